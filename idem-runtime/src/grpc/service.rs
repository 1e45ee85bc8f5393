//! The service the layer wraps around another: one call through it, from
//! its key to the response its retries get; and the layer as the guarded
//! call of `crate::door` sees it (its `Door`: which answer for what,
//! which responses are kept).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, Request, Response};
use http_body::Body as HttpBody;
use http_body_util::Full;
use tonic::body::Body;
use tonic::{Code, Status};

use super::layer::{Config, IdempotencyLayer};
use super::status::{answer, pushback, refused, refused_before, stored, with_trailers};
use crate::door::BoxError;
use crate::door::body::{Collected, collect_up_to};
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

impl<S> std::fmt::Debug for Idempotency<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotency").field("scope", &self.config.door.scope).finish_non_exhaustive()
    }
}

impl<S> tower_layer::Layer<S> for IdempotencyLayer {
    type Service = Idempotency<S>;

    fn layer(&self, inner: S) -> Idempotency<S> {
        Idempotency { inner, config: self.config.clone() }
    }
}

impl<S, RB> tower_service::Service<Request<Body>> for Idempotency<S>
where
    S: tower_service::Service<Request<Body>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send + 'static,
    RB: HttpBody<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        // The service that was polled ready serves this call; a clone takes
        // its place for the next one.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(serve(self.config.clone(), inner, request))
    }
}

/// One call through the layer.
async fn serve<S, RB>(config: Arc<Config>, mut inner: S, request: Request<Body>) -> Result<Response<Body>, S::Error>
where
    S: tower_service::Service<Request<Body>, Response = Response<RB>> + Send + 'static,
    S::Future: Send,
    S::Error: Send + 'static,
    RB: HttpBody<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    if config.passes(request.uri().path()) {
        return inner.call(request).await.map(passed);
    }
    match config.door.read(request).await {
        Read::Pass(request) => inner.call(request).await.map(passed),
        Read::Refused(refusal) => Ok(refused_before(&config, refusal)),
        Read::Guarded(guard, parts, body) => {
            guarded(config, guard, inner, Request::from_parts(parts, Body::new(Full::new(body)))).await
        }
    }
}

impl Door for Config {
    type Response = Response<Body>;

    fn settings(&self) -> &Settings {
        &self.door
    }

    fn refused(&self, e: &Error) -> Response<Body> {
        refused(e, self.door.lease.as_millis())
    }

    fn misconfigured(&self, detail: &str) -> Response<Body> {
        answer(Status::internal(detail))
    }

    fn stored(&self, kept: StoredResponse, replayed: bool) -> Response<Body> {
        stored(kept, replayed)
    }

    fn panicked(&self) -> Response<Body> {
        answer(Status::internal("the handler failed; nothing was kept, a retry runs again"))
    }

    fn cancelled(&self) -> Response<Body> {
        pushback(answer(Status::unavailable("the server is shutting down; retry later")), 1000)
    }

    fn handled<RB, E>(
        &self,
        response: Response<RB>,
    ) -> impl Future<Output = Result<Handled<Response<Body>>, Failure<Response<Body>, E>>> + Send
    where
        RB: HttpBody<Data = Bytes> + Send + 'static,
        RB::Error: Into<BoxError>,
        E: Send,
    {
        handled(self, response)
    }
}

/// The handler's response, read whole (messages and trailers), and kept
/// if its status is one the layer keeps.
async fn handled<RB, E>(
    config: &Config,
    response: Response<RB>,
) -> Result<Handled<Response<Body>>, Failure<Response<Body>, E>>
where
    RB: HttpBody<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    let (parts, body) = response.into_parts();
    let (bytes, trailers) = match collect_up_to(body, config.door.max_response, true).await {
        Collected::Whole(bytes, trailers) => (bytes, trailers),
        Collected::Partial(body, why) => return Ok(Handled::Unkept(Response::from_parts(parts, Body::new(body)), why)),
    };
    let code = code_of(&parts.headers, trailers.as_ref());
    if !(config.keep)(code) {
        tracing::debug!(target: "idem", scope = %config.door.scope, code = ?code,
            "idempotency layer: a call's response not kept (by its status); a retry runs again");
        return Err(Failure::Release(Response::from_parts(parts, with_trailers(bytes, trailers))));
    }
    Ok(Handled::Whole(StoredResponse::of(&parts, &bytes, trailers.as_ref(), config.door.retention)))
}

/// A response's gRPC status: in its trailers, or in its headers for a
/// trailers-only response (how tonic answers an `Err(Status)`); `UNKNOWN`
/// where there is none.
fn code_of(headers: &HeaderMap, trailers: Option<&HeaderMap>) -> Code {
    const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
    trailers
        .and_then(|t| t.get(GRPC_STATUS))
        .or_else(|| headers.get(GRPC_STATUS))
        .map_or(Code::Unknown, |value| Code::from_bytes(value.as_bytes()))
}

/// A response passed through as the service gave it.
fn passed<RB>(response: Response<RB>) -> Response<Body>
where
    RB: HttpBody<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    response.map(Body::new)
}
