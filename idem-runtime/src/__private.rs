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

/// Turn a claim into the function's own result: a replay is `Ok`, a guard
/// failure converts into the function's error type.
pub fn settle<T, R, E: GuardError>(claim: Result<Claim<T, R>, Error>) -> Result<T, E> {
    match claim {
        Ok(Claim::Replay(value)) => Ok(value),
        Ok(Claim::Run(_)) => unreachable!("generated code handles Claim::Run before settling"),
        Err(e) => Err(e.into()),
    }
}
