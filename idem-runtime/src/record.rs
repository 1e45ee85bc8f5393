//! What a record holds, and how a caller learns whether a call ran or replayed.

use std::cell::Cell;
use std::future::Future;

use crate::metrics::Labels;

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

    pub(crate) fn parse(s: &str) -> Option<RecordStatus> {
        match s {
            "PROCESSING" => Some(RecordStatus::Processing),
            "DONE" => Some(RecordStatus::Done),
            "FAILED" => Some(RecordStatus::Failed),
            _ => None,
        }
    }
}

/// A stored record, as [`crate::find_record`] returns it.
///
/// Timestamps are the store's clock in milliseconds since the Unix epoch.
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

/// Whether a guarded call ran its body or replayed a stored answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// First call for this key: the body ran.
    Executed,
    /// A repeat: the body did not run; the first call's answer was returned
    /// (or, for a state change whose answer is not stored, the
    /// [`crate::SilentRepeat`] answer).
    Replayed,
    /// The guard refused the call without running the body: an illegal state
    /// transition ([`crate::Error::IllegalTransition`], also logged as an
    /// `ERROR` event) or a spent token ([`crate::Error::TokenRejected`]).
    /// Counted apart from repeats.
    Rejected,
    /// Another call with this key was still running: the call was told to
    /// retry later ([`crate::Error::InProgress`]).
    InProgress,
    /// The key came with another payload than its first call's
    /// ([`crate::Error::KeyMismatch`]).
    Mismatched,
    /// A repeat of a call that ran to success but whose answer could not be
    /// kept ([`crate::Error::AnswerNotKept`]): the body did not run again.
    NotKept,
}

impl Outcome {
    /// `executed`, `replayed`, `rejected`, `in_progress`, `mismatched` or
    /// `not_kept`, as in the tracing events and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Executed => "executed",
            Outcome::Replayed => "replayed",
            Outcome::Rejected => "rejected",
            Outcome::InProgress => "in_progress",
            Outcome::Mismatched => "mismatched",
            Outcome::NotKept => "not_kept",
        }
    }
}

tokio::task_local! {
    static OBSERVED: Cell<Option<Outcome>>;
}

/// Run `fut` and report what the last guard inside it did: ran, replayed,
/// or refused (a rejected token or state change, a call still in progress,
/// a key reused with another payload).
///
/// The guarded function keeps its signature, so the answer comes alongside:
///
/// ```
/// # extern crate idem_runtime as idem;
/// # async fn demo() {
/// let (result, outcome) = idem::observe(async { 42 }).await;
/// assert_eq!(result, 42);
/// assert_eq!(outcome, None); // no guard ran inside
/// # }
/// ```
///
/// Use it to set an `Idempotent-Replayed: true` response header or to count
/// replays. Every guard also emits a DEBUG `tracing` event (target `idem`) with the
/// scope, a short key hash and the outcome.
pub async fn observe<F: Future>(fut: F) -> (F::Output, Option<Outcome>) {
    OBSERVED
        .scope(Cell::new(None), async move {
            let out = fut.await;
            (out, OBSERVED.with(|c| c.get()))
        })
        .await
}

/// Forget what earlier guards in this `observe` reported, so that
/// [`reported`] tells whether a guard nested in the current one did.
pub(crate) fn forget_reported() {
    let _ = OBSERVED.try_with(|c| c.set(None));
}

/// Whether a guard reported since [`forget_reported`].
pub(crate) fn reported() -> bool {
    OBSERVED.try_with(|c| c.get().is_some()).unwrap_or(false)
}

pub(crate) fn report(labels: Labels<'_>, key: &crate::Key, outcome: Outcome) {
    let _ = OBSERVED.try_with(|c| c.set(Some(outcome)));
    crate::metrics::call(labels, outcome);
    // Per call, so at DEBUG: a busy service logs nothing by default. The key
    // hash is only computed when someone listens.
    if tracing::enabled!(target: "idem", tracing::Level::DEBUG) {
        tracing::debug!(target: "idem", scope = labels.scope, strategy = labels.strategy, store = labels.store,
            key = key.hash(), outcome = outcome.as_str(), "idempotent call {}", outcome.as_str());
    }
}
