//! The outbox table (migration 0004, feature `outbox`): its statements,
//! written once over the dialect, and the steps that send them, for a
//! guarded body's handle (insert, or remove what an attempt whose body
//! failed wrote) and the relay (claim, mark sent, settle a failure,
//! release); the operator's are `outbox_admin`'s.
//!
//! A message is one row, `pending` until the relay marks it `sent` after
//! the broker's confirmation, or `dead` once it gave up. A relay claims a
//! row by lease (`claimed_by`, `claim_until`): it holds no lock while it
//! talks to the broker. The claim takes only a key's first pending message
//! (none of its key with a lower `seq` is pending), so no message overtakes
//! an earlier one of its key, however many relays claim at once. How each
//! database claims is its own ([`OutboxSql`]); what a claim may take is
//! written once here ([`candidates_sql`]).

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use super::dialect::{Arg, Dialect, Query, Stmt, read_required, read_text, text};
use super::{SqlBackend, classify, statements};
use crate::error::Error;
use crate::future::BoxFuture;
use crate::table::RecordTable;

/// A message's id: `idem-msg-` and 32 hex digits, a hash of the call that
/// published it (scope and key as stored, or the step's key) and the
/// message's ordinal in it (0, 1, 2, ... in the order the body published).
/// The same for every attempt of the call, so a consumer that keys its own
/// dedup record on it takes a message re-sent by the relay once.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageId(pub(crate) String);

impl MessageId {
    /// The id of the `ordinal`-th message of the call of `scope` and `key`,
    /// both as stored ([`stored_scope`](crate::key::stored_scope),
    /// [`Key::as_str`](crate::Key::as_str)): what the handle gives inside
    /// the call, for a check from outside it.
    pub fn for_call(scope: &str, key: &str, ordinal: u32) -> MessageId {
        MessageId(format!("idem-msg-{}", crate::key::parts_hash(&[scope, key, &ordinal.to_string()])))
    }

    /// The id of the `ordinal`-th message published in the step whose key
    /// is `step` ([`StepKey::as_str`](crate::lease::StepKey::as_str)).
    pub fn for_step(step: &str, ordinal: u32) -> MessageId {
        MessageId(format!("idem-msg-{}", crate::key::parts_hash(&[step, &ordinal.to_string()])))
    }

    /// As a consumer is given it (AMQP `message_id`, NATS `Nats-Msg-Id`).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A consumer keys its dedup record on the id: `Guard::new(..).key(&message.id)`.
impl crate::key::IdempotencyKey for MessageId {
    fn write_key(&self, out: &mut String) -> Result<(), &'static str> {
        out.push_str(&self.0);
        Ok(())
    }
}

impl std::fmt::Display for MessageId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The prefix of every message id.
const ID_PREFIX: &str = "idem-msg-";
/// The hex digits after it.
const ID_DIGITS: usize = 32;

/// An id as a consumer or the `idem` command shows it: `idem-msg-` and 32
/// hex digits (upper case taken as lower). Anything else is refused with
/// what is wrong with it, since no message could have that id.
///
/// ```
/// # use idem_runtime::outbox::MessageId;
/// let id: MessageId = "idem-msg-0123456789abcdef0123456789ABCDEF".parse().unwrap();
/// assert_eq!(id.as_str(), "idem-msg-0123456789abcdef0123456789abcdef");
/// let e = "idem-msg-12".parse::<MessageId>().unwrap_err();
/// assert!(e.to_string().contains("has 2 hex digits after `idem-msg-`, not 32"), "{e}");
/// ```
impl std::str::FromStr for MessageId {
    type Err = ParseMessageIdError;

    fn from_str(text: &str) -> Result<MessageId, ParseMessageIdError> {
        let refuse = |reason: String| ParseMessageIdError { text: text.to_owned(), reason };
        let Some(digits) = text.strip_prefix(ID_PREFIX) else {
            return Err(refuse(format!("an outbox message id starts with `{ID_PREFIX}`")));
        };
        if let Some((at, c)) = digits.char_indices().find(|(_, c)| !c.is_ascii_hexdigit()) {
            return Err(refuse(format!(
                "{c:?} at byte {} is not a hex digit (an id is `{ID_PREFIX}` and {ID_DIGITS} hex digits)",
                ID_PREFIX.len() + at
            )));
        }
        if digits.len() != ID_DIGITS {
            return Err(refuse(format!("it has {} hex digits after `{ID_PREFIX}`, not {ID_DIGITS}", digits.len())));
        }
        Ok(MessageId(format!("{ID_PREFIX}{}", digits.to_ascii_lowercase())))
    }
}

/// Why a text is no [`MessageId`]: its [`FromStr`](std::str::FromStr).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not an outbox message id: {reason}")]
pub struct ParseMessageIdError {
    text: String,
    reason: String,
}

/// A message as the relay hands it to a [`Publisher`](crate::outbox::Publisher):
/// everything the body published, and where it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Message {
    /// Its row in the outbox: the order of its key's messages.
    pub seq: i64,
    /// Its id, the consumer's dedup key: send it as the broker's message id.
    pub id: MessageId,
    /// Where it goes (an exchange's routing key, a subject, a Kafka topic).
    pub topic: String,
    /// The call that published it, as its record stores it: scope and key.
    /// A key's messages are handed over in the order the body published
    /// them; it is the partitioning key where a broker has one.
    pub scope: String,
    /// See [`scope`](Self::scope).
    pub key: String,
    /// The bytes, exactly as published.
    pub payload: Vec<u8>,
    /// Headers the body gave, in its order.
    pub headers: Vec<(String, String)>,
    /// This is the relay's `attempt`-th try to hand it over (from 1).
    pub attempt: u32,
}

impl Message {
    /// A message as a relay hands one over, of no call (scope and key
    /// empty, no headers, first attempt): for a publisher's own tests.
    pub fn new(id: MessageId, topic: impl Into<String>, payload: impl Into<Vec<u8>>) -> Message {
        Message {
            seq: 0,
            id,
            topic: topic.into(),
            scope: String::new(),
            key: String::new(),
            payload: payload.into(),
            headers: Vec::new(),
            attempt: 1,
        }
    }
}

/// A message a guarded body publishes (all checked by the handle).
pub(crate) struct NewMessage<'a> {
    pub(crate) id: &'a MessageId,
    pub(crate) scope: &'a str,
    pub(crate) key: &'a str,
    pub(crate) topic: &'a str,
    pub(crate) payload: &'a [u8],
    pub(crate) headers: &'a [(String, String)],
    pub(crate) retention: Duration,
}

/// What one attempt of a call published: its next ordinal, and the rows
/// it wrote (removed if its body fails and the caller commits anyway).
#[derive(Debug, Default)]
pub(crate) struct Published {
    next: AtomicU32,
    seqs: Mutex<Vec<i64>>,
}

impl Published {
    pub(crate) fn next_ordinal(&self) -> u32 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    fn wrote(&self, seq: i64) {
        self.seqs.lock().unwrap_or_else(|e| e.into_inner()).push(seq);
    }

    fn written(&self) -> Vec<i64> {
        self.seqs.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// The outbox's statements for one record table (its outbox beside it).
/// Those that name a list of rows (`seq IN (...)`) are written at run
/// time: the prefixes here.
pub(crate) struct OutboxStatements {
    insert: Stmt,
    /// The insert that also wakes listening relays (PostgreSQL), sent at
    /// most once per [`WAKE_EVERY`] by a process.
    waking_insert: Option<Stmt>,
    /// `$1` the claim's owner; then `seq IN (...)`.
    mark_sent: String,
    /// `$1` seq, `$2` owner, `$3` status, `$4` delay, `$5` error.
    settle: Stmt,
    /// `$1` the claim's owner; then `seq IN (...)`: claimed, never tried.
    release: String,
    discard: String,
}

impl OutboxStatements {
    pub(crate) fn new<D: OutboxSql>(t: &RecordTable) -> OutboxStatements {
        let (o, now, clock) = (t.outbox(), D::NOW, D::CLOCK);
        let insert = format!(
            "INSERT INTO {o} (message_id, scope, idem_key, topic, payload, headers, status, attempts, \
             next_attempt_at, created_at, expires_at) \
             VALUES ({id}, $2, $3, {topic}, $5, {headers}, 'pending', 0, {now}, {now}, {expires})",
            id = D::text_value("$1"),
            topic = D::text_value("$4"),
            headers = D::text_value("$6"),
            expires = D::after(clock, "$7"),
        );
        OutboxStatements {
            insert: Stmt::new::<D>(&D::insert_sql(&insert)),
            waking_insert: D::waking_insert_sql(&insert, o).map(|sql| Stmt::new::<D>(&sql)),
            mark_sent: format!(
                "UPDATE {o} SET status = 'sent', sent_at = {clock}, claimed_by = NULL, claim_until = NULL \
                 WHERE claimed_by = $1 AND seq IN "
            ),
            settle: Stmt::new::<D>(&format!(
                "UPDATE {o} SET status = {status}, next_attempt_at = {next}, last_error = {error}, \
                 claimed_by = NULL, claim_until = NULL WHERE seq = $1 AND claimed_by = $2",
                status = D::text_value("$3"),
                next = D::after(clock, "$4"),
                error = D::text_value("$5"),
            )),
            release: format!(
                "UPDATE {o} SET claimed_by = NULL, claim_until = NULL, attempts = attempts - 1 \
                 WHERE claimed_by = $1 AND seq IN "
            ),
            discard: format!("DELETE FROM {o} WHERE status = 'pending' AND seq IN "),
        }
    }
}

fn outbox<DB: SqlBackend>() -> &'static OutboxStatements {
    &statements::<DB>().outbox
}

/// Not in a relay's hands: never claimed, or its claim has passed.
pub(crate) fn unclaimed(clock: &str) -> String {
    format!("(claim_until IS NULL OR claim_until <= {clock})")
}

/// `prefix` and `(1, 2, 3)`: `seqs` written in (integers idem read from
/// the table), sent once (not prepared for the session: each list is
/// another text).
fn listing<'a, D: Dialect>(prefix: &str, seqs: &[i64], args: &[Arg<'a>]) -> Query<D> {
    let list = seqs.iter().map(i64::to_string).collect::<Vec<_>>().join(", ");
    D::once(Stmt::new::<D>(&format!("{prefix}({list})")).query::<D>(args))
}

/// The columns of a claimed message, as [`decode_message`] reads them, from
/// the rows named `p` (`"c."`, or `""`); `attempts`: the attempt's number
/// as the row has it after the claim.
pub(crate) fn message_columns<D: Dialect>(p: &str, attempts: &str) -> String {
    format!(
        "{p}seq, {}, {p}scope, {p}idem_key, {}, {p}payload, {}, {}",
        D::text_column(&format!("{p}message_id")),
        D::text_column(&format!("{p}topic")),
        D::text_column(&format!("{p}headers")),
        D::int8(attempts),
    )
}

/// The messages a claim may take, `columns` of them: pending, due, in no
/// relay's hands, of the relay's scopes (`$4` and on, if it names any),
/// and the first pending one of their key, oldest first, `$3` at most.
/// The database's claim statement or transaction is built around it.
///
/// "The first of its key" is a scalar subquery, not a `NOT EXISTS`:
/// PostgreSQL turns the latter into an anti-join, which on a table not
/// analyzed since a burst of inserts it planned as a nested loop over
/// every pending row of the scope for each candidate (10 s a claim at
/// 8,000 pending rows); a scalar subquery stays one probe of the key's
/// index per candidate, whatever the statistics.
pub(crate) fn candidates_sql<D: Dialect>(o: &str, columns: &str, scopes: usize) -> String {
    format!("SELECT {columns} FROM {o} c WHERE {} ORDER BY c.seq LIMIT $3", claimable::<D>(o, scopes))
}

/// The condition of a row `c` a claim may take (see [`candidates_sql`]).
pub(crate) fn claimable<D: Dialect>(o: &str, scopes: usize) -> String {
    let clock = D::CLOCK;
    let scopes = match scopes {
        0 => String::new(),
        n => format!(" AND c.scope IN ({})", (4..4 + n).map(|i| format!("${i}")).collect::<Vec<_>>().join(", ")),
    };
    format!(
        "c.status = 'pending' AND c.next_attempt_at <= {clock} \
         AND (c.claim_until IS NULL OR c.claim_until <= {clock}){scopes} \
         AND c.seq = (SELECT min(e.seq) FROM {o} e WHERE e.scope = c.scope AND e.idem_key = c.idem_key \
         AND e.status = 'pending')"
    )
}

/// A relay's claim of a batch: its values are `$1` the owner, `$2` the
/// lease, `$3` the batch, then the scopes ([`args`](Self::args)).
#[doc(hidden)]
pub struct BatchRequest<'a> {
    pub(crate) owner: &'a str,
    pub(crate) lease: Duration,
    pub(crate) batch: u32,
    /// The relay's scopes, as stored (none: all).
    pub(crate) scopes: &'a [String],
}

impl<'a> BatchRequest<'a> {
    pub(crate) fn args(&self) -> Vec<Arg<'a>> {
        let mut args = vec![text(self.owner), Arg::Span(self.lease), Arg::Int(self.batch.into())];
        args.extend(self.scopes.iter().map(|s| text(s)));
        args
    }
}

/// A row of [`message_columns`].
pub(crate) fn decode_message<D: Dialect>(row: &D::Row) -> Result<Message, sqlx::Error> {
    Ok(Message {
        seq: D::int(row, 0)?,
        id: MessageId(read_required::<D>(row, 1)?),
        scope: read_required::<D>(row, 2)?,
        key: read_required::<D>(row, 3)?,
        topic: read_required::<D>(row, 4)?,
        payload: D::opt_bytes(row, 5)?.unwrap_or_default(),
        headers: decode_headers(read_text::<D>(row, 6)?, 6)?,
        attempt: u32::try_from(D::int(row, 7)?).unwrap_or(0),
    })
}

/// Headers are kept as JSON, `[["name", "value"], ...]`; none: NULL.
fn encode_headers(headers: &[(String, String)]) -> Option<String> {
    (!headers.is_empty()).then(|| serde_json::to_string(headers).expect("strings serialize"))
}

pub(crate) fn decode_headers(json: Option<String>, i: usize) -> Result<Vec<(String, String)>, sqlx::Error> {
    let Some(json) = json else { return Ok(Vec::new()) };
    serde_json::from_str(&json).map_err(|e| sqlx::Error::ColumnDecode { index: i.to_string(), source: e.into() })
}

/// How a database claims and purges the outbox's rows, and whether it can
/// wake a relay when a message commits. Sealed, like the dialects.
#[doc(hidden)]
pub trait OutboxSql: Dialect {
    /// A claim's statements, for a relay of `scopes` scopes (`0`: all).
    type BatchClaim: ClaimBatch<Self>;

    /// The insert (`insert`, a plain `INSERT`) as this database sends it:
    /// one that returns the row's `seq`.
    fn insert_sql(insert: &str) -> String {
        format!("{insert} RETURNING seq")
    }

    /// The same insert, also waking the relays that listen for commits on
    /// `outbox` (see [`wake_on_commit`](Self::wake_on_commit)); `None`
    /// where the database cannot.
    fn waking_insert_sql(insert: &str, outbox: &str) -> Option<String> {
        let _ = (insert, outbox);
        None
    }

    /// Send the insert: the row's `seq`.
    fn insert(conn: &mut Self::Connection, query: Query<Self>) -> BoxFuture<'_, Result<i64, sqlx::Error>> {
        Box::pin(async move { Self::int(&Self::fetch_one(conn, query).await?, 0) })
    }

    fn claim_statements(outbox: &str, scopes: usize) -> Self::BatchClaim;

    /// A purge batch: delete at most `$1` rows of `condition` (its values
    /// from `$2`).
    fn purge_sql(outbox: &str, condition: &str) -> String;

    /// Wake `wake` each time a message commits (`outbox`: the table), by a
    /// task of its own on a connection of `pool`; `None`: the database
    /// cannot, and the relay polls.
    fn wake_on_commit(
        pool: &sqlx::Pool<Self>,
        outbox: &str,
        wake: Arc<tokio::sync::Notify>,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let _ = (pool, outbox, wake);
        None
    }
}

/// How a database claims a batch: the rows of [`message_columns`], their
/// `attempts` counting this claim, in any order.
#[doc(hidden)]
pub trait ClaimBatch<D: Dialect>: Send + Sync + 'static {
    fn claim<'a>(
        &'a self,
        conn: &'a mut D::Connection,
        request: &'a BatchRequest<'a>,
    ) -> BoxFuture<'a, Result<Vec<D::Row>, sqlx::Error>>;
}

/// One statement that chooses, claims and returns the rows.
impl<D: Dialect> ClaimBatch<D> for Stmt {
    fn claim<'a>(
        &'a self,
        conn: &'a mut D::Connection,
        request: &'a BatchRequest<'a>,
    ) -> BoxFuture<'a, Result<Vec<D::Row>, sqlx::Error>> {
        D::fetch_all(conn, self.query::<D>(&request.args()))
    }
}

/// Insert a message in the caller's transaction; the row is recorded in
/// `published`.
pub(crate) async fn insert<DB: SqlBackend>(
    conn: &mut DB::Connection,
    m: &NewMessage<'_>,
    published: Option<&Published>,
) -> Result<(), Error> {
    let headers = encode_headers(m.headers);
    let args = [
        text(m.id.as_str()),
        text(m.scope),
        text(m.key),
        text(m.topic),
        Arg::Bytes(m.payload),
        Arg::Text(headers.as_deref()),
        Arg::Span(m.retention),
    ];
    let statements = outbox::<DB>();
    let statement = match &statements.waking_insert {
        Some(waking) if wake_now() => waking,
        _ => &statements.insert,
    };
    let seq = DB::insert(conn, statement.query::<DB>(&args)).await.map_err(classify::<DB>)?;
    if let Some(published) = published {
        published.wrote(seq);
    }
    Ok(())
}

/// How often at most a process's messages wake the relays (PostgreSQL's
/// `NOTIFY`). A transaction that notified holds a database-wide lock from
/// its commit until its commit is flushed, so that notifications queue in
/// commit order: commits that notify are made one at a time, which took
/// 16 publishing clients to 0.42 of the same calls without a message
/// (BENCHMARKS.md, R9). A message that does not notify is found by the
/// relay's next round: one woken goes on claiming while it finds messages,
/// and polls briefly after ([`HOT_POLL`]).
pub(crate) const WAKE_EVERY: std::time::Duration = std::time::Duration::from_millis(10);

/// How soon a woken relay looks again after a round that found nothing,
/// for [`HOT_FOR`] after it last found a message: a message whose
/// notification was left out (another commit of its process had notified
/// within [`WAKE_EVERY`]) is found that soon.
pub(crate) const HOT_POLL: std::time::Duration = std::time::Duration::from_millis(5);

/// See [`HOT_POLL`].
pub(crate) const HOT_FOR: std::time::Duration = std::time::Duration::from_millis(250);

/// Whether this insert should notify: none of this process did in the
/// last [`WAKE_EVERY`].
fn wake_now() -> bool {
    use std::sync::atomic::{AtomicU64, Ordering};
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = u64::try_from(EPOCH.get_or_init(std::time::Instant::now).elapsed().as_micros()).unwrap_or(u64::MAX);
    // 0 is "never": the first insert of a process notifies.
    let now = now.max(1);
    let last = LAST.load(Ordering::Relaxed);
    let every = u64::try_from(WAKE_EVERY.as_micros()).unwrap_or(u64::MAX);
    (last == 0 || now.saturating_sub(last) >= every)
        && LAST.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok()
}

/// Remove what one attempt wrote (its body failed): nothing of it is
/// published even if the caller commits anyway. If this fails, the
/// transaction cannot commit: nothing to report.
pub(crate) async fn discard<DB: SqlBackend>(conn: &mut DB::Connection, published: &Published) {
    let seqs = published.written();
    if seqs.is_empty() {
        return;
    }
    if let Err(e) = DB::execute(conn, listing::<DB>(&outbox::<DB>().discard, &seqs, &[])).await {
        tracing::debug!(target: "idem", error = %e, "outbox messages of a failed body not removed");
    }
}

/// Claim a batch: the messages, oldest first.
pub(crate) async fn claim<DB: SqlBackend>(
    conn: &mut DB::Connection,
    claim: &DB::BatchClaim,
    request: &BatchRequest<'_>,
) -> Result<Vec<Message>, Error> {
    let rows = claim.claim(conn, request).await.map_err(classify::<DB>)?;
    let mut messages = rows.iter().map(decode_message::<DB>).collect::<Result<Vec<_>, _>>()?;
    messages.sort_by_key(|m| m.seq);
    Ok(messages)
}

/// Mark the messages `seqs` of `owner`'s claim sent: how many were still
/// its own.
pub(crate) async fn mark_sent<DB: SqlBackend>(
    conn: &mut DB::Connection,
    owner: &str,
    seqs: &[i64],
) -> Result<u64, Error> {
    if seqs.is_empty() {
        return Ok(0);
    }
    let done = DB::execute(conn, listing::<DB>(&outbox::<DB>().mark_sent, seqs, &[text(owner)])).await;
    Ok(DB::rows(&done.map_err(classify::<DB>)?))
}

/// Hand back the messages `seqs` of `owner`'s claim it never tried (its
/// lease was running out): they are claimable again at once, their try
/// not counted.
pub(crate) async fn release<DB: SqlBackend>(conn: &mut DB::Connection, owner: &str, seqs: &[i64]) -> Result<(), Error> {
    if !seqs.is_empty() {
        DB::execute(conn, listing::<DB>(&outbox::<DB>().release, seqs, &[text(owner)]))
            .await
            .map_err(classify::<DB>)?;
    }
    Ok(())
}

/// A message `owner` failed to hand over: tried again after `delay`, or
/// (`dead`) never again; `error` kept. False if the claim was no longer
/// its own.
pub(crate) async fn settle<DB: SqlBackend>(
    conn: &mut DB::Connection,
    seq: i64,
    owner: &str,
    dead: bool,
    delay: Duration,
    error: &str,
) -> Result<bool, Error> {
    let status = if dead { "dead" } else { "pending" };
    let args = [Arg::Int(seq), text(owner), text(status), Arg::Span(delay), text(error)];
    let done = DB::execute(conn, outbox::<DB>().settle.query::<DB>(&args)).await.map_err(classify::<DB>)?;
    Ok(DB::rows(&done) == 1)
}

#[cfg(test)]
mod tests {
    use super::MessageId;

    /// Ids given to consumers stay valid: their hashing never changes.
    #[test]
    fn a_message_id_is_stable_and_names_one_message() {
        let a = MessageId::for_call("pay", "T-1", 0);
        assert_eq!(a, MessageId::for_call("pay", "T-1", 0));
        assert_ne!(a, MessageId::for_call("pay", "T-1", 1));
        assert_ne!(a, MessageId::for_call("pa", "yT-1", 0), "parts do not run into each other");
        assert_ne!(MessageId::for_step("idem-step-x", 0), MessageId::for_step("idem-step-x", 1));
        assert!(a.as_str().starts_with("idem-msg-") && a.as_str().len() == 41, "{a}");
        assert_eq!(a.as_str(), "idem-msg-e459ccaf315f3d3604f8cb91616e50bd");
    }

    #[test]
    fn an_id_parses_back_and_a_wrong_one_says_what_is_wrong() {
        let id = MessageId::for_call("pay", "T-1", 0);
        assert_eq!(id.as_str().parse::<MessageId>(), Ok(id.clone()));
        assert_eq!(id.as_str().to_ascii_uppercase().replace("IDEM-MSG-", "idem-msg-").parse::<MessageId>(), Ok(id));
        for (text, says) in [
            ("", "starts with `idem-msg-`"),
            ("idem-step-0123456789abcdef0123456789abcdef", "starts with `idem-msg-`"),
            ("idem-msg-", "has 0 hex digits"),
            ("idem-msg-0123456789abcdef0123456789abcdef0", "has 33 hex digits"),
            ("idem-msg-0123456789abcdeg0123456789abcdef", "'g' at byte 24 is not a hex digit"),
            ("idem-msg-0123456789abcdef0123456789abcde ", "' ' at byte 40"),
        ] {
            let e = text.parse::<MessageId>().unwrap_err().to_string();
            assert!(e.contains(says) && e.contains(&format!("{text:?}")), "{text:?}: {e}");
        }
    }
}
