//! The Redis store on a real Redis Cluster (`IDEM_REDIS_CLUSTER_URLS`,
//! started by `.ci/redis-cluster`): what only a cluster can show. The
//! strategies' suites run on it too (tests/lease.rs, token_lock.rs,
//! precheck.rs, each a `redis_cluster` module); the failover is
//! tests/redis_cluster_failover.rs.

use idem_test_support as common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use common::{AppError, unique};
use idem::idempotent;
use idem::lease::{HeldLease, LeaseClaim, LeaseRequest, LeaseStore};
use idem::lock::{LockAttempt, LockStore};
use idem::precheck::PrecheckStore;
use idem::store::RecordKind;
use idem::store::RedisStore;
use idem::token::TokenStore;
use redis::cluster_async::ClusterConnection;

type ClusterStore = RedisStore<ClusterConnection>;

async fn store() -> Option<(ClusterStore, ClusterConnection)> {
    let conn = common::redis_cluster().await?;
    Some((RedisStore::new(conn.clone(), format!("{}:", unique("idem-cluster"))), conn))
}

async fn slot(conn: &mut ClusterConnection, key: &str) -> i64 {
    redis::cmd("CLUSTER").arg("KEYSLOT").arg(key).query_async(conn).await.unwrap()
}

/// Redis Cluster refuses a command or script whose keys span slots
/// (`CROSSSLOT`), so running each kind of step is the check that each
/// touches one slot; and every record of one business key is in the slot
/// of that key, whatever the scope.
#[tokio::test]
async fn every_script_and_command_touches_one_slot() {
    let Some((store, mut conn)) = store().await else { return };
    let key = unique("order{7}:a%b");
    let (scope, other_scope) = ("tests.cluster.steps", "tests.cluster.other:scope");
    let lease = Duration::from_secs(5);
    let req =
        |owner| LeaseRequest { scope, key: &key, fingerprint: None, owner, lease, retention: Duration::from_secs(60) };
    // Lease: claim, busy claim, extend, complete, replay; claim and release.
    let LeaseClaim::Acquired { fence, .. } = store.claim(&req("w")).await.unwrap() else { panic!("claim") };
    assert!(matches!(store.claim(&req("x")).await.unwrap(), LeaseClaim::Busy { .. }));
    let held =
        HeldLease { scope, key: &key, owner: "w", fingerprint: None, fence, lease, retention: Duration::from_secs(60) };
    assert!(LeaseStore::extend(&store, &held).await.unwrap());
    assert!(store.complete(&held, Some("\"done\"")).await.unwrap());
    assert_eq!(store.claim(&req("y")).await.unwrap(), LeaseClaim::Done { response: Some("\"done\"".into()) });
    let other = LeaseRequest { scope: other_scope, ..req("z") };
    let LeaseClaim::Acquired { fence: f2, .. } = store.claim(&other).await.unwrap() else { panic!("claim") };
    assert!(
        LeaseStore::release(&store, &HeldLease { scope: other_scope, owner: "z", fence: f2, ..held.clone() })
            .await
            .unwrap()
    );
    // Lock: acquire (two keys: the lock and its fencing counter), extend, release.
    let LockAttempt::Acquired { fence: lock_fence } = store.acquire(scope, &key, "o", lease).await.unwrap() else {
        panic!("acquire")
    };
    assert!(lock_fence > 0);
    assert!(LockStore::extend(&store, scope, &key, "o", lease).await.unwrap());
    assert!(LockStore::release(&store, scope, &key, "o").await.unwrap());
    // Token: issue, spend once.
    store.put(scope, &key, lease).await.unwrap();
    assert!(store.consume(scope, &key).await.unwrap());
    assert!(!store.consume(scope, &key).await.unwrap());
    // Precheck marker.
    assert!(store.mark(scope, &key, lease).await.unwrap());
    assert!(!store.mark(scope, &key, lease).await.unwrap());
    // One slot for every record of the key, in both scopes.
    let mut slots = Vec::new();
    for kind in [RecordKind::Lease, RecordKind::Lock, RecordKind::Fence, RecordKind::Token, RecordKind::Seen] {
        for s in [scope, other_scope] {
            slots.push(slot(&mut conn, &store.key(kind, s, &key)).await);
        }
    }
    slots.dedup();
    assert_eq!(slots.len(), 1, "{slots:?}");
}

/// A node without the scripts (restarted, a replica just promoted, its
/// cache flushed) is sent their source instead: every step still works.
#[tokio::test]
async fn a_node_without_the_scripts_gets_their_source() {
    let Some((store, mut conn)) = store().await else { return };
    // The client sends SCRIPT FLUSH to every node.
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query_async(&mut conn).await.unwrap();
    let (scope, key, lease) = ("tests.cluster.noscript", unique("k"), Duration::from_secs(5));
    let req = LeaseRequest { scope, key: &key, fingerprint: None, owner: "w", lease, retention: lease };
    assert!(matches!(store.claim(&req).await.unwrap(), LeaseClaim::Acquired { .. }));
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query_async(&mut conn).await.unwrap();
    assert!(matches!(store.acquire(scope, &key, "o", lease).await.unwrap(), LockAttempt::Acquired { .. }));
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query_async(&mut conn).await.unwrap();
    assert!(LockStore::extend(&store, scope, &key, "o", lease).await.unwrap());
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query_async(&mut conn).await.unwrap();
    assert!(LockStore::release(&store, scope, &key, "o").await.unwrap());
}

/// A cluster client resends a command whose connection dropped, reply or
/// not: a lock acquire repeated by the owner it granted is granted again,
/// with the same fence, instead of reading as busy until the TTL.
#[tokio::test]
async fn a_lock_acquire_repeated_by_its_owner_is_granted_again() {
    let Some((store, _)) = store().await else { return };
    let (scope, key, ttl) = ("tests.cluster.relock", unique("k"), Duration::from_secs(5));
    let LockAttempt::Acquired { fence } = store.acquire(scope, &key, "o", ttl).await.unwrap() else { panic!() };
    assert_eq!(store.acquire(scope, &key, "o", ttl).await.unwrap(), LockAttempt::Acquired { fence });
    assert!(matches!(store.acquire(scope, &key, "p", ttl).await.unwrap(), LockAttempt::Busy { .. }));
    assert!(LockStore::release(&store, scope, &key, "o").await.unwrap());
    let LockAttempt::Acquired { fence: next } = store.acquire(scope, &key, "p", ttl).await.unwrap() else { panic!() };
    assert!(next > fence);
}

#[idempotent(key = "id", strategy = "lease", scope = "tests.cluster.batch", store = "store")]
async fn counted(store: &dyn LeaseStore, id: &str, n: usize, runs: &AtomicUsize) -> Result<usize, AppError> {
    runs.fetch_add(1, SeqCst);
    Ok(n)
}

/// Batching turned on by hand on a cluster connection: the first batch
/// across slots is refused (`CROSSSLOT`), its operations go one per call,
/// batching turns itself off, and every caller gets its own answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batching_forced_on_a_cluster_turns_itself_off_and_loses_nothing() {
    let Some((store, _)) = store().await else { return };
    let store = Arc::new(store.batching(true));
    let runs = Arc::new(AtomicUsize::new(0));
    let ids: Vec<String> = (0..200).map(|i| unique(&format!("b{i}-"))).collect();
    let tasks: Vec<_> = ids
        .iter()
        .cloned()
        .enumerate()
        .map(|(n, id)| {
            let (store, runs) = (store.clone(), runs.clone());
            tokio::spawn(async move { counted(&*store, &id, n, &runs).await })
        })
        .collect();
    for (n, t) in tasks.into_iter().enumerate() {
        assert_eq!(t.await.unwrap().unwrap(), n);
    }
    assert_eq!(runs.load(SeqCst), 200);
    assert!(format!("{store:?}").contains("batching: false"), "{store:?}");
    for (n, id) in ids.iter().enumerate() {
        assert_eq!(counted(&*store, id, n, &runs).await.unwrap(), n, "replayed");
    }
    assert_eq!(runs.load(SeqCst), 200, "no body ran twice");
}
