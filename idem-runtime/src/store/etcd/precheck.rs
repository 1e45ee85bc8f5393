//! Precheck markers on etcd: `<prefix>{<key>}seen:<scope>`, written only
//! where no key is (`create_revision == 0`), attached to a shared etcd lease
//! that keeps it at least its TTL.

use std::time::Duration;

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};

use super::EtcdStore;
use crate::error::Error;
use crate::precheck::store::PrecheckStore;
use crate::store::{BoxFuture, RecordKind};

impl PrecheckStore for EtcdStore {
    fn kind(&self) -> &'static str {
        "etcd"
    }

    fn mark<'a>(&'a self, scope: &'a str, key: &'a str, ttl: Duration) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let name = self.key(RecordKind::Seen, scope, key);
            // A repeat of a write that landed reports the marker seen: the
            // record then decides, as for any repeat.
            let answer = self
                .txn_kept(ttl, |lease| {
                    Txn::new()
                        .when([Compare::create_revision(name.as_str(), CompareOp::Equal, 0)])
                        .and_then([TxnOp::put(name.as_str(), "1", Some(PutOptions::new().with_lease(lease)))])
                })
                .await?;
            Ok(answer.succeeded())
        })
    }
}
