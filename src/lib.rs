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
//! ## How `strategy = "dedup"` works
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
//! | body returns `Err` | the record is removed, even if the caller commits anyway; a retry runs again |
//! | same key, different `fingerprint` | `Err(idem::Error::KeyMismatch)`, checked before anything else |
//! | worker dies mid-way | the transaction rolls back, record included |
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
//! ## State machines
//!
//! When a call moves an entity's one-way status, the status stops repeats:
//! `strategy = "state"` runs a compare-and-set in the caller's transaction
//! before the body,
//! `UPDATE <table> SET <status> = <to> WHERE <key> = ? AND <status> IN (<from>...)`.
//!
//! ```no_run
//! use idem::idempotent;
//! use sqlx::{Sqlite, Transaction};
//!
//! #[derive(idem::StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
//! #[state(table = "orders", key_column = "order_no", status_column = "status")]
//! enum OrderStatus {
//!     #[state(code = 1, to(Paid, Canceled))]
//!     WaitPay,
//!     #[state(code = 2, to(Shipped, Canceled))]
//!     Paid,
//!     #[state(code = 3, to(Finished))]
//!     Shipped,
//!     #[state(code = 4)]
//!     Finished,
//!     #[state(code = 9)]
//!     Canceled,
//! }
//!
//! #[derive(Debug, thiserror::Error)]
//! enum AppError {
//!     #[error(transparent)] Idem(#[from] idem::Error),
//!     #[error(transparent)] Db(#[from] sqlx::Error),
//! }
//!
//! /// The coupon hangs off the transition: granted exactly when the order becomes PAID.
//! #[idempotent(key = "order_no", strategy = "state", scope = "shop.order.pay",
//!              transition = "OrderStatus::WaitPay -> OrderStatus::Paid")]
//! async fn on_paid(tx: &mut Transaction<'_, Sqlite>, order_no: &str) -> Result<(), AppError> {
//!     sqlx::query("INSERT INTO coupons (order_no) VALUES (?)").bind(order_no).execute(&mut **tx).await?;
//!     Ok(())
//! }
//!
//! /// Both lines of defence: the dedup record replays the first answer.
//! #[idempotent(key = "order_no", strategy = "dedup+state", scope = "shop.order.cancel",
//!              transition = "OrderStatus::WaitPay | OrderStatus::Paid -> OrderStatus::Canceled")]
//! async fn cancel(tx: &mut Transaction<'_, Sqlite>, order_no: &str) -> Result<Option<u64>, AppError> {
//!     let refund_id = 7; // start the refund here
//!     Ok(Some(refund_id))
//! }
//!
//! const _: () = assert!(OrderStatus::can_transition(OrderStatus::Paid, OrderStatus::Shipped));
//! ```
//!
//! | the compare-and-set... | result | body |
//! |---|---|---|
//! | moved the row | this call made the transition | runs |
//! | moved nothing, the status is the target | a repeat: `Ok(T::silent_repeat())` under `state`, the stored answer under `dedup+state` | not run |
//! | moved nothing, the status is another one | [`Error::IllegalTransition`] (an `ERROR` event, [`Outcome::Rejected`]) | not run |
//! | found no row | [`Error::NotFound`] | not run |
//!
//! - A concurrent repeat waits on the row lock, then sees the target. A body
//!   that returns `Err` has the status put back where it was, even if the
//!   caller commits anyway (and under `dedup+state` the record removed).
//! - With several sources the guard first reads the status under a row lock
//!   (`FOR UPDATE`), so it knows which source to restore on failure.
//! - The derive: `#[state(table, key_column, status_column)]` on the enum
//!   (`key_column = "a, b"` for a composite key: one key part per column);
//!   per variant `to(...)` and `code = N` (or a discriminant `WaitPay = 1`);
//!   or `stored_as = "name"` on the enum to store text (`WAIT_PAY` by default,
//!   `name = "..."` per variant). Names are written into the SQL unquoted, so
//!   they must be plain identifiers. It generates [`StateMachine`] and an
//!   inherent `const fn can_transition(from, to) -> bool`.
//! - Transitions are checked at compile time against the enum: an undeclared
//!   one fails the build with the targets its source does declare.
//! - `state` keeps no record, so it takes no `fingerprint` or `retention`;
//!   a repeat returns [`SilentRepeat::silent_repeat`] (`()`, or `None` for
//!   an `Option`; implement it for your own answer type). `dedup+state`
//!   replays the first answer from its record, even after the entity moved
//!   on; with the record gone (past retention) but the status at the target,
//!   it is still a repeat and returns `silent_repeat()`. On PostgreSQL its
//!   claim and transition are one statement.
//!
//! ## Work outside the transaction: `lease`
//!
//! When the guarded work cannot share a transaction with its record (a bank
//! API call), `strategy = "lease"` claims the key in a [`lease::LeaseStore`]
//! before the body: a `PROCESSING` record with a lease deadline on the
//! store's clock, committed on its own. See the [`lease`] module for the
//! semantics and stores.
//!
//! ```no_run
//! use idem::idempotent;
//!
//! #[derive(Debug, thiserror::Error)]
//! enum AppError {
//!     #[error(transparent)] Idem(#[from] idem::Error),
//!     #[error("the bank refused: {0}")] Bank(String),
//! }
//!
//! #[idempotent(key = "transfer_id", strategy = "lease", lease = "30s", scope = "bank.transfer")]
//! async fn transfer(transfer_id: &str, cents: i64) -> Result<u64, AppError> {
//!     // Pass the fencing token on, so a stalled worker's late write is refused.
//!     let fence = idem::lease::current().expect("inside the lease").fence;
//!     Ok(fence as u64) // call the bank here
//! }
//!
//! # async fn run(pool: sqlx::PgPool) -> Result<(), AppError> {
//! idem::migrate(&pool).await?;
//! idem::Stores::builder().lease(idem::lease::SqlStore::new(pool)).install()?;
//! match transfer("T-1", 500).await {
//!     Ok(receipt) => {}                                             // ran, or replayed
//!     Err(AppError::Idem(idem::Error::InProgress { retry_after, .. })) => {} // another worker holds it
//!     Err(e) => return Err(e),
//! }
//! # Ok(()) }
//! ```
//!
//! ## Double submits: `token`; concurrency: locks
//!
//! A user who double-clicks "pay" sends one request twice, with nothing to
//! tell them apart. `strategy = "token"` makes the form carry a one-time
//! token ([`token::issue`] when it is rendered); the guard spends it in one
//! atomic step, so of any number of concurrent submits exactly one runs and
//! the others get [`Error::TokenRejected`] ("please do not submit twice").
//! `"token+dedup"` also keeps a dedup record in your transaction, so a retry
//! of a submit that succeeded replays its answer. See the [`token`] module.
//!
//! ```no_run
//! use idem::idempotent;
//! # #[derive(Debug, thiserror::Error)]
//! # enum AppError { #[error(transparent)] Idem(#[from] idem::Error) }
//!
//! #[idempotent(strategy = "token", scope = "orders.create")]
//! async fn create_order(#[idem(token)] token: &str, user_id: i64) -> Result<i64, AppError> {
//!     Ok(user_id) // insert the order; a unique index on its token is the backstop
//! }
//!
//! # async fn run(client: redis::Client) -> Result<(), Box<dyn std::error::Error>> {
//! let store = idem::RedisStore::new(redis::aio::ConnectionManager::new(client).await?, "idem:");
//! idem::Stores::builder().token(store.clone()).install()?;
//! // When the form is rendered:
//! let token = idem::token::issue(&store, "orders.create", std::time::Duration::from_secs(600)).await?;
//! // When it is submitted (twice):
//! assert!(create_order(&token, 7).await.is_ok());
//! assert!(matches!(create_order(&token, 7).await, Err(AppError::Idem(idem::Error::TokenRejected))));
//! # Ok(()) }
//! ```
//!
//! A lock stops **concurrency, not repetition**: `"lock+dedup"` and
//! `"lock+state"` take an owner-checked lock on the key (`ttl`, renewed
//! while the body runs; `wait` to queue for it instead of failing with
//! [`Error::LockBusy`]) around a `dedup` or `state` guard, which is what
//! stops repeats; `"lock"` alone needs `concurrency_only = true`. The body
//! reads its fencing token with [`lock::current`]. See the [`lock`] module.
//!
//! ```no_run
//! use idem::idempotent;
//! # #[derive(Debug, thiserror::Error)]
//! # enum AppError { #[error(transparent)] Idem(#[from] idem::Error), #[error(transparent)] Db(#[from] sqlx::Error) }
//!
//! #[idempotent(key = "order_no", strategy = "lock+dedup", ttl = "10s", wait = "2s", scope = "stock.deduct")]
//! async fn deduct(tx: &mut sqlx::Transaction<'_, sqlx::Postgres>, order_no: &str, sku: i64) -> Result<bool, AppError> {
//!     // The conditional decrement stays the backstop: never below zero.
//!     let sold = sqlx::query("UPDATE stock SET num = num - 1 WHERE id = $1 AND num > 0")
//!         .bind(sku).execute(&mut **tx).await?.rows_affected() == 1;
//!     Ok(sold)
//! }
//! ```
//!
//! ## Consumers: `precheck = "redis"`
//!
//! Where repeats are the common case (a broker redelivering, producers
//! re-publishing), `precheck = "redis"` on `dedup`, `dedup+state` or
//! `token+dedup` (or `lease`) asks a marker
//! store "seen before?" in one round trip first (with `lease`, worth it on
//! SQL lease stores only). A seen key whose completed
//! record is there replays after one plain read, without the claim; a
//! marker whose record is missing (a crash or rollback after it was written)
//! takes the normal path. The record stays the truth: losing every marker
//! costs speed, never correctness. See the [`precheck`] module.
//!
//! ```no_run
//! use idem::idempotent;
//! # #[derive(Debug, thiserror::Error)]
//! # enum AppError { #[error(transparent)] Idem(#[from] idem::Error) }
//!
//! // The producer's business key (a header), never the broker's delivery tag.
//! #[idempotent(key = "business_key", scope = "ledger.apply", precheck = "redis", ttl = "2d")]
//! async fn apply(tx: &mut sqlx::Transaction<'_, sqlx::Postgres>, business_key: &str) -> Result<(), AppError> {
//!     Ok(()) // write the ledger entry in `tx`
//! }
//! ```
//!
//! ## The attribute
//!
//! `#[idempotent(key = ..., strategy = ..., scope = ..., fingerprint = ..., retention = ..., claim = ...)]`
//!
//! - **`key`** (required): an expression over the parameters, as a string
//!   (`key = "event.trade_no"`) or bare (`key = event.trade_no`). Several
//!   comma-separated parts make a composite key (`key = "req.user_id,
//!   req.request_id"`). Parts must be strings, integers, `char`, `bool`, UUIDs
//!   (feature `uuid`) or `Option`s of these ([`IdempotencyKey`]); floats and
//!   structs are refused at compile time. An empty or all-whitespace string
//!   or a `None` part is refused at run time with [`Error::InvalidKey`]. Keys over 128 bytes are
//!   stored as their SHA-256.
//! - **`strategy`**: `"dedup"` (the default), `"state"` or `"dedup+state"`
//!   (see [state machines](#state-machines)), `"lease"` (see
//!   [work outside the transaction](#work-outside-the-transaction-lease)),
//!   `"token"`, `"token+dedup"`, `"lock+dedup"`, `"lock+state"` and `"lock"`
//!   (see [double submits and locks](#double-submits-token-concurrency-locks)).
//!   `key` is required, except with `"token"`, which keys on the token and
//!   refuses a `key`.
//! - **`lease`** (`lease` only): the lease length (`"30s"`, the default).
//! - **`store`** (`lease`, token and lock strategies): an expression naming
//!   the [`lease::LeaseStore`], [`token::TokenStore`] or [`lock::LockStore`]
//!   (`store = "self.redis"`; for a `static` behind a `LazyLock`, `"*STORE"`).
//!   Default: the store of that role installed with [`Stores`]; with none
//!   installed the call fails with [`Error::NoStore`].
//! - **`ttl`**, **`wait`** (lock strategies): the lock's TTL (required;
//!   renewed every third of it while the body runs) and how long to wait for
//!   a busy lock (default: not at all, [`Error::LockBusy`] at once).
//! - **`precheck = "redis"`** (`dedup`, `dedup+state`, `token+dedup`,
//!   `lease`): a marker cache in front of the record, in the store named by
//!   `store` (`dedup`, `dedup+state`; with `lease` and `token+dedup`, `store`
//!   names the lease or token store and markers go to the precheck store
//!   installed with [`Stores`]); `ttl` is the marker's lifetime (default 24 h).
//!   With `lease` it saves work only on SQL lease stores (a plain read
//!   instead of the claiming upsert): Redis and memory lease stores already
//!   replay in one cheap call.
//! - **`on_store_error`** (token strategies): `"reject"` (default) or
//!   `"allow"`, what to do while the token store is unreachable.
//! - **`concurrency_only = true`** (`lock` only): the acknowledgement that a
//!   lock alone does not stop repeats.
//! - **`transition`** (`state`, `dedup+state`): `"Enum::From -> Enum::To"`,
//!   several sources joined by `|`.
//! - **`scope`**: the record namespace. Default: `module_path::fn_name`.
//!   **Set it explicitly in production**: moving or renaming the function
//!   changes the default, and repeats of calls made before the deploy would
//!   then run again. Methods (functions with a `self` receiver) must set it:
//!   two types in one module with a method of the same name would share the
//!   default. Associated functions without `self` cannot be told apart by the
//!   macro: give them a scope too.
//! - **`fingerprint`**: an expression (anything `serde::Serialize`) hashed
//!   into the record; a repeat whose fingerprint differs is
//!   [`Error::KeyMismatch`]. Fingerprint structs, vectors and `BTreeMap`s,
//!   not `HashMap`s (their order is random).
//! - **`retention`**: how long records are kept (`"24h"`, `"7d"`; default
//!   7 days). After it, a repeat runs again. [`purge_expired`] deletes expired
//!   records in bounded batches; schedule it.
//! - **`source`**: `"frontend" | "callback" | "mq" | "rpc"`, who sends the
//!   requests. The token strategies refuse `callback`, `mq` and `rpc`: those
//!   callers never fetch a token. Token strategies also require an explicit
//!   `scope`, the one tokens are issued for.
//! - **`claim`**: `"before"` (default) or `"after"`, see below.
//!
//! The transaction parameter is found by its type (`&mut
//! sqlx::Transaction<'_, DB>` for `Postgres`, `MySql`, `Sqlite`), or marked
//! with `#[idem(tx)]` when it is your own type implementing [`TxContext`].
//!
//! The function must be `async` and return `Result<T, E>` where `T` is
//! [`Replayable`] (serde) and `E: From<idem::Error>`. Its signature does not
//! change; the expansion is a few lines around one runtime call (see it with
//! `cargo expand`). The body's `Result` is held while the response is
//! stored, so the future is `Send` when `T` and `E` are (use
//! `Box<dyn Error + Send + Sync>`, not `Box<dyn Error>`, in spawned tasks).
//!
//! ## Telling a first run from a replay
//!
//! [`observe`] returns whether the guard inside a future ran or replayed, e.g.
//! to set an `Idempotent-Replayed: true` header. Every guard also emits a
//! `tracing` event (target `idem`) with the scope, a short hash of the key and
//! the outcome.
//!
//! ## Schema
//!
//! [`migrate`] creates `idem_records` (idempotent; run at start-up). For your
//! own migration tool, the SQL is in `idem-runtime/migrations/<backend>/` and
//! in [`SqlBackend::SCHEMA`].

#![warn(missing_docs)]

/// Make an async function idempotent; see the [crate docs](crate) for the arguments.
pub use idem_macros::idempotent;

/// Describe an entity's status enum for `strategy = "state"` and
/// `"dedup+state"`; see [the crate docs](crate#state-machines).
pub use idem_macros::StateMachine;

pub use idem_runtime::{
    Claim, DEFAULT_RETENTION, DedupRecord, Error, Fingerprint, Guard, GuardError, IdempotencyKey, Key, LeaseTicket,
    LockTicket, Outcome, PurgeOptions, PurgeReport, RecordStatus, Replayable, Result, SilentRepeat, SqlBackend,
    StateMachine, Stores, StoresBuilder, Ticket, TokenTicket, TxContext, find_record, migrate, observe, purge_expired,
};
pub use idem_runtime::{MemoryStore, error, key, lease, lock, precheck, record, sql, state, store, token};

/// Lease records, tokens and locks in Redis; see [`lease`], [`token`], [`lock`].
#[cfg(feature = "redis")]
pub use idem_runtime::RedisStore;

#[doc(hidden)]
pub use idem_runtime::__private;
