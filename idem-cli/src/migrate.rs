//! `idem migrate`: create the record table, its archive and the outbox.

use serde_json::json;

use crate::error::Failure;
use crate::render::{Done, Out};
use crate::store::Sql;

pub(crate) async fn run(sql: &Sql, out: &Out) -> Result<Done, Failure> {
    let name = sql.name();
    sql.migrate().await?;
    let table = idem_runtime::Stores::installed().map(|s| s.record_table().clone()).unwrap_or_default();
    let (archive, outbox) = (table.archive(), table.outbox());
    out.say(format_args!("{name}: {table}, {archive} and the outbox {outbox} are in place"));
    let tables = [table.qualified(), archive, outbox];
    Ok(Done::ok(json!({ "command": "migrate", "stores": [{ "store": name, "migrated": true, "tables": tables }] })))
}
