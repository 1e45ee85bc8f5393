//! Lease records, one-time tokens and locks in this process's memory: for
//! tests and single-process services. Sharded by key, so calls on different
//! keys rarely share a lock; no lock is held across an `.await`.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::AtomicI64;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use super::keyspace::Keyspace;
use super::millis;
use super::waiters::Waiters;

mod lease;
mod lock;
mod precheck;
mod token;

use lease::Rec;

const SHARDS: usize = 64;

/// String-keyed maps behind 64 locks, picked by the key's hash.
pub(crate) struct Shards<V> {
    maps: Box<[Mutex<HashMap<String, V>>]>,
    hasher: RandomState,
}

impl<V> Shards<V> {
    fn new() -> Shards<V> {
        Shards { maps: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(), hasher: RandomState::new() }
    }

    /// The map `id` lives in, locked.
    pub(crate) fn lock(&self, id: &str) -> MutexGuard<'_, HashMap<String, V>> {
        let i = (self.hasher.hash_one(id) as usize) % SHARDS;
        // A panic while holding a shard cannot leave an entry half-written
        // (every change is one assignment), so a poisoned lock is still usable.
        self.maps[i].lock().unwrap_or_else(|p| p.into_inner())
    }

    fn len(&self) -> usize {
        self.maps.iter().map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).len()).sum()
    }

    /// Keep the entries `keep` accepts; returns how many went. One shard at a
    /// time, so live calls wait at most one shard's sweep.
    pub(crate) fn retain(&self, mut keep: impl FnMut(&V) -> bool) -> usize {
        let mut gone = 0;
        for shard in self.maps.iter() {
            let mut map = shard.lock().unwrap_or_else(|p| p.into_inner());
            let before = map.len();
            map.retain(|_, v| keep(v));
            gone += before - map.len();
        }
        gone
    }
}

/// Lease records, one-time tokens, locks and precheck markers in this
/// process's memory: for tests, and for services that run as one process.
/// Choose it explicitly (`idem::Stores::builder().all(MemoryStore::new())`);
/// several processes need a shared store (Redis, or SQL for lease records).
/// The clock is this process's monotonic clock.
///
/// Each record is named as in Redis (see [`RecordKind`](crate::store::RecordKind)):
/// no two (kind, scope, key) triples share an entry.
///
/// Clones share their records (a clone is a handle, as a pool's is).
#[derive(Clone)]
pub struct MemoryStore {
    state: Arc<State>,
}

/// What a [`MemoryStore`] holds.
struct State {
    /// Every entry's name (the prefix is empty).
    names: Keyspace,
    shards: Shards<Rec>,
    /// Token name -> expiry: see `token`.
    tokens: Shards<i64>,
    /// Marker name -> expiry: see `precheck`.
    markers: Shards<i64>,
    /// Lock name -> holder: see `lock`.
    locks: Shards<lock::Held>,
    /// Lease record name -> its call's recorded steps: see `lease`.
    steps: Shards<lease::KeptSteps>,
    /// The last fencing token granted by any lease or lock of this store.
    fences: AtomicI64,
    epoch: Instant,
    /// Calls waiting for a lease record to be completed or released.
    waiters: Waiters,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore").field("records", &self.len()).finish()
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> MemoryStore {
        // Fencing tokens start at the wall clock's microseconds, so a store
        // made after a restart still grants tokens above the old ones.
        let state = State {
            names: Keyspace::new(""),
            shards: Shards::new(),
            tokens: Shards::new(),
            markers: Shards::new(),
            locks: Shards::new(),
            steps: Shards::new(),
            fences: AtomicI64::new(super::clock_micros()),
            epoch: Instant::now(),
            waiters: Waiters::default(),
        };
        MemoryStore { state: Arc::new(state) }
    }

    /// A fencing token above every one this store granted before: one
    /// counter for every key, so a key's tokens keep increasing even after
    /// its record was removed.
    pub(crate) fn next_fence(&self) -> i64 {
        self.state.fences.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1
    }

    /// Milliseconds on this store's clock.
    pub(crate) fn now(&self) -> i64 {
        millis(self.state.epoch.elapsed())
    }

    /// Lease records held, expired ones included until purged.
    pub fn len(&self) -> usize {
        self.state.shards.len()
    }

    /// True when no lease record is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drop lease records past their retention, and tokens, locks and
    /// precheck markers past their TTL; returns how many. One shard at a
    /// time, so live calls wait at most one shard's sweep.
    pub fn purge_expired(&self) -> usize {
        let now = self.now();
        self.state.shards.retain(|r| r.expires_at > now)
            + self.state.tokens.retain(|until| *until > now)
            + self.state.locks.retain(|held| held.until > now)
            + self.state.markers.retain(|until| *until > now)
            + self.state.steps.retain(|log| log.expires_at > now)
    }
}
