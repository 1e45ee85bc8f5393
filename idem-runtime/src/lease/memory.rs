//! Lease records, one-time tokens and locks in this process's memory: for
//! tests and single-process services. Sharded by key, so calls on different
//! keys rarely share a lock; no lock is held across an `.await`.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::AtomicI64;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::{BoxFuture, HeldLease, LeaseClaim, LeaseRequest, LeaseStore, millis};
use crate::Error;

const SHARDS: usize = 64;

struct Rec {
    done: bool,
    fingerprint: Option<String>,
    response: String,
    owner: String,
    fence: i64,
    lease_until: i64,
    expires_at: i64,
}

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

/// Lease records, one-time tokens and locks in memory. The clock is this
/// process's monotonic clock.
pub struct MemoryStore {
    shards: Shards<Rec>,
    /// token -> (scope, expires at): see `token`.
    pub(crate) tokens: Shards<(String, i64)>,
    /// scope + key -> marker deadline: see `precheck`.
    pub(crate) markers: Shards<i64>,
    /// lock name -> holder: see `lock`.
    pub(crate) locks: Shards<crate::lock::memory::Held>,
    /// The last fencing token granted by any lease or lock of this store.
    pub(crate) fences: AtomicI64,
    epoch: Instant,
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
        MemoryStore {
            shards: Shards::new(),
            tokens: Shards::new(),
            markers: Shards::new(),
            locks: Shards::new(),
            fences: AtomicI64::new(super::clock_micros()),
            epoch: Instant::now(),
        }
    }

    /// A fencing token above every one this store granted before: one
    /// counter for every key, so a key's tokens keep increasing even after
    /// its record was removed.
    pub(crate) fn next_fence(&self) -> i64 {
        self.fences.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1
    }

    /// Milliseconds on this store's clock.
    pub(crate) fn now(&self) -> i64 {
        millis(self.epoch.elapsed())
    }

    fn shard(&self, id: &str) -> MutexGuard<'_, HashMap<String, Rec>> {
        self.shards.lock(id)
    }

    /// Lease records held, expired ones included until purged.
    pub fn len(&self) -> usize {
        self.shards.len()
    }

    /// True when no lease record is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drop lease records past their retention, and tokens, locks and
    /// precheck markers past their TTL; returns how many. One shard at a time, so live calls wait at most one
    /// shard's sweep.
    pub fn purge_expired(&self) -> usize {
        let now = self.now();
        self.shards.retain(|r| r.expires_at > now)
            + self.tokens.retain(|(_, until)| *until > now)
            + self.locks.retain(|held| held.until > now)
            + self.markers.retain(|until| *until > now)
    }

    fn id(scope: &str, key: &str) -> String {
        let mut id = String::with_capacity(scope.len() + key.len() + 1);
        id.push_str(scope);
        id.push('\0');
        id.push_str(key);
        id
    }

    fn claim_now(&self, req: &LeaseRequest<'_>) -> LeaseClaim {
        let now = self.now();
        let id = Self::id(req.scope, req.key);
        let mut map = self.shard(&id);
        let lease_until = now.saturating_add(millis(req.lease));
        let expires_at = now.saturating_add(millis(req.retention.max(req.lease)));
        let fresh = |fence| Rec {
            done: false,
            fingerprint: req.fingerprint.map(str::to_owned),
            response: String::new(),
            owner: req.owner.to_owned(),
            fence,
            lease_until,
            expires_at,
        };
        match map.get_mut(&id) {
            Some(rec) if rec.expires_at > now => {
                if let (Some(ours), Some(theirs)) = (req.fingerprint, rec.fingerprint.as_deref())
                    && ours != theirs
                {
                    return LeaseClaim::Mismatch;
                }
                if rec.done {
                    return LeaseClaim::Done { response: rec.response.clone() };
                }
                if rec.lease_until > now {
                    return LeaseClaim::Busy { retry_after: Duration::from_millis((rec.lease_until - now) as u64) };
                }
                let fence = self.next_fence();
                *rec = fresh(fence);
                LeaseClaim::Acquired { fence, reclaimed: true }
            }
            Some(rec) => {
                // Past retention: a new record.
                let fence = self.next_fence();
                *rec = fresh(fence);
                LeaseClaim::Acquired { fence, reclaimed: false }
            }
            None => {
                let fence = self.next_fence();
                map.insert(id, fresh(fence));
                LeaseClaim::Acquired { fence, reclaimed: false }
            }
        }
    }

    /// Apply `change` to the record if `held` still holds it.
    fn if_held(&self, held: &HeldLease<'_>, change: impl FnOnce(&mut Rec, i64) -> bool) -> bool {
        let id = Self::id(held.scope, held.key);
        let now = self.now();
        let mut map = self.shard(&id);
        match map.get_mut(&id) {
            Some(rec) if !rec.done && rec.owner == held.owner && rec.fence == held.fence => {
                if change(rec, now) {
                    map.remove(&id);
                }
                true
            }
            _ => false,
        }
    }
}

impl LeaseStore for MemoryStore {
    fn kind(&self) -> &'static str {
        "memory"
    }

    fn claim<'a>(&'a self, req: &'a LeaseRequest<'a>) -> BoxFuture<'a, Result<LeaseClaim, Error>> {
        let claimed = self.claim_now(req);
        Box::pin(std::future::ready(Ok(claimed)))
    }

    fn complete<'a>(&'a self, held: &'a HeldLease<'a>, response: &'a str) -> BoxFuture<'a, Result<bool, Error>> {
        let id = Self::id(held.scope, held.key);
        let now = self.now();
        let mut map = self.shard(&id);
        let done = match map.get_mut(&id) {
            Some(rec) if rec.owner == held.owner && rec.fence == held.fence => {
                // Already done by this holder: a repeated completion.
                if !rec.done {
                    rec.done = true;
                    rec.response = response.to_owned();
                    rec.expires_at = now.saturating_add(millis(held.retention));
                }
                true
            }
            _ => false,
        };
        Box::pin(std::future::ready(Ok(done)))
    }

    fn release<'a>(&'a self, held: &'a HeldLease<'a>) -> BoxFuture<'a, Result<bool, Error>> {
        let released = self.if_held(held, |_, _| true);
        Box::pin(std::future::ready(Ok(released)))
    }

    fn extend<'a>(&'a self, held: &'a HeldLease<'a>) -> BoxFuture<'a, Result<bool, Error>> {
        let extended = self.if_held(held, |rec, now| {
            rec.lease_until = now.saturating_add(millis(held.lease));
            rec.expires_at = rec.expires_at.max(rec.lease_until);
            false
        });
        Box::pin(std::future::ready(Ok(extended)))
    }
}
