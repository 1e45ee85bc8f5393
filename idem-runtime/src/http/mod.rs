//! The `Idempotency-Key` layer (feature `http`): the user-facing
//! documentation is the `idem` crate's `http` module (`docs/http.md`); this
//! is the runtime behind it.

// One file per job, as tower-http lays out a layer: `layer` (the
// configuration), `service` (one request through it), `problem` (the
// layer's own answers: a stored response again, refusals as RFC 9457
// answers) and `body` (the response body). What the gRPC layer reads alike
// (the key and tenant, the fingerprint, a response as its record keeps it,
// the guarded call) is `crate::door`'s.

use http::HeaderName;

mod body;
mod layer;
mod problem;
mod service;

pub use body::ResponseBody;
pub use layer::{IdempotencyLayer, keeps_by_default};
pub use service::Idempotency;

/// The errors a body can carry.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The header a replayed response carries.
pub const REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// The header that says, on a first response and on its replays, for how
/// many more seconds the key's record is kept: until then a retry gets the
/// same response; after, the key is free again.
pub const EXPIRES_IN: HeaderName = HeaderName::from_static("idempotency-key-expires-in");
