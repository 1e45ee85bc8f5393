//! The incident: a ledger consumer behind a message broker. Brokers deliver
//! at least once: a consumer that crashes after its work but before its ack
//! gets the message again, and producers re-publish on a timeout (a new
//! message, a new message id, the same business fact). A consumer that
//! trusts "one delivery, one effect" books such postings twice.
//!
//! Three lines of defence: a Redis "seen" marker (`Guard::precheck`) stops
//! most repeats with one round trip and one read; the dedup record,
//! written in the ledger's transaction, is the truth (Redis can be flushed or
//! fail over); the ledger's unique index on the business key is the last
//! resort. The key is the business key the producer put in the
//! `x-idempotency-key` header, never the broker's delivery tag or message id.
//!
//! The consumer takes its deliveries in batches (`--batch N`, up to N at a
//! time) and runs them with `idem::batch::dedup`: each message under its
//! own guard, in a transaction of its own, so a poison message (a posting
//! to an account the ledger does not have) fails alone. The others are
//! acknowledged; the poison is retried (a copy that waits out a backoff,
//! then goes to the back of the queue, its attempts in a header) and after `--max-attempts` dead-lettered with
//! its last error (see `broker.rs`). A body that is not a posting is
//! dead-lettered at its first attempt: a retry would read the same bytes.
//!
//! The run: 1,000 postings, 20% re-published, 3 poison postings, every
//! 10th delivery nacked and requeued after its work committed, two
//! competing consumers, the markers flushed halfway, a few messages without
//! a key (refused and dead-lettered at once). Each posting is booked once.
//!
//! ```text
//! cargo run -p idem-mq-consumer          # in-process queue, memory markers, SQLite
//! cargo run -p idem-mq-consumer -- --amqp-url amqp://guest:guest@127.0.0.1:5672/%2f \
//!     --redis-url redis://127.0.0.1:6379/ --database-url postgres://postgres@127.0.0.1:5432/test
//! ```
//!
//! The flush halfway deletes this run's markers (its keys' prefix), never
//! anything else in the database the Redis URL names.

// A package of its own (`idem-mq-consumer`, not an example of the root
// package): the RabbitMQ client is needed here and in its test only, and
// every example of a package compiles every dev-dependency of it.
mod broker;
// The examples' shared set-up: stores, the ledger's tables.
#[path = "../../common/mod.rs"]
mod common;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use broker::{Broker, Delivery, KEY_HEADER, Message, Source, Verdict};
use clap::Parser;
use common::{AppError, BoxError, Ledger, Store};
use idem::Guard;
use idem::batch::{Failure, Handled};
use idem::precheck::PrecheckStore;
use serde::{Deserialize, Serialize};
use sqlx::Transaction;

/// What the producer publishes: a posting, keyed by its business key.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Posting {
    account: i64,
    amount_cents: i64,
}

/// How long a batch waits, after its first delivery, for the others.
const LINGER: Duration = Duration::from_millis(20);
/// How long the markers live: longer than producers retry.
const MARKER_TTL: Duration = Duration::from_secs(2 * 24 * 3600);

/// What every consumer task shares.
struct Consumer<DB: sqlx::Database> {
    pool: sqlx::Pool<DB>,
    precheck: Arc<dyn PrecheckStore>,
    run: String,
    stats: Stats,
    batch: usize,
    max_attempts: u32,
    nack_every: usize,
    work: Duration,
    trace: bool,
}

#[derive(Default)]
struct Stats {
    delivered: AtomicUsize,
    redelivered: AtomicUsize,
    batches: AtomicUsize,
    executed: AtomicUsize,
    replayed: AtomicUsize,
    nacked: AtomicUsize,
    /// Failed attempts that were retried.
    retried: AtomicUsize,
    /// Messages that failed every attempt, dead-lettered.
    poison: AtomicUsize,
    /// Finally settled: acked, or dead-lettered.
    settled: AtomicUsize,
    keyless: AtomicUsize,
    /// Messages no attempt can handle (a body that is not a posting),
    /// dead-lettered at their first.
    malformed: AtomicUsize,
    /// A duplicate that got past the guards and hit the unique index.
    index_saves: AtomicUsize,
    errors: AtomicUsize,
    /// Batches being handled, and when the last one was settled.
    busy: AtomicUsize,
    last_settled: Mutex<Option<Instant>>,
}

/// One delivery of a batch as its handler sees it.
struct Work<'d> {
    delivery: &'d Delivery,
    posting: Result<Posting, String>,
    /// Which batch, and where in it (from 1), for `--trace`.
    batch: usize,
    index: usize,
}

/// Book the posting in `tx`. The ledger has no negative accounts: such a
/// posting is a poison message, failing every attempt.
async fn book<DB: Ledger>(tx: &mut Transaction<'_, DB>, c: &Consumer<DB>, w: &Work<'_>) -> Result<i64, AppError>
where
    DB::Connection: Send,
{
    let posting = w.posting.as_ref().map_err(|e| AppError::Malformed(e.clone()))?;
    // The guard refused a message without a key before the handler ran.
    let key = w.delivery.msg.key.as_deref().unwrap_or_default();
    if c.trace {
        println!("   batch {}, message {}: applying {key}", w.batch, w.index);
    }
    if posting.account < 0 {
        return Err(AppError::Unexpected(format!("the ledger has no account {}", posting.account)));
    }
    if !c.work.is_zero() {
        tokio::time::sleep(c.work).await;
    }
    Ok(DB::book(tx, &c.run, key, posting.account, posting.amount_cents).await?)
}

/// One batch: each delivery under its own guard, in its own transaction.
async fn handle<DB: Ledger>(c: &Consumer<DB>, batch: usize, deliveries: &[Delivery]) -> Vec<Handled<i64, AppError>>
where
    DB::Connection: Send,
{
    let work: Vec<Work> = (deliveries.iter().enumerate())
        .map(|(i, delivery)| {
            let posting =
                serde_json::from_slice(&delivery.msg.body).map_err(|e| format!("the body is not a posting: {e}"));
            Work { delivery, posting, batch, index: i + 1 }
        })
        .collect();
    let guarded = work.iter().map(|w| {
        let guard = Guard::new("mq.ledger.apply").key(&w.delivery.msg.key).precheck(&*c.precheck, MARKER_TTL);
        (if let Ok(posting) = &w.posting { guard.fingerprint(posting) } else { guard }, w)
    });
    idem::batch::dedup(&c.pool, guarded, |tx, w| Box::pin(book(tx, c, w))).await
}

fn is_unique_violation(failure: &Failure<AppError>) -> bool {
    match failure {
        Failure::Handler(AppError::Db(sqlx::Error::Database(db)))
        | Failure::Idem(idem::Error::Database(sqlx::Error::Database(db))) => db.is_unique_violation(),
        _ => false,
    }
}

/// What to tell the broker about the `n`-th delivery.
fn verdict<DB: sqlx::Database>(c: &Consumer<DB>, n: usize, attempts: u32, handled: Handled<i64, AppError>) -> Verdict {
    let count = |counter: &AtomicUsize| counter.fetch_add(1, Relaxed);
    let failure = match handled {
        Handled::Failed(failure) => failure,
        done => {
            count(if matches!(done, Handled::Succeeded(_)) { &c.stats.executed } else { &c.stats.replayed });
            if n.is_multiple_of(c.nack_every) {
                count(&c.stats.nacked);
                return Verdict::Requeue; // the work committed, then "the consumer crashed" before its ack
            }
            count(&c.stats.settled);
            return Verdict::Ack;
        }
    };
    let error = failure.to_string();
    if !failure.is_retryable() {
        // No key (or the key with another payload) will never pass: not done, not retried.
        if !matches!(failure, Failure::Idem(idem::Error::InvalidKey { .. })) {
            count(&c.stats.errors);
        } else if count(&c.stats.keyless) == 0 {
            println!("   refused a message without a key: {error}");
        }
        count(&c.stats.settled);
        return Verdict::DeadLetter(error);
    }
    if matches!(failure, Failure::Handler(AppError::Malformed(_))) {
        // Retrying would read the same bytes: it fails the same way.
        if count(&c.stats.malformed) == 0 {
            println!("   dead-lettered a malformed message at once: {error}");
        }
        count(&c.stats.settled);
        return Verdict::DeadLetter(error);
    }
    if is_unique_violation(&failure) {
        count(&c.stats.index_saves);
    }
    if attempts + 1 < c.max_attempts {
        count(&c.stats.retried);
        return Verdict::Retry(error);
    }
    if count(&c.stats.poison) == 0 {
        println!("   dead-lettered a message after {} attempts: {error}", attempts + 1);
    }
    count(&c.stats.settled);
    Verdict::DeadLetter(error)
}

async fn consume<DB: Ledger>(c: Arc<Consumer<DB>>, mut source: Source, broker: Arc<Broker>)
where
    DB::Connection: Send,
{
    while let Some(deliveries) = source.next_batch(c.batch, LINGER).await {
        c.stats.busy.fetch_add(1, Relaxed);
        let batch = c.stats.batches.fetch_add(1, Relaxed) + 1;
        let first = c.stats.delivered.fetch_add(deliveries.len(), Relaxed) + 1;
        c.stats.redelivered.fetch_add(deliveries.iter().filter(|d| d.redelivered).count(), Relaxed);
        let handled = handle(&c, batch, &deliveries).await;
        for (n, (delivery, handled)) in (first..).zip(deliveries.into_iter().zip(handled)) {
            let verdict = verdict(&c, n, delivery.msg.attempts, handled);
            if let Err(e) = delivery.settle(verdict, &broker).await {
                eprintln!("   !! settling a delivery failed: {e}");
                c.stats.errors.fetch_add(1, Relaxed);
            }
        }
        *c.stats.last_settled.lock().unwrap() = Some(Instant::now());
        c.stats.busy.fetch_sub(1, Relaxed);
    }
}

/// Redis for the markers, and the flush halfway through.
struct Redis {
    conn: redis::aio::ConnectionManager,
    prefix: String,
}

impl Redis {
    /// Every marker gone, as after a failover or a FLUSHALL: this run's
    /// markers deleted (never the whole database, which others may share).
    async fn flush(&mut self) -> Result<String, redis::RedisError> {
        let n = self.forget().await?;
        Ok(format!("deleted this run's {n} markers"))
    }

    /// Delete this run's markers, with `SCAN` page by page (never `KEYS`,
    /// which blocks a shared server on a big keyspace) and `UNLINK`.
    async fn forget(&mut self) -> Result<i64, redis::RedisError> {
        use redis::AsyncCommands as _;
        let mut keys = Vec::new();
        let mut scan = self.conn.scan_match::<_, String>(format!("{}*", self.prefix)).await?;
        while let Some(key) = scan.next_item().await {
            keys.push(key?);
        }
        drop(scan);
        let mut deleted = 0;
        for page in keys.chunks(1000) {
            deleted += self.conn.unlink::<_, i64>(page).await?;
        }
        Ok(deleted)
    }
}

#[derive(Parser)]
#[command(about = "An at-least-once ledger consumer books every posting once")]
struct Args {
    /// RabbitMQ, e.g. amqp://guest:guest@127.0.0.1:5672/%2f; default: an in-process queue.
    #[arg(long)]
    amqp_url: Option<String>,
    /// Redis for the precheck markers, e.g. redis://127.0.0.1:6379/; default: in process memory.
    #[arg(long)]
    redis_url: Option<String>,
    /// postgres://..., mysql://... or sqlite:PATH; default: SQLite in a temporary file.
    #[arg(long)]
    database_url: Option<String>,
    #[arg(long, default_value_t = 1000)]
    messages: usize,
    /// Percent of the messages the producer publishes twice.
    #[arg(long, default_value_t = 20)]
    republish_percent: usize,
    /// Every n-th delivery is nacked and requeued after its work.
    #[arg(long, default_value_t = 10)]
    nack_every: usize,
    /// Messages published without a key.
    #[arg(long, default_value_t = 5)]
    keyless: usize,
    /// Postings to an account the ledger does not have: they fail every attempt.
    #[arg(long, default_value_t = 3)]
    poison: usize,
    #[arg(long, default_value_t = 2)]
    consumers: usize,
    /// Deliveries each consumer takes at a time, each under its own guard.
    #[arg(long, default_value_t = 10)]
    batch: usize,
    /// Unacked deliveries per consumer (at least `--batch`).
    #[arg(long, default_value_t = 20)]
    prefetch: u16,
    /// Attempts of a failing message before it is dead-lettered.
    #[arg(long, default_value_t = 3)]
    max_attempts: u32,
    /// For tests: consume the queue NAME (and NAME.dead) that exists already, without
    /// producing, until it has been idle for a second.
    #[arg(long, hide = true)]
    queue: Option<String>,
    /// For tests: the run whose ledger entries and markers these are (default: a new one).
    #[arg(long, hide = true)]
    run: Option<String>,
    /// For tests: each message's work takes this many milliseconds, in its transaction.
    #[arg(long, hide = true, default_value_t = 0)]
    work_ms: u64,
    /// For tests: print each message as its work begins.
    #[arg(long, hide = true)]
    trace: bool,
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let store = Store::connect(args.database_url.as_deref(), 10).await?;
    let ok = common::on_pool!(&store, pool => match &args.queue {
        Some(queue) => drain(store.name(), pool, queue, &args).await?,
        None => run(store.name(), pool, &args).await?,
    });
    store.close().await;
    if !ok {
        std::process::exit(1);
    }
    Ok(())
}

/// The producer's messages: postings in order, a re-publish of every
/// `100 / percent`-th one (half right behind it, so the two consumers race,
/// half 100 messages later), and the keyless and poison ones spread in
/// between.
fn plan(run: &str, args: &Args) -> Vec<Message> {
    let body = |account: i64, amount_cents: i64| serde_json::to_vec(&Posting { account, amount_cents }).unwrap();
    let posting = |i: usize| Message {
        key: Some(format!("{run}-{i}")),
        body: body((i % 50) as i64, 100 + i as i64),
        ..Default::default()
    };
    let every = 100 / args.republish_percent.clamp(1, 100);
    let spread = |count: usize, i: usize| count > 0 && (i + 1).is_multiple_of((args.messages / count).max(1));
    let (n, mut out, mut later, mut keyless, mut poison) = (args.messages, Vec::new(), VecDeque::new(), 0, 0);
    for i in 0..n {
        out.push(posting(i));
        if i.is_multiple_of(every) && (i / every).is_multiple_of(2) {
            out.push(posting(i));
        } else if i.is_multiple_of(every) {
            later.push_back((i + 100, posting(i)));
        }
        while later.front().is_some_and(|(at, _)| *at <= i) {
            out.push(later.pop_front().unwrap().1);
        }
        if keyless < args.keyless && spread(args.keyless, i) {
            keyless += 1;
            out.push(Message { key: None, body: body(0, 1), ..Default::default() });
        }
        if poison < args.poison && spread(args.poison, i + n / (2 * args.poison.max(1))) {
            poison += 1;
            out.push(Message { key: Some(format!("{run}-poison-{poison}")), body: body(-1, 1), ..Default::default() });
        }
    }
    out.extend(later.into_iter().map(|(_, m)| m));
    out
}

/// The ledger's tables, the run id and the markers' store (with the Redis
/// connection that flushes them, if they are in Redis).
async fn set_up<DB: Ledger>(
    pool: &sqlx::Pool<DB>,
    args: &Args,
) -> Result<(String, Arc<dyn PrecheckStore>, Option<Redis>), BoxError> {
    idem::migrate(pool).await?;
    DB::setup_ledger(pool).await?;
    let run = args.run.clone().unwrap_or_else(common::run_id);
    let Some(url) = &args.redis_url else { return Ok((run, Arc::new(idem::store::MemoryStore::new()), None)) };
    let conn = redis::aio::ConnectionManager::new(redis::Client::open(url.as_str())?).await?;
    let prefix = format!("idem-mq-{run}:");
    let store = Arc::new(idem::store::RedisStore::new(conn.clone(), prefix.clone()));
    Ok((run, store, Some(Redis { conn, prefix })))
}

/// `args.consumers` consumer tasks on `broker`.
async fn start<DB: Ledger>(
    c: &Arc<Consumer<DB>>,
    broker: &Arc<Broker>,
    args: &Args,
) -> Result<Vec<tokio::task::JoinHandle<()>>, BoxError>
where
    DB::Connection: Send,
{
    let prefetch = args.prefetch.max(u16::try_from(c.batch).unwrap_or(u16::MAX));
    let mut consumers = Vec::new();
    for n in 0..args.consumers.max(1) {
        let source = broker.subscribe(&format!("{}.consumer-{n}.{}", c.run, std::process::id()), prefetch).await?;
        consumers.push(tokio::spawn(consume(c.clone(), source, broker.clone())));
    }
    Ok(consumers)
}

fn consumer<DB: sqlx::Database>(
    pool: &sqlx::Pool<DB>,
    run: String,
    precheck: Arc<dyn PrecheckStore>,
    args: &Args,
) -> Consumer<DB> {
    Consumer {
        pool: pool.clone(),
        precheck,
        run,
        stats: Stats::default(),
        batch: args.batch.max(1),
        max_attempts: args.max_attempts.max(1),
        nack_every: args.nack_every.max(2),
        work: Duration::from_millis(args.work_ms),
        trace: args.trace,
    }
}

async fn run<DB: Ledger>(store: &str, pool: &sqlx::Pool<DB>, args: &Args) -> Result<bool, BoxError>
where
    DB::Connection: Send,
{
    let (run, precheck, mut redis) = set_up(pool, args).await?;
    let queue = format!("idem.mq_consumer.{run}");
    let broker = Arc::new(Broker::connect(args.amqp_url.as_deref(), &queue).await?);
    let messages = plan(&run, args);
    let total = messages.len();
    let keyless = messages.iter().filter(|m| m.key.is_none()).count();
    let broker_name = if args.amqp_url.is_some() { "rabbitmq" } else { "in-process" };
    let marker_store = if redis.is_some() { "redis" } else { "memory" };
    println!("broker={broker_name} queue={queue} precheck={marker_store} store={store}");
    println!(
        "1. the producer publishes {} postings keyed by the `{KEY_HEADER}` header it sets, re-publishes {} of them \
         (a new message id, the same key), sends {keyless} without a key and {} the ledger refuses (poison)",
        args.messages,
        total - args.messages - keyless - args.poison,
        args.poison,
    );

    let c = Arc::new(consumer(pool, run.clone(), precheck, args));
    let consumers = start(&c, &broker, args).await?;
    println!(
        "2. {} consumers{} compete, {} deliveries at a time, each under its own guard; every {}th delivery is \
         nacked and requeued after its work committed (a crash before the ack)",
        consumers.len(),
        if args.amqp_url.is_some() {
            format!(" (prefetch {} each)", args.prefetch.max(c.batch as u16))
        } else {
            String::new()
        },
        c.batch,
        c.nack_every,
    );
    let before = idem::precheck::counters();
    let producer = async {
        for (i, msg) in messages.iter().enumerate() {
            broker.publish(msg, &format!("{run}-m{i}")).await?;
        }
        Ok::<_, BoxError>(())
    };
    let watcher = async {
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut flushed = false;
        while c.stats.settled.load(Relaxed) < total && Instant::now() < deadline {
            let settled = c.stats.settled.load(Relaxed);
            if !flushed && settled >= total / 2 {
                flushed = true;
                match redis.as_mut() {
                    Some(redis) => match redis.flush().await {
                        Ok(what) => println!("3. halfway ({settled} of {total} settled): {what}; every marker is gone"),
                        Err(e) => println!("3. halfway: the flush failed: {e}"),
                    },
                    None => println!("3. halfway ({settled} of {total} settled): no Redis to flush (--redis-url)"),
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    };
    tokio::try_join!(producer, watcher)?;
    stop(consumers).await;
    let after = idem::precheck::counters();
    let (hits, confirms) = (after.seen - before.seen, after.confirmed - before.confirmed);
    let dead = dead_letters(&broker, keyless + args.poison).await?;
    broker.close().await;
    if let Some(mut redis) = redis {
        redis.forget().await?;
    }
    report(pool, &c, args, total, keyless, dead, (hits, confirms)).await
}

async fn stop(consumers: Vec<tokio::task::JoinHandle<()>>) {
    for consumer in consumers {
        consumer.abort();
        let _ = consumer.await;
    }
}

/// The dead-letter queue's length, once it holds `expected` (RabbitMQ
/// counts a confirmed publish at once; waited on for a second at most).
async fn dead_letters(broker: &Broker, expected: usize) -> Result<usize, BoxError> {
    let mut dead = broker.dead_letters().await?;
    for _ in 0..50 {
        if dead >= expected {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        dead = broker.dead_letters().await?;
    }
    Ok(dead)
}

/// Steps 4 and 5 and the `key=value` line; whether every posting was
/// booked once and every refused or poison message dead-lettered.
async fn report<DB: Ledger>(
    pool: &sqlx::Pool<DB>,
    c: &Consumer<DB>,
    args: &Args,
    total: usize,
    keyless: usize,
    dead: usize,
    (hits, confirms): (u64, u64),
) -> Result<bool, BoxError> {
    let s = |c: &AtomicUsize| c.load(Relaxed);
    let stats = &c.stats;
    let delivered = s(&stats.delivered);
    println!(
        "4. {} of {total} settled after {delivered} deliveries in {} batches ({} nacked after their work, {} \
         redelivered): {} ran the handler, {} replayed the first answer ({confirms} confirmed by the precheck with \
         one read, the rest by the claim)",
        s(&stats.settled),
        s(&stats.batches),
        s(&stats.nacked),
        s(&stats.redelivered),
        s(&stats.executed),
        s(&stats.replayed),
    );
    println!(
        "   {} without a key were refused, {} poison postings failed {} attempts each ({} retries), none acked as \
         done: {dead} in the dead-letter queue, each with its error",
        s(&stats.keyless),
        s(&stats.poison),
        c.max_attempts,
        s(&stats.retried),
    );
    let (entries, applied, applied_keys) = DB::ledger_report(pool, &c.run).await?;
    let duplicates = applied - applied_keys;
    let lost = args.messages as i64 - applied_keys;
    println!(
        "5. the ledger: {entries} entries, the body applied {applied} times for {applied_keys} keys; the unique index \
         stopped {} duplicates, {} other errors",
        s(&stats.index_saves),
        s(&stats.errors),
    );
    println!(
        "published={total} delivered={delivered} effects={entries} duplicate_effects={duplicates} lost={lost} \
         precheck_hits={hits} db_confirms={confirms} keyless={} batches={} poison={} dead_lettered={dead}",
        s(&stats.keyless),
        s(&stats.batches),
        s(&stats.poison),
    );
    Ok(entries == args.messages as i64
        && duplicates == 0
        && lost == 0
        && s(&stats.keyless) == keyless
        && s(&stats.poison) == args.poison
        && dead == keyless + args.poison
        && s(&stats.executed) == args.messages
        && s(&stats.index_saves) + s(&stats.errors) == 0)
}

/// `--queue NAME`: consume what is in NAME until it has been idle for a
/// second (a test publishes, kills and restarts this process); no
/// producer, no flush. The line reports this process's share.
async fn drain<DB: Ledger>(store: &str, pool: &sqlx::Pool<DB>, queue: &str, args: &Args) -> Result<bool, BoxError>
where
    DB::Connection: Send,
{
    let url = args.amqp_url.as_deref().ok_or("--queue needs --amqp-url")?;
    let (run, precheck, redis) = set_up(pool, args).await?;
    let broker = Arc::new(Broker::attach(url, queue).await?);
    println!("broker=rabbitmq queue={queue} precheck={} store={store} run={run}", precheck.kind());
    let c = Arc::new(consumer(pool, run, precheck, args));
    let consumers = start(&c, &broker, args).await?;
    let started = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let last = c.stats.last_settled.lock().unwrap().unwrap_or(started);
        if c.stats.busy.load(Relaxed) == 0 && last.elapsed() > Duration::from_secs(1) {
            break;
        }
    }
    stop(consumers).await;
    let dead = broker.dead_letters().await?;
    broker.close().await;
    if let Some(mut redis) = redis {
        redis.forget().await?;
    }
    let s = |c: &AtomicUsize| c.load(Relaxed);
    let (entries, applied, applied_keys) = DB::ledger_report(pool, &c.run).await?;
    let stats = &c.stats;
    println!(
        "delivered={} batches={} executed={} replayed={} retried={} effects={entries} duplicate_effects={} \
         keyless={} malformed={} poison={} dead_lettered={dead} errors={}",
        s(&stats.delivered),
        s(&stats.batches),
        s(&stats.executed),
        s(&stats.replayed),
        s(&stats.retried),
        applied - applied_keys,
        s(&stats.keyless),
        s(&stats.malformed),
        s(&stats.poison),
        s(&stats.errors),
    );
    Ok(applied == applied_keys && s(&stats.errors) == 0)
}
