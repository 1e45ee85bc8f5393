//! The outbox's operator functions (feature `outbox`): list its messages
//! by age, show one, hand one or many over again, how long the oldest has
//! waited, and purge the sent ones; what the `idem` command does with the
//! outbox, as functions a program can call. They work on the outbox beside
//! the record table of the installed [`Stores`](crate::Stores).

use std::time::Duration;

use super::dialect::{Arg, Dialect, Stmt, read_required, read_text, text};
use super::outbox::{Message, MessageId, decode_headers, unclaimed};
use super::{PurgeOptions, PurgeReport, SqlBackend, classify, statements};
use crate::error::Error;
use crate::future::BoxFuture;
use crate::table::RecordTable;

/// Where a message is, as the operator sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MessageState {
    /// Waiting for the relay (or in its hands now), never failed.
    Pending,
    /// Waiting for another try: the broker failed it before (its error is
    /// kept).
    Failing,
    /// Confirmed by the broker; purged after its retention.
    Sent,
    /// Given up: refused by the broker, or failed too often. Waits for an
    /// operator ([`resend`](crate::outbox::resend)).
    Dead,
}

impl MessageState {
    /// The condition of its rows.
    fn condition(self) -> &'static str {
        match self {
            MessageState::Pending => "(status = 'pending' AND (attempts = 0 OR last_error IS NULL))",
            MessageState::Failing => "(status = 'pending' AND attempts > 0 AND last_error IS NOT NULL)",
            MessageState::Sent => "status = 'sent'",
            MessageState::Dead => "status = 'dead'",
        }
    }
}

/// A message in the outbox, as [`list_messages`](crate::outbox::list_messages)
/// shows it (its payload: [`find_message`](crate::outbox::find_message)).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Entry {
    /// Its row, in commit order within its key.
    pub seq: i64,
    /// Its id.
    pub id: MessageId,
    /// The call that published it (as stored).
    pub scope: String,
    /// See [`scope`](Self::scope).
    pub key: String,
    /// Where it goes.
    pub topic: String,
    /// Where it is.
    pub state: MessageState,
    /// How many times a relay took it to hand over.
    pub attempts: u32,
    /// How long ago it was published (by the database's clock).
    pub age: Duration,
    /// A pending message not due yet: its next try is this far off.
    pub due_in: Option<Duration>,
    /// A relay holds it now (it is being handed over).
    pub claimed: bool,
    /// The broker's last error, if one failed or refused it.
    pub last_error: Option<String>,
    /// The payload's length in bytes.
    pub payload_len: u64,
}

/// Which messages [`list_messages`](crate::outbox::list_messages) and
/// [`resend_all`](crate::outbox::resend_all) take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MessageQuery {
    /// Messages in these states (default: pending, failing and dead, the
    /// ones not handed over yet).
    pub states: Vec<MessageState>,
    /// Only the messages of this scope, as the guard names it (`None`, the
    /// default: every scope).
    pub scope: Option<String>,
    /// Only messages after this `seq` (the last one of the page before).
    pub after: Option<i64>,
    /// At most this many (default 100; a list only).
    pub limit: u32,
}

impl Default for MessageQuery {
    fn default() -> Self {
        MessageQuery {
            states: vec![MessageState::Pending, MessageState::Failing, MessageState::Dead],
            scope: None,
            after: None,
            limit: 100,
        }
    }
}

/// The operator's statements for one record table's outbox.
pub(crate) struct OutboxAdminStatements {
    /// `$1` id.
    find: Stmt,
    resend: Stmt,
    /// Entries' columns, and the outbox's name.
    entry: String,
    table: String,
}

impl OutboxAdminStatements {
    pub(crate) fn new<D: Dialect>(t: &RecordTable) -> OutboxAdminStatements {
        let (o, clock) = (t.outbox(), D::CLOCK);
        let entry = entry_columns::<D>();
        OutboxAdminStatements {
            find: Stmt::new::<D>(&format!(
                "SELECT {entry}, payload, {} FROM {o} WHERE message_id = $1 ORDER BY seq DESC",
                D::text_column("headers")
            )),
            // A message a relay holds now is left to it: its outcome comes.
            resend: Stmt::new::<D>(&format!(
                "UPDATE {o} SET status = 'pending', attempts = 0, next_attempt_at = {clock}, claimed_by = NULL, \
                 claim_until = NULL WHERE message_id = $1 AND {unclaimed}",
                unclaimed = unclaimed(clock),
            )),
            entry,
            table: o.to_owned(),
        }
    }
}

fn outbox<DB: SqlBackend>() -> &'static OutboxAdminStatements {
    &statements::<DB>().outbox_admin
}

/// The entries' columns, as [`decode_entry`] reads them (then a
/// message's payload and headers, for [`find_message`]).
fn entry_columns<D: Dialect>() -> String {
    let clock = D::CLOCK;
    format!(
        "seq, {}, scope, idem_key, {}, {}, {}, {}, {}, {}, {}, {}",
        D::text_column("message_id"),
        D::text_column("topic"),
        D::text_column("status"),
        D::int8("attempts"),
        D::text_column("last_error"),
        D::ms_until("created_at"),
        D::ms_until("next_attempt_at"),
        D::flag(&format!("claim_until IS NOT NULL AND claim_until > {clock}")),
        D::int8("length(payload)"),
    )
}

fn decode_entry<D: Dialect>(row: &D::Row) -> Result<Entry, sqlx::Error> {
    let ms = |i| D::int(row, i).map(|ms| Duration::from_millis(ms.unsigned_abs()).max(Duration::ZERO));
    let status = read_required::<D>(row, 5)?;
    let attempts = u32::try_from(D::int(row, 6)?).unwrap_or(0);
    let last_error = read_text::<D>(row, 7)?;
    let state = match status.as_str() {
        "sent" => MessageState::Sent,
        "dead" => MessageState::Dead,
        _ if attempts > 0 && last_error.is_some() => MessageState::Failing,
        _ => MessageState::Pending,
    };
    let due = D::int(row, 9)?;
    Ok(Entry {
        seq: D::int(row, 0)?,
        id: MessageId(read_required::<D>(row, 1)?),
        scope: read_required::<D>(row, 2)?,
        key: read_required::<D>(row, 3)?,
        topic: read_required::<D>(row, 4)?,
        state,
        attempts,
        age: ms(8)?,
        due_in: (state != MessageState::Sent && state != MessageState::Dead && due > 0)
            .then(|| Duration::from_millis(due.unsigned_abs())),
        claimed: D::int(row, 10)? != 0,
        last_error,
        payload_len: u64::try_from(D::int(row, 11)?).unwrap_or(0),
    })
}

/// The condition of `query`'s messages, its scope as `$1` (if any) and the
/// `seq` to start after as `$2`.
fn query_condition(query: &MessageQuery) -> String {
    let mut states = query.states.iter().map(|s| s.condition()).collect::<Vec<_>>();
    states.dedup();
    let mut condition = if states.is_empty() { "1 = 0".to_owned() } else { format!("({})", states.join(" OR ")) };
    if query.scope.is_some() {
        condition.push_str(" AND scope = $1");
    }
    if query.after.is_some() {
        condition.push_str(" AND seq > $2");
    }
    condition
}

/// `query`'s scope (as stored) and the `seq` it starts after.
fn query_args<'a>(scope: Option<&'a str>, query: &MessageQuery) -> [Arg<'a>; 3] {
    [Arg::Text(scope), Arg::Int(query.after.unwrap_or(0)), Arg::Int(query.limit.into())]
}

/// List the messages of `query` in the outbox beside the installed record
/// table, oldest first (`seq` order): pending, failing and dead ones by
/// default, the operator's view. Page on with [`MessageQuery::after`] set
/// to the last one's `seq`.
pub async fn list_messages<DB: SqlBackend>(pool: &sqlx::Pool<DB>, query: &MessageQuery) -> Result<Vec<Entry>, Error> {
    let o = outbox::<DB>();
    let scope = query.scope.as_deref().map(crate::key::stored_scope);
    let sql = format!("SELECT {} FROM {} WHERE {} ORDER BY seq LIMIT $3", o.entry, o.table, query_condition(query));
    let mut conn = pool.acquire().await?;
    let q = DB::once(Stmt::new::<DB>(&sql).query::<DB>(&query_args(scope.as_deref(), query)));
    let rows = DB::fetch_all(&mut conn, q).await.map_err(classify::<DB>)?;
    Ok(rows.iter().map(decode_entry::<DB>).collect::<Result<_, _>>()?)
}

/// The message `id` (the latest row of that id, if a key was used again
/// after its retention): as listed, and as the relay would hand it over.
pub async fn find_message<DB: SqlBackend>(
    pool: &sqlx::Pool<DB>,
    id: &MessageId,
) -> Result<Option<(Entry, Message)>, Error> {
    let mut conn = pool.acquire().await?;
    let q = outbox::<DB>().find.query::<DB>(&[text(id.as_str())]);
    let Some(row) = DB::fetch_optional(&mut conn, q).await.map_err(classify::<DB>)? else { return Ok(None) };
    let entry = decode_entry::<DB>(&row)?;
    let message = Message {
        seq: entry.seq,
        id: entry.id.clone(),
        topic: entry.topic.clone(),
        scope: entry.scope.clone(),
        key: entry.key.clone(),
        payload: DB::opt_bytes(&row, 12)?.unwrap_or_default(),
        headers: decode_headers(read_text::<DB>(&row, 13)?, 13)?,
        attempt: entry.attempts,
    };
    Ok(Some((entry, message)))
}

/// Hand the message `id` over again: pending, due now, its tries counted
/// from 0 (its last error kept), whatever it was: dead, failing, or sent
/// (harmless: a consumer deduplicating by id takes it once). A message a
/// relay holds right now is left alone (its outcome comes). The number of
/// rows made pending: 0 if there is no such message or a relay holds it.
///
/// A key's later messages wait for it again: it is the first of its key.
pub async fn resend<DB: SqlBackend>(pool: &sqlx::Pool<DB>, id: &MessageId) -> Result<u64, Error> {
    let mut conn = pool.acquire().await?;
    let done = DB::execute(&mut conn, outbox::<DB>().resend.query::<DB>(&[text(id.as_str())])).await;
    Ok(DB::rows(&done.map_err(classify::<DB>)?))
}

/// [`resend`] every message of `query` (its `limit` does not apply): e.g.
/// the dead ones of a scope once their cause is fixed. How many were made
/// pending.
pub async fn resend_all<DB: SqlBackend>(pool: &sqlx::Pool<DB>, query: &MessageQuery) -> Result<u64, Error> {
    let o = outbox::<DB>();
    let scope = query.scope.as_deref().map(crate::key::stored_scope);
    let clock = DB::CLOCK;
    let sql = format!(
        "UPDATE {} SET status = 'pending', attempts = 0, next_attempt_at = {clock}, claimed_by = NULL, \
         claim_until = NULL WHERE {} AND {}",
        o.table,
        query_condition(query),
        unclaimed(clock),
    );
    let mut conn = pool.acquire().await?;
    let q = DB::once(Stmt::new::<DB>(&sql).query::<DB>(&query_args(scope.as_deref(), query)[..2]));
    let done = DB::execute(&mut conn, q).await.map_err(classify::<DB>)?;
    Ok(DB::rows(&done))
}

/// How many messages of each state the outbox holds, as
/// [`count_messages`](crate::outbox::count_messages) counts them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MessageCounts {
    /// Waiting for the relay, never failed.
    pub pending: u64,
    /// Waiting for another try after the broker failed them.
    pub failing: u64,
    /// Given up, waiting for an operator.
    pub dead: u64,
    /// Confirmed by the broker, not purged yet.
    pub sent: u64,
    /// Of those counted, the ones a relay holds right now (a
    /// [`resend`] leaves them to it).
    pub claimed: u64,
}

/// Count the messages of `query` (its states and scope; its `after` and
/// `limit` do not apply), by state: what `idem stuck` reports beside
/// [`oldest_pending`], and what `idem outbox resend --all` asks about.
pub async fn count_messages<DB: SqlBackend>(
    pool: &sqlx::Pool<DB>,
    query: &MessageQuery,
) -> Result<MessageCounts, Error> {
    let o = outbox::<DB>();
    let scope = query.scope.as_deref().map(crate::key::stored_scope);
    let count = |condition: &str| DB::int8(&format!("COUNT(CASE WHEN {condition} THEN 1 END)"));
    let states = [MessageState::Pending, MessageState::Failing, MessageState::Dead, MessageState::Sent];
    let mut columns: Vec<String> = states.iter().map(|s| count(s.condition())).collect();
    columns.push(count(&format!("NOT {}", unclaimed(DB::CLOCK))));
    let query = MessageQuery { after: None, ..query.clone() };
    let sql = format!("SELECT {} FROM {} WHERE {}", columns.join(", "), o.table, query_condition(&query));
    let mut conn = pool.acquire().await?;
    let q = DB::once(Stmt::new::<DB>(&sql).query::<DB>(&query_args(scope.as_deref(), &query)[..2]));
    let row = DB::fetch_one(&mut conn, q).await.map_err(classify::<DB>)?;
    let n = |i| DB::int(&row, i).map(|n| n.unsigned_abs());
    Ok(MessageCounts { pending: n(0)?, failing: n(1)?, dead: n(2)?, sent: n(3)?, claimed: n(4)? })
}

/// How long the oldest pending message (of `scope`, if given) has waited,
/// by the database's clock: what `idem stuck` reports. `None`: none waits.
pub async fn oldest_pending<DB: SqlBackend>(
    pool: &sqlx::Pool<DB>,
    scope: Option<&str>,
) -> Result<Option<Duration>, Error> {
    let query = MessageQuery {
        states: vec![MessageState::Pending, MessageState::Failing],
        scope: scope.map(str::to_owned),
        after: None,
        limit: 1,
    };
    Ok(list_messages(pool, &query).await?.first().map(|e| e.age))
}

/// The values of an outbox purge: `$1` the batch, `$2` `older_than`, `$3`
/// the scope as stored.
fn purge_condition<D: Dialect>(options: &PurgeOptions) -> String {
    let clock = D::CLOCK;
    let mut expired = format!("expires_at <= {clock}");
    if options.older_than.is_some() {
        expired = format!("({expired} OR created_at <= {})", D::before(clock, "$2"));
    }
    let scope = if options.scope.is_some() { " AND scope = $3" } else { "" };
    format!("status = 'sent' AND {expired}{scope}")
}

/// Delete sent messages past their retention (the retention of the call
/// that published them), in bounded batches, as
/// [`purge_expired`](crate::sql::purge_expired) deletes records, with the
/// same options ([`archive`](super::PurgeOptions::archive) aside: sent
/// messages are not archived; with
/// [`older_than`](super::PurgeOptions::older_than), also sent messages
/// published longer ago). Pending, failing and dead messages are never
/// purged: they wait for the relay or an operator.
pub async fn purge_sent<DB: SqlBackend>(pool: &sqlx::Pool<DB>, options: PurgeOptions) -> Result<PurgeReport, Error> {
    let older_than = options.older_than.map(|d| crate::error::check_ttl("older_than", d)).transpose()?;
    let scope = options.scope.as_deref().map(crate::key::stored_scope);
    let purge = SentPurge {
        delete: Stmt::new::<DB>(&DB::purge_sql(&outbox::<DB>().table, &purge_condition::<DB>(&options))),
        batch: options.batch_size.max(1),
        older_than: older_than.unwrap_or_default(),
        scope: scope.as_deref(),
    };
    super::schema::in_batches::<DB>(pool, &options, &purge).await
}

/// How many sent messages [`purge_sent`] would delete with `options`
/// (`idem purge --dry-run`); deletes nothing.
pub async fn purge_sent_preview<DB: SqlBackend>(pool: &sqlx::Pool<DB>, options: &PurgeOptions) -> Result<u64, Error> {
    let older_than = options.older_than.map(|d| crate::error::check_ttl("older_than", d)).transpose()?;
    let scope = options.scope.as_deref().map(crate::key::stored_scope);
    let sql = format!(
        "SELECT {} FROM {} WHERE {}",
        DB::int8("COUNT(*)"),
        outbox::<DB>().table,
        purge_condition::<DB>(options)
    );
    let args = [Arg::Int(0), Arg::Span(older_than.unwrap_or_default()), Arg::Text(scope.as_deref())];
    let mut conn = pool.acquire().await?;
    let q = DB::once(Stmt::new::<DB>(&sql).query::<DB>(&args));
    let row = DB::fetch_one(&mut conn, q).await.map_err(classify::<DB>)?;
    Ok(DB::int(&row, 0)?.unsigned_abs())
}

/// One batch of [`purge_sent`].
struct SentPurge<'a> {
    delete: Stmt,
    batch: u32,
    older_than: Duration,
    scope: Option<&'a str>,
}

impl<DB: SqlBackend> super::schema::Batch<DB> for SentPurge<'_> {
    fn run<'c>(&'c self, conn: &'c mut DB::Connection) -> BoxFuture<'c, Result<u64, Error>> {
        let args = [Arg::Int(self.batch.into()), Arg::Span(self.older_than), Arg::Text(self.scope)];
        let q = self.delete.query::<DB>(&args);
        Box::pin(async move { Ok(DB::rows(&DB::execute(conn, q).await.map_err(classify::<DB>)?)) })
    }
}
