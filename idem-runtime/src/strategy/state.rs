//! `strategy = "state"` and `"dedup+state"`: move an entity's status with a
//! compare-and-set in the caller's transaction.
//!
//! `UPDATE <table> SET <status> = to WHERE <key> = ? AND <status> IN (from...)`:
//! one row changed means this call made the transition and the body runs (the
//! body is where side effects live: they hang off the transition). No row
//! changed: the status is read; already the target is a repeat (a silent
//! success), no row is `NotFound`, anything else is `IllegalTransition`.
//!
//! `dedup+state` adds the dedup record in the same transaction: the record
//! replays the first answer, the transition stops a repeat whose record is
//! gone. Either line of defence alone keeps the call idempotent.

use std::time::Duration;

use crate::guard::{Guard, Prepared};
use crate::precheck::PrecheckStore;
use crate::record::{Outcome, report};
use crate::sql::{Cas, Conn, ReadMode, SqlBackend, classify_state};
use crate::state::{SilentRepeat, StateCode, StoredState, Transition};
use crate::strategy::dedup::{
    Claim, Claimed, MAX_ATTEMPTS, Ticket, claim_record, discard, judge, prechecked, require_transaction,
};
use crate::{Error, Replayable};

/// A transition this call made: undone if the body fails.
pub(crate) struct Moved {
    transition: &'static Transition,
    /// The source state the entity was in (a transition may list several).
    from: usize,
}

/// What the compare-and-set decided.
enum Step {
    /// This call moved the entity from this source state.
    Moved(usize),
    /// The entity is already in the target state.
    Repeat,
}

impl Guard {
    /// `strategy = "state"`: make the transition in the caller's transaction.
    pub async fn state<T: SilentRepeat, DB: SqlBackend>(
        self,
        conn: Conn<'_, DB>,
        transition: &'static Transition,
    ) -> Result<Claim<T>, Error> {
        let p = self.prepare()?;
        let conn = conn.0;
        require_transaction::<DB>(conn, &p)?;
        match move_entity::<DB>(conn, &p, transition, None).await? {
            Step::Moved(from) => {
                Ok(Claim::Run(Ticket { prepared: p, record: false, moved: Some(Moved { transition, from }) }))
            }
            Step::Repeat => Ok(Claim::Replay(silent_repeat(&p))),
        }
    }

    /// `strategy = "dedup+state"`: claim the dedup record and make the
    /// transition, in the caller's transaction (one statement on PostgreSQL
    /// when the transition has one source state).
    pub async fn dedup_state<T: Replayable + SilentRepeat, DB: SqlBackend>(
        self,
        conn: Conn<'_, DB>,
        transition: &'static Transition,
    ) -> Result<Claim<T>, Error> {
        self.dedup_state_with(conn, transition, None).await
    }

    /// `dedup+state` with `precheck`: a seen key whose completed record is
    /// there replays before the claim and the transition.
    pub async fn dedup_state_prechecked<T: Replayable + SilentRepeat, DB: SqlBackend>(
        self,
        conn: Conn<'_, DB>,
        transition: &'static Transition,
        precheck: &dyn PrecheckStore,
        ttl: Duration,
    ) -> Result<Claim<T>, Error> {
        self.dedup_state_with(conn, transition, Some((precheck, ttl))).await
    }

    async fn dedup_state_with<T: Replayable + SilentRepeat, DB: SqlBackend>(
        self,
        conn: Conn<'_, DB>,
        transition: &'static Transition,
        precheck: Option<(&dyn PrecheckStore, Duration)>,
    ) -> Result<Claim<T>, Error> {
        let p = self.prepare()?;
        let conn = conn.0;
        require_transaction::<DB>(conn, &p)?;
        if let Some(replay) = prechecked::<T, DB>(conn, &p, precheck).await? {
            return Ok(Claim::Replay(replay));
        }
        let states = transition.states;
        let single = (transition.from.len() == 1).then(|| states.codes[transition.source_indexes().next().unwrap()]);
        let from = single.map(|c| [c]);
        let cas =
            from.as_ref().map(|from| Cas { states, from, to: states.codes[transition.to_index()], key: &p.entity });
        // One source: claim and transition together. Several: claim first,
        // then read the status under a row lock to learn which source it is in.
        let tried = match claim_record::<DB>(conn, &p, cas.as_ref()).await? {
            Claimed::Existing(existing) => return judge(&p, existing).map(Claim::Replay),
            Claimed::Fresh { moved } => cas.as_ref().map(|_| moved),
        };
        match move_entity::<DB>(conn, &p, transition, tried).await {
            Ok(Step::Moved(from)) => {
                Ok(Claim::Run(Ticket { prepared: p, record: true, moved: Some(Moved { transition, from }) }))
            }
            // The record just claimed belongs to no first answer: remove it.
            Ok(Step::Repeat) => {
                discard::<DB>(conn, &p).await;
                Ok(Claim::Replay(silent_repeat(&p)))
            }
            Err(e) => {
                discard::<DB>(conn, &p).await;
                Err(e)
            }
        }
    }
}

fn silent_repeat<T: SilentRepeat>(p: &Prepared) -> T {
    report(p.spec.scope, &p.key, Outcome::Replayed);
    T::silent_repeat()
}

/// Make the transition, or find out why it cannot be made. `tried` is the
/// row count of a compare-and-set already sent (`dedup+state` sends it with
/// the claim).
async fn move_entity<DB: SqlBackend>(
    conn: &mut DB::Connection,
    p: &Prepared,
    t: &'static Transition,
    mut tried: Option<u64>,
) -> Result<Step, Error> {
    let states = t.states;
    let to = states.codes[t.to_index()];
    let sources: Vec<usize> = t.source_indexes().collect();
    let all_from: Vec<StateCode> = sources.iter().map(|&i| states.codes[i]).collect();
    for _ in 0..MAX_ATTEMPTS {
        let source = if let [only] = sources.as_slice() {
            // One source: the compare-and-set first (the common case costs
            // one statement), the status only when it changed nothing.
            let cas = Cas { states, from: &all_from, to, key: &p.entity };
            let rows = match tried.take() {
                Some(rows) => rows,
                None => DB::transition(conn, &cas).await.map_err(classify_state::<DB>(states))?,
            };
            if rows > 0 {
                return moved_rows(p, t, rows, *only);
            }
            match decide(
                p,
                t,
                DB::TEXT_IGNORES_CASE,
                DB::read_state(conn, &cas, ReadMode::Latest).await.map_err(classify_state::<DB>(states))?,
            )? {
                Decision::Repeat => return Ok(Step::Repeat),
                // It was moved back to the source since: try again.
                Decision::Source(_) => continue,
            }
        } else {
            // Several sources: read the status under a row lock first, so the
            // move (and an undo, should the body fail) knows which one it was.
            let cas = Cas { states, from: &all_from, to, key: &p.entity };
            match decide(
                p,
                t,
                DB::TEXT_IGNORES_CASE,
                DB::read_state(conn, &cas, ReadMode::ForUpdate).await.map_err(classify_state::<DB>(states))?,
            )? {
                Decision::Repeat => return Ok(Step::Repeat),
                Decision::Source(i) => i,
            }
        };
        let from = [states.codes[source]];
        let cas = Cas { states, from: &from, to, key: &p.entity };
        let rows = DB::transition(conn, &cas).await.map_err(classify_state::<DB>(states))?;
        if rows > 0 {
            return moved_rows(p, t, rows, source);
        }
    }
    // Every attempt found a source state and moved nothing: the row kept
    // moving under us, or its text matched a source only ignoring case and
    // the column compares exactly (a `_bin` collation on MySQL). Read it once
    // more, exactly: the second is no state, and an error says so.
    let cas = Cas { states, from: &all_from, to, key: &p.entity };
    match decide(
        p,
        t,
        false,
        DB::read_state(conn, &cas, ReadMode::Latest).await.map_err(classify_state::<DB>(states))?,
    )? {
        Decision::Repeat => Ok(Step::Repeat),
        Decision::Source(_) => Err(p.in_progress(Some(std::time::Duration::ZERO))),
    }
}

fn moved_rows(p: &Prepared, t: &Transition, rows: u64, from: usize) -> Result<Step, Error> {
    if rows == 1 {
        return Ok(Step::Moved(from));
    }
    // The caller's transaction must not commit this: the error says so.
    Err(Error::Database(sqlx::Error::Protocol(format!(
        "the transition {} -> {} of scope `{}` changed {rows} rows of `{}`: its key column(s) {:?} must be unique \
         (a primary key or a unique index); roll the transaction back",
        t.qualified_from(),
        t.qualified(t.to_index()),
        p.spec.scope,
        t.states.table,
        t.states.key_columns,
    ))))
}

enum Decision {
    Repeat,
    Source(usize),
}

/// The entity's current status decides: the target is a repeat, a source
/// state can be moved, no row is `NotFound`, anything else is illegal.
fn decide(p: &Prepared, t: &Transition, ignore_case: bool, current: Option<StoredState>) -> Result<Decision, Error> {
    let Some(current) = current else {
        return Err(Error::NotFound { scope: p.spec.scope.to_owned(), key_hash: p.key.hash() });
    };
    let states = t.states;
    let to = t.to_index();
    let variant = if ignore_case { states.variant_of(&current) } else { states.variant_exact(&current) };
    match variant {
        Some(v) if v == to => return Ok(Decision::Repeat),
        Some(v) if t.source_indexes().any(|f| f == v) => return Ok(Decision::Source(v)),
        _ => {}
    }
    let current = match variant {
        Some(v) => t.qualified(v),
        None => format!("{current} (no variant of {} is stored so)", states.name),
    };
    let (from, to) = (t.qualified_from(), t.qualified(to));
    report(p.spec.scope, &p.key, Outcome::Rejected);
    tracing::error!(target: "idem", scope = p.spec.scope, key = %p.key.hash(), %from, %to, %current,
        "illegal state transition refused");
    Err(Error::IllegalTransition { scope: p.spec.scope.to_owned(), key_hash: p.key.hash(), from, to, current })
}

/// The body failed: put the entity back where this call found it, so the
/// transition does not survive even if the caller commits anyway.
pub(crate) async fn revert<DB: SqlBackend>(conn: &mut DB::Connection, p: &Prepared, moved: &Moved) {
    let states = moved.transition.states;
    let from = [states.codes[moved.transition.to_index()]];
    let cas = Cas { states, from: &from, to: states.codes[moved.from], key: &p.entity };
    // As with a record's removal: if this fails the transaction cannot commit.
    if let Err(e) = DB::transition(conn, &cas).await {
        tracing::debug!(target: "idem", scope = p.spec.scope, key = %p.key.hash(), error = %e,
            "transition not undone after the body failed; the transaction cannot commit it");
    }
}
