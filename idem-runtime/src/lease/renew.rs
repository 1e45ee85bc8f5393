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
    let every = (lease / 3).max(Duration::from_millis(10));
    let retry = (every / 4).max(Duration::from_millis(5));
    let margin = every / 2;
    // Until when the hold is safe to count on.
    let mut safe_until = start + lease.saturating_sub(margin);
    let mut next = start + every;
    loop {
        tokio::select! {
            // The body first: a body that is ready is never held up.
            biased;
            output = &mut body => return Some(output),
            () = tokio::time::sleep_until(next.min(safe_until)) => {}
        }
        if Instant::now() >= safe_until {
            tracing::warn!(target: "idem", scope, "no renewal of the {what} succeeded in time; giving it up");
            return None;
        }
        // The renewal runs alongside the body, which keeps making progress.
        let sent = Instant::now();
        let renewal = tokio::select! {
            biased;
            output = &mut body => return Some(output),
            renewal = tokio::time::timeout_at(safe_until, renew()) => renewal,
        };
        match renewal {
            Ok(Ok(true)) => {
                safe_until = sent + lease.saturating_sub(margin);
                next = sent + every;
            }
            Ok(Ok(false)) => return None,
            Ok(Err(e)) => {
                tracing::warn!(target: "idem", scope, error = %e, "could not renew the {what}; trying again");
                next = Instant::now() + retry;
            }
            Err(_) => {
                tracing::warn!(target: "idem", scope, "renewing the {what} timed out");
                next = Instant::now() + retry;
            }
        }
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
