//! One-time tokens (`token`, `token+dedup`): the user-facing documentation is
//! the `idem` crate's `token` module; this is the runtime behind it.

pub(crate) mod guard;
pub(crate) mod store;

use std::time::Duration;

use crate::error::Error;

/// Longest token the stores accept; longer input is rejected without a
/// round trip.
pub const MAX_TOKEN_LEN: usize = 128;

pub use crate::token::guard::TokenTicket;
pub use crate::token::store::TokenStore;

/// Issue a one-time token for `scope` (the `scope` of the guard that will
/// consume it), valid for `ttl`: 128 random bits as 32 hex digits. A `ttl`
/// under a millisecond or over 100 years is [`Error::InvalidDuration`].
///
/// ```
/// # extern crate idem_runtime as idem;
/// # async fn demo() -> Result<(), idem::Error> {
/// use std::time::Duration;
/// let store = idem::store::MemoryStore::new();
/// let token = idem::token::issue(&store, "orders.create", Duration::from_secs(600)).await?;
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
