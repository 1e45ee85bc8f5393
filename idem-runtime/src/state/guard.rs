//! `strategy = "state"` and `"dedup+state"`: move an entity's status with a
//! compare-and-set in the caller's transaction.
//!
//! `UPDATE <table> SET <status> = to WHERE <key> = ? AND <status> IN (from...)`:
//! one row changed means this call made the transition and the body runs (the
//! body is where side effects live: they hang off the transition). No row
//! changed: the status is read; already the target is a repeat (a silent
//! success), no row is `NotFound`, anything else is `IllegalTransition`.
//!
//! `dedup+state` adds the dedup record in the same transaction: the record
//! replays the first answer, the transition stops a repeat whose record is
//! gone. Either line of defence alone keeps the call idempotent.

use crate::dedup::context::{Claimed, TxContext};
use crate::dedup::record::{discard, judge, prechecked};
use crate::dedup::ticket::Moved;
use crate::dedup::ticket::Ticket;
use crate::error::Error;
use crate::guard::Claim;
use crate::guard::Guard;
use crate::machine::Cas;
use crate::replay::Replayable;
use crate::state::transition::{Step, check_key, move_entity, silent_repeat};
use crate::state::{SilentRepeat, Transition};

impl Guard<'_> {
    /// `state`: move the entity the key selects along `transition`, with a
    /// compare-and-set in the caller's transaction
    /// (`UPDATE <table> SET <status> = <to> WHERE <key> = ? AND <status> IN (<from>...)`).
    /// The key's parts must be added with [`Guard::entity_key`], one per
    /// key column of the state enum.
    ///
    /// - [`Claim::Run`]: this call moved the entity: run the body (its side
    ///   effects hang off the transition), then [`Ticket::complete`], which
    ///   puts the status back if the body fails.
    /// - [`Claim::Replay`]: the entity is already in the target state (a
    ///   repeat): `T::silent_repeat()`, nothing stored to replay.
    ///
    /// Errors: [`Error::IllegalTransition`] (the entity is in another state:
    /// also an `ERROR` event), [`Error::NotFound`] (no such entity).
    #[tracing::instrument(level = "debug", target = "idem", name = "idem.claim", skip_all, fields(scope = %self.scope(), strategy = "state"))]
    pub async fn state<T: SilentRepeat, C: TxContext + ?Sized>(
        self,
        tx: &mut C,
        transition: &'static Transition,
    ) -> Result<Claim<T, Ticket<C::Db>>, Error> {
        let p = self.prepare_claim_before("state", <C::Db as crate::store::sql::SqlBackend>::BACKEND)?;
        check_key(transition, &p)?;
        tx.ready_for_guard(&p, false).await?;
        match move_entity::<C::Db>(tx.guard_connection(), &p, transition, None).await? {
            Step::Moved(from) => Ok(Claim::Run(Ticket::new(p, false, Some(Moved { transition, from })).running_on(tx))),
            Step::Repeat => Ok(Claim::Replay(silent_repeat(&p))),
        }
    }

    /// `dedup+state`: claim a dedup record and make the transition, both in
    /// the caller's transaction (one statement on PostgreSQL when the
    /// transition has one source state). A repeat replays the first answer
    /// from the record, even after the entity moved on; with the record
    /// gone (past its retention) and the entity at the target, it is a
    /// silent repeat. [`Guard::precheck`] applies before both.
    #[tracing::instrument(level = "debug", target = "idem", name = "idem.claim", skip_all, fields(scope = %self.scope(), strategy = "dedup+state"))]
    pub async fn dedup_state<T: Replayable + SilentRepeat, C: TxContext + ?Sized>(
        self,
        tx: &mut C,
        transition: &'static Transition,
    ) -> Result<Claim<T, Ticket<C::Db>>, Error> {
        let precheck = self.precheck_store();
        let p = self.prepare_claim_before("dedup+state", <C::Db as crate::store::sql::SqlBackend>::BACKEND)?;
        check_key(transition, &p)?;
        tx.ready_for_guard(&p, true).await?;
        if let Some(replay) = prechecked::<T, C::Db>(tx.guard_connection(), &p, precheck).await? {
            return Ok(Claim::Replay(replay));
        }
        let states = transition.states;
        let single = (transition.from.len() == 1).then(|| states.codes[transition.source_indexes().next().unwrap()]);
        let from = single.map(|c| [c]);
        let cas =
            from.as_ref().map(|from| Cas { states, from, to: states.codes[transition.to_index()], key: &p.entity });
        // One source: claim and transition together. Several: claim first,
        // then read the status under a row lock to learn which source it is in.
        let tried = match tx.claim_record(&p, cas.as_ref()).await? {
            Claimed::Existing(existing) => return judge(&p, existing).map(Claim::Replay),
            Claimed::Fresh { moved } => cas.as_ref().map(|_| moved),
        };
        match move_entity::<C::Db>(tx.guard_connection(), &p, transition, tried).await {
            Ok(Step::Moved(from)) => {
                Ok(Claim::Run(Ticket::new(p, true, Some(Moved { transition, from })).running_on(tx)))
            }
            // The record just claimed belongs to no first answer: remove it.
            Ok(Step::Repeat) => {
                discard::<C::Db>(tx.guard_connection(), &p).await;
                Ok(Claim::Replay(silent_repeat(&p)))
            }
            Err(e) => {
                discard::<C::Db>(tx.guard_connection(), &p).await;
                Err(e)
            }
        }
    }
}
