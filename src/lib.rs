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
//! ## Strategies
//!
//! | strategy | stops | needs | limit | where |
//! |---|---|---|---|---|
//! | `dedup` (default) | server-side repeats: callbacks, MQ redelivery, RPC retries | the record and the business change in one transaction of one database | no work outside that transaction: use `lease` | below |
//! | `state`, `dedup+state` | every repeat of a state change | an entity with a one-way status | no status to test (adding points) | [`state`] |
//! | `lease` | repeats of work outside a transaction (a bank's API) | a lease store | a worker stalled past its lease is taken over: fence outside writes | [`lease`] |
//! | `token`, `token+dedup` | front-end resubmission (double click) | a token the client fetched first | useless for callbacks, MQ, RPC | [`token`] |
//! | `lock+dedup`, `lock+state`, `lock` | concurrency, not repetition | a TTL longer than the work | released, the request can run again | [`lock`] |
//! | `precheck = "redis"` (modifier) | the claim's cost on common repeats | a marker store | a cache: the record decides | [`precheck`] |
//!
//! At the HTTP edge, the `http` module (feature `http`) is a tower layer for
//! the `Idempotency-Key` header, on the same lease records.
//!
//! The attribute's arguments and rules: [`idempotent`]. Where stores come
//! from (there is no silent default): [`store`]. The schema, purging and
//! the statements per database: [`sql`]. Without the attribute, the same
//! guards by hand: [`Guard`].
//!
//! ## `dedup`: the record in your transaction
//!
//! The guarded function takes the caller's transaction. Before the body runs,
//! the guard inserts a record `(scope, key)` into `idem_records` **in that
//! transaction**; after the body it stores the `Ok` value in the record. So the
//! record and the business change commit together or not at all:
//!
//! | situation | what happens |
//! |---|---|
//! | first call | the body runs; the record is written in your transaction |
//! | repeat after commit | the stored `Ok` value is returned; the body does not run |
//! | concurrent repeat | it waits on the record's row lock, then replays (or runs, if the first call rolled back) |
//! | concurrent repeat, PostgreSQL at `REPEATABLE READ` or `SERIALIZABLE` | the record committed meanwhile is outside its snapshot: the claim fails with a serialization failure ([`Error::Database`], SQLSTATE 40001, [`is_retryable`](Error::is_retryable)); retry in a new transaction, which replays (MySQL's default `REPEATABLE READ` replays directly; so does the first guard of an [`idem::Tx`](Tx) begun `REPEATABLE READ`, whose claim rides on `BEGIN` and fails on the unique key instead) |
//! | body returns `Err` | the record is removed, even if the caller commits anyway; a retry runs again |
//! | same key, different `fingerprint` | `Err(idem::Error::KeyMismatch)`, checked before anything else |
//! | worker dies mid-way | the transaction rolls back, record included |
//! | the body succeeded, its answer cannot be kept (over the store's limit, a value JSON cannot carry exactly: `f64::NAN`, `Some(())`) | the first call gets its answer; the record stays in your transaction marked "answer not kept" (logged at WARN): committed, repeats get [`Error::AnswerNotKept`] and the body never runs again; rolled back, both go |
//!
//! Only a unique-key violation on the record counts as a duplicate: a lock
//! timeout, a lost connection or a missing table is an error
//! ([`Error::Database`], [`Error::NotMigrated`]). The claim never aborts a
//! PostgreSQL transaction (`ON CONFLICT DO NOTHING`, not a failing INSERT).
//!
//! Statements the guard adds to your transaction:
//!
//! | | first call | replay |
//! |---|---|---|
//! | PostgreSQL | 2 (claim, response) | 2 (insert that does nothing, then a read) |
//! | MySQL/MariaDB | 2 (claim, response) | 2 (the failed insert, then a locking read) |
//! | SQLite | 2 (claim, response) | 2 (insert that does nothing, then a read) |
//! | PostgreSQL, SQLite, `claim = "after"` | 1 (record with response) | the body, the insert, a take-over attempt (PostgreSQL only), `ROLLBACK; BEGIN`, a read |
//! | MySQL/MariaDB, `claim = "after"` | 1 (record with response) | the body, the failed insert, a locking read, `ROLLBACK; BEGIN`, a locking read |
//!
//! (On PostgreSQL one statement could claim and return the existing record;
//! measured with `loadgen`, it made every first call about 4% slower, and
//! first calls are the common case.)
//!
//! ## `idem::Tx`: no round trip of the guard's own
//!
//! Each statement above is a round trip to the database. Let idem begin and
//! commit the transaction, and on PostgreSQL and MySQL/MariaDB the claim
//! travels with `BEGIN` and the answer with `COMMIT`: a `dedup` first call
//! takes the round trips of the transaction alone, a repeat two and no
//! commit (`dedup+state` saves one round trip: its transition follows the
//! claim as a statement of its own).
//!
//! ```no_run
//! # use idem::idempotent;
//! # #[derive(Debug, thiserror::Error)]
//! # enum AppError { #[error(transparent)] Idem(#[from] idem::Error), #[error(transparent)] Db(#[from] sqlx::Error) }
//! #[idempotent(key = "trade_no", scope = "payments.on_pay")]
//! async fn on_pay(tx: &mut idem::PgTx, trade_no: &str) -> Result<i64, AppError> {
//!     let id = sqlx::query_scalar("INSERT INTO coupons (trade_no) VALUES ($1) RETURNING id")
//!         .bind(trade_no)
//!         .fetch_one(&mut **tx) // inside the body, as with a sqlx::Transaction
//!         .await?;
//!     Ok(id)
//! }
//!
//! # async fn run(pool: sqlx::PgPool) -> Result<(), AppError> {
//! let mut tx = idem::begin(&pool).await?; // nothing sent yet
//! let coupon = on_pay(&mut tx, "T-1001").await?; // BEGIN + claim, the body
//! tx.commit().await?; // the answer + COMMIT
//! # let _ = coupon; Ok(()) }
//! ```
//!
//! | round trips | `sqlx::Transaction` | [`idem::Tx`](Tx) |
//! |---|---|---|
//! | first call (body: one statement) | 5: BEGIN, claim, body, answer, COMMIT | 3: BEGIN + claim, body, answer + COMMIT |
//! | repeat | 4: BEGIN, claim, read, COMMIT | 2: claim (refused), ROLLBACK + read; the commit sends nothing |
//!
//! The situations above hold as they are, with these differences: the
//! claim is a plain `INSERT` whose unique-key error stops the text (nothing
//! after it runs), then the guard rolls back and reads; the answer is an
//! `UPDATE` that fails the text before its `COMMIT` if the record is gone
//! (the commit returns the error and nothing commits). Values are sent as
//! literals no value can break out of (PostgreSQL: escape strings in which
//! everything but letters, digits and a few marks is a Unicode escape, or
//! for non-ASCII values hex converted by the server; MySQL: hexadecimal
//! literals). On PostgreSQL the statements are prepared once per session
//! (under names with a hash of their text: `idem_claim_<hash>`); a session
//! without them, a new one or one a transaction-mode pooler hands over,
//! prepares them on its first claim (one round trip more, once). Answers
//! over 256 KiB of JSON are bound as a parameter (one round trip more). SQLite runs the same steps
//! as separate statements. On PostgreSQL each repeat's refused claim is
//! an `ERROR` line in the server log (`duplicate key value violates unique
//! constraint`) and a dead tuple: expected, not a fault; with many repeats
//! (a consumer that sees most messages twice) prefer a `sqlx::Transaction`,
//! or a `precheck`, which replays before any claim.
//!
//! Rules: inside a guarded body `&mut **tx` is the connection; anywhere
//! else call [`tx.open().await?`](Tx::open) first (it sends `BEGIN` if
//! nothing has begun; after a repeat nothing has). `&mut **tx` outside a
//! body without it panics, on first calls too, so tests find it. A claim
//! cancelled mid-flight closes the connection rather than return it to the
//! pool in an unknown state. Strategies other than `dedup`, `dedup+state`
//! and `token+dedup`, `claim = "after"`, and a second guard in the same
//! transaction begin it first (sending answers queued before them) and
//! claim as on a `sqlx::Transaction`; their answers still wait for
//! `COMMIT`. If queued answers cannot be stored, the guard that sent them
//! fails and the `Tx` can only be rolled back.
//!
//! It pays where the database is a network hop away: measured with one
//! client and 500 µs added to each round trip, 0.90 of an unguarded
//! transaction's throughput against 0.70 for the same guard on a
//! `sqlx::Transaction`. With the database on loopback and the server's CPU
//! the limit, the two are even on PostgreSQL and `idem::Tx` is behind on
//! MariaDB (`BENCHMARKS.md`).
//!
//! ## `claim = "after"`: one statement per first call
//!
//! By default the guard claims the key before the body and stores the
//! response after it: two statements, and a repeat never runs the body. With
//! `claim = "after"` the body runs first and the record is written **with its
//! response in one statement**; if a live record is already there, this call
//! was a repeat: the guard rolls the transaction back to where it began,
//! continues in a fresh transaction and returns the first answer.
//!
//! It is faster for first calls and slower for repeats, and it applies only
//! when both hold:
//! - every effect of the body is inside the transaction (no HTTP call, no
//!   message published, no write to another database), since the body of a
//!   repeat runs before it is discarded;
//! - the guarded call is the first work of its transaction: on a repeat,
//!   statements the caller ran earlier in the same transaction are rolled back
//!   too (statements after the call land in the fresh transaction). Inside a
//!   nested `Transaction` (a savepoint) only the savepoint is rolled back. The
//!   fresh transaction starts with a plain `BEGIN`, whatever isolation level the
//!   original one had.
//!
//! Use it on hot paths where repeats are rare; keep the default where repeats
//! are common (gateway retries) or the body has outside effects.
//!
//! ## The guard without the attribute
//!
//! `#[idempotent]` expands to calls of [`Guard`], which code that cannot
//! carry the attribute (an HTTP layer, a consumer loop, a handler generic
//! over its work) calls itself: a scope, the key's parts, options, one
//! strategy method; then the ticket of a first call takes the body's result.
//!
//! ```no_run
//! use idem::{Claim, Guard};
//!
//! # async fn demo(pool: sqlx::PgPool, trade_no: &str) -> Result<u64, idem::Error> {
//! let mut tx = pool.begin().await?;
//! let coupon = match Guard::new("payments.on_pay").key(trade_no).dedup(&mut tx).await? {
//!     Claim::Replay(coupon) => coupon,
//!     Claim::Run(ticket) => {
//!         let granted: Result<u64, idem::Error> = Ok(7); // the work, in `tx`
//!         ticket.finish(&mut tx, granted).await?
//!     }
//! };
//! tx.commit().await?;
//! # Ok(coupon) }
//! ```
//!
//! ## Telling a first run from a replay, and watching guards
//!
//! [`observe`] returns what the guard inside a future did ([`Outcome`]):
//! ran, replayed, or refused (a call still in progress, a key reused with
//! another payload, a rejected token or state change), e.g. to set an
//! `Idempotent-Replayed: true` header. The outcome is task-local: wrap the
//! guarded call itself, inside any `tokio::spawn`.
//!
//! `tracing` (target `idem`): a DEBUG span around each claim (`idem.claim`,
//! `idem.lock`), each body a lease or lock guard runs (`idem.run`) and each
//! completion (`idem.complete`), and a DEBUG event per call with the scope,
//! strategy, store, a short hash of the key and the outcome; WARN and
//! ERROR for what needs a person (a lease taken over or lost, an illegal
//! state change, a store down). With the `metrics` feature, counters and
//! histograms go to the [`metrics`](https://docs.rs/metrics) facade: see
//! [`telemetry`].
//!
//! ## Errors
//!
//! A duplicate is never an error: a repeat of a completed call is `Ok` with
//! the first answer. [`Error`] is what a caller must act on:
//! [`KeyMismatch`](Error::KeyMismatch) (same key, other payload),
//! [`InProgress`](Error::InProgress) (retry later), state and token
//! refusals, lost leases and locks, and store or database failures (never
//! taken for a duplicate). [`Error::is_retryable`] says which to retry.

#![warn(missing_docs)]
// docs.rs builds with `--cfg docsrs` (see Cargo.toml): label items by the
// cargo feature they need.
#![cfg_attr(docsrs, feature(doc_cfg))]

#[doc = include_str!("../docs/idempotent.md")]
pub use idem_macros::idempotent;

#[doc = include_str!("../docs/state_machine.md")]
pub use idem_macros::StateMachine;

#[cfg(feature = "mysql")]
pub use idem_runtime::MySqlTx;
#[cfg(feature = "postgres")]
pub use idem_runtime::PgTx;
#[cfg(feature = "sqlite")]
pub use idem_runtime::SqliteTx;
pub use idem_runtime::{
    Claim, DEFAULT_RETENTION, DedupRecord, Error, Fingerprint, Guard, GuardError, IdempotencyKey, Key, LeaseTicket,
    LockTicket, Outcome, PurgeOptions, PurgeReport, RecordStatus, RecordTable, Replayable, Result, SilentRepeat,
    SqlBackend, StateMachine, Stores, StoresBuilder, Ticket, TokenTicket, Tx, TxContext, begin, begin_with,
    find_record, migrate, migrator, observe, purge_expired, record_table, set_record_table,
};

/// Lease records: `strategy = "lease"`.
pub mod lease {
    #![doc = include_str!("../docs/lease.md")]
    pub use idem_runtime::lease::*;
}

/// Locks: `lock+dedup`, `lock+state`, `lock`.
pub mod lock {
    #![doc = include_str!("../docs/lock.md")]
    pub use idem_runtime::lock::*;
}

/// One-time tokens: `token`, `token+dedup`.
pub mod token {
    #![doc = include_str!("../docs/token.md")]
    pub use idem_runtime::token::*;
}

/// `precheck = "redis"`.
pub mod precheck {
    #![doc = include_str!("../docs/precheck.md")]
    pub use idem_runtime::precheck::*;
}

/// State machines: `state`, `dedup+state`.
pub mod state {
    #![doc = include_str!("../docs/state.md")]
    pub use idem_runtime::state::*;
}

/// Where guards keep what is not in your transaction.
pub mod store {
    #![doc = include_str!("../docs/stores.md")]
    pub use idem_runtime::store::*;
}

/// Dedup records in SQL: schema, purging, statements.
pub mod sql {
    #![doc = include_str!("../docs/sql.md")]
    pub use idem_runtime::sql::*;
}

pub use idem_runtime::{MemoryStore, admin, error, key, record, telemetry};

/// The `Idempotency-Key` layer for HTTP services (feature `http`).
#[cfg(feature = "http")]
pub use idem_runtime::http;

/// Lease records, tokens, locks and precheck markers in Redis; see [`store`].
#[cfg(feature = "redis")]
pub use idem_runtime::RedisStore;

#[doc(hidden)]
pub use idem_runtime::__private;

/// The README's example, compiled and run as a doctest.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
