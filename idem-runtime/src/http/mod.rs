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
//! The layer takes its store as every guard does: the lease store of the
//! [`Stores`](crate::Stores) installed at start-up
//! ([`IdempotencyLayer::installed`], looked up at each request, so the
//! layer may be built before `install` runs; a request finding none is a
//! `500` naming the fix), that of a `Stores` value
//! ([`with_stores`](IdempotencyLayer::with_stores)), or a lease store of
//! its own ([`new`](IdempotencyLayer::new)).
//!
//! ```no_run
//! # extern crate idem_runtime as idem;
//! # fn demo(pool: sqlx::PgPool) -> Result<(), idem::Error> {
//! use idem::http::IdempotencyLayer;
//!
//! // Built with the router, before or after the stores are installed.
//! let layer = IdempotencyLayer::installed().scope("payments.api");
//! idem::Stores::builder().lease(idem::lease::SqlStore::new(pool)).install()?;
//! # let _ = layer; Ok(()) }
//! ```
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

// One file per job, as tower-http lays out a layer: `layer` (the
// configuration), `service` (one request through it), `request` (its key
// and tenant), `fingerprint` (what makes two requests the same), `problem`
// (refusals as RFC 9457 answers), `body` (the response body, read up to a
// limit) and `stored` (a response as its record keeps it).

use http::HeaderName;

mod body;
mod fingerprint;
mod layer;
mod problem;
mod request;
mod service;
mod stored;

pub use body::ResponseBody;
pub use layer::{IdempotencyLayer, keeps_by_default};
pub use service::Idempotency;

/// The errors a body can carry.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The header a replayed response carries.
pub const REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");
