//! Locks on etcd: the lock is `<prefix>{<key>}lock:<scope>` holding its
//! owner id, attached to an etcd lease of the lock's TTL (granted with the
//! acquire, renewed by keep-alive), and written only where no key is
//! (`create_revision == 0`). The fence is the revision of that write (the
//! key's `create_revision`): etcd's revisions only increase, so every grant
//! of a lock gets a higher fence than every earlier one, with no counter to
//! lose. The lock frees itself when etcd expires its lease.

use std::time::Duration;

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};

use super::{EtcdStore, got, revision, seconds};
use crate::error::Error;
use crate::lock::store::{LockAttempt, LockStore};
use crate::store::{BoxFuture, RecordKind};

const RACES: usize = 16;

impl EtcdStore {
    async fn acquire_lock(&self, name: &str, owner: &str, ttl: Duration) -> Result<LockAttempt, Error> {
        let mut found = self.get(name).await?;
        for _ in 0..RACES {
            let Some(kv) = found else {
                let lease = self.grant(seconds(ttl)).await?;
                let txn = Txn::new()
                    .when([Compare::create_revision(name, CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(name, owner, Some(PutOptions::new().with_lease(lease)))])
                    .or_else([TxnOp::get(name, None)]);
                // Safe to repeat: a repeat finds the lock its first attempt
                // took, this owner's, and is granted again with its fence.
                let answer = self.txn(txn, true).await?;
                if answer.succeeded() {
                    return Ok(LockAttempt::Acquired { fence: revision(&answer) });
                }
                found = got(&answer);
                continue;
            };
            if kv.value() == owner.as_bytes() {
                // Granted again to its owner, for the whole TTL, with its fence.
                if self.renew(kv.lease()).await? {
                    return Ok(LockAttempt::Acquired { fence: kv.create_revision() });
                }
            } else if let Some(left) = self.lease_left(kv.lease()).await? {
                let until = Duration::from_secs(left as u64 + 1).min(ttl.max(Duration::from_millis(1)));
                return Ok(LockAttempt::Busy { retry_after: until });
            }
            // Its lease expired just now: etcd deletes the key with it.
            found = self.get(name).await?;
        }
        Err(self.message(&format!("{name} changed under {RACES} acquires in a row")))
    }
}

impl LockStore for EtcdStore {
    fn kind(&self) -> &'static str {
        "etcd"
    }

    fn acquire<'a>(
        &'a self,
        scope: &'a str,
        key: &'a str,
        owner: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<LockAttempt, Error>> {
        Box::pin(async move { self.acquire_lock(&self.key(RecordKind::Lock, scope, key), owner, ttl).await })
    }

    fn release<'a>(&'a self, scope: &'a str, key: &'a str, owner: &'a str) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let name = self.key(RecordKind::Lock, scope, key);
            let txn = Txn::new()
                .when([Compare::value(name.as_str(), CompareOp::Equal, owner)])
                .and_then([TxnOp::delete(name.as_str(), None)]);
            // Not repeated: if the first attempt deleted the lock, a second
            // would find it gone and report it lost. A release that did not
            // happen frees itself when etcd expires the lock's lease.
            let answer = self.txn(txn, false).await?;
            Ok(answer.succeeded())
        })
    }

    fn extend<'a>(
        &'a self,
        scope: &'a str,
        key: &'a str,
        owner: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        // The lease is renewed for the TTL it was granted with.
        let _ = ttl;
        Box::pin(async move {
            match self.get(&self.key(RecordKind::Lock, scope, key)).await? {
                Some(kv) if kv.value() == owner.as_bytes() => self.renew(kv.lease()).await,
                _ => Ok(false),
            }
        })
    }

    fn release_detached(&self, scope: &str, key: &str, owner: &str) {
        crate::store::release_in_background(self, scope, key, owner);
    }

    fn shared(&self) -> Option<std::sync::Arc<dyn LockStore>> {
        Some(std::sync::Arc::new(self.clone()))
    }
}
