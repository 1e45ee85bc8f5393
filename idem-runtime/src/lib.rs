//! Runtime of [idem](https://docs.rs/idem-guard): guards, records and their
//! stores. Applications use it through the `idem-guard` crate (`use idem::...`),
//! which re-exports everything public here next to the `#[idempotent]`
//! attribute and documents it for users.
//!
//! Module map, one folder per concern:
//! - `guard`: [`Guard`], the entry point the attribute expands to; each
//!   strategy adds its method in its own folder;
//! - `dedup`, [`state`], [`token`], [`lease`] (with its renewal),
//!   [`lock`], [`precheck`]: one folder per strategy, holding what users
//!   call (`current()`, `issue()`, `acquire()`, `counters()`, state
//!   machines), its store trait (`store.rs`) and its guard method
//!   (`guard.rs`); `dedup` also holds the record's steps and the ticket the
//!   other in-transaction strategies share;
//! - [`store`]: the stores, one folder each (`memory`, `redis` with its Lua
//!   in `.lua` files, [`store::sql`]: PostgreSQL, MySQL/MariaDB and SQLite,
//!   and the SQL lease store), `routed`, and the record names of key-value
//!   stores (`keyspace`); a store implements the strategies' store traits
//!   and knows no strategy's logic;
//! - [`Stores`]: which stores guards use when they name none;
//! - `http`: the `Idempotency-Key` layer (feature `http`);
//! - [`error`], [`key`], [`record`]: the error type, key parts and
//!   fingerprints, a record as stores keep it; `replay`: what an answer
//!   must be to replay exactly ([`Replayable`]); [`telemetry`]: whether a
//!   call ran or replayed ([`observe`]), events and metrics; `canonical`:
//!   the one canonical JSON every fingerprint hashes. These leaves import
//!   nothing above them.

#![warn(missing_docs)]
// docs.rs builds with `--cfg docsrs` (see Cargo.toml): label items by the
// cargo feature they need.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod canonical;
#[cfg(feature = "sql")]
mod dedup;
pub mod error;
mod guard;
#[cfg(feature = "http")]
pub mod http;
pub mod key;
pub mod lease;
pub mod lock;
pub mod precheck;
pub mod record;
mod replay;
pub mod state;
pub mod store;
#[cfg(feature = "sql")]
pub use store::sql;
#[cfg(feature = "sql")]
pub use store::sql::admin;
mod stores;
pub mod telemetry;
pub mod token;
#[cfg(feature = "tx")]
mod tx;

#[cfg(feature = "sql")]
pub use dedup::context::TxContext;
#[cfg(feature = "sql")]
pub use dedup::ticket::Ticket;
pub use error::{Error, Result};
pub use guard::{Claim, DEFAULT_RETENTION, Guard, GuardError};
pub use key::{Fingerprint, IdempotencyKey, Key};
pub use lease::guard::LeaseTicket;
pub use lock::guard::LockTicket;
pub use record::{DedupRecord, RecordStatus};
pub use replay::Replayable;
#[cfg(feature = "sql")]
pub use sql::table::{RecordTable, record_table, set_record_table};
#[cfg(feature = "sql")]
pub use sql::{PurgeOptions, PurgeReport, SqlBackend, find_record, migrate, migrator, purge_expired};
pub use state::{SilentRepeat, StateMachine};
pub use store::MemoryStore;
#[cfg(feature = "redis")]
pub use store::RedisStore;
pub use stores::{Stores, StoresBuilder};
pub use telemetry::{Outcome, observe};
pub use token::guard::TokenTicket;
#[cfg(all(feature = "tx", feature = "mysql"))]
pub use tx::MySqlTx;
#[cfg(all(feature = "tx", feature = "postgres"))]
pub use tx::PgTx;
#[cfg(all(feature = "tx", feature = "sqlite"))]
pub use tx::SqliteTx;
#[cfg(feature = "tx")]
pub use tx::{Tx, begin, begin_with};

/// Not a stable API: the items generated code names. Reach them only through
/// `#[idempotent]`.
#[doc(hidden)]
pub mod __private;
