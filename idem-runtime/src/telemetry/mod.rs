//! What guards tell the caller and the operator: whether a call ran or
//! replayed ([`observe`], [`Outcome`]), DEBUG `tracing` events (target
//! `idem`), and metrics.
//!
//! The table of metrics (names, kinds, labels) is in [`observe`]'s docs,
//! where users read it: keep it in step with `metrics.rs`.

use std::cell::Cell;
use std::future::Future;

pub(crate) mod metrics;

use metrics::Labels;

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
///
/// ## Metrics
///
/// Counters and histograms through the [`metrics`](https://docs.rs/metrics)
/// facade (feature `metrics`, off by default): install any recorder
/// (Prometheus, StatsD, ...) and these appear; without the feature they
/// compile to nothing.
///
/// | name | kind | labels | what |
/// |---|---|---|---|
/// | `idem_calls_total` | counter | `scope`, `strategy`, `store`, `outcome` | guarded calls by outcome: `executed`, `replayed`, `rejected`, `in_progress`, `mismatched`, `not_kept` |
/// | `idem_claim_seconds` | histogram | `scope`, `strategy`, `store` | from the guard's start to its decision (run, replay or refusal) |
/// | `idem_complete_seconds` | histogram | `scope`, `strategy`, `store` | storing a first call's answer (or removing its record) |
/// | `idem_leases_taken_over_total` | counter | `scope`, `store` | lease records taken over after their lease passed (a worker stopped mid-work) |
/// | `idem_leases_lost_total` | counter | `scope`, `store` | leases lost while their body ran (taken over, or not renewed in time) |
/// | `idem_locks_lost_total` | counter | `scope`, `store` | locks lost while their body ran |
/// | `idem_illegal_transitions_total` | counter | `scope`, `store` | state changes the state machine refused |
/// | `idem_answers_not_kept_total` | counter | `scope`, `store` | first calls that ran to success but whose answer could not be stored (their records say so; repeats get `not_kept`) |
///
/// Labels hold the guard's scope as written: keep scopes to a bounded set
/// (they are code, not data), as every label of a metric should be.
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

pub(crate) fn report(labels: Labels<'_>, key: &crate::key::Key, outcome: Outcome) {
    let _ = OBSERVED.try_with(|c| c.set(Some(outcome)));
    metrics::call(labels, outcome);
    // Per call, so at DEBUG: a busy service logs nothing by default. The key
    // hash is only computed when someone listens.
    if tracing::enabled!(target: "idem", tracing::Level::DEBUG) {
        tracing::debug!(target: "idem", scope = labels.scope, strategy = labels.strategy, store = labels.store,
            key = key.hash(), outcome = outcome.as_str(), "idempotent call {}", outcome.as_str());
    }
}
