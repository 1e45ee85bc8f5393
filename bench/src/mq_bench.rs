//! `loadgen --scenario mq`: what `precheck = "redis"` buys a message
//! consumer whose deliveries are half repeats.
//!
//! No broker in the loop (the broker is not what is measured): N client
//! tasks take messages from a shared feed. Every other message is the first
//! delivery of a fresh business key; the rest repeat a key this mode already
//! processed and committed (picked among the last [`RECENT`] completed keys),
//! so every repeat meets a completed record. Each message: begin, the guarded
//! handler (book a ledger entry and its application log, bump the account's
//! counter), commit. Two handlers with the same body and the same attribute
//! but for the precheck:
//! - `plain`: `dedup` alone; a repeat costs the claim INSERT (a conflict)
//!   and the read of the record;
//! - `prechecked`: `precheck = "redis"` on a Redis marker store
//!   (`--redis-url`) or the memory store; a repeat costs the marker round
//!   trip and one read, a first delivery the marker round trip more.
//!
//! The two modes alternate in slices within one run (the order swapped each
//! round), each with its own keys and the same mix; throughputs are medians
//! over rounds, the speed-up the median of per-round ratios. Statements
//! saved are counted from `idem::precheck::counters()`: `confirmed` repeats
//! replayed without the claim.

use crate::lease_bench::median;
use crate::percentile;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem::precheck::{Counters, PrecheckStore};
use idem::{Outcome, idempotent};
use sqlx::Transaction;

use crate::common::{AppError, BoxError, Ledger, Shop, Store};
use crate::errors::Errors;

/// Share of the messages that repeat a completed key.
const DUP_RATIO: f64 = 0.5;
/// Repeats pick among this many most recently completed keys of their mode.
const RECENT: usize = 8192;
/// Prefix of this benchmark's ledger runs (`mq_ledger.run`), reset at start.
const RUN_PREFIX: &str = "mqbench-";

/// The consumer's effect: a ledger entry and its application log (two
/// INSERTs), and the account's counter (one UPDATE).
async fn effect<DB: Ledger + Shop>(
    conn: &mut DB::Connection,
    run: &str,
    key: &str,
    account: i64,
) -> Result<i64, sqlx::Error> {
    let entry = DB::book(conn, run, key, account, 100).await?;
    DB::bump_user(conn, account).await?;
    Ok(entry)
}

#[idempotent(key = "key", scope = "loadgen.mq", retention = "1h")]
async fn plain<DB: Ledger + Shop>(
    tx: &mut Transaction<'_, DB>,
    run: &str,
    key: &str,
    account: i64,
) -> Result<i64, AppError>
where
    DB::Connection: Send,
{
    Ok(effect::<DB>(tx, run, key, account).await?)
}

#[idempotent(key = "key", scope = "loadgen.mq", retention = "1h", precheck = "redis", ttl = "1h", store = "marks")]
async fn prechecked<DB: Ledger + Shop>(
    tx: &mut Transaction<'_, DB>,
    marks: &dyn PrecheckStore,
    run: &str,
    key: &str,
    account: i64,
) -> Result<i64, AppError>
where
    DB::Connection: Send,
{
    Ok(effect::<DB>(tx, run, key, account).await?)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Plain,
    Precheck,
}

/// One mode's messages: fresh keys `{run}-{tag}{k}`, and repeats of keys
/// whose first delivery committed.
struct Feed {
    tag: char,
    /// Messages handed out: odd ones are repeats (once a key has completed).
    seq: AtomicU64,
    /// Fresh keys handed out.
    fresh: AtomicU64,
    /// The last [`RECENT`] completed keys (ring) and the next slot.
    done: Mutex<(Vec<u64>, usize)>,
}

enum Msg {
    First(u64),
    Repeat(u64),
}

impl Feed {
    fn new(tag: char) -> Feed {
        Feed { tag, seq: AtomicU64::new(0), fresh: AtomicU64::new(0), done: Mutex::new((Vec::new(), 0)) }
    }

    fn next(&self) -> Msg {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        if n % 2 == 1 {
            let done = self.done.lock().unwrap();
            if !done.0.is_empty() {
                // A fixed scramble of n: repeats spread over the recent keys.
                let pick = n.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 17;
                return Msg::Repeat(done.0[(pick % done.0.len() as u64) as usize]);
            }
        }
        Msg::First(self.fresh.fetch_add(1, Ordering::Relaxed))
    }

    fn completed(&self, k: u64) {
        let mut done = self.done.lock().unwrap();
        let (ring, next) = &mut *done;
        if ring.len() < RECENT {
            ring.push(k);
        } else {
            ring[*next] = k;
            *next = (*next + 1) % RECENT;
        }
    }
}

struct Ctx<DB: sqlx::Database> {
    pool: sqlx::Pool<DB>,
    marks: Arc<dyn PrecheckStore>,
    run: String,
    plain: Feed,
    precheck: Feed,
}

/// One message: begin, the handler, commit; whether the guard ran the body.
async fn deliver<DB: Ledger + Shop>(ctx: &Ctx<DB>, mode: Mode, key: &str, account: i64) -> Result<Outcome, AppError>
where
    DB::Connection: Send,
{
    let mut tx = ctx.pool.begin().await?;
    let (entry, outcome) = match mode {
        Mode::Plain => idem::observe(plain(&mut tx, &ctx.run, key, account)).await,
        Mode::Precheck => idem::observe(prechecked(&mut tx, &*ctx.marks, &ctx.run, key, account)).await,
    };
    entry?;
    tx.commit().await?;
    Ok(outcome.expect("a guard ran"))
}

#[derive(Default)]
struct Tally {
    msgs: u64,
    firsts: u64,
    repeats: u64,
    slice_tps: Vec<f64>,
    latencies_us: Vec<u32>,
    /// Of the repeats alone.
    repeat_latencies_us: Vec<u32>,
    /// Precheck counters gained during this mode's slices.
    counters: Counters,
}

#[derive(Default)]
struct ClientResult {
    firsts: u64,
    repeats: u64,
    /// Failed deliveries, and first deliveries that replayed or repeats
    /// that ran the body.
    errors: Errors,
    latencies_us: Vec<u32>,
    repeat_latencies_us: Vec<u32>,
}

async fn slice<DB: Ledger + Shop>(
    ctx: &Arc<Ctx<DB>>,
    mode: Mode,
    clients: usize,
    length: Duration,
    tally: &mut Tally,
) -> Result<(), BoxError>
where
    DB::Connection: Send,
{
    let before = idem::precheck::counters();
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients.max(1) {
        let (ctx, stop) = (ctx.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let feed = if mode == Mode::Plain { &ctx.plain } else { &ctx.precheck };
            let mut out = ClientResult::default();
            while !stop.load(Ordering::Relaxed) {
                let (k, first) = match feed.next() {
                    Msg::First(k) => (k, true),
                    Msg::Repeat(k) => (k, false),
                };
                let key = format!("{}-{}{k}", ctx.run, feed.tag);
                let account = (k.wrapping_mul(104_729) % 1000) as i64;
                let t = Instant::now();
                match deliver(&ctx, mode, &key, account).await {
                    Ok(outcome) => {
                        let us = t.elapsed().as_micros().min(u128::from(u32::MAX)) as u32;
                        out.latencies_us.push(us);
                        if first {
                            out.firsts += 1;
                            feed.completed(k);
                        } else {
                            out.repeats += 1;
                            out.repeat_latencies_us.push(us);
                        }
                        match (outcome == Outcome::Executed, first) {
                            (false, true) => out.errors.add(format!("first delivery of {key} replayed")),
                            (true, false) => out.errors.add(format!("repeat of {key} ran the body")),
                            _ => {}
                        }
                    }
                    Err(e) => out.errors.add(e),
                }
            }
            out
        }));
    }
    tokio::time::sleep(length).await;
    stop.store(true, Ordering::Relaxed);
    let (mut msgs, mut errors) = (0, Errors::default());
    for t in tasks {
        let out = t.await.expect("client task");
        msgs += out.latencies_us.len() as u64;
        tally.firsts += out.firsts;
        tally.repeats += out.repeats;
        errors.absorb(out.errors);
        tally.latencies_us.extend(out.latencies_us);
        tally.repeat_latencies_us.extend(out.repeat_latencies_us);
    }
    let elapsed = started.elapsed();
    tally.msgs += msgs;
    tally.slice_tps.push(msgs as f64 / elapsed.as_secs_f64());
    let after = idem::precheck::counters();
    let c = &mut tally.counters;
    c.marked += after.marked - before.marked;
    c.seen += after.seen - before.seen;
    c.confirmed += after.confirmed - before.confirmed;
    c.missing += after.missing - before.missing;
    c.unavailable += after.unavailable - before.unavailable;
    errors.check("mq", &format!("{mode:?}"))
}

/// Earlier runs' records and ledger rows, removed at start so every run
/// starts from the same table sizes.
const RESET: &str = "DELETE FROM idem_records WHERE scope = 'loadgen.mq'; \
                     DELETE FROM mq_ledger WHERE run LIKE 'mqbench-%'; \
                     DELETE FROM mq_applied WHERE run LIKE 'mqbench-%'";

/// Database statements per message, BEGIN and COMMIT included (checked
/// against sqlx's statement log; the pool's liveness ping on acquire, the
/// same in both modes, is not counted).
struct Model {
    /// BEGIN, claim INSERT, 2 INSERTs + 1 UPDATE of the body, the record's
    /// completing UPDATE, COMMIT: the same in both modes.
    first: u64,
    /// Without the precheck: BEGIN, claim INSERT (conflict), read, COMMIT.
    plain_repeat: u64,
    /// With the precheck, a confirmed hit: BEGIN, read, COMMIT; on SQLite
    /// the read is preceded by a no-op UPDATE that takes the write lock
    /// (`read_then_claim`), so no statement is saved there.
    precheck_repeat: u64,
}

fn model(backend: &str) -> Model {
    Model { first: 7, plain_repeat: 4, precheck_repeat: if backend == "sqlite" { 4 } else { 3 } }
}

pub async fn run(
    database_url: Option<&str>,
    redis_url: Option<&str>,
    clients: usize,
    seconds: u64,
    rounds: u32,
) -> Result<(), BoxError> {
    let store = Store::connect(database_url, clients as u32 + 2).await?;
    let name = store.name();
    let result = crate::common::on_pool!(&store, pool => async {
        idem::migrate(pool).await?;
        Shop::setup(pool).await?;
        Ledger::setup_ledger(pool).await?;
        sqlx::raw_sql(RESET).execute(pool).await?;
        if name == "postgres" {
            // One statement each: VACUUM refuses to run inside a multi-statement query.
            for table in ["idem_records", "mq_ledger", "mq_applied", "shop_users"] {
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!("VACUUM ANALYZE {table}"))).execute(pool).await?;
            }
        }
        bench(name, pool, redis_url, clients, seconds, rounds).await
    }
    .await);
    store.close().await;
    result
}

async fn bench<DB: Ledger + Shop>(
    db: &str,
    pool: &sqlx::Pool<DB>,
    redis_url: Option<&str>,
    clients: usize,
    seconds: u64,
    rounds: u32,
) -> Result<(), BoxError>
where
    DB::Connection: Send,
{
    let id = crate::common::run_id();
    let (run, prefix) = (format!("{RUN_PREFIX}{id}"), format!("idem-mqbench-{id}:"));
    let mut redis = None;
    let (markers, marks): (&str, Arc<dyn PrecheckStore>) = match redis_url {
        Some(url) => {
            let conn = redis::Client::open(url)?.get_multiplexed_async_connection().await?;
            redis = Some(conn.clone());
            ("redis", Arc::new(idem::store::RedisStore::new(conn, prefix.clone())))
        }
        None => ("memory", Arc::new(idem::store::MemoryStore::new())),
    };
    let ctx =
        Arc::new(Ctx { pool: pool.clone(), marks, run: run.clone(), plain: Feed::new('p'), precheck: Feed::new('c') });
    let rounds = rounds.max(1);
    let slice_len = crate::slice_length(seconds, rounds, 2.0, 0.2);

    // Warm-up (not counted): connections and statement caches, and the first
    // completed keys of each mode for the repeats to pick from.
    let mut warm = Tally::default();
    for mode in [Mode::Plain, Mode::Precheck] {
        slice(&ctx, mode, clients, Duration::from_millis(500), &mut warm).await?;
    }
    let (mut plain, mut pre) = (Tally::default(), Tally::default());
    let mut ratios = Vec::new();
    for round in 0..rounds {
        // Swap the order each round so neither mode always follows the other.
        let order = if round % 2 == 0 { [Mode::Plain, Mode::Precheck] } else { [Mode::Precheck, Mode::Plain] };
        for mode in order {
            let tally = if mode == Mode::Plain { &mut plain } else { &mut pre };
            slice(&ctx, mode, clients, slice_len, tally).await?;
        }
        let last = |t: &Tally| t.slice_tps.last().copied().unwrap_or(f64::NAN);
        ratios.push(last(&pre) / last(&plain));
    }

    let (plain_tps, pre_tps) = (median(plain.slice_tps.clone()), median(pre.slice_tps.clone()));
    let speedup = median(ratios.clone());
    let pct = |v: &mut Vec<u32>| {
        v.sort_unstable();
        (percentile(v, 0.50), percentile(v, 0.99))
    };
    let ((plain_p50, plain_p99), (pre_p50, pre_p99)) = (pct(&mut plain.latencies_us), pct(&mut pre.latencies_us));
    let (plain_rp50, _) = pct(&mut plain.repeat_latencies_us);
    let (pre_rp50, _) = pct(&mut pre.repeat_latencies_us);
    let m = model(db);
    let per_hit = m.plain_repeat - m.precheck_repeat;
    let c = pre.counters;
    let saved = c.confirmed * per_hit;
    let saved_per_msg = saved as f64 / pre.msgs.max(1) as f64;
    let stmts = |t: &Tally, repeat: u64| {
        (m.first * t.firsts + repeat * t.repeats) as f64 / (t.firsts + t.repeats).max(1) as f64
    };
    let plain_stmts = stmts(&plain, m.plain_repeat);
    let pre_stmts = stmts(&pre, m.plain_repeat) - saved as f64 / (pre.firsts + pre.repeats).max(1) as f64;

    // Every first delivery booked once, no repeat booked again.
    let (entries, applied, keys) = DB::ledger_report(pool, &run).await?;
    let executed = (warm.firsts + plain.firsts + pre.firsts) as i64;
    let ledger_ok = entries == executed && applied == executed && keys == executed;
    if let Some(mut conn) = redis {
        forget(&mut conn, &prefix).await?;
    }
    if !ledger_ok {
        return Err(format!(
            "scenario mq: ledger: {entries} entries, {applied} applications, {keys} keys for {executed} first deliveries"
        )
        .into());
    }

    let dup = |t: &Tally| t.repeats as f64 / (t.firsts + t.repeats).max(1) as f64;
    let store = format!("{db}+{markers}");
    println!(
        "mq on {store}: {clients} clients, {rounds} rounds of {:.1} s per mode, repeats {:.1}% / {:.1}% of the \
         messages",
        slice_len.as_secs_f64(),
        100.0 * dup(&plain),
        100.0 * dup(&pre),
    );
    println!(
        "  without precheck: {plain_tps:.0} msgs/s (median), p50 {plain_p50} us, p99 {plain_p99} us, repeats p50 \
         {plain_rp50} us; {} messages",
        plain.msgs
    );
    println!(
        "  with precheck:    {pre_tps:.0} msgs/s (median), p50 {pre_p50} us, p99 {pre_p99} us, repeats p50 {pre_rp50} \
         us; {} messages",
        pre.msgs
    );
    let shown: Vec<String> = ratios.iter().map(|r| format!("{r:.3}")).collect();
    println!("  speed-up {speedup:.3} (median of the per-round ratios {})", shown.join(" "));
    println!(
        "  precheck counters in its slices: marked {} seen {} confirmed {} missing {} unavailable {}: {} claims \
         skipped, {saved} statements saved ({per_hit} per confirmed repeat on {db})",
        c.marked, c.seen, c.confirmed, c.missing, c.unavailable, c.confirmed
    );
    println!(
        "  database statements per message (BEGIN..COMMIT): first delivery {} in both modes; repeat {} without, {} \
         with the precheck (+1 marker check per message, {markers}); this mix: {plain_stmts:.2} vs {pre_stmts:.2}",
        m.first, m.plain_repeat, m.precheck_repeat
    );
    println!("  ledger: {entries} entries, {applied} applications, {keys} keys for {executed} first deliveries");
    println!(
        "scenario=mq store={store} clients={clients} dup_ratio={DUP_RATIO} plain_msgs_per_s={plain_tps:.0} \
         precheck_msgs_per_s={pre_tps:.0} speedup={speedup:.3} queries_saved={saved} \
         queries_saved_per_msg={saved_per_msg:.3} plain_p50_us={plain_p50} plain_p99_us={plain_p99} \
         precheck_p50_us={pre_p50} precheck_p99_us={pre_p99} plain_repeat_p50_us={plain_rp50} precheck_repeat_p50_us={pre_rp50} claims_skipped={} plain_stmts_per_msg={plain_stmts:.2} \
         precheck_stmts_per_msg={pre_stmts:.2}",
        c.confirmed
    );
    Ok(())
}

/// Delete this run's markers (SCAN + UNLINK: never blocks the server long).
async fn forget(conn: &mut redis::aio::MultiplexedConnection, prefix: &str) -> Result<(), BoxError> {
    let mut cursor = 0u64;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await?;
        if !keys.is_empty() {
            redis::cmd("UNLINK").arg(&keys).query_async::<()>(conn).await?;
        }
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}
