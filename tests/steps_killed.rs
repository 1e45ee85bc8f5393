//! Recorded steps when the worker *process* dies: a worker running a
//! three-step transfer (reserve, charge, ledger) is killed with SIGKILL at
//! a chosen point, and a take-over in another process resumes it, on every
//! lease store that outlives a process: SQLite (a file), PostgreSQL,
//! MariaDB, Redis and Redis Cluster. (The memory store dies with its
//! process, so there is nothing to take over; its dropped-future case is in
//! `tests/steps.rs`, as is every store's.)
//!
//! The worker is this test binary run again, as the test [`worker_process`]
//! with [`WORKER`] set; it runs three calls at once, each killed at one of
//! the steps, prints a marker line for each as it gets there, and blocks.
//! The test reads the three markers, kills the process, and takes the three
//! calls over itself once their leases pass. The outside system is a file
//! per call, one line `<step name> <step key>` appended per call it got, so
//! that what the dead worker sent is still counted.
//!
//! Kill points, for each of the three steps:
//! - before: the step has begun, its outside call not yet made;
//! - during: the outside call was made, its result not yet recorded;
//! - after: its result recorded, the next step not begun.
//!
//! The outside system does not deduplicate: a step re-sent is a second
//! request. `charge` is a plain step (re-sent with its key), or one with a
//! check (the take-over asks the outside system, and does not send it
//! again), or at-most-once (the take-over stops in doubt until the test,
//! as an operator, resolves it).

use idem_test_support as common;

use std::fs::{File, OpenOptions};
use std::io::{BufRead as _, BufReader, Write as _};
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc::{self, TryRecvError};
use std::time::{Duration, Instant};

use common::unique;
use idem::lease::{LeaseStore, Resolve, StepKey, StepOutcome, Steps};
use idem::{Claim, Error, Guard, Replayable};
use serde::{Deserialize, Serialize};

type Store = Arc<dyn LeaseStore>;

/// The environment variable that makes this binary a worker: its [`Job`]
/// as JSON.
const WORKER: &str = "IDEM_STEPS_KILLED_WORKER";

/// Short, so that a take-over waits about a second; renewed every third
/// while the worker stands at its kill point, so it is live until the kill.
const LEASE: Duration = Duration::from_secs(1);

/// How long a worker may take to reach its kill points (a loaded machine
/// starting a process and connecting), and a take-over to claim.
const PATIENCE: Duration = Duration::from_secs(30);

const STEPS: [&str; 3] = ["reserve", "charge", "ledger"];

/// The amount reserved, charged, and answered.
const CENTS: u64 = 500;

/// The marker a worker prints when one of its calls stands at its kill
/// point: the call's id follows.
const AT_KILL_POINT: &str = "AT-KILL-POINT ";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
enum Phase {
    Before,
    During,
    After,
}

impl Phase {
    /// Steps recorded when the worker was killed at `step` (its index).
    fn recorded_at_kill(self, step: usize) -> usize {
        step + usize::from(self == Phase::After)
    }
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
enum Kind {
    Sqlite,
    Postgres,
    Mysql,
    Redis,
    RedisCluster,
}

/// The store of `kind`: `place` is the SQLite file or the Redis prefix,
/// the same in the worker and the test. `None`: the server is unreachable
/// (the test skips, or fails with `IDEM_REQUIRE_SERVICES=1`).
async fn open(kind: Kind, place: &str) -> Option<Store> {
    use idem::store::{RedisStore, SqlStore};
    Some(match kind {
        Kind::Sqlite => Arc::new(SqlStore::new(common::sqlite_at(Path::new(place)).await)),
        Kind::Postgres => Arc::new(SqlStore::new(common::postgres().await?)),
        Kind::Mysql => Arc::new(SqlStore::new(common::mysql().await?)),
        Kind::Redis => Arc::new(RedisStore::new(common::redis().await?, place)),
        Kind::RedisCluster => Arc::new(RedisStore::new(common::redis_cluster().await?, place)),
    })
}

/// How the `charge` step declares itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
enum Charge {
    /// `Steps::run`: re-sent after a crash in it.
    Plain,
    /// `Steps::run_checked`, asking the outside system for its key.
    Checked,
    /// `Steps::run_at_most_once`.
    AtMostOnce,
}

/// What a worker process is to do: in `scope`, one call killed at each
/// step ([`call_killed_at`]), in `phase` of that step.
#[derive(Serialize, Deserialize)]
struct Job {
    kind: Kind,
    place: String,
    scope: String,
    phase: Phase,
    charge: Charge,
    /// Where the outside system's files are.
    dir: PathBuf,
}

/// The key of the call killed at `step` (the scope is the test's own).
fn call_killed_at(step: &str) -> String {
    format!("killed-at-{step}")
}

impl Job {
    /// The outside system of the call killed at `step`.
    fn outside(&self, step: &str) -> Outside {
        Outside { file: self.dir.join(format!("{}.calls", call_killed_at(step))) }
    }
}

/// The outside system (a bank, a ledger) as one call sees it: a file that
/// gets one line `<step name> <step key>` per request, appended and
/// written through before the caller goes on, so a request survives the
/// process that sent it.
struct Outside {
    file: PathBuf,
}

impl Outside {
    fn request(&self, step: &str, key: &StepKey) {
        let mut file = OpenOptions::new().create(true).append(true).open(&self.file).unwrap();
        file.write_all(format!("{step} {key}\n").as_bytes()).unwrap();
        file.flush().unwrap();
    }

    /// Whether the outside system got step `key`: what `check` asks.
    fn got(&self, key: &StepKey) -> bool {
        self.requests().iter().any(|(_, k)| k == key.as_str())
    }

    /// The requests so far, as (step, key).
    fn requests(&self) -> Vec<(String, String)> {
        let Ok(text) = std::fs::read_to_string(&self.file) else { return Vec::new() };
        text.lines()
            .map(|line| {
                let (step, key) = line.split_once(' ').unwrap();
                (step.to_owned(), key.to_owned())
            })
            .collect()
    }
}

/// Where a worker's call dies: `phase` of the step named.
type KillPoint<'a> = (Phase, &'a str);

/// reserve -> charge -> ledger, each step one request to the outside
/// system, `charge` declared as `charge` says; with `kill`, the call stops
/// there for good (its process is about to be killed).
async fn transfer(
    steps: Steps<'_>,
    outside: &Outside,
    charge: Charge,
    kill: Option<(KillPoint<'_>, &str)>,
) -> Result<u64, Error> {
    let held = step(&steps, outside, kill, ("reserve", Charge::Plain), CENTS).await?;
    let charged = step(&steps, outside, kill, ("charge", charge), held).await?;
    step(&steps, outside, kill, ("ledger", Charge::Plain), ()).await?;
    Ok(charged)
}

/// The step `name`: a request to the outside system with the step's key,
/// answering `value`; for the call killed at this step, the marker and no
/// return at the kill point.
async fn step<T: Replayable + Clone>(
    steps: &Steps<'_>,
    outside: &Outside,
    kill: Option<(KillPoint<'_>, &str)>,
    (name, declared): (&str, Charge),
    value: T,
) -> Result<T, Error> {
    let stand_if = |phase: Phase| async move {
        match kill {
            Some(((at, step), call)) if at == phase && step == name => match stand_at_kill_point(call).await {},
            _ => {}
        }
    };
    let answer = value.clone();
    let send = |key: StepKey| async move {
        stand_if(Phase::Before).await;
        outside.request(name, &key);
        stand_if(Phase::During).await;
        Ok::<_, Error>(value)
    };
    let value = match declared {
        Charge::Plain => steps.run(name, send).await?,
        Charge::Checked => {
            let check = |key: StepKey| async move { Ok(outside.got(&key).then_some(answer)) };
            steps.run_checked(name, check, send).await?
        }
        Charge::AtMostOnce => steps.run_at_most_once(name, send).await?,
    };
    stand_if(Phase::After).await;
    Ok(value)
}

/// Say so on stdout, where the test reads it, and wait to be killed (the
/// lease is renewed meanwhile: the call is alive until the kill).
async fn stand_at_kill_point(call: &str) -> std::convert::Infallible {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{AT_KILL_POINT}{call}").unwrap();
    stdout.flush().unwrap();
    drop(stdout);
    std::future::pending().await
}

/// The worker: returns at once unless [`WORKER`] is set (as the test sets
/// it for the process it starts and kills).
#[tokio::test]
async fn worker_process() {
    let Ok(job) = std::env::var(WORKER) else { return };
    let job: Job = serde_json::from_str(&job).unwrap();
    let store = open(job.kind, &job.place).await.expect("the test reached the store");
    let killed_at = |step: &'static str| {
        let (store, job) = (&store, &job);
        async move {
            let call = call_killed_at(step);
            let claim = Guard::new(job.scope.clone()).key(&call).lease::<u64>(&**store, LEASE).await.unwrap();
            let Claim::Run(ticket) = claim else { panic!("{call}: a first call runs") };
            let outside = job.outside(step);
            let kill = Some(((job.phase, step), call.as_str()));
            let ran = ticket.run_steps(|steps| transfer(steps, &outside, job.charge, kill)).await;
            panic!("{call} went past its kill point: {ran:?}");
        }
    };
    tokio::join!(killed_at(STEPS[0]), killed_at(STEPS[1]), killed_at(STEPS[2]));
}

/// A worker process of the test's own. Dropped, it is killed and reaped:
/// a failing test leaves none behind.
struct Worker {
    child: Child,
    /// Its stdout, line by line (read on a thread of its own).
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
    stderr: PathBuf,
}

impl Worker {
    fn start(job: &Job) -> Worker {
        let stderr = job.dir.join("worker.stderr");
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "worker_process", "--nocapture", "--test-threads", "1"])
            .env(WORKER, serde_json::to_string(job).unwrap())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(File::create(&stderr).unwrap())
            .spawn()
            .unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Worker { child, lines, seen: Vec::new(), stderr }
    }

    /// Wait until each of `calls` stands at its kill point.
    async fn wait_at_kill_points(&mut self, calls: &[String]) {
        let deadline = Instant::now() + PATIENCE;
        // `ends_with`: the harness's `test worker_process ... ` begins the
        // line of the first marker.
        let at =
            |seen: &[String], call: &String| seen.iter().any(|line| line.ends_with(&format!("{AT_KILL_POINT}{call}")));
        while !calls.iter().all(|call| at(&self.seen, call)) {
            match self.lines.try_recv() {
                Ok(line) => self.seen.push(line),
                Err(TryRecvError::Empty) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err(e) => panic!("the worker did not reach its kill points ({e:?}); {}", self.output()),
            }
        }
    }

    fn output(&self) -> String {
        let stderr = std::fs::read_to_string(&self.stderr).unwrap_or_default();
        format!("its stdout:\n{}\nits stderr:\n{stderr}", self.seen.join("\n"))
    }

    /// SIGKILL (what `Child::kill` sends on Unix): no destructor, no
    /// release of its records, its connections cut.
    fn kill(mut self) {
        self.child.kill().unwrap();
        let status = self.child.wait().unwrap();
        assert_eq!(status.signal(), Some(libc::SIGKILL), "killed by SIGKILL: {status}; {}", self.output());
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Kill a worker in `phase` of each step (three calls, one process), then
/// take each call over and check what the outside system got.
async fn kill_and_take_over(kind: Kind, phase: Phase) {
    kill_and_take_over_charging(kind, phase, Charge::Plain).await;
}

/// [`kill_and_take_over`], with `charge` declared as `charge` says.
async fn kill_and_take_over_charging(kind: Kind, phase: Phase, charge: Charge) {
    let dir = TestDir::new();
    let place = match kind {
        Kind::Sqlite => dir.0.join("store.db").to_str().unwrap().to_owned(),
        Kind::Redis | Kind::RedisCluster => format!("{}:", unique("idem-steps-killed")),
        Kind::Postgres | Kind::Mysql => String::new(),
    };
    let Some(store) = open(kind, &place).await else { return };
    let job = Job { kind, place, scope: unique("tests.steps_killed"), phase, charge, dir: dir.0.clone() };
    let mut worker = Worker::start(&job);
    worker.wait_at_kill_points(&STEPS.map(call_killed_at)).await;
    worker.kill();
    tokio::join!(take_over(&*store, &job, 0), take_over(&*store, &job, 1), take_over(&*store, &job, 2));
}

/// The test's directory (the SQLite file, the outside system's files, the
/// worker's stderr), removed when dropped, after the worker (declared
/// later) was killed. A failure's message carries what they held.
struct TestDir(PathBuf);

impl TestDir {
    fn new() -> TestDir {
        let dir = std::env::temp_dir().join("idem-tests").join(unique("steps-killed"));
        std::fs::create_dir_all(&dir).unwrap();
        TestDir(dir)
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Take over the call killed at `STEPS[killed]`, and check it: each step
/// recorded before the kill requested once in all, the one in flight
/// ("during") twice with the same key if it is a plain step (once if it is
/// checked; at-most-once, the take-over stops in doubt and the test
/// resolves it done), nothing more than twice, the take-over resumed where
/// the worker stopped, and its answer replays.
async fn take_over(store: &dyn LeaseStore, job: &Job, killed: usize) {
    let call = call_killed_at(STEPS[killed]);
    let outside = job.outside(STEPS[killed]);
    let recorded = job.phase.recorded_at_kill(killed);
    let resent = job.phase == Phase::During && (killed != 1 || job.charge == Charge::Plain);
    let requested_at_kill = recorded + usize::from(job.phase == Phase::During);
    assert_eq!(outside.requests().len(), requested_at_kill, "{call}: requests when the worker was killed");

    let scope = idem::key::stored_scope(&job.scope);
    let key = idem::Key::new(&call).unwrap();
    let in_doubt = killed == 1 && job.charge == Charge::AtMostOnce && job.phase != Phase::After;
    if in_doubt {
        let doubt = attempt(store, job, &call, &outside).await;
        let Err(Error::InDoubt { step_key, .. }) = doubt else { panic!("{call}: {doubt:?}") };
        assert_eq!(step_key, StepKey::for_step(&scope, key.as_str(), "charge").to_string());
        // The operator asked the outside system.
        let outcome = match outside.requests().len() > recorded {
            true => StepOutcome::Done { result: "500" },
            false => StepOutcome::NotDone,
        };
        let resolved = store.resolve_step(&scope, key.as_str(), "charge", outcome).await.unwrap();
        assert!(matches!(resolved, Resolve::Resolved(_)), "{call}: {resolved:?}");
    }
    let mut resumed = None;
    let answer = attempt_with(store, job, &call, |steps| async {
        resumed = Some((idem::lease::current().unwrap().reclaimed, steps.recorded()));
        transfer(steps, &outside, job.charge, None).await
    })
    .await
    .unwrap();
    assert_eq!(answer, CENTS);
    let (reclaimed, replayed) = (!in_doubt, recorded + usize::from(in_doubt && job.phase == Phase::During));
    assert_eq!(resumed, Some((reclaimed, replayed)), "{call}: took the record over, and replayed {replayed} steps");

    let requests = outside.requests();
    for (number, name) in STEPS.into_iter().enumerate() {
        let key = StepKey::for_step(&scope, key.as_str(), name);
        let sent: Vec<_> = requests.iter().filter(|(step, _)| step == name).collect();
        assert!(sent.iter().all(|(_, k)| k == key.as_str()), "{call}: {name} always with its key: {sent:?}");
        let expected = if number == killed && resent { 2 } else { 1 };
        assert_eq!(sent.len(), expected, "{call}: requests of {name}: {requests:?}");
    }

    // A later duplicate replays the answer; nothing runs.
    let again = Guard::new(job.scope.clone()).key(&call).lease::<u64>(store, LEASE).await.unwrap();
    assert!(matches!(again, Claim::Replay(CENTS)), "{call}: {again:?}");
    assert_eq!(outside.requests().len(), requests.len(), "{call}: the replay requested nothing");
}

/// One attempt of `call`, its body `transfer` with no kill.
async fn attempt(store: &dyn LeaseStore, job: &Job, call: &str, outside: &Outside) -> Result<u64, Error> {
    attempt_with(store, job, call, |steps| transfer(steps, outside, job.charge, None)).await
}

/// One attempt of `call` with `body`, waiting for the dead worker's lease.
async fn attempt_with<'s, F, Fut>(store: &'s dyn LeaseStore, job: &Job, call: &str, body: F) -> Result<u64, Error>
where
    F: FnOnce(Steps<'s>) -> Fut,
    Fut: Future<Output = Result<u64, Error>>,
{
    let guard = Guard::new(job.scope.clone()).key(call);
    match guard.lease_or_wait::<u64>(store, LEASE, PATIENCE).await? {
        Claim::Run(ticket) => ticket.run_steps(body).await,
        Claim::Replay(answer) => panic!("{call}: the dead worker's call was completed: {answer}"),
    }
}

macro_rules! killed_suite {
    (mod $m:ident; kind = $kind:expr;) => {
        mod $m {
            use super::*;

            /// The step had begun, its request not sent: the take-over
            /// sends it, once in all.
            #[tokio::test]
            async fn a_worker_killed_before_a_step_calls_out_leaves_the_one_call_to_the_take_over() {
                kill_and_take_over($kind, Phase::Before).await;
            }

            /// Killed as the bank call returns: the take-over charges once
            /// more with the same key (the bank deduplicates), and records it.
            #[tokio::test]
            async fn a_worker_killed_as_the_outside_call_returns_is_followed_by_one_resend_with_the_same_key() {
                kill_and_take_over($kind, Phase::During).await;
            }

            /// The step's result was recorded: the take-over replays it and
            /// goes on with the next step, never sending it again.
            #[tokio::test]
            async fn a_worker_killed_after_a_step_was_recorded_is_resumed_at_the_next_step() {
                kill_and_take_over($kind, Phase::After).await;
            }

            /// Killed as the outside system charged, the charge checked:
            /// the take-over finds the charge there and records it; the
            /// outside system, which does not deduplicate, is charged once.
            #[tokio::test]
            async fn a_worker_killed_in_a_checked_charge_leaves_one_charge() {
                kill_and_take_over_charging($kind, Phase::During, Charge::Checked).await;
            }

            /// Killed as the outside system charged, the charge at-most-once:
            /// the take-over stops in doubt; resolved done, the call
            /// completes, charged once.
            #[tokio::test]
            async fn a_worker_killed_in_an_at_most_once_charge_leaves_the_call_in_doubt() {
                kill_and_take_over_charging($kind, Phase::During, Charge::AtMostOnce).await;
            }
        }
    };
}

killed_suite! {
    mod sqlite;
    kind = Kind::Sqlite;
}

killed_suite! {
    mod postgres;
    kind = Kind::Postgres;
}

killed_suite! {
    mod mysql;
    kind = Kind::Mysql;
}

killed_suite! {
    mod redis;
    kind = Kind::Redis;
}

killed_suite! {
    mod redis_cluster;
    kind = Kind::RedisCluster;
}
