//! An `Idempotency-Key` layer for HTTP services (feature `http`): a
//! [`tower`](https://docs.rs/tower) layer over any service of `http` 1.x
//! requests and responses, axum's routers included.
//!
//! It follows the IETF draft `draft-ietf-httpapi-idempotency-key-header`:
//! a client sends `Idempotency-Key: "<key>"` with a request it may retry;
//! the first request with that key runs the handler, and every retry gets
//! the first response back, status, headers and body, marked
//! `Idempotent-Replayed: true`. Built on the `lease` strategy, so the
//! records live in any lease store (SQL, Redis, memory) and concurrent
//! duplicates never both reach the handler.
//!
//! | request | answer |
//! |---|---|
//! | first with its key | the handler runs; a response worth keeping (2xx, and 4xx but 401/403/407/408/409/429, by default) is stored |
//! | a retry after that | the stored response, exactly, with `Idempotent-Replayed: true`; the handler does not run |
//! | a retry while the first still runs | `409 Conflict` with `Retry-After` |
//! | the same key with another request (method, path, body) | `422 Unprocessable Content` |
//! | no key where one is required, or a malformed key | `400 Bad Request` |
//! | a body over the request limit | `413 Content Too Large`, the handler not run |
//! | the handler fails (5xx by default; 401, 403, 407, 408, 409, 429) | passed on, nothing stored: a retry runs again |
//! | the handler panics | `500` problem+json, nothing stored: a retry runs again |
//! | the store does not answer (down) before the handler runs | `503` with `Retry-After: 1`, within the store's bound ([`DEFAULT_TIMEOUT`](crate::store::DEFAULT_TIMEOUT), 3 s), the handler not run |
//! | the store stops answering while the handler runs | the lease cannot be renewed: the handler is stopped before another worker could take the record over, and the client gets `503` with `Retry-After` (the lease, in seconds); a retry after it takes the record over and runs the handler again (what it did before it was stopped stands) |
//! | its client goes away while the handler runs | the handler runs to its end (on a task of its own) and its response is kept: the retry gets it |
//! | a response over the response limit, with trailers, or whose body fails mid-way | sent as it comes, its record completed without it: a retry gets `410 Gone` (problem+json, `Idempotent-Replayed: true`) and the handler never runs again ([`pass_through_oversized`](IdempotencyLayer::pass_through_oversized): removed instead, a retry runs again) |
//! | a response the store cannot hold, or a store that fails as it is written | the client gets the handler's response; retries get `410 Gone`, as above |
//! | a retry of a request whose response was not kept | `410 Gone`, the handler not run |
//! | a method the layer does not guard (GET, PUT, DELETE by default) | passed through |
//!
//! Errors are `application/problem+json` (RFC 9457) and name the problem.
//!
//! The wrapped service's request body type must be buildable from bytes
//! (`From<Bytes>`: axum's `Body`, `Full<Bytes>`): the layer reads the body
//! (for the fingerprint and the size limit) and hands the service the
//! same bytes. Behind hyper directly, map `Incoming` to such a body first.
//! Keys are scoped per tenant when a [tenant](IdempotencyLayer::tenant)
//! function is given, so one client's key can never replay another's
//! response. **Without one, keys are shared by every caller**: anyone who
//! sends a key another client used gets that client's response (its
//! `Set-Cookie`, its payment). Give a tenant function on any API with more
//! than one caller; the layer logs a warning once when it has none.
//!
//! A request's record is a lease record of the layer's [scope](IdempotencyLayer::scope)
//! (default `http`) keyed by the header's key (without its quotes), or, with
//! a tenant function, by the composite key of tenant then key (as
//! `Guard::new(scope).key(tenant).key(key)` builds it: [`Key::from_parts`](crate::Key::from_parts)).
//! From a shell: `idem inspect --scope http --tenant <tenant> --key <key>`
//! (no `--tenant` for a layer without a tenant function), which shows the
//! stored response (JSON `{"status", "headers": [[name, base64]], "body":
//! base64}`) as its status, headers and body.
//!
//! A response is read whole (up to [`max_response_body`](IdempotencyLayer::max_response_body))
//! before it is stored and sent: a streaming endpoint (server-sent events,
//! a long download) sends nothing until its end or the limit. Don't put
//! such endpoints behind the layer (guard the request that starts the work
//! instead).
//!
//! A guarded request runs on a Tokio task of its own, so that a client
//! going away cannot stop its handler half-way. A server shutting down
//! waits for its connections, not for those tasks: give the runtime a
//! moment after a graceful shutdown (handlers of clients that left finish
//! and store their answers), or their records wait for their lease and the
//! next retry takes them over.
//!
//! A JSON request body (`application/json`, `+json` types) is fingerprinted
//! as canonical JSON: a retry serialized again, keys in another order,
//! matches. Any other body, and JSON whose parse would lose a difference
//! (a number past 64-bit precision, a key written twice), is compared byte
//! for byte.

use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, request};
use http_body::Body as HttpBody;
use http_body_util::BodyExt;
use sha2::{Digest, Sha256};

use crate::store::lease::LeaseStore;
use crate::{Claim, Error, Guard};

mod body;
mod stored;

pub use body::ResponseBody;
use body::{Collected, OVER_LIMIT, collect_up_to};
use stored::StoredResponse;

/// The errors a body can carry.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The header a replayed response carries.
pub const REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

type TenantFn = dyn Fn(&request::Parts) -> Option<String> + Send + Sync;
type StoreFn = dyn Fn(StatusCode) -> bool + Send + Sync;
type FingerprintFn = dyn Fn(&request::Parts, &[u8]) -> Vec<u8> + Send + Sync;

/// What identifies "the same request" behind one key.
#[derive(Clone)]
enum Fingerprint {
    /// Method, path and query, and body (the default).
    Request,
    /// Nothing: a key replays whatever request comes with it.
    None,
    /// The application's own.
    Custom(Arc<FingerprintFn>),
}

struct Config {
    store: Arc<dyn LeaseStore>,
    scope: Cow<'static, str>,
    header: HeaderName,
    required: bool,
    methods: Vec<Method>,
    tenant: Option<Arc<TenantFn>>,
    fingerprint: Fingerprint,
    keep: Arc<StoreFn>,
    max_request: usize,
    max_response: usize,
    pass_through_oversized: bool,
    /// Whether a response of `max_response` bytes fits the store's records,
    /// once asked (`Err`: the problem to answer every guarded request with).
    fits: std::sync::OnceLock<Result<(), String>>,
    lease: Duration,
    retention: Duration,
    /// Whether the warning about keys shared by every caller was logged.
    warned_shared: std::sync::atomic::AtomicBool,
}

/// The layer: wrap a service with it (`ServiceBuilder::layer`,
/// `axum::Router::layer`).
///
/// ```no_run
/// # extern crate idem_runtime as idem;
/// # fn demo(pool: sqlx::PgPool) {
/// use std::time::Duration;
/// use idem::http::IdempotencyLayer;
///
/// let layer = IdempotencyLayer::new(idem::lease::SqlStore::new(pool))
///     .scope("payments.api")
///     .required(true)
///     .tenant(|request| {
///         // The authenticated caller, as an earlier layer left it.
///         request.headers.get("x-api-client").and_then(|v| v.to_str().ok()).map(str::to_owned)
///     })
///     .retention(Duration::from_secs(24 * 3600));
/// # let _ = layer; }
/// ```
#[derive(Clone)]
pub struct IdempotencyLayer {
    config: Arc<Config>,
}

impl std::fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = &self.config;
        f.debug_struct("IdempotencyLayer")
            .field("store", &c.store.kind())
            .field("scope", &c.scope)
            .field("header", &c.header)
            .field("required", &c.required)
            .field("methods", &c.methods)
            .field("tenant", &c.tenant.is_some())
            .field("max_request", &c.max_request)
            .field("max_response", &c.max_response)
            .field("lease", &c.lease)
            .field("retention", &c.retention)
            .finish_non_exhaustive()
    }
}

/// The default statuses worth keeping: 2xx, and 4xx but those that say
/// "try again" or "not you, not now": 401 and 407 (the caller was not
/// authenticated: a retry with credentials must run), 403 (permissions can
/// be granted), 408 (timeout), 409 (conflict) and 429 (too many requests).
/// Never 5xx: the handler failed, a retry runs again.
pub fn keeps_by_default(status: StatusCode) -> bool {
    status.is_success()
        || (status.is_client_error()
            && !matches!(
                status,
                StatusCode::UNAUTHORIZED
                    | StatusCode::FORBIDDEN
                    | StatusCode::PROXY_AUTHENTICATION_REQUIRED
                    | StatusCode::REQUEST_TIMEOUT
                    | StatusCode::CONFLICT
                    | StatusCode::TOO_MANY_REQUESTS
            ))
}

impl IdempotencyLayer {
    /// A layer keeping its records in `store` (a lease store: SQL where a
    /// second run is unacceptable, Redis, or memory for one process), with
    /// the defaults: scope `http`, header `Idempotency-Key`, the key
    /// optional, `POST` and `PATCH` guarded, the fingerprint of method,
    /// path and body, 2xx and most 4xx kept, 1 MiB limits, a 30 s lease
    /// (renewed while the handler runs) and 24 h retention.
    pub fn new(store: impl LeaseStore + 'static) -> IdempotencyLayer {
        IdempotencyLayer {
            config: Arc::new(Config {
                store: Arc::new(store),
                scope: Cow::Borrowed("http"),
                header: HeaderName::from_static("idempotency-key"),
                required: false,
                methods: vec![Method::POST, Method::PATCH],
                tenant: None,
                fingerprint: Fingerprint::Request,
                keep: Arc::new(keeps_by_default),
                max_request: 1 << 20,
                max_response: 1 << 20,
                pass_through_oversized: false,
                fits: std::sync::OnceLock::new(),
                lease: Duration::from_secs(30),
                retention: Duration::from_secs(24 * 3600),
                warned_shared: std::sync::atomic::AtomicBool::new(false),
            }),
        }
    }

    fn with(mut self, change: impl FnOnce(&mut Config)) -> IdempotencyLayer {
        change(Arc::get_mut(&mut self.config).expect("a layer is configured before it is cloned"));
        self
    }

    /// The records' scope: give each API (or version of one) its own.
    pub fn scope(self, scope: impl Into<Cow<'static, str>>) -> IdempotencyLayer {
        let scope = scope.into();
        self.with(|c| c.scope = scope)
    }

    /// The key's header (default `Idempotency-Key`).
    pub fn header(self, header: HeaderName) -> IdempotencyLayer {
        self.with(|c| c.header = header)
    }

    /// Refuse a guarded request without a key (`400`), instead of passing
    /// it through unguarded.
    pub fn required(self, required: bool) -> IdempotencyLayer {
        self.with(|c| c.required = required)
    }

    /// The methods guarded (default `POST` and `PATCH`: the others are
    /// idempotent by definition); any other passes through.
    pub fn methods(self, methods: impl IntoIterator<Item = Method>) -> IdempotencyLayer {
        let methods = methods.into_iter().collect();
        self.with(|c| c.methods = methods)
    }

    /// Scope keys per tenant: `tenant` names who sent the request (an
    /// authenticated user, an API client id). Two tenants' equal keys are
    /// different records, so one can never replay the other's response. A
    /// request it names no tenant for (`None`, or an empty name) is refused
    /// (`401`): a key nobody owns would be shared.
    pub fn tenant(
        self,
        tenant: impl Fn(&request::Parts) -> Option<String> + Send + Sync + 'static,
    ) -> IdempotencyLayer {
        let tenant: Arc<TenantFn> = Arc::new(tenant);
        self.with(|c| c.tenant = Some(tenant))
    }

    /// What makes two requests "the same" behind one key: bytes hashed
    /// into the record (the default: method, path and query, and body). A
    /// retry must match; another request with the key is `422`.
    pub fn fingerprint(
        self,
        fingerprint: impl Fn(&request::Parts, &[u8]) -> Vec<u8> + Send + Sync + 'static,
    ) -> IdempotencyLayer {
        let fingerprint: Arc<FingerprintFn> = Arc::new(fingerprint);
        self.with(|c| c.fingerprint = Fingerprint::Custom(fingerprint))
    }

    /// No fingerprint: a key replays its first response to whatever request
    /// comes with it.
    pub fn without_fingerprint(self) -> IdempotencyLayer {
        self.with(|c| c.fingerprint = Fingerprint::None)
    }

    /// Which responses are kept and replayed (default [`keeps_by_default`]);
    /// a response not kept leaves no record, so a retry runs again.
    pub fn keep(self, keep: impl Fn(StatusCode) -> bool + Send + Sync + 'static) -> IdempotencyLayer {
        let keep: Arc<StoreFn> = Arc::new(keep);
        self.with(|c| c.keep = keep)
    }

    /// The largest request body read (default 1 MiB): a longer one is `413`.
    pub fn max_request_body(self, bytes: usize) -> IdempotencyLayer {
        self.with(|c| c.max_request = bytes)
    }

    /// The largest response body kept (default 1 MiB). A longer one is sent
    /// as it comes, and its record completed without it: its retries get
    /// `410 Gone` and the handler never runs again (see
    /// [`pass_through_oversized`](Self::pass_through_oversized) for the
    /// other choice). Kept responses live in the store's records, base64 in
    /// JSON (a third longer than the body): a limit whose records the store
    /// cannot hold (16 MiB on MariaDB's default `max_allowed_packet`) is
    /// refused at the first guarded request, with a `500` naming both sizes
    /// and nothing run.
    pub fn max_response_body(self, bytes: usize) -> IdempotencyLayer {
        self.with(|c| c.max_response = bytes)
    }

    /// Pass a response over [`max_response_body`](Self::max_response_body)
    /// through unstored and remove its record, so that a retry runs the
    /// handler again (default `false`). Only for handlers that are safe to
    /// run twice: a payment answered with a long body would be made again
    /// by its retry.
    pub fn pass_through_oversized(self, pass: bool) -> IdempotencyLayer {
        self.with(|c| c.pass_through_oversized = pass)
    }

    /// How long a first request holds its key without news (default 30 s;
    /// renewed while the handler runs).
    pub fn lease(self, lease: Duration) -> IdempotencyLayer {
        self.with(|c| c.lease = lease)
    }

    /// How long responses are kept (default 24 h).
    pub fn retention(self, retention: Duration) -> IdempotencyLayer {
        self.with(|c| c.retention = retention)
    }
}

impl Config {
    /// Whether the store's records hold a response of `max_response` bytes
    /// (asked of the store once): its body in base64, a third longer, and
    /// room for its headers.
    async fn fits_store(&self) -> Result<(), &str> {
        if let Some(fits) = self.fits.get() {
            return fits.as_ref().map_err(String::as_str).copied();
        }
        let limit = self.store.answer_limit().await;
        let stored = self.max_response.div_ceil(3).saturating_mul(4).saturating_add(HEADROOM);
        let fits = if stored <= limit {
            Ok(())
        } else {
            let detail = format!(
                "the idempotency layer is misconfigured: max_response_body ({} bytes) would be stored as up to {stored} \
                 bytes, more than its {} store holds ({limit}); lower max_response_body",
                self.max_response,
                self.store.kind()
            );
            tracing::error!(target: "idem", scope = %self.scope, "{detail}");
            Err(detail)
        };
        self.fits.get_or_init(|| fits).as_ref().map_err(String::as_str).copied()
    }
}

/// Room for a stored response's status and headers beside its body.
const HEADROOM: usize = 64 * 1024;

impl<S> tower_layer::Layer<S> for IdempotencyLayer {
    type Service = Idempotency<S>;

    fn layer(&self, inner: S) -> Idempotency<S> {
        Idempotency { inner, config: self.config.clone() }
    }
}

/// The service [`IdempotencyLayer`] wraps around another.
#[derive(Clone)]
pub struct Idempotency<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> std::fmt::Debug for Idempotency<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotency").field("scope", &self.config.scope).finish_non_exhaustive()
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
    let body = match http_body_util::Limited::new(body, config.max_request).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            let detail = format!(
                "the request body is over {} bytes, the most kept for an idempotent request",
                config.max_request
            );
            return Ok(problem(StatusCode::PAYLOAD_TOO_LARGE, &detail));
        }
        Err(e) => return Ok(problem(StatusCode::BAD_REQUEST, &format!("the request body could not be read: {e}"))),
    };
    let tenant = match &config.tenant {
        None => {
            if !config.warned_shared.swap(true, std::sync::atomic::Ordering::Relaxed) {
                tracing::warn!(target: "idem", scope = %config.scope,
                    "idempotency layer without a tenant function: keys are shared by every caller, so one \
                     client's key replays another's response; set IdempotencyLayer::tenant on APIs with more than one caller");
            }
            None
        }
        Some(tenant) => match tenant(&parts) {
            Some(tenant) if !tenant.trim().is_empty() => Some(tenant),
            _ => {
                let detail = "an idempotency key belongs to a caller, and this request names none";
                return Ok(problem(StatusCode::UNAUTHORIZED, detail));
            }
        },
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
    match task.await {
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
    // Whether the store holds responses of the layer's limit is asked of it
    // once, beside the first claims (not before: a store that is down then
    // fails both within one bound).
    if let Some(Err(detail)) = config.fits.get() {
        return Ok(problem(StatusCode::INTERNAL_SERVER_ERROR, detail));
    }
    let (fits, claim) = tokio::join!(config.fits_store(), guard.lease::<StoredResponse>(&*config.store, config.lease));
    if let Err(detail) = fits {
        if let Ok(Claim::Run(ticket)) = claim {
            ticket.release_failed("was refused (the layer is misconfigured)").await;
        }
        return Ok(problem(StatusCode::INTERNAL_SERVER_ERROR, detail));
    }
    let ticket = match claim {
        Ok(Claim::Replay(stored)) => return Ok(stored.into_response(true)),
        Ok(Claim::Run(ticket)) => ticket,
        Err(e) => return Ok(refused(&e, config.lease)),
    };
    let ran = ticket
        .run_body(async {
            let response = inner.call(request).await.map_err(Failure::Inner)?;
            handled(&config, response).await
        })
        .await;
    // The handler answered: from here it never runs again for this key,
    // and its client gets its answer, whatever becomes of the record.
    let unkept = match ran {
        Ok(Handled::Whole(stored)) => {
            return Ok(match ticket.completed(stored).await {
                Ok(stored) => stored.into_response(false),
                Err(e) => refused(&e, config.lease),
            });
        }
        Ok(Handled::Unkept(response, why)) => (response, why),
        Err(Failure::Release(response)) => {
            ticket.release_failed("answered with a response not to keep").await;
            return Ok(response);
        }
        Err(Failure::Inner(e)) => return Err(e),
        Err(Failure::Guard(e)) => return Ok(refused(&e, config.lease)),
    };
    let (response, why) = unkept;
    if let Err(e) = ticket.completed_without_answer(why).await {
        tracing::warn!(target: "idem", scope = %config.scope, error = %e,
            "idempotency layer: a response not kept, and its record could not say so");
    }
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
        Collected::Whole(bytes) => Ok(Handled::Whole(StoredResponse::of(&parts, bytes))),
        Collected::Partial(body, why) if why == OVER_LIMIT && config.pass_through_oversized => {
            tracing::warn!(target: "idem", scope = %config.scope, status = %parts.status, max = config.max_response,
                "idempotency layer: a response over the limit passed through unstored (pass_through_oversized); \
                 a retry runs the handler again");
            Err(Failure::Release(Response::from_parts(parts, body)))
        }
        Collected::Partial(body, why) => Ok(Handled::Unkept(Response::from_parts(parts, body), why)),
    }
}

/// The key from its header: a Structured Field string (`"..."`), or bare
/// text for clients that send it so; 1 to 255 visible ASCII characters.
/// `None` without the header; `Err` naming what is wrong.
fn key_of(config: &Config, headers: &HeaderMap) -> Result<Option<String>, String> {
    let mut values = headers.get_all(&config.header).iter();
    let Some(value) = values.next() else { return Ok(None) };
    let name = &config.header;
    if values.next().is_some() {
        return Err(format!("the request has more than one `{name}` header"));
    }
    let text = value.to_str().map_err(|_| format!("`{name}` holds bytes that are not visible ASCII"))?;
    let key = match text.strip_prefix('"') {
        Some(quoted) => {
            quoted.strip_suffix('"').ok_or_else(|| format!("`{name}` opens a quoted string it does not close"))?
        }
        None => text,
    };
    if key.is_empty()
        || key.len() > 255
        || !key.bytes().all(|b| b.is_ascii_graphic() || b == b' ')
        || key.trim().is_empty()
    {
        return Err(format!("`{name}` must hold 1 to 255 visible ASCII characters, e.g. a UUID in quotes"));
    }
    if key.contains(['"', '\\']) {
        return Err(format!("`{name}` holds a quote or a backslash; send the key as a plain quoted string"));
    }
    Ok(Some(key.to_owned()))
}

/// The request's fingerprint, as hex of its SHA-256.
fn fingerprint(of: &Fingerprint, parts: &request::Parts, body: &[u8]) -> Option<String> {
    let mut hash = Sha256::new();
    match of {
        Fingerprint::None => return None,
        Fingerprint::Request => {
            // Length-prefixed, so no two (method, target, body) triples
            // hash the same text.
            let target = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
            // A JSON body is compared as JSON: a client that serializes
            // its retry again (keys in another order, other spacing) sends
            // the same request.
            // The body's form is hashed too, so a raw body never matches a
            // canonical JSON one of the same bytes.
            let canonical = is_json(&parts.headers).then(|| canonical_json(body)).flatten();
            let (form, body): (&[u8], &[u8]) = match &canonical {
                Some(json) => (b"json", json),
                None => (b"raw", body),
            };
            for part in [parts.method.as_str().as_bytes(), target.as_bytes(), form, body] {
                hash.update((part.len() as u64).to_be_bytes());
                hash.update(part);
            }
        }
        Fingerprint::Custom(f) => hash.update(f(parts, body)),
    }
    Some(crate::key::hex(&hash.finalize()))
}

/// Whether the request says its body is JSON (`application/json`, or a
/// `+json` type such as `application/merge-patch+json`).
fn is_json(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    essence == "application/json" || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// `body` as canonical JSON (object keys sorted at every level, no
/// whitespace), or `None` (compare the bytes) if it does not parse, or if
/// parsing would lose what tells two requests apart: a number JSON holds
/// more exactly than a 64-bit integer or float (`1.000000000000000001`,
/// an integer past `u64`) or not in the form it would be written back
/// (`1e2`), or an object with a key twice (which handlers read
/// differently).
fn canonical_json(body: &[u8]) -> Option<Vec<u8>> {
    fn sorted(value: serde_json::Value) -> serde_json::Value {
        match value {
            serde_json::Value::Object(map) => {
                let mut entries: Vec<_> = map.into_iter().collect();
                entries.sort_by(|a, b| a.0.cmp(&b.0));
                serde_json::Value::Object(entries.into_iter().map(|(k, v)| (k, sorted(v))).collect())
            }
            serde_json::Value::Array(items) => serde_json::Value::Array(items.into_iter().map(sorted).collect()),
            other => other,
        }
    }
    fn entries(value: &serde_json::Value) -> usize {
        match value {
            serde_json::Value::Object(map) => map.len() + map.values().map(entries).sum::<usize>(),
            serde_json::Value::Array(items) => items.iter().map(entries).sum(),
            _ => 0,
        }
    }
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let (keys, exact) = scan_json(body);
    if !exact || keys != entries(&value) {
        return None;
    }
    serde_json::to_vec(&sorted(value)).ok()
}

/// In JSON text that parses: how many object keys it writes (a string
/// followed by `:`), and whether every number reads back as written.
fn scan_json(text: &[u8]) -> (usize, bool) {
    let (mut keys, mut i) = (0, 0);
    while i < text.len() {
        match text[i] {
            b'"' => {
                i += 1;
                while i < text.len() && text[i] != b'"' {
                    i += if text[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
                let mut j = i;
                while j < text.len() && text[j].is_ascii_whitespace() {
                    j += 1;
                }
                keys += usize::from(text.get(j) == Some(&b':'));
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                while i < text.len() && matches!(text[i], b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E') {
                    i += 1;
                }
                let token = std::str::from_utf8(&text[start..i]).unwrap_or("");
                let Ok(number) = serde_json::from_str::<serde_json::Number>(token) else { return (keys, false) };
                if number.to_string() != token {
                    return (keys, false);
                }
            }
            _ => i += 1,
        }
    }
    (keys, true)
}

/// A guard's refusal as an HTTP answer (`lease`: the layer's).
fn refused(e: &Error, lease: Duration) -> Response<ResponseBody> {
    match e {
        Error::LeaseLost { .. } => {
            // The handler was stopped: its lease could not be renewed (the
            // store is down) or was taken over. A retry once the lease has
            // passed takes the record over, or replays another's answer.
            tracing::warn!(target: "idem", error = %e, "idempotency layer: the handler was stopped, its lease lost");
            let mut response = problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "the request was stopped: its idempotency record could not be kept alive (the store did not answer); \
                 retry after the time given",
            );
            response.headers_mut().insert(http::header::RETRY_AFTER, HeaderValue::from(lease.as_secs().max(1)));
            response
        }
        Error::InProgress { .. } => {
            let mut response = problem(
                StatusCode::CONFLICT,
                "a request with this idempotency key is being processed; retry after it is done",
            );
            // Not the lease left (30 s by default): a first request
            // usually ends long before its lease, so ask again in a second.
            response.headers_mut().insert(http::header::RETRY_AFTER, HeaderValue::from(1u64));
            response
        }
        Error::KeyMismatch { .. } => problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            "this idempotency key was first used with another request; a retry must repeat the request, a new request needs a new key",
        ),
        Error::AnswerNotKept { .. } => {
            let mut response = problem(
                StatusCode::GONE,
                "the first request with this idempotency key was processed, but its response was not kept (too \
                 large to store); it will not run again: look its outcome up instead of retrying",
            );
            response.headers_mut().insert(REPLAYED, HeaderValue::from_static("true"));
            response
        }
        Error::InvalidKey { reason, .. } => {
            problem(StatusCode::BAD_REQUEST, &format!("invalid idempotency key: {reason}"))
        }
        e if e.is_retryable() => {
            tracing::warn!(target: "idem", error = %e, "idempotency layer: the store failed");
            let mut response =
                problem(StatusCode::SERVICE_UNAVAILABLE, "the idempotency store is not available; retry later");
            response.headers_mut().insert(http::header::RETRY_AFTER, HeaderValue::from(1u64));
            response
        }
        e => {
            tracing::error!(target: "idem", error = %e, "idempotency layer: the request could not be guarded");
            problem(StatusCode::INTERNAL_SERVER_ERROR, "the request could not be guarded against repeats")
        }
    }
}

/// An `application/problem+json` answer (RFC 9457).
fn problem(status: StatusCode, detail: &str) -> Response<ResponseBody> {
    let body = serde_json::json!({
        "type": "about:blank",
        "title": status.canonical_reason().unwrap_or("Error"),
        "status": status.as_u16(),
        "detail": detail,
    });
    let mut response = Response::new(ResponseBody::full(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response.headers_mut().insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
    response
}

/// A response passed through as the service gave it.
fn passed<RB>(response: Response<RB>) -> Response<ResponseBody>
where
    RB: HttpBody<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    response.map(ResponseBody::stream)
}

#[cfg(test)]
mod tests {
    use super::canonical_json;

    #[test]
    fn json_is_compared_as_json_where_nothing_is_lost() {
        let a = canonical_json(br#"{"b": [1, 2.5, {"y": null, "x": "\"q\":"}], "a": -3}"#).unwrap();
        let b = canonical_json(br#"{"a":-3,"b":[1,2.5,{"x":"\"q\":","y":null}]}"#).unwrap();
        assert_eq!(a, b);
        assert_ne!(canonical_json(br#"{"a":1.0}"#), canonical_json(br#"{"a":1}"#));
    }

    /// A request's fingerprint is stored with its record: a retry after an
    /// upgrade must hash as before, or every open record answers `422`.
    /// These hashes are pinned; never change them.
    #[test]
    fn request_fingerprints_hash_exactly_as_stored_records_expect() {
        let request = |content_type: Option<&str>| {
            let mut request = http::Request::post("/payments?x=1");
            if let Some(content_type) = content_type {
                request = request.header(http::header::CONTENT_TYPE, content_type);
            }
            request.body(()).unwrap().into_parts().0
        };
        let json = request(Some("application/json; charset=utf-8"));
        let patch = request(Some("application/merge-patch+json"));
        let plain = request(None);
        for (parts, body, pinned) in [
            (
                &json,
                &br#"{"b": [1, 2.5, {"y": null}], "a": -3}"#[..],
                "8a2e7a4b785b7be76462913e591a1601b559d3123bee6a848d3698fffbb85b4f",
            ),
            (
                &patch,
                br#"{"a":-3,"b":[1,2.5,{"y":null}]}"#,
                "8a2e7a4b785b7be76462913e591a1601b559d3123bee6a848d3698fffbb85b4f",
            ),
            // Would lose a difference: the bytes.
            (&json, br#"{"amount":1e2}"#, "283a012479757489eb9d3c9d849f550c10a83527f13f6bacf337815b82cfec4a"),
            (&json, br#"{"a":1,"a":2}"#, "86b66d6c56d9f2f8fd5a604b350058b6337db27840654c288dd3c11bc6feb44a"),
            (&json, b"not json", "b9b702334b6f5c39645823c604bb275e3ef41ce2b926fc91506067f747174388"),
            (&plain, br#"{"a":-3}"#, "bed2eec97506d1d2c3629751e1731e166c4ec976657a53c13873d7abb7e2efba"),
            (&plain, b"", "942bbd9292ad727076e74655e79c461940826b3147c4e12c14d360b26179240a"),
        ] {
            let hash = super::fingerprint(&super::Fingerprint::Request, parts, body).unwrap();
            assert_eq!(hash, pinned, "{}", String::from_utf8_lossy(body));
        }
        let custom =
            super::Fingerprint::Custom(std::sync::Arc::new(|_: &http::request::Parts, body: &[u8]| body.to_vec()));
        assert_eq!(
            super::fingerprint(&custom, &plain, b"abc").unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(super::fingerprint(&super::Fingerprint::None, &plain, b"abc"), None);
    }

    #[test]
    fn json_whose_parse_would_lose_a_difference_is_compared_as_bytes() {
        for body in [
            &br#"{"amount":1.000000000000000001}"#[..],
            br#"{"amount":123456789012345678901234567890}"#,
            br#"{"amount":1e2}"#,
            br#"{"a":1,"a":2}"#,
            br#"{"o":{"k":1,"k":1}}"#,
            b"not json",
        ] {
            assert_eq!(canonical_json(body), None, "{}", String::from_utf8_lossy(body));
        }
    }
}
