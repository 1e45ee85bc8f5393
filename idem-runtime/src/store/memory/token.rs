//! Tokens in this process's memory: each token's name (its scope and the
//! token) maps to its expiry; consuming removes it under its shard's lock.

use std::time::Duration;

use super::MemoryStore;
use crate::error::Error;
use crate::store::{BoxFuture, RecordKind, millis};
use crate::token::store::TokenStore;

impl TokenStore for MemoryStore {
    fn kind(&self) -> &'static str {
        "memory"
    }

    fn put<'a>(&'a self, scope: &'a str, token: &'a str, ttl: Duration) -> BoxFuture<'a, Result<(), Error>> {
        let now = self.now();
        let name = self.state.names.name(RecordKind::Token, scope, token);
        let mut map = self.state.tokens.lock(&name);
        // Tokens never consumed (forms abandoned) are swept now and then, so
        // that a long-running process does not keep them all.
        if map.len() % 1024 == 1023 {
            map.retain(|_, until| *until > now);
        }
        let live = map.get(&name).is_some_and(|until| *until > now);
        if !live {
            map.insert(name, now.saturating_add(millis(ttl)));
        }
        Box::pin(std::future::ready(Ok(())))
    }

    fn consume<'a>(&'a self, scope: &'a str, token: &'a str) -> BoxFuture<'a, Result<bool, Error>> {
        let now = self.now();
        let name = self.state.names.name(RecordKind::Token, scope, token);
        let spent = self.state.tokens.lock(&name).remove(&name).is_some_and(|until| until > now);
        Box::pin(std::future::ready(Ok(spent)))
    }
}
