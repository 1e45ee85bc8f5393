//! The incident: a ledger consumer behind a message broker. Brokers deliver
//! at least once: a consumer that crashes after its work but before its ack
//! gets the message again, and producers re-publish on a timeout (a new
//! message, a new message id, the same business fact). A consumer that
//! trusts "one delivery, one effect" books such postings twice.
//!
//! Three lines of defence: a Redis "seen" marker (`precheck = "redis"`)
//! stops most repeats with one round trip and one read; the dedup record,
//! written in the ledger's transaction, is the truth (Redis can be flushed or
//! fail over); the ledger's unique index on the business key is the last
//! resort. The key is the business key the producer put in the
//! `x-idempotency-key` header, never the broker's delivery tag or message id.
//!
//! The run: 1,000 postings, 20% re-published, every 10th delivery nacked
//! and requeued after its work committed, two competing consumers, the
//! markers flushed halfway, a few messages without a key (refused and
//! dead-lettered). Each posting is booked once.
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
#[path = "../../examples/common/mod.rs"]
mod common;

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use broker::{Broker, KEY_HEADER, Message, Source, Verdict};
use clap::Parser;
use common::{AppError, BoxError, Ledger, Store};
use idem::precheck::PrecheckStore;
use idem::{Outcome, idempotent};
use serde::{Deserialize, Serialize};
use sqlx::Transaction;

/// What the producer publishes: a posting, keyed by its business key.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Posting {
    account: i64,
    amount_cents: i64,
}

/// The message as the handler sees it: the key from the header, the body.
struct LedgerMessage {
    business_key: Option<String>,
    posting: Posting,
}

/// Book the posting. A message without a key is refused by the guard
/// (`idem::Error::InvalidKey`) before anything runs.
#[idempotent(
    key = "msg.business_key",
    scope = "mq.ledger.apply",
    fingerprint = "msg.posting",
    precheck = "redis",
    ttl = "2d",
    store = "precheck"
)]
async fn apply<DB: Ledger>(
    tx: &mut Transaction<'_, DB>,
    precheck: &dyn PrecheckStore,
    run: &str,
    msg: &LedgerMessage,
) -> Result<i64, AppError>
where
    DB::Connection: Send,
{
    let key = msg.business_key.as_deref().ok_or_else(|| AppError::Unexpected("no key".into()))?;
    Ok(DB::book(tx, run, key, msg.posting.account, msg.posting.amount_cents).await?)
}

#[derive(Default)]
struct Stats {
    delivered: AtomicUsize,
    redelivered: AtomicUsize,
    executed: AtomicUsize,
    replayed: AtomicUsize,
    nacked: AtomicUsize,
    /// Finally settled: acked, or dead-lettered.
    settled: AtomicUsize,
    keyless: AtomicUsize,
    /// A duplicate that got past the guards and hit the unique index.
    index_saves: AtomicUsize,
    errors: AtomicUsize,
}

/// One delivery: begin, apply, commit.
async fn handle<DB: Ledger>(
    pool: &sqlx::Pool<DB>,
    precheck: &dyn PrecheckStore,
    run: &str,
    message: &Message,
) -> Result<Outcome, AppError>
where
    DB::Connection: Send,
{
    let posting = serde_json::from_slice(&message.body).map_err(|e| AppError::Unexpected(format!("bad body: {e}")))?;
    let msg = LedgerMessage { business_key: message.key.clone(), posting };
    let mut tx = pool.begin().await?;
    let (entry, outcome) = idem::observe(apply(&mut tx, precheck, run, &msg)).await;
    entry?;
    tx.commit().await?;
    Ok(outcome.expect("a guard ran"))
}

fn is_unique_violation(e: &AppError) -> bool {
    match e {
        AppError::Db(sqlx::Error::Database(db)) | AppError::Idem(idem::Error::Database(sqlx::Error::Database(db))) => {
            db.is_unique_violation()
        }
        _ => false,
    }
}

async fn consume<DB: Ledger>(
    pool: sqlx::Pool<DB>,
    precheck: Arc<dyn PrecheckStore>,
    run: Arc<str>,
    mut source: Source,
    stats: Arc<Stats>,
    nack_every: usize,
) where
    DB::Connection: Send,
{
    while let Some(delivery) = source.next().await {
        let n = stats.delivered.fetch_add(1, Relaxed) + 1;
        stats.redelivered.fetch_add(usize::from(delivery.redelivered), Relaxed);
        let verdict = match handle(&pool, &*precheck, &run, &delivery.msg).await {
            Ok(outcome) => {
                let counter = if outcome == Outcome::Executed { &stats.executed } else { &stats.replayed };
                counter.fetch_add(1, Relaxed);
                if n.is_multiple_of(nack_every) {
                    stats.nacked.fetch_add(1, Relaxed);
                    Verdict::Requeue // the work committed, then "the consumer crashed" before its ack
                } else {
                    stats.settled.fetch_add(1, Relaxed);
                    Verdict::Ack
                }
            }
            Err(AppError::Idem(e @ idem::Error::InvalidKey { .. })) => {
                if stats.keyless.fetch_add(1, Relaxed) == 0 {
                    println!("   refused a message without a key: {e}");
                }
                stats.settled.fetch_add(1, Relaxed);
                Verdict::DeadLetter // no key will ever appear: not done, not retried
            }
            Err(e) => {
                let counter = if is_unique_violation(&e) { &stats.index_saves } else { &stats.errors };
                counter.fetch_add(1, Relaxed);
                eprintln!("   !! {e}; requeued");
                tokio::time::sleep(Duration::from_millis(50)).await;
                Verdict::Requeue
            }
        };
        if let Err(e) = delivery.settle(verdict).await {
            eprintln!("   !! settling a delivery failed: {e}");
            stats.errors.fetch_add(1, Relaxed);
        }
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
    #[arg(long, default_value_t = 2)]
    consumers: usize,
    #[arg(long, default_value_t = 20)]
    prefetch: u16,
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let store = Store::connect(args.database_url.as_deref(), 10).await?;
    let ok = common::on_pool!(&store, pool => run(store.name(), pool, &args).await?);
    store.close().await;
    if !ok {
        std::process::exit(1);
    }
    Ok(())
}

/// The producer's messages: postings in order, a re-publish of every
/// `100 / percent`-th one (half right behind it, so the two consumers race,
/// half 100 messages later), and the keyless ones spread in between.
fn plan(run: &str, args: &Args) -> Vec<Message> {
    let posting = |i: usize| Message {
        key: Some(format!("{run}-{i}")),
        body: serde_json::to_vec(&Posting { account: (i % 50) as i64, amount_cents: 100 + i as i64 }).unwrap(),
    };
    let every = 100 / args.republish_percent.clamp(1, 100);
    let (n, mut out, mut later, mut keyless) = (args.messages, Vec::new(), VecDeque::new(), 0);
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
        if keyless < args.keyless && (i + 1).is_multiple_of((n / args.keyless).max(1)) {
            keyless += 1;
            let body = serde_json::to_vec(&Posting { account: 0, amount_cents: 1 }).unwrap();
            out.push(Message { key: None, body });
        }
    }
    out.extend(later.into_iter().map(|(_, m)| m));
    out
}

async fn run<DB: Ledger>(store: &str, pool: &sqlx::Pool<DB>, args: &Args) -> Result<bool, BoxError>
where
    DB::Connection: Send,
{
    idem::migrate(pool).await?;
    DB::setup_ledger(pool).await?;
    let run: Arc<str> = common::run_id().into();
    let queue = format!("idem.mq_consumer.{run}");
    let mut redis = None;
    let precheck: Arc<dyn PrecheckStore> = match &args.redis_url {
        Some(url) => {
            let client = redis::Client::open(url.as_str())?;
            let conn = redis::aio::ConnectionManager::new(client).await?;
            let prefix = format!("idem-mq-{run}:");
            redis = Some(Redis { conn: conn.clone(), prefix: prefix.clone() });
            Arc::new(idem::store::RedisStore::new(conn, prefix))
        }
        None => Arc::new(idem::store::MemoryStore::new()),
    };
    let broker = Broker::connect(args.amqp_url.as_deref(), &queue).await?;
    let messages = plan(&run, args);
    let total = messages.len();
    let keyless = messages.iter().filter(|m| m.key.is_none()).count();
    let broker_name = if args.amqp_url.is_some() { "rabbitmq" } else { "in-process" };
    let marker_store = if redis.is_some() { "redis" } else { "memory" };
    println!("broker={broker_name} queue={queue} precheck={marker_store} store={store}");
    println!(
        "1. the producer publishes {} postings keyed by the `{KEY_HEADER}` header it sets, re-publishes {} of them \
         (a new message id, the same key) and sends {keyless} without a key",
        args.messages,
        total - args.messages - keyless,
    );

    let stats = Arc::new(Stats::default());
    let mut consumers = Vec::new();
    for c in 0..args.consumers.max(1) {
        let source = broker.subscribe(&format!("{queue}.consumer-{c}"), args.prefetch).await?;
        let task = consume(pool.clone(), precheck.clone(), run.clone(), source, stats.clone(), args.nack_every.max(2));
        consumers.push(tokio::spawn(task));
    }
    println!(
        "2. {} consumers{} compete; every {}th delivery is nacked and requeued after its work committed (a crash \
         before the ack)",
        consumers.len(),
        if args.amqp_url.is_some() { format!(" (prefetch {} each)", args.prefetch) } else { String::new() },
        args.nack_every.max(2),
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
        while stats.settled.load(Relaxed) < total && Instant::now() < deadline {
            let settled = stats.settled.load(Relaxed);
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
    for consumer in &consumers {
        consumer.abort();
    }
    let after = idem::precheck::counters();
    let (hits, confirms) = (after.seen - before.seen, after.confirmed - before.confirmed);
    let s = |c: &AtomicUsize| c.load(Relaxed);
    let delivered = s(&stats.delivered);
    println!(
        "4. {} of {total} settled after {delivered} deliveries ({} nacked after their work, {} redelivered): {} ran \
         the handler, {} replayed the first answer ({confirms} confirmed by the precheck with one read, the rest by \
         the claim)",
        s(&stats.settled),
        s(&stats.nacked),
        s(&stats.redelivered),
        s(&stats.executed),
        s(&stats.replayed),
    );
    let mut dead = broker.dead_letters().await?;
    for _ in 0..50 {
        if dead >= s(&stats.keyless) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await; // dead-lettering is asynchronous in RabbitMQ
        dead = broker.dead_letters().await?;
    }
    println!("   {} without a key were refused, not acked as done: {dead} in the dead-letter queue", s(&stats.keyless));
    broker.close().await;
    if let Some(mut redis) = redis {
        redis.forget().await?;
    }

    let (entries, applied, applied_keys) = DB::ledger_report(pool, &run).await?;
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
         precheck_hits={hits} db_confirms={confirms} keyless={}",
        s(&stats.keyless),
    );
    Ok(entries == args.messages as i64
        && duplicates == 0
        && lost == 0
        && s(&stats.keyless) == keyless
        && dead == keyless
        && s(&stats.executed) == args.messages
        && s(&stats.index_saves) + s(&stats.errors) == 0)
}
