//! One-time tokens against double submits (`strategy = "token"` and
//! `"token+dedup"`).
//!
//! The server issues a token when it renders a form ([`issue`]); the form
//! sends it back with the submit; the guarded handler consumes it. Consuming
//! is one atomic compare-and-delete on the store (one Lua call on Redis, one
//! locked map operation in memory), never a read followed by a delete: of any
//! number of concurrent submits carrying one token, exactly one passes. The
//! others get [`Error::TokenRejected`], whose message is the one to show the
//! user: "please do not submit twice".
//!
//! A token is bound to the scope it was issued for: a token of
//! `orders.create` does not pass the guard of `payments.refund`, and is not
//! spent by trying.
//!
//! Limits worth knowing:
//! - a token stops front-end resubmission only. Payment callbacks, broker
//!   redeliveries and RPC retries never fetch a token: guard those with
//!   `dedup` or `state` (the attribute refuses `token` with such a `source`);
//! - a token is spent even if the body then fails: a retry fetches a new one
//!   (render the form again). `token+dedup` keeps a record as well, so a
//!   retry after a *successful* submit whose answer was lost replays that
//!   answer instead of being rejected;
//! - with `on_store_error = "allow"` a call passes unchecked while the store
//!   is unreachable (logged as a warning): keep a unique index on the
//!   business row as the backstop, as `examples/order_create.rs` does.

use std::time::Duration;

use crate::Error;

/// Longest token the stores accept; longer input is rejected without a
/// round trip.
pub const MAX_TOKEN_LEN: usize = 128;

pub use crate::store::token::TokenStore;

/// Issue a one-time token for `scope` (the `scope` of the guard that will
/// consume it), valid for `ttl`: 128 random bits as 32 hex digits. A `ttl`
/// under a millisecond or over 100 years is [`Error::InvalidDuration`].
///
/// ```
/// # async fn demo() -> Result<(), idem_runtime::Error> {
/// use std::time::Duration;
/// let store = idem_runtime::MemoryStore::new();
/// let token = idem_runtime::token::issue(&store, "orders.create", Duration::from_secs(600)).await?;
/// assert_eq!(token.len(), 32);
/// # Ok(()) }
/// ```
pub async fn issue<S: TokenStore + ?Sized>(store: &S, scope: &str, ttl: Duration) -> Result<String, Error> {
    let ttl = crate::error::check_ttl("token TTL", ttl)?;
    let token = new_token()?;
    store.put(&crate::key::stored_scope(scope), &token, ttl).await?;
    Ok(token)
}

/// Consume `token` for `scope` outside a guard: `Ok(true)` for the one call
/// that spends it.
pub async fn consume<S: TokenStore + ?Sized>(store: &S, scope: &str, token: &str) -> Result<bool, Error> {
    if !well_formed(token) {
        return Ok(false);
    }
    store.consume(&crate::key::stored_scope(scope), token).await
}

fn new_token() -> Result<String, Error> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| Error::Store { store: "os random", source: Box::new(e) })?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Tokens come from clients: anything empty, too long or not printable
/// ASCII is rejected before it reaches a store (or a Redis key).
pub(crate) fn well_formed(token: &str) -> bool {
    !token.is_empty() && token.len() <= MAX_TOKEN_LEN && token.bytes().all(|b| b.is_ascii_graphic())
}

pub use crate::guard::OnStoreError;

/// A token parameter: `&str`, `String`, or an `Option` of one (`None`, a
/// submit without a token, is rejected).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot carry a one-time token",
    label = "the `#[idem(token)]` parameter must be a string",
    note = "take the token as `&str`, `String` or `Option<String>`"
)]
pub trait TokenParam {
    /// The token, if the request carried one.
    fn token(&self) -> Option<&str>;
}

impl TokenParam for str {
    fn token(&self) -> Option<&str> {
        Some(self)
    }
}
impl TokenParam for String {
    fn token(&self) -> Option<&str> {
        Some(self)
    }
}
impl<T: TokenParam + ?Sized> TokenParam for &T {
    fn token(&self) -> Option<&str> {
        (**self).token()
    }
}
impl<T: TokenParam> TokenParam for Option<T> {
    fn token(&self) -> Option<&str> {
        self.as_ref().and_then(TokenParam::token)
    }
}
