//! `idem outbox`: the outbox's messages as an operator sees them: list the
//! ones waiting, show one, hand them to the relay again; and what `idem
//! stuck` says of the outbox.

use std::time::Duration;

use base64::Engine as _;
use idem_runtime::outbox::{Entry, Message, MessageCounts, MessageId, MessageQuery, MessageState};
use serde_json::{Value, json};

use crate::error::Failure;
use crate::opt::{MessageFilter, OutboxCommand, OutboxListArgs, OutboxResendArgs};
use crate::release::ask;
use crate::render::{Done, Out, as_text, field_line, hex, key_parts, one_line, plural, preview, shown, span};
use crate::store::Sql;

/// How many characters of a broker's error a line of the list shows
/// (`show` and `--json` have it whole).
const ERROR_CHARS: usize = 60;

/// Bytes of a payload that is not text, a line of hex.
const HEX_LINE_BYTES: usize = 32;

pub(crate) async fn run(sql: &Sql, command: OutboxCommand, out: &Out) -> Result<Done, Failure> {
    match command {
        OutboxCommand::List(args) => list(sql, &args, out).await,
        OutboxCommand::Show(args) => show(sql, &args.id, out).await,
        OutboxCommand::Resend(OutboxResendArgs { id: Some(id), .. }) => resend(sql, &id, out).await,
        OutboxCommand::Resend(OutboxResendArgs { id: None, filter, yes, .. }) => {
            resend_all(sql, &filter, yes, out).await
        }
    }
}

/// The outbox table of the installed record table.
fn table() -> String {
    idem_runtime::Stores::installed().map(|s| s.record_table().outbox().to_owned()).unwrap_or_default()
}

async fn list(sql: &Sql, args: &OutboxListArgs, out: &Out) -> Result<Done, Failure> {
    let (name, table) = (sql.name(), table());
    // One more than asked: whether there are more.
    let query = args.filter.query(args.limit.saturating_add(1));
    let mut entries = sql.messages(&query).await?;
    let more = entries.len() > args.limit as usize;
    entries.truncate(args.limit as usize);
    let which = which(&query);
    if entries.is_empty() {
        out.say(format_args!("{name}: no {which} in {table}"));
    } else {
        let more = if more { format!(" (more: raise --limit, currently {})", args.limit) } else { String::new() };
        let n = entries.len();
        out.say(format_args!("{name}: {n} {which} in {table}, oldest first{more}", which = which_n(&query, n)));
        out.say(list_table(&entries));
    }
    let messages: Vec<Value> = entries.iter().map(json_entry).collect();
    let document = json!({ "store": name, "table": table, "messages": messages, "more": more });
    Ok(Done::ok(json!({ "command": "outbox list", "stores": [document] })))
}

/// The messages a query names, for a sentence: "pending, failing or dead
/// messages of scope S".
fn which(query: &MessageQuery) -> String {
    which_n(query, 2)
}

fn which_n(query: &MessageQuery, n: usize) -> String {
    let mut states: Vec<&str> = query.states.iter().map(|s| state_name(*s)).collect();
    states.dedup();
    let states = match states.split_last() {
        Some((last, [])) => (*last).to_owned(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    };
    let scope = query.scope.as_deref().map(|s| format!(" of scope {}", shown(s))).unwrap_or_default();
    format!("{states} message{}{scope}", plural(n))
}

pub(crate) fn state_name(state: MessageState) -> &'static str {
    match state {
        MessageState::Pending => "pending",
        MessageState::Failing => "failing",
        MessageState::Dead => "dead",
        MessageState::Sent => "sent",
    }
}

/// When the relay tries a message next.
fn next_try(e: &Entry) -> String {
    match e.state {
        _ if e.claimed => "now: a relay holds it".to_owned(),
        MessageState::Pending | MessageState::Failing => e.due_in.map_or_else(|| "due now".to_owned(), in_),
        _ => "-".to_owned(),
    }
}

fn in_(d: Duration) -> String {
    format!("in {}", span(ms(d)))
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The list's table: a header, then a line a message, columns aligned.
fn list_table(entries: &[Entry]) -> String {
    let header = ["ID", "SCOPE", "KEY", "TOPIC", "STATE", "TRIES", "AGE", "NEXT TRY", "LAST ERROR"];
    let rows: Vec<[String; 9]> = entries
        .iter()
        .map(|e| {
            let error = match e.last_error.as_deref().map(|t| preview(t, ERROR_CHARS)) {
                None => "-".to_owned(),
                Some((p, false)) => one_line(p),
                Some((p, true)) => format!("{}…", one_line(p)),
            };
            [
                e.id.to_string(),
                shown(&e.scope),
                shown(&e.key),
                shown(&e.topic),
                state_name(e.state).to_owned(),
                e.attempts.to_string(),
                span(ms(e.age)),
                next_try(e),
                error,
            ]
        })
        .collect();
    let mut widths = header.map(|h| h.chars().count());
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let last = cells.len() - 1;
        let padded: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| if i == last { c.clone() } else { format!("{c:<w$}", w = widths[i]) })
            .collect();
        format!("  {}", padded.join("  "))
    };
    let mut lines = vec![line(&header.map(str::to_owned))];
    lines.extend(rows.iter().map(|r| line(r)));
    lines.join("\n")
}

/// A message as listed, as JSON: every field, the last error whole.
fn json_entry(e: &Entry) -> Value {
    let waiting = matches!(e.state, MessageState::Pending | MessageState::Failing);
    json!({
        "id": e.id.as_str(),
        "seq": e.seq,
        "scope": e.scope,
        "key": e.key,
        "key_parts": key_parts(&e.key),
        "topic": e.topic,
        "state": state_name(e.state),
        "attempts": e.attempts,
        "age_ms": ms(e.age),
        // Pending and failing: when the relay tries it (0: due now).
        "next_try_in_ms": waiting.then(|| e.due_in.map_or(0, ms)),
        "claimed": e.claimed,
        "last_error": e.last_error,
        "payload_bytes": e.payload_len,
    })
}

async fn show(sql: &Sql, id: &MessageId, out: &Out) -> Result<Done, Failure> {
    let (name, table) = (sql.name(), table());
    let found = sql.message(id).await?;
    let message = match &found {
        None => {
            out.say(format_args!(
                "{name}: no message {id} in {table} (sent messages go after their retention, with `idem purge`)"
            ));
            Value::Null
        }
        Some((entry, message)) => {
            out.say(text_message(name, entry, message));
            json_message(entry, message)
        }
    };
    let document = json!({ "store": name, "table": table, "message": message });
    Ok(Done::ok(json!({ "command": "outbox show", "id": id.as_str(), "stores": [document] })))
}

/// What a message's state means for the operator.
fn meaning(e: &Entry) -> &'static str {
    match e.state {
        MessageState::Pending => "waiting for the relay",
        MessageState::Failing => "the broker failed it: the relay tries again after a backoff",
        MessageState::Dead => {
            "given up: refused by the broker, or failed too often; `idem outbox resend` hands it over again"
        }
        MessageState::Sent => "confirmed by the broker",
    }
}

fn text_message(store: &str, e: &Entry, m: &Message) -> String {
    let mut lines = vec![format!("{store}: message {}", e.id)];
    let mut field = |name: &str, value: String| lines.push(field_line(name, &value));
    field("state", format!("{} ({})", state_name(e.state), meaning(e)));
    field("scope", shown(&e.scope));
    field("key", shown(&e.key));
    field("topic", shown(&e.topic));
    field("seq", e.seq.to_string());
    field("tries", e.attempts.to_string());
    field("published", format!("{} ago", span(ms(e.age))));
    field("next try", next_try(e));
    field("last error", e.last_error.as_deref().map_or_else(|| "-".to_owned(), one_line));
    field("headers", if m.headers.is_empty() { "(none)".to_owned() } else { m.headers.len().to_string() });
    for (name, value) in &m.headers {
        lines.push(format!("    {}: {}", one_line(name), one_line(value)));
    }
    let n = m.payload.len();
    match as_text(&m.payload) {
        _ if m.payload.is_empty() => lines.push(field_line("payload", "(empty)")),
        Some(text) => {
            lines.push(field_line("payload", &format!("{n} byte{}, UTF-8 text:", plural(n))));
            lines.push(text.to_owned());
        }
        None => {
            lines.push(field_line("payload", &format!("{n} byte{}, not UTF-8 text: in hex", plural(n))));
            lines.extend(m.payload.chunks(HEX_LINE_BYTES).map(|chunk| format!("    {}", hex(chunk))));
        }
    }
    lines.join("\n")
}

/// A message as JSON: as listed, and its headers and payload (UTF-8 as
/// text, anything else in base64).
fn json_message(e: &Entry, m: &Message) -> Value {
    let mut message = json_entry(e);
    message["headers"] = m.headers.iter().map(|(name, value)| json!({ "name": name, "value": value })).collect();
    message["payload"] = match std::str::from_utf8(&m.payload) {
        Ok(text) => json!({ "encoding": "utf-8", "data": text }),
        Err(_) => {
            json!({ "encoding": "base64", "data": base64::engine::general_purpose::STANDARD.encode(&m.payload) })
        }
    };
    message
}

async fn resend(sql: &Sql, id: &MessageId, out: &Out) -> Result<Done, Failure> {
    let (name, table) = (sql.name(), table());
    let Some((entry, _)) = sql.message(id).await? else {
        return Err(Failure::error(format!("{name}: no message {id} in {table}: nothing resent")));
    };
    let was = state_name(entry.state);
    let resent = if entry.claimed { 0 } else { sql.resend(id).await? };
    let outcome = if resent > 0 {
        out.say(format_args!(
            "{name}: {id} made pending, due now (it was {was} after {} tr{}; its tries count from 0 again): the \
             relay hands it over with the same id",
            entry.attempts,
            if entry.attempts == 1 { "y" } else { "ies" },
        ));
        "resent"
    } else {
        out.say(format_args!(
            "{name}: {id} left to the relay that holds it right now (it is being handed over; its outcome comes: \
             see `idem outbox show {id}`)"
        ));
        "held_by_relay"
    };
    let document = json!({ "store": name, "id": id.as_str(), "was": was, "outcome": outcome, "resent": resent });
    Ok(Done::ok(json!({ "command": "outbox resend", "resent": resent, "stores": [document] })))
}

async fn resend_all(sql: &Sql, filter: &MessageFilter, yes: bool, out: &Out) -> Result<Done, Failure> {
    let (name, table) = (sql.name(), table());
    let query = filter.query(u32::MAX);
    let counts = sql.count_messages(&query).await?;
    let total = counts.pending + counts.failing + counts.dead + counts.sent;
    let document = |resent: u64, held: u64| {
        let store = json!({ "store": name, "table": table, "matched": total, "resent": resent, "held_by_relay": held });
        json!({ "command": "outbox resend", "resent": resent, "stores": [store] })
    };
    if total == 0 {
        out.say(format_args!("{name}: no {} in {table}: nothing to resend", which(&query)));
        return Ok(Done::ok(document(0, 0)));
    }
    let what = format!("{total} {}{}", which_n(&query, usize::try_from(total).unwrap_or(2)), breakdown(&counts));
    out.say(format_args!("{name}: {what} to resend"));
    if !yes {
        let question = format!(
            "Resend {what} in {name}? Each goes to the broker again with its id (a consumer that deduplicates by \
             id takes it once)."
        );
        ask(&question, "resend them").map_err(|why| Failure::error(format!("{name}: nothing resent: {why}")))?;
    }
    let resent = sql.resend_all(&query).await?;
    // The ones a relay held (or took meanwhile, or sent meanwhile): left
    // to it.
    let held = total.saturating_sub(resent);
    let left = if held > 0 {
        format!("; {held} held by a relay right now left to it (their outcome comes)")
    } else {
        String::new()
    };
    out.say(format_args!("{name}: {resent} message{} made pending, due now{left}", plural(resent)));
    Ok(Done::ok(document(resent, held)))
}

/// ` (1 failing, 2 dead)`: how many of each state, where more than one
/// state has some.
fn breakdown(counts: &MessageCounts) -> String {
    let states =
        [("pending", counts.pending), ("failing", counts.failing), ("dead", counts.dead), ("sent", counts.sent)];
    let parts: Vec<String> = states.iter().filter(|(_, n)| *n > 0).map(|(s, n)| format!("{n} {s}")).collect();
    if parts.len() > 1 { format!(" ({})", parts.join(", ")) } else { String::new() }
}

/// What `idem stuck` says of a database's outbox: `None`, no outbox table
/// (a database migrated before there was one).
pub(crate) fn waiting(store: &str, waiting: Option<&(MessageCounts, Option<Duration>)>, out: &Out) -> Value {
    let Some((counts, oldest)) = waiting else {
        out.say(format_args!("{store}: no outbox table (`idem migrate` creates it)"));
        return json!({ "table": false });
    };
    let unsent = counts.pending + counts.failing + counts.dead;
    if unsent == 0 {
        out.say(format_args!("{store}: outbox: no messages waiting"));
    } else {
        let oldest = oldest.map(|age| format!("; the oldest pending has waited {}", span(ms(age)))).unwrap_or_default();
        out.say(format_args!(
            "{store}: outbox: {} pending, {} failing, {} dead{oldest} (see `idem outbox list`)",
            counts.pending, counts.failing, counts.dead
        ));
    }
    json!({
        "table": true,
        "pending": counts.pending,
        "failing": counts.failing,
        "dead": counts.dead,
        "oldest_pending_age_ms": oldest.map(ms),
    })
}
