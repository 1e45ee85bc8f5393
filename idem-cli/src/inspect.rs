//! `idem inspect`: show one record, in each store given; of a call with no
//! record (its last attempt failed, or stopped in doubt), its steps.

use idem_runtime::admin::{Record, RecordId};
use serde_json::json;

use crate::error::Failure;
use crate::render::{Done, Out, json_record, json_steps, key_parts, log_steps, scope_and_key, step_lines, text_record};
use crate::store::Store;

pub(crate) async fn run(stores: &[Store], id: &RecordId, out: &Out) -> Result<Done, Failure> {
    let mut found = Vec::new();
    for (store, record) in read_each(stores, id).await? {
        let name = store.name();
        let mut entry = json!({ "store": name, "record": record.as_ref().map(json_record) });
        match &record {
            Some(r) => out.say(text_record(name, r)),
            None => {
                // Steps outlive a record that a failed attempt removed.
                let log = store.steps(id).await?;
                let steps = log_steps(id.scope(), id.key(), &log);
                out.say(format_args!("{name}: no record for {}", scope_and_key(id.scope(), id.key())));
                if !steps.is_empty() {
                    out.say("  (the call is not running: its last attempt failed, or stopped in doubt)");
                    for line in step_lines(&steps) {
                        out.say(line);
                    }
                }
                let (steps, in_flight) = json_steps(&steps);
                (entry["steps"], entry["in_flight"]) = (steps, in_flight);
            }
        }
        found.push(entry);
    }
    Ok(Done::ok(json!({
        "command": "inspect",
        "scope": id.scope(),
        "key": id.key(),
        "key_parts": key_parts(id.key()),
        "stores": found,
    })))
}

/// The record of `id` in each store given, all read before any is shown:
/// a store that fails fails the command before it says anything.
pub(crate) async fn read_each<'s>(
    stores: &'s [Store],
    id: &RecordId,
) -> Result<Vec<(&'s Store, Option<Record>)>, Failure> {
    let mut read = Vec::new();
    for store in stores {
        read.push((store, store.inspect(id).await?));
    }
    Ok(read)
}
