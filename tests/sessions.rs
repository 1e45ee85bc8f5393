//! Replays are byte-exact on any session (issue 25, section 2): a
//! MySQL/MariaDB connection in a charset other than utf8mb4, a PostgreSQL
//! session that lost idem's prepared statements (a pooler's reset) or holds
//! a statement of the application's under one of their names, and a
//! MariaDB session whose user variables idem's texts must leave alone.

use idem_test_support as common;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

use common::{AppError, unique};
use idem::admin::{RecordId, StuckQuery};
use idem::lease::LeaseStore;
use idem::{Claim, Guard, Key, idempotent};

/// Answers (and keys, and scopes) latin1 cannot hold, or holds differently
/// from utf8mb4: emoji, CJK, right-to-left text, accents, a flag, a mark.
const UNICODE: &[&str] =
    &["😀 emoji", "你好，世界", "שלום עולם", "café é ß", "🇫🇷 Ω ≠ ñ \u{200f}end", "it's \"quoted\" ¿\\?"];

/// One guarded call through the Guard API on any transaction: (ran, answer).
async fn call<C: idem::sql::TxContext + ?Sized>(
    tx: &mut C,
    scope: &str,
    key: &str,
    answer: &str,
) -> Result<(bool, String), idem::Error> {
    call_with(Guard::new(scope.to_owned()), tx, key, answer).await
}

/// [`call`] with a guard set up by the caller (`claim_after`).
async fn call_with<C: idem::sql::TxContext + ?Sized>(
    guard: Guard<'_>,
    tx: &mut C,
    key: &str,
    answer: &str,
) -> Result<(bool, String), idem::Error> {
    match guard.key(key).dedup::<String, _>(tx).await? {
        Claim::Replay(first) => Ok((false, first)),
        Claim::Run(ticket) => Ok((true, ticket.complete(tx, Ok::<_, idem::Error>(answer.to_owned())).await??)),
    }
}

mod mysql {
    use super::*;
    use sqlx::MySqlPool;

    /// The test database (migrated), and a pool on it whose sessions speak
    /// latin1 (`SET NAMES latin1`), as an application's pool may.
    async fn pools() -> Option<(MySqlPool, MySqlPool)> {
        let utf8 = common::mysql().await?;
        let opts = utf8.connect_options().as_ref().clone().charset("latin1");
        let latin1 = sqlx::mysql::MySqlPoolOptions::new().max_connections(4).connect_with(opts).await.unwrap();
        let names: String = sqlx::query_scalar("SELECT @@character_set_results").fetch_one(&latin1).await.unwrap();
        assert_eq!(names, "latin1", "the pool's sessions are latin1");
        Some((utf8, latin1))
    }

    /// What a record holds, read through `pool`: (scope, key, response),
    /// the key as the guard stores it (`Key::as_str`).
    async fn stored(pool: &MySqlPool, scope: &str, key: &str) -> (String, String, Option<String>) {
        let record = idem::sql::find_record(pool, scope, &Key::new(key).unwrap()).await.unwrap().expect("a record");
        let inspected = idem::admin::inspect(pool, &RecordId::new(scope, &Key::new(key).unwrap()))
            .await
            .unwrap()
            .expect("a record");
        assert_eq!(
            (&inspected.scope, &inspected.key, &inspected.response),
            (&record.scope, &record.key, &record.response),
            "the admin read and find_record agree"
        );
        (record.scope, record.key, record.response)
    }

    fn stored_key(key: &str) -> String {
        Key::new(key).unwrap().as_str().to_owned()
    }

    /// Each answer, written by a latin1 session, replays exactly on a
    /// latin1 session and a utf8mb4 one, and is stored as it was written
    /// (so a utf8mb4 session, or another service, reads it too); and the
    /// other way round. `tx` begins a transaction of one kind on a pool.
    async fn unicode_round_trips<F, T>(scope: &str, tx: F)
    where
        F: AsyncFn(&MySqlPool) -> T,
        T: idem::sql::TxContext<Db = sqlx::MySql> + Committable,
    {
        let Some((utf8, latin1)) = pools().await else { return };
        for (writer, reader) in [(&latin1, &utf8), (&utf8, &latin1), (&latin1, &latin1)] {
            for answer in UNICODE {
                let scope = format!("{scope} {answer}");
                let key = format!("{answer} {}", unique("k"));
                let mut first = tx(writer).await;
                assert_eq!(call(&mut first, &scope, &key, answer).await.unwrap(), (true, answer.to_string()));
                first.commit_it().await;
                let json = serde_json::to_string(answer).unwrap();
                for pool in [&utf8, &latin1] {
                    assert_eq!(stored(pool, &scope, &key).await, (scope.clone(), stored_key(&key), Some(json.clone())));
                }
                let mut repeat = tx(reader).await;
                let replayed = call(&mut repeat, &scope, &key, "not this").await.unwrap();
                repeat.commit_it().await;
                assert_eq!(replayed, (false, answer.to_string()), "replays {answer:?} byte for byte");
            }
        }
    }

    /// Commit either kind of transaction.
    trait Committable {
        async fn commit_it(self);
    }
    impl Committable for sqlx::Transaction<'static, sqlx::MySql> {
        async fn commit_it(self) {
            self.commit().await.unwrap()
        }
    }
    impl Committable for idem::MySqlTx {
        async fn commit_it(self) {
            self.commit().await.unwrap()
        }
    }

    #[tokio::test]
    async fn a_latin1_session_replays_any_unicode_answer_exactly_on_a_sqlx_transaction() {
        unicode_round_trips("tests.sessions.sqlx", async |pool: &MySqlPool| pool.begin().await.unwrap()).await;
    }

    /// `claim = "after"`: the record is written with its answer in one
    /// statement after the body (`insert_done`).
    #[tokio::test]
    async fn a_latin1_session_replays_any_unicode_answer_exactly_with_the_claim_after_the_body() {
        let Some((utf8, latin1)) = pools().await else { return };
        for (writer, reader) in [(&latin1, &utf8), (&utf8, &latin1)] {
            for answer in UNICODE {
                let (scope, key) = (format!("tests.sessions.after {answer}"), format!("{answer} {}", unique("k")));
                let after = || Guard::new(scope.clone()).claim_after();
                let mut tx = writer.begin().await.unwrap();
                assert_eq!(call_with(after(), &mut tx, &key, answer).await.unwrap(), (true, answer.to_string()));
                tx.commit().await.unwrap();
                let json = serde_json::to_string(answer).unwrap();
                assert_eq!(stored(&utf8, &scope, &key).await, (scope.clone(), stored_key(&key), Some(json)));
                let mut tx = reader.begin().await.unwrap();
                // The body runs before the claim; the call returns the first answer.
                let (_, replayed) = call_with(after(), &mut tx, &key, "not this").await.unwrap();
                tx.commit().await.unwrap();
                assert_eq!(replayed, *answer, "replays {answer:?} byte for byte");
            }
        }
    }

    #[tokio::test]
    async fn a_latin1_session_replays_any_unicode_answer_exactly_on_an_idem_tx() {
        unicode_round_trips("tests.sessions.tx", async |pool: &MySqlPool| idem::begin(pool).await.unwrap()).await;
    }

    #[idempotent(
        key = "id",
        strategy = "lease",
        scope = "tests.sessions.lease",
        store = "store",
        fingerprint = "answer"
    )]
    async fn leased(store: &dyn LeaseStore, id: &str, answer: &str, runs: &AtomicUsize) -> Result<String, AppError> {
        runs.fetch_add(1, SeqCst);
        Ok(answer.to_owned())
    }

    /// The lease store on a latin1 pool: the answer is stored as written
    /// and replays exactly, and the fingerprint of the repeat matches.
    #[tokio::test]
    async fn a_lease_store_on_a_latin1_pool_replays_any_unicode_answer_exactly() {
        let Some((utf8, latin1)) = pools().await else { return };
        let on_latin1 = idem::store::SqlStore::new(latin1.clone());
        let on_utf8 = idem::store::SqlStore::new(utf8.clone());
        for (writer, reader) in [(&on_latin1, &on_utf8), (&on_utf8, &on_latin1)] {
            for answer in UNICODE {
                let (id, runs) = (format!("{answer} {}", unique("lease")), AtomicUsize::new(0));
                assert_eq!(leased(writer, &id, answer, &runs).await.unwrap(), *answer);
                assert_eq!(leased(reader, &id, answer, &runs).await.unwrap(), *answer, "replays {answer:?}");
                assert_eq!(runs.load(SeqCst), 1, "the repeat replayed");
                let json = serde_json::to_string(answer).unwrap();
                let scope = "tests.sessions.lease";
                for pool in [&utf8, &latin1] {
                    assert_eq!(stored(pool, scope, &id).await, (scope.to_owned(), stored_key(&id), Some(json.clone())));
                }
            }
        }
    }

    /// The admin tools on a latin1 pool list and release a stuck record
    /// whose scope and key latin1 cannot hold.
    #[tokio::test]
    async fn the_admin_tools_on_a_latin1_pool_find_and_release_unicode_keys() {
        let Some((_, latin1)) = pools().await else { return };
        let scope = format!("tests.sessions.stuck 😀 {}", unique("s"));
        let key = "你好 שלום 🇫🇷";
        let mut tx = latin1.begin().await.unwrap();
        let Claim::Run(ticket) = Guard::new(scope.clone()).key(key).dedup::<u32, _>(&mut tx).await.unwrap() else {
            panic!("claims")
        };
        // Committed without its answer: an unfinished record.
        drop(ticket);
        tx.commit().await.unwrap();
        let query = StuckQuery { scope: Some(scope.clone()), ..StuckQuery::default() };
        let stuck = idem::admin::stuck(&latin1, &query).await.unwrap();
        assert_eq!(stuck.len(), 1, "{stuck:?}");
        assert_eq!((stuck[0].scope.as_str(), stuck[0].key.as_str()), (scope.as_str(), key));
        let id = RecordId::new(&scope, &Key::new(key).unwrap());
        let released = idem::admin::release(&latin1, &id, stuck[0].fence).await.unwrap();
        assert!(matches!(released, idem::admin::Release::Released(_)), "{released:?}");
        assert!(idem::admin::inspect(&latin1, &id).await.unwrap().is_none());
    }

    /// A user variable of the application's session, `@idem_completed`
    /// included (the name idem's answer text once set), and every other,
    /// is as the application left it after guarded calls of every kind.
    #[tokio::test]
    async fn guarded_calls_leave_the_session_s_user_variables_alone() {
        let Some(_) = common::mysql().await else { return };
        let url = std::env::var("IDEM_MYSQL_URL").unwrap_or_else(|_| common::DEFAULT_MYSQL_URL.to_owned());
        let pool = sqlx::mysql::MySqlPoolOptions::new().max_connections(1).connect(&url).await.unwrap();
        sqlx::raw_sql("SET @idem_completed = 'mine', @idem = 'also mine'").execute(&pool).await.unwrap();
        let variables = async |pool: &MySqlPool| -> Vec<(String, Option<String>)> {
            // MariaDB lists them all; MySQL has no such table: the two known.
            let all = sqlx::query_as(
                "SELECT CAST(VARIABLE_NAME AS CHAR), CAST(VARIABLE_VALUE AS CHAR) \
                 FROM information_schema.USER_VARIABLES ORDER BY 1",
            )
            .fetch_all(pool)
            .await;
            match all {
                Ok(all) => all,
                Err(_) => sqlx::query_as(
                    "SELECT 'idem', CAST(@idem AS CHAR) UNION ALL SELECT 'idem_completed', CAST(@idem_completed AS CHAR)",
                )
                .fetch_all(pool)
                .await
                .unwrap(),
            }
        };
        let before = variables(&pool).await;
        assert!(before.contains(&("idem_completed".to_owned(), Some("mine".to_owned()))), "{before:?}");
        for _ in 0..2 {
            let key = unique("vars");
            for _ in 0..2 {
                let mut tx = idem::begin(&pool).await.unwrap();
                call(&mut tx, "tests.sessions.vars", &key, "answer").await.unwrap();
                tx.commit().await.unwrap();
                let mut tx = pool.begin().await.unwrap();
                call(&mut tx, "tests.sessions.vars.sqlx", &key, "answer").await.unwrap();
                tx.commit().await.unwrap();
            }
            assert_eq!(variables(&pool).await, before, "idem set no variable of the session's");
        }
    }
}

mod postgres {
    use super::*;
    use sqlx::PgPool;

    /// A pool of one connection, so that every transaction lands on the
    /// session the test resets (as a transaction-mode pooler's reset would).
    async fn one_session() -> Option<PgPool> {
        common::postgres().await?;
        let url = std::env::var("IDEM_PG_URL").unwrap_or_else(|_| common::DEFAULT_PG_URL.to_owned());
        Some(sqlx::postgres::PgPoolOptions::new().max_connections(1).connect(&url).await.unwrap())
    }

    /// Statements on the session in the simple protocol: after
    /// `DEALLOCATE ALL` sqlx's own cached statements are gone too (its
    /// problem, not idem's), so the tests send none of them.
    async fn on(conn: &mut sqlx::PgConnection, text: &str) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(text.to_owned())).execute(conn).await.unwrap();
    }

    async fn idem_statements(pool: &PgPool) -> Vec<(String, String)> {
        let mut conn = pool.acquire().await.unwrap();
        let rows = sqlx::raw_sql(
            "SELECT name::text, statement FROM pg_prepared_statements WHERE name LIKE 'idem\\_%' ORDER BY name",
        )
        .fetch_all(&mut *conn)
        .await
        .unwrap();
        use sqlx::Row as _;
        rows.iter().map(|r| (r.get(0), r.get(1))).collect()
    }

    /// A first call whose body deallocates every prepared statement of the
    /// session, idem's included, between the claim and the commit: the
    /// commit goes through, with the answer, and the repeat replays it.
    #[tokio::test]
    async fn a_body_that_deallocates_idem_s_statements_still_commits_its_answer() {
        let Some(pool) = one_session().await else { return };
        for body in ["DEALLOCATE ALL", "DEALLOCATE ALL; DISCARD PLANS"] {
            let key = unique("dealloc");
            let mut tx = idem::begin(&pool).await.unwrap();
            let Claim::Run(ticket) =
                Guard::new("tests.sessions.dealloc").key(&key).dedup::<String, _>(&mut tx).await.unwrap()
            else {
                panic!("claims")
            };
            on(&mut tx, body).await;
            on(&mut tx, &format!("INSERT INTO idem_test_orders (trade_no) VALUES ('{key}')")).await;
            ticket.complete(&mut tx, Ok::<_, idem::Error>(format!("first {key}"))).await.unwrap().unwrap();
            tx.commit().await.expect("the commit does not depend on statements the body may have deallocated");
            let mut tx = idem::begin(&pool).await.unwrap();
            assert_eq!(
                call(&mut tx, "tests.sessions.dealloc", &key, "again").await.unwrap(),
                (false, format!("first {key}"))
            );
            tx.commit().await.unwrap();
        }
    }

    /// A session reset between transactions (`DISCARD ALL`,
    /// `DEALLOCATE ALL`: what a transaction-mode pooler does when it hands
    /// the server session on), and between a first call and its repeat:
    /// every call runs or replays as it should.
    #[tokio::test]
    async fn a_session_reset_between_transactions_costs_no_call() {
        let Some(pool) = one_session().await else { return };
        for reset in ["DISCARD ALL", "DEALLOCATE ALL"] {
            let key = unique("reset");
            for (ran, answer) in [(true, "first"), (false, "first"), (false, "first")] {
                on(&mut pool.acquire().await.unwrap(), reset).await;
                let mut tx = idem::begin(&pool).await.unwrap();
                let got = call(&mut tx, "tests.sessions.reset", &key, if ran { answer } else { "not this" }).await;
                assert_eq!(got.unwrap(), (ran, answer.to_owned()), "after {reset}");
                tx.commit().await.unwrap();
            }
        }
    }

    /// A session without idem's statements, in transactions begun with an
    /// isolation level: the claim is prepared inside the transaction (a
    /// statement before the `BEGIN` would keep its isolation level from
    /// being set), and stays prepared when a repeat's claim is refused and
    /// rolled back.
    #[tokio::test]
    async fn a_transaction_with_an_isolation_level_prepares_the_claim_in_a_session_without_it() {
        let Some(pool) = one_session().await else { return };
        let key = unique("isolation");
        for (ran, answer) in [(true, "first"), (false, "first")] {
            on(&mut pool.acquire().await.unwrap(), "DEALLOCATE ALL").await;
            let mut tx = idem::sql::begin_with(&pool, "BEGIN ISOLATION LEVEL REPEATABLE READ").await.unwrap();
            let got = call(&mut tx, "tests.sessions.isolation", &key, if ran { answer } else { "not this" }).await;
            assert_eq!(got.unwrap(), (ran, answer.to_owned()));
            tx.commit().await.unwrap();
            // Planned once since the DEALLOCATE: the claim named it, rather
            // than being written out after a failed prepare.
            let mut conn = pool.acquire().await.unwrap();
            let plans = sqlx::raw_sql(
                "SELECT (generic_plans + custom_plans)::int8 FROM pg_prepared_statements WHERE name LIKE 'idem\\_claim\\_%'",
            )
            .fetch_all(&mut *conn)
            .await
            .unwrap();
            use sqlx::Row as _;
            let plans: Vec<i64> = plans.iter().map(|r| r.get(0)).collect();
            assert_eq!(plans, [1], "the claim is prepared and named (ran: {ran})");
        }
    }

    /// The application prepared statements of its own under the names
    /// idem gives its claim and its read: guarded calls on that session
    /// still run and replay (with idem's statements written out), and
    /// idem leaves the application's statements as they are.
    #[tokio::test]
    async fn a_statement_of_the_application_s_under_an_idem_name_breaks_no_call() {
        let Some(pool) = one_session().await else { return };
        let mut tx = idem::begin(&pool).await.unwrap();
        call(&mut tx, "tests.sessions.collide", &unique("warm"), "warm").await.unwrap();
        tx.commit().await.unwrap();
        let ours = idem_statements(&pool).await;
        assert!(ours.iter().any(|(n, _)| n.starts_with("idem_claim_")), "{ours:?}");
        for taken in &ours {
            let mut conn = pool.acquire().await.unwrap();
            on(&mut conn, "DEALLOCATE ALL").await;
            // The application's own, under idem's name, taking other parameters.
            on(&mut conn, &format!("PREPARE {} (int8) AS SELECT $1 + 1", taken.0)).await;
            drop(conn);
            let key = unique("collide");
            for (ran, answer) in [(true, "first"), (false, "first"), (true, "second")] {
                let key = if answer == "second" { format!("{key}-2") } else { key.clone() };
                let mut tx = idem::begin(&pool).await.unwrap();
                let got = call(&mut tx, "tests.sessions.collide", &key, answer).await;
                assert_eq!(got.unwrap(), (ran, answer.to_owned()), "with {} taken", taken.0);
                tx.commit().await.unwrap();
            }
            let after = idem_statements(&pool).await;
            let theirs = after.iter().find(|(n, _)| *n == taken.0).expect("the application's statement is kept");
            assert!(theirs.1.contains("SELECT $1 + 1"), "{theirs:?}");
        }
    }

    /// The application prepared a statement of its own under idem's claim
    /// name, taking the claim's own parameter types: the claim runs it
    /// without an error and writes no record. The call fails once, where
    /// its answer goes out (at the commit, or before the next guard's
    /// claim), naming the statement, with nothing committed (a repeat's
    /// second answer does not overwrite the first); idem deallocated the
    /// statement, so the session's next calls run and replay.
    #[tokio::test]
    async fn a_statement_of_the_application_s_with_the_claim_s_parameter_types_fails_one_call() {
        let Some(pool) = one_session().await else { return };
        let scope = "tests.sessions.same_types";
        let repeated = unique("same-types");
        let mut tx = idem::begin(&pool).await.unwrap();
        assert_eq!(call(&mut tx, scope, &repeated, "first").await.unwrap(), (true, "first".to_owned()));
        tx.commit().await.unwrap();
        let ours = idem_statements(&pool).await;
        let claim = ours.into_iter().map(|(n, _)| n).find(|n| n.starts_with("idem_claim_")).expect("prepared");
        // A repeat (its record is there), then a first call (none is).
        for (key, next) in [(repeated, (false, "first")), (unique("same-types"), (true, "fourth"))] {
            let mut conn = pool.acquire().await.unwrap();
            on(&mut conn, "DEALLOCATE ALL").await;
            on(&mut conn, &format!("PREPARE {claim} (text, text, text, int8) AS SELECT $1, $2, $3, $4")).await;
            drop(conn);
            let mut tx = idem::begin(&pool).await.unwrap();
            // The claim wrote nothing, so even the repeat's body ran.
            assert_eq!(call(&mut tx, scope, &key, "second").await.unwrap(), (true, "second".to_owned()));
            let err = tx.commit().await.unwrap_err();
            assert!(matches!(&err, idem::Error::StatementTaken { name } if *name == claim), "{err:?}");
            assert!(err.is_retryable());
            assert!(idem_statements(&pool).await.iter().all(|(n, _)| *n != claim), "the application's is gone");
            for (ran, answer) in [next, (false, next.1)] {
                let mut tx = idem::begin(&pool).await.unwrap();
                let got = call(&mut tx, scope, &key, "fourth").await.unwrap();
                assert_eq!(got, (ran, answer.to_owned()), "{key}");
                tx.commit().await.unwrap();
            }
        }
        // Two guarded calls in one transaction: the first one's answer goes
        // out before the second one's claim, and fails there.
        let mut conn = pool.acquire().await.unwrap();
        on(&mut conn, "DEALLOCATE ALL").await;
        on(&mut conn, &format!("PREPARE {claim} (text, text, text, int8) AS SELECT $1, $2, $3, $4")).await;
        drop(conn);
        let (a, b) = (unique("same-types-a"), unique("same-types-b"));
        let mut tx = idem::begin(&pool).await.unwrap();
        assert_eq!(call(&mut tx, scope, &a, "a").await.unwrap(), (true, "a".to_owned()));
        let err = call(&mut tx, scope, &b, "b").await.unwrap_err();
        assert!(matches!(&err, idem::Error::StatementTaken { name } if *name == claim), "{err:?}");
        assert!(tx.commit().await.is_err(), "nothing of it commits");
        let mut tx = idem::begin(&pool).await.unwrap();
        assert_eq!(call(&mut tx, scope, &a, "a again").await.unwrap(), (true, "a again".to_owned()));
        assert_eq!(call(&mut tx, scope, &b, "b").await.unwrap(), (true, "b".to_owned()));
        tx.commit().await.unwrap();
    }
}
