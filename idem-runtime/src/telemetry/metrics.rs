//! The counters and histograms (see the table in [`telemetry`](super)); without the `metrics` feature every function
//! here compiles to nothing.

use std::time::Duration;

use super::Outcome;

/// Which guard a measurement belongs to.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Labels<'a> {
    pub scope: &'a str,
    pub strategy: &'static str,
    pub store: &'static str,
}

#[cfg(feature = "metrics")]
mod on {
    use super::*;

    pub(crate) fn call(l: Labels<'_>, outcome: Outcome) {
        metrics::counter!("idem_calls_total", "scope" => l.scope.to_owned(), "strategy" => l.strategy,
            "store" => l.store, "outcome" => outcome.as_str())
        .increment(1);
    }

    pub(crate) fn claim(l: Labels<'_>, took: Duration) {
        metrics::histogram!("idem_claim_seconds", "scope" => l.scope.to_owned(), "strategy" => l.strategy,
            "store" => l.store)
        .record(took.as_secs_f64());
    }

    pub(crate) fn complete(l: Labels<'_>, took: Duration) {
        metrics::histogram!("idem_complete_seconds", "scope" => l.scope.to_owned(), "strategy" => l.strategy,
            "store" => l.store)
        .record(took.as_secs_f64());
    }

    pub(crate) fn event(name: &'static str, scope: &str, store: &'static str) {
        metrics::counter!(name, "scope" => scope.to_owned(), "store" => store).increment(1);
    }
}

#[cfg(not(feature = "metrics"))]
mod on {
    use super::*;

    pub(crate) fn call(_: Labels<'_>, _: Outcome) {}
    pub(crate) fn claim(_: Labels<'_>, _: Duration) {}
    pub(crate) fn complete(_: Labels<'_>, _: Duration) {}
    pub(crate) fn event(_: &'static str, _: &str, _: &'static str) {}
}

pub(crate) use on::{call, claim, complete};

/// A lease record taken over after its lease passed.
pub(crate) fn lease_taken_over(scope: &str, store: &'static str) {
    on::event("idem_leases_taken_over_total", scope, store);
}

/// A lease lost while its body ran.
pub(crate) fn lease_lost(scope: &str, store: &'static str) {
    on::event("idem_leases_lost_total", scope, store);
}

/// A lock lost while its body ran.
pub(crate) fn lock_lost(scope: &str, store: &'static str) {
    on::event("idem_locks_lost_total", scope, store);
}

/// A state change refused.
#[cfg(feature = "sql")]
pub(crate) fn illegal_transition(scope: &str, store: &'static str) {
    on::event("idem_illegal_transitions_total", scope, store);
}

/// A first call's answer that could not be stored.
pub(crate) fn answer_not_kept(scope: &str, store: &'static str) {
    on::event("idem_answers_not_kept_total", scope, store);
}
