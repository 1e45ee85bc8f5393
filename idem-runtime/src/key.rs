//! Idempotency keys: what may be a key part, how parts combine, and how long
//! keys are stored.

use std::borrow::Cow;
use std::fmt::Write as _;

use sha2::{Digest, Sha256};

use crate::error::Error;

/// Keys longer than this many bytes are stored as `\sha256:<hex>`, so every key
/// fits the indexed column on every backend.
pub const MAX_PLAIN_KEY_LEN: usize = 128;

/// A type that can be part of an idempotency key.
///
/// Implemented for strings, integers, `char`, `bool`, UUIDs (feature `uuid`),
/// references to these, and `Option` of these (`None`, and a string that is
/// empty or only whitespace, are rejected at run time with
/// [`Error::InvalidKey`]). Floats are deliberately not keys: `0.1 + 0.2 !=
/// 0.3`, and `NaN` never equals itself, so two copies of one request could get
/// two different keys.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be part of an idempotency key",
    label = "not a key type",
    note = "key parts must be strings, integers, UUIDs (or `Option` of these); floats and structs are never keys",
    note = "use the business identifier inside it, e.g. `key = \"order.id\"`, or several parts: `key = \"req.user_id, req.request_id\"`"
)]
pub trait IdempotencyKey {
    /// Append this part's text form to `out`, as it is: the key builder
    /// escapes the separator for every part (so an implementation of your
    /// own need not), and refuses a part that wrote nothing. Different
    /// values must write different text. Return `Err(reason)` when the
    /// value cannot be a key (e.g. blank).
    fn write_key(&self, out: &mut String) -> Result<(), &'static str>;

    /// The value as a state guard binds it to the entity's key column
    /// (`WHERE order_no = ?`). Strings bind as text, integers as a 64-bit
    /// integer, UUIDs as `uuid` on PostgreSQL and as hyphenated text elsewhere.
    /// The default binds the text form.
    fn sql_key(&self) -> Result<SqlKey, &'static str> {
        let mut text = String::new();
        self.write_key(&mut text)?;
        Ok(SqlKey::Text(text))
    }
}

/// A key part as bound to an entity's key column by the `state` strategies.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SqlKey {
    /// Bound as a 64-bit integer.
    Int(i64),
    /// Bound as text.
    Text(String),
    /// Bound as `uuid` on PostgreSQL, as hyphenated text on MySQL and SQLite.
    #[cfg(feature = "uuid")]
    Uuid(uuid::Uuid),
}

impl<T: IdempotencyKey + ?Sized> IdempotencyKey for &T {
    fn write_key(&self, out: &mut String) -> Result<(), &'static str> {
        (**self).write_key(out)
    }
    fn sql_key(&self) -> Result<SqlKey, &'static str> {
        (**self).sql_key()
    }
}

impl IdempotencyKey for str {
    fn write_key(&self, out: &mut String) -> Result<(), &'static str> {
        blank(self)?;
        out.push_str(self);
        Ok(())
    }
    fn sql_key(&self) -> Result<SqlKey, &'static str> {
        blank(self)?;
        Ok(SqlKey::Text(self.to_owned()))
    }
}

/// `text` as a key part: the part separator escaped so ("a:b", "c") and
/// ("a", "b:c") differ, and NUL, which PostgreSQL text cannot hold, as `\0`.
fn escape(text: &str, out: &mut String) {
    for c in text.chars() {
        match c {
            ':' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            '\0' => out.push_str("\\0"),
            c => out.push(c),
        }
    }
}

/// An empty or all-whitespace text is no business key (a field never filled
/// in, a padded `CHAR` column): taken as one, it would put unrelated requests
/// under one record and replay one's answer to the others.
fn blank(text: &str) -> Result<(), &'static str> {
    if text.is_empty() {
        Err("is an empty string")
    } else if text.trim().is_empty() {
        Err("is only whitespace")
    } else {
        Ok(())
    }
}

impl IdempotencyKey for String {
    fn write_key(&self, out: &mut String) -> Result<(), &'static str> {
        self.as_str().write_key(out)
    }
    fn sql_key(&self) -> Result<SqlKey, &'static str> {
        self.as_str().sql_key()
    }
}

impl IdempotencyKey for std::borrow::Cow<'_, str> {
    fn write_key(&self, out: &mut String) -> Result<(), &'static str> {
        self.as_ref().write_key(out)
    }
    fn sql_key(&self) -> Result<SqlKey, &'static str> {
        self.as_ref().sql_key()
    }
}

impl<T: IdempotencyKey> IdempotencyKey for Option<T> {
    fn write_key(&self, out: &mut String) -> Result<(), &'static str> {
        match self {
            Some(v) => v.write_key(out),
            None => Err("is None"),
        }
    }
    fn sql_key(&self) -> Result<SqlKey, &'static str> {
        match self {
            Some(v) => v.sql_key(),
            None => Err("is None"),
        }
    }
}

macro_rules! integer_keys {
    ($($t:ty),*) => {$(
        impl IdempotencyKey for $t {
            fn write_key(&self, out: &mut String) -> Result<(), &'static str> {
                let _ = write!(out, "{self}");
                Ok(())
            }
            fn sql_key(&self) -> Result<SqlKey, &'static str> {
                i64::try_from(*self).map(SqlKey::Int).map_err(|_| "does not fit the signed 64-bit column of an entity key")
            }
        }
    )*};
}
integer_keys!(i8, i16, i32, i64, i128, isize, u8, u16, u32, u64, u128, usize);

macro_rules! display_keys {
    ($($t:ty),*) => {$(
        impl IdempotencyKey for $t {
            fn write_key(&self, out: &mut String) -> Result<(), &'static str> {
                let _ = write!(out, "{self}");
                Ok(())
            }
        }
    )*};
}
display_keys!(bool);

impl IdempotencyKey for char {
    // A character is a value of its own, a space included (a one-letter
    // code), unlike a text left blank.
    fn write_key(&self, out: &mut String) -> Result<(), &'static str> {
        // Escaped like a one-character string (`:`, `\` and NUL included)
        // by the key builder.
        out.push(*self);
        Ok(())
    }
    fn sql_key(&self) -> Result<SqlKey, &'static str> {
        // The character itself, as an entity's key column holds it.
        Ok(SqlKey::Text(self.to_string()))
    }
}

#[cfg(feature = "uuid")]
impl IdempotencyKey for uuid::Uuid {
    fn write_key(&self, out: &mut String) -> Result<(), &'static str> {
        let _ = write!(out, "{self}");
        Ok(())
    }
    fn sql_key(&self) -> Result<SqlKey, &'static str> {
        Ok(SqlKey::Uuid(*self))
    }
}

/// A finished key: the text stored in the record and a short hash for logs.
#[derive(Clone, PartialEq, Eq)]
pub struct Key {
    stored: String,
}

impl Key {
    /// Build a key from text already in key form (one part, or parts joined by
    /// `:` with `:` and `\` escaped, NUL written `\0`). Long keys are hashed,
    /// as `\sha256:<hex>`: in key form a backslash is only ever followed by
    /// `:`, `\` or `0`, so no plain key (e.g. the composite
    /// `("sha256", "<hex>")`) can equal a hashed one.
    pub fn from_stored(text: String) -> Key {
        if text.len() > MAX_PLAIN_KEY_LEN { Key { stored: hashed(&text) } } else { Key { stored: text } }
    }

    /// Build a key from one value, exactly as a guard with `key = "value"` does.
    pub fn new(value: &(impl IdempotencyKey + ?Sized)) -> Result<Key, Error> {
        KeyBuilder::new("key").part(value).finish("")
    }

    /// Build a key from several parts, exactly as a guard with
    /// `.key(a).key(b)` (or `key = "a, b"`) does: each part escaped, joined
    /// by `:`, the whole hashed when long. The HTTP layer keys a tenant's
    /// records with `[tenant, key]`.
    pub fn from_parts(parts: &[&dyn IdempotencyKey]) -> Result<Key, Error> {
        let mut key = KeyBuilder::new("key");
        for part in parts {
            key = key.part(*part);
        }
        key.finish("")
    }

    /// The parts the key was built from, each as its type wrote it (an
    /// integer as its digits), read back from the stored text: one for a
    /// one-part key. `None` for a hashed key (`\sha256:...`, whose parts
    /// are gone) and for text no guard stores.
    pub fn parts(&self) -> Option<Vec<String>> {
        parts(&self.stored)
    }

    /// The key as stored: the text of the record's key column, and the
    /// `key` store-level calls take (their scope is [`stored_scope`]'s; the
    /// `key` module lists those calls). A composite key's parts are escaped
    /// and joined, a long key hashed:
    ///
    /// ```
    /// # extern crate idem_runtime as idem;
    /// # fn demo() -> Result<(), idem::Error> {
    /// use idem::Key;
    /// assert_eq!(Key::from_parts(&[&"A:1", &7])?.as_str(), r"A\:1:7");
    /// assert_eq!(Key::new("T-1001")?.as_str(), "T-1001");
    /// # Ok(()) }
    /// # demo().unwrap();
    /// ```
    pub fn as_str(&self) -> &str {
        &self.stored
    }

    /// A short hash of the key, safe to log (keys may carry personal data).
    pub fn hash(&self) -> String {
        short_hash(&self.stored)
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the key itself: it may be an e-mail address or a card token.
        write!(f, "Key({})", self.hash())
    }
}

/// The parts of a key as stored (see [`Key::parts`]): split at each `:`
/// the escaping left bare, each part unescaped.
pub(crate) fn parts(stored: &str) -> Option<Vec<String>> {
    if stored.is_empty() || stored.starts_with("\\sha256:") {
        return None;
    }
    let mut parts = vec![String::new()];
    let mut chars = stored.chars();
    while let Some(c) = chars.next() {
        match c {
            ':' => parts.push(String::new()),
            '\\' => {
                let unescaped = match chars.next()? {
                    ':' => ':',
                    '\\' => '\\',
                    '0' => '\0',
                    _ => return None,
                };
                parts.last_mut()?.push(unescaped);
            }
            c => parts.last_mut()?.push(c),
        }
    }
    // An empty part is never stored: the builder refuses it.
    (!parts.iter().any(String::is_empty)).then_some(parts)
}

/// `text` as stored when it is too long (or, for a scope, holds a
/// backslash or NUL): `\sha256:<hex>`.
pub(crate) fn hashed(text: &str) -> String {
    format!("\\sha256:{}", hex(&Sha256::digest(text.as_bytes())))
}

/// The scope as records store it, and as store-level calls take it (with
/// the key as [`Key::as_str`] gives it): as given, unless it is longer than
/// a key column ([`MAX_PLAIN_KEY_LEN`]), starts with a backslash or holds
/// NUL; then `\sha256:<hex>` of it. A plain scope never starts with a
/// backslash, so it never equals a hashed one. `scope` is the guard's:
/// its `scope = "..."`, or `module_path::fn_name`.
///
/// ```
/// # extern crate idem_runtime as idem;
/// use idem::key::stored_scope;
/// assert_eq!(stored_scope("payments.on_pay"), "payments.on_pay");
/// assert!(stored_scope(&"s".repeat(200)).starts_with(r"\sha256:"));
/// ```
pub fn stored_scope(scope: &str) -> Cow<'_, str> {
    if scope.len() > MAX_PLAIN_KEY_LEN || scope.starts_with('\\') || scope.contains('\0') {
        Cow::Owned(hashed(scope))
    } else {
        Cow::Borrowed(scope)
    }
}

/// 32 hex digits (the first 16 bytes) of the SHA-256 of `parts`, each
/// preceded by its length, so that no two lists of parts hash alike
/// (`["ab", "c"]` and `["a", "bc"]` differ): a step's stable key, the SQL
/// name of a call's steps.
pub(crate) fn parts_hash(parts: &[&str]) -> String {
    let mut hash = Sha256::new();
    for part in parts {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part.as_bytes());
    }
    hex(&hash.finalize()[..16])
}

/// The stable key of the step `name` of the call of `scope` and `key` (as
/// stored): `idem-step-` and 32 hex digits (`lease::StepKey`'s text).
pub(crate) fn step_key(scope: &str, key: &str, name: &str) -> String {
    format!("idem-step-{}", parts_hash(&[scope, key, name]))
}

/// First 16 hex digits of the SHA-256 of `text`.
pub(crate) fn short_hash(text: &str) -> String {
    let mut h = hex(&Sha256::digest(text.as_bytes()));
    h.truncate(16);
    h
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// Collects the parts of a composite key: a [`Guard`](crate::Guard)'s, one
/// `part` call per `.key(...)` (the attribute's comma-separated key
/// expressions), and [`Key::from_parts`]'s.
#[derive(Clone)]
pub(crate) struct KeyBuilder {
    sources: &'static str,
    text: String,
    /// The part being written, before it is escaped into `text`.
    part_text: String,
    index: usize,
    error: Option<String>,
    /// The parts as bound to an entity's key columns (state strategies only).
    entity: Option<Vec<SqlKey>>,
}

impl KeyBuilder {
    /// `sources` is the key as written in the attribute, for error messages.
    pub fn new(sources: &'static str) -> KeyBuilder {
        KeyBuilder { sources, text: String::new(), part_text: String::new(), index: 0, error: None, entity: None }
    }

    /// Name the parts as written in the attribute (comma-separated).
    pub fn sources(mut self, sources: &'static str) -> KeyBuilder {
        self.sources = sources;
        self
    }

    /// Append one part.
    pub fn part<T: IdempotencyKey + ?Sized>(mut self, value: &T) -> KeyBuilder {
        if self.error.is_none() {
            if self.index > 0 {
                self.text.push(':');
            }
            // Each part is written as the type gives it, then escaped here,
            // for every type alike (a key type of your own included): the
            // separator and the escape character of one part can never
            // make two composite keys equal, and an empty part is no key.
            self.part_text.clear();
            match value.write_key(&mut self.part_text) {
                Ok(()) if self.part_text.is_empty() => self.fail("is empty"),
                Ok(()) => escape(&self.part_text, &mut self.text),
                Err(reason) => self.fail(reason),
            }
        }
        self.index += 1;
        self
    }

    /// Append one part that also selects the entity a state guard moves.
    pub fn entity_part<T: IdempotencyKey + ?Sized>(mut self, value: &T) -> KeyBuilder {
        if self.error.is_none() {
            match value.sql_key() {
                Ok(v) => self.entity.get_or_insert_with(Vec::new).push(v),
                Err(reason) => self.fail(reason),
            }
        }
        self.part(value)
    }

    fn fail(&mut self, reason: &str) {
        // Named as written in the attribute; by position for a guard built
        // by hand (whose parts have no source text).
        let source = match self.sources.split(',').nth(self.index) {
            Some(source) if self.sources != "key" => format!("key part `{}`", source.trim()),
            _ if self.index == 0 => "the key".to_owned(),
            _ => format!("key part {}", self.index + 1),
        };
        self.error = Some(format!("{source} {reason}"));
    }

    /// No part was added.
    #[cfg(feature = "sql")]
    pub fn is_empty(&self) -> bool {
        self.index == 0
    }

    /// The finished key, or [`Error::InvalidKey`] naming the bad part.
    pub fn finish(self, scope: &str) -> Result<Key, Error> {
        self.finish_with_entity(scope).map(|(key, _)| key)
    }

    /// The finished key and the entity key values (empty unless
    /// [`KeyBuilder::entity_part`] was used). A key with no part is invalid.
    pub fn finish_with_entity(self, scope: &str) -> Result<(Key, Vec<SqlKey>), Error> {
        let invalid = |reason| Error::InvalidKey { scope: scope.to_owned(), reason };
        if let Some(reason) = self.error {
            return Err(invalid(reason));
        }
        if self.index == 0 {
            return Err(invalid("the key has no part: add one with `.key(...)`".to_owned()));
        }
        Ok((Key::from_stored(self.text), self.entity.unwrap_or_default()))
    }
}

/// A hash of the request payload, stored with the record to detect a key reused
/// for a different request ([`Error::KeyMismatch`]).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Fingerprint {
    /// What a new record holds: [`V2`] and 61 hex digits.
    stored: String,
    /// What 0.2 stored for the payload (64 hex digits, no version), to
    /// compare the records it wrote; `None` where it refused the payload.
    v1: Option<String>,
}

/// How a version 2 fingerprint begins. Version 1 (0.2's) is 64 hex
/// digits: no text is both.
const V2: &str = "v2:";

impl Fingerprint {
    /// SHA-256 over the canonical text of `value` (see the `key` module:
    /// "Fingerprints"), as a record stores it: `v2:` and 61 hex digits.
    /// Errors where `value` cannot be serialized (a map whose keys are not
    /// strings, numbers or unit variants, or its own `Serialize` error).
    pub fn of<T: Fingerprintable + ?Sized>(value: &T) -> Result<Fingerprint, serde_json::Error> {
        let digests = crate::canonical::digests(value)?;
        let mut stored = String::with_capacity(64);
        stored.push_str(V2);
        stored.push_str(&hex(&digests.v2)[..64 - V2.len()]);
        Ok(Fingerprint { stored, v1: digests.v1.map(|v1| hex(&v1)) })
    }

    /// The stored text.
    pub fn as_str(&self) -> &str {
        &self.stored
    }

    /// Whether a record's fingerprint is this payload's, compared in the
    /// version the record was written in: a record of 0.2 is compared with
    /// the payload's version 1, so that an identical retry across the
    /// upgrade still replays.
    #[cfg(feature = "sql")]
    pub(crate) fn matches(&self, stored: &str) -> bool {
        stored == self.stored || self.v1.as_deref() == Some(stored)
    }

    /// The payload's fingerprint as 0.2 wrote it, for a claim that found a
    /// record of 0.2's (see [`matches`](Self::matches)): a claim made with
    /// it keeps the record in its version.
    pub(crate) fn v1(&self) -> Option<Fingerprint> {
        self.v1.as_ref().map(|v1| Fingerprint { stored: v1.clone(), v1: None })
    }
}

/// A value `fingerprint = "..."` can hash: anything `serde::Serialize`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be fingerprinted: it does not implement `serde::Serialize`",
    label = "fingerprint expression must be serializable",
    note = "derive `serde::Serialize` on it, or fingerprint the fields that identify the request"
)]
pub trait Fingerprintable: serde::Serialize {}
impl<T: serde::Serialize + ?Sized> Fingerprintable for T {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn composite_parts_cannot_collide() {
        let a = KeyBuilder::new("a, b").part("x:y").part("z").finish("s").unwrap();
        let b = KeyBuilder::new("a, b").part("x").part("y:z").finish("s").unwrap();
        assert_ne!(a, b);
        assert_eq!(a.as_str(), "x\\:y:z");
    }

    #[test]
    fn long_keys_are_hashed_short_ones_kept() {
        assert_eq!(Key::new("T100").unwrap().as_str(), "T100");
        let long = "x".repeat(500);
        let k = Key::new(&long).unwrap();
        assert!(k.as_str().starts_with("\\sha256:"));
        assert_eq!(k.as_str().len(), 8 + 64);
        let hex_part = &k.as_str()[8..];
        let forged = KeyBuilder::new("a, b").part("\\sha256").part(hex_part).finish("s").unwrap();
        assert_ne!(forged, k, "a composite key must not forge a hashed one");
        let forged = KeyBuilder::new("a, b").part("sha256").part(hex_part).finish("s").unwrap();
        assert_ne!(forged, k);
    }

    #[test]
    fn empty_and_none_parts_are_named_in_the_error() {
        let e = KeyBuilder::new("event.trade_no, event.user").part("T1").part(&None::<i64>).finish("s");
        match e {
            Err(Error::InvalidKey { reason, .. }) => assert_eq!(reason, "key part `event.user` is None"),
            other => panic!("{other:?}"),
        }
        assert!(Key::new("").is_err());
        // Whitespace only is no key either (a padded CHAR column, a field
        // filled with a space): it would put unrelated requests under one
        // record. Whitespace around a real key stays part of it.
        for blank in [" ", "\t", " \r\n ", "\u{3000}"] {
            let e = KeyBuilder::new("event.trade_no").part(blank).finish("s");
            match e {
                Err(Error::InvalidKey { reason, .. }) => {
                    assert_eq!(reason, "key part `event.trade_no` is only whitespace", "{blank:?}")
                }
                other => panic!("{blank:?}: {other:?}"),
            }
            assert!(blank.sql_key().is_err());
        }
        assert_ne!(Key::new(" T1").unwrap(), Key::new("T1").unwrap());
        // A `char` is a value, a space included.
        assert_eq!(KeyBuilder::new("code").part(&' ').finish("s").unwrap().as_str(), " ");
    }

    #[test]
    fn fingerprint_is_stable_and_distinguishes_payloads() {
        assert_eq!(Fingerprint::of(&(1, "a")).unwrap(), Fingerprint::of(&(1, "a")).unwrap());
        assert_ne!(Fingerprint::of(&(1, "a")).unwrap(), Fingerprint::of(&(2, "a")).unwrap());
    }

    /// Fingerprints are stored with records: a retry after an upgrade must
    /// hash its payload exactly as before, or every open record would
    /// answer `KeyMismatch`. These hashes are pinned; never change them:
    /// each version's, and 0.2's (version 1), which records it wrote hold.
    #[test]
    fn fingerprints_hash_exactly_as_stored_records_expect() {
        let json: serde_json::Value =
            serde_json::from_str(r#"{"b":[1,2.5,{"y":null,"x":"\"q\":"}],"a":-3,"c":1.0}"#).unwrap();
        let map: std::collections::HashMap<&str, u32> = [("z", 1), ("a", 2), ("m", 3)].into_iter().collect();
        for (fingerprint, v2, v1) in [
            (
                Fingerprint::of(&(1, "a")),
                "v2:2010945388e2de98f5651051478912aa4ff38bb13a2cdb1a2c257bb97fbf9",
                "2010945388e2de98f5651051478912aa4ff38bb13a2cdb1a2c257bb97fbf98ff",
            ),
            (
                Fingerprint::of(&json),
                "v2:947a8d02765470bcad1e40377461920713e7fb1c0a71e5fcc41410bc0566f",
                "947a8d02765470bcad1e40377461920713e7fb1c0a71e5fcc41410bc0566f53f",
            ),
            (
                Fingerprint::of(&map),
                "v2:ebba85cfdc0a724b6cc327ecc545faeb38b9fe02eca603b430eb872f5cf75",
                "ebba85cfdc0a724b6cc327ecc545faeb38b9fe02eca603b430eb872f5cf75370",
            ),
            (
                Fingerprint::of(&(0.1f64, -0.0f64, 1e300f64)),
                "v2:2b63cd7620268cf46195a1e627e512cebebc95d9c3eb6163f9d03f0b6762a",
                "2b63cd7620268cf46195a1e627e512cebebc95d9c3eb6163f9d03f0b6762a3db",
            ),
            // Past 64 bits: 0.2 hashed it in its plain JSON.
            (
                Fingerprint::of(&u128::MAX),
                "v2:f315ff319bf588e202110ab686fb8c3dbca12b4df9fbd844615b566a2fff3",
                "f315ff319bf588e202110ab686fb8c3dbca12b4df9fbd844615b566a2fff3e75",
            ),
            (
                Fingerprint::of("text"),
                "v2:1e1d0f251d3a76fa2b1bfc81164078572623403887db02988b504b0492e9f",
                "1e1d0f251d3a76fa2b1bfc81164078572623403887db02988b504b0492e9f076",
            ),
            // What 0.2 wrote as `null` (all four alike), and the last value
            // of a key written twice.
            (
                Fingerprint::of(&None::<u8>),
                "v2:140bedbf9c3f6d56a9846d2ba7088798683f4da0c248231336e6a05679e4f",
                "74234e98afe7498fb5daf1f36ac2d78acc339464f950703b8c019892f982b90b",
            ),
            (
                Fingerprint::of(&f64::NAN),
                "v2:d5b592c05dc25b5032553f1b27f4139be95e881f73db33b02b05ab20c3f99",
                "74234e98afe7498fb5daf1f36ac2d78acc339464f950703b8c019892f982b90b",
            ),
        ] {
            let fingerprint = fingerprint.unwrap();
            assert_eq!(fingerprint.as_str(), v2);
            assert_eq!(fingerprint.v1().unwrap().as_str(), v1);
        }
    }

    /// What JSON writes alike (`null`, a key's last value) fingerprints
    /// apart, so the same key with the other payload is a mismatch; a
    /// record 0.2 wrote still compares as 0.2 compared it.
    #[cfg(feature = "sql")]
    #[test]
    fn payloads_json_writes_alike_fingerprint_apart() {
        let nulls = [
            Fingerprint::of(&f64::NAN),
            Fingerprint::of(&f64::INFINITY),
            Fingerprint::of(&f64::NEG_INFINITY),
            Fingerprint::of(&()),
            Fingerprint::of(&None::<u8>),
            Fingerprint::of(&Some(None::<u8>)),
        ]
        .map(Result::unwrap);
        for (i, a) in nulls.iter().enumerate() {
            for b in &nulls[i + 1..] {
                assert!(!a.matches(b.as_str()), "{a:?} {b:?}");
                // As 0.2 hashed them, they were one.
                assert!(a.matches(b.v1().unwrap().as_str()));
            }
            assert!(a.matches(a.as_str()));
            assert_eq!(a.as_str().len(), 64, "a record's column holds 64 characters");
        }
    }

    #[test]
    fn equal_maps_fingerprint_alike_whatever_their_order() {
        use std::collections::HashMap;
        // Two HashMaps with the same entries usually iterate in different
        // orders (each has its own random hasher seed).
        let entries: Vec<(String, u32)> = (0..32).map(|i| (format!("k{i}"), i)).collect();
        let a: HashMap<String, u32> = entries.iter().cloned().collect();
        let b: HashMap<String, u32> = entries.iter().rev().cloned().collect();
        assert_eq!(Fingerprint::of(&a).unwrap(), Fingerprint::of(&b).unwrap());
        // Nested, and in JSON objects written in another order.
        let x: serde_json::Value =
            serde_json::from_str(r#"{"amount":1,"meta":{"a":[{"y":1,"x":2}],"b":null}}"#).unwrap();
        let y: serde_json::Value =
            serde_json::from_str(r#"{"meta":{"b":null,"a":[{"x":2,"y":1}]},"amount":1}"#).unwrap();
        assert_eq!(Fingerprint::of(&x).unwrap(), Fingerprint::of(&y).unwrap());
        // Values still count, and so does the order of a list.
        let z: serde_json::Value =
            serde_json::from_str(r#"{"amount":2,"meta":{"a":[{"y":1,"x":2}],"b":null}}"#).unwrap();
        assert_ne!(Fingerprint::of(&x).unwrap(), Fingerprint::of(&z).unwrap());
        assert_ne!(Fingerprint::of(&[1, 2]).unwrap(), Fingerprint::of(&[2, 1]).unwrap());
        // An integer serde_json::Value cannot hold still fingerprints.
        assert_ne!(Fingerprint::of(&u128::MAX).unwrap(), Fingerprint::of(&(u128::MAX - 1)).unwrap());
    }

    /// A key type of the application's own: whatever it writes is escaped
    /// like a string part, and writing nothing is no key.
    struct Code(&'static str);
    impl IdempotencyKey for Code {
        fn write_key(&self, out: &mut String) -> Result<(), &'static str> {
            out.push_str(self.0);
            Ok(())
        }
    }

    #[test]
    fn a_key_type_of_your_own_is_escaped_and_cannot_be_empty() {
        let a = KeyBuilder::new("a, b").part(&Code("x:y")).part("z").finish("s").unwrap();
        let b = KeyBuilder::new("a, b").part(&Code("x")).part("y:z").finish("s").unwrap();
        assert_ne!(a, b);
        assert_eq!(a, KeyBuilder::new("a, b").part("x:y").part("z").finish("s").unwrap());
        let empty = KeyBuilder::new("code").part(&Code("")).finish("s");
        assert!(matches!(empty, Err(Error::InvalidKey { reason, .. }) if reason == "key part `code` is empty"));
    }

    #[test]
    fn a_plain_scope_never_equals_a_hashed_one() {
        let long = "s".repeat(200);
        let hashed = stored_scope(&long).into_owned();
        assert!(hashed.starts_with("\\sha256:"));
        // Written out by hand, the hashed form is itself hashed again.
        assert_ne!(stored_scope(&hashed), hashed.as_str());
        // A backslash elsewhere (a Windows-style path) keeps the scope as is.
        assert_eq!(stored_scope("jobs\\nightly"), "jobs\\nightly");
        assert_ne!(stored_scope("a\0b"), "a\0b");
    }

    #[test]
    fn stored_keys_read_back_into_their_parts() {
        let parts = |p: &[&str]| p.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let composite = Key::from_parts(&[&"ac:me\\", &"k:1", &7]).unwrap();
        assert_eq!(composite, KeyBuilder::new("a, b, c").part("ac:me\\").part("k:1").part(&7).finish("s").unwrap());
        assert_eq!(composite.parts(), Some(parts(&["ac:me\\", "k:1", "7"])));
        assert_eq!(Key::new("cr{as}h:ed").unwrap().parts(), Some(parts(&["cr{as}h:ed"])));
        assert_eq!(Key::new("a\0b").unwrap().parts(), Some(parts(&["a\0b"])));
        assert_eq!(Key::new(&"x".repeat(500)).unwrap().parts(), None, "a hashed key's parts are gone");
        for not_stored in ["a\\xb", "a:", ":a", "a\\"] {
            assert_eq!(super::parts(not_stored), None, "{not_stored}");
        }
        assert!(Key::from_parts(&[&"acme", &" "]).is_err());
    }

    #[test]
    fn nul_is_escaped_so_every_store_can_hold_the_key() {
        let k = Key::new("a\0b").unwrap();
        assert_eq!(k.as_str(), "a\\0b");
        assert_ne!(k, Key::new("a\\0b").unwrap(), "a NUL and a written backslash-zero differ");
        assert!(!k.as_str().contains('\0'));
        // A char is escaped like a string.
        let c = KeyBuilder::new("a, b").part(&'\\').part("y").finish("s").unwrap();
        assert_ne!(c, Key::new(":y").unwrap());
        assert_eq!(Key::new(&':').unwrap(), Key::new(":").unwrap());
        // As an entity's key value, a char is itself, unescaped.
        assert_eq!(':'.sql_key(), Ok(SqlKey::Text(":".to_owned())));
    }
}
