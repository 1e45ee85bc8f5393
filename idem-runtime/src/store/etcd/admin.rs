//! Operating the lease records on etcd: look one up, list the stuck ones
//! (a range read over the store's prefix, in pages), release one. The
//! counterparts of `RedisStore`'s.
//!
//! etcd keeps no wall-clock time: a record's times are this machine's clock
//! when it was read (`now_ms`) plus what etcd says is left of the etcd
//! leases behind it (the call's lease, the retention), in whole seconds.
//! Whether a lease has passed is etcd's word (its lease is gone), never
//! this clock's.

use etcd_client::GetOptions;

use super::EtcdStore;
use super::lease::Read;
use crate::error::Error;
use crate::record::{Record, RecordId, RecordState, RecordStatus, Release};
use crate::store::RecordKind;

/// Keys read per page of [`EtcdStore::stuck_leases`].
const PAGE: i64 = 500;

impl EtcdStore {
    /// The lease record of `id` with its state (by etcd: held with its
    /// etcd lease live, or passed), and the steps its call recorded. `None`
    /// when there is none. Times: see the module docs; `created_at_ms` and
    /// `updated_at_ms` are unknown (`None`): a fence is a revision, not a
    /// time.
    pub async fn inspect_lease(&self, id: &RecordId) -> Result<Option<Record>, Error> {
        let name = self.key(RecordKind::Lease, id.scope(), id.key());
        match self.read_record(&name).await? {
            Some(read) => Ok(Some(self.as_record(id, read).await?)),
            None => Ok(None),
        }
    }

    /// `read` as an operator sees it, with its steps.
    async fn as_record(&self, id: &RecordId, read: Read) -> Result<Record, Error> {
        let now_ms = crate::store::clock_micros() / 1000;
        let kept = match read.kept_by {
            0 => None,
            lease => self.lease_left(lease).await?,
        };
        let (status, state, lease_until_ms) = if read.done() {
            (RecordStatus::Done, RecordState::Done, None)
        } else {
            match self.lease_left(read.head.l).await? {
                Some(left) => (RecordStatus::Processing, RecordState::Running, Some(now_ms + left * 1000)),
                // etcd does not say when it expired the lease: before now.
                None => (RecordStatus::Processing, RecordState::LeasePassed, Some(now_ms - 1)),
            }
        };
        let mut record = Record {
            scope: id.scope().to_owned(),
            key: id.key().to_owned(),
            status,
            state,
            fingerprint: read.head.fp.clone(),
            response: read.response.clone(),
            owner: Some(read.head.o.clone()),
            fence: read.fence,
            lease_until_ms,
            created_at_ms: None,
            updated_at_ms: None,
            expires_at_ms: kept.map(|left| now_ms + left * 1000),
            now_ms,
            steps: Vec::new(),
            in_flight: None,
        };
        let log = self.read_steps(id.scope(), id.key()).await?;
        let marked = log.started.map(|step| (step.number, step.name));
        record.set_steps(log.recorded.into_iter().map(|step| (step.name, step.result)), marked);
        Ok(record)
    }

    /// Lease records whose lease has passed (etcd expired it; the next call
    /// of the key would take them over), at most `limit`, optionally of one
    /// scope (as the guard names it), each with the steps its call
    /// recorded: where it stopped. Reads the keys under the store's prefix
    /// in pages of 500, in key order.
    pub async fn stuck_leases(&self, scope: Option<&str>, limit: usize) -> Result<Vec<Record>, Error> {
        let stored_scope = scope.map(crate::key::stored_scope);
        let mut from = format!("{}{{", self.names.escaped_prefix()).into_bytes();
        // Every name of this store starts with `<prefix>{`: the range ends
        // where that prefix does (its last byte, `{`, plus one).
        let mut end = from.clone();
        *end.last_mut().expect("not empty") += 1;
        let mut found = Vec::new();
        loop {
            let options = GetOptions::new().with_range(end.clone()).with_limit(PAGE);
            let start = from.clone();
            let mut page = self
                .run(true, |mut c| {
                    let (start, options) = (start.clone(), options.clone());
                    async move { c.get(start, Some(options)).await }
                })
                .await?;
            let more = page.more();
            let kvs = page.take_kvs();
            let Some(last) = kvs.last() else { return Ok(found) };
            from = last.key().to_vec();
            from.push(0);
            for kv in &kvs {
                let Ok(name) = kv.key_str() else { continue };
                let Some((RecordKind::Lease, s, k)) = self.names.read(name) else { continue };
                if stored_scope.as_deref().is_some_and(|want| want != s) {
                    continue;
                }
                let Some(read) = super::lease::decode(kv) else { continue };
                if read.done() || self.lease_left(read.head.l).await?.is_some() {
                    continue;
                }
                found.push(self.as_record(&RecordId::stored(s, k), read).await?);
                if found.len() >= limit {
                    return Ok(found);
                }
            }
            if !more {
                return Ok(found);
            }
        }
    }

    /// Delete the lease record of `id` only if its lease has passed (by
    /// etcd) and its fence is still `fence`, in a transaction comparing the
    /// revision read: a record a worker took over meanwhile, one that
    /// completed, or one whose lease is live is left alone. After a release
    /// the next call of the key runs its body again.
    pub async fn release_lease(&self, id: &RecordId, fence: i64) -> Result<Release, Error> {
        let name = self.key(RecordKind::Lease, id.scope(), id.key());
        for _ in 0..16 {
            let Some(read) = self.read_record(&name).await? else { return Ok(Release::NotFound) };
            let revision = read.mod_revision;
            let record = self.as_record(id, read).await?;
            if record.fence != fence {
                return Ok(Release::FenceChanged(record));
            }
            if record.state != RecordState::LeasePassed {
                return Ok(Release::NotStuck(record));
            }
            let txn = etcd_client::Txn::new()
                .when([etcd_client::Compare::mod_revision(name.as_str(), etcd_client::CompareOp::Equal, revision)])
                .and_then([etcd_client::TxnOp::delete(name.as_str(), None)]);
            let answer = self.txn(txn, true).await?;
            if answer.succeeded() {
                return Ok(Release::Released(record));
            }
        }
        Err(self.message(&format!("{name} changed under 16 releases in a row")))
    }
}
