//! The idempotency layer for tonic gRPC services (feature `grpc`): the
//! user-facing documentation is the `idem` crate's `grpc` module
//! (`docs/grpc.md`); this is the runtime behind it.

// One file per job, as tower-http lays out a layer: `layer` (the
// configuration), `service` (one call through it), `status` (the layer's
// own answers: a stored call again, refusals as gRPC statuses). What the
// HTTP layer reads alike (the key and tenant, the fingerprint, a response
// as its record keeps it, the guarded call) is `crate::door`'s.

mod layer;
mod service;
mod status;

pub use layer::IdempotencyLayer;
pub use service::Idempotency;

/// The metadata entry (`true`) a replayed call's response carries, in its
/// headers.
pub const REPLAYED: &str = "idempotent-replayed";

/// The metadata entry telling a client how long to wait before it retries
/// (gRFC A6's retry pushback, in milliseconds), on `ABORTED` and
/// `UNAVAILABLE` refusals.
pub const RETRY_PUSHBACK: &str = "grpc-retry-pushback-ms";
