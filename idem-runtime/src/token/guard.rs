//! `strategy = "token"`: a one-time token consumed in one atomic step
//! before the body runs (`token+dedup`, which claims a dedup record first,
//! is in `dedup/token.rs`).

use crate::guard::{Guard, GuardError, Prepared};
use crate::telemetry::{Outcome, report};
use crate::token::{OnStoreError, TokenParam, TokenStore, well_formed};

/// The token a `#[idem(token)]` parameter carries, if any.
#[doc(hidden)]
pub fn token_param<K: TokenParam + ?Sized>(param: &K) -> Option<&str> {
    param.token()
}
use crate::error::Error;
use crate::guard::Claim;

/// The right to run the body once, its token spent: see [`TokenTicket::run`].
#[derive(Debug)]
#[must_use = "a spent token must run the body"]
pub struct TokenTicket {
    prepared: Prepared,
}

impl Guard<'_> {
    /// `token`: spend a one-time token (issued with
    /// [`token::issue`](crate::token::issue) for this guard's scope) in one
    /// atomic step; the token is the key. Of any number of concurrent calls
    /// with one token, exactly one gets [`Claim::Run`]: run the body with
    /// [`TokenTicket::run`]. The others, and a used, expired, forged,
    /// missing (`None`) or other scope's token, get
    /// [`Error::TokenRejected`] ("please do not submit twice"). A token is
    /// spent whatever the body returns. A store that cannot be reached
    /// fails the call, unless [`Guard::on_store_error`] allows it.
    #[tracing::instrument(level = "debug", target = "idem", name = "idem.claim", skip_all, fields(scope = %self.scope(), strategy = "token"))]
    pub async fn token<T>(self, store: &dyn TokenStore, token: Option<&str>) -> Result<Claim<T, TokenTicket>, Error> {
        let Some(token) = token.filter(|t| well_formed(t)) else {
            // No usable token to key on: report under an empty key.
            let labels =
                crate::telemetry::metrics::Labels { scope: self.scope(), strategy: "token", store: store.kind() };
            report(labels, &crate::key::Key::from_stored(String::new()), Outcome::Rejected);
            return Err(Error::TokenRejected);
        };
        let on_store_error = self.store_error_policy();
        let p = self.key(token).prepare_claim_before("token", store.kind())?;
        spend(store, &p, token, on_store_error).await?;
        p.claimed();
        Ok(Claim::Run(TokenTicket { prepared: p }))
    }
}

/// Consume the token; a store failure follows the guard's policy.
pub(crate) async fn spend(
    store: &dyn TokenStore,
    p: &Prepared,
    token: &str,
    on_store_error: OnStoreError,
) -> Result<(), Error> {
    match store.consume(&p.stored_scope, token).await {
        Ok(true) => Ok(()),
        Ok(false) => {
            p.report(Outcome::Rejected);
            Err(Error::TokenRejected)
        }
        // No token store configured is a mistake to fix, never "allowed".
        Err(e @ Error::NoStore { .. }) => Err(e),
        Err(e) => match on_store_error {
            OnStoreError::Reject => Err(e),
            OnStoreError::Allow => {
                tracing::warn!(target: "idem", scope = %p.scope, store = store.kind(), error = %e,
                    "token store unreachable; on_store_error = \"allow\" lets the call through unchecked");
                Ok(())
            }
        },
    }
}

impl TokenTicket {
    /// Run the body; the token is spent whatever it returns.
    #[tracing::instrument(level = "debug", target = "idem", name = "idem.run", skip_all, fields(scope = %self.prepared.scope, strategy = "token"))]
    pub async fn run<T, E: GuardError, F: Future<Output = Result<T, E>>>(self, body: F) -> Result<T, E> {
        let result = body.await;
        if result.is_ok() {
            self.prepared.report(Outcome::Executed);
        }
        result
    }
}
