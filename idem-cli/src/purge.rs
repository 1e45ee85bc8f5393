//! `idem purge`: delete records past their retention (and, asked, older
//! ones), or count them first.

use idem_runtime::admin::PurgePreview;
use idem_runtime::sql::{PurgeOptions, PurgeReport};
use serde_json::{Value, json};

use crate::error::Failure;
use crate::opt::PurgeArgs;
use crate::render::{Done, Out, plural, shown};
use crate::store::Sql;

pub(crate) async fn run(sql: &Sql, args: PurgeArgs, out: &Out) -> Result<Done, Failure> {
    let PurgeArgs { scope, older_than, archive, dry_run, batch_size, pause, pause_factor } = args;
    let pause = pause.unwrap_or_default();
    let options = PurgeOptions { batch_size, pause, pause_factor, archive, scope, older_than, ..Default::default() };
    let mut document =
        if dry_run { count(sql, &options, out).await? } else { delete(sql, options.clone(), out).await? };
    document["outbox"] =
        if dry_run { count_sent(sql, &options, out).await? } else { delete_sent(sql, options, out).await? };
    Ok(Done::ok(json!({ "command": "purge", "stores": [document] })))
}

/// `--dry-run`: what a purge would delete.
async fn count(sql: &Sql, options: &PurgeOptions, out: &Out) -> Result<Value, Failure> {
    let name = sql.name();
    let PurgePreview { deleted, archived } = sql.purge_preview(options).await?;
    let archive = if options.archive { format!(", {archived} of them archived first") } else { String::new() };
    let what = which(options);
    out.say(format_args!("{name}: would delete {deleted} record{} {what}{archive} (dry run)", plural(deleted)));
    Ok(json!({ "store": name, "dry_run": true, "deleted": deleted, "archived": archived }))
}

async fn delete(sql: &Sql, options: PurgeOptions, out: &Out) -> Result<Value, Failure> {
    let name = sql.name();
    let (what, archive) = (which(&options), options.archive);
    let PurgeReport { deleted, batches } = sql.purge(options).await?;
    let archive = if archive { " (completed ones archived first)" } else { "" };
    out.say(format_args!(
        "{name}: deleted {deleted} record{} {what} in {batches} batch{}{archive}",
        plural(deleted),
        if batches == 1 { "" } else { "es" }
    ));
    Ok(json!({ "store": name, "dry_run": false, "deleted": deleted, "batches": batches }))
}

/// `--dry-run`: the outbox's sent messages a purge would delete.
async fn count_sent(sql: &Sql, options: &PurgeOptions, out: &Out) -> Result<Value, Failure> {
    let name = sql.name();
    let Some(deleted) = sql.purge_sent_preview(options).await? else { return Ok(no_outbox(name, out)) };
    let what = which(options);
    out.say(format_args!("{name}: would delete {deleted} sent outbox message{} {what} (dry run)", plural(deleted)));
    Ok(json!({ "table": true, "deleted": deleted }))
}

/// The outbox's sent messages, after the records: purged by the same
/// options (the call's retention, and --older-than).
async fn delete_sent(sql: &Sql, options: PurgeOptions, out: &Out) -> Result<Value, Failure> {
    let name = sql.name();
    let what = which(&options);
    let Some(PurgeReport { deleted, batches }) = sql.purge_sent(options).await? else {
        return Ok(no_outbox(name, out));
    };
    out.say(format_args!(
        "{name}: deleted {deleted} sent outbox message{} {what} in {batches} batch{}",
        plural(deleted),
        if batches == 1 { "" } else { "es" }
    ));
    Ok(json!({ "table": true, "deleted": deleted, "batches": batches }))
}

/// A database migrated before the outbox: nothing to purge there.
fn no_outbox(name: &str, out: &Out) -> Value {
    out.say(format_args!("{name}: no outbox table: no sent messages to purge"));
    json!({ "table": false })
}

/// Which records (or messages) the options name, after "records".
fn which(options: &PurgeOptions) -> String {
    match (&options.scope, options.older_than) {
        (None, None) => "past their retention".to_owned(),
        (Some(s), None) => format!("of scope {} past their retention", shown(s)),
        (None, Some(d)) => format!("past their retention or older than {}", humantime::format_duration(d)),
        (Some(s), Some(d)) => {
            format!("of scope {} past their retention or older than {}", shown(s), humantime::format_duration(d))
        }
    }
}
