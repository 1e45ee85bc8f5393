//! Runtime of [idem](https://docs.rs/idem-guard): guards, records and their
//! stores. Applications use it through the `idem-guard` crate (`use idem::...`),
//! which re-exports everything public here next to the `#[idempotent]`
//! attribute and documents it for users.
//!
//! Module map:
//! - `guard`: [`Guard`], the entry point the attribute expands to;
//!   `strategy`: one module per strategy over shared steps (the record,
//!   the transition, the ticket), each a method of `Guard`;
//! - [`store`]: the store traits and the stores, one module each:
//!   `store/memory`, `store/redis` (Lua in `.lua` files), [`store::sql`]
//!   (the dedup record in PostgreSQL, MySQL/MariaDB and SQLite, one file
//!   each, and the SQL lease store), `store/routed`, and the record names of
//!   key-value stores (`store/keyspace`);
//! - [`Stores`]: which stores guards use when they name none;
//! - [`lease`], [`token`], [`lock`], [`precheck`], [`state`]: what users call
//!   for each (`current()`, `issue()`, `acquire()`, `counters()`, state
//!   machines);
//! - [`error`], [`key`], [`record`]: the error type, key parts and
//!   fingerprints, and whether a call ran or replayed ([`observe`]);
//!   `canonical`: the one canonical JSON every fingerprint hashes.

#![warn(missing_docs)]
// docs.rs builds with `--cfg docsrs` (see Cargo.toml): label items by the
// cargo feature they need.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod canonical;
pub mod error;
mod exact;
mod guard;
#[cfg(feature = "http")]
pub mod http;
pub mod key;
pub mod lease;
pub mod lock;
pub mod metrics;
pub mod precheck;
pub mod record;
pub mod state;
pub mod store;
pub use store::sql;
pub use store::sql::admin;
mod stores;
mod strategy;
pub mod token;

pub use error::{Error, Result};
pub use guard::{Claim, DEFAULT_RETENTION, Guard, GuardError};
pub use key::{Fingerprint, IdempotencyKey, Key};
pub use record::{DedupRecord, Outcome, RecordStatus, observe};
pub use sql::table::{RecordTable, record_table, set_record_table};
#[cfg(feature = "mysql")]
pub use sql::tx::MySqlTx;
#[cfg(feature = "postgres")]
pub use sql::tx::PgTx;
#[cfg(feature = "sqlite")]
pub use sql::tx::SqliteTx;
pub use sql::tx::{Tx, begin, begin_with};
pub use sql::{PurgeOptions, PurgeReport, SqlBackend, TxContext, find_record, migrate, migrator, purge_expired};
pub use state::{SilentRepeat, StateMachine};
pub use store::MemoryStore;
#[cfg(feature = "redis")]
pub use store::RedisStore;
pub use stores::{Stores, StoresBuilder};
pub use strategy::lease::LeaseTicket;
pub use strategy::lock::LockTicket;
pub use strategy::ticket::Ticket;
pub use strategy::token::TokenTicket;

/// The `Ok` type of a guarded function: stored after the first call and
/// returned to every repeat, so it must survive a JSON round trip. `()`, `0`,
/// `false`, `""`, empty collections and `None` all replay exactly. The first
/// call checks that its answer decodes back, so a value JSON cannot carry
/// fails that call ([`Error::Response`]) instead of every repeat: `f64::NAN`,
/// and a `Some` around a value JSON writes as `null` (`Some(())`, `Some(None)`
/// of an `Option<Option<T>>`, `Some(Value::Null)`), which would replay as
/// `None`; use `bool` for `Option<()>` and an enum of your own for
/// three-valued answers. Serde shapes that decode into another variant
/// (an `#[serde(untagged)]` enum whose variants overlap) are not detected.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be replayed to a repeated call",
    label = "the first call's answer is stored and returned to every repeat",
    note = "derive `serde::Serialize` and `serde::Deserialize` on `{Self}` (or, in an `Option` or a `Vec`, on your type)"
)]
pub trait Replayable: serde::Serialize + serde::de::DeserializeOwned {}
// Not recommended: rustc then reports the one missing `Replayable` (with
// the fix above) instead of one error per serde trait the impl needs.
#[diagnostic::do_not_recommend]
impl<T: serde::Serialize + serde::de::DeserializeOwned> Replayable for T {}

/// Not a stable API: the items generated code names. Reach them only through
/// `#[idempotent]`.
#[doc(hidden)]
pub mod __private {
    pub use crate::state::Transition;
    pub use crate::store::sql::connection;
    pub use crate::stores::{installed_lease, installed_lock, installed_precheck, installed_token};
    pub use crate::strategy::ticket::{finish, settle};
    pub use crate::strategy::token::token_param;
    pub use crate::token::OnStoreError;

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
}
