//! The service the layer wraps around another: one request through it,
//! from its key to the response its retries get.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Body as HttpBody;

use super::body::{Collected, OVER_LIMIT, collect_up_to};
use super::fingerprint::fingerprint;
use super::layer::{Config, IdempotencyLayer};
use super::problem::{problem, refused};
use super::request::{body_of, key_of, tenant_of};
use super::stored::{StoredResponse, expires_in};
use super::{BoxError, ResponseBody};
use crate::error::Error;
use crate::guard::Claim;
use crate::guard::Guard;
use crate::lease::guard::LeaseTicket;

/// The service [`IdempotencyLayer`](super::IdempotencyLayer) wraps around another.
#[derive(Clone)]
pub struct Idempotency<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> Idempotency<S> {
    pub(super) fn new(inner: S, config: Arc<Config>) -> Idempotency<S> {
        Idempotency { inner, config }
    }
}

impl<S> std::fmt::Debug for Idempotency<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotency").field("scope", &self.config.scope).finish_non_exhaustive()
    }
}

impl<S> tower_layer::Layer<S> for IdempotencyLayer {
    type Service = Idempotency<S>;

    fn layer(&self, inner: S) -> Idempotency<S> {
        Idempotency::new(inner, self.config.clone())
    }
}

impl<S, B, RB> tower_service::Service<Request<B>> for Idempotency<S>
where
    S: tower_service::Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send + 'static,
    B: HttpBody<Data = Bytes> + From<Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    RB: HttpBody<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    type Response = Response<ResponseBody>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ResponseBody>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The service that was polled ready serves this request; a clone
        // takes its place for the next one.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(serve(self.config.clone(), inner, request))
    }
}

/// One request through the layer.
async fn serve<S, B, RB>(
    config: Arc<Config>,
    mut inner: S,
    request: Request<B>,
) -> Result<Response<ResponseBody>, S::Error>
where
    S: tower_service::Service<Request<B>, Response = Response<RB>> + Send + 'static,
    S::Future: Send,
    S::Error: Send + 'static,
    B: HttpBody<Data = Bytes> + From<Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    RB: HttpBody<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    if !config.methods.contains(request.method()) {
        return inner.call(request).await.map(passed);
    }
    let key = match key_of(&config, request.headers()) {
        Ok(Some(key)) => key,
        Ok(None) if !config.required => return inner.call(request).await.map(passed),
        Ok(None) => {
            return Ok(problem(StatusCode::BAD_REQUEST, &format!("this request needs an `{}` header", config.header)));
        }
        Err(why) => return Ok(problem(StatusCode::BAD_REQUEST, &why)),
    };
    let (parts, body) = request.into_parts();
    let body = match body_of(&config, body).await {
        Ok(body) => body,
        Err((status, why)) => return Ok(problem(status, &why)),
    };
    let tenant = match tenant_of(&config, &parts) {
        Ok(tenant) => tenant,
        Err(why) => return Ok(problem(StatusCode::UNAUTHORIZED, why)),
    };
    let fingerprint = fingerprint(&config.fingerprint, &parts, &body);
    let request = Request::from_parts(parts, B::from(body));
    // From here the request runs to its end on a task of its own, whether
    // or not its client waits: a handler dropped half-way (the client went
    // away) could leave a payment sent and no answer stored, and its retry
    // would send it again.
    // The task carries the request's span, so the handler's logs keep it.
    let scope = config.scope.clone();
    let guarded = guarded(config, inner, request, tenant, key, fingerprint);
    let task = tokio::spawn(tracing::Instrument::instrument(guarded, tracing::Span::current()));
    joined(&scope, task.await)
}

/// The answer of a guarded request's task: its own, or a `500` if its
/// handler panicked, a `503` if the runtime cancelled it.
fn joined<E>(
    scope: &str,
    task: Result<Result<Response<ResponseBody>, E>, tokio::task::JoinError>,
) -> Result<Response<ResponseBody>, E> {
    match task {
        Ok(answer) => answer,
        Err(e) if e.is_panic() => {
            // Its record was removed as the panic went by: a retry runs again.
            let panic = e.into_panic();
            let what =
                panic.downcast_ref::<&str>().copied().or_else(|| panic.downcast_ref::<String>().map(String::as_str));
            tracing::error!(target: "idem", scope = %scope, panic = what.unwrap_or("(not a string)"),
                "idempotency layer: the handler panicked");
            Ok(problem(StatusCode::INTERNAL_SERVER_ERROR, "the handler failed; nothing was kept, a retry runs again"))
        }
        Err(e) => {
            tracing::error!(target: "idem", error = %e, "idempotency layer: the request's task was cancelled");
            Ok(problem(StatusCode::SERVICE_UNAVAILABLE, "the server is shutting down; retry later"))
        }
    }
}

/// Claim the key, then run the handler under the lease and store its
/// response, or answer the repeat.
async fn guarded<S, B, RB>(
    config: Arc<Config>,
    mut inner: S,
    request: Request<B>,
    tenant: Option<String>,
    key: String,
    fingerprint: Option<String>,
) -> Result<Response<ResponseBody>, S::Error>
where
    S: tower_service::Service<Request<B>, Response = Response<RB>>,
    RB: HttpBody<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    let mut guard = Guard::new(config.scope.clone()).retention(config.retention);
    if let Some(tenant) = &tenant {
        guard = guard.key(tenant);
    }
    guard = guard.key(&key);
    if let Some(fingerprint) = &fingerprint {
        guard = guard.fingerprint(fingerprint);
    }
    let ticket = match claimed(&config, guard).await {
        Ok(ticket) => ticket,
        Err(answer) => return Ok(answer),
    };
    let ran = ticket
        .run_body(async {
            let response = inner.call(request).await.map_err(Failure::Inner)?;
            handled(&config, response).await
        })
        .await;
    finished(&config, &ticket, ran).await
}

/// The key claimed for the handler to run; or the answer instead: the
/// stored response of a repeat, or a refusal.
async fn claimed<'c>(config: &'c Config, guard: Guard<'_>) -> Result<LeaseTicket<'c>, Response<ResponseBody>> {
    // Whether the store holds responses of the layer's limit is asked of it
    // once, beside the first claims (not before: a store that is down then
    // fails both within one bound).
    if let Some(Err(detail)) = config.fits.get() {
        return Err(problem(StatusCode::INTERNAL_SERVER_ERROR, detail));
    }
    let store = config.store().map_err(|e| refused(&e, config.lease))?;
    let (fits, claim) =
        tokio::join!(config.fits_store(store), guard.lease_or_wait::<StoredResponse>(store, config.lease, config.wait));
    if let Err(detail) = fits {
        if let Ok(Claim::Run(ticket)) = claim {
            ticket.release_failed("was refused (the layer is misconfigured)").await;
        }
        return Err(problem(StatusCode::INTERNAL_SERVER_ERROR, detail));
    }
    match claim {
        Ok(Claim::Replay(stored)) => Err(stored.into_response(true)),
        Ok(Claim::Run(ticket)) => Ok(ticket),
        Err(e) => Err(refused(&e, config.lease)),
    }
}

/// The handler answered: from here it never runs again for this key, and
/// its client gets its answer, whatever becomes of the record.
async fn finished<E>(
    config: &Config,
    ticket: &LeaseTicket<'_>,
    ran: Result<Handled, Failure<E>>,
) -> Result<Response<ResponseBody>, E> {
    let (response, why) = match ran {
        Ok(Handled::Whole(stored)) => {
            return Ok(match ticket.completed(stored).await {
                Ok(stored) => stored.into_response(false),
                Err(e) => refused(&e, config.lease),
            });
        }
        Ok(Handled::Unkept(response, why)) => (response, why),
        // `run_body` removed the record, as for every `Err`.
        Err(Failure::Release(response)) => return Ok(response),
        Err(Failure::Inner(e)) => return Err(e),
        Err(Failure::Guard(e)) => return Ok(refused(&e, config.lease)),
    };
    if let Err(e) = ticket.completed_without_answer(why).await {
        tracing::warn!(target: "idem", scope = %config.scope, error = %e,
            "idempotency layer: a response not kept, and its record could not say so");
    }
    let mut response = response;
    expires_in(&mut response, i64::try_from(config.retention.as_millis()).unwrap_or(i64::MAX));
    Ok(response)
}

/// A first request's response, once the handler answered.
enum Handled {
    /// Read whole: to store, and send.
    Whole(StoredResponse),
    /// Worth keeping, but it cannot be stored (over the response limit,
    /// trailers, a body that failed mid-way): sent as it comes, and the
    /// record completed without it.
    Unkept(Response<ResponseBody>, &'static str),
}

/// Why a first request's response does not complete its record.
enum Failure<E> {
    /// Not worth keeping (a 5xx, by its status; or over the response limit
    /// with `pass_through_oversized`): passed as it came, and the record
    /// removed (a retry runs again).
    Release(Response<ResponseBody>),
    /// The handler's service failed.
    Inner(E),
    /// The guard failed (the lease lost, the store down).
    Guard(Error),
}

impl<E> From<Error> for Failure<E> {
    fn from(e: Error) -> Self {
        Failure::Guard(e)
    }
}

/// The handler's response: read whole if it is worth keeping and fits.
async fn handled<RB, E>(config: &Config, response: Response<RB>) -> Result<Handled, Failure<E>>
where
    RB: HttpBody<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    let (parts, body) = response.into_parts();
    if !(config.keep)(parts.status) {
        tracing::debug!(target: "idem", scope = %config.scope, status = %parts.status,
            "idempotency layer: a response not kept (by its status); a retry runs again");
        return Err(Failure::Release(Response::from_parts(parts, ResponseBody::stream(body))));
    }
    match collect_up_to(body, config.max_response).await {
        Collected::Whole(bytes) => Ok(Handled::Whole(StoredResponse::of(&parts, bytes, config.retention))),
        Collected::Partial(body, why) if why == OVER_LIMIT && config.pass_through_oversized => {
            tracing::warn!(target: "idem", scope = %config.scope, status = %parts.status, max = config.max_response,
                "idempotency layer: a response over the limit passed through unstored (pass_through_oversized); \
                 a retry runs the handler again");
            Err(Failure::Release(Response::from_parts(parts, body)))
        }
        Collected::Partial(body, why) => Ok(Handled::Unkept(Response::from_parts(parts, body), why)),
    }
}

/// A response passed through as the service gave it.
fn passed<RB>(response: Response<RB>) -> Response<ResponseBody>
where
    RB: HttpBody<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    response.map(ResponseBody::stream)
}
