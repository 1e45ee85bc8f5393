//! Redis servers a test starts for itself, for the tests that kill or
//! restart one (`tests/redis_restart.rs`, `tests/redis_cluster_failover.rs`,
//! `examples/http/tests/faults.rs`, `examples/grpc/tests/faults.rs`):
//! the shared servers (6379, the cluster on 7000-7005) belong to every
//! other test and person on the machine, and are never stopped.
//!
//! Each server is `redis-server` on a free port of 127.0.0.1, keeping
//! nothing on disk (`--save ""`, no AOF; a cluster node its nodes.conf) in a
//! temporary directory of its own, where it also logs. It runs in the
//! foreground as the test's child, never daemonized, and is killed, reaped
//! and its directory removed when its [`RedisServer`] drops, a panicking
//! test's included. It inherits no descriptor of the test process but
//! stdin, stdout and stderr (all `/dev/null`): a server holding an inherited
//! pipe (cargo's, a `| tee` of the test run) would keep its reader waiting
//! after the test.
//!
//! Behind the feature `redis-server`: it needs `libc`, which the other
//! packages using this crate lack.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{cannot_run, unique};

/// How long a server may take to answer `PING` after it was started.
const START_WITHIN: Duration = Duration::from_secs(15);

/// Whether `redis-server` and `redis-cli` are installed; if not, the calling
/// test cannot run (a skip; a failure with `IDEM_REQUIRE_SERVICES=1`).
pub fn installed() -> bool {
    for tool in ["redis-server", "redis-cli"] {
        let found = Command::new(tool).arg("--version").stdin(Stdio::null()).stdout(Stdio::null()).status();
        if found.is_err() {
            cannot_run(format!("{tool} is not installed: this test starts Redis servers of its own"));
            return false;
        }
    }
    true
}

/// A port of 127.0.0.1 nobody listens on now. (Another process may take it
/// before the server binds it: [`RedisServer::start`] then tries another.)
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A `redis-server` of the test's own.
pub struct RedisServer {
    pub port: u16,
    dir: PathBuf,
    /// What it was started with, to start it again as it was.
    args: Vec<String>,
    child: Option<Child>,
}

impl RedisServer {
    /// A standalone server, answering `PING`; `None` (the test skips) when
    /// Redis is not installed.
    pub fn start() -> Option<RedisServer> {
        installed().then(|| RedisServer::start_with(|_| Vec::new()))
    }

    /// A server started with `extra(port)` after the common arguments, on
    /// a free port (another one if that was taken meanwhile).
    fn start_with(extra: impl Fn(u16) -> Vec<String>) -> RedisServer {
        let mut last_log = String::new();
        for _ in 0..5 {
            let port = free_port();
            let dir = std::env::temp_dir().join(unique("idem-redis"));
            std::fs::create_dir_all(&dir).unwrap();
            let mut args: Vec<String> = [
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--daemonize",
                "no",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                &dir.display().to_string(),
                "--logfile",
                "redis.log",
            ]
            .map(str::to_owned)
            .to_vec();
            args.extend(extra(port));
            let mut server = RedisServer { port, dir, args, child: None };
            match server.run() {
                Ok(()) => return server,
                // Dropped: the directory goes; the next turn takes another port.
                Err(log) => last_log = log,
            }
        }
        panic!("redis-server did not start on any of 5 free ports; its log:\n{last_log}");
    }

    /// Start the process and wait for its `PONG`; `Err(its log)` if it
    /// exits or stays silent.
    fn run(&mut self) -> Result<(), String> {
        let mut command = Command::new("redis-server");
        command.args(&self.args).current_dir(&self.dir);
        command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
        // SAFETY: between fork and exec the closure only makes system calls.
        unsafe { command.pre_exec(close_inherited_descriptors) };
        let child = command.spawn().map_err(|e| format!("cannot run redis-server: {e}"))?;
        self.child = Some(child);
        let deadline = Instant::now() + START_WITHIN;
        while Instant::now() < deadline {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                self.child = None;
                return Err(format!("exited ({status}):\n{}", self.log()));
            }
            if self.pong() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.kill();
        Err(format!("no PONG within {START_WITHIN:?}:\n{}", self.log()))
    }

    /// Whether it answers `PING` with `PONG` (not `LOADING`, say).
    fn pong(&self) -> bool {
        let Ok(mut conn) = TcpStream::connect(("127.0.0.1", self.port)) else { return false };
        let _ = conn.set_read_timeout(Some(Duration::from_secs(1)));
        let mut answer = [0u8; 7];
        conn.write_all(b"PING\r\n").is_ok() && conn.read_exact(&mut answer).is_ok() && &answer == b"+PONG\r\n"
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default()
    }

    /// SIGKILL: a crash, nothing flushed, no goodbye to clients or replicas.
    /// Its port and directory stay its own, for [`start_again`](Self::start_again).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Start it again as it was (same port, same directory; a cluster node
    /// rejoins from its nodes.conf) and wait for its `PONG`.
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "the server on {} is running", self.port);
        // A replica's full sync may have left a dump.rdb: stale, never to be
        // loaded (the server starts empty, as it was).
        let _ = std::fs::remove_file(self.dir.join("dump.rdb"));
        if let Err(log) = self.run() {
            panic!("redis-server on {} did not start again: {log}", self.port);
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// In the child between fork and exec: close every descriptor but stdin,
/// stdout and stderr, whether or not it is marked close-on-exec (those the
/// test process inherited are not). Only system calls here: no allocation.
pub(crate) fn close_inherited_descriptors() -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    // SAFETY: close_range(2) on descriptors this process will not use again.
    if unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) } == 0 {
        return Ok(());
    }
    // No close_range (an older kernel, another system): one by one.
    // SAFETY: sysconf and close, on descriptors this process will not use again.
    let max = unsafe { libc::sysconf(libc::_SC_OPEN_MAX) };
    let max = if max <= 0 { 65_536 } else { max.min(1 << 20) as libc::c_int };
    for fd in 3..max {
        unsafe { libc::close(fd) };
    }
    Ok(())
}

/// A Redis Cluster of the test's own: 3 masters and 3 replicas, a 2 s node
/// timeout so that a failover takes seconds.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Six nodes, made a cluster with `redis-cli --cluster create`, healthy
    /// (see [`healthy`]); `None` (the test skips) when Redis is not
    /// installed.
    pub fn start() -> Option<RedisCluster> {
        if !installed() {
            return None;
        }
        let node = |_port: u16| -> Vec<String> {
            let bus = free_port();
            ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000"]
                .into_iter()
                .map(str::to_owned)
                .chain(["--cluster-port".to_owned(), bus.to_string()])
                // Replicas load a full sync straight from the socket.
                .chain(["--repl-diskless-load".to_owned(), "swapdb".to_owned()])
                .collect()
        };
        let cluster = RedisCluster { nodes: (0..6).map(|_| RedisServer::start_with(node)).collect() };
        let created = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(cluster.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)))
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            created.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&created.stdout),
            String::from_utf8_lossy(&created.stderr)
        );
        let port = cluster.nodes[0].port;
        assert!(wait_healthy(port, Duration::from_secs(60)), "the new cluster is not healthy: {:?}", nodes(port));
        Some(cluster)
    }

    /// Every node's URL (any serves as a seed).
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| format!("redis://127.0.0.1:{}", n.port)).collect()
    }

    pub fn node(&mut self, port: u16) -> &mut RedisServer {
        self.nodes.iter_mut().find(|n| n.port == port).expect("a node of this cluster")
    }
}

/// `redis-cli` on a node: its output, `None` when it fails.
pub fn cli(port: u16, args: &[&str]) -> Option<String> {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).replace('\r', ""))
}

/// One line of `CLUSTER NODES`.
#[derive(Debug)]
pub struct Node {
    pub id: String,
    pub port: u16,
    pub flags: String,
    pub master: String,
    pub slots: Vec<(u16, u16)>,
}

/// The cluster as the node on `port` sees it.
pub fn nodes(port: u16) -> Vec<Node> {
    let text = cli(port, &["cluster", "nodes"]).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let port = f.get(1)?.split('@').next()?.rsplit(':').next()?.parse().ok()?;
            let slots = f
                .iter()
                .skip(8)
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| match s.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => s.parse().ok().map(|n| (n, n)),
                })
                .collect();
            Some(Node { id: f[0].into(), port, flags: f[2].into(), master: f[3].into(), slots })
        })
        .collect()
}

/// Whole: every node answers and sees `cluster_state:ok`, none is flagged
/// failing, and every master serving slots has a replica in sync.
pub fn healthy(any_port: u16) -> bool {
    let all = nodes(any_port);
    if all.len() < 2 || all.iter().any(|n| n.flags.contains("fail") || n.flags.contains("noaddr")) {
        return false;
    }
    let masters: Vec<&Node> = all.iter().filter(|n| n.flags.contains("master") && !n.slots.is_empty()).collect();
    // Each replica in sync: one that is not could not take over.
    let in_sync = |n: &Node| {
        !n.flags.contains("slave")
            || cli(n.port, &["info", "replication"]).is_some_and(|i| i.contains("master_link_status:up"))
    };
    masters.iter().all(|m| all.iter().any(|r| r.master == m.id))
        && all.iter().all(|n| cli(n.port, &["cluster", "info"]).is_some_and(|i| i.contains("cluster_state:ok")))
        && all.iter().all(in_sync)
}

pub fn wait_healthy(any_port: u16, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if healthy(any_port) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    false
}
