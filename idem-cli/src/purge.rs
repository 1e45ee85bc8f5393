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
    let document = if dry_run { count(sql, &options, out).await? } else { delete(sql, options, out).await? };
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

/// Which records the options name, after "records".
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
