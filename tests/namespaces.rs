//! Records of different kinds, scopes or keys never meet in a key-value
//! store, whatever the scopes and keys hold: the cases that collided under
//! the earlier layout (names joined with `:`), on memory and a real Redis.
//! The naming itself is property-tested in idem-runtime (store/keyspace.rs).

use idem_test_support as common;

use std::sync::Arc;
use std::time::Duration;

use common::{AppError, unique};
use idem::lease::{HeldLease, LeaseClaim, LeaseRequest, LeaseStore};
use idem::lock::{LockAttempt, LockStore};
use idem::precheck::PrecheckStore;
use idem::store::RecordKind;
use idem::token::TokenStore;
use idem::{Error, idempotent};

/// Every kind of store at once, as `MemoryStore` and `RedisStore` are.
trait Store: LeaseStore + TokenStore + LockStore + PrecheckStore {}
impl<S: LeaseStore + TokenStore + LockStore + PrecheckStore> Store for S {}
type Shared = Arc<dyn Store>;

const SECOND: Duration = Duration::from_secs(1);

/// The lock of scope `tests.ns.a`, composite key (`b`, `c`): under the
/// earlier layout it was the lock `tests.ns.a:b:c`, the same as scope
/// `tests.ns.a:b` with key `c`.
#[idempotent(
    key = "b, c",
    strategy = "lock",
    concurrency_only = true,
    ttl = "5s",
    scope = "tests.ns.a",
    store = "store"
)]
async fn composite(store: &dyn LockStore, b: &str, c: &str) -> Result<i64, AppError> {
    Ok(idem::lock::current().unwrap().fence)
}

#[idempotent(
    key = "c",
    strategy = "lock",
    concurrency_only = true,
    ttl = "5s",
    scope = "tests.ns.a:b",
    store = "store"
)]
async fn colon_scope(store: &dyn LockStore, c: &str) -> Result<i64, AppError> {
    Ok(idem::lock::current().unwrap().fence)
}

fn request<'a>(scope: &'a str, key: &'a str) -> LeaseRequest<'a> {
    LeaseRequest { scope, key, fingerprint: None, owner: "w", lease: 5 * SECOND, retention: 60 * SECOND }
}

/// Claim and complete a lease record: a record that sits for its whole retention.
async fn done_lease_record(store: &dyn LeaseStore, scope: &str, key: &str) {
    let LeaseClaim::Acquired { fence, .. } = store.claim(&request(scope, key)).await.unwrap() else {
        panic!("claim {scope} {key}")
    };
    let held =
        HeldLease { scope, key, owner: "w", fingerprint: None, fence, lease: 5 * SECOND, retention: 60 * SECOND };
    assert!(store.complete(&held, Some("\"first\"")).await.unwrap());
}

macro_rules! suite {
    (mod $m:ident; store = $store:expr;) => {
        mod $m {
            use super::*;

            macro_rules! store {
                () => {
                    match $store {
                        Some(store) => store,
                        None => return,
                    }
                };
            }

            #[tokio::test]
            async fn a_colon_in_the_scope_and_a_composite_key_are_different_locks() {
                let store: Shared = store!();
                let c = unique("c");
                // Scope `tests.ns.a:b`, key `c`, taken by hand and held.
                let held = idem::lock::acquire(&*store, "tests.ns.a:b", &c, 5 * SECOND, Duration::ZERO).await.unwrap();
                // The guard of that scope and key is the same lock: busy.
                let busy = colon_scope(&*store, &c).await;
                assert!(matches!(busy, Err(AppError::Idem(Error::LockBusy { .. }))), "{busy:?}");
                // Scope `tests.ns.a`, key (`b`, `c`): another lock, free.
                composite(&*store, "b", &c).await.unwrap();
                assert!(held.release().await.unwrap());
                colon_scope(&*store, &c).await.unwrap();
            }

            #[tokio::test]
            async fn a_lease_record_of_scope_lock_or_fence_never_blocks_a_lock() {
                let store: Shared = store!();
                let key = unique("k");
                for scope in ["lock", "fence", "lock:x", "x}lock"] {
                    done_lease_record(&*store, scope, &key).await;
                }
                for scope in ["s", "lock", "fence"] {
                    let held = idem::lock::acquire(&*store, scope, &key, 5 * SECOND, Duration::ZERO).await;
                    let held = held.unwrap_or_else(|e| panic!("lock of scope {scope}: {e}"));
                    assert!(held.fence() > 0);
                    assert!(held.release().await.unwrap(), "released, nothing left behind");
                }
                // The lease records are untouched.
                for scope in ["lock", "fence", "lock:x", "x}lock"] {
                    let claim = store.claim(&request(scope, &key)).await.unwrap();
                    assert_eq!(claim, LeaseClaim::Done { response: Some("\"first\"".into()) }, "{scope}");
                }
            }

            #[tokio::test]
            async fn a_precheck_marker_never_blocks_a_lease_record() {
                let store: Shared = store!();
                let key = unique("k");
                assert!(store.mark("x", &key, 60 * SECOND).await.unwrap(), "first sight");
                for scope in ["x:seen", "x", "seen:x"] {
                    let claim = store.claim(&request(scope, &key)).await;
                    assert!(matches!(claim, Ok(LeaseClaim::Acquired { .. })), "{scope}: {claim:?}");
                }
                assert!(!store.mark("x", &key, 60 * SECOND).await.unwrap(), "the marker is still there");
                assert!(store.mark("x:seen", &key, 60 * SECOND).await.unwrap(), "a marker of another scope");
            }

            #[tokio::test]
            async fn a_token_shares_no_record_with_a_lease_a_lock_or_a_marker_of_its_text() {
                let store: Shared = store!();
                let token = idem::token::issue(&*store, "tests.ns.form", 60 * SECOND).await.unwrap();
                done_lease_record(&*store, "token", &token).await;
                done_lease_record(&*store, "tests.ns.form", &token).await;
                assert!(store.mark("tests.ns.form", &token, 60 * SECOND).await.unwrap());
                let held = idem::lock::acquire(&*store, "tests.ns.form", &token, 5 * SECOND, Duration::ZERO).await;
                assert!(held.unwrap().release().await.unwrap());
                assert!(!idem::token::consume(&*store, "tests.ns.other", &token).await.unwrap(), "another scope's");
                assert!(idem::token::consume(&*store, "tests.ns.form", &token).await.unwrap(), "spent once");
                assert!(!idem::token::consume(&*store, "tests.ns.form", &token).await.unwrap());
            }
        }
    };
}

suite! {
    mod memory;
    store = Some(Arc::new(idem::store::MemoryStore::new()) as Shared);
}

suite! {
    mod redis;
    store = common::redis().await.map(|c| Arc::new(idem::store::RedisStore::new(c, format!("{}:", unique("idem-ns")))) as Shared);
}

/// Redis only: a key of another type where a script expects its own
/// record fails the call and leaves everything as it was: the acquire
/// script reads and checks the fencing counter before it takes the lock.
#[tokio::test]
async fn a_fencing_counter_of_another_type_fails_the_acquire_before_anything_is_written() {
    let Some(conn) = common::redis().await else { return };
    let store = idem::store::RedisStore::new(conn.clone(), format!("{}:", unique("idem-ns")));
    let mut c = conn.clone();
    let (scope, key) = ("tests.ns.poisoned", unique("k"));
    let lock = store.key(RecordKind::Lock, scope, &key);
    let counter = store.key(RecordKind::Fence, scope, &key);
    for (poison, complaint) in [("hash", "WRONGTYPE"), ("text", "holds no counter"), ("huge", "holds no counter")] {
        let _: i64 = ::redis::cmd("DEL").arg(&counter).query_async(&mut c).await.unwrap();
        let _: () = match poison {
            "hash" => ::redis::cmd("HSET").arg(&counter).arg("f").arg("v").query_async(&mut c).await.unwrap(),
            "text" => ::redis::cmd("SET").arg(&counter).arg("not a number").query_async(&mut c).await.unwrap(),
            _ => ::redis::cmd("SET").arg(&counter).arg("9".repeat(19)).query_async(&mut c).await.unwrap(),
        };
        let err = idem::lock::acquire(&store, scope, &key, 5 * SECOND, Duration::ZERO).await.unwrap_err();
        assert!(err.to_string().contains(complaint), "{poison}: {err}");
        let left: i64 = ::redis::cmd("EXISTS").arg(&lock).query_async(&mut c).await.unwrap();
        assert_eq!(left, 0, "{poison}: no lock left behind, owned by nobody");
    }
    let _: i64 = ::redis::cmd("DEL").arg(&counter).query_async(&mut c).await.unwrap();
    let held = idem::lock::acquire(&store, scope, &key, 5 * SECOND, Duration::ZERO).await.unwrap();
    let fence = held.fence();
    assert!(held.release().await.unwrap());
    assert_eq!(store.acquire(scope, &key, "o", SECOND).await.unwrap(), LockAttempt::Acquired { fence: fence + 1 });
}

/// Redis only: a token key of another type fails the consume and is left
/// as it was (GETDEL deletes nothing then).
#[tokio::test]
async fn a_token_key_of_another_type_is_an_error_and_stays() {
    let Some(conn) = common::redis().await else { return };
    let store = idem::store::RedisStore::new(conn.clone(), format!("{}:", unique("idem-ns")));
    let mut c = conn.clone();
    let token = "0123456789abcdef0123456789abcdef";
    let key = store.key(RecordKind::Token, "tests.ns.form", token);
    let _: () = ::redis::cmd("HSET").arg(&key).arg("f").arg("v").query_async(&mut c).await.unwrap();
    let err = idem::token::consume(&store, "tests.ns.form", token).await.unwrap_err();
    assert!(err.to_string().contains("WRONGTYPE"), "{err}");
    let left: i64 = ::redis::cmd("EXISTS").arg(&key).query_async(&mut c).await.unwrap();
    assert_eq!(left, 1);
    let _: i64 = ::redis::cmd("DEL").arg(&key).query_async(&mut c).await.unwrap();
}

/// Redis only: records of the earlier layout (0.1) are abandoned, and
/// never read as records of any kind: a done lease record at
/// `prefix{key}:scope` does not replay, a lock at `prefix{scope:key}:lock`
/// does not block, a token at `prefix token:<token>` does not pass.
#[tokio::test]
async fn records_of_the_earlier_layout_are_never_read() {
    let Some(conn) = common::redis().await else { return };
    let prefix = format!("{}:", unique("idem-ns"));
    let store = idem::store::RedisStore::new(conn.clone(), prefix.clone());
    let mut c = conn.clone();
    let (scope, key) = ("tests.ns.old", unique("k"));
    let dots = ".".repeat(64);
    let token = "fedcba9876543210fedcba9876543210";
    for (old, value) in [
        (format!("{prefix}{{{key}}}:{scope}"), format!("D{dots}7:60000:w|\"old\"")),
        (format!("{prefix}{{{scope}:{key}}}:lock"), "someone".to_owned()),
        (format!("{prefix}{{{key}}}:{scope}:seen"), "1".to_owned()),
        (format!("{prefix}token:{token}"), scope.to_owned()),
    ] {
        let _: () = ::redis::cmd("SET").arg(old).arg(value).arg("PX").arg(60_000).query_async(&mut c).await.unwrap();
    }
    assert!(matches!(store.claim(&request(scope, &key)).await.unwrap(), LeaseClaim::Acquired { .. }));
    let held = idem::lock::acquire(&store, scope, &key, 5 * SECOND, Duration::ZERO).await.unwrap();
    assert!(held.release().await.unwrap());
    assert!(store.mark(scope, &key, 60 * SECOND).await.unwrap(), "an old marker is no marker");
    assert!(!idem::token::consume(&store, scope, token).await.unwrap(), "an old token does not pass");
}
