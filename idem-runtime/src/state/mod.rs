//! State machines: an entity's one-way status, moved by compare-and-set.
//!
//! `#[derive(idem::StateMachine)]` on a fieldless enum describes the status:
//! its variants, the transitions each allows, how each is stored, and where
//! (table, key column(s), status column). A guard with `strategy = "state"`
//! or `"dedup+state"` then moves one entity with
//! `UPDATE <table> SET <status> = <to> WHERE <key> = ? AND <status> IN (<from>...)`
//! in the caller's transaction.

#[cfg(feature = "sql")]
pub(crate) mod guard;
#[cfg(feature = "sql")]
pub(crate) mod sql;
#[cfg(feature = "sql")]
pub(crate) mod transition;

pub use crate::machine::{StateCode, StateTable, StoredState, Transition};

/// An entity status enum. Derive it with `#[derive(idem::StateMachine)]`
/// (the `idem` crate documents the attributes); the derive also generates an
/// inherent `const fn can_transition(from, to) -> bool`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a state machine idem can move",
    label = "this type does not derive `idem::StateMachine`",
    note = "add `#[derive(idem::StateMachine)]` to the status enum, with `#[state(table = \"...\", key_column = \"...\", status_column = \"...\")]` and each variant's `to(...)`"
)]
pub trait StateMachine {
    /// The variants, their codes, transitions and storage.
    const STATES: StateTable;
}

/// What a repeat of a state change returns when no first answer is stored.
///
/// `strategy = "state"` stores no response: a repeat (the entity is already
/// in the target state) returns `Ok(T::silent_repeat())` without running the
/// body. `dedup+state` replays the first answer from its record, and needs
/// this only when the record is gone (past retention) or the state was moved
/// by another path while the record never existed.
///
/// Implemented for `()` and for `Option<T>` (`None`: "nothing new"). Implement
/// it for an answer type of your own to say what a repeat returns.
#[diagnostic::on_unimplemented(
    message = "a repeated state change has no stored answer to return as `{Self}`",
    label = "a repeat (the entity is already in the target state) must return a value of this type",
    note = "return `Result<(), E>` or `Result<Option<{Self}>, E>` (a repeat gets `None`), or implement `idem::SilentRepeat` for `{Self}` to say what a repeat returns"
)]
pub trait SilentRepeat {
    /// The answer to a repeat whose first answer is not stored.
    fn silent_repeat() -> Self;
}

impl SilentRepeat for () {
    fn silent_repeat() {}
}

impl<T> SilentRepeat for Option<T> {
    fn silent_repeat() -> Self {
        None
    }
}
