//! etcd clusters a test starts for itself: 3 members of `/usr/bin/etcd`
//! (or the `etcd` on the `PATH`) on free ports of 127.0.0.1, for clients
//! and for peers, each with a data directory of its own (under `/dev/shm`
//! where there is one: a member's fsync then costs nothing, and a SIGKILL
//! still loses nothing the kernel was given). Members run in the
//! foreground as the test's children and are killed by their own pids.
//!
//! - [`EtcdCluster::start`]: a cluster of the caller's own, killed and its
//!   directories removed when it drops (a panicking test's too); a member
//!   can be killed ([`kill`](EtcdCluster::kill)) and started again
//!   ([`restart`](EtcdCluster::restart)) by index, and the leader is found
//!   through the maintenance status API ([`leader`](EtcdCluster::leader)).
//! - [`shared`]: one cluster for every suite of a test binary, started on
//!   first use. Its members are started by a thread that lives as long as
//!   the test process, with `PR_SET_PDEATHSIG`: they die with the process
//!   (statics are never dropped); directories of earlier runs whose
//!   process is gone are removed when the next one starts.
//!
//! Members use a 50 ms heartbeat and a 500 ms election timeout, so an
//! election after a leader's loss takes about half a second, and etcd's
//! shortest lease is 1 s.

use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant};

use crate::{cannot_run, unique};

/// How long a cluster may take to answer after it was started.
const START_WITHIN: Duration = Duration::from_secs(20);

/// The etcd binary: `/usr/bin/etcd`, else `etcd` on the `PATH`.
fn binary() -> &'static str {
    if std::path::Path::new("/usr/bin/etcd").exists() { "/usr/bin/etcd" } else { "etcd" }
}

/// Whether etcd is installed; if not, the calling test cannot run (a skip;
/// a failure with `IDEM_REQUIRE_SERVICES=1`).
pub fn installed() -> bool {
    let found = Command::new(binary()).arg("--version").stdin(Stdio::null()).stdout(Stdio::null()).status();
    if found.is_err() {
        cannot_run(
            "etcd is not installed (`apt-get install etcd-server`): this test starts an etcd cluster of its own",
        );
        return false;
    }
    true
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Where members keep their data: `/dev/shm` where there is one.
fn base_dir() -> PathBuf {
    let shm = PathBuf::from("/dev/shm");
    if shm.is_dir() { shm } else { std::env::temp_dir() }
}

/// Remove the directories of earlier runs whose process is gone.
fn remove_stale_dirs() {
    let Ok(entries) = std::fs::read_dir(base_dir()) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix("idem-etcd-").and_then(|rest| rest.split('-').next()) else { continue };
        let Ok(pid) = pid.parse::<i32>() else { continue };
        // SAFETY: kill with signal 0 only asks whether the process exists.
        if pid != std::process::id() as i32 && unsafe { libc::kill(pid, 0) } != 0 {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

type Spawn = (Command, mpsc::Sender<std::io::Result<Child>>);

/// Start `command` from the spawner thread, which lives as long as the
/// process: a child asks to be killed when that thread ends
/// (`PR_SET_PDEATHSIG`), so, at the latest, when the test process exits.
fn spawn(mut command: Command) -> std::io::Result<Child> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Spawn>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Spawn>();
        std::thread::Builder::new()
            .name("etcd-spawner".into())
            .spawn(move || {
                for (mut command, answer) in rx {
                    let _ = answer.send(command.spawn());
                }
                // The channel is in a static: never closed. Stay alive.
                loop {
                    std::thread::park();
                }
            })
            .expect("a thread to start etcd members from");
        Mutex::new(tx)
    });
    // SAFETY: between fork and exec only system calls.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            crate::redis_server::close_inherited_descriptors()
        });
    }
    let (tx, rx) = mpsc::channel();
    spawner.lock().unwrap_or_else(|e| e.into_inner()).send((command, tx)).expect("the spawner thread runs");
    rx.recv().expect("the spawner thread answers")
}

/// One member of a cluster.
pub struct Member {
    pub name: String,
    pub client_port: u16,
    pub peer_port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl Member {
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

/// An etcd cluster of the test's own.
pub struct EtcdCluster {
    pub members: Vec<Member>,
    dir: PathBuf,
    initial: String,
    token: String,
}

impl EtcdCluster {
    /// A cluster of `size` members, answering with a leader; `None` (the
    /// test skips) when etcd is not installed.
    pub async fn start(size: usize) -> Option<EtcdCluster> {
        if !installed() {
            return None;
        }
        remove_stale_dirs();
        let dir = base_dir().join(format!("idem-etcd-{}-{}", std::process::id(), unique("c")));
        std::fs::create_dir_all(&dir).unwrap();
        let members: Vec<Member> = (0..size)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: free_port(),
                peer_port: free_port(),
                dir: dir.join(format!("m{i}")),
                child: None,
            })
            .collect();
        let initial = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = EtcdCluster { members, dir, initial, token: unique("idem-etcd") };
        for i in 0..size {
            cluster.run(i, "new");
        }
        cluster.wait_ready().await;
        Some(cluster)
    }

    /// Start member `i` (`state`: `new` for the first start, `existing` to
    /// rejoin from its data directory).
    fn run(&mut self, i: usize, state: &str) {
        let m = &self.members[i];
        let client = m.endpoint();
        let peer = format!("http://127.0.0.1:{}", m.peer_port);
        let mut command = Command::new(binary());
        command
            .args(["--name", &m.name, "--data-dir", &m.dir.display().to_string()])
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &self.initial, "--initial-cluster-state", state])
            .args(["--initial-cluster-token", &self.token])
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .args(["--logger", "zap", "--log-level", "warn"])
            .args(["--log-outputs", &self.dir.join(format!("{}.log", m.name)).display().to_string()]);
        command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
        let child = spawn(command).unwrap_or_else(|e| panic!("cannot run etcd: {e}"));
        self.members[i].child = Some(child);
    }

    /// Every member's client URL.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(Member::endpoint).collect()
    }

    /// A store on every member, its keys under `prefix`.
    pub async fn store(&self, prefix: &str) -> idem::store::EtcdStore {
        idem::store::EtcdStore::connect(self.endpoints(), None)
            .await
            .expect("connect to the test's etcd")
            .prefix(prefix)
    }

    /// Until a write through every running member succeeds.
    pub async fn wait_ready(&self) {
        let deadline = Instant::now() + START_WITHIN;
        for m in self.members.iter().filter(|m| m.child.is_some()) {
            loop {
                let ok = async {
                    let mut c = etcd_client::Client::connect([m.endpoint()], None).await?;
                    c.put("idem-test-ready", "1", None).await
                };
                match tokio::time::timeout(Duration::from_secs(2), ok).await {
                    Ok(Ok(_)) => break,
                    _ if Instant::now() > deadline => {
                        panic!("etcd member {} did not answer within {START_WITHIN:?}:\n{}", m.name, self.log(m))
                    }
                    _ => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        }
    }

    fn log(&self, m: &Member) -> String {
        std::fs::read_to_string(self.dir.join(format!("{}.log", m.name))).unwrap_or_default()
    }

    /// The index of the current leader, asked of the running members
    /// (maintenance status: the leader's member id, matched to a member's
    /// through the member list); `None` while there is none.
    pub async fn leader(&self) -> Option<usize> {
        for m in self.members.iter().filter(|m| m.child.is_some()) {
            let asked = async {
                let mut c = etcd_client::Client::connect([m.endpoint()], None).await?;
                let leader = c.status().await?.leader();
                let members = c.member_list().await?;
                Ok::<_, etcd_client::Error>(
                    members.members().iter().find(|x| x.id() == leader).map(|x| x.name().to_owned()),
                )
            };
            if let Ok(Ok(Some(name))) = tokio::time::timeout(Duration::from_secs(1), asked).await {
                return self.members.iter().position(|m| m.name == name);
            }
        }
        None
    }

    /// SIGKILL member `i`: a crash, its data directory kept for
    /// [`restart`](Self::restart).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Start member `i` again from its data directory, and wait until it
    /// answers.
    pub async fn restart(&mut self, i: usize) {
        assert!(self.members[i].child.is_none(), "member {i} is running");
        self.run(i, "existing");
        self.wait_ready().await;
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The test binary's cluster, started on first use (`None`: etcd is not
/// installed, and the test skips or, with `IDEM_REQUIRE_SERVICES=1`, fails).
pub async fn shared() -> Option<&'static EtcdCluster> {
    static CLUSTER: tokio::sync::OnceCell<Option<EtcdCluster>> = tokio::sync::OnceCell::const_new();
    // Each test runs its own runtime: the cluster is started on a thread of
    // its own, whose runtime ends with the start (the members are processes).
    CLUSTER
        .get_or_init(|| async {
            std::thread::spawn(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap()
                    .block_on(EtcdCluster::start(3))
            })
            .join()
            .expect("the etcd cluster started")
        })
        .await
        .as_ref()
}

/// A store on the shared cluster, under a prefix of its own.
pub async fn store() -> Option<idem::store::EtcdStore> {
    let cluster = shared().await?;
    Some(cluster.store(&format!("{}/", unique("idem-test"))).await)
}
