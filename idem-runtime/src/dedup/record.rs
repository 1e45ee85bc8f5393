//! Operations on the dedup record in the caller's transaction, shared by
//! every strategy that keeps one (`dedup`, `dedup+state`, `token+dedup`,
//! and the lock strategies around them).

use crate::error::Error;
use crate::guard::Prepared;
use crate::precheck::{PrecheckStore, Sight, confirmed as precheck_confirmed, look};
use crate::record::RecordStatus;
use crate::replay::{Replayable, encode, fit};
use crate::store::sql::{ExistingRecord, SqlBackend, classify};
use crate::telemetry::Outcome;

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
        let existing = DB::read_then_claim(conn, &p.stored_scope, p.key.as_str()).await.map_err(classify::<DB>)?;
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

/// A first call's answer as its record keeps it.
pub(crate) enum Kept<T> {
    /// Its JSON, and the value decoded back from it: what the first call
    /// returns, so that it gets what every repeat will (a `#[serde(skip)]`
    /// field at its default, a map in the order JSON gives it).
    Answer(String, T),
    /// It cannot be kept (see [`encode`] and [`fit`], in `replay`): the record is
    /// completed without it, and the first call returns the value as the
    /// body gave it. A repeat gets [`Error::AnswerNotKept`], never a second run.
    NotKept(T),
}

impl<T> Kept<T> {
    /// The JSON to write (`None`: completed, answer not kept) and the value
    /// the first call returns.
    pub(crate) fn split(self) -> (Option<String>, T) {
        match self {
            Kept::Answer(json, value) => (Some(json), value),
            Kept::NotKept(value) => (None, value),
        }
    }
}

/// [`encode`] then [`fit`], within the limit `limit` gives for the answer's
/// length: the answer kept, or (logged and counted) not kept.
pub(crate) async fn keep<T: Replayable, L: Future<Output = usize>>(
    p: &Prepared,
    value: T,
    limit: impl FnOnce(usize) -> L,
) -> Kept<T> {
    let json = match encode(&value) {
        Ok(json) => json,
        Err(e) => {
            p.answer_not_kept(format_args!("it does not serialize: {e}"));
            return Kept::NotKept(value);
        }
    };
    let max = limit(json.len()).await;
    match fit(&value, json, max) {
        Ok((json, back)) => Kept::Answer(json, back),
        Err(e) => {
            p.answer_not_kept(&e);
            Kept::NotKept(value)
        }
    }
}

/// Answers up to this long in the caller's transaction are not checked
/// against the server's limit (on MySQL, asking costs a round trip): it is below every store's default
/// (MySQL's `max_allowed_packet` is 4 MiB to 64 MiB by version). On a
/// server configured below it, the write fails instead: in the caller's
/// transaction its connection is dropped and everything rolls back; a lease
/// store's completion then writes the record without its answer.
pub(crate) const SURE_FIT: usize = 64 * 1024;

/// Decode a stored first answer for a repeat, and report the replay.
pub(crate) fn replayed<T: Replayable>(p: &Prepared, json: &str) -> Result<T, Error> {
    let value = serde_json::from_str(json).map_err(|source| Error::Response {
        scope: p.scope.to_string(),
        action: "replayed",
        source,
    })?;
    p.report(Outcome::Replayed);
    Ok(value)
}

pub(crate) async fn discard<DB: SqlBackend>(conn: &mut DB::Connection, p: &Prepared) {
    // If this fails the transaction is unusable (PostgreSQL aborts it after a
    // failed statement; a lost connection cannot commit): the record cannot
    // be committed either, so the body's error is the one to return.
    match DB::discard(conn, &p.stored_scope, p.key.as_str()).await {
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
