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
pub use store::sql;
pub use store::sql::admin;
mod stores;
mod strategy;
pub mod telemetry;
pub mod token;

pub use error::{Error, Result};
pub use guard::{Claim, DEFAULT_RETENTION, Guard, GuardError};
pub use key::{Fingerprint, IdempotencyKey, Key};
pub use record::{DedupRecord, RecordStatus};
pub use replay::Replayable;
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
pub use telemetry::{Outcome, observe};

/// Not a stable API: the items generated code names. Reach them only through
/// `#[idempotent]`.
#[doc(hidden)]
pub mod __private;
