//! The one error type every guard returns.

use std::time::Duration;

/// What can go wrong in a guard, other than the guarded function's own error.
///
/// A guarded function's error type converts from this one (`impl From<idem::Error>
/// for AppError`), so every guard failure reaches the caller through the
/// function's own `Result`.
///
/// A **duplicate is never an error**: a repeat of a completed call replays the
/// first answer as `Ok`. The variants below are what a caller has to act on.
///
/// `IllegalTransition` and `NotFound` come from the state strategies,
/// `TokenRejected` from `token`, `LockBusy` and `LockLost` from the lock
/// strategies, `LeaseLost` (and most `InProgress`) from `lease`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The key was first used with a different payload (its fingerprint differs).
    /// A retry must send the same request; a new request needs a new key.
    #[error(
        "idempotency key {key_hash} in scope `{scope}` was first used with a different payload; \
         a retry must repeat the same request, a new request needs a new key"
    )]
    KeyMismatch {
        /// Scope of the guard.
        scope: String,
        /// Short hash of the key (keys can carry personal data, so they are not printed).
        key_hash: String,
    },

    /// Another call with the same key is still running (or was cut off before it
    /// finished). Retry later; `retry_after` is a hint when the store knows one.
    #[error("a call with idempotency key {key_hash} in scope `{scope}` is still in progress; retry later")]
    InProgress {
        /// Scope of the guard.
        scope: String,
        /// Short hash of the key.
        key_hash: String,
        /// When a retry may succeed, if known.
        retry_after: Option<Duration>,
    },

    /// A dedup record was committed without its response: the guarded call was
    /// cancelled (its future dropped) mid-body and the caller committed the
    /// transaction anyway. Whether the effect happened is unknown, so idem
    /// neither replays nor runs it again. Not retryable: reconcile the business
    /// state by hand, then delete the record (scope, key) to release the key.
    #[error(
        "a record for key {key_hash} in scope `{scope}` was committed without its response (the guarded call \
         was cancelled or panicked, and its transaction committed anyway); reconcile by hand, then delete the record"
    )]
    Unfinished {
        /// Scope of the guard.
        scope: String,
        /// Short hash of the key.
        key_hash: String,
    },

    /// The first call with this key ran to success, but its answer could not
    /// be kept (too large for the store, a value JSON cannot carry exactly,
    /// or the store failed as it was written): its record says "completed,
    /// answer not kept". The body is never run again within the record's
    /// retention, and there is no answer to replay. Not retryable: look the
    /// outcome up by other means (the business row, the order's status).
    /// The first call itself returned its answer; its log line
    /// (`answer not kept`, WARN) says why it could not be stored.
    #[error(
        "the call with idempotency key {key_hash} in scope `{scope}` already ran to success, but its answer was \
         not kept (too large or not storable; see the first call's log); it will not run again: look its \
         outcome up instead of retrying"
    )]
    AnswerNotKept {
        /// Scope of the guard.
        scope: String,
        /// Short hash of the key.
        key_hash: String,
    },

    /// A state change the entity's state machine does not allow from its current
    /// state: the entity is neither in a source state of the transition nor
    /// already in its target (which would be a repeat, a silent success).
    /// Nothing was changed. Also emitted as an `ERROR` tracing event, since it
    /// usually means a bug or an out-of-order message, not a retry.
    #[error(
        "illegal state transition {from} -> {to} for key {key_hash} in scope `{scope}`: the entity is in state {current}"
    )]
    IllegalTransition {
        /// Scope of the guard.
        scope: String,
        /// Short hash of the key.
        key_hash: String,
        /// The source state(s) the guard expected (`OrderStatus::WaitPay`).
        from: String,
        /// The target state.
        to: String,
        /// The state the entity is actually in.
        current: String,
    },

    /// The entity a state guard should move does not exist (no row with the key
    /// in the state enum's table). Nothing was changed.
    #[error("no entity with key {key_hash} in scope `{scope}`")]
    NotFound {
        /// Scope of the guard.
        scope: String,
        /// Short hash of the key.
        key_hash: String,
    },

    /// A one-time token was already used, has expired, or was never issued.
    /// Show the user "please do not submit twice".
    #[error("the request token was already used or has expired; please do not submit twice")]
    TokenRejected,

    /// Another holder has the lock (a concurrent call with the same key).
    #[error("the lock `{name}` is held by another caller; retry later")]
    LockBusy {
        /// Lock name.
        name: String,
        /// When the current holder's lease ends, if known.
        retry_after: Option<Duration>,
    },

    /// This call's lease stopped being its own while its body ran ([`LostLease`]
    /// says how). The body was stopped at its next `.await` (one that
    /// blocked its thread past the lease finds its completion refused);
    /// nothing it would have stored was written, and another call holds or
    /// completed the key: a retry replays that call's answer, or waits for
    /// it. What the body already did outside stands: make those writes
    /// conditional on the fence ([`lease::current`](crate::lease::current)).
    #[error(
        "the lease on key {key_hash} in scope `{scope}` {why}; nothing was overwritten, and a retry gets the answer of the call that holds the key now"
    )]
    LeaseLost {
        /// Scope of the guard.
        scope: String,
        /// Short hash of the key.
        key_hash: String,
        /// How it was lost.
        why: LostLease,
    },

    /// A recorded step of a lease body ([`Steps::run`](crate::lease::Steps::run))
    /// broke a rule: a name used twice in one body, empty or too long, more
    /// steps than a call records, a result that cannot be recorded exactly,
    /// or a store that keeps no steps. Return it from the body: the call
    /// fails and nothing more is recorded.
    #[error("step `{step}` of scope `{scope}`: {reason}")]
    Step {
        /// Scope of the guard.
        scope: String,
        /// The step's name.
        step: String,
        /// What is wrong, and what to do.
        reason: String,
    },

    /// A call resumed after a crash or a failure names another step at a
    /// place than the one its earlier attempt recorded: the body changed
    /// between deploys. Nothing was replayed or run at that place.
    #[error(
        "the steps of scope `{scope}` changed since this call recorded them: step {position} was `{recorded}` and \
         is now `{found}`; let the calls the old body started finish (or release them with `idem release`) before \
         reordering or renaming steps, or give the new body a scope of its own"
    )]
    StepsChanged {
        /// Scope of the guard.
        scope: String,
        /// The step's place in the body, from 0.
        position: usize,
        /// The step recorded there.
        recorded: String,
        /// The step the body names there now.
        found: String,
    },

    /// An at-most-once step ([`Steps::run_at_most_once`](crate::lease::Steps::run_at_most_once))
    /// was in flight when an earlier attempt of this call stopped (its
    /// worker died, its body was dropped or panicked): whether its work
    /// happened is unknown, and idem does not guess. Nothing ran; every
    /// attempt of the call stops here until an operator asks the outside
    /// system about `step_key` and resolves the step with `idem steps
    /// resolve` (done, with its result, or not done). Not retryable.
    #[error(
        "step `{step}` of the call with idempotency key {key_hash} in scope `{scope}` is in doubt: it is \
         at-most-once and was in flight when an earlier attempt stopped, so it may or may not have taken effect; \
         ask the outside system about step key {step_key}, then resolve it with `idem steps resolve --step {step} \
         --done --result JSON` or `--not-done` (with the call's --scope and --key)"
    )]
    InDoubt {
        /// Scope of the guard.
        scope: String,
        /// Short hash of the call's key.
        key_hash: String,
        /// The step's name.
        step: String,
        /// The step's stable key, the one its work was given for the
        /// outside system ([`StepKey`](crate::lease::StepKey)).
        step_key: String,
    },

    /// The lock a `lock+dedup`, `lock+state` or `lock` guard held was lost
    /// while the call ran (its renewals failed, or another holder has it).
    /// The body was stopped mid-way, or (with `dedup` or `state`) its result
    /// withheld before your commit: roll the transaction back (returning
    /// this error through `?` does). Whatever a stopped body did outside any
    /// transaction stands.
    #[error(
        "the lock on key {key_hash} in scope `{scope}` was lost while the call ran; another caller may hold it, \
         so roll back this call's transaction"
    )]
    LockLost {
        /// Scope of the guard.
        scope: String,
        /// Short hash of the key.
        key_hash: String,
    },

    /// A duration given at run time cannot be kept: a token's or a lock's
    /// TTL, a lease or a retention of zero (or under a millisecond, the finest any store keeps), or
    /// over 100 years (what every store can count). Nothing was written.
    #[error("{what} of {duration:?} cannot be used: {reason}; give at least a millisecond and at most 100 years")]
    InvalidDuration {
        /// Which duration: `token TTL`, `lock TTL`, `lease`, `retention`.
        what: &'static str,
        /// The duration given.
        duration: Duration,
        /// Why it cannot be used.
        reason: &'static str,
    },

    /// A guard's scope cannot name records: it is empty, or holds a control
    /// character. (The attribute refuses such a scope at compile time.)
    #[error("invalid scope `{scope}`: {reason}; a scope is a name like \"payments.on_pay\"")]
    InvalidScope {
        /// The scope, escaped for printing.
        scope: String,
        /// What is wrong with it.
        reason: &'static str,
    },

    /// The idempotency key cannot be used (empty, missing, or malformed).
    #[error("invalid idempotency key in scope `{scope}`: {reason}")]
    InvalidKey {
        /// Scope of the guard.
        scope: String,
        /// What is wrong, naming the key part.
        reason: String,
    },

    /// The transaction handed to a dedup guard is not inside a transaction (a
    /// `TxContext` of the application's returned a bare connection): the record
    /// would commit apart from the business change, so nothing was written.
    #[error(
        "the connection given to the guard of scope `{scope}` is not inside a transaction; \
         begin one, so the dedup record commits or rolls back with your change"
    )]
    NoTransaction {
        /// Scope of the guard.
        scope: String,
    },

    /// An [`idem::Tx`][Tx] (feature `tx`) was used after its commit or
    /// rollback, or after one of its statements was cancelled (a dropped
    /// future, a timeout) or failed with the server's state unknown. Its
    /// connection is closed when it is dropped, so the server rolls back.
    #[doc = links!()]
    #[error("this idem::Tx cannot be used any more: {reason}; begin a new one with `idem::begin(&pool)`")]
    TxUnusable {
        /// What happened to it.
        reason: &'static str,
    },

    /// The dedup record a first call claimed was gone from its own
    /// transaction when its answer was to be stored: the body deleted it,
    /// the ticket was completed on another transaction than its claim's,
    /// or the server rolled the transaction back (a deadlock victim). The
    /// transaction must not commit: roll it back (an `idem::Tx` committed
    /// nothing); after the rollback, running the call again is safe.
    #[error(
        "the dedup record of scope `{scope}` vanished inside its own transaction before its answer was stored \
         (deleted by the body, completed on another transaction, or rolled back by the server); roll the \
         transaction back"
    )]
    RecordVanished {
        /// Scope of the guard (of an `idem::Tx`'s commit: the scopes of the
        /// answers it carried, `, `-separated).
        scope: String,
    },

    /// PostgreSQL: the session held a statement of the application's under
    /// the name an [`idem::Tx`](crate::Tx) gives its claim
    /// (`idem_claim_<hash>`), with the claim's parameter types, so the claim
    /// ran it and wrote no record; the answer then found none. Nothing was
    /// committed. idem deallocated that statement: the session's next claim
    /// prepares its own, so running the call again works.
    #[error(
        "the session's prepared statement `{name}` was not idem's claim (a statement of the application's under \
         idem's name, with the same parameter types): this transaction's claim wrote no record and nothing was \
         committed; idem deallocated it, so running the call again works"
    )]
    #[cfg(feature = "tx")]
    StatementTaken {
        /// The statement's name.
        name: String,
    },

    /// A state machine does not fit its table: a transition moved more
    /// than one row (the key columns are not unique), or a key or state
    /// code has another type than its column. Nothing may commit: roll the
    /// transaction back and fix the mapping.
    #[error("the state machine `{name}` does not fit its table `{table}`: {reason}; roll the transaction back")]
    StateTable {
        /// The state enum's name.
        name: &'static str,
        /// Its table.
        table: &'static str,
        /// What does not fit, and what to change.
        reason: String,
    },

    /// The guarded function's `Ok` value could not be stored, or a stored one no
    /// longer decodes into the function's type (it changed since the first call).
    #[error("response of scope `{scope}` could not be {action}: {source}{}", response_hint(.action))]
    Response {
        /// Scope of the guard.
        scope: String,
        /// `stored` or `replayed`.
        action: &'static str,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },

    /// An idem table does not exist (`idem_records`, or `idem_records_archive`
    /// for a purge with `archive`): `idem::migrate` was not run, or not every
    /// migration file was applied.
    #[error(
        "an idem table is missing on {backend}: run `idem::migrate(&pool).await` at start-up or apply every \
         SQL file in idem-runtime/migrations/{backend}/ (the database's error names the table: {source})"
    )]
    #[cfg(feature = "sql")]
    NotMigrated {
        /// `postgres`, `mysql` or `sqlite`.
        backend: &'static str,
        /// The database error.
        #[source]
        source: sqlx::Error,
    },

    /// The statement given to [`idem::sql::begin_with`][begin_with] is not
    /// one that begins a transaction and nothing else: the first guard's
    /// claim is sent in the same text, so anything else could run it outside
    /// the transaction, or comment it out.
    #[doc = links!()]
    #[error(
        "`{statement}` cannot begin an idem::Tx: {reason}; write `BEGIN ...` or `START TRANSACTION ...` with its \
         options only (on MySQL, set the isolation level for the session instead)"
    )]
    InvalidBegin {
        /// The statement as given.
        statement: String,
        /// What is wrong with it.
        reason: &'static str,
    },

    /// A record table name that is not a plain `name` or `schema.name`, or
    /// one installed after this process already used `idem_records`
    /// ([`StoresBuilder::record_table`][crate::StoresBuilder::record_table]).
    #[doc = links!()]
    #[error("invalid record table `{table}`: {reason}")]
    InvalidTable {
        /// The name given.
        table: String,
        /// What is wrong with it.
        reason: String,
    },

    /// An outbox message (feature `outbox`) is larger than the handle
    /// takes: its payload and headers together. Nothing was written; the
    /// body decides what to do (a retry would fail the same way).
    #[error(
        "the outbox message to `{topic}` is {len} bytes, over the limit of {limit}: publish a reference to the \
         data (a row id, an object's key) instead of the data, or raise the limit with `Outbox::max_payload` if \
         your broker takes it"
    )]
    #[cfg(feature = "outbox")]
    MessageTooLarge {
        /// The message's topic.
        topic: String,
        /// Its payload's and headers' bytes.
        len: usize,
        /// The handle's limit.
        limit: usize,
    },

    /// An outbox message (feature `outbox`) that cannot be published as
    /// given: its topic is empty, longer than 255 bytes or holds a control
    /// character, a header's name is empty or either holds a control
    /// character, or its value does not serialize. Nothing was written.
    #[error("the outbox message to `{topic}` cannot be published: {reason}")]
    #[cfg(feature = "outbox")]
    InvalidMessage {
        /// The message's topic, escaped for printing.
        topic: String,
        /// What is wrong, and what to give instead.
        reason: String,
    },

    /// A delivery a consumer received carries no message id (features
    /// `rabbitmq`, `nats`: [`outbox::consumer::message_id`](crate::outbox::consumer::message_id)):
    /// no AMQP `message_id` property, no `Nats-Msg-Id` header, or an empty
    /// one. Its producer is not the outbox's relay, or did not set it; the
    /// delivery cannot be deduplicated by id: refuse (dead-letter) it.
    #[error("{delivery}: it cannot be deduplicated by message id; have its producer set one (idem's relay does)")]
    #[cfg(any(feature = "rabbitmq", feature = "nats"))]
    NoMessageId {
        /// The delivery (its exchange and routing key, or its subject) and
        /// where its id was looked for.
        delivery: String,
    },

    /// A lease store other than a SQL database (Redis) failed: unreachable,
    /// timed out, or answered something unexpected. Never a duplicate.
    #[error("{store} store error: {source}")]
    Store {
        /// `redis`, `os random` (token generation), or `routed` (a [`Routed`](crate::store::Routed) store's route
        /// named no shard; not retryable).
        store: &'static str,
        /// What the client library reported.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// A guard needs a store of a role (`lease`, `token`, `lock`,
    /// `precheck`), names none with `store = "..."`, and none is installed
    /// for that role. Nothing was run. There is no silent fallback: a store
    /// other instances cannot see would let each of them run a repeat.
    #[error(
        "no {role} store is configured: install one at start-up with \
         `idem::Stores::builder().{role}(store).install()?` (or `.all(store)` for a RedisStore or MemoryStore), \
         or name one on the guard with `store = \"...\"`"
    )]
    NoStore {
        /// The role with no store: `lease`, `token`, `lock` or `precheck`.
        role: &'static str,
    },

    /// [`Stores::installed`](crate::Stores::installed) found no stores:
    /// [`StoresBuilder::install`](crate::StoresBuilder::install) has not run.
    #[error(
        "idem's stores are not installed: call `idem::Stores::builder()....install()?` once at start-up, before \
         the first guarded call"
    )]
    StoresNotInstalled,

    /// [`StoresBuilder::install`](crate::StoresBuilder::install) ran a second
    /// time. The first configuration stays in force: install once, at
    /// start-up, before the first guarded call.
    #[error("idem's stores are already installed; install them once, at start-up (the first configuration stays)")]
    StoresAlreadyInstalled,

    /// `strategy = "unique"` names a constraint the database cannot tell
    /// apart (SQLite: no index of that name).
    #[error("unique constraint `{constraint}`: {reason}")]
    InvalidConstraint {
        /// The constraint (or index) as the guard names it.
        constraint: String,
        /// What is wrong with it.
        reason: String,
    },

    /// `strategy = "unique"` without a savepoint, and the body's plain
    /// `INSERT` hit the constraint on PostgreSQL: the duplicate aborted the
    /// transaction, so the existing row cannot be read in it. Roll back;
    /// then let the guard take its savepoint (the default) or write the
    /// insert with `idem::unique::insert` (`ON CONFLICT ... DO NOTHING`).
    #[error(
        "a duplicate on `{constraint}` in scope `{scope}` aborted the PostgreSQL transaction (the guard took no \
         savepoint): write the insert with idem::unique::insert (ON CONFLICT ON CONSTRAINT {constraint} DO \
         NOTHING), or drop `savepoint = false`"
    )]
    UniqueAborted {
        /// Scope of the guard.
        scope: String,
        /// The constraint.
        constraint: String,
    },

    /// Any other database error. Never a duplicate: only a unique-key violation on
    /// the record is treated as one.
    #[error("database error: {0}")]
    #[cfg(feature = "sql")]
    Database(#[from] sqlx::Error),
}

/// How a lease was lost ([`Error::LeaseLost`], [`LeaseInfo::lost`](crate::lease::LeaseInfo::lost)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostLease {
    /// The store answered that the record is no longer this call's: another
    /// call took it over once its lease had passed (this one was paused, or
    /// cut off from the store, for longer than the lease), or an operator
    /// released it.
    TakenOver,
    /// No renewal reached the store in time: it did not answer for most of
    /// the lease, so another call may take the record over soon; this one
    /// gave the lease up before that could happen.
    NotRenewed,
}

impl std::fmt::Display for LostLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LostLease::TakenOver => {
                "was taken over by another call (this one was paused or cut off from the store for longer than its lease)"
            }
            LostLease::NotRenewed => "could not be renewed in time (the store did not answer)",
        })
    }
}

impl Error {
    /// True for errors where retrying the same request later can succeed
    /// (`InProgress`, `LockBusy`, `LockLost`, `LeaseLost`, `StatementTaken`, store failures, and transient
    /// database failures: lost connections, pool timeouts, deadlocks and
    /// serialization failures, SQLite's busy database).
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::InProgress { .. } | Error::LockBusy { .. } | Error::LockLost { .. } | Error::LeaseLost { .. } => {
                true
            }
            #[cfg(feature = "tx")]
            Error::StatementTaken { .. } => true,
            // A route to a shard that does not exist stays wrong.
            Error::Store { store, .. } => *store != "routed",
            #[cfg(feature = "sql")]
            Error::Database(sqlx::Error::Database(db)) => {
                // Deadlock and serialization failures (SQLSTATE 40001, PostgreSQL
                // 40P01), SQLite's busy and locked: the transaction was rolled
                // back or never got its lock; running it again can succeed.
                matches!(db.code().as_deref(), Some("40001" | "40P01" | "5" | "6" | "517"))
            }
            #[cfg(feature = "sql")]
            Error::Database(e) => matches!(e, sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed),
            _ => false,
        }
    }
}

impl Error {
    /// A deadlock or serialization failure: the server rolled the statement
    /// (or its transaction) back, and sending it again can succeed.
    #[cfg(feature = "sql")]
    pub(crate) fn is_deadlock(&self) -> bool {
        matches!(self, Error::Database(sqlx::Error::Database(db)) if matches!(db.code().as_deref(), Some("40001" | "40P01")))
    }
}

/// The longest duration any store keeps: 100 years as humantime counts them
/// (the attribute's arguments have the same bound, checked at compile time).
pub(crate) const MAX_DURATION: Duration = Duration::from_secs(100 * 31_557_600);

/// `duration` as a TTL some store will hold: at least a millisecond (the
/// finest any store keeps; under it Redis would hold nothing) and at most
/// [`MAX_DURATION`] (beyond it Redis and the SQL databases refuse or
/// overflow).
pub(crate) fn check_ttl(what: &'static str, duration: Duration) -> Result<Duration> {
    let reason = if duration < Duration::from_millis(1) {
        "nothing would be held"
    } else if duration > MAX_DURATION {
        "longer than any store keeps"
    } else {
        return Ok(duration);
    };
    Err(Error::InvalidDuration { what, duration, reason })
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What to check when a stored answer does not decode.
fn response_hint(action: &str) -> &'static str {
    if action == "replayed" {
        " (the stored answer does not decode into this function's `Ok` type: did the type change since the \
         first call, or do two guards with different types share this scope? Give each its own `scope`)"
    } else {
        ""
    }
}
