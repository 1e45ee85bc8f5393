//! `strategy = "dedup"`: a record written in the caller's transaction.
//!
//! claim (INSERT, never failing the transaction) -> body -> response stored in
//! the same transaction. The record commits or rolls back with the business
//! change; a concurrent duplicate waits on the record's row lock and then
//! replays (or claims, if the first call rolled back).

use crate::guard::{Guard, GuardError, Prepared};
use crate::precheck::{PrecheckStore, Sight, confirmed as precheck_confirmed, look};
use crate::record::{Outcome, RecordStatus, report};
use crate::sql::{
    Cas, ClaimResult, Conn, ExistingRecord, InsertDone, SqlBackend, classify, classify_state, in_transaction,
};
use crate::strategy::state::{Moved, revert};
use crate::{Error, Replayable};

/// What a claim decided.
#[doc(hidden)]
pub enum Claim<T, R = Ticket> {
    /// A repeat of a completed call: return this, do not run the body.
    Replay(T),
    /// First call: run the body, then complete the ticket.
    Run(R),
}

/// The right to run the body once; completing it stores the response (when
/// a record was claimed) or settles the state change.
#[doc(hidden)]
#[must_use = "a claimed record must be completed with the body's result"]
pub struct Ticket {
    pub(crate) prepared: Prepared,
    /// A dedup record was claimed (or, with `claim = "after"`, will be written).
    pub(crate) record: bool,
    /// The state change this call made, undone if the body fails.
    pub(crate) moved: Option<Moved>,
}

/// Claims can loop when a record disappears between statements (its
/// transaction rolled back, or it expired and was purged). Bounded.
pub(crate) const MAX_ATTEMPTS: usize = 5;

impl Guard {
    /// Claim the key in the caller's transaction.
    pub async fn dedup<T: Replayable, DB: SqlBackend>(self, conn: Conn<'_, DB>) -> Result<Claim<T>, Error> {
        let p = self.prepare()?;
        let conn = conn.0;
        require_transaction::<DB>(conn, &p)?;
        dedup_prepared::<T, DB>(conn, p).await
    }

    /// `dedup` with `precheck`: a "seen" marker first; a seen key whose
    /// completed record is there replays without the claim.
    pub async fn dedup_prechecked<T: Replayable, DB: SqlBackend>(
        self,
        conn: Conn<'_, DB>,
        store: &dyn PrecheckStore,
        ttl: std::time::Duration,
    ) -> Result<Claim<T>, Error> {
        let p = self.prepare()?;
        let conn = conn.0;
        require_transaction::<DB>(conn, &p)?;
        if let Some(replay) = prechecked::<T, DB>(conn, &p, Some((store, ttl))).await? {
            return Ok(Claim::Replay(replay));
        }
        dedup_prepared::<T, DB>(conn, p).await
    }
}

/// `precheck`: a "seen" marker first; a seen key whose completed record is
/// there replays from a plain read (SQLite: taking the write lock first),
/// before any claim, token or state change. `None`: go on and claim.
pub(crate) async fn prechecked<T: Replayable, DB: SqlBackend>(
    conn: &mut DB::Connection,
    p: &Prepared,
    precheck: Option<(&dyn PrecheckStore, std::time::Duration)>,
) -> Result<Option<T>, Error> {
    let Some((store, ttl)) = precheck else { return Ok(None) };
    if let Sight::Seen = look(store, &p.stored_scope, p.key.as_str(), ttl, p.spec.scope).await? {
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

async fn dedup_prepared<T: Replayable, DB: SqlBackend>(
    conn: &mut DB::Connection,
    p: Prepared,
) -> Result<Claim<T>, Error> {
    if p.spec.claim_after {
        // Nothing to do before the body: the record is written with its
        // response in `Ticket::complete`.
        return Ok(Claim::Run(Ticket { prepared: p, record: true, moved: None }));
    }
    match claim_record::<DB>(conn, &p, None).await? {
        Claimed::Fresh { .. } => Ok(Claim::Run(Ticket { prepared: p, record: true, moved: None })),
        Claimed::Existing(existing) => judge(&p, existing).map(Claim::Replay),
    }
}

pub(crate) fn require_transaction<DB: SqlBackend>(conn: &DB::Connection, p: &Prepared) -> Result<(), Error> {
    if in_transaction::<DB>(conn) { Ok(()) } else { Err(Error::NoTransaction { scope: p.spec.scope.to_owned() }) }
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
    p: &Prepared,
    cas: Option<&Cas<'_>>,
) -> Result<Claimed, Error> {
    let record = p.record();
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

/// A committed record exists: decide between replay, mismatch and in-progress.
pub(crate) fn judge<T: Replayable>(p: &Prepared, existing: ExistingRecord) -> Result<T, Error> {
    p.check_fingerprint(existing.fingerprint.as_deref())?;
    match RecordStatus::parse(&existing.status) {
        Some(RecordStatus::Done) => replayed(p, existing.response.as_deref().unwrap_or("null")),
        // A committed PROCESSING record in dedup mode means the guarded future
        // was dropped mid-body and the caller committed anyway: whether the
        // effect happened is unknown, so never run it again silently, and do
        // not call it retryable (it would stay so for the whole retention).
        _ => Err(p.unfinished()),
    }
}

impl Ticket {
    /// Store the body's `Ok` value, or remove the record when the body failed,
    /// so that no record survives an `Err` even if the caller commits. The
    /// outer `Err` is a guard failure; [`finish`] turns both into the
    /// function's result.
    pub async fn complete<T: Replayable, E, DB: SqlBackend>(
        self,
        conn: Conn<'_, DB>,
        result: Result<T, E>,
    ) -> Result<Result<T, E>, Error> {
        let Ticket { prepared: p, record, moved } = self;
        let conn = conn.0;
        let value = match result {
            Ok(value) => value,
            Err(e) if p.spec.claim_after => return failed_after::<T, E, DB>(conn, &p, e).await,
            Err(e) => {
                undo::<DB>(conn, &p, record, moved.as_ref()).await;
                return Ok(Err(e));
            }
        };
        if !record {
            // `state`: the transition is the whole guard; nothing to store.
            report(p.spec.scope, &p.key, Outcome::Executed);
            return Ok(Ok(value));
        }
        let json = match stored_response(&value, DB::MAX_RESPONSE) {
            Ok(json) => json,
            Err(source) => {
                if !p.spec.claim_after {
                    undo::<DB>(conn, &p, record, moved.as_ref()).await;
                }
                return Err(Error::Response { scope: p.spec.scope.to_owned(), action: "stored", source });
            }
        };
        if p.spec.claim_after {
            return complete_after::<T, E, DB>(conn, &p, value, &json).await;
        }
        match DB::complete(conn, &p.stored_scope, p.key.as_str(), &json).await {
            Ok(1) => {
                report(p.spec.scope, &p.key, Outcome::Executed);
                Ok(Ok(value))
            }
            Ok(_) => Err(Error::Database(sqlx::Error::Protocol(format!(
                "the dedup record of scope `{}` vanished inside its own transaction",
                p.spec.scope
            )))),
            Err(e) => Err(classify::<DB>(e)),
        }
    }
}

/// `claim = "after"`: the body already ran in the caller's transaction; write
/// the record with its response in one statement. If a live record is there,
/// this call was a repeat: roll the transaction back to its start (the body's
/// writes go with it), continue in a fresh one, and replay the first answer.
async fn complete_after<T: Replayable, E, DB: SqlBackend>(
    conn: &mut DB::Connection,
    p: &Prepared,
    value: T,
    json: &str,
) -> Result<Result<T, E>, Error> {
    match DB::insert_done(conn, &p.record(), json).await.map_err(classify::<DB>)? {
        InsertDone::Written => {
            report(p.spec.scope, &p.key, Outcome::Executed);
            Ok(Ok(value))
        }
        InsertDone::Conflict => replay_after_restart::<T, E, DB>(conn, p).await?.ok_or_else(|| vanished(p)),
    }
}

/// `claim = "after"` and the body failed. On a repeat that is common: the
/// body's own insert hits its own unique key (`orders.trade_no`) before the
/// guard's record is reached. Answering that with an error would make a
/// gateway retry forever, so look for a live record first (in a fresh
/// transaction: the failed one may be aborted) and replay it if there is one.
async fn failed_after<T: Replayable, E, DB: SqlBackend>(
    conn: &mut DB::Connection,
    p: &Prepared,
    error: E,
) -> Result<Result<T, E>, Error> {
    Ok(match replay_after_restart::<T, E, DB>(conn, p).await? {
        Some(replay) => replay,
        None => Err(error),
    })
}

/// Roll the transaction back to its start, then read the record in the fresh
/// one. The read comes after the restart on purpose: a record written earlier
/// in this same transaction (the guarded call was not the transaction's first
/// work) is gone now, and must not be replayed as if it had committed.
async fn replay_after_restart<T: Replayable, E, DB: SqlBackend>(
    conn: &mut DB::Connection,
    p: &Prepared,
) -> Result<Option<Result<T, E>>, Error> {
    DB::restart(conn).await.map_err(classify::<DB>)?;
    match DB::read(conn, &p.stored_scope, p.key.as_str()).await.map_err(classify::<DB>)? {
        // Expired: another caller's take-over won, or is about to; retry.
        Some(existing) if existing.expired => Err(p.in_progress(Some(std::time::Duration::ZERO))),
        Some(existing) => judge(p, existing).map(|v| Some(Ok(v))),
        None => Ok(None),
    }
}

/// The record a `claim = "after"` insert conflicted with is gone after the
/// restart: it was written earlier in this same transaction (then rolled back
/// with it), or its own transaction rolled back. Either way nothing may be
/// replayed; the caller retries from the start.
fn vanished(p: &Prepared) -> Error {
    tracing::warn!(target: "idem", scope = p.spec.scope,
        "claim = \"after\" conflicted with a record that is gone after the restart; was the key used \
         earlier in the same transaction? claim = \"after\" must be the first work of its transaction");
    p.in_progress(Some(std::time::Duration::ZERO))
}

/// The JSON to store, after checking it decodes back into `T` and holds no
/// `Some` that would come back as `None`: a value JSON cannot carry
/// (`f64::NAN` becomes `null`, `Some(())` is written like `None`) fails the
/// first call, which rolls back, instead of failing or changing every repeat
/// later.
pub(crate) fn stored_response<T: Replayable>(value: &T, max: usize) -> Result<String, serde_json::Error> {
    use serde::ser::Error as _;
    let json = serde_json::to_string(value)?;
    if json.len() > max {
        return Err(serde_json::Error::custom(format_args!(
            "its JSON is {} bytes, more than the {max} the store's response column holds; return less (an id to \
             look the rest up by), or keep the records where responses may be larger",
            json.len()
        )));
    }
    let back = serde_json::from_str::<T>(&json)?;
    // Only JSON with a `null` in it can hide such a `Some`.
    if json.contains("null") {
        crate::exact::check(value, &back).map_err(serde_json::Error::custom)?;
    }
    Ok(json)
}

/// Decode a stored first answer for a repeat, and report the replay.
pub(crate) fn replayed<T: Replayable>(p: &Prepared, json: &str) -> Result<T, Error> {
    let value = serde_json::from_str(json).map_err(|source| Error::Response {
        scope: p.spec.scope.to_owned(),
        action: "replayed",
        source,
    })?;
    report(p.spec.scope, &p.key, Outcome::Replayed);
    Ok(value)
}

/// The body failed (or its answer cannot be stored): remove the record and
/// undo the transition, so nothing of this call survives even if the caller
/// commits anyway.
async fn undo<DB: SqlBackend>(conn: &mut DB::Connection, p: &Prepared, record: bool, moved: Option<&Moved>) {
    if let Some(moved) = moved {
        revert::<DB>(conn, p, moved).await;
    }
    if record {
        discard::<DB>(conn, p).await;
    }
}

pub(crate) async fn discard<DB: SqlBackend>(conn: &mut DB::Connection, p: &Prepared) {
    // If this fails the transaction is unusable (PostgreSQL aborts it after a
    // failed statement; a lost connection cannot commit): the record cannot
    // be committed either, so the body's error is the one to return.
    if let Err(e) = DB::discard(conn, &p.stored_scope, p.key.as_str()).await {
        tracing::debug!(target: "idem", scope = p.spec.scope, key = %p.key.hash(), error = %e,
            "dedup record not removed after the body failed; the transaction cannot commit it");
    }
}

/// Turn a claim into the function's own result: a replay is `Ok`, a guard
/// failure converts into the function's error type.
#[doc(hidden)]
pub fn settle<T, R, E: GuardError>(claim: Result<Claim<T, R>, Error>) -> Result<T, E> {
    match claim {
        Ok(Claim::Replay(value)) => Ok(value),
        Ok(Claim::Run(_)) => unreachable!("generated code handles Claim::Run before settling"),
        Err(e) => Err(e.into()),
    }
}

/// Turn a completion into the function's own result.
#[doc(hidden)]
pub fn finish<T, E: GuardError>(completed: Result<Result<T, E>, Error>) -> Result<T, E> {
    completed.unwrap_or_else(|e| Err(e.into()))
}
