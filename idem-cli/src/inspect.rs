//! `idem inspect`: show one record, in each store given.

use idem_runtime::admin::{Record, RecordId};
use serde_json::json;

use crate::error::Failure;
use crate::render::{Done, Out, json_record, key_parts, scope_and_key, text_record};
use crate::store::Store;

pub(crate) async fn run(stores: &[Store], id: &RecordId, out: &Out) -> Result<Done, Failure> {
    let mut found = Vec::new();
    for (store, record) in read_each(stores, id).await? {
        let name = store.name();
        match &record {
            Some(r) => out.say(text_record(name, r)),
            None => out.say(format_args!("{name}: no record for {}", scope_and_key(id.scope(), id.key()))),
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
