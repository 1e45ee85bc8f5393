//! `--added-rtt-us N`: a TCP proxy in front of the database that makes every
//! request/response exchange cost about N µs more, as if the application
//! and the database ran on different hosts (N = 500: one availability zone).
//!
//! Every chunk read from either side is forwarded N/2 µs after it arrived,
//! in order, while later chunks keep being read (a delay line per direction,
//! not a sleep per exchange, so pipelined and concurrent traffic is not
//! serialized). tokio's timer ticks in milliseconds and would round each
//! half up to the next tick (N = 500 would cost 2 ms or more), so the
//! deadlines are kept by a thread of their own, which waits on a condition
//! variable with a timeout (the kernel's high-resolution timers). Waking
//! that thread and then the forwarding task takes 60-100 µs (the kernel's
//! timer slack is 50 µs), so waiters are woken that much ahead of their
//! deadline, learnt from how late they resume. What is left is the proxy's
//! own cost (a read and a write each way, 20-70 µs per round trip on an idle
//! machine; more when the CPU is busy: the proxy runs on the machine it
//! measures); `measure` reports what a round trip really gains.

use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use sqlx::Connection;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};

use crate::common::BoxError;

/// Starts the proxy in front of the host and port of `url` (postgres:// or
/// mysql://) and returns `url` pointing at the proxy instead.
pub async fn start(url: &str, added_rtt: Duration) -> Result<String, BoxError> {
    let target = Target::parse(url)?;
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let proxied = target.rewrite(listener.local_addr()?.port());
    let half = added_rtt / 2;
    tokio::spawn(async move {
        loop {
            let client = match listener.accept().await {
                Ok((client, _)) => client,
                Err(e) => {
                    eprintln!("added-rtt proxy: accept: {e}");
                    return;
                }
            };
            let (host, port) = (target.host.clone(), target.port);
            tokio::spawn(async move {
                if let Err(e) = relay(client, (&*host, port), half).await {
                    eprintln!("added-rtt proxy: {e}");
                }
            });
        }
    });
    Ok(proxied)
}

/// The average round trip (a protocol-level ping, on one connection, with
/// nothing else running) straight to the database and through the proxy.
pub async fn measure(direct: &str, proxied: &str) -> Result<(Duration, Duration), BoxError> {
    if direct.starts_with("postgres") {
        Ok((ping::<sqlx::PgConnection>(direct).await?, ping::<sqlx::PgConnection>(proxied).await?))
    } else {
        let (direct, proxied) =
            (direct.replacen("mariadb://", "mysql://", 1), proxied.replacen("mariadb://", "mysql://", 1));
        Ok((ping::<sqlx::MySqlConnection>(&direct).await?, ping::<sqlx::MySqlConnection>(&proxied).await?))
    }
}

async fn ping<C: Connection>(url: &str) -> Result<Duration, sqlx::Error> {
    const PINGS: u32 = 200;
    let mut conn = C::connect(url).await?;
    for _ in 0..20 {
        conn.ping().await?;
    }
    let started = Instant::now();
    for _ in 0..PINGS {
        conn.ping().await?;
    }
    let each = started.elapsed() / PINGS;
    conn.close().await?;
    Ok(each)
}

/// Where `--database-url` points, and the rest of it.
struct Target {
    /// `postgres://user:password@`
    head: String,
    host: String,
    port: u16,
    /// `/database?options`
    tail: String,
}

impl Target {
    fn parse(url: &str) -> Result<Target, BoxError> {
        let unsupported = || format!("--added-rtt-us needs a postgres:// or mysql:// --database-url, not {url:?}");
        let (scheme, rest) = url.split_once("://").ok_or_else(unsupported)?;
        let default_port = match scheme {
            "postgres" | "postgresql" => 5432,
            "mysql" | "mariadb" => 3306,
            _ => return Err(unsupported().into()),
        };
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(end);
        if tail.contains("host=") || tail.contains("port=") {
            return Err("--added-rtt-us: give the host and port in the URL's authority, not as options".into());
        }
        let at = authority.rfind('@').map_or(0, |i| i + 1);
        let (user, host_port) = authority.split_at(at);
        let (host, port) = match host_port.strip_prefix('[') {
            // [IPv6]:port
            Some(v6) => {
                let (host, after) = v6.split_once(']').ok_or_else(unsupported)?;
                (host, after.strip_prefix(':'))
            }
            None => match host_port.rsplit_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (host_port, None),
            },
        };
        let port = match port {
            Some(port) => port.parse().map_err(|_| unsupported())?,
            None => default_port,
        };
        let host = if host.is_empty() { "localhost" } else { host };
        Ok(Target { head: format!("{scheme}://{user}"), host: host.to_owned(), port, tail: tail.to_owned() })
    }

    fn rewrite(&self, proxy_port: u16) -> String {
        format!("{}127.0.0.1:{proxy_port}{}", self.head, self.tail)
    }
}

/// One proxied connection: a delay line each way until both sides close.
async fn relay(client: TcpStream, target: (&str, u16), half: Duration) -> io::Result<()> {
    let server = TcpStream::connect(target).await?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let (client_in, client_out) = client.into_split();
    let (server_in, server_out) = server.into_split();
    tokio::try_join!(delay_line(client_in, server_out, half), delay_line(server_in, client_out, half))?;
    Ok(())
}

/// Forwards what `from` sends to `to`, each chunk `delay` after it arrived.
async fn delay_line(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, delay: Duration) -> io::Result<()> {
    let (queue, mut chunks) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let read = async move {
        let mut buf = vec![0; 64 * 1024];
        loop {
            let n = from.read(&mut buf).await?;
            // End of stream: `queue` goes, the writer drains what is left.
            if n == 0 || queue.send((Instant::now() + delay, buf[..n].to_vec())).is_err() {
                return Ok::<_, io::Error>(());
            }
        }
    };
    let write = async move {
        while let Some((deadline, chunk)) = chunks.recv().await {
            sleep_until(deadline, delay).await;
            to.write_all(&chunk).await?;
        }
        to.shutdown().await
    };
    tokio::try_join!(read, write)?;
    Ok(())
}

/// Deadlines kept to the microsecond (with the kernel's timer slack) by a
/// thread of their own: tokio's timer would round them up to a millisecond.
struct Timer {
    /// (deadline, sequence number) -> whom to wake.
    due: Mutex<BTreeMap<(Instant, u64), oneshot::Sender<()>>>,
    changed: Condvar,
    seq: AtomicU64,
    /// How much earlier than its deadline a waiter is woken (ns): what the
    /// wake-up itself takes, learnt from how late the waiters woke.
    early_ns: AtomicU64,
}

fn timer() -> &'static Timer {
    static TIMER: OnceLock<&'static Timer> = OnceLock::new();
    TIMER.get_or_init(|| {
        let timer: &'static Timer = Box::leak(Box::new(Timer {
            due: Mutex::default(),
            changed: Condvar::new(),
            seq: AtomicU64::new(0),
            early_ns: AtomicU64::new(0),
        }));
        std::thread::Builder::new().name("added-rtt-timer".into()).spawn(|| timer.run()).expect("timer thread");
        timer
    })
}

impl Timer {
    fn run(&self) {
        let mut due = self.due.lock().unwrap();
        loop {
            let now = Instant::now();
            while let Some(first) = due.first_entry() {
                if first.key().0 > now {
                    break;
                }
                // The waiter may be gone (its connection closed): nothing to do.
                let _ = first.remove().send(());
            }
            due = match due.first_key_value().map(|((deadline, _), _)| deadline.saturating_duration_since(now)) {
                Some(wait) => self.changed.wait_timeout(due, wait).unwrap().0,
                None => self.changed.wait(due).unwrap(),
            };
        }
    }
}

/// Sleeps until `deadline`, or a little earlier: the timer thread wakes a
/// waiter ahead of its deadline by the average lateness seen so far (at most
/// `max_early`), so that on average it resumes on time.
async fn sleep_until(deadline: Instant, max_early: Duration) {
    let start = Instant::now();
    if deadline <= start {
        // Held up behind earlier chunks: nothing to learn about waking up.
        return;
    }
    let timer = timer();
    let early = Duration::from_nanos(timer.early_ns.load(Ordering::Relaxed));
    let wake_at = deadline.checked_sub(early).unwrap_or(deadline);
    if wake_at > start {
        let (wake, woken) = oneshot::channel();
        let seq = timer.seq.fetch_add(1, Ordering::Relaxed);
        let earliest = {
            let mut due = timer.due.lock().unwrap();
            due.insert((wake_at, seq), wake);
            due.first_key_value().is_some_and(|(key, _)| *key == (wake_at, seq))
        };
        if earliest {
            timer.changed.notify_one();
        }
        let _ = woken.await;
    }
    // Resumed `late` ns after the deadline (negative: before it); wake the
    // next waiters earlier (later) by 1/16 of that.
    let now = Instant::now();
    let late = now.saturating_duration_since(deadline).as_nanos() as i64
        - deadline.saturating_duration_since(now).as_nanos() as i64;
    let max = max_early.as_nanos() as i64;
    let _ = timer.early_ns.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |early| {
        Some((early as i64 + late / 16).clamp(0, max) as u64)
    });
}
