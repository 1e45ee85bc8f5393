//! Not a stable API: the items generated code names (see the crate root).

use crate::error::Error;
use crate::guard::{Claim, GuardError};

#[cfg(feature = "sql")]
pub use crate::dedup::context::connection;
pub use crate::state::Transition;
// `Conn` is what `connection` returns: named here (a hidden path), the
// compiler's "other types implement `TxContext`" help leaves it out.
#[cfg(feature = "sql")]
pub use crate::dedup::context::Conn;
pub use crate::stores::{installed_lease, installed_lock, installed_precheck, installed_token};
pub use crate::token::OnStoreError;
pub use crate::token::guard::token_param;

/// The store named by `store = "..."` of a token guard.
pub fn token_store<S: crate::token::TokenStore>(store: &S) -> &dyn crate::token::TokenStore {
    store
}

/// The store named by `store = "..."` of a precheck.
pub fn precheck_store<S: crate::precheck::PrecheckStore>(store: &S) -> &dyn crate::precheck::PrecheckStore {
    store
}

/// The store named by `store = "..."` of a lock guard.
pub fn lock_store<S: crate::lock::LockStore>(store: &S) -> &dyn crate::lock::LockStore {
    store
}

/// The store named by `store = "..."`, as the guard takes it.
pub fn lease_store<S: crate::lease::LeaseStore>(store: &S) -> &dyn crate::lease::LeaseStore {
    store
}
pub use std::time::Duration;

/// A ticket whose call's outbox handle `outbox = "..."` binds: a
/// transaction's ticket, with the feature `outbox`.
#[cfg(feature = "sql")]
#[diagnostic::on_unimplemented(
    message = "`outbox = \"...\"` needs idem's cargo feature `outbox`",
    label = "the outbox handle of this call",
    note = "add the feature to idem-guard in Cargo.toml: `features = [\"outbox\"]`"
)]
pub trait OutboxTicket {
    /// The handle.
    type Handle;
    /// The call's handle.
    fn outbox_handle(&self) -> Self::Handle;
}

#[cfg(feature = "outbox")]
impl<DB: crate::store::sql::SqlBackend> OutboxTicket for crate::dedup::ticket::Ticket<DB> {
    type Handle = crate::outbox::Outbox;
    fn outbox_handle(&self) -> crate::outbox::Outbox {
        self.outbox()
    }
}

/// `outbox = "name"`: the call's outbox handle.
#[cfg(feature = "sql")]
pub fn outbox<T: OutboxTicket>(ticket: &T) -> T::Handle {
    ticket.outbox_handle()
}

/// Turn a claim into the function's own result: a replay is `Ok`, a guard
/// failure converts into the function's error type.
pub fn settle<T, R, E: GuardError>(claim: Result<Claim<T, R>, Error>) -> Result<T, E> {
    match claim {
        Ok(Claim::Replay(value)) => Ok(value),
        Ok(Claim::Run(_)) => unreachable!("generated code handles Claim::Run before settling"),
        Err(e) => Err(e.into()),
    }
}

/// `unique`: the replay function's answer must be the guarded function's.
#[diagnostic::on_unimplemented(
    message = "the replay function answers `{Self}`, but the guarded function returns `{R}`",
    label = "the replay function's answer",
    note = "a duplicate gets the replay function's answer in place of the body's: give it the guarded function's return type"
)]
pub trait ReplayAnswer<R> {
    /// The answer, as the guarded function's.
    fn into_answer(self) -> R;
}

impl<R> ReplayAnswer<R> for R {
    fn into_answer(self) -> R {
        self
    }
}

/// `unique`: the replay function's answer, checked to be the function's.
pub fn replay_answer<R, A: ReplayAnswer<R>>(answer: A) -> R {
    answer.into_answer()
}
