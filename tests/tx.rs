//! `idem::Tx`: the claim rides on BEGIN and the answer on COMMIT, on real
//! PostgreSQL and MySQL/MariaDB. Round trips are counted by a TCP proxy in
//! front of the server; the rest checks that the semantics of a
//! `sqlx::Transaction` guard hold (the suites in dedup.rs and state.rs run
//! with both transaction types as well).

use idem_test_support as common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use common::{AppError, unique};
use idem::{Claim, Guard, Key, idempotent};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A TCP proxy to `upstream` that counts round trips: each burst of client
/// bytes that follows server bytes (or opens the connection) is one.
async fn counting_proxy(upstream: u16) -> (u16, Arc<AtomicU64>) {
    let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let trips = Arc::new(AtomicU64::new(0));
    let counter = trips.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else { break };
            client.set_nodelay(true).unwrap();
            server.set_nodelay(true).unwrap();
            // 0 nothing yet, 1 the client spoke last, 2 the server did.
            let last = Arc::new(AtomicU8::new(0));
            let ((mut cr, mut cw), (mut sr, mut sw)) = (client.into_split(), server.into_split());
            let (trips, spoke) = (counter.clone(), last.clone());
            tokio::spawn(async move {
                let mut buf = vec![0u8; 1 << 16];
                while let Ok(n @ 1..) = cr.read(&mut buf).await {
                    if spoke.swap(1, SeqCst) != 1 {
                        trips.fetch_add(1, SeqCst);
                    }
                    if sw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
                let _ = sw.shutdown().await;
            });
            tokio::spawn(async move {
                let mut buf = vec![0u8; 1 << 16];
                while let Ok(n @ 1..) = sr.read(&mut buf).await {
                    last.store(2, SeqCst);
                    if cw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
                let _ = cw.shutdown().await;
            });
        }
    });
    (port, trips)
}

/// Scopes, keys and answers that would break a statement quoted by hand.
const HOSTILE: &[&str] = &[
    "it's",
    "back\\slash\\",
    "$$ dollar $$",
    "$q$ tagged $q$",
    "\\0 not a NUL",
    "'); DROP TABLE idem_records; --",
    "\u{202e}rtl\u{202c} and emoji 🧾",
    "0x27 0x5c",
    "--",
    "/* c */",
];

macro_rules! tx_suite {
    (
        mod $m:ident;
        db = $DB:ty;
        pool = $pool:path;
        upstream = $port:literal;
        url = $url:literal;
        insert_coupon = $insert:literal;
        count_coupons = $count:literal;
        delete_record = $delete_record:literal;
        session_id = $session_id:literal;
        short_lock_wait = $short_lock_wait:literal;
        texts = $texts:literal;
    ) => {
        mod $m {
            use super::*;

            type Db = $DB;

            macro_rules! pool {
                () => {
                    match $pool().await {
                        Some(pool) => pool,
                        None => return,
                    }
                };
            }

            #[idempotent(key = "trade_no", scope = "tests.tx.grant")]
            async fn grant(tx: &mut idem::Tx<Db>, trade_no: &str, runs: &AtomicUsize) -> Result<u64, AppError> {
                runs.fetch_add(1, SeqCst);
                sqlx::query($insert).bind(trade_no).execute(&mut **tx).await?;
                Ok(42)
            }

            #[idempotent(key = "trade_no", scope = "tests.tx.grant")]
            async fn grant_sqlx(
                tx: &mut sqlx::Transaction<'_, Db>,
                trade_no: &str,
                runs: &AtomicUsize,
            ) -> Result<u64, AppError> {
                runs.fetch_add(1, SeqCst);
                sqlx::query($insert).bind(trade_no).execute(&mut **tx).await?;
                Ok(42)
            }

            #[idempotent(key = "trade_no", scope = "tests.tx.fails")]
            async fn fails(tx: &mut idem::Tx<Db>, trade_no: &str) -> Result<u64, AppError> {
                sqlx::query($insert).bind(trade_no).execute(&mut **tx).await?;
                Err(AppError::Rule("no".into()))
            }

            #[idempotent(key = "trade_no", scope = "tests.tx.vanishes")]
            async fn deletes_its_record(tx: &mut idem::Tx<Db>, trade_no: &str) -> Result<u64, AppError> {
                sqlx::query($insert).bind(trade_no).execute(&mut **tx).await?;
                sqlx::query($delete_record).bind(trade_no).execute(&mut **tx).await?;
                Ok(1)
            }

            #[idempotent(key = "trade_no", scope = "tests.tx.savepoint")]
            async fn with_savepoint(tx: &mut idem::Tx<Db>, trade_no: &str) -> Result<u64, AppError> {
                use sqlx::Connection as _;
                let mut sp = (&mut **tx).begin().await?;
                sqlx::query($insert).bind(trade_no).execute(&mut *sp).await?;
                sp.rollback().await?;
                sqlx::query($insert).bind(trade_no).execute(&mut **tx).await?;
                Ok(7)
            }

            #[idempotent(key = "order_no", scope = "tests.tx.outer", claim = "after")]
            async fn outer_after(tx: &mut idem::Tx<Db>, order_no: &str, inner_key: &str) -> Result<String, AppError> {
                let inner = inner(tx, inner_key).await?;
                Ok(format!("outer+{inner}"))
            }

            #[idempotent(key = "key", scope = "tests.tx.inner")]
            async fn inner(tx: &mut idem::Tx<Db>, key: &str) -> Result<String, AppError> {
                sqlx::query($insert).bind(key).execute(&mut **tx).await?;
                Ok("inner".to_owned())
            }

            async fn coupons(pool: &sqlx::Pool<Db>, trade_no: &str) -> i64 {
                sqlx::query_scalar($count).bind(trade_no).fetch_one(pool).await.unwrap()
            }

            /// One guarded call through the Guard API: (ran, answer).
            async fn call(
                tx: &mut idem::Tx<Db>,
                scope: &str,
                key: &str,
                answer: &str,
            ) -> Result<(bool, String), idem::Error> {
                match Guard::new(scope.to_owned()).key(key).dedup::<String, _>(tx).await? {
                    Claim::Replay(first) => Ok((false, first)),
                    Claim::Run(ticket) => {
                        let stored = ticket.complete(tx, Ok::<_, idem::Error>(answer.to_owned())).await??;
                        Ok((true, stored))
                    }
                }
            }

            #[tokio::test]
            async fn a_first_call_takes_the_round_trips_of_a_plain_transaction_and_a_repeat_two() {
                let _migrated = pool!();
                let (port, trips) = counting_proxy($port).await;
                let url = format!($url, port);
                let pool = sqlx::pool::PoolOptions::<Db>::new()
                    .max_connections(1)
                    .test_before_acquire(false)
                    .connect(&url)
                    .await
                    .unwrap();
                let runs = AtomicUsize::new(0);
                // Warm up: prepare every statement on the one connection
                // (idem's read is prepared by the first repeat).
                let warm = unique("warm");
                for _ in 0..2 {
                    let mut tx = idem::begin(&pool).await.unwrap();
                    grant(&mut tx, &warm, &runs).await.unwrap();
                    tx.commit().await.unwrap();
                }
                let mut tx = pool.begin().await.unwrap();
                grant_sqlx(&mut tx, &unique("warm"), &AtomicUsize::new(0)).await.unwrap();
                tx.commit().await.unwrap();

                let key = unique("rt");
                let measure = |label: &'static str, before: u64| {
                    let n = trips.load(SeqCst) - before;
                    println!("{label}: {n} round trips");
                    n
                };
                // Counted from a connection in hand: the pool pings a
                // connection when it is returned, which is nobody's call.
                // Controls: a plain sqlx transaction (BEGIN, the insert,
                // COMMIT), and the same guard on a sqlx::Transaction.
                use sqlx::Connection as _;
                let mut conn = pool.acquire().await.unwrap();
                let before = trips.load(SeqCst);
                let mut plain = conn.begin().await.unwrap();
                sqlx::query($insert).bind(&key).execute(&mut *plain).await.unwrap();
                plain.commit().await.unwrap();
                let plain_trips = measure("plain transaction (BEGIN, insert, COMMIT)", before);
                let before = trips.load(SeqCst);
                let mut sqlx_tx = conn.begin().await.unwrap();
                grant_sqlx(&mut sqlx_tx, &unique("sqlx"), &runs).await.unwrap();
                sqlx_tx.commit().await.unwrap();
                let sqlx_guard =
                    measure("the guard on a sqlx::Transaction (BEGIN, claim, body, answer, COMMIT)", before);

                let before = trips.load(SeqCst);
                let mut tx = idem::Tx::new(conn).unwrap();
                assert_eq!(grant(&mut tx, &key, &runs).await.unwrap(), 42);
                tx.commit().await.unwrap();
                let first = measure("first call (BEGIN+claim, body, answer+COMMIT)", before);

                // The commit queued a ROLLBACK of sqlx's bookkeeping, sent by
                // the pool's ping on release.
                let conn = pool.acquire().await.unwrap();
                let before = trips.load(SeqCst);
                let mut tx = idem::Tx::new(conn).unwrap();
                assert_eq!(grant(&mut tx, &key, &runs).await.unwrap(), 42);
                let replay = measure("repeat (claim refused, ROLLBACK+read)", before);
                let before = trips.load(SeqCst);
                tx.commit().await.unwrap();
                let commit = measure("commit after a repeat", before);

                assert_eq!(
                    runs.load(SeqCst),
                    3,
                    "the warm-up, the control and the first call ran; the repeat replayed"
                );
                assert_eq!(plain_trips, 3, "the control: BEGIN, the insert, COMMIT");
                assert_eq!(sqlx_guard, 5, "the guard on a sqlx::Transaction adds two");
                if $texts {
                    assert_eq!(first, 3, "a first call: BEGIN+claim, body, answer+COMMIT");
                    assert_eq!(replay, 2, "a repeat: the refused claim, then ROLLBACK+read");
                    assert_eq!(commit, 0, "nothing has begun after a repeat: the commit sends nothing");
                } else {
                    assert_eq!(first, sqlx_guard, "a first call: the statements of a sqlx::Transaction");
                    assert_eq!(replay, 3, "a repeat: BEGIN, the refused claim, the read");
                    assert_eq!(commit, 1, "a repeat: COMMIT");
                }
            }

            #[tokio::test]
            async fn hostile_scopes_keys_and_answers_are_stored_byte_for_byte() {
                let pool = pool!();
                for (i, s) in HOSTILE.iter().enumerate() {
                    let scope = format!("tests.tx.hostile {s}");
                    let key = format!("{s} {}", unique("k"));
                    let answer = format!("{s} \0 nul {i}");
                    let mut tx = idem::begin(&pool).await.unwrap();
                    assert_eq!(call(&mut tx, &scope, &key, &answer).await.unwrap(), (true, answer.clone()), "{s:?}");
                    tx.commit().await.unwrap();
                    let record = idem::sql::find_record(&pool, &scope, &Key::new(&key).unwrap()).await.unwrap();
                    let record = record.unwrap_or_else(|| panic!("no record for {s:?}"));
                    assert_eq!(record.response.as_deref(), Some(serde_json::to_string(&answer).unwrap().as_str()));
                    let mut tx = idem::begin(&pool).await.unwrap();
                    assert_eq!(call(&mut tx, &scope, &key, "other").await.unwrap(), (false, answer), "{s:?}");
                    tx.commit().await.unwrap();
                }
                // Every table is still there.
                assert_eq!(coupons(&pool, "none").await, 0);
                idem::sql::find_record(&pool, "x", &Key::new("y").unwrap()).await.unwrap();
            }

            #[tokio::test]
            async fn answers_on_both_sides_of_the_inline_limit_replay_exactly() {
                let pool = pool!();
                // 256 KiB of JSON rides with COMMIT; a byte more is bound.
                for len in [256 * 1024 - 2, 256 * 1024 - 1, 256 * 1024 + 7, 2 << 20] {
                    let answer: String = "\\'$".chars().cycle().take(len / 2).collect();
                    let key = unique("big");
                    let mut tx = idem::begin(&pool).await.unwrap();
                    let (ran, _) = call(&mut tx, "tests.tx.big", &key, &answer).await.unwrap();
                    assert!(ran);
                    tx.commit().await.unwrap();
                    let mut tx = idem::begin(&pool).await.unwrap();
                    let (ran, replayed) = call(&mut tx, "tests.tx.big", &key, "").await.unwrap();
                    assert!(!ran);
                    assert!(replayed == answer, "an answer of {} bytes of JSON replays exactly", len);
                }
            }

            #[tokio::test]
            async fn a_concurrent_repeat_waits_then_replays_or_runs_if_the_first_rolled_back() {
                let pool = pool!();
                for first_commits in [true, false] {
                    let key = unique("race");
                    let mut a = idem::begin(&pool).await.unwrap();
                    let ticket = match Guard::new("tests.tx.race").key(&key).dedup::<String, _>(&mut a).await {
                        Ok(Claim::Run(ticket)) => ticket,
                        other => panic!("the first call claims: {other:?}"),
                    };
                    let (pool2, key2) = (pool.clone(), key.clone());
                    let repeat = tokio::spawn(async move {
                        let mut b = idem::begin(&pool2).await.unwrap();
                        let out = call(&mut b, "tests.tx.race", &key2, "second").await;
                        b.commit().await.unwrap();
                        out
                    });
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    assert!(!repeat.is_finished(), "the repeat waits on the first call's record");
                    ticket.complete(&mut a, Ok::<_, idem::Error>("first".to_owned())).await.unwrap().unwrap();
                    if first_commits {
                        a.commit().await.unwrap();
                        assert_eq!(repeat.await.unwrap().unwrap(), (false, "first".to_owned()));
                    } else {
                        a.rollback().await.unwrap();
                        assert_eq!(repeat.await.unwrap().unwrap(), (true, "second".to_owned()));
                    }
                }
            }

            #[tokio::test]
            async fn a_failing_body_leaves_no_record_even_if_the_caller_commits() {
                let pool = pool!();
                let key = unique("fail");
                let mut tx = idem::begin(&pool).await.unwrap();
                assert!(matches!(fails(&mut tx, &key).await, Err(AppError::Rule(_))));
                tx.commit().await.unwrap();
                assert_eq!(coupons(&pool, &key).await, 1, "the caller committed the body's write");
                let found = idem::sql::find_record(&pool, "tests.tx.fails", &Key::new(&key).unwrap()).await.unwrap();
                assert!(found.is_none(), "but no record: a retry runs again");
            }

            #[tokio::test]
            async fn a_record_gone_before_commit_fails_the_commit_and_nothing_commits() {
                let pool = pool!();
                let key = unique("gone");
                let mut tx = idem::begin(&pool).await.unwrap();
                let called = deletes_its_record(&mut tx, &key).await;
                let err = if $texts {
                    called.unwrap();
                    tx.commit().await.unwrap_err()
                } else {
                    // Bound statements: the answer's own statement says so,
                    // and the Tx refuses to commit after it.
                    let refused = tx.commit().await;
                    assert!(matches!(refused, Err(idem::Error::TxUnusable { .. })), "{refused:?}");
                    match called.unwrap_err() {
                        AppError::Idem(e) => e,
                        other => panic!("{other:?}"),
                    }
                };
                assert!(err.to_string().contains("vanished"), "{err}");
                assert_eq!(coupons(&pool, &key).await, 0, "the text failed before its COMMIT");
            }

            /// A guard that finds the answers queued before it cannot be
            /// stored (here: the first call's record is gone) fails, and so
            /// does the commit: nothing of either call commits.
            #[tokio::test]
            async fn a_failed_flush_of_queued_answers_forbids_the_commit() {
                let pool = pool!();
                let key = unique("flush");
                let mut tx = idem::begin(&pool).await.unwrap();
                let first = deletes_its_record(&mut tx, &key).await;
                assert_eq!(first.is_ok(), $texts, "bound statements: the answer's own fails");
                let second = call(&mut tx, "tests.tx.flush", &unique("second"), "b").await;
                assert!(second.is_err(), "{second:?}");
                let err = tx.commit().await.unwrap_err();
                assert!(matches!(err, idem::Error::TxUnusable { .. }), "{err}");
                assert_eq!(coupons(&pool, &key).await, 0);
            }

            #[tokio::test]
            async fn an_expired_record_is_taken_over_in_the_claims_text() {
                let pool = pool!();
                let key = unique("expired");
                let guard = || Guard::new("tests.tx.expired").key(&key).retention(Duration::from_millis(5));
                let mut tx = idem::begin(&pool).await.unwrap();
                let Claim::Run(t) = guard().dedup::<u32, _>(&mut tx).await.unwrap() else { panic!("claims") };
                t.complete(&mut tx, Ok::<_, idem::Error>(1)).await.unwrap().unwrap();
                tx.commit().await.unwrap();
                tokio::time::sleep(Duration::from_millis(50)).await;
                let mut tx = idem::begin(&pool).await.unwrap();
                let Claim::Run(t) = guard().dedup::<u32, _>(&mut tx).await.unwrap() else {
                    panic!("an expired record does not replay")
                };
                t.complete(&mut tx, Ok::<_, idem::Error>(2)).await.unwrap().unwrap();
                tx.commit().await.unwrap();
                let record =
                    idem::sql::find_record(&pool, "tests.tx.expired", &Key::new(&key).unwrap()).await.unwrap().unwrap();
                assert_eq!(record.response.as_deref(), Some("2"));
            }

            #[tokio::test]
            async fn a_claim_cancelled_while_it_waits_closes_its_connection() {
                let pool = pool!();
                let key = unique("cancel");
                let mut a = idem::begin(&pool).await.unwrap();
                let Claim::Run(ticket) = Guard::new("tests.tx.cancel").key(&key).dedup::<u32, _>(&mut a).await.unwrap()
                else {
                    panic!("claims")
                };
                let one: sqlx::Pool<Db> = sqlx::pool::PoolOptions::new()
                    .max_connections(1)
                    .connect_with(pool.connect_options().as_ref().clone())
                    .await
                    .unwrap();
                let session_before: i64 = sqlx::query_scalar($session_id).fetch_one(&one).await.unwrap();
                let mut b = idem::begin(&one).await.unwrap();
                let waited = tokio::time::timeout(
                    Duration::from_millis(200),
                    Guard::new("tests.tx.cancel").key(&key).dedup::<u32, _>(&mut b),
                )
                .await;
                assert!(waited.is_err(), "the repeat waits on the first call's lock");
                drop(b);
                ticket.complete(&mut a, Ok::<_, idem::Error>(5)).await.unwrap().unwrap();
                a.rollback().await.unwrap();
                let session_after: i64 = sqlx::query_scalar($session_id).fetch_one(&one).await.unwrap();
                assert_ne!(session_before, session_after, "the connection left in an unknown state was closed");
                let mut c = idem::begin(&one).await.unwrap();
                let Claim::Run(t) = Guard::new("tests.tx.cancel").key(&key).dedup::<u32, _>(&mut c).await.unwrap()
                else {
                    panic!("the first call rolled back: the key is free")
                };
                t.complete(&mut c, Ok::<_, idem::Error>(6)).await.unwrap().unwrap();
                c.commit().await.unwrap();
            }

            #[tokio::test]
            async fn two_guards_of_one_key_in_one_transaction_replay_the_first() {
                let pool = pool!();
                let key = unique("twice");
                let mut tx = idem::begin(&pool).await.unwrap();
                assert_eq!(call(&mut tx, "tests.tx.twice", &key, "one").await.unwrap(), (true, "one".to_owned()));
                assert_eq!(call(&mut tx, "tests.tx.twice", &key, "two").await.unwrap(), (false, "one".to_owned()));
                tx.commit().await.unwrap();
            }

            /// A repeat under `claim = "after"` rolls back its body, guards
            /// inside it included: what they queued for COMMIT goes too.
            #[tokio::test]
            async fn a_claim_after_repeat_drops_what_inner_guards_queued() {
                let pool = pool!();
                let order = unique("outer");
                for attempt in 0..2 {
                    let inner_key = unique("inner");
                    let mut tx = idem::begin(&pool).await.unwrap();
                    let answer = outer_after(&mut tx, &order, &inner_key).await.unwrap();
                    tx.commit().await.unwrap();
                    assert_eq!(answer, "outer+inner", "attempt {attempt}");
                    let inner_ran = coupons(&pool, &inner_key).await;
                    assert_eq!(inner_ran, if attempt == 0 { 1 } else { 0 }, "a repeat's body is rolled back");
                }
            }

            #[tokio::test]
            async fn begin_with_refuses_statements_that_do_more_than_begin() {
                let pool = pool!();
                for bad in
                    ["SET TRANSACTION ISOLATION LEVEL SERIALIZABLE", "BEGIN -- why", "BEGIN; DELETE FROM x", "COMMIT"]
                {
                    let refused = idem::sql::begin_with(&pool, sqlx::AssertSqlSafe(bad)).await;
                    assert!(matches!(refused, Err(idem::Error::InvalidBegin { .. })), "{bad}: {refused:?}");
                }
                let mut tx = idem::sql::begin_with(&pool, "start transaction read write;").await.unwrap();
                let (ran, _) = call(&mut tx, "tests.tx.begin_with", &unique("bw"), "x").await.unwrap();
                assert!(ran);
                tx.commit().await.unwrap();
            }

            #[tokio::test]
            async fn savepoints_inside_a_body_work() {
                let pool = pool!();
                let key = unique("sp");
                let mut tx = idem::begin(&pool).await.unwrap();
                assert_eq!(with_savepoint(&mut tx, &key).await.unwrap(), 7);
                tx.commit().await.unwrap();
                assert_eq!(coupons(&pool, &key).await, 1, "the rolled-back savepoint's write is gone");
                let mut tx = idem::begin(&pool).await.unwrap();
                assert_eq!(with_savepoint(&mut tx, &key).await.unwrap(), 7);
                tx.commit().await.unwrap();
                assert_eq!(coupons(&pool, &key).await, 1, "a repeat replays");
            }

            #[tokio::test]
            async fn open_gives_the_connection_outside_bodies() {
                let pool = pool!();
                let key = unique("open");
                let runs = AtomicUsize::new(0);
                let mut tx = idem::begin(&pool).await.unwrap();
                sqlx::query($insert).bind(&key).execute(tx.open().await.unwrap()).await.unwrap();
                // Begun already: the guard takes the path of an open transaction.
                assert_eq!(grant(&mut tx, &key, &runs).await.unwrap(), 42);
                sqlx::query($insert).bind(&key).execute(&mut *tx).await.unwrap();
                tx.commit().await.unwrap();
                assert_eq!(coupons(&pool, &key).await, 3);
                let mut tx = idem::begin(&pool).await.unwrap();
                assert_eq!(grant(&mut tx, &key, &runs).await.unwrap(), 42);
                tx.commit().await.unwrap();
                assert_eq!(runs.load(SeqCst), 1);
            }

            #[tokio::test]
            #[should_panic(expected = "outside a guarded body")]
            async fn deref_outside_a_body_panics_even_on_a_first_call() {
                let pool = pool!();
                let runs = AtomicUsize::new(0);
                let mut tx = idem::begin(&pool).await.unwrap();
                grant(&mut tx, &unique("deref"), &runs).await.unwrap();
                // A first call: the transaction has begun, but a repeat would
                // not have begun it; the rule is the same for both.
                let _ = sqlx::query("SELECT 1").execute(&mut *tx).await;
            }

            #[tokio::test]
            async fn a_dropped_tx_rolls_back_and_its_connection_is_reused() {
                let pool = pool!();
                let key = unique("drop");
                let runs = AtomicUsize::new(0);
                {
                    let mut tx = idem::begin(&pool).await.unwrap();
                    grant(&mut tx, &key, &runs).await.unwrap();
                }
                assert_eq!(coupons(&pool, &key).await, 0);
                let mut tx = idem::begin(&pool).await.unwrap();
                assert_eq!(grant(&mut tx, &key, &runs).await.unwrap(), 42);
                tx.commit().await.unwrap();
                assert_eq!(runs.load(SeqCst), 2, "the dropped call left nothing; the next one ran");
                assert_eq!(coupons(&pool, &key).await, 1);
            }

            // `claim = "commit"`: the record with its answer goes out in the
            // text of COMMIT; the guarded call is the whole transaction.

            #[idempotent(key = "trade_no", scope = "tests.tx.commit", claim = "commit")]
            async fn grant_at_commit(
                tx: &mut idem::Tx<Db>,
                trade_no: &str,
                runs: &AtomicUsize,
            ) -> Result<u64, AppError> {
                let run = runs.fetch_add(1, SeqCst) as u64;
                sqlx::query($insert).bind(trade_no).execute(&mut **tx).await?;
                Ok(run)
            }

            #[idempotent(key = "order_no", scope = "tests.tx.commit.outer")]
            async fn outer_before(tx: &mut idem::Tx<Db>, order_no: &str, inner_key: &str) -> Result<String, AppError> {
                let inner = inner_at_commit(tx, inner_key).await?;
                sqlx::query($insert).bind(order_no).execute(&mut **tx).await?;
                Ok(format!("outer+{inner}"))
            }

            #[idempotent(key = "key", scope = "tests.tx.commit.inner", claim = "commit")]
            async fn inner_at_commit(tx: &mut idem::Tx<Db>, key: &str) -> Result<String, AppError> {
                sqlx::query($insert).bind(key).execute(&mut **tx).await?;
                Ok("inner".to_owned())
            }

            /// Inside another guard's body the call is not the whole
            /// transaction: it does not commit it (it is `claim = "after"`),
            /// and the outer body goes on in the transaction.
            #[tokio::test]
            async fn claim_commit_inside_another_guards_body_leaves_the_transaction_open() {
                let pool = pool!();
                let (order, inner_key) = (unique("outer"), unique("inner"));
                for attempt in 0..2 {
                    let mut tx = idem::begin(&pool).await.unwrap();
                    assert_eq!(outer_before(&mut tx, &order, &inner_key).await.unwrap(), "outer+inner");
                    // Texts: not begun after a replay (the refused claim rode on
                    // BEGIN); bound statements begin before the claim.
                    assert_eq!(tx.is_begun(), attempt == 0 || !$texts, "open after a first call");
                    tx.commit().await.unwrap();
                    assert_eq!((coupons(&pool, &order).await, coupons(&pool, &inner_key).await), (1, 1));
                }
            }

            /// One `claim = "commit"` call through the Guard API, its body
            /// a coupon of `key`: (the body ran, the answer returned).
            async fn call_at_commit(
                tx: &mut idem::Tx<Db>,
                scope: &str,
                key: &str,
                answer: &str,
            ) -> Result<(bool, String), AppError> {
                match Guard::new(scope.to_owned()).key(key).claim_at_commit().dedup::<String, _>(tx).await? {
                    Claim::Replay(first) => Ok((false, first)),
                    Claim::Run(ticket) => {
                        sqlx::query($insert).bind(key).execute(&mut **tx).await?;
                        Ok((true, ticket.complete(tx, Ok::<_, AppError>(answer.to_owned())).await??))
                    }
                }
            }

            /// A `claim = "commit"` call whose answer JSON cannot carry.
            async fn not_kept(tx: &mut idem::Tx<Db>, key: &str) -> Result<Result<f64, AppError>, AppError> {
                let guard = Guard::new("tests.tx.commit.nan").key(key).claim_at_commit();
                let Claim::Run(t) = guard.dedup::<f64, _>(tx).await? else { panic!("claims after the body") };
                sqlx::query($insert).bind(key).execute(&mut **tx).await?;
                Ok(t.complete(tx, Ok::<_, AppError>(f64::NAN)).await?)
            }

            /// What a client does with an error: retry the retryable ones
            /// (InProgress, deadlocks), up to 50 times.
            async fn with_retries<T, F: Future<Output = Result<T, AppError>>>(
                mut call: impl FnMut() -> F,
            ) -> (Result<T, AppError>, u32) {
                let mut retries = 0;
                loop {
                    match call().await {
                        Err(AppError::Idem(e)) if e.is_retryable() && retries < 50 => {}
                        Err(AppError::Db(sqlx::Error::Database(d)))
                            if matches!(d.code().as_deref(), Some("40001" | "40P01")) && retries < 50 => {}
                        done => return (done, retries),
                    }
                    retries += 1;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }

            /// `n` concurrent clients of `grant_at_commit(key)`, each
            /// retrying what is retryable: their answers and retries.
            fn clients(
                pool: &sqlx::Pool<Db>,
                key: &str,
                runs: &Arc<AtomicUsize>,
                n: usize,
            ) -> Vec<tokio::task::JoinHandle<(Result<u64, AppError>, u32)>> {
                let call = |(pool, key, runs): (sqlx::Pool<Db>, String, Arc<AtomicUsize>)| async move {
                    let (pool, key, runs) = (&pool, key.as_str(), &*runs);
                    with_retries(|| async move {
                        let mut tx = idem::begin(pool).await?;
                        let answer = grant_at_commit(&mut tx, key, runs).await?;
                        tx.commit().await?;
                        Ok(answer)
                    })
                    .await
                };
                (0..n).map(|_| tokio::spawn(call((pool.clone(), key.to_owned(), runs.clone())))).collect()
            }

            async fn answers(calls: Vec<tokio::task::JoinHandle<(Result<u64, AppError>, u32)>>) -> Vec<u64> {
                let mut answers = Vec::new();
                for call in calls {
                    let (answer, retried) = call.await.unwrap();
                    answers.push(answer.unwrap());
                    if retried > 0 {
                        println!("a client retried {retried} times");
                    }
                }
                answers
            }

            /// A holder of `key` in `tests.tx.commit` (claimed, not
            /// committed), and a pool of one connection of its own for the
            /// call that meets it.
            async fn held_key(
                pool: &sqlx::Pool<Db>,
                key: &str,
            ) -> (sqlx::Transaction<'static, Db>, idem::Ticket<Db>, sqlx::Pool<Db>) {
                let mut holder = pool.begin().await.unwrap();
                let guard = Guard::new("tests.tx.commit").key(key);
                let Claim::Run(held) = guard.dedup::<String, _>(&mut holder).await.unwrap() else {
                    panic!("the holder claims")
                };
                let one = sqlx::pool::PoolOptions::new()
                    .max_connections(1)
                    .connect_with(pool.connect_options().as_ref().clone())
                    .await
                    .unwrap();
                (holder, held, one)
            }

            async fn record_answer(pool: &sqlx::Pool<Db>, scope: &str, key: &str) -> Option<Option<String>> {
                let found = idem::sql::find_record(pool, scope, &Key::new(key).unwrap()).await.unwrap();
                found.map(|r| r.response)
            }

            #[tokio::test]
            async fn claim_commit_writes_once_in_the_commit_text_and_takes_the_round_trips_of_a_plain_transaction() {
                let _migrated = pool!();
                let (port, trips) = counting_proxy($port).await;
                let pool = sqlx::pool::PoolOptions::<Db>::new()
                    .max_connections(1)
                    .test_before_acquire(false)
                    .connect(&format!($url, port))
                    .await
                    .unwrap();
                let runs = AtomicUsize::new(0);
                // Warm up, a first call and a repeat: every statement is
                // prepared on the one connection.
                let warm = unique("warm");
                for _ in 0..2 {
                    let mut tx = idem::begin(&pool).await.unwrap();
                    grant_at_commit(&mut tx, &warm, &runs).await.unwrap();
                    tx.commit().await.unwrap();
                }
                let measure = |label: &'static str, before: u64| {
                    let n = trips.load(SeqCst) - before;
                    println!("{label}: {n} round trips");
                    n
                };
                let key = unique("once");
                let conn = pool.acquire().await.unwrap();
                let before = trips.load(SeqCst);
                let mut tx = idem::Tx::new(conn).unwrap();
                let first = grant_at_commit(&mut tx, &key, &runs).await.unwrap();
                let first_trips = measure("first call (BEGIN, body, INSERT+COMMIT)", before);
                assert!(!tx.is_begun(), "the guard ended the transaction");
                let before = trips.load(SeqCst);
                tx.commit().await.unwrap();
                let commit_trips = measure("Tx::commit after it", before);
                assert_eq!(record_answer(&pool, "tests.tx.commit", &key).await, Some(Some(first.to_string())));
                assert_eq!(coupons(&pool, &key).await, 1);

                let conn = pool.acquire().await.unwrap();
                let before = trips.load(SeqCst);
                let mut tx = idem::Tx::new(conn).unwrap();
                assert_eq!(grant_at_commit(&mut tx, &key, &runs).await.unwrap(), first, "the first answer");
                let repeat_trips = measure("repeat (BEGIN, body, refused INSERT, ROLLBACK+BEGIN+read)", before);
                tx.commit().await.unwrap();
                assert_eq!(coupons(&pool, &key).await, 1, "the repeat's body was rolled back");
                assert_eq!(runs.load(SeqCst), 4, "the warm-up's two, the first call and the repeat's body ran");
                assert_eq!(commit_trips, 0, "the guard committed: Tx::commit sends nothing");
                if $texts {
                    assert_eq!(first_trips, 3, "BEGIN, the body, the record with COMMIT: a plain transaction's");
                    assert_eq!(repeat_trips, 4, "BEGIN, the body, the refused text, ROLLBACK+BEGIN+read");
                } else {
                    // `claim = "after"`'s statements.
                    assert_eq!(first_trips, 4, "BEGIN, the body, the record, COMMIT");
                    assert_eq!(
                        repeat_trips, 6,
                        "BEGIN, the body, the refused record, its locking read, ROLLBACK, the read"
                    );
                }
            }

            #[tokio::test]
            async fn claim_commit_100_concurrent_duplicates_commit_one_body_and_all_get_its_answer() {
                let pool = pool!();
                let key = unique("herd");
                let runs = Arc::new(AtomicUsize::new(0));
                let calls = clients(&pool, &key, &runs, 100);
                let answers = answers(calls).await;
                println!("bodies run: {}", runs.load(SeqCst));
                let first = answers[0];
                assert!(answers.iter().all(|a| *a == first), "every call gets the first answer: {answers:?}");
                assert_eq!(coupons(&pool, &key).await, 1, "one body's effect committed");
                assert_eq!(record_answer(&pool, "tests.tx.commit", &key).await, Some(Some(first.to_string())));
            }

            /// The holder of a key rolls back while claims wait on it: on
            /// MariaDB, InnoDB picks deadlock victims among the waiters. A
            /// victim replays if another's record is committed, else gets a
            /// retryable error; one body commits.
            #[tokio::test]
            async fn claim_commit_waiters_on_a_holder_that_rolls_back_commit_one_body() {
                let pool = pool!();
                let key = unique("victims");
                let mut holder = pool.begin().await.unwrap();
                let Claim::Run(_held) =
                    Guard::new("tests.tx.commit").key(&key).dedup::<u64, _>(&mut holder).await.unwrap()
                else {
                    panic!("the holder claims")
                };
                let runs = Arc::new(AtomicUsize::new(0));
                let calls = clients(&pool, &key, &runs, 10);
                tokio::time::sleep(Duration::from_millis(500)).await;
                assert!(calls.iter().all(|c| !c.is_finished()), "the waiters wait on the holder");
                holder.rollback().await.unwrap();
                let answers = answers(calls).await;
                assert!(answers.iter().all(|a| *a == answers[0]), "{answers:?}");
                assert_eq!(coupons(&pool, &key).await, 1);
            }

            #[tokio::test]
            async fn claim_commit_hostile_scopes_keys_and_answers_are_stored_byte_for_byte() {
                let pool = pool!();
                for (i, s) in HOSTILE.iter().enumerate() {
                    let scope = format!("tests.tx.commit.hostile {s}");
                    let key = format!("{s} {}", unique("k"));
                    let answer = format!("{s} \0 nul {i}");
                    let mut tx = idem::begin(&pool).await.unwrap();
                    let first = call_at_commit(&mut tx, &scope, &key, &answer).await.unwrap();
                    assert_eq!(first, (true, answer.clone()), "{s:?}");
                    tx.commit().await.unwrap();
                    let stored = serde_json::to_string(&answer).unwrap();
                    assert_eq!(record_answer(&pool, &scope, &key).await, Some(Some(stored)), "{s:?}");
                    let mut tx = idem::begin(&pool).await.unwrap();
                    assert_eq!(call_at_commit(&mut tx, &scope, &key, "other").await.unwrap().1, answer, "{s:?}");
                    tx.commit().await.unwrap();
                    assert_eq!(coupons(&pool, &key).await, 1, "{s:?}");
                }
                assert_eq!(coupons(&pool, "none").await, 0);
                idem::sql::find_record(&pool, "x", &Key::new("y").unwrap()).await.unwrap();
            }

            #[tokio::test]
            async fn claim_commit_answers_over_the_inline_limit_are_bound_and_replay_exactly() {
                let pool = pool!();
                for len in [256 * 1024 - 2, 256 * 1024 + 7] {
                    let answer: String = "\\'$".chars().cycle().take(len / 2).collect();
                    let key = unique("commit-big");
                    for attempt in 0..2 {
                        let mut tx = idem::begin(&pool).await.unwrap();
                        let sent = if attempt == 0 { answer.as_str() } else { "" };
                        let (_, got) = call_at_commit(&mut tx, "tests.tx.commit.big", &key, sent).await.unwrap();
                        tx.commit().await.unwrap();
                        assert!(got == answer, "{len} bytes of JSON, attempt {attempt}");
                    }
                    assert_eq!(coupons(&pool, &key).await, 1);
                }
            }

            /// A value JSON cannot carry exactly: the first call gets it,
            /// the record commits "completed, answer not kept", and a repeat
            /// is told so, its body rolled back.
            #[tokio::test]
            async fn claim_commit_an_answer_not_kept_commits_and_the_body_never_counts_twice() {
                let pool = pool!();
                let key = unique("commit-nan");
                let mut tx = idem::begin(&pool).await.unwrap();
                assert!(not_kept(&mut tx, &key).await.unwrap().unwrap().is_nan(), "the first call gets its answer");
                tx.commit().await.unwrap();
                assert_eq!(record_answer(&pool, "tests.tx.commit.nan", &key).await, Some(None));
                let mut tx = idem::begin(&pool).await.unwrap();
                let err = not_kept(&mut tx, &key).await.unwrap_err();
                assert!(matches!(err, AppError::Idem(idem::Error::AnswerNotKept { .. })), "{err}");
                tx.commit().await.unwrap();
                assert_eq!(coupons(&pool, &key).await, 1);
            }

            /// A record past its retention, not yet purged: the text fails on
            /// it, the body's writes go with the rollback, the record is
            /// removed and the call is retryable; the retry runs and writes.
            #[tokio::test]
            async fn claim_commit_an_expired_record_in_the_way_is_removed_and_the_retry_runs() {
                let pool = pool!();
                let key = unique("commit-expired");
                let call = |answer: u32| {
                    let (pool, key) = (pool.clone(), key.clone());
                    async move {
                        let mut tx = idem::begin(&pool).await?;
                        let guard = Guard::new("tests.tx.commit.expired")
                            .key(&key)
                            .retention(Duration::from_millis(5))
                            .claim_at_commit();
                        let Claim::Run(t) = guard.dedup::<u32, _>(&mut tx).await? else { panic!("claims after") };
                        sqlx::query($insert).bind(&key).execute(&mut *tx).await?;
                        let answer = t.complete(&mut tx, Ok::<_, AppError>(answer)).await??;
                        tx.commit().await?;
                        Ok::<_, AppError>(answer)
                    }
                };
                assert_eq!(call(1).await.unwrap(), 1);
                tokio::time::sleep(Duration::from_millis(50)).await;
                if !$texts {
                    // Bound statements (`claim = "after"`): taken over in place.
                    assert_eq!(call(2).await.unwrap(), 2, "the expired record taken over");
                    assert_eq!(record_answer(&pool, "tests.tx.commit.expired", &key).await, Some(Some("2".to_owned())));
                    assert_eq!(coupons(&pool, &key).await, 2);
                    return;
                }
                let err = call(2).await.unwrap_err();
                assert!(
                    matches!(err, AppError::Idem(idem::Error::InProgress { retry_after: Some(d), .. }) if d.is_zero()),
                    "{err}"
                );
                assert_eq!(coupons(&pool, &key).await, 1, "the refused call's body was rolled back");
                assert_eq!(call(3).await.unwrap(), 3, "the retry runs");
                let answer = record_answer(&pool, "tests.tx.commit.expired", &key).await;
                assert_eq!(answer, Some(Some("3".to_owned())));
                assert_eq!(coupons(&pool, &key).await, 2);
            }

            /// idem does not commit a `sqlx::Transaction`: there the mode is
            /// `claim = "after"`, and the caller commits.
            #[tokio::test]
            async fn claim_commit_on_a_sqlx_transaction_is_claim_after() {
                let pool = pool!();
                let key = unique("commit-sqlx");
                for answer in ["first", "second"] {
                    let mut tx = pool.begin().await.unwrap();
                    let guard = Guard::new("tests.tx.commit.sqlx").key(&key).claim_at_commit();
                    let Claim::Run(t) = guard.dedup::<String, _>(&mut tx).await.unwrap() else { panic!("claims after") };
                    sqlx::query($insert).bind(&key).execute(&mut *tx).await.unwrap();
                    let got = t.complete(&mut tx, Ok::<_, idem::Error>(answer.to_owned())).await.unwrap().unwrap();
                    assert_eq!(got, "first");
                    assert_eq!(record_answer(&pool, "tests.tx.commit.sqlx", &key).await.is_some(), answer != "first");
                    tx.commit().await.unwrap();
                }
                assert_eq!(coupons(&pool, &key).await, 1);
            }

            /// Only a unique-key error is a repeat: a record refused otherwise
            /// (its insert's lock wait timed out on a holder's record; MySQL
            /// keeps the transaction open after that), by `claim = "commit"`'s
            /// text or `claim = "after"`'s statement, is an error, nothing of
            /// the call is kept, and `Tx::commit` fails: the body's write
            /// never commits without its record for a retry to run it again.
            #[tokio::test]
            async fn a_record_refused_otherwise_than_on_the_key_keeps_nothing_and_says_so() {
                let pool = pool!();
                for at_commit in [true, false] {
                    let key = unique("refused-timeout");
                    // A connection of its own: the lock wait is set for its session.
                    let (mut holder, held, one) = held_key(&pool, &key).await;
                    let mut tx = idem::begin(&one).await.unwrap();
                    let guard = Guard::new("tests.tx.commit").key(&key);
                    let guard = if at_commit { guard.claim_at_commit() } else { guard.claim_after() };
                    let Claim::Run(t) = guard.dedup::<String, _>(&mut tx).await.unwrap() else {
                        panic!("claims after the body")
                    };
                    sqlx::query($short_lock_wait).execute(&mut *tx).await.unwrap();
                    sqlx::query($insert).bind(&key).execute(&mut *tx).await.unwrap();
                    let err = t.complete(&mut tx, Ok::<_, idem::Error>("mine".to_owned())).await.unwrap_err();
                    assert!(matches!(err, idem::Error::Database(_)), "an error, not a repeat: {err}");
                    let refused = tx.commit().await;
                    assert!(matches!(refused, Err(idem::Error::TxUnusable { .. })), "{refused:?}");
                    held.complete(&mut holder, Ok::<_, idem::Error>("holder".to_owned())).await.unwrap().unwrap();
                    holder.commit().await.unwrap();
                    one.close().await;
                    assert_eq!(coupons(&pool, &key).await, 0, "the body's write was not kept (at_commit: {at_commit})");
                    let answer = record_answer(&pool, "tests.tx.commit", &key).await;
                    assert_eq!(answer, Some(Some("\"holder\"".to_owned())));
                }
            }

            /// The future is dropped while its commit text waits (on a
            /// holder's uncommitted record): the `Tx` refuses to commit, its
            /// connection is reused, and what the server then did commits
            /// the body and the record together or neither.
            #[tokio::test]
            async fn claim_commit_cancelled_mid_commit_commits_all_or_nothing() {
                let pool = pool!();
                for holder_commits in [false, true] {
                    let key = unique("commit-cancel");
                    let (mut holder, held, one) = held_key(&pool, &key).await;
                    let mut tx = idem::begin(&one).await.unwrap();
                    let waited = tokio::time::timeout(
                        Duration::from_millis(300),
                        call_at_commit(&mut tx, "tests.tx.commit", &key, "cancelled"),
                    )
                    .await;
                    assert!(waited.is_err(), "the commit text waits on the holder's record");
                    let refused = tx.commit().await;
                    assert!(matches!(refused, Err(idem::Error::TxUnusable { .. })), "{refused:?}");
                    if holder_commits {
                        held.complete(&mut holder, Ok::<_, idem::Error>("holder".to_owned())).await.unwrap().unwrap();
                        holder.commit().await.unwrap();
                    } else {
                        held.complete(&mut holder, Ok::<_, idem::Error>("holder".to_owned())).await.unwrap().unwrap();
                        holder.rollback().await.unwrap();
                    }
                    // The one connection is usable again, and the outcome whole.
                    let mut tx = idem::begin(&one).await.unwrap();
                    let (_, answer) = call_at_commit(&mut tx, "tests.tx.commit", &key, "retry").await.unwrap();
                    tx.commit().await.unwrap();
                    // Texts: the COMMIT was sent with the record, and the
                    // server ran it once the holder's lock went. Bound
                    // statements: the COMMIT was never sent (rolled back).
                    let expect = match (holder_commits, $texts) {
                        (true, _) => "holder",
                        (false, true) => "cancelled",
                        (false, false) => "retry",
                    };
                    assert_eq!(answer, expect, "holder commits: {holder_commits}");
                    let coupons_expected = if holder_commits { 0 } else { 1 };
                    assert_eq!(coupons(&pool, &key).await, coupons_expected, "the cancelled call's body with its record");
                }
            }
        }
    };
}

tx_suite! {
    mod postgres;
    db = sqlx::Postgres;
    pool = common::postgres;
    upstream = 5432;
    url = "postgres://postgres@127.0.0.1:{}/test";
    insert_coupon = "INSERT INTO idem_test_coupons (trade_no) VALUES ($1)";
    count_coupons = "SELECT COUNT(*) FROM idem_test_coupons WHERE trade_no = $1";
    delete_record = "DELETE FROM idem_records WHERE scope = 'tests.tx.vanishes' AND idem_key = $1";
    session_id = "SELECT pg_backend_pid()::int8";
    short_lock_wait = "SET LOCAL lock_timeout = '300ms'";
    texts = true;
}

tx_suite! {
    mod mysql;
    db = sqlx::MySql;
    pool = common::mysql;
    upstream = 3306;
    url = "mysql://root@127.0.0.1:{}/test";
    insert_coupon = "INSERT INTO idem_test_coupons (trade_no) VALUES (?)";
    count_coupons = "SELECT COUNT(*) FROM idem_test_coupons WHERE trade_no = ?";
    delete_record = "DELETE FROM idem_records WHERE scope = 'tests.tx.vanishes' AND idem_key = ?";
    session_id = "SELECT CAST(CONNECTION_ID() AS SIGNED)";
    short_lock_wait = "SET SESSION innodb_lock_wait_timeout = 1";
    // MySQL/MariaDB: an idem::Tx sends the statements of a sqlx::Transaction.
    texts = false;
}

mod postgres_only {
    use super::*;

    /// The pool, with a table whose unique constraint is checked at COMMIT.
    async fn with_deferred_table() -> Option<sqlx::PgPool> {
        let pool = common::postgres().await?;
        sqlx::raw_sql(
            "CREATE TABLE IF NOT EXISTS idem_test_deferred (v TEXT, \
             CONSTRAINT idem_test_deferred_v UNIQUE (v) DEFERRABLE INITIALLY DEFERRED)",
        )
        .execute(&pool)
        .await
        .unwrap();
        Some(pool)
    }

    /// A deferred constraint fails at COMMIT: nothing of the call commits,
    /// and a retry runs again.
    #[tokio::test]
    async fn a_failed_commit_commits_nothing() {
        let Some(pool) = with_deferred_table().await else { return };
        let key = unique("deferred");
        let mut tx = idem::begin(&pool).await.unwrap();
        let Claim::Run(t) = Guard::new("tests.tx.deferred").key(&key).dedup::<u32, _>(&mut tx).await.unwrap() else {
            panic!("claims")
        };
        for _ in 0..2 {
            sqlx::query("INSERT INTO idem_test_deferred (v) VALUES ($1)").bind(&key).execute(&mut *tx).await.unwrap();
        }
        t.complete(&mut tx, Ok::<_, idem::Error>(1)).await.unwrap().unwrap();
        let err = tx.commit().await.unwrap_err();
        assert!(err.to_string().contains("idem_test_deferred_v"), "{err}");
        let found = idem::sql::find_record(&pool, "tests.tx.deferred", &Key::new(&key).unwrap()).await.unwrap();
        assert!(found.is_none(), "the failed COMMIT committed no record");
    }

    /// `claim = "commit"`: a deferred constraint fails the COMMIT of the
    /// record's text with a unique-key error of another table, which is no
    /// duplicate: the call fails, nothing is committed, `Tx::commit` says
    /// so too, and a retry runs again.
    #[tokio::test]
    async fn claim_commit_a_failed_commit_keeps_nothing_and_says_so() {
        let Some(pool) = with_deferred_table().await else { return };
        let key = unique("commit-deferred");
        for twice in [true, false] {
            let mut tx = idem::begin(&pool).await.unwrap();
            let guard = Guard::new("tests.tx.commit.deferred").key(&key).claim_at_commit();
            let Claim::Run(t) = guard.dedup::<u32, _>(&mut tx).await.unwrap() else { panic!("claims after") };
            for _ in 0..if twice { 2 } else { 1 } {
                sqlx::query("INSERT INTO idem_test_deferred (v) VALUES ($1)")
                    .bind(&key)
                    .execute(&mut *tx)
                    .await
                    .unwrap();
            }
            let done = t.complete(&mut tx, Ok::<_, idem::Error>(1)).await;
            let committed = tx.commit().await;
            let found = idem::sql::find_record(&pool, "tests.tx.commit.deferred", &Key::new(&key).unwrap()).await;
            if twice {
                let err = done.unwrap_err();
                assert!(err.to_string().contains("idem_test_deferred_v"), "{err}");
                assert!(matches!(committed, Err(idem::Error::TxUnusable { .. })), "{committed:?}");
                assert!(found.unwrap().is_none(), "the failed COMMIT committed no record");
            } else {
                assert_eq!(done.unwrap().unwrap(), 1, "the retry runs");
                committed.unwrap();
                assert_eq!(found.unwrap().unwrap().response.as_deref(), Some("1"));
            }
        }
    }

    /// `claim = "commit"`'s text names no prepared statement: a body that
    /// deallocates the session's statements cannot break it.
    #[tokio::test]
    async fn claim_commit_survives_a_body_that_deallocates_every_statement() {
        let Some(_) = common::postgres().await else { return };
        // A pool of its own: sqlx's cached statements go too.
        let pool =
            sqlx::postgres::PgPoolOptions::new().max_connections(1).connect(common::DEFAULT_PG_URL).await.unwrap();
        let key = unique("commit-deallocate");
        for expect_ran in [true, false] {
            let mut tx = idem::begin(&pool).await.unwrap();
            let guard = Guard::new("tests.tx.commit.deallocate").key(&key).claim_at_commit();
            let Claim::Run(t) = guard.dedup::<String, _>(&mut tx).await.unwrap() else { panic!("claims after") };
            sqlx::raw_sql("DEALLOCATE ALL").execute(&mut *tx).await.unwrap();
            let answer = if expect_ran { "first" } else { "second" };
            let got = t.complete(&mut tx, Ok::<_, idem::Error>(answer.to_owned())).await.unwrap().unwrap();
            assert_eq!(got, "first");
            tx.commit().await.unwrap();
        }
        pool.close().await;
    }

    /// Under REPEATABLE READ a repeat that waited on the first call replays
    /// it (the claim's unique-key error, then a fresh read), where the guard
    /// on a `sqlx::Transaction` reports a serialization failure to retry.
    #[tokio::test]
    async fn a_repeat_under_repeatable_read_replays() {
        let Some(pool) = common::postgres().await else { return };
        let key = unique("rr");
        let mut a = idem::sql::begin_with(&pool, "BEGIN ISOLATION LEVEL REPEATABLE READ").await.unwrap();
        let Claim::Run(ticket) = Guard::new("tests.tx.rr").key(&key).dedup::<u32, _>(&mut a).await.unwrap() else {
            panic!("claims")
        };
        let (pool2, key2) = (pool.clone(), key.clone());
        let repeat = tokio::spawn(async move {
            let mut b = idem::sql::begin_with(&pool2, "BEGIN ISOLATION LEVEL REPEATABLE READ").await.unwrap();
            let out = Guard::new("tests.tx.rr").key(&key2).dedup::<u32, _>(&mut b).await;
            b.commit().await.unwrap();
            out.map(|c| matches!(c, Claim::Replay(9)))
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        ticket.complete(&mut a, Ok::<_, idem::Error>(9)).await.unwrap().unwrap();
        a.commit().await.unwrap();
        assert!(repeat.await.unwrap().unwrap(), "the repeat replays the first answer");
    }

    /// idem prepares its statements once per session (its texts name
    /// them, so they are not planned on every call); a session that lost
    /// them prepares them again, and where that fails the texts carry the
    /// statements in full.
    #[tokio::test]
    async fn sessions_prepare_the_statements_and_survive_losing_them() {
        let Some(_) = common::postgres().await else { return };
        let pool =
            sqlx::postgres::PgPoolOptions::new().max_connections(1).connect(common::DEFAULT_PG_URL).await.unwrap();
        let ours = |pool: sqlx::PgPool| async move {
            sqlx::query_scalar::<_, String>(
                "SELECT name::text FROM pg_prepared_statements WHERE name LIKE 'idem\\_%' ORDER BY name",
            )
            .fetch_all(&pool)
            .await
            .unwrap()
        };
        let run = |pool: sqlx::PgPool, key: String| async move {
            for expect_ran in [true, false] {
                let mut tx = idem::begin(&pool).await.unwrap();
                let claim = Guard::new("tests.tx.prepared").key(&key).dedup::<String, _>(&mut tx).await.unwrap();
                match claim {
                    Claim::Run(t) => {
                        assert!(expect_ran);
                        t.complete(&mut tx, Ok::<_, idem::Error>(key.clone())).await.unwrap().unwrap();
                    }
                    Claim::Replay(first) => {
                        assert!(!expect_ran);
                        assert_eq!(first, key);
                    }
                }
                tx.commit().await.unwrap();
            }
        };
        let deallocate = |pool: sqlx::PgPool, names: Vec<String>| async move {
            for name in names {
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DEALLOCATE {name}"))).execute(&pool).await.unwrap();
            }
        };
        run(pool.clone(), unique("prep")).await;
        let names = ours(pool.clone()).await;
        // The claim and the read; the answer, sent after the body, is
        // written out (the body may have deallocated them).
        assert_eq!(names.len(), 2, "{names:?}");
        assert!(names[0].starts_with("idem_claim_") && names[1].starts_with("idem_read_"), "{names:?}");
        // All lost: prepared again, each when a text first names it.
        deallocate(pool.clone(), names.clone()).await;
        run(pool.clone(), unique("prep")).await;
        assert_eq!(ours(pool.clone()).await, names);
        // One lost: that one is prepared again, alone.
        for lost in &names {
            deallocate(pool.clone(), vec![lost.clone()]).await;
            run(pool.clone(), unique("prep")).await;
            assert_eq!(ours(pool.clone()).await, names, "after losing {lost}");
        }
    }

    /// A 40 MiB answer (bound, not sent as text) is stored exactly.
    #[tokio::test]
    async fn a_40_mib_answer_is_stored_exactly() {
        let Some(pool) = common::postgres().await else { return };
        let key = unique("40mib");
        let answer: String = "'\\$$ ".chars().cycle().take(40 << 20).collect();
        let mut tx = idem::begin(&pool).await.unwrap();
        let Claim::Run(t) = Guard::new("tests.tx.40mib").key(&key).dedup::<String, _>(&mut tx).await.unwrap() else {
            panic!("claims")
        };
        t.complete(&mut tx, Ok::<_, idem::Error>(answer.clone())).await.unwrap().unwrap();
        tx.commit().await.unwrap();
        let mut tx = idem::begin(&pool).await.unwrap();
        let Claim::Replay(replayed) = Guard::new("tests.tx.40mib").key(&key).dedup::<String, _>(&mut tx).await.unwrap()
        else {
            panic!("replays")
        };
        assert!(replayed == answer);
        sqlx::query("DELETE FROM idem_records WHERE scope = 'tests.tx.40mib'").execute(&pool).await.unwrap();
    }
}

mod mysql_only {
    use super::*;

    /// An answer over what MySQL's column and packet hold never reaches the
    /// server: the first call gets it back, its record is committed
    /// "completed, answer not kept", and a repeat does not run.
    #[tokio::test]
    async fn a_40_mib_answer_is_returned_and_its_record_says_not_kept() {
        let Some(pool) = common::mysql().await else { return };
        let key = unique("40mib");
        let answer: String = "x".repeat(40 << 20);
        let mut tx = idem::begin(&pool).await.unwrap();
        let Claim::Run(t) = Guard::new("tests.tx.40mib").key(&key).dedup::<String, _>(&mut tx).await.unwrap() else {
            panic!("claims")
        };
        let returned = t.complete(&mut tx, Ok::<_, idem::Error>(answer)).await.unwrap().unwrap();
        assert_eq!(returned.len(), 40 << 20, "the first call gets its answer");
        tx.commit().await.unwrap();
        let found = idem::sql::find_record(&pool, "tests.tx.40mib", &Key::new(&key).unwrap()).await.unwrap().unwrap();
        assert_eq!((found.status, found.response), (idem::admin::RecordStatus::Done, None));
        let mut tx = idem::begin(&pool).await.unwrap();
        let err = Guard::new("tests.tx.40mib").key(&key).dedup::<String, _>(&mut tx).await.map(|_| ()).unwrap_err();
        assert!(matches!(err, idem::Error::AnswerNotKept { .. }), "{err}");
    }
}

mod sqlite {
    use super::*;

    #[idempotent(key = "trade_no", scope = "tests.tx.sqlite")]
    async fn grant(tx: &mut idem::SqliteTx, trade_no: &str, runs: &AtomicUsize) -> Result<u64, AppError> {
        runs.fetch_add(1, SeqCst);
        sqlx::query("INSERT INTO idem_test_coupons (trade_no) VALUES (?)").bind(trade_no).execute(&mut **tx).await?;
        Ok(42)
    }

    #[idempotent(key = "trade_no", scope = "tests.tx.sqlite.commit", claim = "commit")]
    async fn grant_at_commit(tx: &mut idem::SqliteTx, trade_no: &str, runs: &AtomicUsize) -> Result<u64, AppError> {
        runs.fetch_add(1, SeqCst);
        sqlx::query("INSERT INTO idem_test_coupons (trade_no) VALUES (?)").bind(trade_no).execute(&mut **tx).await?;
        Ok(42)
    }

    /// `claim = "commit"` on SQLite: the record bound, then COMMIT; a
    /// repeat's body is rolled back and the first answer replayed.
    #[tokio::test]
    async fn claim_commit_first_calls_commit_once_and_repeats_replay() {
        let Some(pool) = common::sqlite().await else { return };
        let (key, runs) = (unique("sqlite-commit"), AtomicUsize::new(0));
        for _ in 0..3 {
            let mut tx = idem::begin(&pool).await.unwrap();
            assert_eq!(grant_at_commit(&mut tx, &key, &runs).await.unwrap(), 42);
            assert!(!tx.is_begun());
            tx.commit().await.unwrap();
        }
        let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idem_test_coupons WHERE trade_no = ?")
            .bind(&key)
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!((runs.load(SeqCst), count), (3, 1), "three bodies ran, one committed");
    }

    /// SQLite sends the guard's statements one by one (no network to
    /// save), with the same semantics.
    #[tokio::test]
    async fn first_calls_run_once_and_repeats_replay() {
        let Some(pool) = common::sqlite().await else { return };
        let (key, runs) = (unique("sqlite"), AtomicUsize::new(0));
        for _ in 0..3 {
            let mut tx = idem::begin(&pool).await.unwrap();
            assert_eq!(grant(&mut tx, &key, &runs).await.unwrap(), 42);
            tx.commit().await.unwrap();
        }
        assert_eq!(runs.load(SeqCst), 1);
    }
}
