//! SQLite: no texts (there is no network to save); the `Tx` sends the
//! plain statements, one by one, in a transaction it begins lazily.

use sqlx::Sqlite;
use sqlx::sqlite::SqliteConnection;

use crate::store::sql::ExistingRecord;
use crate::store::sql::texts::{Texts, TxSql};

impl TxSql for Sqlite {
    const TEXTS: Option<&'static Texts> = None;

    async fn execute_text(conn: &mut SqliteConnection, text: sqlx::SqlStr) -> Result<u64, sqlx::Error> {
        Ok(sqlx::raw_sql(text).execute(conn).await?.rows_affected())
    }

    async fn read_text_record(
        conn: &mut SqliteConnection,
        text: sqlx::SqlStr,
    ) -> Result<Option<ExistingRecord>, sqlx::Error> {
        let row = sqlx::raw_sql(text).fetch_optional(conn).await?;
        row.map(|row| crate::store::sql::decode_existing(&row)).transpose()
    }
}
