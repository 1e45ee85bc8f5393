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
//!   (`guard.rs`); `dedup` also holds the caller's transaction as guards
//!   see it (`context.rs`, `sql::TxContext`), the record's steps and the
//!   ticket the other in-transaction strategies share, and `token+dedup`;
//!   everything SQL needs the `sql` feature (implied by each database);
//! - `tx`: `Tx` (feature `tx`), which overrides the transaction's steps
//!   to send the claim with `BEGIN` and the answer with `COMMIT`;
//! - [`store`]: the stores, one folder each (`memory`, `redis` with its Lua
//!   in `.lua` files, `etcd` with its transactions, `store/sql`: the SQL of each concern written once
//!   over a dialect per database (PostgreSQL, MySQL/MariaDB, SQLite), and
//!   the SQL lease store), `routed`, and the record names of key-value
//!   stores (`keyspace`); a store implements the strategies' store traits
//!   and knows no strategy's logic (the state machines' SQL is
//!   `state/sql.rs`). What users call of `store/sql` is listed by the
//!   root's `sql` and `admin` modules (and `migrate` at the root);
//! - [`Stores`]: which stores guards use when they name none, and the
//!   record table of SQL records with its statements;
//! - `batch`: a broker's batch, each message under its own dedup guard
//!   (feature `sql`);
//! - `outbox`: messages a guarded body publishes in its transaction, and
//!   the relay that hands them to a broker after the commit (feature
//!   `outbox`); its table's SQL is `store/sql/outbox.rs`'s;
//! - `http`: the `Idempotency-Key` layer (feature `http`); `grpc`: the
//!   same for tonic services (feature `grpc`); `door`: what the two share
//!   (settings, key and tenant, fingerprint, a response as kept, the
//!   guarded call from claim to answer), so neither imports the other;
//! - `testing`: duplicates fired at an operation, and stores with faults
//!   injected (feature `testing`), for users' tests of their own code;
//! - `error`, [`key`], `record`, `machine`, `future`, `table`: the error
//!   type, key parts and fingerprints, a record as stores keep it, a state
//!   machine as its derive describes it, the future store traits return,
//!   the record table's name; `replay`: what an answer
//!   must be to replay exactly ([`Replayable`]); `telemetry`: whether a
//!   call ran or replayed ([`observe`]), events and metrics; `canonical`:
//!   the one canonical text every fingerprint hashes, written from
//!   `Serialize` (the doors' JSON bodies too). These leaves import
//!   nothing above them.
//!
//! Public paths are the facade's, one per item: a module's items are the
//! ones it re-exports (a folder's inner modules are private).

#![warn(missing_docs)]
// docs.rs builds with `--cfg docsrs` (see Cargo.toml): label items by the
// cargo feature they need.
#![cfg_attr(docsrs, feature(doc_cfg))]

#[macro_use]
mod doc_links;

#[cfg(feature = "sql")]
pub mod batch;
mod canonical;
#[cfg(feature = "sql")]
mod dedup;
#[cfg(any(feature = "http", feature = "grpc"))]
mod door;
mod error;
mod future;
#[cfg(feature = "grpc")]
pub mod grpc;
mod guard;
#[cfg(feature = "http")]
pub mod http;
pub mod key;
pub mod lease;
pub mod lock;
mod machine;
#[cfg(feature = "outbox")]
pub mod outbox;
pub mod precheck;
#[cfg(any(feature = "sql", feature = "redis", feature = "etcd"))]
mod record;
mod replay;
pub mod state;
pub mod store;
mod stores;
#[cfg(feature = "sql")]
mod table;
mod telemetry;
#[cfg(feature = "testing")]
pub mod testing;
pub mod token;
#[cfg(feature = "tx")]
mod tx;
#[cfg(feature = "sql")]
pub mod unique;

// One path per public item, the facade's (`idem-guard`): what a module
// does not list here is reachable only inside this crate. Only `Key`,
// `IdempotencyKey` (defined in `key`) and `StateMachine`, `SilentRepeat`
// (defined in `state`) are also reachable by their defining module's path
// here; the facade names them at its root only.
#[cfg(feature = "sql")]
pub use dedup::ticket::Ticket;
pub use error::{Error, LostLease, Result};
pub use guard::{Claim, DEFAULT_RETENTION, Guard, GuardError};
pub use key::{IdempotencyKey, Key};
pub use replay::Replayable;
pub use state::{SilentRepeat, StateMachine};
#[cfg(feature = "sql")]
pub use store::sql::migrate;
pub use stores::{Stores, StoresBuilder};
pub use telemetry::{Outcome, observe};

#[cfg(all(feature = "tx", feature = "mysql"))]
pub use tx::MySqlTx;
#[cfg(all(feature = "tx", feature = "postgres"))]
pub use tx::PgTx;
#[cfg(all(feature = "tx", feature = "sqlite"))]
pub use tx::SqliteTx;
#[cfg(feature = "tx")]
pub use tx::{Tx, begin};

/// Operating idem's records: look one up, list the stuck ones, release one
/// (with `redis` alone: the record types of `RedisStore`'s counterparts).
#[cfg(feature = "sql")]
pub use store::sql::admin;

/// Operating idem's lease records in Redis or etcd: the record types that
/// `RedisStore::inspect_lease` (`EtcdStore::inspect_lease`), `stuck_leases`
/// and `release_lease` take and return (with a SQL feature, this module
/// also holds the SQL functions).
#[cfg(all(any(feature = "redis", feature = "etcd"), not(feature = "sql")))]
pub mod admin {
    pub use crate::record::{InFlightStep, Record, RecordId, RecordState, RecordStatus, RecordStep, Release};
}

/// Dedup records in SQL: the backend trait, the transaction trait, the
/// record table, reading, purging and operating records. (`Tx`, `begin`
/// and `migrate` are at the crate root.)
#[cfg(feature = "sql")]
pub mod sql {
    pub use crate::dedup::context::TxContext;
    pub use crate::record::DedupRecord;
    pub use crate::store::sql::{
        PurgeOptions, PurgeReport, RECORD_TABLE, SqlBackend, find_record, migrator, purge_expired,
    };
    pub use crate::table::RecordTable;
    #[cfg(feature = "tx")]
    pub use crate::tx::begin_with;
}

/// Not a stable API: the items generated code names. Reach them only through
/// `#[idempotent]`.
#[doc(hidden)]
pub mod __private;
