//! MySQL/MariaDB: values as hexadecimal literals (`X'6b33'`), read back
//! as bytes (`CAST(response AS BINARY)`), so that neither way depends on
//! the session's charset; MySQL has no `PREPARE` the texts could name
//! without session variables.

use sqlx::MySql;

use crate::store::sql::NewRecord;
use crate::store::sql::texts::{Texts, TxSql};
use crate::table::RecordTable;

impl TxSql for MySql {
    fn texts(t: &RecordTable) -> Option<Texts> {
        Some(Texts {
            commit: "COMMIT AND NO CHAIN NO RELEASE",
            table: t.qualified().to_owned(),
            prepared: None,
            claim,
            read,
            discard_expired,
            complete,
            // The scalar subquery of two rows (error 1242).
            no_record: "21000",
            insert_done,
            table_name: t.name().to_owned(),
        })
    }

    const ROLLBACK: &'static str = "ROLLBACK AND NO CHAIN NO RELEASE";
}

fn claim(texts: &Texts, r: &NewRecord<'_>, _prepared: bool) -> String {
    format!(
        "INSERT INTO {} (scope, idem_key, status, fingerprint, created_at, updated_at, expires_at) \
         VALUES ({}, {}, 'PROCESSING', {}, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), \
         UTC_TIMESTAMP(6) + INTERVAL {} MICROSECOND)",
        texts.table,
        bytes(r.scope),
        bytes(r.key),
        r.fingerprint.map_or_else(|| "NULL".to_owned(), text),
        i64::try_from(r.retention.as_micros()).unwrap_or(i64::MAX),
    )
}

/// `claim = "commit"`: a plain `INSERT`, whose duplicate-key error (1062)
/// stops the text before its `COMMIT`.
fn insert_done(texts: &Texts, r: &NewRecord<'_>, response: Option<&str>) -> String {
    format!(
        "INSERT INTO {} (scope, idem_key, status, fingerprint, response, created_at, updated_at, expires_at) \
         VALUES ({}, {}, 'DONE', {}, {}, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), \
         UTC_TIMESTAMP(6) + INTERVAL {} MICROSECOND)",
        texts.table,
        bytes(r.scope),
        bytes(r.key),
        r.fingerprint.map_or_else(|| "NULL".to_owned(), text),
        response.map_or_else(|| "NULL".to_owned(), text),
        i64::try_from(r.retention.as_micros()).unwrap_or(i64::MAX),
    )
}

fn read(texts: &Texts, scope: &str, key: &str, _prepared: bool) -> String {
    format!(
        "SELECT CAST(status AS BINARY), CAST(fingerprint AS BINARY), CAST(response AS BINARY), \
         CAST(expires_at <= UTC_TIMESTAMP(6) AS SIGNED) FROM {} WHERE {}",
        texts.table,
        key_where(scope, key)
    )
}

fn discard_expired(texts: &Texts, scope: &str, key: &str) -> String {
    format!("DELETE FROM {} WHERE {} AND expires_at <= UTC_TIMESTAMP(6)", texts.table, key_where(scope, key))
}

fn complete(texts: &Texts, scope: &str, key: &str, response: &str) -> String {
    // No record updated: the scalar subquery returns two rows (error
    // 1242), which stops the text before its COMMIT. A `SELECT` of its
    // own, so that no variable of the session's is set (a `SET
    // @name = ...` would overwrite the application's `@name`; `DO`
    // would turn the error into a warning).
    format!(
        "UPDATE {} SET status = 'DONE', response = {}, updated_at = UTC_TIMESTAMP(6) WHERE {}; \
         SELECT (SELECT 1 UNION ALL SELECT 2 FROM DUAL WHERE ROW_COUNT() <> 1)",
        texts.table,
        text(response),
        key_where(scope, key)
    )
}

/// A `VARBINARY` value as a text statement carries it: a hexadecimal
/// literal (`X'6b33'`), only hex digits between the quotes whatever the
/// value holds, and a literal (no function call to plan).
fn bytes(s: &str) -> String {
    format!("X'{}'", crate::key::hex(s.as_bytes()))
}

/// A string for a text column: a hexadecimal literal read as UTF-8.
fn text(s: &str) -> String {
    format!("_utf8mb4 X'{}'", crate::key::hex(s.as_bytes()))
}

fn key_where(scope: &str, key: &str) -> String {
    format!("scope = {} AND idem_key = {}", bytes(scope), bytes(key))
}
