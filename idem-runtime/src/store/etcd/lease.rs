//! Lease records on etcd: one key, `<prefix>{<key>}lease:<scope>`, whose
//! value is a line of JSON (state, fence, owner, fingerprint; while held
//! also the etcd lease that is the call's lease, its length and the
//! retention), followed, once done, by a newline and the answer as it is
//! (never escaped: an answer of quotes takes no more room than it has).
//!
//! Every change is a transaction comparing the key's `mod_revision` with
//! the one read: a claim of a fresh key (`create_revision == 0`), a
//! take-over, a completion, a release. A loser of a race reads again and
//! decides anew. A new record's fence is the revision its transaction got
//! (written as 0 and read back as the key's `create_revision`); a take-over
//! writes the fence it took over plus one.
//!
//! The lease has passed when etcd no longer knows the etcd lease the record
//! names (the leader expired it): only then is the record taken over.

use std::time::Duration;

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use serde::{Deserialize, Serialize};

use super::{EtcdStore, got, revision, seconds};
use crate::error::Error;
use crate::lease::store::{HeldLease, LeaseClaim, LeaseRequest, LeaseStore};
use crate::lease::store::{NewStep, Resolve, StepLog, StepOutcome};
use crate::store::{BoxFuture, RecordKind, millis};

/// How often one operation reads again after losing a race before it
/// reports an error (each lost race is another call's write landing).
const RACES: usize = 16;

/// A lease record's head (the first line of its value).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Head {
    /// `P` while held, `D` once done.
    pub(super) s: char,
    /// The fence; 0 for the fence of a new record, its `create_revision`.
    pub(super) f: i64,
    /// The holder's owner id.
    pub(super) o: String,
    /// The fingerprint the claim was made with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) fp: Option<String>,
    /// While held: the etcd lease that is the call's lease.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(super) l: i64,
    /// While held: the lease's length (ms), as claimed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(super) lm: i64,
    /// The retention (ms).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(super) rm: i64,
    /// Once done: whether the answer was kept (it follows the head).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(super) a: bool,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// A lease record as read.
#[derive(Clone, Debug)]
pub(super) struct Read {
    pub(super) head: Head,
    /// Its fence, the `0` of a new record resolved.
    pub(super) fence: i64,
    pub(super) response: Option<String>,
    pub(super) mod_revision: i64,
    /// The etcd lease the key is attached to (its retention).
    pub(super) kept_by: i64,
}

impl Read {
    pub(super) fn done(&self) -> bool {
        self.head.s == 'D'
    }

    fn holds(&self, held: &HeldLease<'_>) -> bool {
        self.fence == held.fence && self.head.o == held.owner
    }
}

/// A record's value: its head, then (once done with an answer kept) a
/// newline and the answer.
fn encode(head: &Head, response: Option<&str>) -> Vec<u8> {
    let mut value = serde_json::to_vec(head).expect("a head serializes");
    if let Some(response) = response {
        value.push(b'\n');
        value.extend_from_slice(response.as_bytes());
    }
    value
}

/// A value read back; `None` when it is no lease record of idem's.
pub(super) fn decode(kv: &etcd_client::KeyValue) -> Option<Read> {
    let value = kv.value();
    let (head, rest) = match value.iter().position(|&b| b == b'\n') {
        Some(at) => (&value[..at], Some(&value[at + 1..])),
        None => (value, None),
    };
    let head: Head = serde_json::from_slice(head).ok()?;
    if head.s != 'P' && head.s != 'D' {
        return None;
    }
    let response = match rest {
        Some(rest) if head.a => Some(String::from_utf8(rest.to_vec()).ok()?),
        _ => None,
    };
    let fence = if head.f == 0 { kv.create_revision() } else { head.f };
    Some(Read { head, fence, response, mod_revision: kv.mod_revision(), kept_by: kv.lease() })
}

/// Whether a claim with `fingerprint` conflicts with a record's: both have
/// one, and they differ.
fn mismatch(record: Option<&str>, claim: Option<&str>) -> bool {
    matches!((record, claim), (Some(a), Some(b)) if a != b)
}

impl EtcdStore {
    /// The lease record of `scope` and `key`, with its key's name.
    pub(super) async fn read_record(&self, name: &str) -> Result<Option<Read>, Error> {
        match self.get(name).await? {
            Some(kv) => decode(&kv).map(Some).ok_or_else(|| self.not_a_record(name)),
            None => Ok(None),
        }
    }

    pub(super) fn not_a_record(&self, name: &str) -> Error {
        self.message(&format!("{name} does not hold an idem lease record"))
    }

    /// Write `value` to `name` if its `mod_revision` is still `seen` (0: if
    /// there is no key), attached to a lease keeping it `keep`; `Ok(None)`
    /// when written (its revision then), or the key as it is now.
    async fn swap(
        &self,
        name: &str,
        seen: i64,
        value: Vec<u8>,
        keep: Duration,
    ) -> Result<Result<i64, Option<etcd_client::KeyValue>>, Error> {
        let when = if seen == 0 {
            Compare::create_revision(name, CompareOp::Equal, 0)
        } else {
            Compare::mod_revision(name, CompareOp::Equal, seen)
        };
        let answer = self
            .txn_kept(keep, |kept_by| {
                Txn::new()
                    .when([when.clone()])
                    .and_then([TxnOp::put(name, value.clone(), Some(PutOptions::new().with_lease(kept_by)))])
                    .or_else([TxnOp::get(name, None)])
            })
            .await?;
        Ok(if answer.succeeded() { Ok(revision(&answer)) } else { Err(got(&answer)) })
    }

    /// Delete `name` if its `mod_revision` is still `seen`.
    async fn delete_if(&self, name: &str, seen: i64) -> Result<bool, Error> {
        let txn = Txn::new()
            .when([Compare::mod_revision(name, CompareOp::Equal, seen)])
            .and_then([TxnOp::delete(name, None)]);
        Ok(self.txn(txn, true).await?.succeeded())
    }

    async fn claim_record(&self, req: &LeaseRequest<'_>) -> Result<LeaseClaim, Error> {
        let name = self.key(RecordKind::Lease, req.scope, req.key);
        let keep = req.lease.saturating_add(req.retention);
        let head = |fence: i64, hold: i64| Head {
            s: 'P',
            f: fence,
            o: req.owner.to_owned(),
            fp: req.fingerprint.map(str::to_owned),
            l: hold,
            lm: millis(req.lease),
            rm: millis(req.retention),
            a: false,
        };
        let mut found = self.get(&name).await?;
        for _ in 0..RACES {
            let Some(kv) = found else {
                let hold = self.grant(seconds(req.lease)).await?;
                match self.swap(&name, 0, encode(&head(0, hold), None), keep).await? {
                    Ok(fence) => return Ok(LeaseClaim::Acquired { fence, reclaimed: false }),
                    Err(now) => {
                        found = now;
                        continue;
                    }
                }
            };
            let record = decode(&kv).ok_or_else(|| self.not_a_record(&name))?;
            if mismatch(record.head.fp.as_deref(), req.fingerprint) {
                return Ok(LeaseClaim::Mismatch);
            }
            if record.done() {
                return Ok(LeaseClaim::Done { response: record.response });
            }
            if record.head.o == req.owner {
                // Its own claim, repeated (its reply was lost).
                return Ok(LeaseClaim::Acquired { fence: record.fence, reclaimed: false });
            }
            if let Some(left) = self.lease_left(record.head.l).await? {
                // etcd's figure is whole seconds, the lease ending within the
                // next; never past the record's own lease length.
                let until =
                    Duration::from_secs(left as u64 + 1).min(Duration::from_millis(record.head.lm.max(1) as u64));
                return Ok(LeaseClaim::Busy { retry_after: until });
            }
            // Passed, by etcd: take it over, if nobody changed it since.
            let hold = self.grant(seconds(req.lease)).await?;
            let fence = record.fence + 1;
            match self.swap(&name, kv.mod_revision(), encode(&head(fence, hold), None), keep).await? {
                Ok(_) => return Ok(LeaseClaim::Acquired { fence, reclaimed: true }),
                Err(now) => found = now,
            }
        }
        Err(self.message(&format!("{name} changed under {RACES} claims in a row")))
    }

    async fn complete_record(&self, held: &HeldLease<'_>, response: Option<&str>) -> Result<bool, Error> {
        let name = self.key(RecordKind::Lease, held.scope, held.key);
        let mut found = self.get(&name).await?;
        for _ in 0..RACES {
            let Some(kv) = found else { return Ok(false) };
            let record = decode(&kv).ok_or_else(|| self.not_a_record(&name))?;
            if !record.holds(held) {
                return Ok(false);
            }
            if record.done() {
                // A stored answer is final: its holder's repeat is answered
                // `true` and changes nothing.
                return Ok(true);
            }
            let head = Head { s: 'D', f: record.fence, l: 0, lm: 0, a: response.is_some(), ..record.head.clone() };
            match self.swap(&name, kv.mod_revision(), encode(&head, response), held.retention).await? {
                Ok(_) => return Ok(true),
                Err(now) => found = now,
            }
        }
        Err(self.message(&format!("{name} changed under {RACES} completions in a row")))
    }

    async fn release_record(&self, held: &HeldLease<'_>) -> Result<bool, Error> {
        let name = self.key(RecordKind::Lease, held.scope, held.key);
        for _ in 0..RACES {
            let Some(record) = self.read_record(&name).await? else { return Ok(false) };
            if !record.holds(held) || record.done() {
                return Ok(false);
            }
            if self.delete_if(&name, record.mod_revision).await? {
                return Ok(true);
            }
        }
        Err(self.message(&format!("{name} changed under {RACES} releases in a row")))
    }

    async fn extend_record(&self, held: &HeldLease<'_>) -> Result<bool, Error> {
        let name = self.key(RecordKind::Lease, held.scope, held.key);
        match self.read_record(&name).await? {
            // Only a live etcd lease is renewed: once etcd expired it, the
            // record may be taken over, and the holder has lost it.
            Some(record) if record.holds(held) && !record.done() => self.renew(record.head.l).await,
            _ => Ok(false),
        }
    }

    /// The answer limit: etcd refuses a request over its
    /// `--max-request-bytes` (1.5 MiB by default); a record's head and the
    /// transaction around it take less than 8 KiB of it.
    const ANSWER_LIMIT: usize = 1536 * 1024 - 8 * 1024;
}

impl LeaseStore for EtcdStore {
    fn kind(&self) -> &'static str {
        "etcd"
    }

    fn claim<'a>(&'a self, req: &'a LeaseRequest<'a>) -> BoxFuture<'a, Result<LeaseClaim, Error>> {
        Box::pin(self.claim_record(req))
    }

    fn complete<'a>(
        &'a self,
        held: &'a HeldLease<'a>,
        response: Option<&'a str>,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.complete_record(held, response))
    }

    fn release<'a>(&'a self, held: &'a HeldLease<'a>) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.release_record(held))
    }

    fn extend<'a>(&'a self, held: &'a HeldLease<'a>) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.extend_record(held))
    }

    fn answer_limit(&self) -> BoxFuture<'_, usize> {
        Box::pin(std::future::ready(EtcdStore::ANSWER_LIMIT))
    }

    fn steps<'a>(&'a self, scope: &'a str, key: &'a str) -> BoxFuture<'a, Result<StepLog, Error>> {
        Box::pin(self.read_steps(scope, key))
    }

    fn record_step<'a>(&'a self, held: &'a HeldLease<'a>, step: &'a NewStep<'a>) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.write_step(held, step.number, step.name, Some(step.result)))
    }

    fn mark_step<'a>(
        &'a self,
        held: &'a HeldLease<'a>,
        number: usize,
        name: &'a str,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.write_step(held, number, name, None))
    }

    fn unmark_step<'a>(&'a self, held: &'a HeldLease<'a>, number: usize) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(self.drop_mark(held, number))
    }

    fn resolve_step<'a>(
        &'a self,
        scope: &'a str,
        key: &'a str,
        step: &'a str,
        outcome: StepOutcome<'a>,
    ) -> BoxFuture<'a, Result<Resolve, Error>> {
        Box::pin(self.resolve_marked(scope, key, step, outcome))
    }

    fn forget_steps<'a>(&'a self, scope: &'a str, key: &'a str) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(self.drop_steps(scope, key))
    }

    fn shared(&self) -> Option<std::sync::Arc<dyn LeaseStore>> {
        Some(std::sync::Arc::new(self.clone()))
    }
}
