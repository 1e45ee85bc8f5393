//! `idem migrate`: create the record table and its archive.

use serde_json::json;

use crate::error::Failure;
use crate::render::{Done, Out};
use crate::store::Sql;

pub(crate) async fn run(sql: &Sql, out: &Out) -> Result<Done, Failure> {
    let name = sql.name();
    sql.migrate().await?;
    let table = idem_runtime::Stores::installed().map(|s| s.record_table().clone()).unwrap_or_default();
    out.say(format_args!("{name}: {table} and {} are in place", table.archive()));
    Ok(Done::ok(json!({ "command": "migrate", "stores": [{ "store": name, "migrated": true }] })))
}
