//! The layer: its configuration, built once and shared by every service it
//! wraps.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, request};
use tonic::Code;

use crate::door::fingerprint::{Fingerprint, FingerprintFn};
use crate::door::settings::{Records, Settings, TenantFn};
use crate::lease::store::LeaseStore;
use crate::stores::Stores;

pub(super) type KeepFn = dyn Fn(Code) -> bool + Send + Sync;

/// What a layer was configured with, shared by its services and their
/// calls.
#[derive(Clone)]
pub(super) struct Config {
    pub(super) door: Settings,
    /// Full method paths (`/pkg.Service/Method`) and service names
    /// (`pkg.Service`) passed through unguarded.
    pub(super) pass_through: Vec<String>,
    pub(super) keep: Arc<KeepFn>,
}

impl Config {
    /// Whether a call to `path` passes through unguarded.
    pub(super) fn passes(&self, path: &str) -> bool {
        self.pass_through.iter().any(|entry| {
            path == entry
                || path
                    .strip_prefix('/')
                    .and_then(|p| p.strip_prefix(entry.as_str()))
                    .is_some_and(|method| method.starts_with('/'))
        })
    }
}

/// The layer: wrap a tonic server with it (`Server::builder().layer(...)`).
///
/// ```no_run
/// # extern crate idem_runtime as idem;
/// # fn demo(pool: sqlx::PgPool) {
/// use idem::grpc::IdempotencyLayer;
///
/// let layer = IdempotencyLayer::new(idem::store::SqlStore::new(pool))
///     .scope("payments.grpc")
///     .required(true)
///     // Streaming methods, and whole services that need no guard.
///     .pass_through(["/payments.Payments/Watch", "grpc.health.v1.Health"])
///     .tenant(|request| {
///         // The authenticated caller, as an earlier layer left it.
///         request.headers.get("x-api-client").and_then(|v| v.to_str().ok()).map(str::to_owned)
///     });
/// // tonic::transport::Server::builder().layer(layer).add_service(...)
/// # let _ = layer; }
/// ```
#[derive(Clone)]
pub struct IdempotencyLayer {
    pub(super) config: Arc<Config>,
}

impl std::fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = &self.config.door;
        f.debug_struct("IdempotencyLayer")
            .field("store", &c.store)
            .field("scope", &c.scope)
            .field("metadata_key", &c.header)
            .field("required", &c.required)
            .field("pass_through", &self.config.pass_through)
            .field("tenant", &c.tenant.is_some())
            .field("max_request", &c.max_request)
            .field("max_response", &c.max_response)
            .field("lease", &c.lease)
            .field("retention", &c.retention)
            .finish_non_exhaustive()
    }
}

impl IdempotencyLayer {
    /// A layer keeping its records in `store` (a lease store: SQL where a
    /// second run is unacceptable, Redis, or memory for one process), with
    /// the defaults: scope `grpc`, metadata `idempotency-key`, the key
    /// optional, every method guarded (none passed through), the
    /// fingerprint of method path and request message, `OK` responses
    /// kept, 1 MiB limits, a 30 s lease (renewed while the handler runs)
    /// and 24 h retention.
    pub fn new(store: impl LeaseStore + 'static) -> IdempotencyLayer {
        IdempotencyLayer::over(Records::Store(Arc::new(store)))
    }

    /// A layer keeping its records in the lease store
    /// [installed](crate::StoresBuilder::install) at start-up, looked up at
    /// each call (the layer may be built before the stores are installed);
    /// the defaults of [`new`](Self::new). A guarded call finding no lease
    /// store is refused with `INTERNAL` naming the fix
    /// ([`Error::NoStore`](crate::Error::NoStore)), nothing run.
    pub fn installed() -> IdempotencyLayer {
        IdempotencyLayer::over(Records::Installed)
    }

    /// A layer keeping its records in the lease store of `stores`; the
    /// defaults of [`new`](Self::new). Without a lease store in it, guarded
    /// calls are refused with `INTERNAL` naming the fix.
    pub fn with_stores(stores: Stores) -> IdempotencyLayer {
        IdempotencyLayer::over(Records::Stores(stores))
    }

    fn over(store: Records) -> IdempotencyLayer {
        IdempotencyLayer {
            config: Arc::new(Config {
                door: Settings::new(store, "grpc"),
                pass_through: Vec::new(),
                keep: Arc::new(|code| code == Code::Ok),
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

    /// The key's metadata entry (default `idempotency-key`).
    pub fn metadata_key(self, name: HeaderName) -> IdempotencyLayer {
        self.with_door(|c| c.header = name)
    }

    /// Refuse a guarded call without a key (`INVALID_ARGUMENT`), instead
    /// of passing it through unguarded.
    pub fn required(self, required: bool) -> IdempotencyLayer {
        self.with_door(|c| c.required = required)
    }

    /// Pass these through unguarded: full method paths
    /// (`/payments.Payments/Watch`) or whole services (`grpc.health.v1.Health`).
    /// **Every streaming method must be listed**: the layer cannot tell
    /// from the wire that a method streams, and a guarded one would be read
    /// whole before its handler runs and before its client sees a message.
    pub fn pass_through<I, S>(self, methods: I) -> IdempotencyLayer
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let methods: Vec<String> = methods.into_iter().map(Into::into).collect();
        self.with(|c| c.pass_through.extend(methods))
    }

    /// Scope keys per tenant: `tenant` names who sent the call from its
    /// request (metadata are its headers; an authenticated user, an API
    /// client id). Two tenants' equal keys are different records, so one
    /// can never replay the other's response. A call it names no tenant for
    /// (`None`, or an empty name) is refused (`UNAUTHENTICATED`).
    pub fn tenant(
        self,
        tenant: impl Fn(&request::Parts) -> Option<String> + Send + Sync + 'static,
    ) -> IdempotencyLayer {
        let tenant: Arc<TenantFn> = Arc::new(tenant);
        self.with_door(|c| c.tenant = Some(tenant))
    }

    /// What makes two calls "the same" behind one key: bytes hashed into
    /// the record (the default: the method path and the request body, its
    /// messages as sent). A retry must match; another call with the key is
    /// `FAILED_PRECONDITION`. The body is the messages behind their 5-byte
    /// gRPC prefixes; protobuf encodes a message in more than one way (map
    /// entries in any order), so a client that encodes its retry afresh
    /// may need a fingerprint of the decoded message.
    pub fn fingerprint(
        self,
        fingerprint: impl Fn(&request::Parts, &[u8]) -> Vec<u8> + Send + Sync + 'static,
    ) -> IdempotencyLayer {
        let fingerprint: Arc<FingerprintFn> = Arc::new(fingerprint);
        self.with_door(|c| c.fingerprint = Fingerprint::Custom(fingerprint))
    }

    /// No fingerprint: a key replays its first response to whatever call
    /// comes with it.
    pub fn without_fingerprint(self) -> IdempotencyLayer {
        self.with_door(|c| c.fingerprint = Fingerprint::None)
    }

    /// Which responses are kept and replayed, by their status (default:
    /// `OK` only). A response not kept leaves no record, so a retry runs
    /// again: keep a status only where it is the call's final word
    /// (`INVALID_ARGUMENT`, `ALREADY_EXISTS`), never one a retry may cure.
    pub fn keep(self, keep: impl Fn(Code) -> bool + Send + Sync + 'static) -> IdempotencyLayer {
        let keep: Arc<KeepFn> = Arc::new(keep);
        self.with(|c| c.keep = keep)
    }

    /// The largest request body read (default 1 MiB): a longer one is
    /// `RESOURCE_EXHAUSTED`, nothing run.
    pub fn max_request_body(self, bytes: usize) -> IdempotencyLayer {
        self.with_door(|c| c.max_request = bytes)
    }

    /// The largest response body kept (default 1 MiB). A longer one is sent
    /// as it comes, and its record completed without it: its retries get
    /// `ALREADY_EXISTS` and the handler never runs again. A limit whose
    /// records the store cannot hold is refused at the first guarded call
    /// (`INTERNAL`, naming both sizes), nothing run.
    pub fn max_response_body(self, bytes: usize) -> IdempotencyLayer {
        self.with_door(|c| c.max_response = bytes)
    }

    /// How long a first call holds its key without news (default 30 s;
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
    /// `ABORTED` with `grpc-retry-pushback-ms`, as without waiting. Default zero: refused at once, and
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

    /// A listed method passes, and every method of a listed service, but
    /// no service whose name only starts alike.
    #[test]
    fn pass_through_names_methods_and_whole_services() {
        let layer = IdempotencyLayer::new(crate::store::MemoryStore::new())
            .pass_through(["/payments.Payments/Watch", "grpc.health.v1.Health"]);
        let passes = |path| layer.config.passes(path);
        assert!(passes("/payments.Payments/Watch"));
        assert!(!passes("/payments.Payments/Pay"));
        assert!(!passes("/payments.Payments/WatchAll"));
        assert!(passes("/grpc.health.v1.Health/Check"));
        assert!(passes("/grpc.health.v1.Health/Watch"));
        assert!(!passes("/grpc.health.v1.HealthX/Check"));
        assert!(!passes("/grpc.health.v1/Health"));
    }

    /// A layer cloned, then configured, changes its own copy (it panicked).
    #[test]
    fn a_cloned_layer_is_configured_on_its_own() {
        let base = IdempotencyLayer::new(crate::store::MemoryStore::new());
        let waiting = base.clone().wait(std::time::Duration::from_secs(5));
        assert_eq!(waiting.config.door.wait, std::time::Duration::from_secs(5));
        assert_eq!(base.config.door.wait, std::time::Duration::ZERO);
    }
}
