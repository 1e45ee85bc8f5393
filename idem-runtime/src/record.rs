//! What a record holds: plain data, as stores and the operator's tools
//! read it.

use crate::key::Key;

/// Lifecycle of a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordStatus {
    /// Claimed; the guarded work has not finished (or its worker died).
    Processing,
    /// Finished; the record holds the response to replay.
    Done,
    /// The work failed in a way that allows a retry (lease strategy).
    Failed,
}

impl RecordStatus {
    /// The text stored in the `status` column.
    pub fn as_str(self) -> &'static str {
        match self {
            RecordStatus::Processing => "PROCESSING",
            RecordStatus::Done => "DONE",
            RecordStatus::Failed => "FAILED",
        }
    }

    /// The status as an SQL record's column holds it.
    #[cfg(feature = "sql")]
    pub(crate) fn parse(s: &str) -> Option<RecordStatus> {
        match s {
            "PROCESSING" => Some(RecordStatus::Processing),
            "DONE" => Some(RecordStatus::Done),
            "FAILED" => Some(RecordStatus::Failed),
            _ => None,
        }
    }
}

/// A stored record, as [`crate::sql::find_record`] returns it.
///
/// Timestamps are the store's clock in milliseconds since the Unix epoch.
#[cfg(feature = "sql")]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DedupRecord {
    /// Scope of the guard that wrote it.
    pub scope: String,
    /// The stored key (keys over [`crate::key::MAX_PLAIN_KEY_LEN`] bytes are hashed).
    pub key: String,
    /// Lifecycle state.
    pub status: RecordStatus,
    /// Hex SHA-256 of the request payload, when the guard declares a fingerprint.
    pub fingerprint: Option<String>,
    /// JSON of the first call's `Ok` value, once `Done`. `None` on a `Done`
    /// record: the call ran to success but its answer could not be kept
    /// (repeats get [`crate::Error::AnswerNotKept`]).
    pub response: Option<String>,
    /// Worker that holds the lease (lease strategy).
    pub owner: Option<String>,
    /// Fencing counter: incremented on every reclaim.
    pub fence: i64,
    /// End of the current lease (lease strategy).
    pub lease_until_ms: Option<i64>,
    /// When the record was written.
    pub created_at_ms: i64,
    /// Last change.
    pub updated_at_ms: i64,
    /// When it may be purged.
    pub expires_at_ms: i64,
}

/// Which record: a scope and a key, as the record stores them.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RecordId {
    scope: String,
    key: String,
}

impl RecordId {
    /// The record a guard of `scope` (as the guard names it: its
    /// `scope = "..."`, or `module_path::fn_name`) keeps for `key` (built as
    /// the guard builds it: [`Key::new`] for a one-part business key).
    /// Long scopes are hashed as the guards hash them.
    pub fn new(scope: &str, key: &Key) -> RecordId {
        RecordId { scope: crate::key::stored_scope(scope).into_owned(), key: key.as_str().to_owned() }
    }

    /// A record named as the store holds it: a scope and a key exactly as
    /// [`Record::scope`] and [`Record::key`] show them (a hashed
    /// `\sha256:...` one included), e.g. from `stuck`'s list.
    pub fn stored(scope: impl Into<String>, key: impl Into<String>) -> RecordId {
        RecordId { scope: scope.into(), key: key.into() }
    }

    /// The scope as stored.
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// The key as stored.
    pub fn key(&self) -> &str {
        &self.key
    }
}

/// What a record means now, by the store's clock. See the `admin` module's
/// docs for which states are stuck.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RecordState {
    /// `PROCESSING` with a live lease: a worker runs the call.
    Running,
    /// `PROCESSING` with its lease passed: the worker died or was dropped
    /// (stuck; the next call takes it over).
    LeasePassed,
    /// `PROCESSING` with no lease: a dedup record committed without its
    /// answer (stuck; repeats get [`Error::Unfinished`](crate::error::Error::Unfinished)).
    Unfinished,
    /// `DONE`: repeats replay its response.
    Done,
    /// `FAILED` (reserved by the schema; no guard writes it today).
    Failed,
    /// Past its retention (SQL only: Redis drops such a record itself):
    /// guards ignore it, a purge deletes it.
    Expired,
}

impl RecordState {
    /// `running`, `lease_passed`, `unfinished`, `done`, `failed` or `expired`.
    pub fn as_str(self) -> &'static str {
        match self {
            RecordState::Running => "running",
            RecordState::LeasePassed => "lease_passed",
            RecordState::Unfinished => "unfinished",
            RecordState::Done => "done",
            RecordState::Failed => "failed",
            RecordState::Expired => "expired",
        }
    }

    /// True for the states `release` acts on: [`LeasePassed`](Self::LeasePassed)
    /// and [`Unfinished`](Self::Unfinished).
    pub fn is_stuck(self) -> bool {
        matches!(self, RecordState::LeasePassed | RecordState::Unfinished)
    }

    #[cfg(feature = "sql")]
    pub(crate) fn parse(s: &str) -> Option<RecordState> {
        Some(match s {
            "running" => RecordState::Running,
            "lease_passed" => RecordState::LeasePassed,
            "unfinished" => RecordState::Unfinished,
            "done" => RecordState::Done,
            "failed" => RecordState::Failed,
            "expired" => RecordState::Expired,
            _ => return None,
        })
    }
}

/// A record as an operator sees it, read with the store's clock.
///
/// Timestamps are milliseconds since the Unix epoch on the store's clock;
/// `now_ms` is that clock when the record was read (so `now_ms -
/// created_at_ms` is its age, `lease_until_ms - now_ms` the lease left).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Record {
    /// The scope as stored (long ones hashed, see [`RecordId::new`]).
    pub scope: String,
    /// The key as stored ([`Key::as_str`]: parts joined and escaped, long
    /// keys hashed).
    pub key: String,
    /// The stored status.
    pub status: RecordStatus,
    /// What the record means now.
    pub state: RecordState,
    /// Hex SHA-256 of the first call's payload, when its guard declared one.
    pub fingerprint: Option<String>,
    /// JSON of the first call's answer, once done.
    pub response: Option<String>,
    /// The worker holding (or that last held) the lease.
    pub owner: Option<String>,
    /// Fencing token: a lease record's changes with every take-over; 0 for
    /// a dedup record.
    pub fence: i64,
    /// End of the lease (lease records while `PROCESSING`).
    pub lease_until_ms: Option<i64>,
    /// When the record was written or last taken over (SQL); when it was
    /// first claimed (Redis, from its fence: see `RedisStore::inspect_lease`).
    pub created_at_ms: Option<i64>,
    /// Last change (SQL); when its lease was last claimed, taken over or
    /// extended (Redis, while held).
    pub updated_at_ms: Option<i64>,
    /// When its retention ends (SQL), or its key's TTL runs out (Redis).
    pub expires_at_ms: Option<i64>,
    /// The store's clock when the record was read.
    pub now_ms: i64,
    /// The steps a lease-guarded call recorded so far (`lease::Steps`), in
    /// the order its body ran them; empty for a call that records none,
    /// has not finished its first, or completed (its steps go with the
    /// completion: its answer replays from then on). Of a stuck call, the
    /// last one is where it stopped: the step after it was in flight.
    pub steps: Vec<RecordStep>,
    /// The step after [`steps`](Self::steps), when it was marked started
    /// and has no result (a step with a check, or at-most-once, marks
    /// itself before its work): of a stuck call, the step in flight when
    /// its worker stopped. `None` for a plain step in flight: it leaves no
    /// mark.
    pub in_flight: Option<InFlightStep>,
}

/// A step marked started and not recorded: in flight when its attempt
/// stopped, unless that attempt still runs. Its work may or may not have
/// happened: the next attempt checks it with the outside system, or, for
/// an at-most-once step, stops in doubt until an operator resolves it
/// (`LeaseStore::resolve_step`, `idem steps resolve`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct InFlightStep {
    /// Its place in the body, from 0: the number of steps recorded.
    pub number: usize,
    /// Its name in the body.
    pub name: String,
    /// Its stable key, the one its work was given for the outside system:
    /// ask the outside system about it.
    pub key: String,
}

/// A step a lease-guarded call recorded: its `Ok` result, which a
/// take-over (or a retry after the body failed) replays without running
/// the step again.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecordStep {
    /// Its place in the body, from 0 (as the store numbers it, and as
    /// `Error::StepsChanged` counts).
    pub number: usize,
    /// Its name in the body (`steps.run("charge", ...)`).
    pub name: String,
    /// The JSON of its recorded result.
    pub result: String,
    /// Its stable key, the one the body was given to hand to the outside
    /// system (`lease::StepKey::for_step` of the record's scope, key and
    /// the step's name): look the step up there with it.
    pub key: String,
}

impl Record {
    /// Which record this is, to `release` it or read it again.
    pub fn id(&self) -> RecordId {
        RecordId::stored(self.scope.clone(), self.key.clone())
    }

    /// The key's parts as the guard was given them (see [`Key::parts`]):
    /// for a record of the HTTP layer with a tenant function, `[tenant,
    /// key]`. `None` for a hashed key.
    pub fn key_parts(&self) -> Option<Vec<String>> {
        crate::key::parts(&self.key)
    }

    /// How long ago it was written (SQL: or last taken over; Redis: first
    /// claimed).
    pub fn age_ms(&self) -> Option<i64> {
        self.created_at_ms.map(|c| self.now_ms - c)
    }

    /// Milliseconds left on its lease (negative once passed).
    pub fn lease_left_ms(&self) -> Option<i64> {
        self.lease_until_ms.map(|l| l - self.now_ms)
    }

    /// Set [`steps`](Self::steps) from the `(name, result)` pairs the store
    /// holds, in order, and [`in_flight`](Self::in_flight) from the
    /// `(number, name)` of its mark, each with its stable key.
    pub(crate) fn set_steps(
        &mut self,
        recorded: impl IntoIterator<Item = (String, String)>,
        marked: Option<(usize, String)>,
    ) {
        let key = |name: &str| crate::key::step_key(&self.scope, &self.key, name);
        let steps = recorded.into_iter().enumerate();
        let steps = steps.map(|(number, (name, result))| RecordStep { number, key: key(&name), name, result });
        let in_flight = marked.map(|(number, name)| InFlightStep { number, key: key(&name), name });
        (self.steps, self.in_flight) = (steps.collect(), in_flight);
    }
}

/// What `stuck` lists: one page of stuck records, in (scope, key) order.
#[cfg(feature = "sql")]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StuckQuery {
    /// Only this scope (as the guard names it; hashed like the guards do);
    /// `None`, the default, lists every scope.
    pub scope: Option<String>,
    /// Most records in the page (at least 1). Default 100.
    pub limit: u32,
    /// The page after this record (the last of the previous page); `None`
    /// starts at the beginning.
    pub after: Option<RecordId>,
}

#[cfg(feature = "sql")]
impl Default for StuckQuery {
    fn default() -> Self {
        StuckQuery { scope: None, limit: 100, after: None }
    }
}

/// What `release` (and `RedisStore::release_lease`) did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Release {
    /// The record was stuck with the fence the caller gave, and is gone:
    /// the next call of the key runs its body. The record as it was.
    Released(Record),
    /// No such record.
    NotFound,
    /// The record is not stuck (running, done, failed or expired): left
    /// alone. The record as it is.
    NotStuck(Record),
    /// The record has another fence than the caller gave: a worker took it
    /// over since the caller looked. Left alone; look again.
    FenceChanged(Record),
}
