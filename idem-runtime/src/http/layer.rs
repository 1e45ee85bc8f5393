//! The layer: its configuration, built once and shared by every service it
//! wraps.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Method, StatusCode, request};

use crate::door::fingerprint::{Fingerprint, FingerprintFn};
use crate::door::settings::{Records, Settings, TenantFn};
use crate::lease::store::LeaseStore;
use crate::stores::Stores;

pub(super) type StoreFn = dyn Fn(StatusCode) -> bool + Send + Sync;

/// What a layer was configured with, shared by its services and their
/// requests.
#[derive(Clone)]
pub(super) struct Config {
    pub(super) door: Settings,
    pub(super) methods: Vec<Method>,
    pub(super) keep: Arc<StoreFn>,
    pub(super) pass_through_oversized: bool,
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
/// let layer = IdempotencyLayer::new(idem::store::SqlStore::new(pool))
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
    pub(super) config: Arc<Config>,
}

impl std::fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (c, methods) = (&self.config.door, &self.config.methods);
        f.debug_struct("IdempotencyLayer")
            .field("store", &c.store)
            .field("scope", &c.scope)
            .field("header", &c.header)
            .field("required", &c.required)
            .field("methods", methods)
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
        IdempotencyLayer::over(Records::Store(Arc::new(store)))
    }

    /// A layer keeping its records in the lease store
    /// [installed](crate::StoresBuilder::install) at start-up, as guards
    /// that name no store do; the defaults of [`new`](Self::new). The store
    /// is looked up at each request, so the layer may be built before the
    /// stores are installed; a guarded request finding no lease store is
    /// refused with a `500` naming the fix ([`Error::NoStore`](crate::Error::NoStore)), nothing
    /// run.
    pub fn installed() -> IdempotencyLayer {
        IdempotencyLayer::over(Records::Installed)
    }

    /// A layer keeping its records in the lease store of `stores` (the
    /// value a guard names with `store = "..."`); the defaults of
    /// [`new`](Self::new). Without a lease store in it, guarded requests
    /// are refused with a `500` naming the fix ([`Error::NoStore`](crate::Error::NoStore)).
    pub fn with_stores(stores: Stores) -> IdempotencyLayer {
        IdempotencyLayer::over(Records::Stores(stores))
    }

    fn over(store: Records) -> IdempotencyLayer {
        IdempotencyLayer {
            config: Arc::new(Config {
                door: Settings::new(store, "http"),
                methods: vec![Method::POST, Method::PATCH],
                keep: Arc::new(keeps_by_default),
                pass_through_oversized: false,
            }),
        }
    }

    fn with(mut self, change: impl FnOnce(&mut Config)) -> IdempotencyLayer {
        // A layer cloned (its services share its configuration) and then
        // configured changes a copy of its own.
        change(Arc::make_mut(&mut self.config));
        self
    }

    fn with_door(self, change: impl FnOnce(&mut Settings)) -> IdempotencyLayer {
        self.with(|c| change(&mut c.door))
    }

    /// The records' scope: give each API (or version of one) its own.
    pub fn scope(self, scope: impl Into<Cow<'static, str>>) -> IdempotencyLayer {
        let scope = scope.into();
        self.with_door(|c| c.scope = scope)
    }

    /// The key's header (default `Idempotency-Key`).
    pub fn header(self, header: HeaderName) -> IdempotencyLayer {
        self.with_door(|c| c.header = header)
    }

    /// Refuse a guarded request without a key (`400`), instead of passing
    /// it through unguarded.
    pub fn required(self, required: bool) -> IdempotencyLayer {
        self.with_door(|c| c.required = required)
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
        self.with_door(|c| c.tenant = Some(tenant))
    }

    /// What makes two requests "the same" behind one key: bytes hashed
    /// into the record (the default: method, path and query, and body). A
    /// retry must match; another request with the key is `422`.
    pub fn fingerprint(
        self,
        fingerprint: impl Fn(&request::Parts, &[u8]) -> Vec<u8> + Send + Sync + 'static,
    ) -> IdempotencyLayer {
        let fingerprint: Arc<FingerprintFn> = Arc::new(fingerprint);
        self.with_door(|c| c.fingerprint = Fingerprint::Custom(fingerprint))
    }

    /// No fingerprint: a key replays its first response to whatever request
    /// comes with it.
    pub fn without_fingerprint(self) -> IdempotencyLayer {
        self.with_door(|c| c.fingerprint = Fingerprint::None)
    }

    /// Which responses are kept and replayed (default [`keeps_by_default`]);
    /// a response not kept leaves no record, so a retry runs again.
    pub fn keep(self, keep: impl Fn(StatusCode) -> bool + Send + Sync + 'static) -> IdempotencyLayer {
        let keep: Arc<StoreFn> = Arc::new(keep);
        self.with(|c| c.keep = keep)
    }

    /// The largest request body read (default 1 MiB): a longer one is `413`.
    pub fn max_request_body(self, bytes: usize) -> IdempotencyLayer {
        self.with_door(|c| c.max_request = bytes)
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
        self.with_door(|c| c.max_response = bytes)
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
        self.with_door(|c| c.lease = lease)
    }

    /// How long responses are kept (default 24 h).
    pub fn retention(self, retention: Duration) -> IdempotencyLayer {
        self.with_door(|c| c.retention = retention)
    }

    /// Hold a duplicate that arrives while the first call still runs, up
    /// to `wait`, and answer it as the first call ends: with the first
    /// response, replayed; or, if the first call failed (a status that is
    /// not kept, a panic: its record was removed), by running the handler
    /// for it. Past `wait`,
    /// `409 Conflict` with `Retry-After`, as without waiting. Default zero: refused at once, and
    /// every client retries with a backoff of its own. A waiting call
    /// holds no database connection and does not poll the store in a
    /// tight loop ([`Guard::lease_or_wait`](crate::Guard::lease_or_wait));
    /// each holds its task and its client's connection, so bound `wait`
    /// by what the server can keep open.
    pub fn wait(self, wait: Duration) -> IdempotencyLayer {
        self.with_door(|c| c.wait = wait)
    }
}

#[cfg(test)]
mod tests {
    use super::IdempotencyLayer;

    /// A layer cloned, then configured, changes its own copy (it panicked).
    #[test]
    fn a_cloned_layer_is_configured_on_its_own() {
        let base = IdempotencyLayer::new(crate::store::MemoryStore::new());
        let waiting = base.clone().wait(std::time::Duration::from_secs(5));
        assert_eq!(waiting.config.door.wait, std::time::Duration::from_secs(5));
        assert_eq!(base.config.door.wait, std::time::Duration::ZERO);
    }
}
