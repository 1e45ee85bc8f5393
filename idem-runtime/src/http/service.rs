//! The service the layer wraps around another: one request through it,
//! from its key to the response its retries get; and the layer as the
//! guarded call of `crate::door` sees it (its `Door`: which answer for
//! what, which responses are kept).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Body as HttpBody;

use super::layer::{Config, IdempotencyLayer};
use super::problem::{expires_in, problem, refused, refused_before, stored};
use super::{BoxError, ResponseBody};
use crate::door::body::{Collected, OVER_LIMIT, collect_up_to};
use crate::door::call::{Door, Failure, Handled, guarded};
use crate::door::settings::{Read, Settings};
use crate::door::stored::StoredResponse;
use crate::error::Error;

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
        f.debug_struct("Idempotency").field("scope", &self.config.door.scope).finish_non_exhaustive()
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
    match config.door.read(request).await {
        Read::Pass(request) => inner.call(request).await.map(passed),
        Read::Refused(refusal) => Ok(refused_before(&config, refusal)),
        Read::Guarded(guard, parts, body) => {
            guarded(config, guard, inner, Request::from_parts(parts, B::from(body))).await
        }
    }
}

impl Door for Config {
    type Response = Response<ResponseBody>;

    fn settings(&self) -> &Settings {
        &self.door
    }

    fn refused(&self, e: &Error) -> Response<ResponseBody> {
        refused(e, self.door.lease)
    }

    fn misconfigured(&self, detail: &str) -> Response<ResponseBody> {
        problem(StatusCode::INTERNAL_SERVER_ERROR, detail)
    }

    fn stored(&self, kept: StoredResponse, replayed: bool) -> Response<ResponseBody> {
        stored(kept, replayed)
    }

    fn panicked(&self) -> Response<ResponseBody> {
        problem(StatusCode::INTERNAL_SERVER_ERROR, "the handler failed; nothing was kept, a retry runs again")
    }

    fn cancelled(&self) -> Response<ResponseBody> {
        problem(StatusCode::SERVICE_UNAVAILABLE, "the server is shutting down; retry later")
    }

    fn handled<RB, E>(
        &self,
        response: Response<RB>,
    ) -> impl Future<Output = Result<Handled<Response<ResponseBody>>, Failure<Response<ResponseBody>, E>>> + Send
    where
        RB: HttpBody<Data = Bytes> + Send + 'static,
        RB::Error: Into<BoxError>,
        E: Send,
    {
        handled(self, response)
    }
}

/// The handler's response: read whole if it is worth keeping and fits.
async fn handled<RB, E>(
    config: &Config,
    response: Response<RB>,
) -> Result<Handled<Response<ResponseBody>>, Failure<Response<ResponseBody>, E>>
where
    RB: HttpBody<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    let (parts, body) = response.into_parts();
    let scope = &config.door.scope;
    if !(config.keep)(parts.status) {
        tracing::debug!(target: "idem", scope = %scope, status = %parts.status,
            "idempotency layer: a response not kept (by its status); a retry runs again");
        return Err(Failure::Release(Response::from_parts(parts, ResponseBody::stream(body))));
    }
    let max = config.door.max_response;
    match collect_up_to(body, max, false).await {
        Collected::Whole(bytes, _) => {
            Ok(Handled::Whole(StoredResponse::of(&parts, &bytes, None, config.door.retention)))
        }
        Collected::Partial(body, why) if why == OVER_LIMIT && config.pass_through_oversized => {
            tracing::warn!(target: "idem", scope = %scope, status = %parts.status, max,
                "idempotency layer: a response over the limit passed through unstored (pass_through_oversized); \
                 a retry runs the handler again");
            Err(Failure::Release(Response::from_parts(parts, ResponseBody::stream(body))))
        }
        Collected::Partial(body, why) => {
            let mut response = Response::from_parts(parts, ResponseBody::stream(body));
            expires_in(&mut response, config.door.retention);
            Ok(Handled::Unkept(response, why))
        }
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
