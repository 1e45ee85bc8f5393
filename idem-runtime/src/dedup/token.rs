//! `strategy = "token+dedup"`: a dedup record claimed in the caller's
//! transaction first, then the one-time token spent.

use crate::dedup::context::{Claimed, TxContext};
use crate::dedup::record::{discard, judge, prechecked};
use crate::dedup::ticket::Ticket;
use crate::error::Error;
use crate::guard::{Claim, Guard};
use crate::replay::Replayable;
use crate::telemetry::Outcome;
use crate::token::guard::spend;
use crate::token::{TokenStore, well_formed};

impl Guard<'_> {
    /// `token+dedup`: claim a dedup record (under this guard's key) in the
    /// caller's transaction first, then spend the token. A retry of a
    /// completed submit (whose answer was lost) replays that answer instead
    /// of being told "do not submit twice"; concurrent submits wait on the
    /// first one's record and replay it. A fresh claim whose token cannot
    /// be spent is removed again ([`Error::TokenRejected`]).
    /// [`Guard::precheck`] applies before the claim (a seen, completed key
    /// replays without touching its token).
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
