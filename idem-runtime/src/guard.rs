//! The guard: one call's scope, key, fingerprint and record settings, then
//! one strategy method that claims the key. `#[idempotent]` expands to
//! exactly these calls; code that cannot carry the attribute (a handler
//! generic over its work, an HTTP layer, a consumer loop) calls them itself.
//!
//! ```no_run
//! # extern crate idem_runtime as idem;
//! use idem::{Claim, Guard};
//!
//! # async fn demo(pool: sqlx::SqlitePool, trade_no: &str) -> Result<u64, idem::Error> {
//! let mut tx = pool.begin().await?;
//! let coupon = match Guard::new("payments.on_pay").key(trade_no).dedup::<u64, _>(&mut tx).await? {
//!     Claim::Replay(coupon) => coupon, // a repeat: the first call's answer
//!     Claim::Run(ticket) => {
//!         // The first call: do the work in the same transaction...
//!         let done: Result<u64, idem::Error> = Ok(7);
//!         // ...then store the answer (or, on `Err`, remove the record).
//!         ticket.complete(&mut tx, done).await??
//!     }
//! };
//! tx.commit().await?;
//! # Ok(coupon) }
//! ```
//!
//! Each strategy method is documented where it is defined: [`Guard::dedup`],
//! [`Guard::state`], [`Guard::dedup_state`], [`Guard::token`],
//! [`Guard::token_dedup`], [`Guard::lease`], [`Guard::lock`] and
//! [`Guard::lock_only`]. A [`Claim::Run`] carries a ticket that must see the
//! body's result: [`Ticket::complete`](crate::Ticket::complete),
//! [`LeaseTicket::run`](crate::lease::LeaseTicket::run),
//! [`LockTicket::run`](crate::lock::LockTicket::run),
//! [`TokenTicket::run`](crate::token::TokenTicket::run).

use std::borrow::Cow;
use std::time::Duration;

use crate::error::Error;
use crate::key::Key;
#[cfg(feature = "sql")]
use crate::key::SqlKey;
use crate::key::{Fingerprint, Fingerprintable, IdempotencyKey, KeyBuilder};
use crate::precheck::PrecheckStore;
use crate::replay::{Replayable, encode, fit};

/// Records are kept this long unless the guard says otherwise
/// ([`Guard::retention`], `retention = "..."`). Payment gateways retry
/// callbacks for a day or more; a week covers them.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// What a token guard does when its store cannot be reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnStoreError {
    /// Refuse the call with the store's error (retryable). The default.
    Reject,
    /// Let the call through unchecked, with a warning: for forms where a
    /// unique index behind the guard stops doubles anyway.
    Allow,
}

/// What a claim decided.
#[derive(Debug)]
#[must_use = "a `Claim::Run` ticket must be completed with the body's result"]
pub enum Claim<T, R> {
    /// A repeat of a completed call: return this answer, do not run the body.
    Replay(T),
    /// The first call (or a take-over): run the body, then hand its result
    /// to this ticket.
    Run(R),
}

/// One guarded call in the making: a scope, the key's parts, and optionally
/// a fingerprint, a retention, a precheck and what to do when a token store
/// is down. A strategy method then claims the key.
///
/// `'s` is how long a [precheck](Guard::precheck) store is borrowed.
///
/// Options a strategy gives no meaning are ignored by it (the attribute
/// refuses them at compile time): a precheck on `state`, `token` or a lock
/// alone; a fingerprint on `state`; a retention on `token` or a lock;
/// `on_store_error` outside the token strategies; `claim_after` outside
/// `dedup`.
#[must_use = "a guard does nothing until a strategy method claims its key"]
pub struct Guard<'s> {
    scope: Cow<'static, str>,
    key: KeyBuilder,
    fingerprint: Option<Result<Fingerprint, String>>,
    retention: Duration,
    claim_after: bool,
    at_commit: bool,
    precheck: Option<(&'s dyn PrecheckStore, Duration)>,
    on_store_error: OnStoreError,
    savepoint: bool,
}

impl<'s> Guard<'s> {
    /// A guard for records of `scope`: the namespace of its keys (records of
    /// different scopes never meet). Name it after the operation
    /// (`"payments.on_pay"`), and keep it when code moves: repeats of calls
    /// made under another scope run again. An empty scope, or one holding a
    /// control character, fails the claim with [`Error::InvalidScope`].
    pub fn new(scope: impl Into<Cow<'static, str>>) -> Guard<'s> {
        Guard {
            scope: scope.into(),
            key: KeyBuilder::new("key"),
            fingerprint: None,
            retention: DEFAULT_RETENTION,
            claim_after: false,
            at_commit: false,
            precheck: None,
            on_store_error: OnStoreError::Reject,
            savepoint: true,
        }
    }

    /// Add a part of the key: one call for a simple key, one per part for a
    /// composite key (`.key(&req.user_id).key(&req.request_id)`). Strings,
    /// integers, `char`, `bool`, UUIDs and `Option`s of them
    /// ([`IdempotencyKey`]); an empty or all-whitespace string or a `None`
    /// fails the claim with [`Error::InvalidKey`].
    pub fn key<K: IdempotencyKey + ?Sized>(mut self, part: &K) -> Guard<'s> {
        self.key = self.key.part(part);
        self
    }

    /// Hash the request payload into the record, so that the same key sent
    /// with another payload is [`Error::KeyMismatch`] instead of a replay.
    /// The hash is [`Fingerprint::of`]'s: what counts as the same payload is
    /// in the [`key`](crate::key) module.
    pub fn fingerprint<F: Fingerprintable + ?Sized>(mut self, payload: &F) -> Guard<'s> {
        self.fingerprint = Some(Fingerprint::of(payload).map_err(|e| e.to_string()));
        self
    }

    /// How long records count (default [`DEFAULT_RETENTION`], 7 days): a
    /// repeat after that runs again. At least a millisecond, at most 100
    /// years, else the claim fails with [`Error::InvalidDuration`].
    pub fn retention(mut self, retention: Duration) -> Guard<'s> {
        self.retention = retention;
        self
    }

    /// `dedup` only (the other strategies claim before the body whatever
    /// this says): write the record with its response in one statement
    /// after the body instead of claiming it before (one statement fewer per
    /// first call). Only where the body's effects are all in the transaction
    /// and the guarded call is the transaction's first work: a repeat is
    /// found after its body ran, and the transaction is rolled back to its
    /// start (only the savepoint, in a nested one) before the first answer
    /// is replayed.
    pub fn claim_after(mut self) -> Guard<'s> {
        self.claim_after = true;
        self
    }

    /// `dedup` only: [`claim_after`](Self::claim_after), and on an
    /// [`idem::Tx`][Tx] the record with its answer is written in the
    /// text that commits the transaction (`INSERT ...; COMMIT`), so the
    /// guard writes once and sends nothing of its own:
    /// [`Ticket::complete`][crate::Ticket::complete] commits the `Tx` (a
    /// later `Tx::commit` sends nothing). The guarded call is then the
    /// whole transaction, its first work and its last. A repeat's insert
    /// fails on the key, which stops the text before its `COMMIT`: the
    /// transaction is rolled back, the body's writes with it, and the
    /// first answer replayed. On a `sqlx::Transaction`, which idem does not
    /// commit, it is `claim_after`. See `docs/dedup.md`.
    #[doc = links!()]
    pub fn claim_at_commit(mut self) -> Guard<'s> {
        self.claim_after = true;
        self.at_commit = true;
        self
    }

    /// Ask a marker store "seen before?" first (`dedup`, `dedup_state`,
    /// `token_dedup`, `lease`): a key seen before whose record is complete
    /// replays after one plain read, without the claim. The record stays
    /// the truth; markers live `ttl` (see [`precheck`](crate::precheck)).
    pub fn precheck(mut self, store: &'s dyn PrecheckStore, ttl: Duration) -> Guard<'s> {
        self.precheck = Some((store, ttl));
        self
    }

    /// Token strategies: what to do while the token store cannot be reached
    /// (default [`OnStoreError::Reject`]).
    pub fn on_store_error(mut self, policy: OnStoreError) -> Guard<'s> {
        self.on_store_error = policy;
        self
    }

    /// `unique` and `unique+state` only: whether the guard takes a savepoint
    /// before the body (default `true`), to roll a duplicate back to.
    /// `false` where the body's claiming insert is its first write and
    /// cannot fail its transaction: on PostgreSQL written with
    /// [`unique::insert`](crate::unique::insert) (`ON CONFLICT ... DO
    /// NOTHING`), on MySQL/MariaDB and SQLite a plain `INSERT` (their
    /// duplicate-key error undoes only its statement). The guard then
    /// sends nothing of its own. A plain insert's duplicate on PostgreSQL
    /// without it is [`Error::UniqueAborted`].
    #[cfg(feature = "sql")]
    pub fn savepoint(mut self, take: bool) -> Guard<'s> {
        self.savepoint = take;
        self
    }

    /// The key as written in the attribute (`"event.trade_no, event.user"`),
    /// so that an invalid part is named in the error.
    #[doc(hidden)]
    pub fn key_source(mut self, source: &'static str) -> Guard<'s> {
        self.key = self.key.sources(source);
        self
    }

    /// Add a part that also selects the entity a state guard moves (bound to
    /// the state enum's key columns, in order).
    pub fn entity_key<K: IdempotencyKey + ?Sized>(mut self, part: &K) -> Guard<'s> {
        self.key = self.key.entity_part(part);
        self
    }

    /// This guard's scope, as given.
    pub fn scope(&self) -> &str {
        &self.scope
    }

    pub(crate) fn scope_cow(&self) -> Cow<'static, str> {
        self.scope.clone()
    }

    pub(crate) fn precheck_store(&self) -> Option<(&'s dyn PrecheckStore, Duration)> {
        self.precheck
    }

    #[cfg(feature = "sql")]
    pub(crate) fn takes_savepoint(&self) -> bool {
        self.savepoint
    }

    #[cfg(feature = "sql")]
    pub(crate) fn has_key(&self) -> bool {
        !self.key.is_empty()
    }

    pub(crate) fn store_error_policy(&self) -> OnStoreError {
        self.on_store_error
    }

    /// The key alone (a lock taken around a claim the guard makes later).
    pub(crate) fn key_only(&self) -> Result<Key, Error> {
        check_scope(&self.scope)?;
        self.key.clone().finish(&self.scope)
    }

    /// [`prepare`](Self::prepare) for a strategy that claims before its body
    /// (all but `dedup`): `claim_after` does not apply.
    pub(crate) fn prepare_claim_before(self, strategy: &'static str, store: &'static str) -> Result<Prepared, Error> {
        let mut p = self.prepare(strategy, store)?;
        p.claim_after = false;
        p.at_commit = false;
        Ok(p)
    }

    /// Validate scope, key, fingerprint and retention, for `strategy` on
    /// `store` (both for logs and metrics).
    pub(crate) fn prepare(self, strategy: &'static str, store: &'static str) -> Result<Prepared, Error> {
        check_scope(&self.scope)?;
        #[cfg_attr(not(feature = "sql"), allow(unused_variables))]
        let (key, entity) = self.key.finish_with_entity(&self.scope)?;
        let fingerprint = match self.fingerprint {
            None => None,
            Some(Ok(f)) => Some(f),
            Some(Err(reason)) => {
                return Err(Error::InvalidKey {
                    scope: self.scope.into_owned(),
                    reason: format!("the fingerprint payload could not be serialised: {reason}"),
                });
            }
        };
        let retention = crate::error::check_ttl("retention", self.retention)?;
        let stored_scope = crate::key::stored_scope(&self.scope).into_owned();
        Ok(Prepared {
            started: std::time::Instant::now(),
            strategy,
            store,
            scope: self.scope,
            stored_scope,
            retention,
            claim_after: self.claim_after,
            at_commit: self.at_commit,
            key,
            #[cfg(feature = "sql")]
            entity,
            fingerprint,
        })
    }
}

impl std::fmt::Debug for Guard<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("scope", &self.scope)
            .field("retention", &self.retention)
            .field("claim_after", &self.claim_after)
            .field("at_commit", &self.at_commit)
            .field("precheck", &self.precheck.map(|(store, ttl)| (store.kind(), ttl)))
            .field("on_store_error", &self.on_store_error)
            .field("savepoint", &self.savepoint)
            .finish_non_exhaustive()
    }
}

/// A scope is a name people read in logs, tables and Redis keys; stores
/// escape or hash whatever it holds, but an empty one names nothing and a
/// control character is a slip nobody could type back.
fn check_scope(scope: &str) -> Result<(), Error> {
    let reason = if scope.trim().is_empty() {
        "it is empty"
    } else if scope.chars().any(char::is_control) {
        "it holds a control character"
    } else {
        return Ok(());
    };
    Err(Error::InvalidScope { scope: scope.escape_default().to_string(), reason })
}

/// A validated call: key, fingerprint, and the scope as stored. (Public
/// only as a parameter of [`TxContext`](crate::sql::TxContext)'s hidden steps.)
#[derive(Debug)]
pub struct Prepared {
    /// When the guard started (for the claim's latency).
    pub(crate) started: std::time::Instant,
    /// Which strategy and store, for logs and metrics.
    pub(crate) strategy: &'static str,
    pub(crate) store: &'static str,
    /// The scope as given, for messages and logs.
    pub(crate) scope: Cow<'static, str>,
    /// The scope as records store it (long ones hashed).
    pub(crate) stored_scope: String,
    pub(crate) retention: Duration,
    pub(crate) claim_after: bool,
    /// `claim = "commit"` (with `claim_after`): the record goes with the
    /// `COMMIT` of an `idem::Tx`.
    pub(crate) at_commit: bool,
    pub(crate) key: Key,
    /// The key parts as bound to the entity's key columns (state strategies).
    #[cfg(feature = "sql")]
    pub(crate) entity: Vec<SqlKey>,
    pub(crate) fingerprint: Option<Fingerprint>,
}

impl Prepared {
    pub(crate) fn labels(&self) -> crate::telemetry::metrics::Labels<'_> {
        crate::telemetry::metrics::Labels { scope: &self.scope, strategy: self.strategy, store: self.store }
    }

    /// Tell `observe`, the logs and the metrics what this call did.
    pub(crate) fn report(&self, outcome: crate::telemetry::Outcome) {
        if !matches!(outcome, crate::telemetry::Outcome::Executed) {
            // Decided without running the body: the claim was the whole guard.
            crate::telemetry::metrics::claim(self.labels(), self.started.elapsed());
        }
        crate::telemetry::report(self.labels(), &self.key, outcome);
    }

    /// The claim decided that the body runs.
    pub(crate) fn claimed(&self) {
        crate::telemetry::metrics::claim(self.labels(), self.started.elapsed());
    }

    pub(crate) fn mismatch(&self) -> Error {
        self.report(crate::telemetry::Outcome::Mismatched);
        Error::KeyMismatch { scope: self.scope.to_string(), key_hash: self.key.hash() }
    }

    #[cfg(feature = "sql")]
    pub(crate) fn unfinished(&self) -> Error {
        Error::Unfinished { scope: self.scope.to_string(), key_hash: self.key.hash() }
    }

    /// A repeat of a call that ran to success but whose answer was not kept.
    pub(crate) fn not_kept(&self) -> Error {
        self.report(crate::telemetry::Outcome::NotKept);
        Error::AnswerNotKept { scope: self.scope.to_string(), key_hash: self.key.hash() }
    }

    /// The first call's answer cannot go into its record (`why`): the record
    /// says "completed, answer not kept", and the first call still gets the
    /// answer its body gave.
    pub(crate) fn answer_not_kept(&self, why: impl std::fmt::Display) {
        crate::telemetry::metrics::answer_not_kept(&self.scope, self.store);
        tracing::warn!(target: "idem", scope = %self.scope, key = %self.key.hash(), strategy = self.strategy,
            store = self.store, reason = %why,
            "answer not kept: the body ran to success, but its answer cannot be stored; the record says so, and \
             repeats get Error::AnswerNotKept (never a second run)");
    }

    pub(crate) fn in_progress(&self, retry_after: Option<Duration>) -> Error {
        self.report(crate::telemetry::Outcome::InProgress);
        Error::InProgress { scope: self.scope.to_string(), key_hash: self.key.hash(), retry_after }
    }

    /// The fingerprint is checked before anything else about a record: a
    /// mismatch is a mismatch even while the first call still runs. A record
    /// written without a fingerprint (before one was declared) cannot be
    /// compared and passes; one written by 0.2 is compared in its version.
    #[cfg(feature = "sql")]
    pub(crate) fn check_fingerprint(&self, stored: Option<&str>) -> Result<(), Error> {
        match (&self.fingerprint, stored) {
            (Some(ours), Some(theirs)) if !ours.matches(theirs) => Err(self.mismatch()),
            _ => Ok(()),
        }
    }
}

/// Error types a guarded function can return: anything with
/// `From<idem::Error>`.
#[diagnostic::on_unimplemented(
    message = "the error type `{Self}` cannot carry idem's guard errors",
    label = "this error type needs `impl From<idem::Error>`",
    note = "add `impl From<idem::Error> for {Self}` (or a `#[from] idem::Error` variant with thiserror), so a key mismatch or a database failure in the guard reaches your caller"
)]
pub trait GuardError: From<Error> {}
impl<E: From<Error>> GuardError for E {}

/// A first call's answer as its record keeps it.
pub(crate) enum Kept<T> {
    /// Its JSON, and the value decoded back from it: what the first call
    /// returns, so that it gets what every repeat will (a `#[serde(skip)]`
    /// field at its default, a map in the order JSON gives it).
    Answer(String, T),
    /// It cannot be kept (see `encode` and `fit`, in `replay`): the record is
    /// completed without it, and the first call returns the value as the
    /// body gave it. A repeat gets [`Error::AnswerNotKept`], never a second run.
    NotKept(T),
}

impl<T> Kept<T> {
    /// The JSON to write (`None`: completed, answer not kept) and the value
    /// the first call returns.
    pub(crate) fn split(self) -> (Option<String>, T) {
        match self {
            Kept::Answer(json, value) => (Some(json), value),
            Kept::NotKept(value) => (None, value),
        }
    }
}

/// `encode` then `fit`, within the limit `limit` gives for the answer's
/// length: the answer kept, or (logged and counted) not kept.
pub(crate) async fn keep<T: Replayable, L: Future<Output = usize>>(
    p: &Prepared,
    value: T,
    limit: impl FnOnce(usize) -> L,
) -> Kept<T> {
    let json = match encode(&value) {
        Ok(json) => json,
        Err(e) => {
            p.answer_not_kept(format_args!("it does not serialize: {e}"));
            return Kept::NotKept(value);
        }
    };
    let max = limit(json.len()).await;
    match fit(&value, json, max) {
        Ok((json, back)) => Kept::Answer(json, back),
        Err(e) => {
            p.answer_not_kept(&e);
            Kept::NotKept(value)
        }
    }
}

/// Decode a stored first answer for a repeat, and report the replay.
pub(crate) fn replayed<T: Replayable>(p: &Prepared, json: &str) -> Result<T, Error> {
    let value = serde_json::from_str(json).map_err(|source| Error::Response {
        scope: p.scope.to_string(),
        action: "replayed",
        source,
    })?;
    p.report(crate::telemetry::Outcome::Replayed);
    Ok(value)
}
