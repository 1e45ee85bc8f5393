//! Tokens on etcd: `<prefix>{<token>}token:<scope>`, attached to an etcd
//! lease of the token's TTL, written only where no key is. Spending one is
//! a delete that reports whether it deleted anything: one atomic step (two
//! submits racing, one deletes it, the other finds nothing). The scope is
//! part of the key, so a token of another scope is never found.

use std::time::Duration;

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};

use super::{EtcdStore, seconds};
use crate::error::Error;
use crate::store::{BoxFuture, RecordKind};
use crate::token::store::TokenStore;

impl TokenStore for EtcdStore {
    fn kind(&self) -> &'static str {
        "etcd"
    }

    fn put<'a>(&'a self, scope: &'a str, token: &'a str, ttl: Duration) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let name = self.key(RecordKind::Token, scope, token);
            // A lease of its own: a token is never valid longer than its TTL
            // rounded up to the second.
            let lease = self.grant(seconds(ttl)).await?;
            let txn = Txn::new()
                .when([Compare::create_revision(name.as_str(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(name.as_str(), "1", Some(PutOptions::new().with_lease(lease)))]);
            self.txn(txn, true).await?;
            Ok(())
        })
    }

    fn consume<'a>(&'a self, scope: &'a str, token: &'a str) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let name = self.key(RecordKind::Token, scope, token);
            // Not repeated: the first attempt may have spent the token, and
            // a second would then reject the one submit that should pass.
            let deleted = self
                .run(false, |mut c| {
                    let name = name.clone();
                    async move { c.delete(name, None).await }
                })
                .await?;
            Ok(deleted.deleted() > 0)
        })
    }
}
