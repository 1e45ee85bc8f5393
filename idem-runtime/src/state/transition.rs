//! An entity's status moved by compare-and-set in the caller's transaction
//! (the `state` strategies): the move, why it cannot be made, and its undo.

use crate::dedup::context::MAX_ATTEMPTS;
use crate::error::Error;
use crate::guard::Prepared;
use crate::machine::Cas;
use crate::state::sql::{read_state, transition};
use crate::state::{SilentRepeat, StateCode, StoredState, Transition};
use crate::store::sql::{ReadMode, SqlBackend};
use crate::telemetry::Outcome;

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
    let entity = Entity::new(p, t);
    for _ in 0..MAX_ATTEMPTS {
        let source = if let [only] = entity.sources.as_slice() {
            // One source: the compare-and-set first (the common case costs
            // one statement), the status only when it changed nothing.
            let rows = match tried.take() {
                Some(rows) => rows,
                None => entity.transition::<DB>(conn, &entity.all_from).await?,
            };
            if rows > 0 {
                return moved_rows(p, t, rows, *only);
            }
            match entity.decide::<DB>(conn, ReadMode::Latest, DB::TEXT_IGNORES_CASE).await? {
                Decision::Repeat => return Ok(Step::Repeat),
                // It was moved back to the source since: try again.
                Decision::Source(_) => continue,
            }
        } else {
            // Several sources: read the status under a row lock first, so the
            // move (and an undo, should the body fail) knows which one it was.
            match entity.decide::<DB>(conn, ReadMode::ForUpdate, DB::TEXT_IGNORES_CASE).await? {
                Decision::Repeat => return Ok(Step::Repeat),
                Decision::Source(i) => i,
            }
        };
        let rows = entity.transition::<DB>(conn, &[t.states.codes[source]]).await?;
        if rows > 0 {
            return moved_rows(p, t, rows, source);
        }
    }
    // Every attempt found a source state and moved nothing: the row kept
    // moving under us, or its text matched a source only ignoring case and
    // the column compares exactly (a `_bin` collation on MySQL). Read it once
    // more, exactly: the second is no state, and an error says so.
    match entity.decide::<DB>(conn, ReadMode::Latest, false).await? {
        Decision::Repeat => Ok(Step::Repeat),
        Decision::Source(_) => Err(p.in_progress(Some(std::time::Duration::ZERO))),
    }
}

/// The entity a transition moves, with the states it may move from: what
/// each statement of [`move_entity`] names.
struct Entity<'a> {
    p: &'a Prepared,
    t: &'static Transition,
    /// The indexes of the transition's source states.
    sources: Vec<usize>,
    /// Their stored codes, in the same order.
    all_from: Vec<StateCode>,
}

impl<'a> Entity<'a> {
    fn new(p: &'a Prepared, t: &'static Transition) -> Self {
        let sources: Vec<usize> = t.source_indexes().collect();
        let all_from = sources.iter().map(|&i| t.states.codes[i]).collect();
        Entity { p, t, sources, all_from }
    }

    fn cas<'c>(&'c self, from: &'c [StateCode]) -> Cas<'c> {
        let states = self.t.states;
        Cas { states, from, to: states.codes[self.t.to_index()], key: &self.p.entity }
    }

    /// The compare-and-set from any of `from`: the rows it moved.
    async fn transition<DB: SqlBackend>(&self, conn: &mut DB::Connection, from: &[StateCode]) -> Result<u64, Error> {
        transition::<DB>(conn, &self.cas(from)).await
    }

    /// Read the entity's status with `mode` and [`decide`] by it.
    async fn decide<DB: SqlBackend>(
        &self,
        conn: &mut DB::Connection,
        mode: ReadMode,
        ignore_case: bool,
    ) -> Result<Decision, Error> {
        let cas = self.cas(&self.all_from);
        let current = read_state::<DB>(conn, &cas, mode).await?;
        decide(self.p, self.t, ignore_case, current)
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
