//! An entity's status moved by compare-and-set in the caller's transaction
//! (the `state` strategies): the move, why it cannot be made, and its undo.

use crate::dedup::context::MAX_ATTEMPTS;
use crate::error::Error;
use crate::guard::Prepared;
use crate::state::{SilentRepeat, StateCode, StoredState, Transition};
use crate::store::sql::{Cas, ReadMode, SqlBackend, classify_state};
use crate::telemetry::Outcome;

/// A transition this call made: undone if the body fails.
#[derive(Debug)]
pub(crate) struct Moved {
    pub(crate) transition: &'static Transition,
    /// The source state the entity was in (a transition may list several).
    pub(crate) from: usize,
}

/// What the compare-and-set decided.
pub(crate) enum Step {
    /// This call moved the entity from this source state.
    Moved(usize),
    /// The entity is already in the target state.
    Repeat,
}

pub(crate) fn silent_repeat<T: SilentRepeat>(p: &Prepared) -> T {
    p.report(Outcome::Replayed);
    T::silent_repeat()
}

/// Make the transition, or find out why it cannot be made. `tried` is the
/// row count of a compare-and-set already sent (`dedup+state` sends it with
/// the claim).
pub(crate) async fn move_entity<DB: SqlBackend>(
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
    Err(Error::StateTable {
        name: t.states.name,
        table: t.states.table,
        reason: format!(
            "the transition {} -> {} of scope `{}` changed {rows} rows: its key column(s) {:?} must be unique (a \
             primary key or a unique index)",
            t.qualified_from(),
            t.qualified(t.to_index()),
            &p.scope,
            t.states.key_columns,
        ),
    })
}

enum Decision {
    Repeat,
    Source(usize),
}

/// The entity's current status decides: the target is a repeat, a source
/// state can be moved, no row is `NotFound`, anything else is illegal.
fn decide(p: &Prepared, t: &Transition, ignore_case: bool, current: Option<StoredState>) -> Result<Decision, Error> {
    let Some(current) = current else {
        return Err(Error::NotFound { scope: p.scope.to_string(), key_hash: p.key.hash() });
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
    p.report(Outcome::Rejected);
    crate::telemetry::metrics::illegal_transition(&p.scope, p.store);
    tracing::error!(target: "idem", scope = %p.scope, key = %p.key.hash(), %from, %to, %current,
        "illegal state transition refused");
    Err(Error::IllegalTransition { scope: p.scope.to_string(), key_hash: p.key.hash(), from, to, current })
}

/// The body failed: put the entity back where this call found it, so the
/// transition does not survive even if the caller commits anyway.
pub(crate) async fn revert<DB: SqlBackend>(conn: &mut DB::Connection, p: &Prepared, moved: &Moved) {
    let states = moved.transition.states;
    let from = [states.codes[moved.transition.to_index()]];
    let cas = Cas { states, from: &from, to: states.codes[moved.from], key: &p.entity };
    // As with a record's removal: if this fails the transaction cannot commit.
    if let Err(e) = DB::transition(conn, &cas).await {
        tracing::debug!(target: "idem", scope = %p.scope, key = %p.key.hash(), error = %e,
            "transition not undone after the body failed; the transaction cannot commit it");
    }
}

/// The guard's key selects one entity: one part per key column.
pub(crate) fn check_key(t: &Transition, p: &Prepared) -> Result<(), Error> {
    let columns = t.states.key_columns.len();
    if p.entity.len() == columns {
        return Ok(());
    }
    Err(Error::InvalidKey {
        scope: p.scope.to_string(),
        reason: format!(
            "a state guard on {} needs one entity key part per key column ({:?}), added with \
             `Guard::entity_key`; it has {}",
            t.states.name,
            t.states.key_columns,
            p.entity.len()
        ),
    })
}
