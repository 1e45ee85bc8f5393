//! `idem stuck`: list the stuck records of each store given.

use std::time::Duration;

use idem_runtime::admin::{Record, RecordState};
use idem_runtime::outbox::MessageCounts;
use serde_json::{Value, json};

use crate::error::Failure;
use crate::opt::StuckArgs;
use crate::outbox::waiting;
use crate::render::{Done, Out, json_record, plural, stopped, stuck_line};
use crate::store::Store;

/// What to do about a stuck record, once any is listed.
const HOW_TO_RELEASE: &str = "Release one with: idem release --scope SCOPE --key KEY (a key of two parts: --tenant \
                              PART1 --key PART2), or --stored with the scope and stored key as listed";

/// One store's stuck records, whether it has more than the limit, and a
/// database's outbox.
struct Listed {
    store: &'static str,
    records: Vec<Record>,
    more: bool,
    outbox: Outbox,
}

/// A store's outbox.
enum Outbox {
    /// Redis: the outbox lives in the database.
    NotSql,
    /// A database's: how many messages wait, how long the oldest pending
    /// one has; `None`, no outbox table (migrated before there was one).
    Waiting(Option<(MessageCounts, Option<Duration>)>),
}

pub(crate) async fn run(stores: &[Store], args: &StuckArgs, out: &Out) -> Result<Done, Failure> {
    let mut listed = Vec::new();
    for store in stores {
        listed.push(list(store, args).await?);
    }
    let mut documents = Vec::new();
    for one in &listed {
        say(one, args.limit, out);
        let mut document = document(one);
        if let Outbox::Waiting(outbox) = &one.outbox {
            document["outbox"] = waiting(one.store, outbox.as_ref(), out);
        }
        documents.push(document);
    }
    if listed.iter().any(|one| !one.records.is_empty()) {
        out.say(HOW_TO_RELEASE);
    }
    Ok(Done::ok(json!({ "command": "stuck", "stores": documents })))
}

async fn list(store: &Store, args: &StuckArgs) -> Result<Listed, Failure> {
    let limit = args.limit as usize;
    // One more than asked: whether there are more.
    let mut records = store.stuck(args.scope.as_deref(), limit + 1).await?;
    let more = records.len() > limit;
    records.truncate(limit);
    let outbox = match store {
        Store::Sql(sql) => Outbox::Waiting(sql.outbox_waiting(args.scope.as_deref()).await?),
        _ => Outbox::NotSql,
    };
    Ok(Listed { store: store.name(), records, more, outbox })
}

/// A store's records as text: a count, then the table.
fn say(listed: &Listed, limit: u32, out: &Out) {
    let Listed { store, records, more, .. } = listed;
    if records.is_empty() {
        out.say(format_args!("{store}: no stuck records"));
        return;
    }
    let more = if *more { format!(" (more: raise --limit, currently {limit})") } else { String::new() };
    out.say(format_args!("{store}: {} stuck record{}{more}", records.len(), plural(records.len())));
    for r in records {
        out.say(format_args!("  {}", stuck_line(r)));
    }
}

fn document(listed: &Listed) -> Value {
    json!({
        "store": listed.store,
        "records": listed.records.iter().map(json_stuck).collect::<Vec<_>>(),
        "more": listed.more,
    })
}

/// A stuck record as JSON: the record, and where its call stopped (for a
/// lease record: `stopped_after_step`, null before its first step).
fn json_stuck(r: &Record) -> Value {
    let mut record = json_record(r);
    let after = r.steps.last().filter(|_| r.state == RecordState::LeasePassed);
    record["stopped"] = json!(stopped(r));
    record["stopped_after_step"] = json!(after.map(|step| json!({ "number": step.number, "name": step.name })));
    record
}
