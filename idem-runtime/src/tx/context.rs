//! The guard's steps on an [`idem::Tx`](super::Tx): where a
//! `sqlx::Transaction` sends a statement of the guard's own, the `Tx`
//! sends the claim with its `BEGIN` and queues the answer for its
//! `COMMIT`; everything else is the plain step of
//! [`TxContext`](crate::dedup::context::TxContext).

use super::Tx;
use super::core::{Committed, INLINE_ANSWER_MAX};
use crate::dedup::context::{self, Claimed, EntityMove, MAX_ATTEMPTS, TxContext, new_record, require_transaction};
use crate::error::Error;
use crate::guard::Prepared;
use crate::machine::Cas;
use crate::store::sql::texts::{Texts, texts};
use crate::store::sql::{ExistingRecord, InsertDone, NewRecord, SqlBackend, classify, record};

/// Deadlock victims among claims a `Tx` sends again (see [`claim_with_begin`]).
const MAX_DEADLOCKS: u64 = 10;

impl<DB: SqlBackend> TxContext for Tx<DB>
where
    DB::Connection: Send,
{
    type Db = DB;

    /// The connection, under the rules of `&mut **tx` (guards use their
    /// own access).
    fn connection(&mut self) -> &mut DB::Connection {
        self.check_deref();
        &mut self.conn
    }

    fn guard_connection(&mut self) -> &mut DB::Connection {
        &mut self.conn
    }

    /// Nothing has begun and the claim comes next: it rides on `BEGIN`.
    /// Otherwise begin now (and send what is queued for `COMMIT` first, so
    /// that this guard sees the answers of the ones before it).
    async fn ready_for_guard(&mut self, p: &Prepared, claim_next: bool) -> Result<(), Error> {
        self.core.claim_first = false;
        if claim_next && texts::<DB>().is_some() && self.core.is_deferred() {
            return Ok(());
        }
        let claim_first = claim_next && self.core.is_deferred();
        self.core.ready::<DB>(&mut self.conn).await?;
        self.core.claim_first = claim_first;
        require_transaction::<DB>(&self.conn, p)
    }

    async fn claim_record(&mut self, p: &Prepared, cas: Option<&Cas<'_>>) -> Result<Claimed, Error> {
        match texts::<DB>().filter(|_| self.core.is_deferred()) {
            Some(texts) => claim_with_begin(self, texts, p, cas).await,
            None => {
                // Bound statements (MySQL, SQLite, or a `Tx` already open):
                // if this future is dropped mid-statement, the server's state
                // is unknown, and the `Tx` closes its connection.
                let first = std::mem::take(&mut self.core.claim_first);
                let mut deadlocks = 0;
                loop {
                    let open = self.core.in_flight::<DB>();
                    let claimed = context::claim::<DB>(&mut self.conn, p, cas).await;
                    self.core.landed(open, &claimed);
                    match claimed {
                        // The claim was the first statement after the `Tx`'s
                        // own `BEGIN`, and InnoDB rolled that transaction back
                        // whole (claims waiting on a first call that rolls
                        // back): nothing of the caller's went with it. Begin
                        // again and claim again, as a claim with `BEGIN` does.
                        Err(e) if first && e.is_deadlock() && deadlocks < MAX_DEADLOCKS && self.core.is_open() => {
                            deadlocks += 1;
                            self.core.restart::<DB>(&mut self.conn).await.map_err(classify::<DB>)?;
                            tokio::time::sleep(std::time::Duration::from_millis(2 * deadlocks)).await;
                        }
                        Err(e) => {
                            self.core.roll_back_only();
                            return Err(e);
                        }
                        claimed => return claimed,
                    }
                }
            }
        }
    }

    /// An answer of a claim that rode on `BEGIN` goes out with `COMMIT`,
    /// in a text that fails before its `COMMIT` if the record is gone.
    async fn store_answer(&mut self, p: &Prepared, json: Option<String>) -> Result<(), Error> {
        match (texts::<DB>().filter(|_| self.core.is_open()), json) {
            (Some(texts), Some(json)) if json.len() <= INLINE_ANSWER_MAX => {
                self.core.queue(&(texts.complete)(texts, &p.stored_scope, p.key.as_str(), &json), &p.scope);
                Ok(())
            }
            (_, json) => {
                let open = self.core.in_flight::<DB>();
                let stored = context::store_answer::<DB>(&mut self.conn, p, json).await;
                // An answer not stored: the transaction can only roll back
                // (as when a queued answer's text fails).
                self.core.wrote(open, &stored);
                stored
            }
        }
    }

    /// `claim = "after"` on a `Tx`: a bound statement after the body. If it
    /// fails (not on the key: a lock wait timed out, say), the body's
    /// writes must not commit without their record, or a retry would run
    /// the body again: the `Tx` refuses to commit, it can only roll back.
    async fn insert_done(&mut self, p: &Prepared, json: Option<&str>) -> Result<InsertDone, Error> {
        let open = self.core.in_flight::<DB>();
        let inserted = context::insert_done::<DB>(&mut self.conn, p, json).await;
        self.core.wrote(open, &inserted);
        inserted
    }

    /// `claim = "commit"`: the record with its answer goes out in the text
    /// of `COMMIT` (an answer too large to ride as text, or SQLite: bound,
    /// then `COMMIT`). A repeat finds the transaction rolled back and
    /// replays the record it read in the same round trip.
    async fn commit_with_record(&mut self, p: &Prepared, json: Option<&str>) -> Result<Option<Claimed>, Error> {
        if self.core.bodies > 0 {
            // Inside another guard's body on this `Tx`: the call is not the
            // whole transaction, and committing would leave that body's
            // next statements outside any. Written as `claim = "after"`.
            return Ok(None);
        }
        let record = new_record(p);
        let inline = json.is_none_or(|json| json.len() <= INLINE_ANSWER_MAX);
        let (texts, done) = match texts::<DB>().filter(|_| inline) {
            Some(texts) => {
                (Some(texts), self.core.commit_with_record::<DB>(&mut self.conn, texts, &record, json).await?)
            }
            None => (None, self.core.commit_with_bound_record::<DB>(&mut self.conn, &record, json).await?),
        };
        let (found, deadlock) = match done {
            Committed::Kept => return Ok(Some(Claimed::Fresh { moved: 0 })),
            Committed::Refused { found, deadlock } => (found, deadlock),
        };
        match found {
            Some(existing) if !existing.expired => return Ok(Some(Claimed::Existing(existing))),
            // Past its retention, not yet purged: the body's writes went with
            // the rollback, so this call cannot take it over (a bound insert
            // does, in place). Remove it, only if still expired: the retry
            // runs the body and writes its own.
            Some(_) => {
                if let Some(texts) = texts {
                    self.core.discard_expired::<DB>(&mut self.conn, texts, &record).await?;
                }
            }
            // A deadlock's victim with no record committed yet: the
            // deadlock, which is retryable. Refused on the key: the record
            // is gone since (its retention over, and purged).
            None => {
                if let Some(deadlock) = deadlock {
                    self.core.refuse_commit();
                    return Err(deadlock);
                }
            }
        }
        self.core.refuse_commit();
        Err(p.in_progress(Some(std::time::Duration::ZERO)))
    }

    /// Begin again with the `Tx`'s own statement (its isolation level); the
    /// answers queued for `COMMIT` go with the rollback.
    async fn restart(&mut self) -> Result<(), Error> {
        self.core.restart::<DB>(&mut self.conn).await.map_err(classify::<DB>)
    }

    fn body_started(&mut self) {
        self.core.body_started();
    }

    fn body_ended(&mut self) {
        self.core.body_ended();
    }
}

/// The claim of a `Tx` that has not begun: `BEGIN` and the claim in one
/// text. A repeat's claim fails on the unique key, which stops the text;
/// the failed block is rolled back and the record read in one more round
/// trip, and the `Tx` has still not begun. The transition of
/// `dedup+state` follows the claim as a statement of its own.
async fn claim_with_begin<DB: SqlBackend>(
    tx: &mut Tx<DB>,
    texts: &Texts,
    p: &Prepared,
    cas: Option<&Cas<'_>>,
) -> Result<Claimed, Error> {
    let record = new_record(p);
    let (mut take_over, mut deadlocks) = (false, 0);
    for _ in 0..MAX_ATTEMPTS {
        match claim_once(tx, texts, &record, take_over, &mut deadlocks).await? {
            None => return transition_after_claim(tx, &record, cas).await,
            // The holder rolled back, or the record was purged: claim again.
            Some(None) => take_over = false,
            // Past retention but not yet purged: delete it (only if still
            // expired) in the text of the next claim.
            Some(Some(existing)) if existing.expired => take_over = true,
            Some(Some(existing)) => return Ok(Claimed::Existing(existing)),
        }
    }
    Err(p.in_progress(None))
}

/// One claim with `BEGIN` (see `TxCore::claim_with_begin`), sent again
/// while InnoDB picks it as a deadlock victim: claims waiting on a record
/// whose first call rolls back are (1213). The claim was the first
/// statement of the `Tx`'s own `BEGIN`: nothing of the caller's went with
/// the rollback. `deadlocks` counts them over the whole claim.
async fn claim_once<DB: SqlBackend>(
    tx: &mut Tx<DB>,
    texts: &Texts,
    record: &NewRecord<'_>,
    take_over: bool,
    deadlocks: &mut u64,
) -> Result<Option<Option<ExistingRecord>>, Error> {
    loop {
        match tx.core.claim_with_begin::<DB>(&mut tx.conn, texts, record, take_over).await {
            Err(e) if e.is_deadlock() && tx.core.is_deferred() && *deadlocks < MAX_DEADLOCKS => {
                *deadlocks += 1;
                tokio::time::sleep(std::time::Duration::from_millis(2 * *deadlocks)).await;
            }
            claimed => return claimed,
        }
    }
}

/// `dedup+state`: the transition after a claim that rode on `BEGIN`.
async fn transition_after_claim<DB: SqlBackend>(
    tx: &mut Tx<DB>,
    new: &NewRecord<'_>,
    cas: Option<&Cas<'_>>,
) -> Result<Claimed, Error> {
    let Some(cas) = cas else { return Ok(Claimed::Fresh { moved: 0 }) };
    match EntityMove::<DB>::make(cas, &mut tx.conn).await {
        Ok(moved) => Ok(Claimed::Fresh { moved }),
        Err(e) => {
            // Leave no PROCESSING record to a caller that commits anyway.
            let _ = record::discard::<DB>(&mut tx.conn, new.scope, new.key).await;
            Err(e)
        }
    }
}
