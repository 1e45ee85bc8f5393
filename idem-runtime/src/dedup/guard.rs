//! `strategy = "dedup"`: a record written in the caller's transaction.
//!
//! claim (INSERT, never failing the transaction) -> body -> response stored in
//! the same transaction. The record commits or rolls back with the business
//! change; a concurrent duplicate waits on the record's row lock and then
//! replays (or claims, if the first call rolled back).

use crate::dedup::context::{Claimed, TxContext};
use crate::dedup::record::{judge, prechecked};
use crate::dedup::ticket::Ticket;
use crate::error::Error;
use crate::guard::Claim;
use crate::guard::Guard;
use crate::replay::Replayable;

impl Guard<'_> {
    /// `dedup`: claim the key with a record written in the caller's
    /// transaction, so the record commits or rolls back with the business
    /// change.
    ///
    /// - [`Claim::Run`]: this is the first call (or the first one rolled
    ///   back): run the body in `tx`, then hand its result to
    ///   [`Ticket::complete`], which stores the `Ok` answer in the record
    ///   (or removes the record for an `Err`, even if you commit anyway).
    /// - [`Claim::Replay`]: a completed call holds the key; its answer.
    ///   A concurrent repeat waits on the first call's row lock, then
    ///   replays it (or claims, if the first rolled back).
    ///
    /// Errors: [`Error::KeyMismatch`] (another fingerprint),
    /// [`Error::Unfinished`] (a record committed without its answer),
    /// [`Error::NoTransaction`] (`tx` is no transaction), database errors
    /// (never taken for a duplicate). With [`Guard::precheck`], a key seen
    /// before whose record is complete replays from a plain read.
    #[tracing::instrument(level = "debug", target = "idem", name = "idem.claim", skip_all, fields(scope = %self.scope(), strategy = "dedup"))]
    pub async fn dedup<T: Replayable, C: TxContext + ?Sized>(
        self,
        tx: &mut C,
    ) -> Result<Claim<T, Ticket<C::Db>>, Error> {
        let precheck = self.precheck_store();
        let p = self.prepare("dedup", <C::Db as crate::store::sql::SqlBackend>::BACKEND)?;
        // `claim_after` writes its record after the body: an `idem::Tx`
        // begins now. A claim before the body rides on its BEGIN.
        tx.ready_for_guard(&p, !p.claim_after).await?;
        if let Some(replay) = prechecked::<T, C::Db>(tx.guard_connection(), &p, precheck).await? {
            return Ok(Claim::Replay(replay));
        }
        if p.claim_after {
            // Nothing to do before the body: the record is written with its
            // response in `Ticket::complete`.
            return Ok(Claim::Run(Ticket::new(p, true, None).running_on(tx)));
        }
        match tx.claim_record(&p, None).await? {
            Claimed::Fresh { .. } => Ok(Claim::Run(Ticket::new(p, true, None).running_on(tx))),
            Claimed::Existing(existing) => judge(&p, existing).map(Claim::Replay),
        }
    }
}
