//! Locks in this process's memory: each lock's name (scope and key) maps to
//! its holder. Fencing tokens come from one counter per store, so they
//! increase per lock (and across locks).

use std::time::Duration;

use super::MemoryStore;
use crate::error::Error;
use crate::lock::store::{LockAttempt, LockStore};
use crate::store::{BoxFuture, RecordKind, millis};

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
        scope: &'a str,
        key: &'a str,
        owner: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<LockAttempt, Error>> {
        let now = self.now();
        let name = self.state.names.name(RecordKind::Lock, scope, key);
        let mut map = self.state.locks.lock(&name);
        let attempt = match map.get(&name) {
            Some(held) if held.until > now => {
                LockAttempt::Busy { retry_after: Duration::from_millis((held.until - now) as u64) }
            }
            _ => {
                let fence = self.next_fence();
                map.insert(name, Held { owner: owner.to_owned(), until: now.saturating_add(millis(ttl)) });
                LockAttempt::Acquired { fence }
            }
        };
        Box::pin(std::future::ready(Ok(attempt)))
    }

    fn release<'a>(&'a self, scope: &'a str, key: &'a str, owner: &'a str) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(std::future::ready(Ok(self.release_now(scope, key, owner))))
    }

    fn release_detached(&self, scope: &str, key: &str, owner: &str) {
        self.release_now(scope, key, owner);
    }

    fn shared(&self) -> Option<std::sync::Arc<dyn LockStore>> {
        Some(std::sync::Arc::new(self.clone()))
    }

    fn extend<'a>(
        &'a self,
        scope: &'a str,
        key: &'a str,
        owner: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        let now = self.now();
        let name = self.state.names.name(RecordKind::Lock, scope, key);
        let mut map = self.state.locks.lock(&name);
        let extended = match map.get_mut(&name) {
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
    /// Delete the lock if `owner` holds it (and it has not expired).
    fn release_now(&self, scope: &str, key: &str, owner: &str) -> bool {
        let now = self.now();
        let name = self.state.names.name(RecordKind::Lock, scope, key);
        let mut map = self.state.locks.lock(&name);
        match map.get(&name) {
            Some(held) if held.owner == owner && held.until > now => map.remove(&name).is_some(),
            _ => false,
        }
    }
}
