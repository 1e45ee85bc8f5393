//! The `idem` binary end to end, against real servers: records are made
//! through the runtime's public API (a lease whose worker "crashed": claimed
//! and never completed; a completed call; an unfinished dedup record), then
//! the binary inspects, lists, releases and purges them, and the guard is
//! run again to see the effect.
//!
//! Every test works in scopes (and on Redis under a key prefix) of its own,
//! so parallel tests and other runs sharing the servers never see each
//! other's records; nothing outside them is deleted. PostgreSQL, MySQL and
//! Redis come from `IDEM_PG_URL`, `IDEM_MYSQL_URL`, `IDEM_REDIS_URL`; a
//! server that cannot be reached skips its tests (fails them with
//! `IDEM_REQUIRE_SERVICES=1`).

// tests/common names the runtime `idem` (the facade crate re-exports it).
extern crate idem_runtime as idem;

#[path = "../../tests/common/mod.rs"]
mod common;

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::unique;
use idem::admin::{self, RecordId, RecordState};
use idem::lease::LeaseStore;
use idem::{Claim, Guard, Key};
use serde_json::Value;

/// A lease short enough to pass within a test.
const SHORT_LEASE: Duration = Duration::from_millis(800);

/// Where the binary looks for its stores.
enum Store<'a> {
    Sql(&'a str),
    Redis { url: &'a str, prefix: &'a str },
}

/// Run `idem` with `args` on `store`, stdin not a terminal, and no store
/// from the environment (the test suite's own IDEM_REDIS_URL included).
fn idem(store: &Store<'_>, args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_idem"));
    cmd.env_remove("IDEM_DATABASE_URL").env_remove("IDEM_REDIS_URL").env_remove("IDEM_REDIS_PREFIX");
    match store {
        Store::Sql(url) => cmd.args(["--database-url", url]),
        Store::Redis { url, prefix } => cmd.args(["--redis-url", url, "--redis-prefix", prefix]),
    };
    cmd.args(args).stdin(Stdio::null()).output().expect("run the idem binary")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Run with `--json` and expect exit code `code`; the one JSON document.
fn idem_json(store: &Store<'_>, args: &[&str], code: i32) -> Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let out = idem(store, &all);
    assert_eq!(out.status.code(), Some(code), "idem {args:?}: stdout {} stderr {}", stdout(&out), stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("idem {args:?}: not JSON ({e}): {}", stdout(&out)))
}

/// The record a store's entry in a document holds (`null` when none).
fn record_in(doc: &Value) -> &Value {
    let stores = doc["stores"].as_array().expect("a `stores` array");
    assert_eq!(stores.len(), 1, "{doc}");
    &stores[0]["record"]
}

/// Claim `key` with a short lease and drop the ticket without running the
/// body: a worker that died mid-work. The record stays PROCESSING.
async fn crash(store: &dyn LeaseStore, scope: &str, key: &str) {
    match Guard::new(scope.to_owned()).key(key).lease::<u32>(store, SHORT_LEASE).await.unwrap() {
        Claim::Run(ticket) => drop(ticket),
        Claim::Replay(_) => panic!("a fresh key"),
    }
}

/// Run the guard of `key` with a body answering 7: whether the body ran.
async fn run(store: &dyn LeaseStore, scope: &str, key: &str) -> bool {
    match Guard::new(scope.to_owned()).key(key).lease::<u32>(store, Duration::from_secs(30)).await.unwrap() {
        Claim::Run(ticket) => {
            assert_eq!(ticket.run(async { Ok::<u32, idem::Error>(7) }).await.unwrap(), 7);
            true
        }
        Claim::Replay(answer) => {
            assert_eq!(answer, 7);
            false
        }
    }
}

/// `key` as records store it (escaped, hashed when long): what `stuck`
/// lists and `--stored` takes.
fn stored(key: &str) -> String {
    Key::new(key).unwrap().as_str().to_owned()
}

/// Scope and key text that SQL quoting, `LIKE`, Redis glob patterns,
/// record names and terminals could each get wrong.
fn hostile(prefix: &str) -> String {
    format!("{}'\"%_{{x}}*?[a]\\ é日本 ;--", unique(prefix))
}

/// What every store's lease records must go through: a crashed worker's
/// record and a completed one, with hostile scope and keys (a 500-byte
/// key among them, stored hashed).
async fn lease_lifecycle(store: &dyn LeaseStore, cli: &Store<'_>) {
    let scope = hostile("cli.lease");
    let crashed = hostile("crashed");
    let long = format!("{}{}", unique("long"), "k".repeat(500));
    let done = hostile("done");
    crash(store, &scope, &crashed).await;
    crash(store, &scope, &long).await;
    assert!(run(store, &scope, &done).await);

    // While the lease is live the record is running: not stuck, not released.
    let out = idem(cli, &["release", "--scope", &scope, "--key", &crashed, "--yes"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("lease is live"), "{}", stderr(&out));
    let live = idem_json(cli, &["inspect", "--scope", &scope, "--key", &crashed], 0);
    assert_eq!(record_in(&live)["state"], "running", "{live}");
    let none = idem_json(cli, &["stuck", "--scope", &scope], 0);
    assert_eq!(none["stores"][0]["records"].as_array().unwrap().len(), 0, "{none}");

    tokio::time::sleep(SHORT_LEASE + Duration::from_millis(300)).await;

    // inspect, by the business key as the guard was given it.
    let doc = idem_json(cli, &["inspect", "--scope", &scope, "--key", &crashed], 0);
    let record = record_in(&doc);
    assert_eq!((record["status"].as_str(), record["state"].as_str()), (Some("PROCESSING"), Some("lease_passed")));
    assert_eq!(record["stuck"], true);
    assert!(record["owner"].is_string() && record["fence"].as_i64().unwrap() > 0, "{doc}");
    assert!(record["lease_left_ms"].as_i64().unwrap() < 0, "{doc}");
    let text = idem(cli, &["inspect", "--scope", &scope, "--key", &crashed]);
    assert_eq!(text.status.code(), Some(0));
    let text = stdout(&text);
    assert!(text.contains("PROCESSING") && text.contains("STUCK") && text.contains("fence"), "{text}");
    let long_doc = idem_json(cli, &["inspect", "--scope", &scope, "--key", &long], 0);
    let stored_long = stored(&long);
    assert!(stored_long.starts_with("\\sha256:"));
    assert_eq!(record_in(&long_doc)["key"].as_str(), Some(stored_long.as_str()), "{long_doc}");

    let done_doc = idem_json(cli, &["inspect", "--scope", &scope, "--key", &done], 0);
    let done_record = record_in(&done_doc);
    assert_eq!((done_record["status"].as_str(), done_record["state"].as_str()), (Some("DONE"), Some("done")));
    assert_eq!(done_record["response_preview"], "7");

    // stuck lists the crashed records of this scope, not the completed one.
    let listed = idem_json(cli, &["stuck", "--scope", &scope], 0);
    let mut keys: Vec<&str> =
        listed["stores"][0]["records"].as_array().unwrap().iter().map(|r| r["key"].as_str().unwrap()).collect();
    keys.sort();
    let stored_crashed = stored(&crashed);
    let mut want = vec![stored_crashed.as_str(), stored_long.as_str()];
    want.sort();
    assert_eq!(keys, want, "{listed}");
    let limited = idem_json(cli, &["stuck", "--scope", &scope, "--limit", "1"], 0);
    assert_eq!(limited["stores"][0]["records"].as_array().unwrap().len(), 1);
    assert_eq!(limited["stores"][0]["more"], true);

    // Without --yes on a non-terminal: refused, nothing released.
    let out = idem(cli, &["release", "--scope", &scope, "--key", &crashed]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("--yes"), "{}", stderr(&out));
    let still = idem_json(cli, &["inspect", "--scope", &scope, "--key", &crashed], 0);
    assert_eq!(record_in(&still)["state"], "lease_passed");

    // A completed record is never released.
    let out = idem(cli, &["release", "--scope", &scope, "--key", &done, "--yes"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("DONE"), "{}", stderr(&out));
    assert!(!run(store, &scope, &done).await, "the completed call still replays");

    // Nor is a record that is not there.
    let out = idem(cli, &["release", "--scope", &scope, "--key", &unique("absent"), "--yes"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("no record"), "{}", stderr(&out));

    // --yes releases it; the next call runs the body again.
    let released = idem_json(cli, &["release", "--scope", &scope, "--key", &crashed, "--yes"], 0);
    assert_eq!(released["released"], 1, "{released}");
    assert_eq!(released["stores"][0]["outcome"], "released");
    let gone = idem_json(cli, &["inspect", "--scope", &scope, "--key", &crashed], 0);
    assert!(record_in(&gone).is_null(), "{gone}");
    assert!(run(store, &scope, &crashed).await, "a released key runs again");

    // The hashed one, named as `stuck` listed it.
    let out = idem(cli, &["release", "--stored", "--scope", &scope, "--key", &stored_long, "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("released"));
    assert!(run(store, &scope, &long).await);
    let none = idem_json(cli, &["stuck", "--scope", &scope], 0);
    assert_eq!(none["stores"][0]["records"].as_array().unwrap().len(), 0, "{none}");
}

/// A record a worker re-took after the operator looked is left alone: the
/// release compares the fence it saw.
async fn release_compares_the_fence<F, Fut>(store: &dyn LeaseStore, release: F)
where
    F: Fn(RecordId, i64) -> Fut,
    Fut: std::future::Future<Output = admin::Release>,
{
    let scope = unique("cli.fence");
    let key = unique("retaken");
    crash(store, &scope, &key).await;
    tokio::time::sleep(SHORT_LEASE + Duration::from_millis(300)).await;
    let id = RecordId::new(&scope, &Key::new(key.as_str()).unwrap());
    // What the operator saw: a stuck record with some fence; a worker
    // takes it over (fence + 1) and crashes again before the release.
    let seen = match release(id.clone(), -1).await {
        admin::Release::FenceChanged(r) => r,
        other => panic!("{other:?}"),
    };
    assert_eq!(seen.state, RecordState::LeasePassed);
    crash(store, &scope, &key).await;
    tokio::time::sleep(SHORT_LEASE + Duration::from_millis(300)).await;
    match release(id.clone(), seen.fence).await {
        admin::Release::FenceChanged(now) => {
            assert_eq!(now.fence, seen.fence + 1);
            assert_eq!(now.state, RecordState::LeasePassed);
        }
        other => panic!("{other:?}"),
    }
    match release(id, seen.fence + 1).await {
        admin::Release::Released(r) => assert_eq!(r.fence, seen.fence + 1),
        other => panic!("{other:?}"),
    }
    assert!(run(store, &scope, &key).await);
}

macro_rules! sql_tests {
    ($backend:ident, $db:ty, $connect:expr, $count_archived:expr) => {
        mod $backend {
            use super::*;

            type Pool = sqlx::Pool<$db>;

            /// The pool and the URL the binary is given, after `idem migrate`.
            async fn setup() -> Option<(Pool, String)> {
                let (pool, url): (Pool, String) = $connect.await?;
                let out = idem(&Store::Sql(&url), &["migrate"]);
                assert_eq!(out.status.code(), Some(0), "migrate: {}", stderr(&out));
                assert!(stdout(&out).contains("idem_records"));
                Some((pool, url))
            }

            #[tokio::test]
            async fn a_crashed_lease_is_inspected_listed_and_released_and_then_runs_again() {
                let Some((pool, url)) = setup().await else { return };
                let store = idem::lease::SqlStore::new(pool);
                lease_lifecycle(&store, &Store::Sql(&url)).await;
            }

            #[tokio::test]
            async fn a_release_leaves_a_record_taken_over_since() {
                let Some((pool, _url)) = setup().await else { return };
                let store = idem::lease::SqlStore::new(pool.clone());
                release_compares_the_fence(&store, |id, fence| {
                    let pool = pool.clone();
                    async move { admin::release(&pool, &id, fence).await.unwrap() }
                })
                .await;
            }

            /// A dedup record committed without its answer (the guarded call
            /// was cut off and the caller committed anyway) is stuck too:
            /// repeats fail until an operator releases it.
            #[tokio::test]
            async fn an_unfinished_dedup_record_is_listed_and_released() {
                let Some((pool, url)) = setup().await else { return };
                let cli = Store::Sql(&url);
                let scope = hostile("cli.unfinished");
                let key = hostile("cut-off");
                let mut tx = pool.begin().await.unwrap();
                match Guard::new(scope.clone()).key(&key).dedup::<u32, _>(&mut tx).await.unwrap() {
                    Claim::Run(ticket) => drop(ticket),
                    Claim::Replay(_) => panic!("a fresh key"),
                }
                tx.commit().await.unwrap();
                let mut tx = pool.begin().await.unwrap();
                let repeat = Guard::new(scope.clone()).key(&key).dedup::<u32, _>(&mut tx).await;
                assert!(matches!(repeat, Err(idem::Error::Unfinished { .. })), "{repeat:?}");
                // Now, not on the connection's next use: MySQL's read holds a
                // shared lock on the record until then.
                tx.rollback().await.unwrap();

                let listed = idem_json(&cli, &["stuck", "--scope", &scope], 0);
                let records = listed["stores"][0]["records"].as_array().unwrap();
                assert_eq!(records.len(), 1, "{listed}");
                assert_eq!(records[0]["key"].as_str(), Some(stored(&key).as_str()), "{listed}");
                assert_eq!(records[0]["state"], "unfinished");
                let text = stdout(&idem(&cli, &["stuck", "--scope", &scope]));
                assert!(text.contains("unfinished") && text.contains("1 stuck record"), "{text}");

                let out = idem(&cli, &["release", "--scope", &scope, "--key", &key, "--yes"]);
                assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
                let mut tx = pool.begin().await.unwrap();
                match Guard::new(scope.clone()).key(&key).dedup::<u32, _>(&mut tx).await.unwrap() {
                    Claim::Run(ticket) => {
                        assert_eq!(ticket.finish(&mut tx, Ok::<u32, idem::Error>(3)).await.unwrap(), 3)
                    }
                    Claim::Replay(_) => panic!("a released key runs again"),
                }
                tx.commit().await.unwrap();
            }

            #[tokio::test]
            async fn purge_by_scope_and_age_counts_first_and_spares_processing_and_other_scopes() {
                let Some((pool, url)) = setup().await else { return };
                let cli = Store::Sql(&url);
                let store = idem::lease::SqlStore::new(pool.clone());
                let scope = hostile("cli.purge");
                let other = hostile("cli.purge.other");
                let done: Vec<String> = (0..3).map(|_| hostile("old")).collect();
                for key in &done {
                    assert!(run(&store, &scope, key).await);
                }
                let crashed = unique("crashed");
                crash(&store, &scope, &crashed).await;
                let live = unique("live");
                match Guard::new(scope.clone()).key(&live).lease::<u32>(&store, Duration::from_secs(60)).await.unwrap()
                {
                    Claim::Run(ticket) => drop(ticket),
                    Claim::Replay(_) => panic!("a fresh key"),
                }
                let elsewhere = unique("elsewhere");
                assert!(run(&store, &other, &elsewhere).await);
                tokio::time::sleep(Duration::from_millis(50)).await;

                // Nothing of this scope is past its retention (7 days).
                let expired_only = idem_json(&cli, &["purge", "--scope", &scope, "--dry-run"], 0);
                assert_eq!(expired_only["stores"][0]["deleted"], 0, "{expired_only}");

                let age = ["purge", "--scope", &scope, "--older-than", "10ms", "--archive"];
                let mut dry = age.to_vec();
                dry.push("--dry-run");
                let preview = idem_json(&cli, &dry, 0);
                assert_eq!(preview["stores"][0]["dry_run"], true);
                assert_eq!(
                    (preview["stores"][0]["deleted"].as_u64(), preview["stores"][0]["archived"].as_u64()),
                    (Some(3), Some(3)),
                    "{preview}"
                );
                let text = stdout(&idem(&cli, &dry));
                assert!(text.contains("would delete 3 records"), "{text}");
                for key in &done {
                    let found =
                        admin::inspect(&pool, &RecordId::new(&scope, &Key::new(key.as_str()).unwrap())).await.unwrap();
                    assert!(found.is_some(), "a dry run deletes nothing");
                }

                let purged = idem_json(&cli, &age, 0);
                assert_eq!(purged["stores"][0]["deleted"], 3, "{purged}");
                for key in &done {
                    let found =
                        admin::inspect(&pool, &RecordId::new(&scope, &Key::new(key.as_str()).unwrap())).await.unwrap();
                    assert_eq!(found, None);
                    let archived: i64 = sqlx::query_scalar($count_archived)
                        .bind(&scope)
                        .bind(stored(key))
                        .fetch_one(&pool)
                        .await
                        .unwrap();
                    assert_eq!(archived, 1, "the completed record was archived");
                }
                // PROCESSING records stay, live or stuck; so do other scopes'.
                for key in [&crashed, &live] {
                    let found =
                        admin::inspect(&pool, &RecordId::new(&scope, &Key::new(key.as_str()).unwrap())).await.unwrap();
                    assert_eq!(found.map(|r| r.status), Some(idem::RecordStatus::Processing), "{key}");
                }
                assert!(!run(&store, &other, &elsewhere).await, "another scope's record survives");
                let again = idem_json(&cli, &age, 0);
                assert_eq!(again["stores"][0]["deleted"], 0, "{again}");
            }

            #[tokio::test]
            async fn errors_name_the_problem() {
                let Some((_pool, url)) = setup().await else { return };
                let out = idem(&Store::Sql(&url), &["inspect", "--scope", "s", "--key", " "]);
                assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
                assert!(stderr(&out).contains("whitespace"), "{}", stderr(&out));
                let out = idem(&Store::Sql(&url), &["release", "--scope", "s"]);
                assert_eq!(out.status.code(), Some(2), "clap's usage error: {}", stderr(&out));
            }
        }
    };
}

fn pg_url() -> String {
    std::env::var("IDEM_PG_URL").unwrap_or_else(|_| common::DEFAULT_PG_URL.to_owned())
}

fn mysql_url() -> String {
    std::env::var("IDEM_MYSQL_URL").unwrap_or_else(|_| common::DEFAULT_MYSQL_URL.to_owned())
}

sql_tests!(
    postgres,
    sqlx::Postgres,
    async { Some((common::postgres().await?, pg_url())) },
    "SELECT count(*) FROM idem_records_archive WHERE scope = $1 AND idem_key = $2"
);
sql_tests!(
    mysql,
    sqlx::MySql,
    async { Some((common::mysql().await?, mysql_url())) },
    "SELECT count(*) FROM idem_records_archive WHERE scope = ? AND idem_key = ?"
);
sql_tests!(
    sqlite,
    sqlx::Sqlite,
    async {
        // A file the binary creates with `idem migrate`; the test's pool
        // opens it after.
        let dir = std::env::temp_dir().join("idem-tests");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{}.db", unique("cli")));
        let url = format!("sqlite:{}", path.display());
        let out = idem(&Store::Sql(&url), &["migrate"]);
        assert_eq!(out.status.code(), Some(0), "migrate: {}", stderr(&out));
        let options = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&path)
            .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(30));
        let pool = sqlx::sqlite::SqlitePoolOptions::new().max_connections(4).connect_with(options).await.unwrap();
        Some((pool, url))
    },
    "SELECT count(*) FROM idem_records_archive WHERE scope = ?1 AND idem_key = ?2"
);

#[test]
fn a_database_that_does_not_exist_yet_is_not_created_but_by_migrate() {
    let path = std::env::temp_dir().join("idem-tests").join(format!("{}.db", unique("absent")));
    let url = format!("sqlite:{}", path.display());
    let out = idem(&Store::Sql(&url), &["stuck"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("idem migrate"), "{}", stderr(&out));
    assert!(!path.exists());
}

#[test]
fn unknown_schemes_and_missing_stores_are_usage_errors() {
    let out = idem(&Store::Sql("oracle://db/x"), &["stuck"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("unknown scheme `oracle`"), "{}", stderr(&out));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_idem"));
    cmd.env_remove("IDEM_DATABASE_URL").env_remove("IDEM_REDIS_URL").args(["--json", "stuck"]);
    let out = cmd.output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(doc["error"].as_str().unwrap().contains("no store given"), "{doc}");
    let out = idem(&Store::Redis { url: "redis://127.0.0.1:1/", prefix: "x:" }, &["purge"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--database-url"), "{}", stderr(&out));
}

#[test]
fn an_unreachable_server_is_named_with_its_url_but_not_its_password() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("postgres://idem:secret@127.0.0.1:{port}/test");
    let out = idem(&Store::Sql(&url), &["stuck"]);
    assert_eq!(out.status.code(), Some(1));
    let said = stderr(&out);
    assert!(said.contains(&format!("postgres://idem:***@127.0.0.1:{port}/test")), "{said}");
    assert!(!said.contains("secret"), "{said}");
}

mod redis_store {
    use super::*;

    /// A store under a prefix of this test's own, and the URL; the prefix's
    /// keys are deleted when the guard drops.
    async fn setup() -> Option<(idem::RedisStore, String, Cleanup)> {
        let conn = common::redis().await?;
        let url = std::env::var("IDEM_REDIS_URL").unwrap_or_else(|_| common::DEFAULT_REDIS_URL.to_owned());
        let prefix = format!("{}:", unique("idem-cli-test"));
        let store = idem::RedisStore::new(conn.clone(), prefix.clone());
        Some((store, url, Cleanup { conn, prefix }))
    }

    /// Deletes this test's keys (SCAN + UNLINK of its own prefix only).
    struct Cleanup {
        conn: redis::aio::ConnectionManager,
        prefix: String,
    }

    impl Cleanup {
        async fn run(mut self) {
            let mut cursor: u64 = 0;
            loop {
                let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(format!("{}*", self.prefix))
                    .arg("COUNT")
                    .arg(500)
                    .query_async(&mut self.conn)
                    .await
                    .unwrap();
                for key in keys {
                    let _: () = redis::cmd("UNLINK").arg(&key).query_async(&mut self.conn).await.unwrap();
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
    }

    #[tokio::test]
    async fn a_crashed_lease_is_inspected_listed_and_released_and_then_runs_again() {
        let Some((store, url, cleanup)) = setup().await else { return };
        let prefix = cleanup.prefix.clone();
        lease_lifecycle(&store, &Store::Redis { url: &url, prefix: &prefix }).await;
        cleanup.run().await;
    }

    #[tokio::test]
    async fn a_release_leaves_a_record_taken_over_since() {
        let Some((store, _url, cleanup)) = setup().await else { return };
        release_compares_the_fence(&store, |id, fence| {
            let store = store.clone();
            async move { store.release_lease(&id, fence).await.unwrap() }
        })
        .await;
        cleanup.run().await;
    }

    /// Another prefix's records (another application, another test) are
    /// neither listed nor reachable.
    #[tokio::test]
    async fn stuck_sees_only_its_prefix() {
        let Some((store, url, cleanup)) = setup().await else { return };
        let prefix = cleanup.prefix.clone();
        let scope = hostile("cli.prefix");
        crash(&store, &scope, "k1").await;
        let (other, _, other_cleanup) = setup().await.unwrap();
        crash(&other, &scope, "k2").await;
        tokio::time::sleep(SHORT_LEASE + Duration::from_millis(300)).await;
        let listed = idem_json(&Store::Redis { url: &url, prefix: &prefix }, &["stuck", "--scope", &scope], 0);
        let records = listed["stores"][0]["records"].as_array().unwrap();
        assert_eq!(records.len(), 1, "{listed}");
        assert_eq!(records[0]["key"], "k1");
        let all = idem_json(&Store::Redis { url: &url, prefix: &prefix }, &["stuck"], 0);
        assert_eq!(all["stores"][0]["records"].as_array().unwrap().len(), 1, "{all}");
        cleanup.run().await;
        other_cleanup.run().await;
    }
}
