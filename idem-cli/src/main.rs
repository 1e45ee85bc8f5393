//! `idem`: operate idem's records from a shell. Every command is a call of
//! the runtime's public functions (`idem::migrate`, `idem::admin::*`,
//! `idem::purge_expired`, `RedisStore::inspect_lease` ...), so a program
//! can do the same.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use clap::Parser;
use idem_runtime::admin::{PurgePreview, Record, RecordId, RecordState, Release};
use idem_runtime::{PurgeOptions, PurgeReport};
use serde_json::json;

mod answer;
mod connect;
mod error;
mod opt;
mod render;
mod store;

use error::{Failure, argument_error};
use opt::{Cli, Command, PurgeArgs, StuckArgs};
use render::{Done, Out, json_record, key_parts, plural, shown, shown_key, span, stuck_line, text_record};
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
