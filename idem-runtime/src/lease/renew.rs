//! Running a body while a lease or lock it depends on is kept alive.

use std::time::Duration;

use tokio::time::Instant;

use crate::error::Error;

/// Drive `body` to its end, renewing the hold every third of `lease` while
/// it waits. `None` when the hold is lost: `renew` answered `false` (another
/// holder has it, or it is gone), or no renewal succeeded in time. The body
/// is then dropped where it stands, since another holder may run by now.
///
/// The hold is counted from the moment each successful renewal was *sent*
/// (the store restarted its TTL no earlier than that), and given up a sixth
/// of the lease before it would end by that count, so that this body stops
/// before another holder can start. A failed renewal is retried soon, not a
/// third of the lease later.
pub(crate) async fn under_renewal<F, R, Fut>(
    body: F,
    lease: Duration,
    renew: R,
    what: &str,
    scope: &str,
) -> Option<F::Output>
where
    F: Future,
    R: Fn() -> Fut,
    Fut: Future<Output = Result<bool, Error>>,
{
    let start = Instant::now();
    let mut body = std::pin::pin!(body);
    // Poll the body once before arming the renewal timer: a body that
    // finishes without waiting never touches the timer wheel (creating and
    // dropping a timer takes the runtime's timer lock).
    let first = std::future::poll_fn(|cx| std::task::Poll::Ready(body.as_mut().poll(cx))).await;
    if let std::task::Poll::Ready(output) = first {
        return Some(output);
    }
    let mut hold = Hold::new(start, lease);
    loop {
        tokio::select! {
            // The body first: a body that is ready is never held up.
            biased;
            output = &mut body => return Some(output),
            () = tokio::time::sleep_until(hold.next.min(hold.safe_until())) => {}
        }
        if Instant::now() >= hold.safe_until() {
            tracing::warn!(target: "idem", scope, "no renewal of the {what} succeeded in time; giving it up");
            return None;
        }
        // The renewal runs alongside the body, which keeps making progress.
        let sent = Instant::now();
        let renewal = tokio::select! {
            biased;
            output = &mut body => return Some(output),
            renewal = tokio::time::timeout_at(hold.safe_until(), renew()) => renewal,
        };
        match renewal {
            Ok(Ok(true)) => hold.renewed(sent),
            Ok(Ok(false)) => return None,
            Ok(Err(e)) => {
                tracing::warn!(target: "idem", scope, error = %e, "could not renew the {what}; trying again");
                hold.retry_soon();
            }
            Err(_) => {
                tracing::warn!(target: "idem", scope, "renewing the {what} timed out");
                hold.retry_soon();
            }
        }
    }
}

/// The renewal schedule of [`under_renewal`]'s hold: a renewal every third
/// of the lease, a retry a quarter of that after a failure, and the hold
/// counted on until a sixth of the lease before it would end.
struct Hold {
    lease: Duration,
    every: Duration,
    retry: Duration,
    margin: Duration,
    /// When the last renewal that succeeded was sent (at first, the start).
    renewed_at: Instant,
    /// When to renew next.
    next: Instant,
}

impl Hold {
    fn new(start: Instant, lease: Duration) -> Hold {
        let every = (lease / 3).max(Duration::from_millis(10));
        let retry = (every / 4).max(Duration::from_millis(5));
        Hold { lease, every, retry, margin: every / 2, renewed_at: start, next: start + every }
    }

    /// Until when the hold is safe to count on.
    fn safe_until(&self) -> Instant {
        self.renewed_at + self.lease.saturating_sub(self.margin)
    }

    /// A renewal sent at `sent` succeeded: the store restarted the TTL no
    /// earlier than that.
    fn renewed(&mut self, sent: Instant) {
        self.renewed_at = sent;
        self.next = sent + self.every;
    }

    /// A renewal failed: tried again soon, not a third of the lease later.
    fn retry_soon(&mut self) {
        self.next = Instant::now() + self.retry;
    }
}

/// A clean-up call (releasing a lock or a lease record after the body, or
/// after the hold was given up), abandoned after a third of the hold's
/// length: past that the store frees the hold by its TTL anyway, and the
/// caller learns the call's outcome instead of waiting on a store that does
/// not answer (a default `ConnectionManager` retries for many seconds).
pub(crate) async fn bounded<T>(
    hold: Duration,
    store: &'static str,
    call: impl Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    let limit = (hold / 3).max(Duration::from_millis(50));
    match tokio::time::timeout(limit, call).await {
        Ok(result) => result,
        Err(_) => Err(Error::Store { store, source: format!("no answer within {limit:?}").into() }),
    }
}
