//! SQLite: no texts (there is no network to save); the `Tx` sends the
//! plain statements, one by one, in a transaction it begins lazily.

use crate::store::sql::texts::TxSql;

impl TxSql for sqlx::Sqlite {}
