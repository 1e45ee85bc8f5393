//! `idem`: operate idem's records from a shell. Every command is a call of
//! the runtime's public functions (`idem::migrate`, `idem::admin::*`,
//! `idem::purge_expired`, `RedisStore::inspect_lease` ...), so a program
//! can do the same.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::{Duration, UNIX_EPOCH};

use clap::Parser;
use idem_runtime::admin::{PurgePreview, Record, RecordId, RecordState, Release};
use idem_runtime::{Key, PurgeOptions, PurgeReport, RecordStatus};
use serde_json::{Value, json};

mod connect;
mod error;
mod opt;
mod store;

use error::{Failure, argument_error};
use opt::{Cli, Command, PurgeArgs, StuckArgs};
use store::{Sql, Store};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return argument_error(e),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let json = cli.json;
    match runtime.block_on(run(cli)) {
        Ok(Done { document, failure }) => {
            if json {
                println!("{document}");
            }
            failure.map_or(ExitCode::SUCCESS, Failure::exit)
        }
        Err(f) => {
            if json {
                println!("{}", f.to_json());
            }
            f.exit()
        }
    }
}

/// What a command printed as JSON (with `--json`), and whether it failed
/// after producing it (a refused release).
struct Done {
    document: Value,
    failure: Option<Failure>,
}

impl Done {
    fn ok(document: Value) -> Done {
        Done { document, failure: None }
    }
}

async fn run(cli: Cli) -> Result<Done, Failure> {
    let out = Out { json: cli.json };
    let Cli { stores: given, table, command, .. } = cli;
    // In each arm the same order of checks: the stores given, the table,
    // the record; then the stores are reached.
    match command {
        Command::Migrate => {
            let url = given.database_url()?;
            use_table(&table)?;
            migrate(&connect::sql(url, true).await?, &out).await
        }
        Command::Inspect(target) => {
            given.any()?;
            use_table(&table)?;
            let id = target.id()?;
            inspect(&connect::each(&given).await?, &id, &out).await
        }
        Command::Stuck(args) => {
            given.any()?;
            use_table(&table)?;
            stuck(&connect::each(&given).await?, &args, &out).await
        }
        Command::Release(args) => {
            given.any()?;
            use_table(&table)?;
            let id = args.target.id()?;
            release(&connect::each(&given).await?, &id, args.yes, &out).await
        }
        Command::Purge(args) => {
            let url = given.database_url()?;
            use_table(&table)?;
            purge(&connect::sql(url, false).await?, args, &out).await
        }
    }
}

/// The record table the application names (`--table`).
fn use_table(table: &str) -> Result<(), Failure> {
    idem_runtime::set_record_table(table).map_err(|e| Failure::usage(e.to_string()))
}

/// Text output (stdout), unless `--json`.
struct Out {
    json: bool,
}

impl Out {
    fn say(&self, text: impl std::fmt::Display) {
        if !self.json {
            println!("{text}");
        }
    }
}

async fn migrate(sql: &Sql, out: &Out) -> Result<Done, Failure> {
    let name = sql.name();
    sql.migrate().await?;
    let table = idem_runtime::record_table();
    out.say(format_args!("{name}: {table} and {} are in place", table.archive()));
    Ok(Done::ok(json!({ "command": "migrate", "stores": [{ "store": name, "migrated": true }] })))
}

async fn inspect(stores: &[Store], id: &RecordId, out: &Out) -> Result<Done, Failure> {
    let mut found = Vec::new();
    for (store, record) in read_each(stores, id).await? {
        let name = store.name();
        match &record {
            Some(r) => out.say(text_record(name, r)),
            None => {
                out.say(format_args!("{name}: no record for scope {} key {}", shown(id.scope()), shown_key(id.key())))
            }
        }
        found.push(json!({ "store": name, "record": record.as_ref().map(json_record) }));
    }
    Ok(Done::ok(json!({
        "command": "inspect",
        "scope": id.scope(),
        "key": id.key(),
        "key_parts": key_parts(id.key()),
        "stores": found,
    })))
}

/// The record of `id` in each store given; all read before any is shown.
async fn read_each<'s>(stores: &'s [Store], id: &RecordId) -> Result<Vec<(&'s Store, Option<Record>)>, Failure> {
    let mut read = Vec::new();
    for store in stores {
        read.push((store, store.inspect(id).await?));
    }
    Ok(read)
}

async fn stuck(stores: &[Store], args: &StuckArgs, out: &Out) -> Result<Done, Failure> {
    let limit = args.limit;
    let mut listed = Vec::new();
    let mut total = 0;
    for store in stores {
        // One more than asked: whether there are more.
        let mut records = store.stuck(args.scope.as_deref(), limit as usize + 1).await?;
        let more = records.len() > limit as usize;
        records.truncate(limit as usize);
        listed.push((store.name(), records, more));
    }
    let mut documents = Vec::new();
    for (name, records, more) in listed {
        total += records.len();
        if records.is_empty() {
            out.say(format_args!("{name}: no stuck records"));
        } else {
            out.say(format_args!(
                "{name}: {} stuck record{}{}",
                records.len(),
                plural(records.len()),
                if more { format!(" (more: raise --limit, currently {limit})") } else { String::new() }
            ));
            for r in &records {
                out.say(format_args!("  {}", stuck_line(r)));
            }
        }
        documents.push(json!({
            "store": name,
            "records": records.iter().map(json_record).collect::<Vec<_>>(),
            "more": more,
        }));
    }
    if total > 0 {
        out.say(
            "Release one with: idem release --scope SCOPE --key KEY (a key of two parts: --tenant PART1 --key \
             PART2), or --stored with the scope and stored key as listed",
        );
    }
    Ok(Done::ok(json!({ "command": "stuck", "stores": documents })))
}

async fn release(stores: &[Store], id: &RecordId, yes: bool, out: &Out) -> Result<Done, Failure> {
    let mut documents = Vec::new();
    let mut failures = Vec::new();
    let mut released = 0;
    for (store, record) in read_each(stores, id).await? {
        let name = store.name();
        let Some(record) = record else {
            out.say(format_args!("{name}: no record for scope {} key {}", shown(id.scope()), shown_key(id.key())));
            documents.push(json!({ "store": name, "outcome": "not_found", "record": null }));
            continue;
        };
        out.say(text_record(name, &record));
        if !record.state.is_stuck() {
            failures.push(format!("{name}: not released: {}", not_stuck_reason(&record)));
            documents.push(json!({ "store": name, "outcome": "not_stuck", "record": json_record(&record) }));
            continue;
        }
        if !yes {
            match confirm(name) {
                Ok(true) => {}
                Ok(false) => {
                    failures.push(format!("{name}: not released: not confirmed"));
                    documents
                        .push(json!({ "store": name, "outcome": "not_confirmed", "record": json_record(&record) }));
                    continue;
                }
                Err(why) => {
                    failures.push(format!("{name}: not released: {why}"));
                    documents
                        .push(json!({ "store": name, "outcome": "not_confirmed", "record": json_record(&record) }));
                    continue;
                }
            }
        }
        let outcome = store.release(id, record.fence).await?;
        let (word, now) = match &outcome {
            Release::Released(_) => {
                released += 1;
                out.say(format_args!("{name}: released: the next call of this key runs its body again"));
                ("released", None)
            }
            Release::NotFound => {
                failures.push(format!("{name}: not released: the record was removed meanwhile"));
                ("not_found", None)
            }
            Release::NotStuck(now) => {
                failures.push(format!("{name}: not released: it changed meanwhile: {}", not_stuck_reason(now)));
                ("not_stuck", Some(now))
            }
            Release::FenceChanged(now) => {
                failures.push(format!(
                    "{name}: not released: a worker took it over meanwhile (fence {} -> {}); look again",
                    record.fence, now.fence
                ));
                ("fence_changed", Some(now))
            }
            _ => ("unknown", None),
        };
        documents.push(json!({
            "store": name,
            "outcome": word,
            "record": json_record(now.unwrap_or(&record)),
        }));
    }
    if released == 0 && failures.is_empty() {
        failures.push(format!(
            "no record for scope {} key {} in any store given",
            shown(id.scope()),
            shown_key(id.key())
        ));
    }
    let document = json!({ "command": "release", "released": released, "stores": documents });
    let failure = (!failures.is_empty()).then(|| Failure::error(failures.join("; ")));
    Ok(Done { document, failure })
}

/// Ask on the terminal; `Err` when there is none to ask on.
fn confirm(store: &str) -> Result<bool, &'static str> {
    if !std::io::stdin().is_terminal() {
        return Err("confirmation needed and stdin is not a terminal: pass --yes to release without asking");
    }
    eprint!("Release this record in {store}? The next call of its key will run its body again. [y/N] ");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    std::io::stdin().read_line(&mut answer).map_err(|_| "could not read the answer")?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes"))
}

fn not_stuck_reason(r: &Record) -> String {
    match r.state {
        RecordState::Running => format!(
            "its lease is live (a worker holds it for {} more); a record is released only once its lease has passed",
            span(r.lease_left_ms().unwrap_or(0))
        ),
        RecordState::Done => "it is DONE: repeats replay its answer; `idem purge` deletes completed records".to_owned(),
        RecordState::Expired => {
            "it is past its retention: guards ignore it already, and `idem purge` deletes it".to_owned()
        }
        state => format!("it is {} (only stuck records are released)", state.as_str()),
    }
}

async fn purge(sql: &Sql, args: PurgeArgs, out: &Out) -> Result<Done, Failure> {
    let PurgeArgs { scope, older_than, archive, dry_run, batch_size } = args;
    let options = PurgeOptions { batch_size, archive, scope, older_than, ..Default::default() };
    let name = sql.name();
    let what = match (&options.scope, options.older_than) {
        (None, None) => "past their retention".to_owned(),
        (Some(s), None) => format!("of scope {} past their retention", shown(s)),
        (None, Some(d)) => format!("past their retention or older than {}", humantime::format_duration(d)),
        (Some(s), Some(d)) => {
            format!("of scope {} past their retention or older than {}", shown(s), humantime::format_duration(d))
        }
    };
    let document = if dry_run {
        let PurgePreview { deleted, archived } = sql.purge_preview(&options).await?;
        let archive = if options.archive { format!(", {archived} of them archived first") } else { String::new() };
        out.say(format_args!("{name}: would delete {deleted} record{} {what}{archive} (dry run)", plural(deleted)));
        json!({ "store": name, "dry_run": true, "deleted": deleted, "archived": archived })
    } else {
        let archive = options.archive;
        let PurgeReport { deleted, batches } = sql.purge(options).await?;
        let archive = if archive { " (completed ones archived first)" } else { "" };
        out.say(format_args!(
            "{name}: deleted {deleted} record{} {what} in {batches} batch{}{archive}",
            plural(deleted),
            if batches == 1 { "" } else { "es" }
        ));
        json!({ "store": name, "dry_run": false, "deleted": deleted, "batches": batches })
    };
    Ok(Done::ok(json!({ "command": "purge", "stores": [document] })))
}

/// How many characters of a stored response (or of a text body) are shown.
const PREVIEW_CHARS: usize = 200;

/// How many bytes of a body that is not text are shown, in hex.
const PREVIEW_BYTES: usize = 64;

/// `text` cut to at most `max` characters, and whether it was cut.
fn preview(text: &str, max: usize) -> (&str, bool) {
    match text.char_indices().nth(max) {
        None => (text, false),
        Some((at, _)) => (&text[..at], true),
    }
}

/// A record's answer, as shown.
enum Answer<'a> {
    /// None yet (not done).
    Pending,
    /// Done, and its answer was not kept (NULL or empty): "completed,
    /// answer not kept".
    NotKept,
    /// A response the HTTP layer stored, decoded.
    Http(HttpResponse),
    /// Any other answer: its JSON.
    Json(&'a str),
}

fn answer(r: &Record) -> Answer<'_> {
    match r.response.as_deref() {
        None | Some("") if r.status == RecordStatus::Done => Answer::NotKept,
        None | Some("") => Answer::Pending,
        Some(text) => http_response(text).map_or(Answer::Json(text), Answer::Http),
    }
}

/// A response as the HTTP layer (`idem::http`) stores it.
struct HttpResponse {
    status: u16,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
}

/// `text` decoded if it is the HTTP layer's stored form, JSON
/// `{"status": 201, "headers": [[name, base64]], "body": base64}` (exactly
/// those fields, the base64 valid); `None` for any other answer.
fn http_response(text: &str) -> Option<HttpResponse> {
    use base64::Engine as _;
    let base64 = base64::engine::general_purpose::STANDARD;
    let Value::Object(fields) = serde_json::from_str::<Value>(text).ok()? else { return None };
    if fields.len() != 3 {
        return None;
    }
    let status = u16::try_from(fields.get("status")?.as_u64()?).ok().filter(|s| (100..=999).contains(s))?;
    let headers = fields
        .get("headers")?
        .as_array()?
        .iter()
        .map(|pair| match pair.as_array()?.as_slice() {
            [name, value] => Some((name.as_str()?.to_owned(), base64.decode(value.as_str()?).ok()?)),
            _ => None,
        })
        .collect::<Option<Vec<_>>>()?;
    let body = base64.decode(fields.get("body")?.as_str()?).ok()?;
    Some(HttpResponse { status, headers, body })
}

/// `bytes` as text when they are UTF-8 with no control characters but
/// tabs and line ends (a JSON or HTML body, a header value); `None` for
/// anything else, shown in hex.
fn as_text(bytes: &[u8]) -> Option<&str> {
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

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Text for one line of a terminal: control characters (line ends in a
/// body) escaped.
fn one_line(text: &str) -> String {
    text.chars().flat_map(|c| if c.is_control() { c.escape_default().collect() } else { vec![c] }).collect()
}

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

fn json_record(r: &Record) -> Value {
    let (response_preview, truncated) = match r.response.as_deref().map(|t| preview(t, PREVIEW_CHARS)) {
        Some((p, cut)) => (Some(p), cut),
        None => (None, false),
    };
    let answer = answer(r);
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
    })
}

fn text_record(store: &str, r: &Record) -> String {
    let mut lines = vec![format!("{store}: scope {} key {}", shown(&r.scope), shown_key(&r.key))];
    let mut field = |name: &str, value: String| lines.push(format!("  {name:<12}{value}"));
    let meaning = match r.state {
        RecordState::Running => "running: a worker holds a live lease",
        RecordState::LeasePassed => "STUCK: the lease passed (worker died?); the next call takes it over",
        RecordState::Unfinished => "STUCK: unfinished (committed without its answer); repeats fail until released",
        RecordState::Done => "done: repeats replay its answer",
        RecordState::Failed => "failed",
        RecordState::Expired => "expired: past its retention; ignored by guards, deleted by a purge",
        _ => "",
    };
    field("status", format!("{} ({meaning})", r.status.as_str()));
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
    match answer(r) {
        Answer::Pending => field("response", "-".to_owned()),
        Answer::NotKept => field("response", "answer not kept (the call completed; its answer was not stored)".into()),
        Answer::Json(text) => field(
            "response",
            match preview(text, PREVIEW_CHARS) {
                (p, false) => one_line(p),
                (p, true) => format!("{}… ({} bytes in all)", one_line(p), text.len()),
            },
        ),
        Answer::Http(response) => {
            let headers = response.headers.len();
            field(
                "response",
                format!("HTTP {} ({headers} header{}, stored by the HTTP layer)", response.status, plural(headers)),
            );
            for (name, value) in &response.headers {
                let value = match as_text(value) {
                    Some(text) => one_line(text),
                    None => format!("(hex) {}", hex(value)),
                };
                lines.push(format!("    {name}: {value}"));
            }
            let body = match body_preview(&response.body) {
                _ if response.body.is_empty() => "(empty)".to_owned(),
                BodyPreview::Text(text, false) => one_line(text),
                BodyPreview::Text(text, true) => format!("{}… ({} bytes in all)", one_line(text), response.body.len()),
                BodyPreview::Hex(hex, false) => format!("(hex, {} bytes) {hex}", response.body.len()),
                BodyPreview::Hex(hex, true) => {
                    format!("(hex, {} bytes, the first {PREVIEW_BYTES} shown) {hex}…", response.body.len())
                }
            };
            lines.push(format!("  {:<12}{body}", "body"));
        }
    }
    lines.join("\n")
}

fn stuck_line(r: &Record) -> String {
    let mut line =
        format!("{:<13} scope {} key {} fence {}", r.state.as_str(), shown(&r.scope), shown_key(&r.key), r.fence);
    if let Some(owner) = &r.owner {
        line.push_str(&format!(" owner {owner}"));
    }
    if let Some(left) = r.lease_left_ms() {
        line.push_str(&format!(", lease passed {} ago", span(-left)));
    }
    if let Some(age) = r.age_ms() {
        line.push_str(&format!(", age {}", span(age)));
    }
    line
}

/// The parts of a stored key (the guard's key parts; the HTTP layer's
/// tenant and key), `None` when hashed.
fn key_parts(stored: &str) -> Option<Vec<String>> {
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
fn shown(text: &str) -> String {
    let plain = !text.is_empty() && !text.chars().any(|c| c.is_whitespace() || c.is_control() || c == '"' || c == '\'');
    if plain { text.to_owned() } else { format!("{text:?}") }
}

fn plural<N: PartialEq + From<u8>>(n: N) -> &'static str {
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
fn span(ms: i64) -> String {
    let ms = ms.unsigned_abs();
    if ms < 1000 { format!("{ms}ms") } else { humantime::format_duration(Duration::from_secs(ms / 1000)).to_string() }
}

/// `in 5s` or `5s ago`.
fn relative(ms: i64) -> String {
    if ms >= 0 { format!("in {}", span(ms)) } else { format!("{} ago", span(ms)) }
}
