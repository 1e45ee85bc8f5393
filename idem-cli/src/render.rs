//! How records and values look: a record as text and as JSON, a line of
//! the stuck table, keys, times and spans. Text goes to stdout unless
//! `--json`, when a command's one JSON document goes there instead.

use std::time::{Duration, UNIX_EPOCH};

use idem_runtime::Key;
use idem_runtime::admin::RecordStatus;
use idem_runtime::admin::{Record, RecordState};
use idem_runtime::lease::{StepKey, StepLog};
use serde_json::{Value, json};

use crate::answer::{Answer, HttpResponse, answer};
use crate::error::Failure;

/// Text output (stdout), unless `--json`.
pub(crate) struct Out {
    pub(crate) json: bool,
}

impl Out {
    pub(crate) fn say(&self, text: impl std::fmt::Display) {
        if !self.json {
            println!("{text}");
        }
    }
}

/// What a command printed as JSON (with `--json`), and whether it failed
/// after producing it (a refused release).
pub(crate) struct Done {
    pub(crate) document: Value,
    pub(crate) failure: Option<Failure>,
}

impl Done {
    pub(crate) fn ok(document: Value) -> Done {
        Done { document, failure: None }
    }
}

/// What a command that acts on the call in each store given (`release`,
/// `steps resolve`) did: `count` stores `did` it; `refused`, each store's
/// `(store, why)` where it did not, fail the command, and so does `none`
/// when no store acted and none refused (no store holds the call).
pub(crate) fn each_store(
    command: &str,
    (did, count): (&str, usize),
    refused: impl IntoIterator<Item = (&'static str, String)>,
    none: String,
    documents: Vec<Value>,
) -> Done {
    let mut failures: Vec<String> =
        refused.into_iter().map(|(store, why)| format!("{store}: not {did}: {why}")).collect();
    if count == 0 && failures.is_empty() {
        failures.push(none);
    }
    let mut document = json!({ "command": command, "stores": documents });
    document[did] = json!(count);
    let failure = (!failures.is_empty()).then(|| Failure::error(failures.join("; ")));
    Done { document, failure }
}

/// A record as JSON: every field, times both as RFC 3339 and as epoch
/// milliseconds, a preview of its answer, and its call's recorded steps.
pub(crate) fn json_record(r: &Record) -> Value {
    let (response_preview, truncated) = match r.response.as_deref().map(|t| preview(t, PREVIEW_CHARS)) {
        Some((p, cut)) => (Some(p), cut),
        None => (None, false),
    };
    let answer = answer(r);
    let (steps, in_flight) = json_steps(&record_steps(r));
    json!({
        "scope": r.scope,
        "key": r.key,
        "key_parts": r.key_parts(),
        "status": r.status.as_str(),
        "state": r.state.as_str(),
        "stuck": r.state.is_stuck(),
        "owner": r.owner,
        "fence": r.fence,
        "fingerprint": r.fingerprint,
        "lease_until": r.lease_until_ms.map(timestamp),
        "lease_until_ms": r.lease_until_ms,
        "lease_left_ms": r.lease_left_ms(),
        "created_at": r.created_at_ms.map(timestamp),
        "created_at_ms": r.created_at_ms,
        "age_ms": r.age_ms(),
        "updated_at": r.updated_at_ms.map(timestamp),
        "updated_at_ms": r.updated_at_ms,
        "expires_at": r.expires_at_ms.map(timestamp),
        "expires_at_ms": r.expires_at_ms,
        "now_ms": r.now_ms,
        // Whether a DONE record kept its answer (null while not done).
        "answer_kept": (r.status == RecordStatus::Done).then_some(!matches!(answer, Answer::NotKept)),
        "response_preview": response_preview,
        "response_truncated": truncated,
        "response_bytes": r.response.as_ref().map(String::len),
        "http_response": match &answer {
            Answer::Http(response) => json_http(response),
            _ => Value::Null,
        },
        "steps": steps,
        "in_flight": in_flight,
    })
}

/// A step of a call as shown: recorded (with its result), or in flight.
pub(crate) struct Step<'a> {
    number: usize,
    name: &'a str,
    key: String,
    /// `None`: in flight (marked started, not recorded).
    result: Option<&'a str>,
}

/// A record's steps, the one in flight last.
fn record_steps(r: &Record) -> Vec<Step<'_>> {
    let recorded =
        r.steps.iter().map(|s| Step { number: s.number, name: &s.name, key: s.key.clone(), result: Some(&s.result) });
    let in_flight =
        r.in_flight.iter().map(|s| Step { number: s.number, name: &s.name, key: s.key.clone(), result: None });
    recorded.chain(in_flight).collect()
}

/// A call's steps as the store holds them (`scope` and `key` as stored),
/// the one in flight last.
pub(crate) fn log_steps<'a>(scope: &str, key: &str, log: &'a StepLog) -> Vec<Step<'a>> {
    let step_key = |name: &str| StepKey::for_step(scope, key, name).to_string();
    let recorded = log.recorded.iter().enumerate();
    let recorded =
        recorded.map(|(number, s)| Step { number, name: &s.name, key: step_key(&s.name), result: Some(&s.result) });
    let in_flight =
        log.started.iter().map(|s| Step { number: s.number, name: &s.name, key: step_key(&s.name), result: None });
    recorded.chain(in_flight).collect()
}

/// Steps as JSON: the recorded ones (number, name, stable key, a preview
/// of the result as of an answer), and the one in flight (number, name,
/// key), or null.
pub(crate) fn json_steps(steps: &[Step<'_>]) -> (Value, Value) {
    let mut recorded = Vec::new();
    let mut in_flight = Value::Null;
    for step in steps {
        let Some(result) = step.result else {
            in_flight = json!({ "number": step.number, "name": step.name, "key": step.key });
            continue;
        };
        let (result_preview, truncated) = preview(result, PREVIEW_CHARS);
        recorded.push(json!({
            "number": step.number,
            "name": step.name,
            "key": step.key,
            "result_preview": result_preview,
            "result_truncated": truncated,
            "result_bytes": result.len(),
        }));
    }
    (Value::Array(recorded), in_flight)
}

/// A response the HTTP layer stored: status, headers, and a preview of
/// the body as text or hex.
fn json_http(response: &HttpResponse) -> Value {
    let (text, hex_preview, truncated) = match body_preview(&response.body) {
        BodyPreview::Text(text, cut) => (Some(text), None, cut),
        BodyPreview::Hex(hex, cut) => (None, Some(hex), cut),
    };
    let headers: Vec<Value> = response
        .headers
        .iter()
        .map(|(name, value)| match as_text(value) {
            Some(text) => json!({ "name": name, "value": text }),
            None => json!({ "name": name, "value_hex": hex(value) }),
        })
        .collect();
    json!({
        "status": response.status,
        "headers": headers,
        "body_bytes": response.body.len(),
        "body_text": text,
        "body_hex": hex_preview,
        "body_truncated": truncated,
    })
}

/// A record for a terminal: a line naming it, then a line per field.
pub(crate) fn text_record(store: &str, r: &Record) -> String {
    let mut lines = vec![format!("{store}: {}", scope_and_key(&r.scope, &r.key))];
    let mut field = |name: &str, value: String| lines.push(field_line(name, &value));
    field("status", format!("{} ({})", r.status.as_str(), meaning(r)));
    field("owner", r.owner.clone().unwrap_or_else(|| "-".to_owned()));
    field("fence", r.fence.to_string());
    field(
        "lease until",
        match (r.lease_until_ms, r.lease_left_ms()) {
            (Some(at), Some(left)) => format!("{} ({})", timestamp(at), relative(left)),
            _ => "-".to_owned(),
        },
    );
    if let (Some(created), Some(age)) = (r.created_at_ms, r.age_ms()) {
        field("created", format!("{} ({} ago)", timestamp(created), span(age)));
    }
    if let Some(updated) = r.updated_at_ms {
        field("updated", timestamp(updated));
    }
    field(
        "expires",
        match r.expires_at_ms {
            Some(at) => format!("{} ({})", timestamp(at), relative(at - r.now_ms)),
            None => "never (no TTL)".to_owned(),
        },
    );
    field("fingerprint", r.fingerprint.clone().unwrap_or_else(|| "-".to_owned()));
    lines.extend(answer_lines(r));
    lines.extend(step_lines(&record_steps(r)));
    lines.join("\n")
}

/// The `steps` field when the call recorded any, a line a step, its
/// result shown as an answer is; then the `in flight` field, if a step is.
pub(crate) fn step_lines(steps: &[Step<'_>]) -> Vec<String> {
    let recorded = steps.iter().filter(|step| step.result.is_some()).count();
    let mut lines = Vec::new();
    if recorded > 0 {
        lines.push(field_line("steps", &format!("{recorded} recorded")));
    }
    for step in steps {
        match step.result {
            Some(result) => lines.push(format!("    {}: {} (key {})", step_name(step), json_text(result), step.key)),
            None => lines.push(field_line(
                "in flight",
                &format!(
                    "{} (key {}): marked started, not recorded: it may or may not have taken effect; the next \
                     attempt checks it, or, at-most-once, stops in doubt until `idem steps resolve`",
                    step_name(step),
                    step.key
                ),
            )),
        }
    }
    lines
}

/// A step named for a terminal: its number, then its name in backticks.
fn step_name(step: &Step<'_>) -> String {
    format!("step {} `{}`", step.number, one_line(step.name))
}

/// Where the call of a stuck lease record stopped: in the step a mark
/// says was in flight (name and key), or after its last recorded step (the
/// next one was in flight), or before its first step. `None` for another
/// record (an unfinished dedup record records no steps).
pub(crate) fn stopped(r: &Record) -> Option<String> {
    if r.state != RecordState::LeasePassed {
        return None;
    }
    let steps = record_steps(r);
    Some(match steps.last() {
        Some(step) if step.result.is_none() => format!("in {} (key {})", step_name(step), step.key),
        Some(step) => format!("after {}", step_name(step)),
        None => "before its first step".to_owned(),
    })
}

/// One field of [`text_record`], its values aligned.
pub(crate) fn field_line(name: &str, value: &str) -> String {
    format!("  {name:<12}{value}")
}

/// What a record means for the operator, by the store's clock.
pub(crate) fn meaning(r: &Record) -> String {
    let text = match r.state {
        // Its worker may be running, or dead with its lease not yet passed:
        // the store cannot tell which.
        RecordState::Running => {
            let until = r.lease_until_ms.map_or_else(|| "-".to_owned(), timestamp);
            return format!(
                "held (lease live until {until}): by a worker, or by one that stopped since; the next call takes it over once the lease passes"
            );
        }
        RecordState::LeasePassed => "STUCK: the lease passed (worker died?); the next call takes it over",
        RecordState::Unfinished => "STUCK: unfinished (committed without its answer); repeats fail until released",
        RecordState::Done => "done: repeats replay its answer",
        RecordState::Failed => "failed",
        RecordState::Expired => "expired: past its retention; ignored by guards, deleted by a purge",
        _ => "",
    };
    text.to_owned()
}

/// The `response` field, and for a response of the HTTP layer its headers
/// and body.
fn answer_lines(r: &Record) -> Vec<String> {
    let response = match answer(r) {
        Answer::Pending => "-".to_owned(),
        Answer::NotKept => "answer not kept (the call completed; its answer was not stored)".to_owned(),
        Answer::Json(text) => json_text(text),
        Answer::Http(response) => return http_lines(&response),
    };
    vec![field_line("response", &response)]
}

/// A stored JSON value (an answer, a step's result) on one line, cut to
/// [`PREVIEW_CHARS`].
fn json_text(text: &str) -> String {
    match preview(text, PREVIEW_CHARS) {
        (p, false) => one_line(p),
        (p, true) => format!("{}… ({} bytes in all)", one_line(p), text.len()),
    }
}

fn http_lines(response: &HttpResponse) -> Vec<String> {
    let headers = response.headers.len();
    let status = format!("HTTP {} ({headers} header{}, stored by the HTTP layer)", response.status, plural(headers));
    let mut lines = vec![field_line("response", &status)];
    for (name, value) in &response.headers {
        let value = match as_text(value) {
            Some(text) => one_line(text),
            None => format!("(hex) {}", hex(value)),
        };
        lines.push(format!("    {name}: {value}"));
    }
    lines.push(field_line("body", &text_body(&response.body)));
    lines
}

fn text_body(body: &[u8]) -> String {
    match body_preview(body) {
        _ if body.is_empty() => "(empty)".to_owned(),
        BodyPreview::Text(text, false) => one_line(text),
        BodyPreview::Text(text, true) => format!("{}… ({} bytes in all)", one_line(text), body.len()),
        BodyPreview::Hex(hex, false) => format!("(hex, {} bytes) {hex}", body.len()),
        BodyPreview::Hex(hex, true) => format!("(hex, {} bytes, the first {PREVIEW_BYTES} shown) {hex}…", body.len()),
    }
}

/// How many characters of a stored response (or of a text body) are shown.
const PREVIEW_CHARS: usize = 200;

/// How many bytes of a body that is not text are shown, in hex.
const PREVIEW_BYTES: usize = 64;

/// `text` cut to at most `max` characters, and whether it was cut.
pub(crate) fn preview(text: &str, max: usize) -> (&str, bool) {
    match text.char_indices().nth(max) {
        None => (text, false),
        Some((at, _)) => (&text[..at], true),
    }
}

/// `bytes` as text when they are UTF-8 with no control characters but
/// tabs and line ends (a JSON or HTML body, a header value); `None` for
/// anything else, shown in hex.
pub(crate) fn as_text(bytes: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(bytes).ok()?;
    (!text.chars().any(|c| c.is_control() && !matches!(c, '\t' | '\n' | '\r'))).then_some(text)
}

/// A body's preview, and whether it was cut.
enum BodyPreview<'a> {
    /// Text, cut to [`PREVIEW_CHARS`].
    Text(&'a str, bool),
    /// Hex of the first [`PREVIEW_BYTES`].
    Hex(String, bool),
}

fn body_preview(body: &[u8]) -> BodyPreview<'_> {
    match as_text(body) {
        Some(text) => {
            let (p, cut) = preview(text, PREVIEW_CHARS);
            BodyPreview::Text(p, cut)
        }
        None => {
            let shown = &body[..body.len().min(PREVIEW_BYTES)];
            BodyPreview::Hex(hex(shown), shown.len() < body.len())
        }
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Text for one line of a terminal: control characters (line ends in a
/// body) escaped.
pub(crate) fn one_line(text: &str) -> String {
    text.chars().flat_map(|c| if c.is_control() { c.escape_default().collect() } else { vec![c] }).collect()
}

/// One line of `idem stuck`'s table.
pub(crate) fn stuck_line(r: &Record) -> String {
    let mut line = format!("{:<13} {} fence {}", r.state.as_str(), scope_and_key(&r.scope, &r.key), r.fence);
    if let Some(owner) = &r.owner {
        line.push_str(&format!(" owner {owner}"));
    }
    if let Some(left) = r.lease_left_ms() {
        line.push_str(&format!(", lease passed {} ago", span(-left)));
    }
    if let Some(age) = r.age_ms() {
        line.push_str(&format!(", age {}", span(age)));
    }
    if let Some(stopped) = stopped(r) {
        line.push_str(&format!(", stopped {stopped}"));
    }
    line
}

/// Which record, for a terminal: `scope S key K`.
pub(crate) fn scope_and_key(scope: &str, key: &str) -> String {
    format!("scope {} key {}", shown(scope), shown_key(key))
}

/// The parts of a stored key (the guard's key parts; the HTTP layer's
/// tenant and key), `None` when hashed.
pub(crate) fn key_parts(stored: &str) -> Option<Vec<String>> {
    Key::from_stored(stored.to_owned()).parts()
}

/// A stored key for a terminal: as the guard was given it (a composite
/// key's parts in parentheses), and the stored form after it when that
/// differs (what `--stored --key` takes).
fn shown_key(stored: &str) -> String {
    match key_parts(stored).as_deref() {
        Some([one]) if one == stored => shown(one),
        Some([one]) => format!("{} (stored {})", shown(one), shown(stored)),
        Some(parts) => {
            let parts: Vec<String> = parts.iter().map(|p| format!("{p:?}")).collect();
            format!("({}) (stored {})", parts.join(", "), shown(stored))
        }
        None => shown(stored),
    }
}

/// A scope or key for a terminal: as it is when it is plain, quoted and
/// escaped (Rust string syntax) when it holds spaces, quotes or control
/// characters.
pub(crate) fn shown(text: &str) -> String {
    let plain = !text.is_empty() && !text.chars().any(|c| c.is_whitespace() || c.is_control() || c == '"' || c == '\'');
    if plain { text.to_owned() } else { format!("{text:?}") }
}

pub(crate) fn plural<N: PartialEq + From<u8>>(n: N) -> &'static str {
    if n == N::from(1) { "" } else { "s" }
}

/// An epoch-milliseconds time as RFC 3339 (UTC).
fn timestamp(ms: i64) -> String {
    let at = if ms >= 0 {
        UNIX_EPOCH + Duration::from_millis(ms as u64)
    } else {
        UNIX_EPOCH - Duration::from_millis(ms.unsigned_abs())
    };
    humantime::format_rfc3339_millis(at).to_string()
}

/// A length of time in milliseconds, to the second (to the millisecond
/// under one).
pub(crate) fn span(ms: i64) -> String {
    let ms = ms.unsigned_abs();
    if ms < 1000 { format!("{ms}ms") } else { humantime::format_duration(Duration::from_secs(ms / 1000)).to_string() }
}

/// `in 5s` or `5s ago`.
fn relative(ms: i64) -> String {
    if ms >= 0 { format!("in {}", span(ms)) } else { format!("{} ago", span(ms)) }
}
