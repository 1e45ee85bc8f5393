//! What the HTTP and gRPC doors share (features `http`, `grpc`): where
//! their records live, the settings every guarded call reads, its key and
//! tenant, its fingerprint, a response as its record keeps it, and the
//! call itself from the claim to the answer its retries get. Each door
//! adds its own wire: which calls it guards, how it reads a request, how it
//! answers a refusal.
//!
//! A door never imports another door; both import this.

pub(crate) mod body;
pub(crate) mod call;
pub(crate) mod fingerprint;
pub(crate) mod settings;
pub(crate) mod stored;

/// The errors a body can carry.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
