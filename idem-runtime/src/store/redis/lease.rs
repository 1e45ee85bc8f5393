//! Lease records in Redis: every step is one Lua script call (one round
//! trip), so claim, take-over, completion and release are each atomic on the
//! server, with the lease on Redis's clock (`TIME`).
//!
//! A record is one string at `<prefix>{<key>}lease:<scope>`: the business
//! key is the hash tag, so on Redis Cluster every record of one business key lives
//! in one slot. It holds the status, fingerprint, fence, owner and lease
//! length (or, once done, the response); the lease and the retention are the
//! key's TTL.
//!
//! Under concurrency the store batches: while two script calls are in
//! flight, further operations queue and go out together as one call of the
//! same script, each still atomic on its own key (see [`RedisStore`]).
//!
//! Redis is not a database of record: a restart without persistence or a
//! failover can lose records. A completion that finds its record gone is
//! refused ([`Error::LeaseLost`]), never written blindly; for work that must
//! never run twice, keep the record in SQL (or put `precheck = "redis"` in
//! front of a SQL store).

use std::borrow::Cow;
use std::sync::atomic::Ordering;
use std::sync::{Arc, LazyLock};

use super::{Lua, RedisStore, Shared, store_error, store_message, unexpected};
use crate::error::Error;
use crate::lease::store::{HeldLease, LeaseClaim, LeaseRequest, LeaseStore};
use crate::lease::store::{NewStep, Resolve, StepLog, StepOutcome};
use crate::store::keyspace::Keyspace;
use crate::store::{BoxFuture, RecordKind, millis};

// A record is one string:
// `P<fence>.<TTL ms>:<owner>|<lease ms>:<retention ms>:<fp 64>` while held,
// and `D<fp 64><fence>:<retention ms>:<owner>|<response JSON>` once done
// (owner ids hold no `|`); `<fp 64>` is the hex fingerprint (SHA-256), or 64
// dots without one. A held record is written with the TTL `lease +
// retention`, so the lease left is the key's TTL less the retention, on
// Redis's clock; an extension only resets the TTL. A held record therefore
// stays the string its claim wrote, which its holder can rebuild. A
// completion keeps the key's TTL: a done record lives for the retention
// plus what was left of the lease. A new record's fence is Redis's clock in
// microseconds (`TIME`), so a key's fences keep increasing after its record
// was removed or expired; a take-over adds one.
//
// One script runs every operation, on one key or on a batch of keys:
// `KEYS[i]` is item i's record and its arguments follow those of the items
// before it in `ARGV`, the first telling the operation apart:
// - claim: the record but for its head (`.<TTL>:<owner>|<lease>:<retention>:<fp
//   64>`, which the script prefixes with `P<fence>`);
// - complete: the done record whole (`D...`), the holder's record;
// - release: `r`, the holder's record;
// - extend: `e`, the holder's record, its TTL.
// It returns one flat reply per item (a nested table costs Redis more to
// turn into a reply than the item's own GET): a claim replies the fence of
// a new record (digits), `A<fence>` (its own record again),
// `R<fence>` (taken over), `B<ms left>` (held), `M` (another fingerprint)
// or the whole done record (`D...`: the client checks its fingerprint and
// cuts the response out); the others reply 1 or 0. An item whose commands
// failed (a key of the wrong type, say) replies `X<message>` and the others
// go on.
//
// What a call costs Redis is mostly per argument and per command, so the hot
// paths keep both to the least: a replay is one GET, a new claim a GET and a
// SET (and one TIME per call), a completion one `SET ... XX GET` and a
// comparison of the record it replaced with the holder's (interned strings:
// a pointer comparison). Where they differ the rare path decides: the
// record is the holder's if it has the same fence and owner (a holder built
// by hand, or a claim repeated by its owner, with another lease, retention
// or fingerprint); else it was taken over, released or completed.

static OPS: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("lease.lua")));

/// A record's fingerprint field when the call has none (`.` x 64).
const NO_FINGERPRINT: &str = "................................................................";

/// Script calls in flight at once before further operations queue and go
/// out together as one batch (1 measured slower under load; 4 and 8 no
/// faster than 2).
const IN_FLIGHT: usize = 2;

/// Most operations in one batch: a script call holds the server for its
/// whole length (about 3 us per operation here), so a long queue goes out
/// in several calls.
const MAX_BATCH: usize = 128;

/// One operation on one record, as the script takes it: the record's key
/// and up to three arguments (the first telling the operation apart), packed
/// in one buffer (one allocation per operation).
pub(super) struct Op {
    buf: String,
    /// End of the key, then of each argument, in `buf`.
    ends: [usize; 4],
    parts: usize,
}

impl Op {
    /// An operation on the lease record of `scope` and `key`.
    fn new(names: &Keyspace, scope: &str, key: &str) -> Op {
        let mut buf = String::with_capacity(key.len() + scope.len() + 220);
        names.write(&mut buf, RecordKind::Lease, scope, key);
        Op { ends: [buf.len(), 0, 0, 0], buf, parts: 1 }
    }

    fn arg(mut self, value: impl std::fmt::Display) -> Op {
        use std::fmt::Write as _;
        let _ = write!(self.buf, "{value}");
        self.ends[self.parts] = self.buf.len();
        self.parts += 1;
        self
    }

    fn part(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        let end = if i < self.parts { self.ends[i] } else { start };
        &self.buf[start..end]
    }
}

pub(super) type Waiter = tokio::sync::oneshot::Sender<Result<redis::Value, Error>>;

/// An operation's turn: sent at once, or queued for the next batch.
enum Turn {
    Now(Op),
    Queued(tokio::sync::oneshot::Receiver<Result<redis::Value, Error>>),
}

/// Operations waiting for a batch, shared by the clones of one store.
#[derive(Default)]
pub(super) struct Batcher {
    /// Script calls in flight (single operations and batch flushes).
    pub(super) in_flight: usize,
    pub(super) queue: Vec<(Op, Waiter)>,
}

impl Batcher {
    /// The next batch: the oldest [`MAX_BATCH`] queued operations.
    pub(super) fn next(&mut self) -> Vec<(Op, Waiter)> {
        if self.queue.len() <= MAX_BATCH {
            std::mem::take(&mut self.queue)
        } else {
            self.queue.drain(..MAX_BATCH).collect()
        }
    }
}

impl<C> RedisStore<C>
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Run one operation: at once while fewer than [`IN_FLIGHT`] calls are
    /// out, else in the next batch.
    async fn run(&self, op: Op) -> Result<redis::Value, Error> {
        self.bounded(self.run_unbounded(op)).await
    }

    async fn run_unbounded(&self, op: Op) -> Result<redis::Value, Error> {
        if !self.shared.batching.load(Ordering::Relaxed) {
            self.shared.count(1);
            return single(&mut self.conn.clone(), &op).await;
        }
        let turn = {
            let mut b = self.shared.lock();
            if b.in_flight < IN_FLIGHT {
                b.in_flight += 1;
                Turn::Now(op)
            } else {
                let (tx, rx) = tokio::sync::oneshot::channel();
                b.queue.push((op, tx));
                Turn::Queued(rx)
            }
        };
        match turn {
            Turn::Queued(rx) => {
                rx.await.unwrap_or_else(|_| Err(store_message("the batch carrying this operation was dropped")))
            }
            // Whatever queues meanwhile goes out when this call is done, even
            // if this future is dropped mid-call.
            Turn::Now(op) => {
                let _slot = Slot { conn: &self.conn, shared: &self.shared };
                self.shared.count(1);
                single(&mut self.conn.clone(), &op).await
            }
        }
    }

    /// `op` (with the holder's record as its second argument, then `ttl` if
    /// any) on the record of `held`: 1 if it was the holder's.
    async fn held(&self, op: char, held: &HeldLease<'_>, ttl: Option<i64>) -> Result<bool, Error> {
        let mut op = Op::new(&self.names, held.scope, held.key).arg(op).arg(Holder(held));
        if let Some(ttl) = ttl {
            op = op.arg(ttl);
        }
        self.finished(op).await
    }

    /// A completion's, release's or extension's reply: 1 if the record was
    /// the holder's.
    async fn finished(&self, op: Op) -> Result<bool, Error> {
        match self.run(op).await? {
            redis::Value::Int(n) => Ok(n == 1),
            other => Err(unexpected(&other)),
        }
    }
}

/// A call slot held by a single operation. Given back when the operation
/// is done (or its future dropped); if operations queued meanwhile, the slot
/// passes to a task that sends them as one batch.
struct Slot<'a, C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static> {
    conn: &'a C,
    shared: &'a Arc<Shared>,
}

impl<C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static> Drop for Slot<'_, C> {
    fn drop(&mut self) {
        let batch = {
            let mut b = self.shared.lock();
            if b.queue.is_empty() {
                b.in_flight -= 1;
                return;
            }
            b.next()
        };
        // The slot passes to the flush task; if that task never runs or is
        // dropped (its runtime shut down), the guard gives it back.
        let slot = FlushSlot { shared: self.shared.clone(), armed: true };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(flush(self.conn.clone(), slot, batch));
            }
            Err(_) => {
                for (_, tx) in batch {
                    let _ = tx.send(Err(store_message("no Tokio runtime left to send a batch on")));
                }
                drop(slot);
            }
        }
    }
}

/// A flush task's call slot. Given back if the task is dropped (its
/// runtime shut down) before or while it runs: then the operations still
/// queued are answered with an error rather than left waiting for a task
/// that will not come.
struct FlushSlot {
    shared: Arc<Shared>,
    armed: bool,
}

impl Drop for FlushSlot {
    fn drop(&mut self) {
        if self.armed {
            let stranded = {
                let mut b = self.shared.lock();
                b.in_flight -= 1;
                std::mem::take(&mut b.queue)
            };
            for (_, tx) in stranded {
                let _ = tx.send(Err(store_message("the task sending lease operations to Redis was stopped")));
            }
        }
    }
}

/// Send `batch`, then whatever queued meanwhile, until the queue is empty.
async fn flush<C>(mut conn: C, mut slot: FlushSlot, mut batch: Vec<(Op, Waiter)>)
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    let shared = slot.shared.clone();
    loop {
        send_batch(&mut conn, &shared, batch).await;
        let mut b = shared.lock();
        if b.queue.is_empty() {
            // Checked and given back under one lock: an operation that
            // queued found this slot taken and is sent by this loop.
            b.in_flight -= 1;
            slot.armed = false;
            return;
        }
        batch = b.next();
    }
}

/// One script call for every operation of `batch`, each waiter answered
/// with its own item's reply.
async fn send_batch<C>(conn: &mut C, shared: &Shared, batch: Vec<(Op, Waiter)>)
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    // A caller that stopped waiting (its future dropped) has its operation
    // left out: a claim nobody runs would hold the key for a whole lease.
    let batch: Vec<(Op, Waiter)> = batch.into_iter().filter(|(_, tx)| !tx.is_closed()).collect();
    if batch.is_empty() {
        return;
    }
    shared.count(batch.len());
    match eval(conn, batch.iter().map(|(op, _)| op), batch.len()).await.map(|reply| items(reply, batch.len())) {
        Ok(Ok(items)) => {
            for ((_, tx), item) in batch.into_iter().zip(items) {
                let _ = tx.send(item_reply(item));
            }
        }
        Err(e) if e.code() == Some("CROSSSLOT") => {
            tracing::warn!(target: "idem", "redis refused a batch across hash slots (a cluster behind this \
                connection?): lease operations now go one per call");
            shared.batching.store(false, Ordering::Relaxed);
            for (op, tx) in batch {
                shared.count(1);
                let _ = tx.send(single(conn, &op).await);
            }
        }
        Err(e) => {
            for (_, tx) in batch {
                let _ = tx.send(Err(store_error(e.clone())));
            }
        }
        Ok(Err(other)) => {
            for (_, tx) in batch {
                let _ = tx.send(Err(unexpected(&other)));
            }
        }
    }
}

/// One operation in a call of its own.
async fn single<C: redis::aio::ConnectionLike + Send>(conn: &mut C, op: &Op) -> Result<redis::Value, Error> {
    let reply = eval(conn, std::iter::once(op), 1).await.map_err(store_error)?;
    let mut items = items(reply, 1).map_err(|other| unexpected(&other))?;
    item_reply(items.pop().expect("one item"))
}

/// The script's reply to a call of `n` operations, one per operation: a
/// lone operation's comes back bare, a batch's as an array (or, if neither,
/// the reply itself as the error).
fn items(reply: redis::Value, n: usize) -> Result<Vec<redis::Value>, redis::Value> {
    match reply {
        item if n == 1 => Ok(vec![item]),
        redis::Value::Array(items) if items.len() == n => Ok(items),
        other => Err(other),
    }
}

/// `EVALSHA` of the script over `ops` (`EVAL` of its source on a node
/// that does not have it); a dropped connection is tried once more (every
/// operation is safe to repeat: a claim finds its own record, though a
/// repeated take-over then reports a plain claim, not `reclaimed`; the
/// others are conditional on owner and fence).
async fn eval<'o, C: redis::aio::ConnectionLike + Send>(
    conn: &mut C,
    ops: impl Iterator<Item = &'o Op> + Clone,
    n: usize,
) -> redis::RedisResult<redis::Value> {
    OPS.eval_retrying(conn, |cmd| {
        cmd.arg(n);
        for op in ops.clone() {
            cmd.arg(op.part(0));
        }
        for op in ops.clone() {
            for i in 1..op.parts {
                cmd.arg(op.part(i));
            }
        }
    })
    .await
}

/// An item's reply, or the error the script caught for it.
fn item_reply(item: redis::Value) -> Result<redis::Value, Error> {
    if let redis::Value::BulkString(b) = &item
        && b.first() == Some(&b'X')
    {
        let message = String::from_utf8_lossy(&b[1..]);
        return Err(store_message(&format!("a lease operation failed on the server: {message}")));
    }
    Ok(item)
}

/// A held record's lease and retention in milliseconds, and its TTL (their
/// sum): the lease left is the key's TTL less the retention.
fn held_times(lease: std::time::Duration, retention: std::time::Duration) -> (i64, i64, i64) {
    let (lease, retention) = (millis(lease), millis(retention));
    (lease, retention, lease.saturating_add(retention))
}

/// A held record but for its head (`P<fence>`): what a claim sends, and
/// what the holder's record ends with (see the script).
struct HeldTail<'a> {
    owner: &'a str,
    lease: std::time::Duration,
    retention: std::time::Duration,
    /// 64 characters (see [`fingerprint64`]).
    fingerprint: &'a str,
}

impl std::fmt::Display for HeldTail<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (lease, retention, ttl) = held_times(self.lease, self.retention);
        write!(f, ".{ttl}:{}|{lease}:{retention}:{}", self.owner, self.fingerprint)
    }
}

/// The record of `held`'s holder, as its claim wrote it.
struct Holder<'a>(&'a HeldLease<'a>);

impl std::fmt::Display for Holder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let held = self.0;
        let fingerprint = held.fingerprint.map_or(Cow::Borrowed(NO_FINGERPRINT), fingerprint64);
        let tail =
            HeldTail { owner: held.owner, lease: held.lease, retention: held.retention, fingerprint: &fingerprint };
        write!(f, "P{}{tail}", held.fence)
    }
}

/// A fingerprint as records hold it: 64 characters. The runtime's are
/// SHA-256 in hex already; any other text (a store driven by hand) is
/// hashed, the same way on claim and completion.
fn fingerprint64(fp: &str) -> Cow<'_, str> {
    if fp.len() == 64 {
        Cow::Borrowed(fp)
    } else {
        use sha2::Digest as _;
        Cow::Owned(crate::key::hex(&sha2::Sha256::digest(fp.as_bytes())))
    }
}

/// A claim's reply (see the script): a new record's fence, or one letter
/// and its value, or the done record itself, whose fingerprint is checked
/// here against the claim's `fingerprint` (64 characters, or none).
fn claim_reply(reply: redis::Value, fingerprint: Option<&str>) -> Result<LeaseClaim, Error> {
    let b = match reply {
        redis::Value::BulkString(b) if !b.is_empty() => b,
        other => return Err(unexpected(&other)),
    };
    if b[0].is_ascii_digit() {
        // A new record's fence.
        return match std::str::from_utf8(&b).ok().and_then(|t| t.parse::<i64>().ok()) {
            Some(fence) => Ok(LeaseClaim::Acquired { fence, reclaimed: false }),
            None => Err(unexpected(&redis::Value::BulkString(b))),
        };
    }
    let number = |b: &[u8]| std::str::from_utf8(&b[1..]).ok().and_then(|t| t.parse::<i64>().ok());
    let claim = match b[0] {
        // `D<fp 64><fence>:<retention>:<owner>|<response>`: the response
        // follows the first `|` after the fingerprint.
        b'D' => match b.iter().skip(65).position(|&c| c == b'|') {
            Some(_) if fingerprint.is_some_and(|fp| b[1] != b'.' && fp.as_bytes() != &b[1..65]) => LeaseClaim::Mismatch,
            Some(at) => {
                let mut b = b;
                b.drain(..66 + at);
                let response = String::from_utf8(b).map_err(|_| store_message("a stored response is not UTF-8"))?;
                // No JSON is empty: an empty answer is one not kept.
                LeaseClaim::Done { response: Some(response).filter(|r| !r.is_empty()) }
            }
            None => return Err(unexpected(&redis::Value::BulkString(b))),
        },
        b'A' | b'R' => match number(&b) {
            Some(fence) => LeaseClaim::Acquired { fence, reclaimed: b[0] == b'R' },
            None => return Err(unexpected(&redis::Value::BulkString(b))),
        },
        b'B' => {
            LeaseClaim::Busy { retry_after: std::time::Duration::from_millis(number(&b).unwrap_or(0).max(0) as u64) }
        }
        b'M' if b.len() == 1 => LeaseClaim::Mismatch,
        _ => return Err(unexpected(&redis::Value::BulkString(b))),
    };
    Ok(claim)
}

impl<C> LeaseStore for RedisStore<C>
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    fn kind(&self) -> &'static str {
        "redis"
    }

    fn claim<'a>(&'a self, req: &'a LeaseRequest<'a>) -> BoxFuture<'a, Result<LeaseClaim, Error>> {
        Box::pin(async move {
            let fingerprint = req.fingerprint.map(fingerprint64);
            let fp = fingerprint.as_deref().unwrap_or(NO_FINGERPRINT);
            if req.owner.contains('|') {
                // The records separate the owner with `|`.
                return Err(store_message(&format!(
                    "owner id {:?} holds a `|`, which Redis records cannot",
                    req.owner
                )));
            }
            let tail = HeldTail { owner: req.owner, lease: req.lease, retention: req.retention, fingerprint: fp };
            let op = Op::new(&self.names, req.scope, req.key).arg(tail);
            claim_reply(self.run(op).await?, fingerprint.as_deref())
        })
    }

    fn complete<'a>(
        &'a self,
        held: &'a HeldLease<'a>,
        response: Option<&'a str>,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            // The done record whole, as the script swaps it in; an answer not
            // kept is an empty one.
            let fp = held.fingerprint.map_or(Cow::Borrowed(NO_FINGERPRINT), fingerprint64);
            let retention = millis(held.retention);
            let response = response.unwrap_or("");
            let op = Op::new(&self.names, held.scope, held.key)
                .arg(format_args!("D{fp}{}:{retention}:{}|{response}", held.fence, held.owner))
                .arg(Holder(held));
            let done = self.finished(op).await?;
            if done {
                self.announce(held.scope, held.key);
            }
            Ok(done)
        })
    }

    fn release<'a>(&'a self, held: &'a HeldLease<'a>) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let released = self.held('r', held, None).await?;
            if released {
                self.announce(held.scope, held.key);
            }
            Ok(released)
        })
    }

    fn steps<'a>(&'a self, scope: &'a str, key: &'a str) -> BoxFuture<'a, Result<StepLog, Error>> {
        Box::pin(self.read_steps(scope, key))
    }

    fn record_step<'a>(&'a self, held: &'a HeldLease<'a>, step: &'a NewStep<'a>) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.write_step(held, step))
    }

    fn mark_step<'a>(
        &'a self,
        held: &'a HeldLease<'a>,
        number: usize,
        name: &'a str,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.write_mark(held, number, name))
    }

    fn unmark_step<'a>(&'a self, held: &'a HeldLease<'a>, number: usize) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(self.drop_mark(held, number))
    }

    fn resolve_step<'a>(
        &'a self,
        scope: &'a str,
        key: &'a str,
        step: &'a str,
        outcome: StepOutcome<'a>,
    ) -> BoxFuture<'a, Result<Resolve, Error>> {
        Box::pin(self.bounded(self.resolve_marked(scope, key, step, outcome)))
    }

    fn forget_steps<'a>(&'a self, scope: &'a str, key: &'a str) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(self.drop_steps(scope, key))
    }

    fn notifies(&self) -> bool {
        self.sends_notices()
    }

    fn watch<'a>(&'a self, scope: &'a str, key: &'a str) -> crate::lease::store::Watch<'a> {
        self.notice(scope, key)
    }

    fn shared(&self) -> Option<std::sync::Arc<dyn LeaseStore>> {
        Some(std::sync::Arc::new(self.clone()))
    }

    fn answer_limit(&self) -> BoxFuture<'_, usize> {
        Box::pin(async move {
            if let Some(&limit) = self.shared.answer_limit.get() {
                return limit;
            }
            // A record is one bulk string: the answer and its head (at most
            // about 200 bytes). Where `CONFIG` is not allowed (managed
            // services rename it), Redis's default (512 MiB) stands, and the
            // next long answer asks again.
            let mut conn = self.conn.clone();
            let asked: Result<std::collections::HashMap<String, String>, _> = self
                .bounded(async {
                    redis::cmd("CONFIG")
                        .arg("GET")
                        .arg("proto-max-bulk-len")
                        .query_async(&mut conn)
                        .await
                        .map_err(super::store_error)
                })
                .await;
            let bulk = asked.ok().and_then(|m| m.get("proto-max-bulk-len").and_then(|v| v.parse::<usize>().ok()));
            match bulk {
                Some(bulk) => *self.shared.answer_limit.get_or_init(|| bulk.saturating_sub(1024)),
                None => (512 << 20) - 1024,
            }
        })
    }

    fn extend<'a>(&'a self, held: &'a HeldLease<'a>) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let (_, _, ttl) = held_times(held.lease, held.retention);
            self.held('e', held, Some(ttl)).await
        })
    }
}
