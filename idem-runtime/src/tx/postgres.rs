//! PostgreSQL: the claim and the read prepared once per session and named
//! by the texts; values as escape-string literals (or hex converted by the
//! server) that nothing of the value can break out of.

use sqlx::Postgres;

use crate::store::sql::NewRecord;
use crate::store::sql::texts::{Prepared, Texts, TxSql};
use crate::table::RecordTable;

impl TxSql for Postgres {
    /// The statements prepared once per session are named with a hash of
    /// their text (the record table's name included): a session prepared by
    /// another version of idem, or by a service keeping its records in
    /// another table (sessions handed between applications by a
    /// transaction-mode pooler), holds other names, never a statement that
    /// writes elsewhere. Each is prepared on its own when a text finds it
    /// missing: a session that lost one (an application's `DEALLOCATE
    /// name`) prepares that one, not both (preparing one that is there
    /// would fail).
    fn texts(t: &RecordTable) -> Option<Texts> {
        use sha2::Digest as _;
        let table = t.qualified().to_owned();
        let claim = claim_sql(&table, "$1", "$2", "$3", "$4");
        let read = read_sql(&table, "$1", "$2");
        let digest = sha2::Sha256::digest(format!("{claim}\n{read}"));
        let tag = crate::key::hex(&digest[..6]);
        let (claim_name, read_name) = (format!("idem_claim_{tag}"), format!("idem_read_{tag}"));
        let claim = format!("PREPARE {claim_name} (text, text, text, int8) AS {claim}");
        // The server keeps, for a statement prepared in SQL, the whole text
        // its PREPARE came in: idem's holds this PREPARE as written.
        let claim_taken = format!(
            "SELECT 1 FROM pg_prepared_statements WHERE name = '{claim_name}' AND strpos(statement, {}) = 0",
            text(&claim)
        );
        let prepared = Prepared {
            claim,
            read: format!("PREPARE {read_name} (text, text) AS {read}"),
            claim_name,
            read_name,
            is_unprepared: |e| e.as_database_error().and_then(|d| d.code()).is_some_and(|c| c == "26000"),
            claim_taken,
        };
        Some(Texts {
            commit: "COMMIT; BEGIN",
            table,
            prepared: Some(prepared),
            claim: claim_text,
            read: read_text,
            discard_expired,
            complete,
            // `1 / count(*)` of no rows: division by zero.
            no_record: "22012",
            insert_done,
            table_name: t.name().to_owned(),
        })
    }
}

/// The name a text gives a prepared statement of `texts`.
fn prepared(texts: &Texts, name: fn(&Prepared) -> &str) -> &str {
    texts.prepared.as_ref().map(name).expect("PostgreSQL's texts prepare their statements")
}

fn claim_text(texts: &Texts, r: &NewRecord<'_>, prepared_claim: bool) -> String {
    let (scope, key) = (text(r.scope), text(r.key));
    let fingerprint = r.fingerprint.map_or_else(|| "NULL".to_owned(), text);
    let us = retention_us(r.retention);
    if prepared_claim {
        return format!("EXECUTE {}({scope}, {key}, {fingerprint}, {us})", prepared(texts, |p| p.claim_name.as_str()));
    }
    claim_sql(&texts.table, &scope, &key, &fingerprint, &us.to_string())
}

fn read_text(texts: &Texts, scope: &str, key: &str, prepared_read: bool) -> String {
    if prepared_read {
        return format!("EXECUTE {}({}, {})", prepared(texts, |p| p.read_name.as_str()), text(scope), text(key));
    }
    read_sql(&texts.table, &key_text(scope), &key_text(key))
}

fn discard_expired(texts: &Texts, scope: &str, key: &str) -> String {
    format!(
        "DELETE FROM {} WHERE scope = {} AND idem_key = {} AND expires_at <= now()",
        texts.table,
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
fn complete(texts: &Texts, scope: &str, key: &str, response: &str) -> String {
    complete_sql(&texts.table, &key_text(scope), &key_text(key), &text(response))
}

/// `claim = "commit"`: written out, as [`complete`] is, for the same
/// reason (it goes out with `COMMIT`, after the body).
fn insert_done(texts: &Texts, r: &NewRecord<'_>, response: Option<&str>) -> String {
    let fingerprint = r.fingerprint.map_or_else(|| "NULL".to_owned(), text);
    let response = response.map_or_else(|| "NULL".to_owned(), text);
    format!(
        "INSERT INTO {} (scope, idem_key, status, fingerprint, response, created_at, updated_at, expires_at) \
         VALUES ({}, {}, 'DONE', {fingerprint}, {response}, now(), now(), \
         clock_timestamp() + {} * interval '1 microsecond')",
        texts.table,
        text(r.scope),
        text(r.key),
        retention_us(r.retention),
    )
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
/// before its COMMIT. Only the claim's own record, still `PROCESSING`: a
/// claim that wrote none (it ran a statement of the application's under
/// its name) must not complete a record it found, a repeat's, with a
/// second answer.
fn complete_sql(table: &str, scope: &str, key: &str, response: &str) -> String {
    format!(
        "WITH done AS (UPDATE {table} SET status = 'DONE', response = {response} \
         WHERE scope = {scope} AND idem_key = {key} AND status = 'PROCESSING' RETURNING 1) SELECT 1 / count(*) FROM done"
    )
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
