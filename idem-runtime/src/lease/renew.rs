//! Running a body while a lease or lock it depends on is kept alive.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::error::{Error, LostLease};
use crate::future::BoxFuture;

/// A renewal sent from a task of its own: owns what it needs.
pub(crate) type DetachedRenew = Box<dyn Fn() -> BoxFuture<'static, Result<bool, Error>> + Send + Sync>;

/// How a hold is renewed while its body runs.
pub(crate) enum Renewal<R> {
    /// From a task of its own, so that a body that blocks its thread (on a
    /// multi-thread runtime) cannot starve the renewal: the store gave a
    /// handle that outlives the call ([`LeaseStore::shared`](crate::lease::LeaseStore::shared)).
    Detached(DetachedRenew),
    /// Polled with the body, in its task: a body that blocks its thread
    /// stops it (a store of the user's own that gives no shared handle).
    InTask(R),
}

/// The sender a hold's renewal sets once the hold is lost, shared with the
/// holder (which sets it too when its completion is refused).
pub(crate) type LostSender = Arc<watch::Sender<Option<LostLease>>>;

/// Drive `body` to its end while the hold is renewed every third of
/// `lease`; `Err(how)` when the hold is lost (`renew` answered `false`:
/// another holder has it, or it is gone; or no renewal succeeded in time).
/// The body is then dropped where it stands, since another holder may run
/// by now; `lost` says so first, for what the body runs elsewhere.
///
/// The hold is counted from the moment each successful renewal was *sent*
/// (the store restarted its TTL no earlier than that), and given up a sixth
/// of the lease before it would end by that count, so that this body stops
/// before another holder can start. A failed renewal is retried soon, not a
/// third of the lease later.
pub(crate) async fn under_renewal<F, R, Fut>(
    body: F,
    lease: Duration,
    renew: Renewal<R>,
    lost: &LostSender,
    what: &'static str,
    scope: &str,
) -> Result<F::Output, LostLease>
where
    F: Future,
    R: Fn() -> Fut,
    Fut: Future<Output = Result<bool, Error>>,
{
    let start = Instant::now();
    match renew {
        Renewal::Detached(renew) => {
            let mut watching = lost.subscribe();
            let (started, running) = tokio::sync::oneshot::channel();
            let task = {
                let (lost, scope) = (lost.clone(), scope.to_owned());
                tokio::spawn(async move {
                    let _ = started.send(());
                    let how = keep_renewed(start, lease, renew, what, &scope).await;
                    lost.send_replace(Some(how));
                })
            };
            // Stopped with the body, however it ends (the body's future
            // dropped included): a hold left alone passes with its lease.
            let _stop = AbortOnDrop(task.abort_handle());
            // A task spawned from a worker waits in that worker's slot for
            // the next task, where no other worker can take it: let it start
            // (and arm its timer) before the body can block this thread.
            let _ = running.await;
            let mut body = std::pin::pin!(body);
            tokio::select! {
                // The body first: a body that is ready is never held up.
                biased;
                output = &mut body => Ok(output),
                how = watching.wait_for(Option::is_some) => Err(how.ok().and_then(|how| *how).unwrap_or(LostLease::NotRenewed)),
            }
        }
        Renewal::InTask(renew) => in_task(body, start, lease, renew, what, scope).await,
    }
    .inspect_err(|how| {
        lost.send_replace(Some(*how));
    })
}

/// [`under_renewal`] with the renewal polled in the body's task.
async fn in_task<F, R, Fut>(
    body: F,
    start: Instant,
    lease: Duration,
    renew: R,
    what: &str,
    scope: &str,
) -> Result<F::Output, LostLease>
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
        return Ok(output);
    }
    let mut hold = Hold::new(start, lease);
    loop {
        tokio::select! {
            biased;
            output = &mut body => return Ok(output),
            () = tokio::time::sleep_until(hold.next.min(hold.safe_until())) => {}
        }
        // The renewal runs alongside the body, which keeps making progress.
        let renewal = async {
            let (sent, renewal) = hold.renewal(what, scope)?;
            Ok((sent, tokio::time::timeout_at(renewal, renew()).await))
        };
        let (sent, renewal) = tokio::select! {
            biased;
            output = &mut body => return Ok(output),
            renewal = renewal => renewal?,
        };
        hold.settle(sent, renewal, what, scope)?;
    }
}

/// Renew the hold until it is lost, from a task of its own: how it was.
///
/// Its waits are counted on a timer thread of its own, not Tokio's timer: a
/// worker blocked by a body may be the one that last drove Tokio's timer,
/// and the others may sleep without it until something wakes them. The
/// timer thread's wake puts this task in the runtime's shared queue and
/// wakes an idle worker, which then drives the store's answer too.
async fn keep_renewed(start: Instant, lease: Duration, renew: DetachedRenew, what: &str, scope: &str) -> LostLease {
    let mut hold = Hold::new(start, lease);
    loop {
        until(hold.next.min(hold.safe_until())).await;
        let step = async {
            let (sent, deadline) = hold.renewal(what, scope)?;
            let renewal = tokio::select! {
                renewal = renew() => Ok(renewal),
                () = until(deadline) => Err(()),
            };
            hold.settle(sent, renewal, what, scope)
        };
        if let Err(how) = step.await {
            return how;
        }
    }
}

/// Until `deadline`, on the timer thread.
async fn until(deadline: Instant) {
    let left = deadline.saturating_duration_since(Instant::now());
    if !left.is_zero() {
        futures_timer::Delay::new(left).await;
    }
}

/// Stops a task when dropped.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
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

    /// Time for a renewal: when it is sent, and until when it may take;
    /// or the hold given up, no renewal having succeeded in time.
    fn renewal(&self, what: &str, scope: &str) -> Result<(Instant, Instant), LostLease> {
        let now = Instant::now();
        if now >= self.safe_until() {
            tracing::warn!(target: "idem", scope, "no renewal of the {what} succeeded in time; giving it up");
            return Err(LostLease::NotRenewed);
        }
        Ok((now, self.safe_until()))
    }

    /// What a renewal sent at `sent` answered (or its time-out).
    fn settle(
        &mut self,
        sent: Instant,
        renewal: Result<Result<bool, Error>, impl Sized>,
        what: &str,
        scope: &str,
    ) -> Result<(), LostLease> {
        match renewal {
            Ok(Ok(true)) => self.renewed(sent),
            Ok(Ok(false)) => return Err(LostLease::TakenOver),
            Ok(Err(e)) => {
                tracing::warn!(target: "idem", scope, error = %e, "could not renew the {what}; trying again");
                self.retry_soon();
            }
            Err(_) => {
                tracing::warn!(target: "idem", scope, "renewing the {what} timed out");
                self.retry_soon();
            }
        }
        Ok(())
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
