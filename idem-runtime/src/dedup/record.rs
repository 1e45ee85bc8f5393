//! Operations on the dedup record in the caller's transaction, shared by
//! every strategy that keeps one (`dedup`, `dedup+state`, `token+dedup`,
//! and the lock strategies around them).

use crate::error::Error;
use crate::guard::Prepared;
use crate::precheck::{PrecheckStore, Sight, confirmed as precheck_confirmed, look};
use crate::record::RecordStatus;
use crate::replay::{Replayable, encode, fit};
use crate::store::sql::tx::TxCore;
use crate::store::sql::{
    Cas, ClaimResult, ExistingRecord, NewRecord, SqlBackend, TxContext, classify, classify_state, in_transaction,
};
use crate::telemetry::Outcome;

/// Claims can loop when a record disappears between statements (its
/// transaction rolled back, or it expired and was purged). Bounded.
pub(crate) const MAX_ATTEMPTS: usize = 5;

/// Deadlock victims among claims a guard sends again (see `claim_with_begin`).
const MAX_DEADLOCKS: u64 = 10;

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

pub(crate) fn require_transaction<DB: SqlBackend>(conn: &DB::Connection, p: &Prepared) -> Result<(), Error> {
    if in_transaction::<DB>(conn) { Ok(()) } else { Err(Error::NoTransaction { scope: p.scope.to_string() }) }
}

/// The connection of `tx` for a guard, with the bookkeeping of an
/// `idem::Tx` if it is one. An `idem::Tx` that has not begun stays so when
/// the guard's claim can ride on its `BEGIN` (`inline`: a claim of a dedup
/// record before the body, on a backend that sends texts); otherwise it is
/// begun here (and what it queued for `COMMIT` is sent first). Every other
/// transaction must be open.
pub(crate) async fn guard_context<'t, C: TxContext + ?Sized>(
    tx: &'t mut C,
    p: &Prepared,
    inline: bool,
) -> Result<(&'t mut <C::Db as sqlx::Database>::Connection, Option<&'t mut TxCore>), Error> {
    let (conn, mut core) = tx.tx_parts();
    let rides_on_begin =
        inline && <C::Db as crate::store::sql::RecordSql>::INLINE && core.as_ref().is_some_and(|c| c.is_deferred());
    if !rides_on_begin {
        if let Some(core) = core.as_deref_mut() {
            core.ready::<C::Db>(&mut *conn).await?;
        }
        require_transaction::<C::Db>(conn, p)?;
    }
    Ok((conn, core))
}

/// What [`claim_record`] found.
pub(crate) enum Claimed {
    /// This call inserted the record; with a transition, the rows it moved.
    Fresh { moved: u64 },
    /// A live record of an earlier call holds the key.
    Existing(ExistingRecord),
}

/// Insert the record (and, with `cas`, make the transition in the same step
/// if the insert won), or find the live record that holds the key.
pub(crate) async fn claim_record<DB: SqlBackend>(
    conn: &mut DB::Connection,
    core: Option<&mut TxCore>,
    p: &Prepared,
    cas: Option<&Cas<'_>>,
) -> Result<Claimed, Error> {
    let record = new_record(p);
    if let Some(core) = core.filter(|c| DB::INLINE && c.is_deferred()) {
        return claim_with_begin::<DB>(conn, core, p, &record, cas).await;
    }
    for _ in 0..MAX_ATTEMPTS {
        let (claim, moved) = match cas {
            None => (DB::claim(conn, &record).await.map_err(classify::<DB>)?, 0),
            Some(cas) => DB::claim_transition(conn, &record, cas).await.map_err(classify_state::<DB>(cas.states))?,
        };
        if claim == ClaimResult::Claimed {
            return Ok(Claimed::Fresh { moved });
        }
        let Some(existing) = DB::read(conn, record.scope, record.key).await.map_err(classify::<DB>)? else {
            continue; // the holder rolled back, or the record was purged: claim again
        };
        if existing.expired {
            // Past retention but not yet purged: the old answer no longer
            // counts. Remove it (only if still expired) and claim afresh.
            DB::discard_expired(conn, record.scope, record.key).await.map_err(classify::<DB>)?;
            continue;
        }
        return Ok(Claimed::Existing(existing));
    }
    Err(p.in_progress(None))
}

/// [`claim_record`] on an `idem::Tx` that has not begun: `BEGIN` and the
/// claim in one text. A repeat's claim fails on the unique key, which
/// stops the text; the failed block is rolled back and the record read in
/// one more round trip, and the `Tx` has still not begun. The transition
/// of `dedup+state` follows the claim as a statement of its own.
async fn claim_with_begin<DB: SqlBackend>(
    conn: &mut DB::Connection,
    core: &mut TxCore,
    p: &Prepared,
    record: &NewRecord<'_>,
    cas: Option<&Cas<'_>>,
) -> Result<Claimed, Error> {
    let (mut take_over, mut deadlocks) = (false, 0);
    let mut attempts = 0;
    while attempts < MAX_ATTEMPTS {
        attempts += 1;
        let claimed = match core.claim_with_begin::<DB>(conn, record, take_over).await {
            // InnoDB picks claims waiting on a record whose first call rolls
            // back as deadlock victims (1213). The claim was the first
            // statement of the Tx's own BEGIN: nothing of the caller's went
            // with the rollback, so it is sent again.
            Err(e) if e.is_deadlock() && core.is_deferred() && deadlocks < MAX_DEADLOCKS => {
                deadlocks += 1;
                attempts -= 1;
                tokio::time::sleep(std::time::Duration::from_millis(2 * deadlocks)).await;
                continue;
            }
            claimed => claimed?,
        };
        match claimed {
            None => {
                let Some(cas) = cas else { return Ok(Claimed::Fresh { moved: 0 }) };
                return match DB::transition(conn, cas).await {
                    Ok(moved) => Ok(Claimed::Fresh { moved }),
                    Err(e) => {
                        // Leave no PROCESSING record to a caller that commits anyway.
                        let _ = DB::discard(conn, record.scope, record.key).await;
                        Err(classify_state::<DB>(cas.states)(e))
                    }
                };
            }
            // The holder rolled back, or the record was purged: claim again.
            Some(None) => take_over = false,
            // Past retention but not yet purged: delete it (only if still
            // expired) in the text of the next claim.
            Some(Some(existing)) if existing.expired => take_over = true,
            Some(Some(existing)) => return Ok(Claimed::Existing(existing)),
        }
    }
    Err(p.in_progress(None))
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

/// The record a claim inserts for `p`.
pub(crate) fn new_record(p: &Prepared) -> NewRecord<'_> {
    NewRecord {
        scope: &p.stored_scope,
        key: p.key.as_str(),
        fingerprint: p.fingerprint.as_ref().map(|f| f.as_str()),
        retention: p.retention,
    }
}
