//! Operations on the dedup record in the caller's transaction, shared by
//! every strategy that keeps one (`dedup`, `dedup+state`, `token+dedup`,
//! and the lock strategies around them).

use crate::error::Error;
use crate::guard::{Prepared, replayed};
use crate::precheck::{PrecheckStore, Sight, confirmed as precheck_confirmed, look};
use crate::record::RecordStatus;
use crate::replay::Replayable;
use crate::store::sql::{ExistingRecord, SqlBackend, classify, record};

/// `precheck`: a "seen" marker first; a seen key whose completed record is
/// there replays from a plain read (SQLite: taking the write lock first),
/// before any claim, token or state change. `None`: go on and claim.
pub(crate) async fn prechecked<T: Replayable, DB: SqlBackend>(
    conn: &mut DB::Connection,
    p: &Prepared,
    precheck: Option<(&dyn PrecheckStore, std::time::Duration)>,
) -> Result<Option<T>, Error> {
    let Some((store, ttl)) = precheck else { return Ok(None) };
    if let Sight::Seen = look(store, &p.stored_scope, p.key.as_str(), ttl, &p.scope).await? {
        let read = record::read_then_claim::<DB>(conn, &p.stored_scope, p.key.as_str()).await;
        let existing = read.map_err(classify::<DB>)?;
        match existing {
            Some(existing)
                if !existing.expired && RecordStatus::parse(&existing.status) == Some(RecordStatus::Done) =>
            {
                precheck_confirmed(true);
                return judge(p, existing).map(Some);
            }
            _ => precheck_confirmed(false),
        }
    }
    Ok(None)
}

/// A committed record exists: decide between replay, mismatch and in-progress.
pub(crate) fn judge<T: Replayable>(p: &Prepared, existing: ExistingRecord) -> Result<T, Error> {
    p.check_fingerprint(existing.fingerprint.as_deref())?;
    match RecordStatus::parse(&existing.status) {
        Some(RecordStatus::Done) => match existing.response.as_deref() {
            Some(json) => replayed(p, json),
            None => Err(p.not_kept()),
        },
        // A committed PROCESSING record in dedup mode means the guarded future
        // was dropped mid-body and the caller committed anyway: whether the
        // effect happened is unknown, so never run it again silently, and do
        // not call it retryable (it would stay so for the whole retention).
        _ => Err(p.unfinished()),
    }
}

/// Answers up to this long in the caller's transaction are not checked
/// against the server's limit (on MySQL, asking costs a round trip): it is below every store's default
/// (MySQL's `max_allowed_packet` is 4 MiB to 64 MiB by version). On a
/// server configured below it, the write fails instead: in the caller's
/// transaction its connection is dropped and everything rolls back; a lease
/// store's completion then writes the record without its answer.
pub(crate) const SURE_FIT: usize = 64 * 1024;

pub(crate) async fn discard<DB: SqlBackend>(conn: &mut DB::Connection, p: &Prepared) {
    // If this fails the transaction is unusable (PostgreSQL aborts it after a
    // failed statement; a lost connection cannot commit): the record cannot
    // be committed either, so the body's error is the one to return.
    match record::discard::<DB>(conn, &p.stored_scope, p.key.as_str()).await {
        Ok(0) => {
            // The record claimed in this transaction is not there: the
            // server rolled the transaction back (a deadlock victim), or the
            // ticket was completed on another transaction than its claim's,
            // which then commits the record unfinished.
            tracing::warn!(target: "idem", scope = %p.scope, key = %p.key.hash(),
                "the dedup record to remove after the body failed was not found: was the ticket completed on the \
                 transaction its claim was made in?");
        }
        Ok(_) => {}
        Err(e) => {
            tracing::debug!(target: "idem", scope = %p.scope, key = %p.key.hash(), error = %e,
                "dedup record not removed after the body failed; the transaction cannot commit it");
        }
    }
}
