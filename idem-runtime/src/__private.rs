//! Not a stable API: the items generated code names (see the crate root).

pub use crate::dedup::ticket::{finish, settle};
pub use crate::state::Transition;
// `Conn` is what `connection` returns: named here (a hidden path), the
// compiler's "other types implement `TxContext`" help leaves it out.
pub use crate::store::sql::{Conn, connection};
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
