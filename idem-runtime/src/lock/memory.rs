//! Locks in this process's memory. Fencing tokens come from one counter per
//! store, so they increase per lock (and across locks).

use std::time::Duration;

use super::{LockAttempt, LockStore};
use crate::Error;
use crate::lease::{BoxFuture, MemoryStore, millis};

/// The holder of one lock.
pub(crate) struct Held {
    owner: String,
    pub(crate) until: i64,
}

impl LockStore for MemoryStore {
    fn kind(&self) -> &'static str {
        "memory"
    }

    fn acquire<'a>(
        &'a self,
        name: &'a str,
        owner: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<LockAttempt, Error>> {
        let now = self.now();
        let mut map = self.locks.lock(name);
        let attempt = match map.get(name) {
            Some(held) if held.until > now => {
                LockAttempt::Busy { retry_after: Duration::from_millis((held.until - now) as u64) }
            }
            _ => {
                let fence = self.next_fence();
                map.insert(name.to_owned(), Held { owner: owner.to_owned(), until: now.saturating_add(millis(ttl)) });
                LockAttempt::Acquired { fence }
            }
        };
        Box::pin(std::future::ready(Ok(attempt)))
    }

    fn release<'a>(&'a self, name: &'a str, owner: &'a str) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(std::future::ready(Ok(self.release_now(name, owner))))
    }

    fn release_detached(&self, name: &str, owner: &str) {
        self.release_now(name, owner);
    }

    fn extend<'a>(&'a self, name: &'a str, owner: &'a str, ttl: Duration) -> BoxFuture<'a, Result<bool, Error>> {
        let now = self.now();
        let mut map = self.locks.lock(name);
        let extended = match map.get_mut(name) {
            Some(held) if held.owner == owner && held.until > now => {
                held.until = now.saturating_add(millis(ttl));
                true
            }
            _ => false,
        };
        Box::pin(std::future::ready(Ok(extended)))
    }
}

impl MemoryStore {
    /// Delete lock `name` if `owner` holds it (and it has not expired).
    fn release_now(&self, name: &str, owner: &str) -> bool {
        let now = self.now();
        let mut map = self.locks.lock(name);
        match map.get(name) {
            Some(held) if held.owner == owner && held.until > now => map.remove(name).is_some(),
            _ => false,
        }
    }
}
