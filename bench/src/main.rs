//! Benchmark driver: what the guard costs a real business transaction.
//!
//! Scenario `dedup`: N clients run "insert a coupon + bump one of 1,000 users'
//! counters" in a transaction, six ways, alternating in short slices so
//! that all of them see the same server conditions:
//! - `unguarded`: the business transaction alone;
//! - `guarded`: the same under `#[idempotent(strategy = "dedup")]` (claim,
//!   body, response: the default);
//! - `guarded_after`: the same with `claim = "after"` (body, then the record
//!   with its response in one statement);
//! - `handwritten`: the same guard written by hand in raw sqlx (claim
//!   INSERT, business, UPDATE with the response): the floor idem competes with;
//! - `zero_rt`: `guarded` on an `idem::Tx` (`idem::begin(pool)` ...
//!   `tx.commit()`): the claim rides with `BEGIN`, the response with
//!   `COMMIT`, so the guard sends no round trip of its own;
//! - `one_write`: `guarded` on an `idem::Tx` with `claim = "commit"`: the
//!   body, then the record with its response in the text of `COMMIT`
//!   (`INSERT ...; COMMIT`): one write, no round trip of its own.
//!
//! Two more turns in each round run a C client sending `one_write`'s
//! statements and `unguarded`'s: `pgbench` on PostgreSQL
//! (`bench/pgbench/one_write.sql`, `unguarded.sql`), `mariadb-slap` on
//! MariaDB (`bench/slap/`), see `floor`: `vs_floor` is `one_write`
//! against the first, what the server allows a C client with the same
//! statements; `floor_ratio` the first against the second, what the server
//! allows `ratio_one_write` (`vs_floor=na` without the client on `PATH`).
//!
//! Scenarios `state` and `dedup+state`: the same business change also pays
//! the order (WAIT_PAY -> PAID, orders created ahead of each slice):
//! - `unguarded`: the status written blindly (`UPDATE ... SET status = 2
//!   WHERE trade_no = ?`), coupon, user;
//! - `guarded`: `strategy = "state"` (the compare-and-set replaces the blind
//!   write) or `"dedup+state"` (plus the dedup record and its response);
//! - `handwritten`: the same by hand: the compare-and-set with its row count
//!   checked (and for `dedup+state` the claim INSERT and the response UPDATE).
//!
//! Scenario `outbox`: the `dedup` scenario's `unguarded` and `guarded`
//! modes, and `outbox`: `guarded` whose body also publishes one message
//! through the outbox (`outbox = "outbox"`, one row written in the same
//! transaction; no relay runs, so the figure is the write's cost alone).
//! `outbox_ratio` is `outbox` against `guarded`; beside them pgbench or the
//! slap sends the same statements (`outbox.sql` against `guard.sql`,
//! `floor_ratio`: what the server charges the message's insert).
//! `--scenario relay` and `--scenario outbox-latency` measure the relay:
//! see `outbox_bench`.
//! Scenario `unique`: the same change with a payment row first
//! (`loadgen_payment_record`, unique key `uk_loadgen_pay_no`), three ways:
//! `unguarded` (the row and the change), `guarded` (`strategy = "unique"`,
//! the row is the claim, `savepoint = false`: nothing of idem's is sent;
//! on PostgreSQL through `idem::unique::insert`) and `dedup` (the same
//! change under the dedup guard); `ratio` is guarded against unguarded,
//! `vs_dedup` guarded against dedup.
//!
//! Scenarios `lease`, `token` and `lock` measure a guard with an empty body
//! on its own store (memory by default, or `--redis-url`): see
//! `lease_bench` and `token_bench`. Scenario `steps` measures a lease body
//! in recorded steps (`--steps`, 3 by default) against the same body
//! unrecorded: see `steps_bench`.
//!
//! ```text
//! cargo run --release -p idem-bench -- --scenario token --redis-url redis://127.0.0.1:6379 --clients 100 --seconds 40
//! cargo run --release -p idem-bench -- --scenario lock --redis-url redis://127.0.0.1:6379 --clients 64 --seconds 48
//! cargo run --release -p idem-bench -- --scenario steps --redis-url redis://127.0.0.1:6379 --clients 16 --seconds 60 --rounds 10
//! cargo run --release -p idem-bench -- --scenario steps --database-url postgres://postgres@127.0.0.1/test --clients 16 --seconds 60 --rounds 10
//! cargo run --release -p idem-bench -- --scenario mq --database-url postgres://postgres@127.0.0.1/test --redis-url redis://127.0.0.1:6379 --clients 16 --seconds 30
//! cargo run --release -p idem-bench -- --scenario wait --database-url postgres://postgres@127.0.0.1/test --redis-url redis://127.0.0.1:6379 --clients 16 --rounds 40
//! cargo run --release -p idem-bench -- --scenario dedup --database-url postgres://postgres@127.0.0.1/test --clients 16 --seconds 30
//! cargo run --release -p idem-bench -- --scenario dedup+state --database-url mysql://root@127.0.0.1/test
//! cargo run --release -p idem-bench -- --scenario unique --database-url postgres://postgres@127.0.0.1/test --clients 16
//! ```
//! `--added-rtt-us N` (`dedup`, `state` and `dedup+state` on PostgreSQL or
//! MySQL) puts the database a network hop away: the application and the
//! database on different hosts, e.g. N = 500 for two hosts in one
//! availability zone. On loopback a round trip costs little next to parsing
//! and planning a statement, which favours modes that send more, cheaper
//! statements; with N > 0 loadgen talks to the database through an
//! in-process TCP proxy that holds every chunk of bytes N/2 µs in each
//! direction (see `rtt_proxy`), and first measures what a ping gains through
//! it (`added_rtt_measured_us`, on an idle connection).
//!
//! ```text
//! cargo run --release -p idem-bench -- --scenario dedup --database-url postgres://postgres@127.0.0.1/test --added-rtt-us 500
//! ```
//! Throughputs are pooled over the run; the ratios are medians over rounds of
//! per-round ratios (slices that ran next to each other), which cancels the
//! server's drift. The last line is machine-readable; BENCHMARKS.md records
//! the results.

// The demo shop the examples use (stores, tables, business statements),
// shared rather than copied so the benchmarks measure the examples' own
// transactions; what only the benchmarks need lives in this package.
mod cluster_bench;
#[path = "../../examples/common/mod.rs"]
mod common;
mod errors;
mod floor;
mod lease_bench;
mod mq_bench;
mod outbox_bench;
mod rtt_proxy;
mod steps_bench;
mod token_bench;
mod wait_bench;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use common::{AppError, BoxError, OrderStatus, Shop, Store};
use errors::Errors;
use floor::{Floor, FloorControl, Pair, Script};
use idem::idempotent;
use sqlx::{MySql, Postgres, Sqlite, Transaction};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Scenario {
    Dedup,
    State,
    #[value(name = "dedup+state")]
    DedupState,
    /// Lease records (memory by default; --redis-url or --database-url).
    Lease,
    /// A lease body in --steps recorded steps against the same body
    /// unrecorded (memory by default; --redis-url or --database-url).
    Steps,
    /// One-time tokens consumed through the guard (memory, or --redis-url).
    Token,
    /// `strategy = "lock", concurrency_only = true` (memory, or --redis-url).
    Lock,
    /// A consumer's handler, half its messages repeats, with and without
    /// `precheck = "redis"` (markers in memory, or --redis-url).
    Mq,
    /// What a duplicate waiting for the first call adds after it completes
    /// (memory; --database-url; --redis-url with and without notices).
    Wait,
    /// A dedup guard whose body publishes one outbox message, against the
    /// same guard without it.
    Outbox,
    /// The relay's throughput against the broker's own confirmed publishing
    /// (--amqp-url or --nats-url; in-process by default).
    Relay,
    /// From a publishing transaction's commit to the broker, with the relay
    /// woken on commit (PostgreSQL `LISTEN`) and polling.
    #[value(name = "outbox-latency")]
    OutboxLatency,
    /// The business change with a payment row whose unique key is the
    /// guard (`strategy = "unique"`), against the same change unguarded and
    /// under `dedup`.
    Unique,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::Dedup => "dedup",
            Scenario::State => "state",
            Scenario::DedupState => "dedup+state",
            Scenario::Lease => "lease",
            Scenario::Steps => "steps",
            Scenario::Token => "token",
            Scenario::Lock => "lock",
            Scenario::Mq => "mq",
            Scenario::Wait => "wait",
            Scenario::Outbox => "outbox",
            Scenario::Relay => "relay",
            Scenario::OutboxLatency => "outbox-latency",
            Scenario::Unique => "unique",
        }
    }

    fn modes(self) -> &'static [Mode] {
        match self {
            Scenario::Dedup => {
                &[Mode::Unguarded, Mode::Guarded, Mode::GuardedAfter, Mode::Handwritten, Mode::ZeroRt, Mode::OneWrite]
            }
            Scenario::State | Scenario::DedupState => &[Mode::Unguarded, Mode::Guarded, Mode::Handwritten],
            Scenario::Outbox => &[Mode::Unguarded, Mode::Guarded, Mode::Outbox],
            Scenario::Unique => &[Mode::Unguarded, Mode::Guarded, Mode::Dedup],
            Scenario::Lease
            | Scenario::Steps
            | Scenario::Token
            | Scenario::Lock
            | Scenario::Mq
            | Scenario::Wait
            | Scenario::Relay
            | Scenario::OutboxLatency => &[],
        }
    }
}

#[derive(Parser)]
#[command(about = "Throughput of guarded vs unguarded vs hand-written business transactions")]
struct Args {
    #[arg(long, value_enum, default_value = "dedup")]
    scenario: Scenario,
    /// postgres://..., mysql://... or sqlite:PATH; default: SQLite in a temporary file
    /// (for `lease` and `steps`: the memory store).
    #[arg(long)]
    database_url: Option<String>,
    /// `lease`, `steps`, `token`, `lock` and `mq` only: keep their records, tokens, locks or markers in this Redis.
    #[arg(long)]
    redis_url: Option<String>,
    /// `lease` only: also on this Redis Cluster (seed nodes, comma separated), side by side with
    /// `--redis-url` (one node), e.g. `redis://127.0.0.1:7000,redis://127.0.0.1:7001`.
    #[arg(long, value_delimiter = ',')]
    redis_cluster_urls: Vec<String>,
    /// `lease` with `--redis-cluster-urls` (the local cluster of `.ci/redis-cluster`): kill the master
    /// of the calls' slots `--rounds` times and measure how long until a call succeeds again.
    #[arg(long)]
    failover: bool,
    /// `token` and `lock` on Redis: the redis-rs connection under the store.
    #[arg(long, value_enum, default_value = "multiplexed")]
    redis_connection: token_bench::Connection,
    /// `--redis-connection pool`: how many multiplexed connections.
    #[arg(long, default_value_t = 4)]
    redis_pool: usize,
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Total measuring time, shared by the modes.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// How many times the modes take turns.
    #[arg(long, default_value_t = 5)]
    rounds: u32,
    /// `lease` only: measure one side alone (first runs, then replays, for
    /// `--seconds` each, no interleaving): for profiling, e.g. under `perf`.
    #[arg(long, value_enum)]
    only: Option<lease_bench::Only>,
    /// `lease` on Redis only: Redis runs under `valgrind --tool=callgrind
    /// --callgrind-out-file=FILE`; print the server's instructions per call,
    /// idem's (serially and from `--clients` tasks) and the `idempotent` crate's, over
    /// `--calls` calls each.
    #[arg(long, value_name = "FILE")]
    callgrind_out: Option<String>,
    #[arg(long, default_value_t = 2000)]
    calls: u64,
    /// `steps` only: how many recorded steps the call's body runs (0: only
    /// what recording costs whatever the steps).
    #[arg(long, default_value_t = 3)]
    steps: usize,
    /// `dedup`, `state` and `dedup+state` on PostgreSQL or MySQL: add this many
    /// microseconds to every round trip to the database (half each way, through
    /// an in-process TCP proxy), as if it ran on another host; 0: off.
    #[arg(long, default_value_t = 0, value_name = "N")]
    added_rtt_us: u64,
    /// `dedup`, `state` and `dedup+state` on PostgreSQL or MySQL: while the
    /// measured rounds run, `idem::sql::purge_expired` deletes expired
    /// records beside them in batches of N (`PurgeOptions::batch_size`), as a
    /// scheduled purge does on a busy service; 0: off. The record table's
    /// expired records are the caller's to load (`bench/scale/run.sh`).
    #[arg(long, default_value_t = 0, value_name = "N")]
    purge_beside: u32,
    /// `--purge-beside`: pause between batches (`PurgeOptions::pause`).
    #[arg(long, default_value_t = 10, value_name = "MS")]
    purge_pause_ms: u64,
    /// `--purge-beside`: after each batch, also pause N times as long as it
    /// took (`PurgeOptions::pause_factor`).
    #[arg(long, default_value_t = 0, value_name = "N")]
    purge_pause_factor: u32,
    /// Do not run `idem::migrate` first: the record table is the caller's,
    /// as it made it (`bench/scale/run.sh` drops an index to measure it;
    /// `migrate` would create it again).
    #[arg(long)]
    skip_migrate: bool,
    /// `relay`: messages relayed per side and round.
    #[arg(long, default_value_t = 20_000)]
    messages: usize,
    /// `relay`: the messages' keys: calls, each publishing messages / keys
    /// (a key's messages go out in order, one a round).
    #[arg(long, default_value_t = 10_000)]
    keys: usize,
    /// `relay`: relay to this RabbitMQ, beside publishing to it directly.
    #[arg(long)]
    amqp_url: Option<String>,
    /// `relay`: relay to this NATS JetStream, beside publishing to it directly.
    #[arg(long)]
    nats_url: Option<String>,
}

/// `--added-rtt-us`: what was asked, and what a ping gained through the proxy.
#[derive(Clone, Copy)]
struct AddedRtt {
    asked_us: u64,
    measured: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Unguarded,
    Guarded,
    GuardedAfter,
    Handwritten,
    /// `guarded` on an `idem::Tx` (claim with BEGIN, response with COMMIT).
    ZeroRt,
    /// `guarded` on an `idem::Tx` with `claim = "commit"` (the record with
    /// its response in the text of COMMIT).
    OneWrite,
    /// `guarded`, publishing one message through the outbox.
    Outbox,
    /// Scenario `unique`: the same change under `dedup` (its record beside
    /// the payment row).
    Dedup,
}

/// The business change, shared by the modes.
async fn business<DB: Shop>(conn: &mut DB::Connection, trade_no: &str, user_id: i64) -> Result<i64, sqlx::Error> {
    let coupon = DB::insert_coupon(conn, trade_no, user_id).await?;
    DB::bump_user(conn, user_id).await?;
    Ok(coupon)
}

#[idempotent(key = "trade_no", scope = "loadgen.dedup", retention = "1h")]
async fn guarded<DB: Shop>(tx: &mut Transaction<'_, DB>, trade_no: &str, user_id: i64) -> Result<i64, AppError>
where
    DB::Connection: Send,
{
    Ok(business::<DB>(tx, trade_no, user_id).await?)
}

/// `guarded` on an `idem::Tx`: the same record, the same body.
#[idempotent(key = "trade_no", scope = "loadgen.dedup_zero_rt", retention = "1h")]
async fn guarded_zero_rt<DB: Shop>(tx: &mut idem::Tx<DB>, trade_no: &str, user_id: i64) -> Result<i64, AppError>
where
    DB::Connection: Send,
{
    Ok(business::<DB>(&mut **tx, trade_no, user_id).await?)
}

/// `guarded` on an `idem::Tx`, written once with its `COMMIT`.
#[idempotent(key = "trade_no", scope = "loadgen.dedup_one_write", retention = "1h", claim = "commit")]
async fn guarded_one_write<DB: Shop>(tx: &mut idem::Tx<DB>, trade_no: &str, user_id: i64) -> Result<i64, AppError>
where
    DB::Connection: Send,
{
    Ok(business::<DB>(&mut **tx, trade_no, user_id).await?)
}

/// `guarded`, and one message for another service, in the same transaction.
#[idempotent(key = "trade_no", scope = "loadgen.outbox", retention = "1h", outbox = "outbox")]
async fn guarded_outbox<DB: Shop>(tx: &mut Transaction<'_, DB>, trade_no: &str, user_id: i64) -> Result<i64, AppError>
where
    DB::Connection: Send,
{
    let coupon = business::<DB>(tx, trade_no, user_id).await?;
    outbox.publish_json(tx, "coupons.granted", &CouponGranted { trade_no, coupon }).await?;
    Ok(coupon)
}

/// The message `guarded_outbox` publishes.
#[derive(serde::Serialize)]
struct CouponGranted<'a> {
    trade_no: &'a str,
    coupon: i64,
}

#[idempotent(key = "trade_no", scope = "loadgen.dedup_after", retention = "1h", claim = "after")]
async fn guarded_after<DB: Shop>(tx: &mut Transaction<'_, DB>, trade_no: &str, user_id: i64) -> Result<i64, AppError>
where
    DB::Connection: Send,
{
    Ok(business::<DB>(tx, trade_no, user_id).await?)
}

#[idempotent(
    key = "trade_no",
    strategy = "state",
    scope = "loadgen.state",
    transition = "OrderStatus::WaitPay -> OrderStatus::Paid"
)]
async fn guarded_state<DB: Shop>(tx: &mut Transaction<'_, DB>, trade_no: &str, user_id: i64) -> Result<(), AppError>
where
    DB::Connection: Send,
{
    business::<DB>(tx, trade_no, user_id).await?;
    Ok(())
}

#[idempotent(
    key = "trade_no",
    strategy = "dedup+state",
    scope = "loadgen.dedup_state",
    retention = "1h",
    transition = "OrderStatus::WaitPay -> OrderStatus::Paid"
)]
async fn guarded_dedup_state<DB: Shop>(
    tx: &mut Transaction<'_, DB>,
    trade_no: &str,
    user_id: i64,
) -> Result<Option<i64>, AppError>
where
    DB::Connection: Send,
{
    Ok(Some(business::<DB>(tx, trade_no, user_id).await?))
}

/// The hand-written compare-and-set: WAIT_PAY -> PAID, or find out why not.
async fn hand_pay<DB: Handwritten>(conn: &mut DB::Connection, trade_no: &str) -> Result<bool, AppError> {
    let (from, to) = (OrderStatus::WaitPay.code(), OrderStatus::Paid.code());
    if DB::set_order_status(conn, trade_no, Some(from), to).await? == 1 {
        return Ok(true);
    }
    Err(AppError::Unexpected(format!("order {trade_no} was not waiting for payment")))
}

#[idempotent(
    strategy = "unique",
    constraint = "uk_loadgen_pay_no",
    replay = "existing_payment",
    savepoint = false,
    key = "trade_no",
    scope = "loadgen.unique"
)]
async fn guarded_unique<DB: Handwritten>(
    tx: &mut Transaction<'_, DB>,
    trade_no: &str,
    user_id: i64,
) -> Result<i64, AppError>
where
    DB::Connection: Send,
{
    DB::insert_payment(tx, trade_no).await?;
    Ok(business::<DB>(tx, trade_no, user_id).await?)
}

/// A repeat's answer: the coupon the first call granted.
async fn existing_payment<DB: Handwritten>(
    tx: &mut Transaction<'_, DB>,
    trade_no: &str,
    _: i64,
) -> Result<i64, AppError>
where
    DB::Connection: Send,
{
    Ok(DB::coupon_of(tx, trade_no).await?)
}

#[idempotent(key = "trade_no", scope = "loadgen.unique_dedup", retention = "1h")]
async fn guarded_dedup_payment<DB: Handwritten>(
    tx: &mut Transaction<'_, DB>,
    trade_no: &str,
    user_id: i64,
) -> Result<i64, AppError>
where
    DB::Connection: Send,
{
    DB::insert_payment(tx, trade_no).await?;
    Ok(business::<DB>(tx, trade_no, user_id).await?)
}

/// The guard as a careful engineer writes it by hand for each database.
trait Handwritten: Shop {
    /// Scenario `unique`: the payment table, and the insert that claims.
    const PAYMENT_DDL: &'static str;
    const INSERT_PAYMENT: &'static str;
    /// Run [`PAYMENT_DDL`](Self::PAYMENT_DDL): the table, emptied.
    fn setup_payments(pool: &sqlx::Pool<Self>) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
    /// The payment row of scenario `unique`: its unique key
    /// `uk_loadgen_pay_no` is the claim. Written as the first statement, so
    /// the guard takes no savepoint: on PostgreSQL with `ON CONFLICT ... DO
    /// NOTHING` through `idem::unique::insert`, elsewhere a plain insert (a
    /// duplicate-key error there undoes only its statement). The control
    /// sends the same text.
    fn insert_payment(
        conn: &mut Self::Connection,
        trade_no: &str,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;
    /// The coupon granted for a trade (a locking read on MySQL, whose
    /// REPEATABLE READ snapshot may predate the winner).
    fn coupon_of(conn: &mut Self::Connection, trade_no: &str) -> impl Future<Output = Result<i64, sqlx::Error>> + Send;
    fn hand_claim(conn: &mut Self::Connection, key: &str) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;
    fn hand_store(
        conn: &mut Self::Connection,
        key: &str,
        response: &str,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
    /// Remove earlier runs' rows.
    fn reset(pool: &sqlx::Pool<Self>) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
    /// `UPDATE shop_orders SET status = to WHERE trade_no = ? [AND status = from]`:
    /// the statement a hand-written state change sends (and, without `from`,
    /// the blind status write of a service with no guard). Rows changed.
    fn set_order_status(
        conn: &mut Self::Connection,
        trade_no: &str,
        from: Option<i64>,
        to: i64,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;
}

/// `UPDATE shop_orders ...` with the database's placeholders for the trade
/// number (`a`) and the new status (`b`).
fn set_status_sql(from: Option<i64>, (a, b): (&str, &str)) -> sqlx::AssertSqlSafe<String> {
    // Integers only are formatted into the SQL; the trade number is bound.
    sqlx::AssertSqlSafe(match from {
        Some(from) => format!("UPDATE shop_orders SET status = {b} WHERE trade_no = {a} AND status = {from}"),
        None => format!("UPDATE shop_orders SET status = {b} WHERE trade_no = {a}"),
    })
}

/// The messages of `--scenario outbox` (its mode's, pgbench's, the slap's).
const OUTBOX_RESET: &str = "DELETE FROM idem_outbox WHERE scope IN ('loadgen.outbox', 'pgbench.outbox', 'slap.outbox')";

const RESET: &str = "DELETE FROM idem_records WHERE scope IN \
                       ('loadgen.dedup', 'loadgen.dedup_after', 'loadgen.dedup_zero_rt', 'loadgen.dedup_one_write', \
                        'loadgen.dedup_state', 'loadgen.hand', 'loadgen.outbox'); \
                     DELETE FROM shop_coupons WHERE trade_no LIKE 'L%'; \
                     DELETE FROM shop_orders WHERE trade_no LIKE 'L%'";

impl Handwritten for Postgres {
    const PAYMENT_DDL: &'static str = "CREATE TABLE IF NOT EXISTS loadgen_payment_record (id BIGSERIAL PRIMARY KEY, \
        pay_no VARCHAR(191) NOT NULL, CONSTRAINT uk_loadgen_pay_no UNIQUE (pay_no)); \
        DELETE FROM loadgen_payment_record";
    const INSERT_PAYMENT: &'static str = "INSERT INTO loadgen_payment_record (pay_no) VALUES ($1) ON CONFLICT ON CONSTRAINT uk_loadgen_pay_no DO NOTHING";
    async fn setup_payments(pool: &sqlx::PgPool) -> Result<(), sqlx::Error> {
        sqlx::raw_sql(Self::PAYMENT_DDL).execute(pool).await.map(drop)
    }
    async fn insert_payment(conn: &mut sqlx::PgConnection, trade_no: &str) -> Result<u64, sqlx::Error> {
        idem::unique::insert(conn, "uk_loadgen_pay_no", sqlx::query(Self::INSERT_PAYMENT).bind(trade_no)).await
    }
    async fn coupon_of(conn: &mut sqlx::PgConnection, trade_no: &str) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar("SELECT id FROM shop_coupons WHERE trade_no = $1").bind(trade_no).fetch_one(conn).await
    }
    async fn reset(pool: &sqlx::PgPool) -> Result<(), sqlx::Error> {
        sqlx::raw_sql(RESET).execute(pool).await?;
        sqlx::raw_sql(OUTBOX_RESET).execute(pool).await?;
        // pgbench's rows too (the `vs_floor` slices', bench/pgbench/run.sh's),
        // as bench/pgbench/setup.sql removes them: both clients start from
        // the same tables.
        sqlx::raw_sql(
            "DELETE FROM idem_records WHERE scope LIKE 'pgbench.%'; DELETE FROM shop_coupons WHERE trade_no LIKE 'P%'",
        )
        .execute(pool)
        .await?;
        // A service's record table is never empty for long; an empty one
        // analyzed as empty gives every connection's prepared statements a
        // cached sequential-scan plan for the key lookups, which stays while
        // the table grows (with autovacuum off, as on this machine, for
        // good), and the run measures that instead. Keep 10,000 rows that
        // are not the benchmark's.
        sqlx::raw_sql(
            "INSERT INTO idem_records (scope, idem_key, status, created_at, updated_at, expires_at) \
             SELECT 'loadgen.filler', 'F' || g, 'DONE', now(), now(), now() + interval '100 years' \
             FROM generate_series(1, 10000) g ON CONFLICT DO NOTHING",
        )
        .execute(pool)
        .await?;
        // One statement each: VACUUM refuses to run inside a multi-statement query.
        for table in [
            "VACUUM ANALYZE idem_records",
            "VACUUM ANALYZE shop_coupons",
            "VACUUM ANALYZE shop_users",
            "VACUUM ANALYZE shop_orders",
        ] {
            sqlx::raw_sql(table).execute(pool).await?;
        }
        Ok(())
    }
    async fn hand_claim(conn: &mut sqlx::PgConnection, key: &str) -> Result<bool, sqlx::Error> {
        let done = sqlx::query(
            "INSERT INTO idem_records (scope, idem_key, status, created_at, updated_at, expires_at) \
             VALUES ('loadgen.hand', $1, 'PROCESSING', now(), now(), now() + interval '1 hour') ON CONFLICT DO NOTHING",
        )
        .bind(key)
        .execute(conn)
        .await?;
        Ok(done.rows_affected() == 1)
    }
    async fn hand_store(conn: &mut sqlx::PgConnection, key: &str, response: &str) -> Result<(), sqlx::Error> {
        sqlx::query(
            "UPDATE idem_records SET status = 'DONE', response = $2 WHERE scope = 'loadgen.hand' AND idem_key = $1",
        )
        .bind(key)
        .bind(response)
        .execute(conn)
        .await?;
        Ok(())
    }
    async fn set_order_status(
        conn: &mut sqlx::PgConnection,
        trade_no: &str,
        from: Option<i64>,
        to: i64,
    ) -> Result<u64, sqlx::Error> {
        // `$2::int2`: the column's type, so the plan is the one a typed query gets.
        let done = sqlx::query(set_status_sql(from, ("$1", "$2"))).bind(trade_no).bind(to as i16).execute(conn).await?;
        Ok(done.rows_affected())
    }
}

impl Handwritten for MySql {
    const PAYMENT_DDL: &'static str = "CREATE TABLE IF NOT EXISTS loadgen_payment_record (id BIGINT AUTO_INCREMENT \
        PRIMARY KEY, pay_no VARCHAR(191) NOT NULL, UNIQUE KEY uk_loadgen_pay_no (pay_no)) ENGINE = InnoDB; \
        DELETE FROM loadgen_payment_record";
    const INSERT_PAYMENT: &'static str = "INSERT INTO loadgen_payment_record (pay_no) VALUES (?)";
    async fn setup_payments(pool: &sqlx::MySqlPool) -> Result<(), sqlx::Error> {
        sqlx::raw_sql(Self::PAYMENT_DDL).execute(pool).await.map(drop)
    }
    async fn insert_payment(conn: &mut sqlx::MySqlConnection, trade_no: &str) -> Result<u64, sqlx::Error> {
        idem::unique::insert(conn, "uk_loadgen_pay_no", sqlx::query(Self::INSERT_PAYMENT).bind(trade_no)).await
    }
    async fn coupon_of(conn: &mut sqlx::MySqlConnection, trade_no: &str) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar("SELECT id FROM shop_coupons WHERE trade_no = ? LOCK IN SHARE MODE")
            .bind(trade_no)
            .fetch_one(conn)
            .await
    }
    async fn reset(pool: &sqlx::MySqlPool) -> Result<(), sqlx::Error> {
        sqlx::raw_sql(RESET).execute(pool).await?;
        sqlx::raw_sql(OUTBOX_RESET).execute(pool).await?;
        // The slap's rows too (the `vs_floor` slices'): both clients start
        // from the same tables.
        sqlx::raw_sql("DELETE FROM idem_records WHERE scope LIKE 'slap.%'; DELETE FROM shop_coupons WHERE trade_no REGEXP '^S[0-9]+$'")
            .execute(pool)
            .await?;
        Ok(())
    }
    async fn hand_claim(conn: &mut sqlx::MySqlConnection, key: &str) -> Result<bool, sqlx::Error> {
        let done = sqlx::query(
            "INSERT INTO idem_records (scope, idem_key, status, created_at, updated_at, expires_at) \
             VALUES ('loadgen.hand', ?, 'PROCESSING', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL 1 HOUR)",
        )
        .bind(key)
        .execute(conn)
        .await;
        match done {
            Ok(_) => Ok(true),
            Err(e) if e.as_database_error().is_some_and(|d| d.is_unique_violation()) => Ok(false),
            Err(e) => Err(e),
        }
    }
    async fn hand_store(conn: &mut sqlx::MySqlConnection, key: &str, response: &str) -> Result<(), sqlx::Error> {
        sqlx::query(
            "UPDATE idem_records SET status = 'DONE', response = ? WHERE scope = 'loadgen.hand' AND idem_key = ?",
        )
        .bind(response)
        .bind(key)
        .execute(conn)
        .await?;
        Ok(())
    }
    async fn set_order_status(
        conn: &mut sqlx::MySqlConnection,
        trade_no: &str,
        from: Option<i64>,
        to: i64,
    ) -> Result<u64, sqlx::Error> {
        let sql = match from {
            Some(from) => format!("UPDATE shop_orders SET status = ? WHERE trade_no = ? AND status = {from}"),
            None => "UPDATE shop_orders SET status = ? WHERE trade_no = ?".to_owned(),
        };
        let done = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(to).bind(trade_no).execute(conn).await?;
        Ok(done.rows_affected())
    }
}

impl Handwritten for Sqlite {
    const PAYMENT_DDL: &'static str = "CREATE TABLE IF NOT EXISTS loadgen_payment_record (id INTEGER PRIMARY KEY \
        AUTOINCREMENT, pay_no TEXT NOT NULL); \
        CREATE UNIQUE INDEX IF NOT EXISTS uk_loadgen_pay_no ON loadgen_payment_record (pay_no); \
        DELETE FROM loadgen_payment_record";
    const INSERT_PAYMENT: &'static str = "INSERT INTO loadgen_payment_record (pay_no) VALUES (?)";
    async fn setup_payments(pool: &sqlx::SqlitePool) -> Result<(), sqlx::Error> {
        sqlx::raw_sql(Self::PAYMENT_DDL).execute(pool).await.map(drop)
    }
    async fn insert_payment(conn: &mut sqlx::SqliteConnection, trade_no: &str) -> Result<u64, sqlx::Error> {
        idem::unique::insert(conn, "uk_loadgen_pay_no", sqlx::query(Self::INSERT_PAYMENT).bind(trade_no)).await
    }
    async fn coupon_of(conn: &mut sqlx::SqliteConnection, trade_no: &str) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar("SELECT id FROM shop_coupons WHERE trade_no = ?").bind(trade_no).fetch_one(conn).await
    }
    async fn reset(pool: &sqlx::SqlitePool) -> Result<(), sqlx::Error> {
        sqlx::raw_sql(RESET).execute(pool).await?;
        sqlx::raw_sql(OUTBOX_RESET).execute(pool).await?;
        Ok(())
    }
    async fn hand_claim(conn: &mut sqlx::SqliteConnection, key: &str) -> Result<bool, sqlx::Error> {
        let done = sqlx::query(
            "INSERT INTO idem_records (scope, idem_key, status, created_at, updated_at, expires_at) \
             VALUES ('loadgen.hand', ?, 'PROCESSING', 0, 0, 4102444800000) ON CONFLICT DO NOTHING",
        )
        .bind(key)
        .execute(conn)
        .await?;
        Ok(done.rows_affected() == 1)
    }
    async fn hand_store(conn: &mut sqlx::SqliteConnection, key: &str, response: &str) -> Result<(), sqlx::Error> {
        sqlx::query(
            "UPDATE idem_records SET status = 'DONE', response = ? WHERE scope = 'loadgen.hand' AND idem_key = ?",
        )
        .bind(response)
        .bind(key)
        .execute(conn)
        .await?;
        Ok(())
    }
    async fn set_order_status(
        conn: &mut sqlx::SqliteConnection,
        trade_no: &str,
        from: Option<i64>,
        to: i64,
    ) -> Result<u64, sqlx::Error> {
        let done = sqlx::query(set_status_sql(from, ("?1", "?2"))).bind(trade_no).bind(to).execute(conn).await?;
        Ok(done.rows_affected())
    }
}

async fn one_call<DB: Handwritten>(
    pool: &sqlx::Pool<DB>,
    scenario: Scenario,
    mode: Mode,
    trade_no: &str,
    user_id: i64,
) -> Result<(), AppError>
where
    DB::Connection: Send,
{
    if mode == Mode::ZeroRt {
        // BEGIN is held back: it goes out with the guard's claim.
        let mut tx = idem::begin(pool).await?;
        guarded_zero_rt::<DB>(&mut tx, trade_no, user_id).await?;
        tx.commit().await?;
        return Ok(());
    }
    if mode == Mode::OneWrite {
        // The guard commits: `commit` sends nothing.
        let mut tx = idem::begin(pool).await?;
        guarded_one_write::<DB>(&mut tx, trade_no, user_id).await?;
        tx.commit().await?;
        return Ok(());
    }
    let mut tx = pool.begin().await?;
    let paid = OrderStatus::Paid.code();
    match (scenario, mode) {
        (Scenario::Unique, Mode::Unguarded) => {
            DB::insert_payment(&mut tx, trade_no).await?;
            business::<DB>(&mut tx, trade_no, user_id).await?;
        }
        (Scenario::Unique, Mode::Guarded) => {
            guarded_unique(&mut tx, trade_no, user_id).await?;
        }
        (Scenario::Unique, Mode::Dedup) => {
            guarded_dedup_payment(&mut tx, trade_no, user_id).await?;
        }
        (Scenario::Unique, Mode::Handwritten) | (_, Mode::Dedup) => {
            unreachable!("scenario unique's modes are unguarded, guarded and dedup")
        }
        (Scenario::Dedup | Scenario::Outbox, Mode::Unguarded) => {
            business::<DB>(&mut tx, trade_no, user_id).await?;
        }
        (Scenario::Dedup | Scenario::Outbox, Mode::Guarded) => {
            guarded(&mut tx, trade_no, user_id).await?;
        }
        (_, Mode::Outbox) => {
            guarded_outbox(&mut tx, trade_no, user_id).await?;
        }
        (_, Mode::GuardedAfter) => {
            guarded_after(&mut tx, trade_no, user_id).await?;
        }
        (Scenario::Dedup, Mode::Handwritten) => {
            if DB::hand_claim(&mut tx, trade_no).await? {
                let coupon = business::<DB>(&mut tx, trade_no, user_id).await?;
                DB::hand_store(&mut tx, trade_no, &coupon.to_string()).await?;
            }
        }
        (_, Mode::Unguarded) => {
            DB::set_order_status(&mut tx, trade_no, None, paid).await?;
            business::<DB>(&mut tx, trade_no, user_id).await?;
        }
        (Scenario::State, Mode::Guarded) => {
            guarded_state(&mut tx, trade_no, user_id).await?;
        }
        (Scenario::State, Mode::Handwritten) => {
            if hand_pay::<DB>(&mut tx, trade_no).await? {
                business::<DB>(&mut tx, trade_no, user_id).await?;
            }
        }
        (Scenario::DedupState, Mode::Guarded) => {
            guarded_dedup_state(&mut tx, trade_no, user_id).await?;
        }
        (_, Mode::ZeroRt | Mode::OneWrite) => unreachable!("an idem::Tx, above"),
        (Scenario::DedupState, Mode::Handwritten) => {
            if DB::hand_claim(&mut tx, trade_no).await? && hand_pay::<DB>(&mut tx, trade_no).await? {
                let coupon = business::<DB>(&mut tx, trade_no, user_id).await?;
                DB::hand_store(&mut tx, trade_no, &coupon.to_string()).await?;
            }
        }
        // Not in `scenario.modes()`: the scenarios without modes run in
        // modules of their own.
        _ => unreachable!("{scenario:?} has no mode {mode:?}"),
    }
    tx.commit().await?;
    Ok(())
}

#[derive(Default)]
struct Tally {
    calls: u64,
    busy: Duration,
    /// Throughput of each slice, in run order (one per round).
    slice_tps: Vec<f64>,
    latencies_us: Vec<u32>,
}

/// Trade numbers `L{run}-{n}`, n from this counter, one per call.
static SEQ: AtomicU64 = AtomicU64::new(0);

struct Slice<'a> {
    scenario: Scenario,
    mode: Mode,
    clients: usize,
    length: Duration,
    run: &'a str,
    /// The fastest slice of this run so far (warm-up and every mode
    /// included), in calls per second: what the state scenarios prepare for.
    best: f64,
}

/// One slice of `mode`; its rate is added to `tally`, and returned. An error
/// if any call failed.
async fn slice<DB: Handwritten>(pool: &sqlx::Pool<DB>, s: Slice<'_>, tally: &mut Tally) -> Result<f64, BoxError>
where
    DB::Connection: Send,
{
    let Slice { scenario, mode, clients, length, run, best } = s;
    let mut prepared = u64::MAX;
    if matches!(scenario, Scenario::State | Scenario::DedupState) {
        // The orders this slice will pay, created ahead (not timed), sized
        // by the run: twice what its fastest slice so far would pay in this
        // slice's length, and never fewer than 20,000. A count fixed ahead
        // runs out on a fast host, and then the modes no longer do the same
        // work: the guards fail on a missing order while the unguarded blind
        // write changes no row. Should a slice still reach its last order,
        // it ends there (its rate is over the time it ran), so that every
        // call in every mode pays an order waiting for payment.
        let budget = ((best * length.as_secs_f64() * 2.0) as u64).max(20_000);
        let from = SEQ.load(Ordering::Relaxed);
        prepared = from + budget;
        DB::create_orders(pool, &format!("L{run}-"), from, prepared).await?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let ran_out = Arc::new(tokio::sync::Notify::new());
    let started = Instant::now();
    let mut tasks = Vec::new();
    for client in 0..clients {
        let (pool, stop, ran_out, run) = (pool.clone(), stop.clone(), ran_out.clone(), run.to_owned());
        tasks.push(tokio::spawn(async move {
            let (mut lat, mut errors) = (Vec::new(), Errors::default());
            while !stop.load(Ordering::Relaxed) {
                let n = SEQ.fetch_add(1, Ordering::Relaxed);
                if n >= prepared {
                    stop.store(true, Ordering::Relaxed);
                    ran_out.notify_one();
                    break;
                }
                let trade_no = format!("L{run}-{n}");
                let user_id = ((client as u64 * 7919 + n * 104_729) % 1000) as i64;
                let t = Instant::now();
                match one_call(&pool, scenario, mode, &trade_no, user_id).await {
                    Ok(()) => lat.push(t.elapsed().as_micros().min(u128::from(u32::MAX)) as u32),
                    Err(e) => errors.add(e),
                }
            }
            (lat, errors)
        }));
    }
    tokio::select! {
        () = tokio::time::sleep(length) => {}
        () = ran_out.notified() => eprintln!("({mode:?}: a slice paid all its orders after {:?})", started.elapsed()),
    }
    stop.store(true, Ordering::Relaxed);
    let (mut calls, mut errors) = (0, Errors::default());
    for t in tasks {
        let (lat, e) = t.await.expect("client task");
        calls += lat.len() as u64;
        tally.latencies_us.extend(lat);
        errors.absorb(e);
    }
    errors.check(scenario.name(), &format!("{mode:?}"))?;
    let elapsed = started.elapsed();
    let tps = calls as f64 / elapsed.as_secs_f64();
    tally.calls += calls;
    tally.busy += elapsed;
    tally.slice_tps.push(tps);
    // Skip the orders created but not used: the next slice creates its own.
    if prepared != u64::MAX {
        SEQ.fetch_max(prepared, Ordering::Relaxed);
    }
    Ok(tps)
}

/// Median over rounds of a/b, each from the same round's slices: the server
/// drifts (tables grow, checkpoints, autovacuum), and comparing slices that
/// ran next to each other cancels most of that drift.
fn median_ratio(a: &Tally, b: &Tally) -> f64 {
    median_of_ratios(&a.slice_tps, &b.slice_tps)
}

/// The median of a[i] / b[i].
fn median_of_ratios(a: &[f64], b: &[f64]) -> f64 {
    let mut r: Vec<f64> = a.iter().zip(b).map(|(x, y)| x / y).collect();
    r.sort_by(f64::total_cmp);
    if r.is_empty() {
        return f64::NAN;
    }
    let mid = r.len() / 2;
    if r.len() % 2 == 1 { r[mid] } else { (r[mid - 1] + r[mid]) / 2.0 }
}

/// Length of one measuring slice: `seconds` shared by `rounds` rounds of
/// `slices` slices each, at least `floor` seconds.
fn slice_length(seconds: u64, rounds: u32, slices: f64, floor: f64) -> Duration {
    Duration::from_secs_f64((seconds as f64 / f64::from(rounds.max(1)) / slices).max(floor))
}

fn percentile(sorted: &[u32], p: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

async fn run<DB: Handwritten>(
    store: &str,
    pool: &sqlx::Pool<DB>,
    args: &Args,
    added_rtt: Option<AddedRtt>,
    floor: &mut FloorControl,
) -> Result<(), BoxError>
where
    DB::Connection: Send,
{
    if !args.skip_migrate {
        idem::migrate(pool).await?;
    }
    DB::setup(pool).await?;
    // Start every run from the same table sizes: earlier runs' rows would
    // slow later ones and blur the comparison.
    DB::reset(pool).await?;
    if args.scenario == Scenario::Unique {
        DB::setup_payments(pool).await?;
    }
    let run = common::run_id();
    let scenario = args.scenario;
    let modes = scenario.modes();
    let mut tallies: Vec<Tally> = modes.iter().map(|_| Tally::default()).collect();
    let clients = args.clients;
    // Warm-up: connections open, caches and statement caches filled.
    let mut warm = Tally::default();
    let mut best = 0.0_f64;
    for &mode in modes {
        let length = Duration::from_millis(500);
        best = best.max(slice(pool, Slice { scenario, mode, clients, length, run: &run, best }, &mut warm).await?);
    }
    if let FloorControl::Client(f) = floor
        && let Err(e) = async {
            f.slice(Script::Guarded, Duration::from_secs(1), &format!("P{run}-w-")).await?;
            f.slice(Script::Control, Duration::from_secs(1), &format!("U{run}-w-")).await
        }
        .await
    {
        eprintln!("no floor: {e}");
        *floor = FloorControl::Na("client_failed");
    }
    // The C client's slices (`vs_floor`, `floor_ratio`) take their turns
    // after the modes, in the same rotation, and their share of `--seconds`.
    let turns = modes.len() + 2 * usize::from(matches!(floor, FloorControl::Client(_)));
    let slices = turns as f64 * f64::from(args.rounds.max(1));
    let slice_len = Duration::from_secs_f64(args.seconds as f64 / slices);
    let purge = (args.purge_beside > 0).then(|| {
        let options = idem::sql::PurgeOptions {
            batch_size: args.purge_beside,
            pause: Duration::from_millis(args.purge_pause_ms),
            pause_factor: args.purge_pause_factor,
            ..Default::default()
        };
        PurgeBeside::start(pool, options)
    });
    for round in 0..args.rounds.max(1) as usize {
        // Rotate the order each round so no mode always follows another.
        for i in 0..turns {
            let m = (i + round) % turns;
            if let (FloorControl::Client(floor), true) = (&mut *floor, m >= modes.len()) {
                if m == modes.len() {
                    let tps = floor.slice(Script::Guarded, slice_len, &format!("P{run}-{round}-")).await?;
                    floor.slice_tps.push(tps);
                } else {
                    let tps = floor.slice(Script::Control, slice_len, &format!("U{run}-{round}-")).await?;
                    floor.control_tps.push(tps);
                }
                continue;
            }
            let s = Slice { scenario, mode: modes[m], clients, length: slice_len, run: &run, best };
            best = best.max(slice(pool, s, &mut tallies[m]).await?);
        }
    }
    let purged = match purge {
        Some(purge) => Some(purge.stop().await?),
        None => None,
    };
    let index = |mode| modes.iter().position(|m| *m == mode);
    let tps = |mode| index(mode).map_or(0.0, |i| tallies[i].calls as f64 / tallies[i].busy.as_secs_f64());
    let (unguarded, guarded, handwritten) = (tps(Mode::Unguarded), tps(Mode::Guarded), tps(Mode::Handwritten));
    let ratio = |a, b| match (index(a), index(b)) {
        (Some(a), Some(b)) => median_ratio(&tallies[a], &tallies[b]),
        _ => f64::NAN,
    };
    let outbox_ratio = index(Mode::Outbox).map(|_| ratio(Mode::Outbox, Mode::Guarded));
    let (dedup, dedup_ratio, vs_dedup) =
        (tps(Mode::Dedup), ratio(Mode::Dedup, Mode::Unguarded), ratio(Mode::Guarded, Mode::Dedup));
    let (ratio, vs_handwritten) = (ratio(Mode::Guarded, Mode::Unguarded), ratio(Mode::Guarded, Mode::Handwritten));
    let outbox = tps(Mode::Outbox);
    let after_ratio = index(Mode::GuardedAfter).map(|i| median_ratio(&tallies[i], &tallies[0]));
    let after = tps(Mode::GuardedAfter);
    let zero_rt = tps(Mode::ZeroRt);
    let zero_rt_ratio = index(Mode::ZeroRt).map(|i| median_ratio(&tallies[i], &tallies[0]));
    let one_write = tps(Mode::OneWrite);
    let one_write_ratio = index(Mode::OneWrite).map(|i| median_ratio(&tallies[i], &tallies[0]));
    let vs_claim_after =
        index(Mode::ZeroRt).zip(index(Mode::GuardedAfter)).map(|(z, a)| median_ratio(&tallies[z], &tallies[a]));
    let mut percentiles = |mode| {
        let Some(i) = index(mode) else { return (0, 0) };
        let mut lat = std::mem::take(&mut tallies[i].latencies_us);
        lat.sort_unstable();
        (percentile(&lat, 0.50), percentile(&lat, 0.99))
    };
    let (p50, p99) = percentiles(Mode::Guarded);
    let (after_p50, after_p99) = percentiles(Mode::GuardedAfter);
    let (zero_rt_p50, zero_rt_p99) = percentiles(Mode::ZeroRt);
    let (one_write_p50, one_write_p99) = percentiles(Mode::OneWrite);
    let (outbox_p50, outbox_p99) = percentiles(Mode::Outbox);
    let (dedup_p50, dedup_p99) = percentiles(Mode::Dedup);
    let name = scenario.name();
    // The outbox scenario has no hand-written mode.
    let (hand_text, hand_fields) = match index(Mode::Handwritten) {
        Some(_) => (
            format!(", hand-written guard {handwritten:.0} tx/s"),
            format!(" handwritten_tps={handwritten:.0} vs_handwritten={vs_handwritten:.3}"),
        ),
        None => (String::new(), String::new()),
    };
    println!(
        "{name}: unguarded {unguarded:.0} tx/s, guarded {guarded:.0} tx/s{hand_text} ({clients} clients, {} s)",
        args.seconds
    );
    let mut line = format!(
        "scenario={name} store={store} clients={clients} guarded_tps={guarded:.0} unguarded_tps={unguarded:.0}\
         {hand_fields} ratio={ratio:.3} p50_us={p50} p99_us={p99}"
    );
    if index(Mode::Dedup).is_some() {
        println!(
            "the same change under dedup: {dedup:.0} tx/s, {dedup_ratio:.3} of unguarded; unique {vs_dedup:.3} of dedup"
        );
        line.push_str(&format!(
            " dedup_tps={dedup:.0} ratio_dedup={dedup_ratio:.3} vs_dedup={vs_dedup:.3} dedup_p50_us={dedup_p50} \
             dedup_p99_us={dedup_p99}"
        ));
    }
    if let Some(after_ratio) = after_ratio {
        println!("guarded with claim=after: {after:.0} tx/s");
        line.push_str(&format!(
            " claim_after_tps={after:.0} ratio_claim_after={after_ratio:.3} claim_after_p50_us={after_p50} \
             claim_after_p99_us={after_p99}"
        ));
    }
    if let (Some(zero_rt_ratio), Some(vs_claim_after)) = (zero_rt_ratio, vs_claim_after) {
        println!(
            "guarded on an idem::Tx (zero round trips): {zero_rt:.0} tx/s, {zero_rt_ratio:.3} of unguarded, \
             {vs_claim_after:.3} of claim=after (medians of per-round ratios), p50 {zero_rt_p50} us, p99 {zero_rt_p99} us"
        );
        line.push_str(&format!(
            " zero_rt_tps={zero_rt:.0} ratio_zero_rt={zero_rt_ratio:.3} vs_claim_after={vs_claim_after:.3} \
             zero_rt_p50_us={zero_rt_p50} zero_rt_p99_us={zero_rt_p99}"
        ));
    }
    if let Some(one_write_ratio) = one_write_ratio {
        println!(
            "guarded on an idem::Tx, claim=commit (one write): {one_write:.0} tx/s, {one_write_ratio:.3} of unguarded \
             (median of per-round ratios), p50 {one_write_p50} us, p99 {one_write_p99} us"
        );
        line.push_str(&format!(
            " one_write_tps={one_write:.0} ratio_one_write={one_write_ratio:.3} one_write_p50_us={one_write_p50} \
             one_write_p99_us={one_write_p99}"
        ));
    }
    if let Some(outbox_ratio) = outbox_ratio {
        println!(
            "guarded with one outbox message: {outbox:.0} tx/s, {outbox_ratio:.3} of guarded without it \
             (median of per-round ratios), p50 {outbox_p50} us, p99 {outbox_p99} us"
        );
        line.push_str(&format!(
            " outbox_tps={outbox:.0} outbox_ratio={outbox_ratio:.3} outbox_p50_us={outbox_p50} outbox_p99_us={outbox_p99}"
        ));
    }
    match floor {
        FloorControl::Client(floor) => {
            let floor_tps = floor.slice_tps.iter().sum::<f64>() / floor.slice_tps.len().max(1) as f64;
            let (measured, control) = floor.pair.names();
            let mode = if floor.pair == Pair::Outbox { Mode::Outbox } else { Mode::OneWrite };
            let vs_floor = index(mode).map_or(f64::NAN, |i| median_of_ratios(&tallies[i].slice_tps, &floor.slice_tps));
            let floor_ratio = median_of_ratios(&floor.slice_tps, &floor.control_tps);
            let seconds = Floor::whole_seconds(slice_len);
            let (client, scripts) = (floor.name(), floor.scripts());
            let allows = if floor.pair == Pair::Outbox { "outbox_ratio" } else { "ratio_one_write" };
            println!(
                "{client} sending {measured}'s statements ({scripts}/{measured}.sql, {seconds} s slices): \
                 {floor_tps:.0} tx/s; {measured} {vs_floor:.3} of it (median of per-round ratios); \
                 {floor_ratio:.3} of {client} sending {control}'s ({scripts}/{control}.sql): \
                 what the server allows {allows}"
            );
            line.push_str(&format!(
                " vs_floor={vs_floor:.3} floor_ratio={floor_ratio:.3} floor_tps={floor_tps:.0} floor_slice_s={seconds} \
                 floor_client={client}"
            ));
        }
        FloorControl::Na(why) => {
            println!("no C client floor for one_write ({why}): vs_floor=na");
            line.push_str(&format!(" vs_floor=na floor_ratio=na floor_tps=na floor={why}"));
        }
        FloorControl::NotHere => {}
    }
    if let Some(AddedRtt { asked_us, measured }) = added_rtt {
        let measured_us = measured.as_micros();
        println!("database {asked_us} us further away (measured: {measured_us} us more per ping)");
        line.push_str(&format!(" added_rtt_us={asked_us} added_rtt_measured_us={measured_us}"));
    }
    if let Some((report, took)) = purged {
        let (deleted, batches, secs) = (report.deleted, report.batches, took.as_secs_f64());
        println!("purged beside the load: {deleted} expired records in {batches} batches, {secs:.1} s");
        line.push_str(&format!(" purged={deleted} purge_batches={batches} purge_s={secs:.1}"));
    }
    println!("{line}");
    if scenario == Scenario::Outbox {
        // No relay ran: leave no pending messages in a shared outbox.
        DB::reset(pool).await?;
    }
    Ok(())
}

/// `--purge-beside`: `purge_expired` run again and again beside the measured
/// rounds, until they end or no expired record is left.
struct PurgeBeside {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Result<(idem::sql::PurgeReport, Duration), idem::Error>>,
}

impl PurgeBeside {
    fn start<DB: Handwritten>(pool: &sqlx::Pool<DB>, options: idem::sql::PurgeOptions) -> PurgeBeside {
        let stop = Arc::new(AtomicBool::new(false));
        let (pool, flag) = (pool.clone(), stop.clone());
        let task = tokio::spawn(async move {
            let started = Instant::now();
            let mut total = idem::sql::PurgeReport::default();
            // A few batches per call, so that the end of the rounds stops it
            // within a few batches.
            let options = idem::sql::PurgeOptions { max_batches: Some(10), ..options };
            while !flag.load(Ordering::Relaxed) {
                let report = idem::sql::purge_expired(&pool, options.clone()).await?;
                total.deleted += report.deleted;
                total.batches += report.batches;
                if report.batches < 10 {
                    break;
                }
            }
            Ok((total, started.elapsed()))
        });
        PurgeBeside { stop, task }
    }

    /// Stop purging; what it deleted, and for how long it ran.
    async fn stop(self) -> Result<(idem::sql::PurgeReport, Duration), BoxError> {
        self.stop.store(true, Ordering::Relaxed);
        Ok(self.task.await??)
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    if args.purge_beside > 0 && !matches!(args.scenario, Scenario::Dedup | Scenario::State | Scenario::DedupState) {
        return Err("--purge-beside is for the dedup, state and dedup+state scenarios".into());
    }
    if args.added_rtt_us > 0 && !matches!(args.scenario, Scenario::Dedup | Scenario::State | Scenario::DedupState) {
        return Err("--added-rtt-us is for the dedup, state and dedup+state scenarios".into());
    }
    if args.scenario == Scenario::Lease {
        let (db, redis) = (args.database_url.as_deref(), args.redis_url.as_deref());
        if args.failover {
            if args.redis_cluster_urls.is_empty() {
                return Err("--failover needs --redis-cluster-urls".into());
            }
            return cluster_bench::failover(&args.redis_cluster_urls, args.clients, args.rounds).await;
        }
        if !args.redis_cluster_urls.is_empty() {
            let url = redis.ok_or("--redis-cluster-urls needs --redis-url (the one node to compare with)")?;
            return cluster_bench::run(url, &args.redis_cluster_urls, args.clients, args.seconds, args.rounds).await;
        }
        if let Some(out) = &args.callgrind_out {
            let url = redis.ok_or("--callgrind-out needs --redis-url (the Redis under callgrind)")?;
            return lease_bench::run_instructions(url, out, args.calls, args.clients).await;
        }
        if let Some(only) = args.only {
            return lease_bench::run_only(only, db, redis, args.clients, args.seconds).await;
        }
        return lease_bench::run(db, redis, args.clients, args.seconds, args.rounds).await;
    }
    if args.scenario == Scenario::Steps {
        let (db, redis) = (args.database_url.as_deref(), args.redis_url.as_deref());
        return steps_bench::run(db, redis, args.steps, args.clients, (args.seconds, args.rounds)).await;
    }
    if args.scenario == Scenario::Wait {
        let (db, redis) = (args.database_url.as_deref(), args.redis_url.as_deref());
        return wait_bench::run(db, redis, args.clients, args.rounds).await;
    }
    if matches!(args.scenario, Scenario::Relay | Scenario::OutboxLatency) {
        let store = Store::connect(args.database_url.as_deref(), args.clients as u32 + 4).await?;
        let options = outbox_bench::Options {
            clients: args.clients,
            seconds: args.seconds,
            messages: args.messages,
            keys: args.keys,
            amqp_url: args.amqp_url.clone(),
            nats_url: args.nats_url.clone(),
        };
        let latency = args.scenario == Scenario::OutboxLatency;
        let done = match &store {
            Store::Sqlite(pool, _) => outbox_bench::run(store.name(), pool, &options, latency).await,
            Store::Postgres(pool) => outbox_bench::run(store.name(), pool, &options, latency).await,
            Store::MySql(pool) => outbox_bench::run(store.name(), pool, &options, latency).await,
        };
        store.close().await;
        return done;
    }
    if args.scenario == Scenario::Mq {
        let (db, redis) = (args.database_url.as_deref(), args.redis_url.as_deref());
        return mq_bench::run(db, redis, args.clients, args.seconds, args.rounds).await;
    }
    let (redis, connection, pool) = (args.redis_url.as_deref(), args.redis_connection, args.redis_pool);
    let (clients, seconds, rounds) = (args.clients, args.seconds, args.rounds);
    match args.scenario {
        Scenario::Token => return token_bench::run_token(redis, connection, pool, clients, seconds, rounds).await,
        Scenario::Lock => return token_bench::run_lock(redis, connection, pool, clients, seconds, rounds).await,
        _ => {}
    }
    let mut url = args.database_url.clone();
    let mut added_rtt = None;
    if args.added_rtt_us > 0 {
        let direct = url.as_deref().unwrap_or_default();
        let proxied = rtt_proxy::start(direct, Duration::from_micros(args.added_rtt_us)).await?;
        let (direct_rtt, proxied_rtt) = rtt_proxy::measure(direct, &proxied).await?;
        let measured = proxied_rtt.saturating_sub(direct_rtt);
        added_rtt = Some(AddedRtt { asked_us: args.added_rtt_us, measured });
        url = Some(proxied);
    }
    let store = Store::connect(url.as_deref(), args.clients as u32 + 2).await?;
    let mut floor = FloorControl::NotHere;
    match (&store, args.scenario, url.as_deref()) {
        (Store::Postgres(_), Scenario::Dedup, Some(url)) => {
            floor = FloorControl::pgbench(url, args.clients, Pair::OneWrite)?
        }
        (Store::MySql(_), Scenario::Dedup, Some(url)) => floor = FloorControl::slap(url, args.clients, Pair::OneWrite)?,
        (Store::Postgres(_), Scenario::Outbox, Some(url)) => {
            floor = FloorControl::pgbench(url, args.clients, Pair::Outbox)?
        }
        (Store::MySql(_), Scenario::Outbox, Some(url)) => floor = FloorControl::slap(url, args.clients, Pair::Outbox)?,
        _ => {}
    }
    match &store {
        Store::Sqlite(pool, _) => run(store.name(), pool, &args, added_rtt, &mut floor).await?,
        Store::Postgres(pool) => run(store.name(), pool, &args, added_rtt, &mut floor).await?,
        Store::MySql(pool) => run(store.name(), pool, &args, added_rtt, &mut floor).await?,
    }
    store.close().await;
    Ok(())
}
