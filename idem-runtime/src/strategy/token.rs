//! `strategy = "token"` and `"token+dedup"`: a one-time token consumed in
//! one atomic step before the body runs.

use crate::guard::{Guard, GuardError, Prepared};
use crate::precheck::PrecheckStore;
use crate::record::{Outcome, report};
use crate::sql::{Conn, SqlBackend};
use crate::strategy::dedup::{Claim, Claimed, Ticket, claim_record, discard, judge, prechecked, require_transaction};
use crate::token::{OnStoreError, TokenParam, TokenStore, well_formed};

/// The token a `#[idem(token)]` parameter carries, if any.
#[doc(hidden)]
pub fn token_param<K: TokenParam + ?Sized>(param: &K) -> Option<&str> {
    param.token()
}
use crate::{Error, Replayable};

/// The right to run the body once, its token spent.
#[doc(hidden)]
#[must_use = "a spent token must run the body"]
pub struct TokenTicket {
    prepared: Prepared,
}

impl Guard {
    /// `strategy = "token"`: spend the token (it is the key), or refuse.
    pub async fn token<T>(
        self,
        store: &dyn TokenStore,
        token: Option<&str>,
        on_store_error: OnStoreError,
    ) -> Result<Claim<T, TokenTicket>, Error> {
        let Some(token) = token.filter(|t| well_formed(t)) else {
            // No usable token to key on: report under an empty key.
            report(self.spec.scope, &crate::Key::from_stored(String::new()), Outcome::Rejected);
            return Err(Error::TokenRejected);
        };
        let p = self.key(token).prepare()?;
        spend(store, &p, token, on_store_error).await?;
        Ok(Claim::Run(TokenTicket { prepared: p }))
    }

    /// `strategy = "token+dedup"`: claim the dedup record in the caller's
    /// transaction first, so that a repeat of a completed call replays its
    /// answer (a retry whose response was lost is not told "do not submit
    /// twice"); a fresh claim then spends the token, or is removed again.
    pub async fn dedup_token<T: Replayable, DB: SqlBackend>(
        self,
        conn: Conn<'_, DB>,
        store: &dyn TokenStore,
        token: Option<&str>,
        on_store_error: OnStoreError,
    ) -> Result<Claim<T>, Error> {
        self.dedup_token_with(conn, store, token, on_store_error, None).await
    }

    /// `token+dedup` with `precheck`: a seen key whose completed record is
    /// there replays before the claim, and its token is left alone.
    pub async fn dedup_token_prechecked<T: Replayable, DB: SqlBackend>(
        self,
        conn: Conn<'_, DB>,
        store: &dyn TokenStore,
        token: Option<&str>,
        on_store_error: OnStoreError,
        precheck: &dyn PrecheckStore,
        ttl: std::time::Duration,
    ) -> Result<Claim<T>, Error> {
        self.dedup_token_with(conn, store, token, on_store_error, Some((precheck, ttl))).await
    }

    async fn dedup_token_with<T: Replayable, DB: SqlBackend>(
        self,
        conn: Conn<'_, DB>,
        store: &dyn TokenStore,
        token: Option<&str>,
        on_store_error: OnStoreError,
        precheck: Option<(&dyn PrecheckStore, std::time::Duration)>,
    ) -> Result<Claim<T>, Error> {
        let p = self.prepare()?;
        let conn = conn.0;
        require_transaction::<DB>(conn, &p)?;
        if let Some(replay) = prechecked::<T, DB>(conn, &p, precheck).await? {
            return Ok(Claim::Replay(replay));
        }
        match claim_record::<DB>(conn, &p, None).await? {
            Claimed::Fresh { .. } => {
                let spent = match token.filter(|t| well_formed(t)) {
                    Some(token) => spend(store, &p, token, on_store_error).await,
                    None => {
                        report(p.spec.scope, &p.key, Outcome::Rejected);
                        Err(Error::TokenRejected)
                    }
                };
                match spent {
                    Ok(()) => Ok(Claim::Run(Ticket { prepared: p, record: true, moved: None })),
                    Err(e) => {
                        discard::<DB>(conn, &p).await;
                        Err(e)
                    }
                }
            }
            Claimed::Existing(existing) => judge(&p, existing).map(Claim::Replay),
        }
    }
}

/// Consume the token; a store failure follows the guard's policy.
async fn spend(store: &dyn TokenStore, p: &Prepared, token: &str, on_store_error: OnStoreError) -> Result<(), Error> {
    match store.consume(&p.stored_scope, token).await {
        Ok(true) => Ok(()),
        Ok(false) => {
            report(p.spec.scope, &p.key, Outcome::Rejected);
            Err(Error::TokenRejected)
        }
        // No token store configured is a mistake to fix, never "allowed".
        Err(e @ Error::NoStore { .. }) => Err(e),
        Err(e) => match on_store_error {
            OnStoreError::Reject => Err(e),
            OnStoreError::Allow => {
                tracing::warn!(target: "idem", scope = p.spec.scope, store = store.kind(), error = %e,
                    "token store unreachable; on_store_error = \"allow\" lets the call through unchecked");
                Ok(())
            }
        },
    }
}

impl TokenTicket {
    /// Run the body; the token is spent whatever it returns.
    pub async fn run<T, E: GuardError, F: Future<Output = Result<T, E>>>(self, body: F) -> Result<T, E> {
        let result = body.await;
        if result.is_ok() {
            report(self.prepared.spec.scope, &self.prepared.key, Outcome::Executed);
        }
        result
    }
}
