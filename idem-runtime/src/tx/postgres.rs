//! PostgreSQL: the claim and the read prepared once per session and named
//! by the texts; values as escape-string literals (or hex converted by the
//! server) that nothing of the value can break out of.

use sqlx::Postgres;
use sqlx::postgres::PgConnection;

use crate::store::sql::texts::{Prepared, Texts, TxSql};
use crate::store::sql::{ExistingRecord, NewRecord};

impl TxSql for Postgres {
    const TEXTS: Option<&'static Texts> = Some(&Texts {
        commit: "COMMIT; BEGIN",
        prepared: Some(Prepared {
            claim: || session_statements().prepare_claim.clone(),
            read: || session_statements().prepare_read.clone(),
            is_unprepared: |e| e.as_database_error().and_then(|d| d.code()).is_some_and(|c| c == "26000"),
        }),
        claim,
        read,
        discard_expired,
        complete,
        // `1 / count(*)` of no rows: division by zero.
        no_record: "22012",
    });

    async fn execute_text(conn: &mut PgConnection, text: sqlx::SqlStr) -> Result<u64, sqlx::Error> {
        Ok(sqlx::raw_sql(text).execute(conn).await?.rows_affected())
    }

    async fn read_text_record(
        conn: &mut PgConnection,
        text: sqlx::SqlStr,
    ) -> Result<Option<ExistingRecord>, sqlx::Error> {
        let row = sqlx::raw_sql(text).fetch_optional(conn).await?;
        row.map(|row| crate::store::sql::decode_existing(&row)).transpose()
    }
}

fn claim(r: &NewRecord<'_>, prepared: bool) -> String {
    let (scope, key) = (text(r.scope), text(r.key));
    let fingerprint = r.fingerprint.map_or_else(|| "NULL".to_owned(), text);
    let us = retention_us(r.retention);
    if prepared {
        return format!("EXECUTE {}({scope}, {key}, {fingerprint}, {us})", session_statements().claim);
    }
    claim_sql(table(), &scope, &key, &fingerprint, &us.to_string())
}

fn read(scope: &str, key: &str, prepared: bool) -> String {
    if prepared {
        return format!("EXECUTE {}({}, {})", session_statements().read, text(scope), text(key));
    }
    read_sql(table(), &key_text(scope), &key_text(key))
}

fn discard_expired(scope: &str, key: &str) -> String {
    format!(
        "DELETE FROM {} WHERE scope = {} AND idem_key = {} AND expires_at <= now()",
        table(),
        key_text(scope),
        key_text(key)
    )
}

/// Always written out, never the `EXECUTE` of a prepared statement:
/// it goes out with `COMMIT`, after the body, which may have
/// deallocated the session's statements (`DEALLOCATE ALL`); a missing
/// one would then fail the text and abort the transaction with the
/// body's writes, with nothing left to retry. (A savepoint around it
/// would allow the retry, at the price of a subtransaction in every
/// transaction.)
fn complete(scope: &str, key: &str, response: &str) -> String {
    complete_sql(table(), &key_text(scope), &key_text(key), &text(response))
}

/// The statements an `idem::Tx` prepares once per session, under names
/// that carry a hash of their text (the record table's name included): a
/// session prepared by another version of idem, or by a service keeping
/// its records in another table (sessions handed between applications by
/// a transaction-mode pooler), holds other names, never a statement that
/// writes elsewhere. Each is prepared on its own when a text finds it
/// missing: a session that lost one (an application's `DEALLOCATE name`)
/// prepares that one, not both (preparing one that is there would fail).
struct SessionStatements {
    claim: String,
    read: String,
    prepare_claim: String,
    prepare_read: String,
}

fn session_statements() -> &'static SessionStatements {
    static STATEMENTS: std::sync::OnceLock<SessionStatements> = std::sync::OnceLock::new();
    STATEMENTS.get_or_init(|| {
        use sha2::Digest as _;
        let t = table();
        let claim = claim_sql(t, "$1", "$2", "$3", "$4");
        let read = read_sql(t, "$1", "$2");
        let digest = sha2::Sha256::digest(format!("{claim}\n{read}"));
        let tag = crate::key::hex(&digest[..6]);
        let (claim_name, read_name) = (format!("idem_claim_{tag}"), format!("idem_read_{tag}"));
        SessionStatements {
            prepare_claim: format!("PREPARE {claim_name} (text, text, text, int8) AS {claim}"),
            prepare_read: format!("PREPARE {read_name} (text, text) AS {read}"),
            claim: claim_name,
            read: read_name,
        }
    })
}

fn claim_sql(table: &str, scope: &str, key: &str, fingerprint: &str, retention_us: &str) -> String {
    format!(
        "INSERT INTO {table} (scope, idem_key, status, fingerprint, created_at, updated_at, expires_at) \
         VALUES ({scope}, {key}, 'PROCESSING', {fingerprint}, now(), now(), \
         clock_timestamp() + {retention_us} * interval '1 microsecond')"
    )
}

fn read_sql(table: &str, scope: &str, key: &str) -> String {
    format!(
        "SELECT status, fingerprint, response, (expires_at <= now())::int::int8 FROM {table} \
         WHERE scope = {scope} AND idem_key = {key}"
    )
}

/// The answer, failing (1 / 0) when no record was updated: the text stops
/// before its COMMIT.
fn complete_sql(table: &str, scope: &str, key: &str, response: &str) -> String {
    format!(
        "WITH done AS (UPDATE {table} SET status = 'DONE', response = {response} \
         WHERE scope = {scope} AND idem_key = {key} RETURNING 1) SELECT 1 / count(*) FROM done"
    )
}

/// The record table as written into text statements (a validated name).
fn table() -> &'static str {
    crate::store::sql::table::record_table().qualified()
}

/// A string as a text statement carries it, so that nothing of the value
/// can reach the lexer. An ASCII value is an escape-string literal
/// (`E'...'`) in which every character but letters, digits and a few
/// harmless marks is a Unicode escape (`\u0027`): a literal, planned like
/// a bound value. A value with other characters is its UTF-8 bytes in hex,
/// converted by the server (`convert_from(decode('..', 'hex'), 'UTF8')`),
/// which, as bound text, works whatever the database's encoding (Unicode
/// escapes above U+007F fail on SQL_ASCII databases, and before
/// PostgreSQL 13 on any encoding but UTF-8). (A NUL, which no text value
/// can hold, is refused by the server; keys and answers never contain one.)
fn text(s: &str) -> String {
    use std::fmt::Write as _;
    if !s.is_ascii() {
        return format!("convert_from(decode('{}', 'hex'), 'UTF8')", crate::key::hex(s.as_bytes()));
    }
    let mut literal = String::with_capacity(s.len() + 3);
    literal.push_str("E'");
    for c in s.chars() {
        match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | ' ' | '-' | '_' | '.' | ':' | ',' | '{' | '}' | '[' | ']' | '"' => {
                literal.push(c)
            }
            c => write!(literal, "\\u{:04x}", u32::from(c)).unwrap(),
        }
    }
    literal.push('\'');
    literal
}

/// [`text`] for a key column compared in a statement written out: the
/// converted form has no collation of its own, and without the key
/// columns' (`COLLATE "default"`) the comparison could not use the
/// primary key. (Prepared statements take it as a parameter: no need.)
fn key_text(s: &str) -> String {
    let value = text(s);
    if s.is_ascii() { value } else { format!("{value} COLLATE \"default\"") }
}

fn retention_us(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}
