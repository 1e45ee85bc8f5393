//! `loadgen --scenario token` and `--scenario lock`: what a one-time token
//! guard and a `concurrency_only` lock guard cost per call, on Redis or the
//! in-process memory store.
//!
//! Each round runs, in alternating slices so that all see the same server,
//! a ladder of ever less code between the caller and the server:
//! - `guard`: the `#[idempotent]` function (token: one `GETDEL`; lock: the
//!   acquire and the release scripts);
//! - `store`: the same store calls without the attribute
//!   (`TokenStore::consume`; `idem::lock::acquire` + `HeldLock::release`);
//! - on Redis, `client`: the store's commands and scripts sent through
//!   redis-rs on the same kind of connection, keys formatted inline: what a
//!   hand-written client would send, the same server work;
//! - on Redis, `redis-benchmark`, run as a subprocess with as many
//!   connections as clients: `GETDEL` on random absent keys of the token
//!   key's shape, the server's raw rate for the consume command. Its
//!   connections are not pipelined, while redis-rs multiplexes all clients'
//!   calls over one connection, so the client rungs can beat it.
//!
//! Tokens are issued ahead of each slice, outside the timing: on Redis by
//! pipelined `SET <prefix>{<token>}token:<scope> 1 NX PX <ttl>` (what
//! `idem::token::issue` writes, one round trip per 5,000), in memory with
//! `idem::token::issue`. Every guarded call spends a distinct token; the
//! ones a slice did not use are deleted after it.

use crate::lease_bench::median;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use idem::idempotent;
use idem::lock::LockStore;
use idem::store::RecordKind;
use idem::token::TokenStore;
use redis::aio::{ConnectionLike, MultiplexedConnection};

use crate::common::{AppError, BoxError};
use crate::errors::Errors;

/// The key prefix of the stores this benchmark uses.
const PREFIX: &str = "idem-bench:";
const TOKEN_SCOPE: &str = "bench.token";
const TOKEN_TTL: Duration = Duration::from_secs(600);
const LOCK_TTL: Duration = Duration::from_secs(30);

/// The lock store's release script, byte for byte, for the `client` rung.
const RELEASE_SRC: &str = include_str!("../../idem-runtime/src/store/redis/lock_release.lua");

/// Which redis-rs connection the store runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Connection {
    /// One `MultiplexedConnection` shared by all clients.
    Multiplexed,
    /// A `ConnectionManager` (a multiplexed connection that reconnects).
    Manager,
    /// `--redis-pool` multiplexed connections, taken in turn (a
    /// `ConnectionLike` of this benchmark's, not of redis-rs).
    Pool,
}

impl Connection {
    fn label(self, pool: usize) -> String {
        match self {
            Connection::Multiplexed => "multiplexed".to_owned(),
            Connection::Manager => "manager".to_owned(),
            Connection::Pool => format!("pool{pool}"),
        }
    }
}

/// The guarded submit: no work in the body, so the figure is the guard's.
#[idempotent(strategy = "token", scope = "bench.token", store = "store")]
async fn submit(store: &dyn TokenStore, #[idem(token)] token: &str) -> Result<(), AppError> {
    Ok(())
}

/// Mutual exclusion only, on a trivial body.
#[idempotent(
    key = "name",
    strategy = "lock",
    concurrency_only = true,
    ttl = "30s",
    scope = "bench.lock",
    store = "store"
)]
async fn exclusive(store: &dyn LockStore, name: &str) -> Result<(), AppError> {
    Ok(())
}

/// What one call did.
enum Step {
    Done,
    /// No token left for this slice: it ends here.
    Exhausted,
}

#[derive(Default)]
struct Sample {
    calls: u64,
    elapsed: Duration,
    latencies_ns: Vec<u32>,
}

impl Sample {
    fn rate(&self) -> f64 {
        self.calls as f64 / self.elapsed.as_secs_f64()
    }
}

/// `call(client)` from `clients` tasks for `length` (or until a call finds
/// no token left); an error if any call failed (`scenario`, `mode`: what the
/// calls measure).
async fn measure<F, Fut>(
    (scenario, mode): (&str, Rung),
    clients: usize,
    length: Duration,
    call: F,
) -> Result<Sample, BoxError>
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Step, BoxError>> + Send,
{
    let call = Arc::new(call);
    let stop = Arc::new(AtomicBool::new(false));
    let exhausted = Arc::new(tokio::sync::Notify::new());
    let started = Instant::now();
    let mut tasks = Vec::new();
    for client in 0..clients.max(1) {
        let (call, stop, exhausted) = (call.clone(), stop.clone(), exhausted.clone());
        tasks.push(tokio::spawn(async move {
            let (mut s, mut errors) = (Sample::default(), Errors::default());
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // The memory store's futures are ready at once: without a
                // yield now and then, busy clients would starve the timer.
                n += 1;
                if n.is_multiple_of(32) {
                    tokio::task::yield_now().await;
                }
                let t = Instant::now();
                match call(client).await {
                    Ok(Step::Done) => {
                        s.latencies_ns.push(t.elapsed().as_nanos().min(u128::from(u32::MAX)) as u32);
                    }
                    Ok(Step::Exhausted) => {
                        stop.store(true, Ordering::Relaxed);
                        exhausted.notify_one();
                    }
                    Err(e) => errors.add(e),
                }
            }
            (s, errors)
        }));
    }
    tokio::select! {
        () = tokio::time::sleep(length) => {}
        () = exhausted.notified() => eprintln!("(a slice ran out of tokens after {:?})", started.elapsed()),
    }
    stop.store(true, Ordering::Relaxed);
    let (mut total, mut errors) = (Sample::default(), Errors::default());
    for t in tasks {
        let (s, e) = t.await.expect("bench task");
        total.latencies_ns.extend(s.latencies_ns);
        errors.absorb(e);
    }
    errors.check(scenario, &format!("{mode:?}"))?;
    total.calls = total.latencies_ns.len() as u64;
    total.elapsed = started.elapsed();
    Ok(total)
}

/// `median [min-max]` of a series, for the human-readable lines.
fn spread(v: &[f64]) -> String {
    let (lo, hi) = v.iter().fold((f64::MAX, f64::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)));
    format!("{:.0} [{lo:.0}-{hi:.0}]", median(v.to_vec()))
}

/// Counts what a connection sends: one request or one pipeline is one
/// round trip.
#[derive(Clone)]
struct Counting<C> {
    inner: C,
    sent: Arc<AtomicU64>,
}

impl<C: ConnectionLike + Send> ConnectionLike for Counting<C> {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, redis::Value> {
        self.sent.fetch_add(1, Ordering::Relaxed);
        self.inner.req_packed_command(cmd)
    }
    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        self.sent.fetch_add(1, Ordering::Relaxed);
        self.inner.req_packed_commands(pipeline, offset, count)
    }
    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }
}

/// Multiplexed connections taken in turn: each has one socket and one
/// driver task, which a single connection's callers all queue behind.
#[derive(Clone)]
struct Pool {
    conns: Arc<[MultiplexedConnection]>,
    next: Arc<AtomicUsize>,
}

impl Pool {
    async fn connect(client: &redis::Client, size: usize) -> Result<Pool, BoxError> {
        let mut conns = Vec::new();
        for _ in 0..size.max(1) {
            conns.push(client.get_multiplexed_async_connection().await?);
        }
        Ok(Pool { conns: conns.into(), next: Arc::new(AtomicUsize::new(0)) })
    }
    fn pick(&self) -> MultiplexedConnection {
        self.conns[self.next.fetch_add(1, Ordering::Relaxed) % self.conns.len()].clone()
    }
}

impl ConnectionLike for Pool {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, redis::Value> {
        let mut conn = self.pick();
        Box::pin(async move { conn.req_packed_command(cmd).await })
    }
    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        let mut conn = self.pick();
        Box::pin(async move { conn.req_packed_commands(pipeline, offset, count).await })
    }
    fn get_db(&self) -> i64 {
        self.conns[0].get_db()
    }
}

/// The `client` rung's connection: of the same kind as the store's.
#[derive(Clone)]
enum AnyConn {
    Multiplexed(MultiplexedConnection),
    Manager(redis::aio::ConnectionManager),
    Pool(Pool),
}

impl ConnectionLike for AnyConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            AnyConn::Multiplexed(c) => c.req_packed_command(cmd),
            AnyConn::Manager(c) => c.req_packed_command(cmd),
            AnyConn::Pool(c) => c.req_packed_command(cmd),
        }
    }
    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            AnyConn::Multiplexed(c) => c.req_packed_commands(pipeline, offset, count),
            AnyConn::Manager(c) => c.req_packed_commands(pipeline, offset, count),
            AnyConn::Pool(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }
    fn get_db(&self) -> i64 {
        match self {
            AnyConn::Multiplexed(c) => c.get_db(),
            AnyConn::Manager(c) => c.get_db(),
            AnyConn::Pool(c) => c.get_db(),
        }
    }
}

/// The stores under test, and on Redis what the raw rates need.
struct Bench {
    name: &'static str,
    tokens: Arc<dyn TokenStore>,
    locks: Arc<dyn LockStore>,
    redis: Option<Raw>,
    run: String,
}

struct Raw {
    url: String,
    /// For issuing tokens and deleting leftovers.
    conn: MultiplexedConnection,
    /// For the `client` rung: a connection of the store's kind.
    client: AnyConn,
    /// The same store over a connection that counts round trips.
    counted: idem::store::RedisStore<Counting<MultiplexedConnection>>,
    sent: Arc<AtomicU64>,
    /// The lock release script's SHA, for the lock floor.
    sha: String,
}

/// The lock store's own acquire script, for the floor: the very file the
/// runtime sends.
static ACQUIRE: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
    redis::Script::new(include_str!("../../idem-runtime/src/store/redis/lock_acquire.lua"))
});

/// Which code sits between the caller and the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rung {
    /// The `#[idempotent]` function.
    Guard,
    /// The store's methods, without the attribute.
    Store,
    /// The store's scripts, invoked through redis-rs.
    Client,
}

static RELEASE: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| redis::Script::new(RELEASE_SRC));

impl Bench {
    async fn connect(redis_url: Option<&str>, connection: Connection, pool: usize) -> Result<Bench, BoxError> {
        let run = crate::common::run_id();
        let Some(url) = redis_url else {
            let store = Arc::new(idem::store::MemoryStore::new());
            return Ok(Bench { name: "memory", tokens: store.clone(), locks: store, redis: None, run });
        };
        let client = redis::Client::open(url)?;
        let (tokens, locks, raw_client): (Arc<dyn TokenStore>, Arc<dyn LockStore>, AnyConn) = match connection {
            Connection::Multiplexed => {
                let s =
                    Arc::new(idem::store::RedisStore::new(client.get_multiplexed_async_connection().await?, PREFIX));
                (s.clone(), s, AnyConn::Multiplexed(client.get_multiplexed_async_connection().await?))
            }
            Connection::Manager => {
                let s = Arc::new(idem::store::RedisStore::new(
                    redis::aio::ConnectionManager::new(client.clone()).await?,
                    PREFIX,
                ));
                (s.clone(), s, AnyConn::Manager(redis::aio::ConnectionManager::new(client.clone()).await?))
            }
            Connection::Pool => {
                let s = Arc::new(idem::store::RedisStore::new(Pool::connect(&client, pool).await?, PREFIX));
                (s.clone(), s, AnyConn::Pool(Pool::connect(&client, pool).await?))
            }
        };
        let mut conn = client.get_multiplexed_async_connection().await?;
        let sha: String = redis::cmd("SCRIPT").arg("LOAD").arg(RELEASE_SRC).query_async(&mut conn).await?;
        let sent = Arc::new(AtomicU64::new(0));
        let counting = Counting { inner: client.get_multiplexed_async_connection().await?, sent: sent.clone() };
        let counted = idem::store::RedisStore::new(counting, PREFIX);
        let redis = Some(Raw { url: url.to_owned(), conn, client: raw_client, counted, sent, sha });
        Ok(Bench { name: "redis", tokens, locks, redis, run })
    }

    /// `n` fresh tokens for `bench.token`, issued.
    async fn issue(&self, tag: &str, n: usize) -> Result<Arc<Vec<String>>, BoxError> {
        let Some(raw) = &self.redis else {
            let mut tokens = Vec::with_capacity(n);
            for _ in 0..n {
                tokens.push(idem::token::issue(&*self.tokens, TOKEN_SCOPE, TOKEN_TTL).await?);
            }
            return Ok(Arc::new(tokens));
        };
        // 32 hex digits like the tokens `issue` makes: the run and slice in
        // the first half, a bijective scramble of the index in the second.
        let head = splitmix(tag.bytes().fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b))));
        let tokens: Vec<String> = (0..n as u64).map(|i| format!("{head:016x}{:016x}", splitmix(i))).collect();
        let mut conn = raw.conn.clone();
        for chunk in tokens.chunks(5000) {
            let mut pipe = redis::pipe();
            for t in chunk {
                pipe.cmd("SET")
                    .arg(raw.counted.key(RecordKind::Token, TOKEN_SCOPE, t))
                    .arg("1")
                    .arg("NX")
                    .arg("PX")
                    .arg(TOKEN_TTL.as_millis() as u64)
                    .ignore();
            }
            let () = pipe.query_async(&mut conn).await?;
        }
        Ok(Arc::new(tokens))
    }

    /// Delete the tokens a slice did not spend.
    async fn discard(&self, tokens: &[String]) -> Result<(), BoxError> {
        if let Some(raw) = &self.redis {
            let mut conn = raw.conn.clone();
            for chunk in tokens.chunks(5000) {
                let mut cmd = redis::cmd("UNLINK");
                for t in chunk {
                    cmd.arg(raw.counted.key(RecordKind::Token, TOKEN_SCOPE, t));
                }
                let _: i64 = cmd.query_async(&mut conn).await?;
            }
        }
        Ok(())
    }

    /// Calls spending distinct tokens, enough for `length` at `best`
    /// calls/s: guarded submits, bare `consume` calls, or raw invocations of
    /// the consume script through redis-rs.
    async fn tokens_slice(
        &self,
        clients: usize,
        length: Duration,
        best: f64,
        rung: Rung,
        tag: &str,
    ) -> Result<Sample, BoxError> {
        // Twice what the best slice so far could use; bounded so that a
        // memory-store slice does not hold gigabytes of tokens (it then ends
        // early, and its rate is over the time it ran).
        let n = ((best * length.as_secs_f64() * 2.0) as usize).clamp(20_000, 3_000_000);
        let tokens = self.issue(tag, n).await?;
        let next = Arc::new(AtomicUsize::new(0));
        let (store, list, counter) = (self.tokens.clone(), tokens.clone(), next.clone());
        let conn = self.redis.as_ref().map(|r| r.client.clone());
        let sample = measure(("token", rung), clients, length, move |_| {
            let (store, tokens, conn) = (store.clone(), list.clone(), conn.clone());
            let i = counter.fetch_add(1, Ordering::Relaxed);
            async move {
                let Some(token) = tokens.get(i) else { return Ok(Step::Exhausted) };
                let spent = match rung {
                    Rung::Guard => match submit(&*store, token).await {
                        Ok(()) => true,
                        Err(AppError::Idem(idem::Error::TokenRejected)) => false,
                        Err(e) => return Err(e.into()),
                    },
                    Rung::Store => store.consume(TOKEN_SCOPE, token).await?,
                    Rung::Client => {
                        let mut conn = conn.expect("redis");
                        let key = format!("{PREFIX}{{{token}}}token:{TOKEN_SCOPE}");
                        let spent: Option<String> = redis::cmd("GETDEL").arg(key).query_async(&mut conn).await?;
                        spent.is_some()
                    }
                };
                // Each token is issued fresh and sent once.
                if spent { Ok(Step::Done) } else { Err("a fresh token was refused".into()) }
            }
        })
        .await?;
        let used = next.load(Ordering::Relaxed).min(tokens.len());
        self.discard(&tokens[used..]).await?;
        Ok(sample)
    }

    /// Lock calls, each client on a lock name of its own: guarded,
    /// `idem::lock::acquire` + `release`, or the store's two scripts invoked
    /// through redis-rs.
    async fn lock_slice(&self, clients: usize, length: Duration, rung: Rung) -> Result<Sample, BoxError> {
        // The same names every run: each lock's fencing counter lives on
        // for a week after its last grant, so fresh names would pile up.
        let names: Arc<Vec<String>> = Arc::new((0..clients.max(1)).map(|c| format!("client-{c}")).collect());
        let store = self.locks.clone();
        let conn = self.redis.as_ref().map(|r| r.client.clone());
        let seq = Arc::new(AtomicU64::new(0));
        measure(("lock", rung), clients, length, move |client| {
            let (store, names, conn) = (store.clone(), names.clone(), conn.clone());
            let n = seq.fetch_add(1, Ordering::Relaxed);
            async move {
                let name = &names[client];
                let released = match rung {
                    Rung::Guard => {
                        exclusive(&*store, name).await?;
                        true
                    }
                    Rung::Store => {
                        let held =
                            idem::lock::acquire(&*store, "bench.lock.store", name, LOCK_TTL, Duration::ZERO).await?;
                        held.release().await?
                    }
                    Rung::Client => {
                        let mut conn = conn.expect("redis");
                        let owner = format!("raw-{n}");
                        let lock = format!("{PREFIX}{{raw:{name}}}:lock");
                        let mut acquire = ACQUIRE.key(&lock);
                        acquire.key(format!("{PREFIX}{{raw:{name}}}:fence")).arg(&owner).arg(30_000).arg(604_800_000);
                        let (got, _): (i64, i64) = acquire.invoke_async(&mut conn).await?;
                        let n: i64 = RELEASE.key(&lock).arg(&owner).invoke_async(&mut conn).await?;
                        got == 1 && n == 1
                    }
                };
                // Each client locks a name of its own: nobody else holds it.
                if released {
                    Ok(Step::Done)
                } else {
                    Err("a lock of the client's own not granted or not released".into())
                }
            }
        })
        .await
    }

    /// `redis-benchmark` at `clients` connections: calls per second of
    /// `GETDEL` (the token consume) on random absent keys of the token key's
    /// shape, or with `script` of `EVALSHA` of the lock release script (one
    /// script call) on such keys.
    async fn redis_benchmark(&self, clients: usize, requests: u64, script: bool) -> Result<f64, BoxError> {
        let raw = self.redis.as_ref().expect("redis");
        let args: Vec<String> =
            ["-u", &raw.url, "-c", &clients.max(1).to_string(), "-n", &requests.to_string(), "-r", "1000000", "--csv"]
                .iter()
                .map(|s| s.to_string())
                .collect();
        let key = format!("{PREFIX}{{{:020}__rand_int__}}token:{TOKEN_SCOPE}", 0);
        let command = if script { "EVALSHA" } else { "GETDEL" };
        let mut args = args;
        if script {
            args.extend([command.to_owned(), raw.sha.clone(), "1".to_owned(), key, "owner".to_owned()]);
        } else {
            args.extend([command.to_owned(), key]);
        }
        let out =
            tokio::task::spawn_blocking(move || std::process::Command::new("redis-benchmark").args(&args).output())
                .await?
                .map_err(|e| {
                    format!("could not run redis-benchmark (installed with redis-server / redis-tools): {e}")
                })?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        // --csv: a header, then `"GETDEL ...","<rps>","<avg ms>",...`.
        let rps = stdout
            .lines()
            .find(|l| l.starts_with(&format!("\"{command}")))
            .and_then(|l| l.split("\",\"").nth(1))
            .and_then(|rps| rps.trim_matches('"').parse::<f64>().ok());
        rps.ok_or_else(|| {
            format!("unexpected redis-benchmark output: {stdout} {}", String::from_utf8_lossy(&out.stderr)).into()
        })
    }

    /// Round trips per call, counted on the connection: `calls` serial
    /// calls through a store on a counting connection.
    async fn round_trips(&self, lock: bool, calls: u64) -> Result<Option<f64>, BoxError> {
        let Some(raw) = &self.redis else { return Ok(None) };
        let store = &raw.counted;
        let tokens =
            if lock { Arc::new(Vec::new()) } else { self.issue(&format!("{}rt", self.run), calls as usize).await? };
        // Once before counting, so that the scripts are loaded (a first
        // EVALSHA may answer NOSCRIPT and be sent again).
        exclusive(store, "round-trips").await?;
        idem::token::consume(store, TOKEN_SCOPE, "not-issued").await?;
        let before = raw.sent.load(Ordering::Relaxed);
        if lock {
            for _ in 0..calls {
                exclusive(store, "round-trips").await?;
            }
        } else {
            for token in tokens.iter() {
                submit(store, token).await?;
            }
        }
        Ok(Some((raw.sent.load(Ordering::Relaxed) - before) as f64 / calls as f64))
    }
}

/// A bijection on u64 (splitmix64's finaliser).
fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// `(p50, p99)` in microseconds.
fn percentiles(mut ns: Vec<u32>) -> (f64, f64) {
    ns.sort_unstable();
    let at = |p: f64| {
        if ns.is_empty() { f64::NAN } else { f64::from(ns[((ns.len() - 1) as f64 * p).round() as usize]) / 1000.0 }
    };
    (at(0.50), at(0.99))
}

/// Per-series values of every round, and the pooled guard latencies.
#[derive(Default)]
struct Series {
    values: std::collections::BTreeMap<&'static str, Vec<f64>>,
    latencies_ns: Vec<u32>,
}

impl Series {
    fn push(&mut self, name: &'static str, v: f64) {
        self.values.entry(name).or_default().push(v);
    }
    fn m(&self, name: &str) -> f64 {
        self.values.get(name).cloned().map_or(f64::NAN, median)
    }
    fn spread(&self, name: &str) -> String {
        self.values.get(name).map_or_else(|| "-".to_owned(), |v| spread(v))
    }
    fn guard(&mut self, s: Sample) -> f64 {
        let rate = s.rate();
        self.latencies_ns.extend(s.latencies_ns);
        rate
    }
}

pub async fn run_token(
    redis_url: Option<&str>,
    connection: Connection,
    pool: usize,
    clients: usize,
    seconds: u64,
    rounds: u32,
) -> Result<(), BoxError> {
    let b = Bench::connect(redis_url, connection, pool).await?;
    let rounds = rounds.max(1);
    let redis = b.redis.is_some();
    let slices = if redis { 4.0 } else { 2.0 };
    let per_slice = crate::slice_length(seconds, rounds, slices, 0.5);
    // Warm-up: connections open, scripts loaded, the first rates known.
    // Also the issue -> guard path end to end, through the public API.
    for _ in 0..100 {
        let token = idem::token::issue(&*b.tokens, TOKEN_SCOPE, TOKEN_TTL).await?;
        submit(&*b.tokens, &token).await?;
    }
    let warm = Duration::from_millis(500);
    let mut best = 20_000.0_f64;
    for rung in [Rung::Guard, Rung::Store, Rung::Client] {
        if rung != Rung::Client || redis {
            let s = b.tokens_slice(clients, warm, best, rung, &format!("{}w{rung:?}", b.run)).await?;
            best = best.max(s.rate());
        }
    }
    let mut raw_best = if redis { b.redis_benchmark(clients, 20_000, false).await? } else { 0.0 };
    let mut t = Series::default();
    for round in 0..rounds {
        let tag = format!("{}r{round}", b.run);
        let guard = b.tokens_slice(clients, per_slice, best, Rung::Guard, &format!("{tag}g")).await?;
        let guard = t.guard(guard);
        best = best.max(guard);
        t.push("guard", guard);
        let direct = b.tokens_slice(clients, per_slice, best, Rung::Store, &format!("{tag}d")).await?;
        let direct = direct.rate();
        t.push("store", direct);
        if redis {
            let client = b.tokens_slice(clients, per_slice, best, Rung::Client, &format!("{tag}c")).await?;
            let client = client.rate();
            t.push("client", client);
            let requests = ((raw_best * per_slice.as_secs_f64()) as u64).clamp(20_000, 5_000_000);
            let raw = b.redis_benchmark(clients, requests, false).await?;
            raw_best = raw_best.max(raw);
            t.push("raw", raw);
            t.push("ratio", guard / raw);
            t.push("vs_client", guard / client);
        }
        eprintln!(
            "round {round}: {:?}",
            t.values.iter().map(|(k, v)| (*k, v.last().map(|x| (x * 1000.0).round() / 1000.0))).collect::<Vec<_>>()
        );
    }
    let trips = b.round_trips(false, 200).await?;
    let (p50, p99) = percentiles(std::mem::take(&mut t.latencies_ns));
    let name = b.name;
    println!(
        "token on {name}: {clients} clients, {rounds} rounds of {per_slice:?}: guarded consumes/s {}, bare store consume {}",
        t.spread("guard"),
        t.spread("store")
    );
    let mut line = format!("scenario=token store={name} clients={clients} consume_per_s={:.0}", t.m("guard"));
    if redis {
        println!(
            "raw: redis-benchmark GETDEL/s {}; GETDEL through redis-rs {}; guard/raw {:.3}, guard/redis-rs {:.3}",
            t.spread("raw"),
            t.spread("client"),
            t.m("ratio"),
            t.m("vs_client")
        );
        line.push_str(&format!(" raw_getdel_per_s={:.0} ratio={:.3}", t.m("raw"), t.m("ratio")));
    }
    line.push_str(&format!(" p50_us={p50:.1} p99_us={p99:.1}"));
    line.push_str(&format!(" store_consume_per_s={:.0}", t.m("store")));
    if redis {
        line.push_str(&format!(
            " client_consume_per_s={:.0} vs_client={:.3} round_trips_per_call={:.2} connection={}",
            t.m("client"),
            t.m("vs_client"),
            trips.unwrap_or(f64::NAN),
            connection.label(pool)
        ));
    }
    println!("{line}");
    Ok(())
}

pub async fn run_lock(
    redis_url: Option<&str>,
    connection: Connection,
    pool: usize,
    clients: usize,
    seconds: u64,
    rounds: u32,
) -> Result<(), BoxError> {
    let b = Bench::connect(redis_url, connection, pool).await?;
    let rounds = rounds.max(1);
    let redis = b.redis.is_some();
    let slices = if redis { 8.0 } else { 4.0 };
    let per_slice = crate::slice_length(seconds, rounds, slices, 0.5);
    let levels: Vec<usize> = if clients > 1 { vec![1, clients] } else { vec![1] };
    // Warm-up.
    let mut raw_best = std::collections::HashMap::new();
    for &n in &levels {
        b.lock_slice(n, Duration::from_millis(300), Rung::Guard).await?;
        b.lock_slice(n, Duration::from_millis(300), Rung::Store).await?;
        if redis {
            b.lock_slice(n, Duration::from_millis(300), Rung::Client).await?;
            raw_best.insert(n, b.redis_benchmark(n, 20_000, true).await?);
        }
    }
    let mut series: Vec<Series> = levels.iter().map(|_| Series::default()).collect();
    for round in 0..rounds {
        for (i, &n) in levels.iter().enumerate() {
            let t = &mut series[i];
            let guard = b.lock_slice(n, per_slice, Rung::Guard).await?;
            let guard = t.guard(guard);
            t.push("guard", guard);
            let direct = b.lock_slice(n, per_slice, Rung::Store).await?;
            let direct = direct.rate();
            t.push("store", direct);
            if redis {
                let client = b.lock_slice(n, per_slice, Rung::Client).await?;
                let client = client.rate();
                t.push("client", client);
                let best = raw_best.get(&n).copied().unwrap_or(20_000.0);
                let requests = ((best * per_slice.as_secs_f64()) as u64).clamp(20_000, 5_000_000);
                let raw = b.redis_benchmark(n, requests, true).await?;
                raw_best.insert(n, best.max(raw));
                t.push("floor", raw / 2.0);
                t.push("vs_floor", guard / (raw / 2.0));
                t.push("vs_client", guard / client);
            }
            eprintln!(
                "round {round}, {n} clients: {:?}",
                t.values.iter().map(|(k, v)| (*k, v.last().map(|x| (x * 1000.0).round() / 1000.0))).collect::<Vec<_>>()
            );
        }
    }
    let trips = b.round_trips(true, 200).await?;
    let name = b.name;
    for (i, &n) in levels.iter().enumerate() {
        let t = &mut series[i];
        let (p50, p99) = percentiles(std::mem::take(&mut t.latencies_ns));
        println!(
            "lock on {name}: {n} clients, {rounds} rounds of {per_slice:?}: guarded lock calls/s {}, bare acquire+release {}",
            t.spread("guard"),
            t.spread("store")
        );
        let mut line = format!("scenario=lock store={name} clients={n} lock_calls_per_s={:.0}", t.m("guard"));
        if let Some(trips) = trips {
            println!(
                "floor (redis-benchmark EVALSHA/s / 2) {}, the two scripts through redis-rs {}; guard/floor {:.3}, guard/redis-rs {:.3}",
                t.spread("floor"),
                t.spread("client"),
                t.m("vs_floor"),
                t.m("vs_client")
            );
            line.push_str(&format!(" round_trips_per_call={trips:.2} floor_per_s={:.0}", t.m("floor")));
        }
        line.push_str(&format!(" p50_us={p50:.1} p99_us={p99:.1}"));
        line.push_str(&format!(" store_calls_per_s={:.0}", t.m("store")));
        if redis {
            line.push_str(&format!(
                " vs_floor={:.3} client_pair_per_s={:.0} vs_client={:.3} connection={}",
                t.m("vs_floor"),
                t.m("client"),
                t.m("vs_client"),
                connection.label(pool)
            ));
        }
        println!("{line}");
    }
    Ok(())
}
