//! Key-routed SQL shards: two PostgreSQL databases hold an orders table
//! split by order id. A dedup record is written in the transaction of its
//! order's shard, so it lives there and nowhere else; lease records go
//! through `idem::store::Routed` with the same route.
//!
//! The shards are the databases `idem_shard_0` and `idem_shard_1` on the
//! server of `IDEM_PG_URL` (default: the local one), created from here if
//! missing. Keys are unique per run: tests and earlier runs share the
//! tables without seeing each other's rows.

use idem_test_support as common;
#[path = "../examples/common/shards.rs"]
mod shards;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{AppError, unique};
use idem::store::{Routed, SqlStore};
use idem::{Error, Outcome, idempotent};
use serde::{Deserialize, Serialize};
use shards::{SHARDS, ensure_database, shard_of};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool, Postgres, Transaction};

const DUPLICATES: usize = 100;
const PAID_SCOPE: &str = "tests.shards.on_paid";
const REFUND_SCOPE: &str = "tests.shards.refund";

/// The test's tables on a shard, created under an advisory lock (two
/// sessions creating one table at once can fail on PostgreSQL's catalog).
async fn setup_shard(pool: &PgPool) -> Result<(), sqlx::Error> {
    idem::migrate(pool).await.expect("migrate a shard");
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('idem_test_shards'))").execute(&mut *tx).await?;
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS idem_test_shard_orders (order_id VARCHAR(191) PRIMARY KEY, \
           amount_cents BIGINT NOT NULL, payments INT NOT NULL DEFAULT 0);
         CREATE TABLE IF NOT EXISTS idem_test_shard_payments (id BIGSERIAL PRIMARY KEY, \
           order_id VARCHAR(191) NOT NULL, amount_cents BIGINT NOT NULL);
         CREATE INDEX IF NOT EXISTS idem_test_shard_payments_order ON idem_test_shard_payments (order_id);",
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await
}

/// A pool per shard, the databases created and migrated; `None` (skip, or
/// a failure with `IDEM_REQUIRE_SERVICES=1`) when the server is unreachable.
async fn shards() -> Option<Vec<PgPool>> {
    let url = std::env::var("IDEM_PG_URL").unwrap_or_else(|_| common::DEFAULT_PG_URL.to_owned());
    let mut admin = common::reach("PostgreSQL", &url, PgConnection::connect(&url)).await?;
    for name in SHARDS {
        ensure_database(&mut admin, name).await.unwrap_or_else(|e| panic!("create database {name}: {e}"));
    }
    admin.close().await.ok();
    let base: PgConnectOptions = url.parse().expect("IDEM_PG_URL is a PostgreSQL URL");
    let mut pools = Vec::new();
    for name in SHARDS {
        // Small pools: the tests of this file run at once, two shards each,
        // under the server's 100 connections.
        let pool = PgPoolOptions::new()
            .max_connections(5)
            .connect_with(base.clone().database(name))
            .await
            .unwrap_or_else(|e| panic!("connect to {name}: {e}"));
        setup_shard(&pool).await.unwrap_or_else(|e| panic!("set up {name}: {e}"));
        pools.push(pool);
    }
    Some(pools)
}

macro_rules! shards {
    () => {
        match shards().await {
            Some(pools) => pools,
            None => return,
        }
    };
}

/// `per_shard` fresh order ids routed to each shard.
fn order_ids(prefix: &str, per_shard: usize) -> Vec<String> {
    let mut ids = Vec::new();
    let mut count = [0; SHARDS.len()];
    while count.iter().any(|&n| n < per_shard) {
        let id = unique(prefix);
        let shard = shard_of(&id);
        if count[shard] < per_shard {
            count[shard] += 1;
            ids.push(id);
        }
    }
    ids
}

/// The orders, each on its shard (the business rows).
async fn create_orders(pools: &[PgPool], ids: &[String]) {
    for id in ids {
        sqlx::query("INSERT INTO idem_test_shard_orders (order_id, amount_cents) VALUES ($1, 1999)")
            .bind(id)
            .execute(&pools[shard_of(id)])
            .await
            .unwrap();
    }
}

/// The shard holding the order's row, asserting exactly one does.
async fn home_of(pools: &[PgPool], id: &str) -> usize {
    let mut homes = Vec::new();
    for (i, pool) in pools.iter().enumerate() {
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idem_test_shard_orders WHERE order_id = $1")
            .bind(id)
            .fetch_one(pool)
            .await
            .unwrap();
        if n == 1 {
            homes.push(i);
        }
    }
    assert_eq!(homes.len(), 1, "order {id} is on shards {homes:?}");
    homes[0]
}

/// Per shard: the keys among `keys` with a record of `scope` there, and its status.
async fn records(pools: &[PgPool], scope: &str, keys: &[String]) -> Vec<HashMap<String, String>> {
    let mut out = Vec::new();
    for pool in pools {
        let rows: Vec<(String, String)> =
            sqlx::query_as("SELECT idem_key, status FROM idem_records WHERE scope = $1 AND idem_key = ANY($2)")
                .bind(scope)
                .bind(keys)
                .fetch_all(pool)
                .await
                .unwrap();
        out.push(rows.into_iter().collect());
    }
    out
}

/// Per shard: payment rows per order among `ids`.
async fn payments(pools: &[PgPool], ids: &[String]) -> Vec<HashMap<String, i64>> {
    let mut out = Vec::new();
    for pool in pools {
        let rows: Vec<(String, i64)> = sqlx::query_as(
            "SELECT order_id, COUNT(*) FROM idem_test_shard_payments WHERE order_id = ANY($1) GROUP BY order_id",
        )
        .bind(ids)
        .fetch_all(pool)
        .await
        .unwrap();
        out.push(rows.into_iter().collect());
    }
    out
}

/// Asserts that every key's record of `scope` is on its order's shard, in
/// status `status`, and on no other shard.
async fn assert_records_at_home(pools: &[PgPool], scope: &str, ids: &[String], status: &str) {
    let found = records(pools, scope, ids).await;
    for id in ids {
        let home = home_of(pools, id).await;
        for (shard, records) in found.iter().enumerate() {
            if shard == home {
                assert_eq!(records.get(id).map(String::as_str), Some(status), "{scope} {id} on its shard {shard}");
            } else {
                assert!(
                    !records.contains_key(id),
                    "{scope} {id} has a record on shard {shard}, its order is on {home}"
                );
            }
        }
    }
}

#[derive(Clone, Debug, Serialize)]
struct PaidCallback {
    order_id: String,
    amount_cents: i64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Receipt {
    payment_id: i64,
}

/// The gateway's "paid" callback. Nothing in the body stops a second run
/// (no status check, no unique index on payments): only the dedup record,
/// written in `tx` on the order's shard, does.
#[idempotent(key = "cb.order_id", strategy = "dedup", fingerprint = "cb", scope = "tests.shards.on_paid")]
async fn on_paid(
    tx: &mut Transaction<'_, Postgres>,
    cb: &PaidCallback,
    fail: bool,
    runs: &AtomicUsize,
) -> Result<Receipt, AppError> {
    runs.fetch_add(1, SeqCst);
    let updated = sqlx::query("UPDATE idem_test_shard_orders SET payments = payments + 1 WHERE order_id = $1")
        .bind(&cb.order_id)
        .execute(&mut **tx)
        .await?
        .rows_affected();
    if updated != 1 {
        return Err(AppError::Rule(format!("no order {} on this shard", cb.order_id)));
    }
    let payment_id = sqlx::query_scalar(
        "INSERT INTO idem_test_shard_payments (order_id, amount_cents) VALUES ($1, $2) RETURNING id",
    )
    .bind(&cb.order_id)
    .bind(cb.amount_cents)
    .fetch_one(&mut **tx)
    .await?;
    if fail {
        return Err(AppError::Rule("the ledger refused the payment".into()));
    }
    Ok(Receipt { payment_id })
}

/// One delivery in a transaction on `pool`: begin, handle, commit.
async fn pay_on(
    pool: &PgPool,
    cb: &PaidCallback,
    fail: bool,
    runs: &AtomicUsize,
) -> Result<(Receipt, Outcome), AppError> {
    let mut tx = pool.begin().await?;
    let (receipt, outcome) = idem::observe(on_paid(&mut tx, cb, fail, runs)).await;
    let receipt = receipt?;
    tx.commit().await?;
    Ok((receipt, outcome.expect("the guard ran")))
}

/// One delivery routed to the order's shard: the route picks the
/// transaction, and the record follows it.
async fn pay(
    pools: &[PgPool],
    cb: &PaidCallback,
    fail: bool,
    runs: &AtomicUsize,
) -> Result<(Receipt, Outcome), AppError> {
    pay_on(&pools[shard_of(&cb.order_id)], cb, fail, runs).await
}

fn callback(order_id: &str) -> PaidCallback {
    PaidCallback { order_id: order_id.to_owned(), amount_cents: 1999 }
}

/// `DUPLICATES` concurrent deliveries of each order's callback; asserts
/// one execution and the same answer for all per order, and returns the answers.
async fn pay_concurrently(pools: &[PgPool], ids: &[String], runs: &Arc<AtomicUsize>) -> HashMap<String, Receipt> {
    let mut tasks = Vec::new();
    for id in ids {
        for _ in 0..DUPLICATES {
            let (pools, cb, runs) = (pools.to_vec(), callback(id), runs.clone());
            tasks.push(tokio::spawn(async move {
                let answer = pay(&pools, &cb, false, &runs).await;
                (cb.order_id, answer)
            }));
        }
    }
    let mut executed: HashMap<String, usize> = HashMap::new();
    let mut replayed: HashMap<String, usize> = HashMap::new();
    let mut answers: HashMap<String, HashSet<i64>> = HashMap::new();
    for t in tasks {
        let (id, answer) = t.await.unwrap();
        let (receipt, outcome) = answer.unwrap_or_else(|e| panic!("a duplicate of {id} failed: {e}"));
        match outcome {
            Outcome::Executed => *executed.entry(id.clone()).or_default() += 1,
            Outcome::Replayed => *replayed.entry(id.clone()).or_default() += 1,
            other => panic!("{id}: {other:?}"),
        }
        answers.entry(id).or_default().insert(receipt.payment_id);
    }
    let mut out = HashMap::new();
    for id in ids {
        assert_eq!(executed.get(id), Some(&1), "{id} executed once");
        assert_eq!(replayed.get(id), Some(&(DUPLICATES - 1)), "{id}: every other copy replayed");
        let answer = &answers[id];
        assert_eq!(answer.len(), 1, "{id}: one answer for all copies: {answer:?}");
        out.insert(id.clone(), Receipt { payment_id: *answer.iter().next().unwrap() });
    }
    out
}

/// The orders' business rows after one payment each: on its shard the
/// order counts one payment and has one payment row; the other shard has
/// neither.
async fn assert_paid_once(pools: &[PgPool], ids: &[String]) {
    let rows = payments(pools, ids).await;
    for id in ids {
        let home = home_of(pools, id).await;
        assert_eq!(home, shard_of(id), "{id} was created on its routed shard");
        for (shard, rows) in rows.iter().enumerate() {
            let expected = if shard == home { Some(&1) } else { None };
            assert_eq!(rows.get(id), expected, "payment rows of {id} on shard {shard} (its order is on {home})");
        }
        let counted: i32 = sqlx::query_scalar("SELECT payments FROM idem_test_shard_orders WHERE order_id = $1")
            .bind(id)
            .fetch_one(&pools[home])
            .await
            .unwrap();
        assert_eq!(counted, 1, "{id}: payments counted on the order");
    }
}

/// N orders over both shards, 100 concurrent copies of each one's callback:
/// the body runs once per order, the dedup record commits with the payment
/// on the order's shard and is absent from the other, a repeat replays.
#[tokio::test]
async fn dedup_records_stay_on_the_shard_of_their_business_row() {
    let pools = shards!();
    let ids = order_ids("shard-pay", 3);
    create_orders(&pools, &ids).await;
    let runs = Arc::new(AtomicUsize::new(0));

    let answers = pay_concurrently(&pools, &ids, &runs).await;
    assert_eq!(runs.load(SeqCst), ids.len(), "the body ran once per order");
    assert_records_at_home(&pools, PAID_SCOPE, &ids, "DONE").await;
    assert_paid_once(&pools, &ids).await;

    // A later repeat, routed to the order's shard, replays the first answer.
    for id in &ids {
        let (receipt, outcome) = pay(&pools, &callback(id), false, &runs).await.unwrap();
        assert_eq!((receipt, outcome), (answers[id].clone(), Outcome::Replayed));
    }
    assert_eq!(runs.load(SeqCst), ids.len());

    // Sent to the other shard, the copy meets no record and no order there:
    // the body runs, finds nothing to pay and fails, and its transaction
    // leaves nothing behind. The route decides where a key lives.
    for id in &ids {
        let wrong = &pools[1 - shard_of(id)];
        let err = pay_on(wrong, &callback(id), false, &runs).await.unwrap_err();
        assert!(matches!(&err, AppError::Rule(m) if m.starts_with("no order")), "{err}");
    }
    assert_records_at_home(&pools, PAID_SCOPE, &ids, "DONE").await;
    assert_paid_once(&pools, &ids).await;
}

/// A refund sent to the bank: outside work, no transaction shared with the
/// shards. Counts the transfers it was asked for, per order.
#[derive(Default)]
struct Bank {
    transfers: Mutex<HashMap<String, usize>>,
}

impl Bank {
    async fn refund(&self, refund: &Refund) -> Result<BankReceipt, AppError> {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut transfers = self.transfers.lock().unwrap();
        let n = transfers.entry(refund.order_id.clone()).or_default();
        *n += 1;
        Ok(BankReceipt { bank_ref: format!("{}#{n}", refund.order_id) })
    }

    fn transfers(&self, order_id: &str) -> usize {
        self.transfers.lock().unwrap().get(order_id).copied().unwrap_or(0)
    }
}

#[derive(Clone, Debug, Serialize)]
struct Refund {
    order_id: String,
    amount_cents: i64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct BankReceipt {
    bank_ref: String,
}

type Leases = Routed<SqlStore<Postgres>>;

/// The route of the transactions, for the lease records: each key's record
/// on the shard of its order.
fn routed_leases(pools: &[PgPool]) -> Leases {
    Routed::new(pools.iter().cloned().map(SqlStore::new).collect(), |_scope, key| shard_of(key))
}

#[idempotent(
    key = "refund.order_id",
    strategy = "lease",
    lease = "10s",
    fingerprint = "refund",
    scope = "tests.shards.refund",
    store = "leases"
)]
async fn send_refund(leases: &Leases, bank: &Bank, refund: &Refund, fail: bool) -> Result<BankReceipt, AppError> {
    if fail {
        return Err(AppError::Rule("the bank is unreachable".into()));
    }
    bank.refund(refund).await
}

/// A client of `send_refund`: told `InProgress`, it tries again shortly.
async fn refund_until_answered(
    leases: &Leases,
    bank: &Bank,
    refund: &Refund,
) -> Result<(BankReceipt, Outcome), AppError> {
    loop {
        match idem::observe(send_refund(leases, bank, refund, false)).await {
            (Ok(receipt), outcome) => return Ok((receipt, outcome.expect("the guard ran"))),
            (Err(AppError::Idem(Error::InProgress { retry_after, .. })), _) => {
                let wait =
                    retry_after.unwrap_or(Duration::ZERO).clamp(Duration::from_millis(5), Duration::from_millis(25));
                tokio::time::sleep(wait).await;
            }
            (Err(e), _) => return Err(e),
        }
    }
}

fn refund(order_id: &str) -> Refund {
    Refund { order_id: order_id.to_owned(), amount_cents: 1999 }
}

/// `DUPLICATES` concurrent refunds of each order through `leases`: one
/// transfer per order, the same answer for all copies.
async fn refund_concurrently(leases: &Arc<Leases>, bank: &Arc<Bank>, ids: &[String]) -> HashMap<String, BankReceipt> {
    let mut tasks = Vec::new();
    for id in ids {
        for _ in 0..DUPLICATES {
            let (leases, bank, refund) = (leases.clone(), bank.clone(), refund(id));
            tasks.push(tokio::spawn(async move {
                let answer = refund_until_answered(&leases, &bank, &refund).await;
                (refund.order_id, answer)
            }));
        }
    }
    let mut executed: HashMap<String, usize> = HashMap::new();
    let mut answers: HashMap<String, HashSet<String>> = HashMap::new();
    for t in tasks {
        let (id, answer) = t.await.unwrap();
        let (receipt, outcome) = answer.unwrap_or_else(|e| panic!("a refund of {id} failed: {e}"));
        match outcome {
            Outcome::Executed => *executed.entry(id.clone()).or_default() += 1,
            Outcome::Replayed => {}
            other => panic!("{id}: {other:?}"),
        }
        answers.entry(id).or_default().insert(receipt.bank_ref);
    }
    let mut out = HashMap::new();
    for id in ids {
        assert_eq!(executed.get(id), Some(&1), "{id} executed once");
        assert_eq!(bank.transfers(id), 1, "{id}: one transfer at the bank");
        let answer = &answers[id];
        assert_eq!(answer.len(), 1, "{id}: one answer for all copies: {answer:?}");
        out.insert(id.clone(), BankReceipt { bank_ref: answer.iter().next().unwrap().clone() });
    }
    out
}

/// Lease records through `Routed::new` with the transactions' route: 100
/// concurrent refunds per order, one transfer each, every record on the
/// shard of its order and only there; a repeat replays.
#[tokio::test]
async fn routed_lease_records_live_on_the_shard_of_their_order() {
    let pools = shards!();
    let ids = order_ids("shard-refund", 3);
    create_orders(&pools, &ids).await;
    let (leases, bank) = (Arc::new(routed_leases(&pools)), Arc::new(Bank::default()));

    let answers = refund_concurrently(&leases, &bank, &ids).await;
    assert_records_at_home(&pools, REFUND_SCOPE, &ids, "DONE").await;

    // A repeat, from another router built the same way (another process).
    let again = routed_leases(&pools);
    for id in &ids {
        let (receipt, outcome) = idem::observe(send_refund(&again, &bank, &refund(id), false)).await;
        assert_eq!((receipt.unwrap(), outcome), (answers[id].clone(), Some(Outcome::Replayed)));
        assert_eq!(bank.transfers(id), 1);
    }
}

/// A body that fails: the dedup transaction rolls back on the order's
/// shard, the lease record is released on the shard it was claimed on;
/// neither shard keeps a record, and a retry runs.
#[tokio::test]
async fn a_failing_body_leaves_no_record_on_either_shard_and_a_retry_runs() {
    let pools = shards!();
    let ids = order_ids("shard-fail", 1);
    create_orders(&pools, &ids).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let (leases, bank) = (Arc::new(routed_leases(&pools)), Arc::new(Bank::default()));

    for id in &ids {
        let err = pay(&pools, &callback(id), true, &runs).await.unwrap_err();
        assert!(matches!(&err, AppError::Rule(m) if m.contains("ledger refused")), "{err}");
        let err = send_refund(&leases, &bank, &refund(id), true).await.unwrap_err();
        assert!(matches!(&err, AppError::Rule(m) if m.contains("unreachable")), "{err}");
    }
    assert_eq!(runs.load(SeqCst), ids.len());
    for scope in [PAID_SCOPE, REFUND_SCOPE] {
        for (shard, records) in records(&pools, scope, &ids).await.iter().enumerate() {
            assert!(records.is_empty(), "{scope}: shard {shard} kept {records:?}");
        }
    }
    for (shard, rows) in payments(&pools, &ids).await.iter().enumerate() {
        assert!(rows.is_empty(), "shard {shard} kept payments {rows:?}");
    }

    // The retries run, once per order, under 100 concurrent copies.
    pay_concurrently(&pools, &ids, &runs).await;
    assert_eq!(runs.load(SeqCst), 2 * ids.len(), "one failed run and one retry per order");
    assert_paid_once(&pools, &ids).await;
    assert_records_at_home(&pools, PAID_SCOPE, &ids, "DONE").await;
    refund_concurrently(&leases, &bank, &ids).await;
    assert_records_at_home(&pools, REFUND_SCOPE, &ids, "DONE").await;
}

/// `Routed::hashed` over the shards: each key's record on exactly one of
/// them, the same one for another router over the same list (a repeat
/// replays), and keys spread over both.
#[tokio::test]
async fn hashed_routing_keeps_each_key_on_one_shard() {
    let pools = shards!();
    let hashed = || Routed::hashed(pools.iter().cloned().map(SqlStore::new).collect());
    let (leases, bank) = (Arc::new(hashed()), Arc::new(Bank::default()));
    let ids: Vec<String> = (0..4).map(|_| unique("shard-hashed")).collect();

    let answers = refund_concurrently(&leases, &bank, &ids).await;
    let found = records(&pools, REFUND_SCOPE, &ids).await;
    for id in &ids {
        let on: Vec<usize> = (0..pools.len()).filter(|&s| found[s].contains_key(id)).collect();
        assert_eq!(on.len(), 1, "{id} has records on shards {on:?}");
        assert_eq!(found[on[0]][id], "DONE");
    }
    let again = hashed();
    for id in &ids {
        let (receipt, outcome) = idem::observe(send_refund(&again, &bank, &refund(id), false)).await;
        assert_eq!((receipt.unwrap(), outcome), (answers[id].clone(), Some(Outcome::Replayed)));
    }

    // 64 more keys, one call each: both shards get some (all 64 on one
    // shard would have a chance of 2^-63 with a working hash).
    let spread: Vec<String> = (0..64).map(|_| unique("shard-spread")).collect();
    for id in &spread {
        send_refund(&leases, &bank, &refund(id), false).await.unwrap();
    }
    let found = records(&pools, REFUND_SCOPE, &spread).await;
    assert_eq!(found.iter().map(HashMap::len).sum::<usize>(), spread.len(), "one record per key");
    assert!(
        found.iter().all(|records| !records.is_empty()),
        "{:?}",
        found.iter().map(HashMap::len).collect::<Vec<_>>()
    );
}
