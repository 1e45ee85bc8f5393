//! A TCP proxy a test puts between a client and a real server, to cut the
//! connection and restore it ("the broker is down for 10 s") without
//! touching the shared server.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Forwards every connection made to [`addr`](Self::addr) to the server,
/// until [`cut`](Self::cut): then the connections it carries are closed,
/// and new ones are accepted and closed at once (a server that is down)
/// until [`restore`](Self::restore). Stops when dropped.
pub struct Proxy {
    addr: SocketAddr,
    cut: Arc<AtomicBool>,
    /// Bumped at each cut: the connections of an earlier generation close.
    generation: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// A proxy on a free local port to `server` (`host:port`).
    pub async fn start(server: &str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cut = Arc::new(AtomicBool::new(false));
        let (generation, _) = watch::channel(0u64);
        let server = server.to_owned();
        let task = tokio::spawn({
            let (cut, generation) = (cut.clone(), generation.clone());
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    if cut.load(Ordering::SeqCst) {
                        drop(client);
                        continue;
                    }
                    let mut closed = generation.subscribe();
                    let server = server.clone();
                    tokio::spawn(async move {
                        let Ok(mut upstream) = TcpStream::connect(&server).await else { return };
                        let mut client = client;
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {}
                            _ = closed.changed() => {}
                        }
                    });
                }
            }
        });
        Proxy { addr, cut, generation, task }
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `url` (`scheme://[user@]host:port[/...]`) with the proxy in place of
    /// its host and port.
    pub fn url(&self, url: &str) -> String {
        let (start, end) = host_port_range(url);
        format!("{}{}{}", &url[..start], self.addr, &url[end..])
    }

    /// Close every connection and refuse new ones.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
    }

    /// Carry connections again.
    pub fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        self.task.abort();
    }
}

/// The `host:port` of `url` (`scheme://[user[:password]@]host:port[/...]`).
pub fn host_port(url: &str) -> String {
    let (start, end) = host_port_range(url);
    url[start..end].to_owned()
}

fn host_port_range(url: &str) -> (usize, usize) {
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    let rest = &url[after_scheme..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let start = rest[..authority_end].rfind('@').map_or(after_scheme, |at| after_scheme + at + 1);
    (start, after_scheme + authority_end)
}
