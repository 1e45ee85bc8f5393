//! The `Idempotency-Key` layer (feature `http`): the user-facing
//! documentation is the `idem` crate's `http` module (`docs/http.md`); this
//! is the runtime behind it.

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

/// The header that says, on a first response and on its replays, for how
/// many more seconds the key's record is kept: until then a retry gets the
/// same response; after, the key is free again.
pub const EXPIRES_IN: HeaderName = HeaderName::from_static("idempotency-key-expires-in");
