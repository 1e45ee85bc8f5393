//! `strategy = "token"` and `"token+dedup"`: a one-time token consumed in
//! one atomic step before the body runs.

#[cfg(feature = "sql")]
use crate::dedup::context::{Claimed, TxContext};
#[cfg(feature = "sql")]
use crate::dedup::record::{discard, judge, prechecked};
#[cfg(feature = "sql")]
use crate::dedup::ticket::Ticket;
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
#[cfg(feature = "sql")]
use crate::replay::Replayable;

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

    /// `token+dedup`: claim a dedup record (under this guard's key) in the
    /// caller's transaction first, then spend the token. A retry of a
    /// completed submit (whose answer was lost) replays that answer instead
    /// of being told "do not submit twice"; concurrent submits wait on the
    /// first one's record and replay it. A fresh claim whose token cannot
    /// be spent is removed again ([`Error::TokenRejected`]).
    /// [`Guard::precheck`] applies before the claim (a seen, completed key
    /// replays without touching its token).
    #[cfg(feature = "sql")]
    #[tracing::instrument(level = "debug", target = "idem", name = "idem.claim", skip_all, fields(scope = %self.scope(), strategy = "token+dedup"))]
    pub async fn token_dedup<T: Replayable, C: TxContext + ?Sized>(
        self,
        tx: &mut C,
        store: &dyn TokenStore,
        token: Option<&str>,
    ) -> Result<Claim<T, Ticket<C::Db>>, Error> {
        let (precheck, on_store_error) = (self.precheck_store(), self.store_error_policy());
        let p = self.prepare_claim_before("token+dedup", <C::Db as crate::store::sql::SqlBackend>::BACKEND)?;
        tx.ready_for_guard(&p, true).await?;
        if let Some(replay) = prechecked::<T, C::Db>(tx.guard_connection(), &p, precheck).await? {
            return Ok(Claim::Replay(replay));
        }
        match tx.claim_record(&p, None).await? {
            Claimed::Fresh { .. } => {
                let spent = match token.filter(|t| well_formed(t)) {
                    Some(token) => spend(store, &p, token, on_store_error).await,
                    None => {
                        p.report(Outcome::Rejected);
                        Err(Error::TokenRejected)
                    }
                };
                match spent {
                    Ok(()) => Ok(Claim::Run(Ticket::new(p, true, None).running_on(tx))),
                    Err(e) => {
                        discard::<C::Db>(tx.guard_connection(), &p).await;
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
