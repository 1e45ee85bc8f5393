//! Recorded steps on etcd: one key beside the lease record,
//! `<prefix>{<key>}steps:<scope>`, holding JSON: the steps recorded, in
//! order (`r`: name and result), and the mark of the step after them
//! (`m`: number, the marking holder's fence, name). Kept by an etcd lease
//! of the retention from its last write.
//!
//! A write reads the lease record and the steps in one snapshot (one
//! transaction of two reads), checks that the holder still holds the record
//! and that etcd still knows its lease, then writes in a transaction that
//! compares both keys' revisions with the ones read: a take-over, or
//! another write of the steps, in between makes it read again.

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};
use serde::{Deserialize, Serialize};

use super::EtcdStore;
use super::lease::{Read, decode};
use crate::error::Error;
use crate::lease::store::{HeldLease, RecordedStep, Resolve, StartedStep, StepLog, StepOutcome};
use crate::store::RecordKind;

const RACES: usize = 16;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Steps {
    /// Recorded: name, result.
    #[serde(default)]
    r: Vec<(String, String)>,
    /// The mark: number, fence, name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    m: Option<(usize, i64, String)>,
}

impl Steps {
    fn log(&self) -> StepLog {
        StepLog {
            recorded: self
                .r
                .iter()
                .map(|(name, result)| RecordedStep { name: name.clone(), result: result.clone() })
                .collect(),
            started: self
                .m
                .as_ref()
                .filter(|(number, _, _)| *number == self.r.len())
                .map(|(number, _, name)| StartedStep { number: *number, name: name.clone() }),
        }
    }
}

/// The lease record and the steps as one snapshot read them, with the
/// revisions a write compares (0: no key).
struct Snapshot {
    record: Option<Read>,
    record_revision: i64,
    steps: Steps,
    steps_revision: i64,
}

/// A key's revision in a comparison: its `mod_revision`, or, for no key,
/// `create_revision == 0`.
fn unchanged(name: &str, revision: i64) -> Compare {
    if revision == 0 {
        Compare::create_revision(name, CompareOp::Equal, 0)
    } else {
        Compare::mod_revision(name, CompareOp::Equal, revision)
    }
}

impl EtcdStore {
    fn names_of(&self, scope: &str, key: &str) -> (String, String) {
        (self.key(RecordKind::Lease, scope, key), self.key(RecordKind::Steps, scope, key))
    }

    async fn snapshot(&self, record: &str, steps: &str) -> Result<Snapshot, Error> {
        let txn = Txn::new().and_then([TxnOp::get(record, None), TxnOp::get(steps, None)]);
        let answer = self.txn(txn, true).await?;
        let mut kvs = answer.op_responses().into_iter().map(|op| match op {
            TxnOpResponse::Get(mut get) => get.take_kvs().into_iter().next(),
            _ => None,
        });
        let (record_kv, steps_kv) = (kvs.next().flatten(), kvs.next().flatten());
        let read = match &record_kv {
            Some(kv) => Some(decode(kv).ok_or_else(|| self.not_a_record(record))?),
            None => None,
        };
        let parsed = match &steps_kv {
            Some(kv) => serde_json::from_slice(kv.value())
                .map_err(|_| self.message(&format!("{steps} does not hold idem's recorded steps")))?,
            None => Steps::default(),
        };
        Ok(Snapshot {
            record: read,
            record_revision: record_kv.as_ref().map_or(0, etcd_client::KeyValue::mod_revision),
            steps: parsed,
            steps_revision: steps_kv.as_ref().map_or(0, etcd_client::KeyValue::mod_revision),
        })
    }

    /// Write `steps` if neither key changed since `seen`; `false` if one
    /// did.
    async fn put_steps(
        &self,
        (record, name): (&str, &str),
        seen: &Snapshot,
        steps: &Steps,
        keep: std::time::Duration,
    ) -> Result<bool, Error> {
        let value = serde_json::to_vec(steps).expect("steps serialize");
        let answer = self
            .txn_kept(keep, |kept_by| {
                Txn::new()
                    .when([unchanged(record, seen.record_revision), unchanged(name, seen.steps_revision)])
                    .and_then([TxnOp::put(name, value.clone(), Some(PutOptions::new().with_lease(kept_by)))])
            })
            .await?;
        Ok(answer.succeeded())
    }

    pub(super) async fn read_steps(&self, scope: &str, key: &str) -> Result<StepLog, Error> {
        let (record, steps) = self.names_of(scope, key);
        Ok(self.snapshot(&record, &steps).await?.steps.log())
    }

    /// Record step `number` (`result`), or mark it started (`None`), for the
    /// live holder `held`.
    pub(super) async fn write_step(
        &self,
        held: &HeldLease<'_>,
        number: usize,
        step: &str,
        result: Option<&str>,
    ) -> Result<bool, Error> {
        let (record, name) = self.names_of(held.scope, held.key);
        for _ in 0..RACES {
            let seen = self.snapshot(&record, &name).await?;
            let Some(lease) = seen.record.as_ref() else { return Ok(false) };
            if lease.done() || lease.fence != held.fence || lease.head.o != held.owner {
                return Ok(false);
            }
            if self.lease_left(lease.head.l).await?.is_none() {
                return Ok(false); // passed, by etcd
            }
            let mut steps = seen.steps.clone();
            let len = steps.r.len();
            match result {
                Some(result) => {
                    if number < len {
                        return Ok(steps.r[number] == (step.to_owned(), result.to_owned()));
                    }
                    if number > len {
                        return Ok(false);
                    }
                    steps.r.push((step.to_owned(), result.to_owned()));
                    if steps.m.as_ref().is_some_and(|(n, _, _)| *n <= number) {
                        steps.m = None;
                    }
                }
                None => {
                    if number != len {
                        return Ok(false);
                    }
                    if steps.m.as_ref().is_some_and(|(n, _, _)| *n == number) {
                        return Ok(true); // an earlier holder's mark is kept
                    }
                    steps.m = Some((number, held.fence, step.to_owned()));
                }
            }
            if self.put_steps((&record, &name), &seen, &steps, held.retention).await? {
                return Ok(true);
            }
        }
        Err(self.message(&format!("{name} changed under {RACES} writes in a row")))
    }

    pub(super) async fn drop_mark(&self, held: &HeldLease<'_>, number: usize) -> Result<(), Error> {
        let (record, name) = self.names_of(held.scope, held.key);
        for _ in 0..RACES {
            let seen = self.snapshot(&record, &name).await?;
            if !seen.steps.m.as_ref().is_some_and(|(n, fence, _)| *n == number && *fence == held.fence) {
                return Ok(());
            }
            let steps = Steps { m: None, ..seen.steps.clone() };
            if self.put_steps((&record, &name), &seen, &steps, held.retention).await? {
                return Ok(());
            }
        }
        Err(self.message(&format!("{name} changed under {RACES} writes in a row")))
    }

    pub(super) async fn drop_steps(&self, scope: &str, key: &str) -> Result<(), Error> {
        let (_, name) = self.names_of(scope, key);
        self.run(true, |mut c| {
            let name = name.clone();
            async move { c.delete(name, None).await }
        })
        .await?;
        Ok(())
    }

    pub(super) async fn resolve_marked(
        &self,
        scope: &str,
        key: &str,
        step: &str,
        outcome: StepOutcome<'_>,
    ) -> Result<Resolve, Error> {
        let (record, name) = self.names_of(scope, key);
        for _ in 0..RACES {
            let seen = self.snapshot(&record, &name).await?;
            if let Some(lease) = seen.record.as_ref().filter(|r| !r.done())
                && let Some(left) = self.lease_left(lease.head.l).await?
            {
                return Ok(Resolve::Held { lease_left: std::time::Duration::from_secs(left as u64 + 1) });
            }
            let before = seen.steps.log();
            let Some(started) = before.started.clone().filter(|s| s.name == step) else {
                return Ok(Resolve::NotInFlight(before));
            };
            let mut steps = seen.steps.clone();
            steps.m = None;
            if let StepOutcome::Done { result } = outcome {
                steps.r.push((started.name, result.to_owned()));
            }
            let keep = seen
                .record
                .as_ref()
                .map_or(crate::guard::DEFAULT_RETENTION, |r| std::time::Duration::from_millis(r.head.rm.max(1) as u64));
            if self.put_steps((&record, &name), &seen, &steps, keep).await? {
                return Ok(Resolve::Resolved(before));
            }
        }
        Err(self.message(&format!("{name} changed under {RACES} resolutions in a row")))
    }
}
