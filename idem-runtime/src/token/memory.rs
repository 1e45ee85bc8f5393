//! Tokens in this process's memory: the token is the map key, its scope and
//! deadline the value; consuming removes it under the shard's lock.

use std::time::Duration;

use super::TokenStore;
use crate::Error;
use crate::lease::{BoxFuture, MemoryStore, millis};

impl TokenStore for MemoryStore {
    fn kind(&self) -> &'static str {
        "memory"
    }

    fn put<'a>(&'a self, scope: &'a str, token: &'a str, ttl: Duration) -> BoxFuture<'a, Result<(), Error>> {
        let now = self.now();
        let mut map = self.tokens.lock(token);
        // Tokens never consumed (forms abandoned) are swept now and then, so
        // that a long-running process does not keep them all.
        if map.len() % 1024 == 1023 {
            map.retain(|_, (_, until)| *until > now);
        }
        let live = map.get(token).is_some_and(|(_, until)| *until > now);
        if !live {
            map.insert(token.to_owned(), (scope.to_owned(), now.saturating_add(millis(ttl))));
        }
        Box::pin(std::future::ready(Ok(())))
    }

    fn consume<'a>(&'a self, scope: &'a str, token: &'a str) -> BoxFuture<'a, Result<bool, Error>> {
        let now = self.now();
        let mut map = self.tokens.lock(token);
        let spent = match map.get(token) {
            Some((theirs, until)) if theirs == scope && *until > now => map.remove(token).is_some(),
            Some((_, until)) if *until <= now => {
                map.remove(token);
                false
            }
            _ => false,
        };
        Box::pin(std::future::ready(Ok(spent)))
    }
}
