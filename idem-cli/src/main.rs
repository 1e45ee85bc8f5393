//! `idem`: operate idem's records from a shell. Every command is a call of
//! the runtime's public functions (`idem::migrate`, `idem::admin::*`,
//! `idem::purge_expired`, `RedisStore::inspect_lease` ...), so a program
//! can do the same.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::{Duration, UNIX_EPOCH};

use clap::{Args, Parser, Subcommand};
use idem_runtime::admin::{self, PurgePreview, Record, RecordId, RecordState, Release, StuckQuery};
use idem_runtime::{Key, PurgeOptions, PurgeReport};
use serde_json::{Value, json};

mod connect;

use connect::{Sql, Stores};

const EXIT_CODES: &str = "\
Exit codes:
  0  done (inspect: also when there is no such record; the output says so)
  1  an error: a store unreachable or failing, tables missing, or a release
     refused (no such record, not stuck, taken over meanwhile, not confirmed)
  2  usage: bad arguments, or no store given for the command

Stores: --database-url (postgres://, postgresql://, mysql://, mariadb://,
sqlite:) and/or --redis-url (redis://, rediss://); or IDEM_DATABASE_URL and
IDEM_REDIS_URL. inspect, stuck and release act on each store given;
migrate and purge on the database.";

/// Operate idem's records: create the schema, look a record up, list and
/// release stuck records, purge old ones.
#[derive(Parser, Debug)]
#[command(name = "idem", version, after_help = EXIT_CODES)]
struct Cli {
    /// The SQL database holding idem_records: postgres://..., mysql://...
    /// (also mariadb://...), or sqlite:path.
    #[arg(long, env = "IDEM_DATABASE_URL", global = true, value_name = "URL", hide_env_values = true)]
    database_url: Option<String>,

    /// The Redis server holding lease records: redis://host:port/db.
    #[arg(long, env = "IDEM_REDIS_URL", global = true, value_name = "URL", hide_env_values = true)]
    redis_url: Option<String>,

    /// The key prefix of the application's RedisStore (`RedisStore::new(conn, prefix)`).
    #[arg(
        long,
        env = "IDEM_REDIS_PREFIX",
        global = true,
        value_name = "PREFIX",
        default_value = "idem:",
        hide_env_values = true
    )]
    redis_prefix: String,

    /// The record table, if the application names another than
    /// `idem_records` (`idem::set_record_table`): `name` or `schema.name`.
    #[arg(
        long,
        env = "IDEM_RECORD_TABLE",
        global = true,
        value_name = "TABLE",
        default_value = "idem_records",
        hide_env_values = true
    )]
    table: String,

    /// Print one JSON document on stdout instead of text (messages still go
    /// to stderr).
    #[arg(long, global = true)]
    json: bool,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Create the record table (idem_records, or --table) and its archive if missing (safe to
    /// repeat, and to run from several processes). SQL only: Redis needs no
    /// schema.
    Migrate,

    /// Show one record: status, state (running, lease passed, unfinished,
    /// done, expired), owner, fence, lease deadline, age, expiry and a
    /// preview of the stored response.
    Inspect(Target),

    /// List stuck records: PROCESSING with the lease passed (the worker
    /// died; the next call takes it over), or PROCESSING with no lease (an
    /// unfinished dedup record: repeats fail with Error::Unfinished until
    /// it is released). Records past their retention are not listed.
    Stuck {
        /// Only this scope, as the guard names it.
        #[arg(long)]
        scope: Option<String>,
        /// List at most this many records per store.
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
        limit: u32,
    },

    /// Delete one stuck record so that the next call of its key runs again.
    /// Shows the record and asks for confirmation (--yes skips it); refuses
    /// a record that is not stuck (running, done, expired), and one that a
    /// worker took over between the look and the delete.
    Release {
        #[command(flatten)]
        target: Target,
        /// Release without asking (needed when stdin is not a terminal).
        #[arg(long, short = 'y')]
        yes: bool,
    },

    /// Delete records past their retention (and, with --older-than, older
    /// completed ones), in bounded batches. SQL only: Redis drops records
    /// by TTL.
    Purge {
        /// Only this scope, as the guard names it.
        #[arg(long)]
        scope: Option<String>,
        /// Also delete records written longer ago than this (e.g. 30d, 12h),
        /// whatever their retention; PROCESSING records are never deleted
        /// this way (see `idem stuck` and `idem release`).
        #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
        older_than: Option<Duration>,
        /// Copy completed records into idem_records_archive before deleting
        /// them.
        #[arg(long)]
        archive: bool,
        /// Count what would be deleted; delete nothing.
        #[arg(long)]
        dry_run: bool,
        /// Records deleted per statement.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
        batch_size: u32,
    },
}

/// Which record.
#[derive(Args, Debug)]
struct Target {
    /// The guard's scope (its `scope = "..."`, or `module::function`).
    #[arg(long)]
    scope: String,
    /// The business key as the guard was given it (`key = "order.id"`: the
    /// id's value); idem derives the stored key as the guard does (escaping,
    /// hashing of keys over 128 bytes).
    #[arg(long)]
    key: String,
    /// --scope and --key are as stored, exactly as `idem stuck` lists them
    /// (a composite key's joined parts, a hashed `\sha256:...` key or scope).
    #[arg(long)]
    stored: bool,
}

impl Target {
    fn id(&self) -> Result<RecordId, Failure> {
        if self.stored {
            return Ok(RecordId::stored(self.scope.clone(), self.key.clone()));
        }
        let key = Key::new(self.key.as_str()).map_err(|e| match e {
            idem_runtime::Error::InvalidKey { reason, .. } => Failure::usage(format!("--key {:?}: {reason}", self.key)),
            e => Failure::usage(format!("--key {:?}: {e}", self.key)),
        })?;
        Ok(RecordId::new(&self.scope, &key))
    }
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(text).map_err(|e| format!("{e} (write e.g. 30d, 12h, 90min)"))?;
    if d.is_zero() { Err("give a duration above zero".to_owned()) } else { Ok(d) }
}

/// Why a command failed, and its exit code.
#[derive(Debug)]
pub(crate) struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    pub(crate) fn error(message: impl Into<String>) -> Failure {
        Failure { code: 1, message: message.into() }
    }

    pub(crate) fn usage(message: impl Into<String>) -> Failure {
        Failure { code: 2, message: message.into() }
    }
}

/// An idem error from `store`, with what to do about it.
pub(crate) fn store_failure(store: &str, e: idem_runtime::Error) -> Failure {
    match e {
        idem_runtime::Error::NotMigrated { source, .. } => Failure::error(format!(
            "{store}: the idem tables are missing ({source}): run `idem migrate` with the same --database-url"
        )),
        e => Failure::error(format!("{store}: {e}")),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
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
            match failure {
                None => ExitCode::SUCCESS,
                Some(f) => {
                    eprintln!("error: {}", f.message);
                    ExitCode::from(f.code)
                }
            }
        }
        Err(f) => {
            if json {
                println!("{}", json!({ "error": f.message, "exit_code": f.code }));
            }
            eprintln!("error: {}", f.message);
            ExitCode::from(f.code)
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
    let wants_sql_only = matches!(cli.command, Command::Migrate | Command::Purge { .. });
    if cli.database_url.is_none() && wants_sql_only {
        let why = if cli.redis_url.is_some() { " (Redis needs no schema and drops records by TTL)" } else { "" };
        return Err(Failure::usage(format!(
            "no SQL database given: pass --database-url URL (or set IDEM_DATABASE_URL){why}"
        )));
    }
    if cli.database_url.is_none() && cli.redis_url.is_none() {
        return Err(Failure::usage(
            "no store given: pass --database-url URL and/or --redis-url URL (or set IDEM_DATABASE_URL / IDEM_REDIS_URL)",
        ));
    }
    idem_runtime::set_record_table(&cli.table).map_err(|e| Failure::usage(e.to_string()))?;
    let create = matches!(cli.command, Command::Migrate);
    let redis_url = if wants_sql_only { None } else { cli.redis_url.as_deref() };
    let stores = Stores::connect(cli.database_url.as_deref(), redis_url, &cli.redis_prefix, create).await?;
    match cli.command {
        Command::Migrate => migrate(&stores, &out).await,
        Command::Inspect(target) => inspect(&stores, &target, &out).await,
        Command::Stuck { scope, limit } => stuck(&stores, scope, limit, &out).await,
        Command::Release { target, yes } => release(&stores, &target, yes, &out).await,
        Command::Purge { scope, older_than, archive, dry_run, batch_size } => {
            let options = PurgeOptions { batch_size, archive, scope, older_than, ..Default::default() };
            purge(&stores, options, dry_run, &out).await
        }
    }
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

async fn migrate(stores: &Stores, out: &Out) -> Result<Done, Failure> {
    let sql = stores.sql.as_ref().expect("checked: a database is given");
    let name = sql.name();
    sql::migrate(sql).await.map_err(|e| store_failure(name, e))?;
    let table = idem_runtime::record_table();
    out.say(format_args!("{name}: {table} and {} are in place", table.archive()));
    Ok(Done::ok(json!({ "command": "migrate", "stores": [{ "store": name, "migrated": true }] })))
}

async fn inspect(stores: &Stores, target: &Target, out: &Out) -> Result<Done, Failure> {
    let id = target.id()?;
    let mut found = Vec::new();
    for (name, record) in read_everywhere(stores, &id).await? {
        match &record {
            Some(r) => out.say(text_record(name, r)),
            None => out.say(format_args!("{name}: no record for scope {} key {}", shown(id.scope()), shown(id.key()))),
        }
        found.push(json!({ "store": name, "record": record.as_ref().map(json_record) }));
    }
    Ok(Done::ok(json!({
        "command": "inspect",
        "scope": id.scope(),
        "key": id.key(),
        "stores": found,
    })))
}

/// The record of `id` in each store given.
async fn read_everywhere(stores: &Stores, id: &RecordId) -> Result<Vec<(&'static str, Option<Record>)>, Failure> {
    let mut read = Vec::new();
    if let Some(sql) = &stores.sql {
        read.push((sql.name(), sql::inspect(sql, id).await.map_err(|e| store_failure(sql.name(), e))?));
    }
    if let Some(redis) = &stores.redis {
        read.push(("redis", redis.inspect_lease(id).await.map_err(|e| store_failure("redis", e))?));
    }
    Ok(read)
}

async fn stuck(stores: &Stores, scope: Option<String>, limit: u32, out: &Out) -> Result<Done, Failure> {
    let mut listed = Vec::new();
    let mut total = 0;
    if let Some(sql) = &stores.sql {
        // One more than asked: whether there are more.
        let query = StuckQuery { scope: scope.clone(), limit: limit.saturating_add(1), after: None };
        let mut records = sql::stuck(sql, &query).await.map_err(|e| store_failure(sql.name(), e))?;
        let more = records.len() > limit as usize;
        records.truncate(limit as usize);
        listed.push((sql.name(), records, more));
    }
    if let Some(redis) = &stores.redis {
        let mut records =
            redis.stuck_leases(scope.as_deref(), limit as usize + 1).await.map_err(|e| store_failure("redis", e))?;
        let more = records.len() > limit as usize;
        records.truncate(limit as usize);
        listed.push(("redis", records, more));
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
        out.say("Release one with: idem release --stored --scope SCOPE --key KEY (as listed)");
    }
    Ok(Done::ok(json!({ "command": "stuck", "stores": documents })))
}

async fn release(stores: &Stores, target: &Target, yes: bool, out: &Out) -> Result<Done, Failure> {
    let id = target.id()?;
    let mut documents = Vec::new();
    let mut failures = Vec::new();
    let mut released = 0;
    for (name, record) in read_everywhere(stores, &id).await? {
        let Some(record) = record else {
            out.say(format_args!("{name}: no record for scope {} key {}", shown(id.scope()), shown(id.key())));
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
        let outcome = match (&stores.redis, name) {
            (Some(redis), "redis") => redis.release_lease(&id, record.fence).await,
            _ => {
                let sql = stores.sql.as_ref().expect("the record was read from it");
                sql::release(sql, &id, record.fence).await
            }
        }
        .map_err(|e| store_failure(name, e))?;
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
        failures.push(format!("no record for scope {} key {} in any store given", shown(id.scope()), shown(id.key())));
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

async fn purge(stores: &Stores, options: PurgeOptions, dry_run: bool, out: &Out) -> Result<Done, Failure> {
    let sql = stores.sql.as_ref().expect("checked: a database is given");
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
        let PurgePreview { deleted, archived } =
            sql::purge_preview(sql, &options).await.map_err(|e| store_failure(name, e))?;
        let archive = if options.archive { format!(", {archived} of them archived first") } else { String::new() };
        out.say(format_args!("{name}: would delete {deleted} record{} {what}{archive} (dry run)", plural(deleted)));
        json!({ "store": name, "dry_run": true, "deleted": deleted, "archived": archived })
    } else {
        let archive = options.archive;
        let PurgeReport { deleted, batches } = sql::purge(sql, options).await.map_err(|e| store_failure(name, e))?;
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

/// The SQL functions, on whichever database the URL named.
mod sql {
    use super::*;

    macro_rules! on_pool {
        ($sql:expr, |$pool:ident| $body:expr) => {
            match $sql {
                Sql::Postgres($pool) => $body,
                Sql::Mysql($pool) => $body,
                Sql::Sqlite($pool) => $body,
            }
        };
    }

    pub(crate) async fn migrate(sql: &Sql) -> Result<(), idem_runtime::Error> {
        on_pool!(sql, |pool| idem_runtime::migrate(pool).await)
    }

    pub(crate) async fn inspect(sql: &Sql, id: &RecordId) -> Result<Option<Record>, idem_runtime::Error> {
        on_pool!(sql, |pool| admin::inspect(pool, id).await)
    }

    pub(crate) async fn stuck(sql: &Sql, query: &StuckQuery) -> Result<Vec<Record>, idem_runtime::Error> {
        on_pool!(sql, |pool| admin::stuck(pool, query).await)
    }

    pub(crate) async fn release(sql: &Sql, id: &RecordId, fence: i64) -> Result<Release, idem_runtime::Error> {
        on_pool!(sql, |pool| admin::release(pool, id, fence).await)
    }

    pub(crate) async fn purge_preview(sql: &Sql, o: &PurgeOptions) -> Result<PurgePreview, idem_runtime::Error> {
        on_pool!(sql, |pool| admin::purge_preview(pool, o).await)
    }

    pub(crate) async fn purge(sql: &Sql, o: PurgeOptions) -> Result<PurgeReport, idem_runtime::Error> {
        on_pool!(sql, |pool| idem_runtime::purge_expired(pool, o).await)
    }
}

/// How many characters of a stored response are shown.
const PREVIEW_CHARS: usize = 200;

/// `text` cut to at most `max` characters, and whether it was cut.
fn preview(text: &str, max: usize) -> (&str, bool) {
    match text.char_indices().nth(max) {
        None => (text, false),
        Some((at, _)) => (&text[..at], true),
    }
}

fn json_record(r: &Record) -> Value {
    let (response_preview, truncated) = match r.response.as_deref().map(|t| preview(t, PREVIEW_CHARS)) {
        Some((p, cut)) => (Some(p), cut),
        None => (None, false),
    };
    json!({
        "scope": r.scope,
        "key": r.key,
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
        "response_preview": response_preview,
        "response_truncated": truncated,
        "response_bytes": r.response.as_ref().map(String::len),
    })
}

fn text_record(store: &str, r: &Record) -> String {
    let mut lines = vec![format!("{store}: scope {} key {}", shown(&r.scope), shown(&r.key))];
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
    field(
        "response",
        match r.response.as_deref() {
            None => "-".to_owned(),
            Some(text) => match preview(text, PREVIEW_CHARS) {
                (p, false) => p.to_owned(),
                (p, true) => format!("{p}… ({} bytes in all)", text.len()),
            },
        },
    );
    lines.join("\n")
}

fn stuck_line(r: &Record) -> String {
    let mut line =
        format!("{:<13} scope {} key {} fence {}", r.state.as_str(), shown(&r.scope), shown(&r.key), r.fence);
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
