//! Running a body while a lease or lock it depends on is kept alive.

use std::time::Duration;

use crate::Error;

/// Drive `body` to its end, calling `renew` every third of `lease` while it
/// waits. `None` when the hold was lost: `renew` answered `false` (another
/// holder has it, or it is gone), or no renewal succeeded for a whole
/// `lease`. The body is then dropped where it stands, since another holder
/// may be running by now.
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
    let mut body = std::pin::pin!(body);
    // Poll the body once before arming the renewal timer: a body that
    // finishes without waiting never touches the timer wheel (creating and
    // dropping a timer takes the runtime's timer lock).
    let first = std::future::poll_fn(|cx| std::task::Poll::Ready(body.as_mut().poll(cx))).await;
    if let std::task::Poll::Ready(output) = first {
        return Some(output);
    }
    let every = (lease / 3).max(Duration::from_millis(10));
    let mut renewed = tokio::time::Instant::now();
    loop {
        tokio::select! {
            // The body first: a body that is ready is never held up.
            biased;
            output = &mut body => return Some(output),
            () = tokio::time::sleep(every) => {}
        }
        // The renewal runs alongside the body, which keeps making progress;
        // it may take until the hold would end, and no longer.
        let deadline = renewed + lease;
        let renewal = tokio::select! {
            biased;
            output = &mut body => return Some(output),
            renewal = tokio::time::timeout_at(deadline, renew()) => renewal,
        };
        match renewal {
            Ok(Ok(true)) => renewed = tokio::time::Instant::now(),
            Ok(Ok(false)) => return None,
            Ok(Err(e)) => tracing::warn!(target: "idem", scope, error = %e, "could not renew the {what}"),
            Err(_) => tracing::warn!(target: "idem", scope, "renewing the {what} timed out"),
        }
        if renewed.elapsed() >= lease {
            return None;
        }
    }
}
