//! One guarded call through a door, from its claim to the answer its
//! retries get: the key claimed in the layer's lease store, the handler run
//! on a task of its own under the lease, its response kept (or not), and
//! every refusal answered as the door answers them.

use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body as HttpBody;

use super::BoxError;
use super::settings::Settings;
use super::stored::StoredResponse;
use crate::error::Error;
use crate::guard::{Claim, Guard};
use crate::lease::Steps;
use crate::lease::guard::LeaseTicket;

/// How a door answers: its responses, built from a stored one or from a
/// refusal.
pub(crate) trait Door: Send + Sync + 'static {
    /// The responses the door's service sends.
    type Response: Send + 'static;

    /// What every door reads alike.
    fn settings(&self) -> &Settings;
    /// A guard's refusal (in progress, a mismatch, the store down, ...).
    fn refused(&self, e: &Error) -> Self::Response;
    /// The layer is misconfigured (`detail` says how); nothing was run.
    fn misconfigured(&self, detail: &str) -> Self::Response;
    /// A stored response: for the first call (from what was stored, so it
    /// and every replay are the same bytes) and, `replayed`, for a repeat.
    fn stored(&self, stored: StoredResponse, replayed: bool) -> Self::Response;
    /// The handler panicked; its record was removed as the panic went by.
    fn panicked(&self) -> Self::Response;
    /// The runtime cancelled the call's task (it is shutting down).
    fn cancelled(&self) -> Self::Response;
    /// A first call's response, once its handler answered: whether it is
    /// kept, read whole if so.
    fn handled<RB, E>(
        &self,
        response: Response<RB>,
    ) -> impl Future<Output = Result<Handled<Self::Response>, Failure<Self::Response, E>>> + Send
    where
        RB: HttpBody<Data = Bytes> + Send + 'static,
        RB::Error: Into<BoxError>,
        E: Send;
}

/// A first call's response, once the handler answered.
pub(crate) enum Handled<R> {
    /// Read whole: to store, and send.
    Whole(StoredResponse),
    /// Worth keeping, but it cannot be stored (over the response limit, a
    /// body that failed mid-way): sent as it comes, and the record
    /// completed without it.
    Unkept(R, &'static str),
}

/// Why a first call's response does not complete its record.
pub(crate) enum Failure<R, E> {
    /// Not worth keeping (a failure, by its status): passed as it came, and
    /// the record removed (a retry runs again).
    Release(R),
    /// The handler's service failed.
    Inner(E),
    /// The guard failed (the lease lost, the store down).
    Guard(Error),
}

impl<R, E> From<Error> for Failure<R, E> {
    fn from(e: Error) -> Self {
        Failure::Guard(e)
    }
}

/// Claim `guard`'s key, call `inner` with `request` under the lease and
/// keep its response; or answer the repeat. From the claim on, the call runs to its
/// end on a task of its own, whether or not its client waits: a handler
/// dropped half-way (the client went away) could leave a payment sent and
/// no answer stored, and its retry would send it again. The task carries
/// the request's span, so the handler's logs keep it. The handler finds
/// its lease in the request's extensions ([`LeaseInfo`](crate::lease::LeaseInfo): the fence for
/// its outside writes, and whether the lease still holds).
pub(crate) async fn guarded<D, S, B, RB>(
    door: Arc<D>,
    guard: Guard<'static>,
    mut inner: S,
    mut request: Request<B>,
) -> Result<D::Response, S::Error>
where
    D: Door,
    S: tower_service::Service<Request<B>, Response = Response<RB>> + Send + 'static,
    S::Future: Send,
    S::Error: Send + 'static,
    B: Send + 'static,
    RB: HttpBody<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    let call = {
        let door = door.clone();
        async move {
            let ticket = match claimed(&*door, guard).await {
                Ok(ticket) => ticket,
                Err(answer) => return Ok(answer),
            };
            request.extensions_mut().insert(ticket.info());
            let steps = ticket.door_steps();
            if let Some(steps) = &steps {
                request.extensions_mut().insert(steps.clone());
            }
            let handler = async {
                let response = inner.call(request).await.map_err(Failure::Inner)?;
                door.handled(response).await
            };
            let ran = ticket.run_body(handler).await;
            finished(&*door, &ticket, ran, steps.as_ref()).await
        }
    };
    let task = tokio::spawn(tracing::Instrument::instrument(call, tracing::Span::current()));
    joined(&*door, task.await)
}

/// The answer of a guarded call's task: its own, or the door's answer to a
/// panicked handler or a cancelled task.
fn joined<D: Door, E>(
    door: &D,
    task: Result<Result<D::Response, E>, tokio::task::JoinError>,
) -> Result<D::Response, E> {
    match task {
        Ok(answer) => answer,
        Err(e) if e.is_panic() => {
            let panic = e.into_panic();
            let what =
                panic.downcast_ref::<&str>().copied().or_else(|| panic.downcast_ref::<String>().map(String::as_str));
            tracing::error!(target: "idem", scope = %door.settings().scope, panic = what.unwrap_or("(not a string)"),
                "idempotency layer: the handler panicked");
            Ok(door.panicked())
        }
        Err(e) => {
            tracing::error!(target: "idem", error = %e, "idempotency layer: the request's task was cancelled");
            Ok(door.cancelled())
        }
    }
}

/// The key claimed for the handler to run; or the answer instead: the
/// stored response of a repeat, or a refusal.
async fn claimed<'c, D: Door>(door: &'c D, guard: Guard<'_>) -> Result<LeaseTicket<'c>, D::Response> {
    let settings = door.settings();
    // Whether the store holds responses of the layer's limit is asked of it
    // once, beside the first claims (not before: a store that is down then
    // fails both within one bound).
    if let Some(detail) = settings.misfit() {
        return Err(door.misconfigured(detail));
    }
    let store = settings.store().map_err(|e| door.refused(&e))?;
    let (fits, claim) = tokio::join!(
        settings.fits_store(store),
        guard.lease_or_wait::<StoredResponse>(store, settings.lease, settings.wait)
    );
    if let Err(detail) = fits {
        if let Ok(Claim::Run(ticket)) = claim {
            ticket.release_failed("was refused (the layer is misconfigured)").await;
        }
        return Err(door.misconfigured(detail));
    }
    match claim {
        Ok(Claim::Replay(stored)) => Err(door.stored(stored, true)),
        Ok(Claim::Run(ticket)) => Ok(ticket),
        Err(e) => Err(door.refused(&e)),
    }
}

/// The handler answered: from here it never runs again for this key, and
/// its client gets its answer, whatever becomes of the record.
async fn finished<D: Door, E>(
    door: &D,
    ticket: &LeaseTicket<'_>,
    ran: Result<Handled<D::Response>, Failure<D::Response, E>>,
    steps: Option<&Steps<'static>>,
) -> Result<D::Response, E> {
    let (response, why) = match ran {
        Ok(Handled::Whole(stored)) => {
            return Ok(match ticket.completed_with_steps(stored, steps).await {
                Ok(stored) => door.stored(stored, false),
                Err(e) => door.refused(&e),
            });
        }
        Ok(Handled::Unkept(response, why)) => (response, why),
        // `run_body` removed the record, as for every `Err`.
        Err(Failure::Release(response)) => return Ok(response),
        Err(Failure::Inner(e)) => return Err(e),
        Err(Failure::Guard(e)) => return Ok(door.refused(&e)),
    };
    if let Err(e) = ticket.completed_without_answer(why, steps).await {
        tracing::warn!(target: "idem", scope = %door.settings().scope, error = %e,
            "idempotency layer: a response not kept, and its record could not say so");
    }
    Ok(response)
}
