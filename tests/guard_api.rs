//! The guard API without the attribute: what `#[idempotent]` expands to,
//! called by hand (an HTTP layer, a consumer loop, a handler generic over
//! its work), on SQLite and memory, and on PostgreSQL where it says so.

use idem_test_support as common;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use common::unique;
use idem::state::Transition;
use idem::{Claim, Error, Guard, Outcome, StateMachine};

/// A service call written by hand: claim, run, complete.
async fn grant_coupon(pool: &sqlx::SqlitePool, trade_no: &str, runs: &AtomicUsize) -> Result<u64, Error> {
    let mut tx = pool.begin().await?;
    let coupon = match Guard::new("tests.api.grant").key(trade_no).fingerprint(&trade_no).dedup(&mut tx).await? {
        Claim::Replay(coupon) => coupon,
        Claim::Run(ticket) => {
            let n = runs.fetch_add(1, SeqCst) as u64 + 100;
            sqlx::query("INSERT INTO idem_test_coupons (trade_no) VALUES (?)").bind(trade_no).execute(&mut *tx).await?;
            ticket.complete(&mut tx, Ok::<u64, Error>(n)).await??
        }
    };
    tx.commit().await?;
    Ok(coupon)
}

#[tokio::test]
async fn dedup_by_hand_runs_once_and_replays() {
    let pool = common::sqlite().await.unwrap();
    let (trade, runs) = (unique("T"), AtomicUsize::new(0));
    let (first, outcome) = idem::observe(grant_coupon(&pool, &trade, &runs)).await;
    assert_eq!((first.unwrap(), outcome), (100, Some(Outcome::Executed)));
    let (again, outcome) = idem::observe(grant_coupon(&pool, &trade, &runs)).await;
    assert_eq!((again.unwrap(), outcome), (100, Some(Outcome::Replayed)));
    assert_eq!(runs.load(SeqCst), 1);
}

#[tokio::test]
async fn a_failed_body_leaves_no_record_even_if_the_caller_commits() {
    let pool = common::sqlite().await.unwrap();
    let trade = unique("T");
    let mut tx = pool.begin().await.unwrap();
    let Claim::Run(ticket) = Guard::new("tests.api.fail").key(&trade).dedup::<u64, _>(&mut tx).await.unwrap() else {
        panic!("first call")
    };
    let body: Result<u64, &str> = Err("card declined");
    assert_eq!(ticket.complete(&mut tx, body).await.unwrap(), Err("card declined"));
    tx.commit().await.unwrap();
    let key = idem::Key::new(&trade).unwrap();
    assert!(idem::sql::find_record(&pool, "tests.api.fail", &key).await.unwrap().is_none());
}

#[tokio::test]
async fn claim_after_and_precheck_are_options_of_the_same_guard() {
    let pool = common::sqlite().await.unwrap();
    let marks = idem::store::MemoryStore::new();
    let trade = unique("T");
    for expected in [Outcome::Executed, Outcome::Replayed, Outcome::Replayed] {
        let mut tx = pool.begin().await.unwrap();
        let guard = Guard::new("tests.api.options").key(&trade).claim_after().precheck(&marks, Duration::from_secs(60));
        let claim = idem::observe(guard.dedup::<String, _>(&mut tx)).await;
        let answer = match claim {
            (Ok(Claim::Replay(answer)), Some(outcome)) => {
                assert_eq!(outcome, expected);
                answer
            }
            (Ok(Claim::Run(ticket)), _) => {
                assert_eq!(expected, Outcome::Executed);
                ticket.finish(&mut tx, Ok::<_, Error>("first".to_owned())).await.unwrap()
            }
            (other, _) => panic!("{:?}", other.err()),
        };
        tx.commit().await.unwrap();
        assert_eq!(answer, "first");
    }
    assert!(idem::precheck::counters().confirmed >= 1, "a repeat replayed from the precheck's read");
}

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state(table = "idem_test_api_orders", key_column = "order_no", status_column = "status")]
enum OrderStatus {
    #[state(code = 1, to(Paid))]
    WaitPay,
    #[state(code = 2)]
    Paid,
}

const PAY: Transition = Transition::new(&<OrderStatus as StateMachine>::STATES, &["WaitPay"], "Paid");

#[tokio::test]
async fn state_by_hand_moves_once_and_repeats_silently() {
    let pool = common::sqlite().await.unwrap();
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS idem_test_api_orders (order_no TEXT PRIMARY KEY, status INTEGER NOT NULL)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let order = unique("O");
    sqlx::query("INSERT INTO idem_test_api_orders VALUES (?, 1)").bind(&order).execute(&pool).await.unwrap();
    let mut moved = 0;
    for _ in 0..3 {
        let mut tx = pool.begin().await.unwrap();
        match Guard::new("tests.api.pay").entity_key(&order).dedup_state::<Option<u32>, _>(&mut tx, &PAY).await {
            Ok(Claim::Run(ticket)) => {
                moved += 1;
                assert_eq!(ticket.finish(&mut tx, Ok::<_, Error>(Some(7))).await.unwrap(), Some(7));
            }
            Ok(Claim::Replay(answer)) => assert_eq!(answer, Some(7), "the first answer, from the record"),
            Err(e) => panic!("{e}"),
        }
        tx.commit().await.unwrap();
    }
    assert_eq!(moved, 1);
    // A guard whose key does not select the entity is refused before any SQL.
    let mut tx = pool.begin().await.unwrap();
    let err = Guard::new("tests.api.pay").key(&order).state::<(), _>(&mut tx, &PAY).await.unwrap_err();
    assert!(matches!(err, Error::InvalidKey { .. }), "{err}");
}

#[tokio::test]
async fn lease_token_and_lock_by_hand() {
    let store = idem::store::MemoryStore::new();
    let runs = AtomicUsize::new(0);
    let id = unique("L");
    for _ in 0..2 {
        let answer = match Guard::new("tests.api.lease").key(&id).lease::<usize>(&store, Duration::from_secs(5)).await {
            Ok(Claim::Run(ticket)) => {
                ticket.run(async { Ok::<_, Error>(runs.fetch_add(1, SeqCst) + 1) }).await.unwrap()
            }
            Ok(Claim::Replay(answer)) => answer,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(answer, 1);
    }

    let token = idem::token::issue(&store, "tests.api.form", Duration::from_secs(60)).await.unwrap();
    let first = Guard::new("tests.api.form").token::<()>(&store, Some(&token)).await;
    assert!(matches!(first, Ok(Claim::Run(_))));
    let second = Guard::new("tests.api.form").token::<()>(&store, Some(&token)).await;
    assert!(matches!(second, Err(Error::TokenRejected)));

    let held =
        Guard::new("tests.api.lock").key("sku-1").lock_only(&store, Duration::from_secs(5), Duration::ZERO).await;
    let held = held.unwrap();
    let busy =
        Guard::new("tests.api.lock").key("sku-1").lock_only(&store, Duration::from_secs(5), Duration::ZERO).await;
    assert!(matches!(busy, Err(Error::LockBusy { .. })));
    held.run(async { Ok::<_, Error>(()) }).await.unwrap();

    // A lock ticket dropped before it ran (the claim after it failed, say)
    // frees its lock at once, not at its TTL.
    let dropped = Guard::new("tests.api.lock").key("sku-2").lock_only(&store, Duration::from_secs(30), Duration::ZERO);
    drop(dropped.await.unwrap());
    let again = Guard::new("tests.api.lock").key("sku-2").lock_only(&store, Duration::from_secs(30), Duration::ZERO);
    assert!(again.await.is_ok(), "the dropped ticket released its lock");
}

#[tokio::test]
async fn claim_after_applies_to_dedup_only() {
    let pool = common::sqlite().await.unwrap();
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS idem_test_api_orders (order_no TEXT PRIMARY KEY, status INTEGER NOT NULL)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let order = unique("O");
    sqlx::query("INSERT INTO idem_test_api_orders VALUES (?, 1)").bind(&order).execute(&pool).await.unwrap();
    let runs = AtomicUsize::new(0);
    for _ in 0..2 {
        let mut tx = pool.begin().await.unwrap();
        let guard = Guard::new("tests.api.after_state").entity_key(&order).claim_after();
        let answer = match guard.dedup_state::<Option<u32>, _>(&mut tx, &PAY).await.unwrap() {
            Claim::Run(ticket) => {
                runs.fetch_add(1, SeqCst);
                ticket.finish(&mut tx, Ok::<_, Error>(Some(3))).await.unwrap()
            }
            Claim::Replay(answer) => answer,
        };
        tx.commit().await.unwrap();
        assert_eq!(answer, Some(3));
    }
    assert_eq!(runs.load(SeqCst), 1, "claimed before the body, as dedup+state always is");
    let status: i64 = sqlx::query_scalar("SELECT status FROM idem_test_api_orders WHERE order_no = ?")
        .bind(&order)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(status, 2);
}

#[tokio::test]
async fn a_guard_without_a_usable_scope_or_key_is_refused_before_any_store() {
    let store = idem::store::MemoryStore::new();
    for scope in ["", "  ", "two\nlines"] {
        let err = Guard::new(scope).key("k").lease::<()>(&store, Duration::from_secs(5)).await.unwrap_err();
        assert!(matches!(err, Error::InvalidScope { .. }), "{scope:?}: {err}");
    }
    let err = Guard::new("tests.api.nokey").lease::<()>(&store, Duration::from_secs(5)).await.unwrap_err();
    assert!(err.to_string().contains("the key has no part"), "{err}");
    let err = Guard::new("tests.api.blank").key(" ").lease::<()>(&store, Duration::from_secs(5)).await.unwrap_err();
    assert!(err.to_string().contains("the key is only whitespace"), "{err}");
    assert!(store.is_empty(), "nothing was written");
}

/// PostgreSQL: the same hand-written call on another database, through the
/// generic transaction.
#[tokio::test]
async fn dedup_by_hand_on_postgres() {
    let Some(pool) = common::postgres().await else { return };
    let trade = unique("T");
    for _ in 0..2 {
        let mut tx = pool.begin().await.unwrap();
        let n = match Guard::new("tests.api.pg").key(&trade).dedup::<i64, _>(&mut tx).await.unwrap() {
            Claim::Replay(n) => n,
            Claim::Run(ticket) => ticket.finish(&mut tx, Ok::<_, Error>(5)).await.unwrap(),
        };
        tx.commit().await.unwrap();
        assert_eq!(n, 5);
    }
}

/// An answer with a field JSON does not carry.
#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct Receipt {
    id: u64,
    #[serde(skip)]
    cached: Option<String>,
}

#[tokio::test]
async fn the_first_call_gets_what_every_repeat_gets() {
    // A `#[serde(skip)]` field is not stored: the first call gets it at its
    // default too, not a richer value than its repeats.
    let pool = common::sqlite().await.unwrap();
    let key = unique("skip");
    let answer = || Receipt { id: 7, cached: Some("in memory only".into()) };
    let mut replies = Vec::new();
    for _ in 0..2 {
        let mut tx = pool.begin().await.unwrap();
        let reply = match Guard::new("tests.api.skip").key(&key).dedup(&mut tx).await.unwrap() {
            Claim::Replay(reply) => reply,
            Claim::Run(ticket) => ticket.complete(&mut tx, Ok::<_, Error>(answer())).await.unwrap().unwrap(),
        };
        tx.commit().await.unwrap();
        replies.push(reply);
    }
    let store = idem::store::MemoryStore::new();
    for _ in 0..2 {
        let reply = match Guard::new("tests.api.skip").key(&key).lease(&store, Duration::from_secs(5)).await.unwrap() {
            Claim::Replay(reply) => reply,
            Claim::Run(ticket) => ticket.run(async { Ok::<_, Error>(answer()) }).await.unwrap(),
        };
        replies.push(reply);
    }
    assert!(replies.iter().all(|r| *r == Receipt { id: 7, cached: None }), "{replies:?}");
}

/// Payloads JSON writes alike: `null` for NaN, the infinities, `()` and
/// `None` (each through its own `Serialize`).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Null {
    NaN,
    Infinity,
    MinusInfinity,
    Unit,
    None,
}

impl serde::Serialize for Null {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Null::NaN => f64::NAN.serialize(s),
            Null::Infinity => f64::INFINITY.serialize(s),
            Null::MinusInfinity => f64::NEG_INFINITY.serialize(s),
            Null::Unit => ().serialize(s),
            Null::None => None::<u8>.serialize(s),
        }
    }
}

/// An order whose extra fields are flattened into it: one holding the
/// name `amount` writes that key twice.
#[derive(serde::Serialize)]
struct Order {
    amount: i64,
    #[serde(flatten)]
    extra: std::collections::BTreeMap<String, i64>,
}

/// One guarded call of `payload` under `key`, on a dedup record (SQLite)
/// and on a lease record (memory): whether each ran.
async fn guarded<P: serde::Serialize>(
    pool: &sqlx::SqlitePool,
    store: &idem::store::MemoryStore,
    key: &str,
    payload: &P,
) -> Result<(bool, bool), Error> {
    let mut tx = pool.begin().await?;
    let dedup = match Guard::new("tests.api.alike").key(key).fingerprint(payload).dedup::<(), _>(&mut tx).await? {
        Claim::Run(ticket) => ticket.complete(&mut tx, Ok::<_, Error>(())).await?.map(|()| true)?,
        Claim::Replay(()) => false,
    };
    tx.commit().await?;
    let lease = Guard::new("tests.api.alike").key(key).fingerprint(payload);
    let lease = match lease.lease::<()>(store, Duration::from_secs(5)).await? {
        Claim::Run(ticket) => ticket.run(async { Ok::<_, Error>(()) }).await.map(|()| true)?,
        Claim::Replay(()) => false,
    };
    Ok((dedup, lease))
}

/// 0.2 fingerprinted them alike, so the same key with the other payload
/// replayed the first one's answer: now it is a mismatch, and only the
/// first payload replays.
#[tokio::test]
async fn payloads_json_writes_alike_are_a_mismatch_for_each_other() {
    let pool = common::sqlite().await.unwrap();
    let store = idem::store::MemoryStore::new();
    let nulls = [Null::NaN, Null::Infinity, Null::MinusInfinity, Null::Unit, Null::None];
    for first in nulls {
        let key = unique("null");
        assert_eq!(guarded(&pool, &store, &key, &first).await.unwrap(), (true, true));
        for other in nulls.into_iter().filter(|&n| n != first) {
            let got = guarded(&pool, &store, &key, &other).await;
            assert!(matches!(got, Err(Error::KeyMismatch { .. })), "{first:?} then {other:?}: {got:?}");
        }
        assert_eq!(guarded(&pool, &store, &key, &first).await.unwrap(), (false, false), "{first:?} replays");
    }
    let twice = Order { amount: 1, extra: [("amount".to_owned(), 2)].into() };
    let once = Order { amount: 2, extra: Default::default() };
    let key = unique("twice");
    assert_eq!(guarded(&pool, &store, &key, &twice).await.unwrap(), (true, true));
    let got = guarded(&pool, &store, &key, &once).await;
    assert!(matches!(got, Err(Error::KeyMismatch { .. })), "a key written twice is not its last value: {got:?}");
    assert_eq!(guarded(&pool, &store, &key, &twice).await.unwrap(), (false, false));
}
