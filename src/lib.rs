//! # idem: repeated requests, made harmless
//!
//! A payment gateway fires the same callback six times, a user double-clicks
//! "pay", a broker redelivers, an RPC client retries on timeout. With idem the
//! second and later copies change nothing and get the first answer.
//!
//! ```no_run
//! use idem::idempotent;
//! use sqlx::{Sqlite, Transaction};
//!
//! #[derive(serde::Deserialize)]
//! struct PayCallback { trade_no: String, amount_cents: i64 }
//!
//! #[derive(Debug, thiserror::Error)]
//! enum AppError {
//!     #[error(transparent)] Idem(#[from] idem::Error),
//!     #[error(transparent)] Db(#[from] sqlx::Error),
//! }
//!
//! #[idempotent(key = "event.trade_no", scope = "payments.on_pay")]
//! async fn on_pay_callback(tx: &mut Transaction<'_, Sqlite>, event: &PayCallback) -> Result<u64, AppError> {
//!     // Runs once per trade number; every repeat gets the first call's answer.
//!     let coupon = sqlx::query("INSERT INTO coupons (trade_no) VALUES (?)")
//!         .bind(&event.trade_no)
//!         .execute(&mut **tx)
//!         .await?;
//!     Ok(coupon.last_insert_rowid() as u64)
//! }
//!
//! # async fn run(pool: sqlx::SqlitePool, event: PayCallback) -> Result<(), AppError> {
//! idem::migrate(&pool).await?; // once, at start-up
//! let mut tx = pool.begin().await?;
//! let coupon_id = on_pay_callback(&mut tx, &event).await?;
//! tx.commit().await?;
//! # Ok(()) }
//! ```
//!
//! The record is written **in your transaction**, next to your change, so
//! both commit or neither does.
//!
//! ## Strategies
//!
//! | strategy | stops | needs | limit | where |
//! |---|---|---|---|---|
//! | `dedup` (default) | server-side repeats: callbacks, MQ redelivery, RPC retries | the record and the business change in one transaction of one database | no work outside that transaction: use `lease` | [`sql`] |
//! | `unique`, `unique+state` | server-side repeats whose work is an insert on a unique key | the business table's unique constraint, a replay function reading the existing row | the answer is re-read, not stored; no fingerprint | [`unique`] |
//! | `state`, `dedup+state` | every repeat of a state change | an entity with a one-way status | no status to test (adding points) | [`state`] |
//! | `lease` | repeats of work outside a transaction (a bank's API) | a lease store | a worker stalled past its lease is taken over: fence outside writes | [`lease`] |
//! | `token`, `token+dedup` | front-end resubmission (double click) | a token the client fetched first | useless for callbacks, MQ, RPC | [`token`] |
//! | `lock+dedup`, `lock+state`, `lock` | concurrency, not repetition | a TTL longer than the work | released, the request can run again | [`lock`] |
//! | `precheck = "redis"` (modifier) | the claim's cost on common repeats | a marker store | a cache: the record decides | [`precheck`] |
//!
//! ## Where to read on
//!
//! - The attribute's arguments, its compile-time rules and its errors:
//!   [`idempotent`].
//! - What `dedup` does in every situation, the statements it adds,
//!   `claim = "after"`, [`idem::Tx`][Tx] (the claim on `BEGIN`, the answer
//!   on `COMMIT`), the schema, sharding, purging and the `idem` command:
//!   [`sql`].
//! - Where lease records, tokens, locks and markers live (there is no
//!   silent default), and what Redis guarantees: [`store`].
//! - The same guards without the attribute: [`Guard`]; a broker's batch,
//!   each message under its own guard: [`batch`].
//! - The `Idempotency-Key` header at the HTTP edge, on the same lease
//!   records: the `http` module (feature `http`); the same for tonic gRPC
//!   services, unary calls keyed by `idempotency-key` metadata: the `grpc`
//!   module (feature `grpc`).
//! - Messages for other services, written in the guarded transaction and
//!   relayed to a broker after commit: the `outbox` module (feature
//!   `outbox`), with the publishers for RabbitMQ (feature `rabbitmq`) and
//!   NATS JetStream (feature `nats`) and the consumer's dedup by message id.
//! - A first run told from a replay, `tracing` spans and metrics:
//!   [`observe`].
//! - Naming a record at the store's level (a scope and a key as stored),
//!   fingerprints: [`key`].
//! - A duplicate is never an error: a repeat of a completed call is `Ok`
//!   with the first answer. [`Error`] is what a caller must act on, and
//!   [`Error::is_retryable`] says which to retry.
//!
// Links to items of a feature that may be off: see `doc_links`.
#![cfg_attr(feature = "tx", doc = "[Tx]: crate::Tx")]
#![cfg_attr(not(feature = "tx"), doc = concat!("[Tx]: https://docs.rs/idem-guard/", env!("CARGO_PKG_VERSION"), "/idem/struct.Tx.html"))]
#![cfg_attr(feature = "sql", doc = "[`sql`]: crate::sql\n[`batch`]: crate::batch\n[`unique`]: crate::unique")]
#![cfg_attr(
    not(feature = "sql"),
    doc = concat!(
        "[`sql`]: https://docs.rs/idem-guard/", env!("CARGO_PKG_VERSION"), "/idem/sql/index.html\n",
        "[`batch`]: https://docs.rs/idem-guard/", env!("CARGO_PKG_VERSION"), "/idem/batch/index.html\n",
        "[`unique`]: https://docs.rs/idem-guard/", env!("CARGO_PKG_VERSION"), "/idem/unique/index.html"
    )
)]
#![warn(missing_docs)]
// docs.rs builds with `--cfg docsrs` (see Cargo.toml): label items by the
// cargo feature they need.
#![cfg_attr(docsrs, feature(doc_cfg))]

#[macro_use]
mod doc_links;

#[doc = include_str!("../docs/idempotent.md")]
// By path: the attributes of a `use` item resolve macros from the crate root.
#[doc = crate::doc_links::links!()]
pub use idem_macros::idempotent;

#[doc = include_str!("../docs/state_machine.md")]
pub use idem_macros::StateMachine;

#[cfg(all(feature = "tx", feature = "mysql"))]
pub use idem_runtime::MySqlTx;
#[cfg(all(feature = "tx", feature = "postgres"))]
pub use idem_runtime::PgTx;
#[cfg(all(feature = "tx", feature = "sqlite"))]
pub use idem_runtime::SqliteTx;
pub use idem_runtime::{
    Claim, DEFAULT_RETENTION, Error, GuardError, IdempotencyKey, Key, LostLease, Outcome, Replayable, Result,
    SilentRepeat, StateMachine, Stores, StoresBuilder,
};
#[cfg(feature = "sql")]
pub use idem_runtime::{Ticket, migrate};
#[cfg(feature = "tx")]
pub use idem_runtime::{Tx, begin};

#[doc = include_str!("../docs/guard.md")]
pub use idem_runtime::Guard;

#[doc = include_str!("../docs/observe.md")]
pub use idem_runtime::observe;

// Each module lists what it holds: every public item has this one path.

/// Lease records: `strategy = "lease"`.
pub mod lease {
    #![doc = include_str!("../docs/lease.md")]
    #![doc = links!()]
    pub use idem_runtime::lease::{
        DEFAULT_LEASE, HeldLease, LeaseClaim, LeaseInfo, LeaseRequest, LeaseStore, LeaseTicket, MAX_STEPS, NewStep,
        RecordedStep, Resolve, StartedStep, StepKey, StepLog, StepOutcome, Steps, Watch, current,
    };
    #[cfg(feature = "sql")]
    pub use idem_runtime::lease::{StepInTransaction, StepTransactions};
}

/// Locks: `lock+dedup`, `lock+state`, `lock`.
pub mod lock {
    #![doc = include_str!("../docs/lock.md")]
    pub use idem_runtime::lock::{HeldLock, LockAttempt, LockInfo, LockStore, LockTicket, acquire, current};
}

/// One-time tokens: `token`, `token+dedup`.
pub mod token {
    #![doc = include_str!("../docs/token.md")]
    pub use idem_runtime::token::{MAX_TOKEN_LEN, OnStoreError, TokenParam, TokenStore, TokenTicket, consume, issue};
}

/// `precheck = "redis"`.
pub mod precheck {
    #![doc = include_str!("../docs/precheck.md")]
    pub use idem_runtime::precheck::{Counters, DEFAULT_TTL, PrecheckStore, WAIT, counters};
}

/// State machines: `state`, `dedup+state`.
pub mod state {
    #![doc = include_str!("../docs/state.md")]
    pub use idem_runtime::state::{StateCode, StateTable, StoredState, Transition};
}

/// The business table's own unique key as the guard: `unique`,
/// `unique+state`.
#[cfg(feature = "sql")]
pub mod unique {
    #![doc = include_str!("../docs/unique.md")]
    pub use idem_runtime::unique::{Completed, DatabaseFailure, Replaying, UniqueTicket, insert};
}

/// A broker's batch, each message under its own dedup guard.
#[cfg(feature = "sql")]
pub mod batch {
    #![doc = include_str!("../docs/batch.md")]
    pub use idem_runtime::batch::{Failure, Handled, dedup};
}

/// Where guards keep what is not in your transaction.
pub mod store {
    #![doc = include_str!("../docs/stores.md")]
    #![doc = links!()]
    #[cfg(feature = "etcd")]
    pub use idem_runtime::store::EtcdStore;
    #[cfg(feature = "sql")]
    pub use idem_runtime::store::SqlStore;
    pub use idem_runtime::store::{BoxFuture, DEFAULT_TIMEOUT, MemoryStore, RecordKind, Routed};
    #[cfg(feature = "redis")]
    pub use idem_runtime::store::{RedisStats, RedisStore};
}

/// Dedup records in SQL: what happens when, statements, schema, purging.
#[cfg(feature = "sql")]
pub mod sql {
    #![doc = include_str!("../docs/dedup.md")]
    #![doc = include_str!("../docs/sql.md")]
    #![doc = links!()]
    #[cfg(feature = "tx")]
    pub use idem_runtime::sql::begin_with;
    pub use idem_runtime::sql::{
        DedupRecord, PurgeOptions, PurgeReport, RECORD_TABLE, RecordTable, SqlBackend, TxContext, find_record,
        migrator, purge_expired,
    };
}

/// The transactional outbox: messages a guarded body hands to other
/// services, written in its transaction and relayed after the commit
/// (feature `outbox`).
#[cfg(feature = "outbox")]
pub mod outbox {
    #![doc = include_str!("../docs/outbox.md")]
    #![doc = links!()]
    /// The NATS JetStream publisher (feature `nats`).
    #[cfg(feature = "nats")]
    pub use idem_runtime::outbox::JetStream;
    /// The RabbitMQ publisher (feature `rabbitmq`).
    #[cfg(feature = "rabbitmq")]
    pub use idem_runtime::outbox::RabbitMq;
    /// The consumer's side: a delivery's message id as its dedup key
    /// (features `rabbitmq`, `nats`).
    #[cfg(any(feature = "rabbitmq", feature = "nats"))]
    pub use idem_runtime::outbox::consumer;
    pub use idem_runtime::outbox::{
        DEFAULT_MAX_PAYLOAD, Entry, InProcess, KEY_HEADER, MAX_TOPIC, Message, MessageCounts, MessageId, MessageQuery,
        MessageState, Outbox, ParseMessageIdError, PublishError, Publisher, Relay, RelayHandle, RelayReport,
        count_messages, find_message, list_messages, oldest_pending, purge_sent, purge_sent_preview, resend,
        resend_all,
    };
}

/// Key parts, the stored form of scopes and keys, and fingerprints.
pub mod key {
    #![doc = include_str!("../docs/key.md")]
    #![doc = links!()]
    pub use idem_runtime::key::{Fingerprint, Fingerprintable, MAX_PLAIN_KEY_LEN, SqlKey, stored_scope};
}

/// The `Idempotency-Key` layer for HTTP services (feature `http`).
#[cfg(feature = "http")]
pub mod http {
    #![doc = include_str!("../docs/http.md")]
    pub use idem_runtime::http::{
        BoxError, EXPIRES_IN, Idempotency, IdempotencyLayer, REPLAYED, ResponseBody, keeps_by_default,
    };
}

/// Testing your own code: duplicates fired at it, stores with faults
/// injected (feature `testing`).
#[cfg(feature = "testing")]
pub mod testing {
    #![doc = include_str!("../docs/testing.md")]
    pub use idem_runtime::testing::{Attempt, Call, Duplicates, Fault, Faults, Faulty, Op, Report};
}

/// The idempotency layer for tonic gRPC services (feature `grpc`).
#[cfg(feature = "grpc")]
pub mod grpc {
    #![doc = include_str!("../docs/grpc.md")]
    pub use idem_runtime::grpc::{Idempotency, IdempotencyLayer, REPLAYED, RETRY_PUSHBACK};
}

/// Operating idem's records: look one up, list the stuck ones, release one
/// (the `idem` command's calls, as functions).
#[cfg(any(feature = "sql", feature = "redis", feature = "etcd"))]
pub use idem_runtime::admin;

#[doc(hidden)]
pub use idem_runtime::__private;

/// The README's example, compiled and run as a doctest.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
