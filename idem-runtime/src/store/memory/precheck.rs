//! Precheck markers in memory: each marker's name (scope and key) maps to
//! its expiry.

use std::time::Duration;

use super::MemoryStore;
use crate::error::Error;
use crate::precheck::store::PrecheckStore;
use crate::store::{BoxFuture, RecordKind, millis};

impl PrecheckStore for MemoryStore {
    fn kind(&self) -> &'static str {
        "memory"
    }

    fn mark<'a>(&'a self, scope: &'a str, key: &'a str, ttl: Duration) -> BoxFuture<'a, Result<bool, Error>> {
        let now = self.now();
        let name = self.state.names.name(RecordKind::Seen, scope, key);
        let mut map = self.state.markers.lock(&name);
        if map.len() % 1024 == 1023 {
            map.retain(|_, until| *until > now);
        }
        let until = now.saturating_add(millis(ttl));
        let fresh = match map.get_mut(&name) {
            Some(seen) if *seen > now => false,
            Some(expired) => {
                *expired = until;
                true
            }
            None => {
                map.insert(name, until);
                true
            }
        };
        Box::pin(std::future::ready(Ok(fresh)))
    }
}
