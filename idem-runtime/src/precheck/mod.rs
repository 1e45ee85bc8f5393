//! `precheck = "redis"`: the user-facing documentation is the `idem` crate's
//! `precheck` module; this is the runtime behind it.

pub(crate) mod store;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::error::Error;

/// Marker TTL when the attribute gives none.
pub const DEFAULT_TTL: Duration = Duration::from_secs(24 * 3600);

pub use crate::precheck::store::PrecheckStore;

/// What the prechecks of this process found, since it started. Monotonic:
/// take differences between two readings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// First sight: the marker was written, the normal claim ran.
    pub marked: u64,
    /// The marker was there (a precheck hit).
    pub seen: u64,
    /// Seen, and a completed record confirmed it: replayed without a claim.
    pub confirmed: u64,
    /// Seen, but no completed record: the normal claim ran (a crash or
    /// rollback after the marker, or the first call still running).
    pub missing: u64,
    /// The precheck store failed: the database alone decided.
    pub unavailable: u64,
}

static MARKED: AtomicU64 = AtomicU64::new(0);
static SEEN: AtomicU64 = AtomicU64::new(0);
static CONFIRMED: AtomicU64 = AtomicU64::new(0);
static MISSING: AtomicU64 = AtomicU64::new(0);
static UNAVAILABLE: AtomicU64 = AtomicU64::new(0);

/// This process's precheck counters.
pub fn counters() -> Counters {
    Counters {
        marked: MARKED.load(Ordering::Relaxed),
        seen: SEEN.load(Ordering::Relaxed),
        confirmed: CONFIRMED.load(Ordering::Relaxed),
        missing: MISSING.load(Ordering::Relaxed),
        unavailable: UNAVAILABLE.load(Ordering::Relaxed),
    }
}

/// What a precheck found, as the dedup guard acts on it.
pub(crate) enum Sight {
    First,
    Seen,
    Unknown,
}

/// How long a call waits for the precheck store before the database record
/// alone decides. The marker only saves a statement, so a slow or
/// unreachable store must not cost more than that: a default
/// `ConnectionManager` retries for about 9.5 s before it reports Redis down.
/// A marker written after the wait was given up is harmless (a later repeat
/// confirms it against the record).
pub const WAIT: Duration = Duration::from_millis(250);

/// Mark the key seen, or find it seen. A store that fails or does not
/// answer within [`WAIT`] leaves the database alone to decide; no store
/// configured at all is [`Error::NoStore`] (a configuration mistake, not
/// an outage).
pub(crate) async fn look(
    store: &dyn PrecheckStore,
    scope: &str,
    key: &str,
    ttl: Duration,
    guard: &str,
) -> Result<Sight, Error> {
    let marked = tokio::time::timeout(WAIT, store.mark(scope, key, ttl)).await.unwrap_or_else(|_| {
        Err(Error::Store { store: store.kind(), source: format!("no answer within {WAIT:?}").into() })
    });
    Ok(match marked {
        Ok(true) => {
            MARKED.fetch_add(1, Ordering::Relaxed);
            Sight::First
        }
        Ok(false) => {
            SEEN.fetch_add(1, Ordering::Relaxed);
            Sight::Seen
        }
        Err(e @ Error::NoStore { .. }) => return Err(e),
        Err(e) => {
            // Warn once per burst: an outage would otherwise log every call.
            let n = UNAVAILABLE.fetch_add(1, Ordering::Relaxed);
            if n.is_power_of_two() || n == 0 {
                tracing::warn!(target: "idem", scope = guard, store = store.kind(), error = %e, failures = n + 1,
                    "precheck store unreachable; the database record alone decides");
            } else {
                tracing::debug!(target: "idem", scope = guard, store = store.kind(), error = %e,
                    "precheck store unreachable; the database record alone decides");
            }
            Sight::Unknown
        }
    })
}

pub(crate) fn confirmed(yes: bool) {
    if yes { &CONFIRMED } else { &MISSING }.fetch_add(1, Ordering::Relaxed);
}
