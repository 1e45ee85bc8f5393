//! The entry point generated code calls: a [`Guard`] collects the key and the
//! fingerprint, then a strategy method (`dedup`, ...) claims the key.

use std::borrow::Cow;
use std::time::Duration;

use crate::key::{Fingerprint, Fingerprintable, IdempotencyKey, KeyBuilder, SqlKey};
use crate::{Error, Key};

/// Records are kept this long unless the attribute says `retention = "..."`.
/// Payment gateways retry callbacks for a day or more; a week covers them.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// What `#[idempotent]` knows at compile time about one guarded function.
#[doc(hidden)]
#[derive(Debug)]
pub struct GuardSpec {
    /// Records of different scopes never collide.
    pub scope: &'static str,
    /// The key as written in the attribute, for error messages.
    pub key_source: &'static str,
    /// How long records are kept.
    pub retention: Duration,
    /// `claim = "after"`: write the record with its response after the body,
    /// in one statement (see the crate docs for when that applies).
    pub claim_after: bool,
}

/// One guarded call in the making. Generated code builds it with one
/// [`Guard::key`] call per key part, an optional [`Guard::fingerprint`], and
/// one strategy call.
#[doc(hidden)]
pub struct Guard {
    pub(crate) spec: &'static GuardSpec,
    pub(crate) key: KeyBuilder,
    fingerprint: Option<Result<Fingerprint, String>>,
}

impl Guard {
    pub fn new(spec: &'static GuardSpec) -> Guard {
        Guard { spec, key: KeyBuilder::new(spec.scope, spec.key_source), fingerprint: None }
    }

    /// Add one key part.
    pub fn key<K: IdempotencyKey + ?Sized>(mut self, part: &K) -> Guard {
        self.key = self.key.part(part);
        self
    }

    /// Add one key part that also selects the entity a state guard moves
    /// (bound to the state enum's key column, in order).
    pub fn entity_key<K: IdempotencyKey + ?Sized>(mut self, part: &K) -> Guard {
        self.key = self.key.entity_part(part);
        self
    }

    /// Hash the request payload, to detect a key reused for another request.
    pub fn fingerprint<F: Fingerprintable + ?Sized>(mut self, payload: &F) -> Guard {
        self.fingerprint = Some(Fingerprint::of(payload).map_err(|e| e.to_string()));
        self
    }

    /// Validate the key and fingerprint.
    pub(crate) fn prepare(self) -> Result<Prepared, Error> {
        let (key, entity) = self.key.finish_with_entity()?;
        let fingerprint = match self.fingerprint {
            None => None,
            Some(Ok(f)) => Some(f),
            Some(Err(reason)) => {
                return Err(Error::InvalidKey {
                    scope: self.spec.scope.to_owned(),
                    reason: format!("the fingerprint payload could not be serialised: {reason}"),
                });
            }
        };
        Ok(Prepared { spec: self.spec, stored_scope: stored_scope(self.spec.scope), key, entity, fingerprint })
    }
}

/// A validated call: key, fingerprint, and the scope as stored.
pub(crate) struct Prepared {
    pub spec: &'static GuardSpec,
    pub stored_scope: Cow<'static, str>,
    pub key: Key,
    /// The key parts as bound to the entity's key columns (state strategies).
    pub entity: Vec<SqlKey>,
    pub fingerprint: Option<Fingerprint>,
}

impl Prepared {
    pub fn mismatch(&self) -> Error {
        Error::KeyMismatch { scope: self.spec.scope.to_owned(), key_hash: self.key.hash() }
    }

    pub fn record(&self) -> crate::sql::NewRecord<'_> {
        crate::sql::NewRecord {
            scope: &self.stored_scope,
            key: self.key.as_str(),
            fingerprint: self.fingerprint.as_ref().map(|f| f.as_str()),
            retention: self.spec.retention,
        }
    }

    pub fn unfinished(&self) -> Error {
        Error::Unfinished { scope: self.spec.scope.to_owned(), key_hash: self.key.hash() }
    }

    pub fn in_progress(&self, retry_after: Option<Duration>) -> Error {
        Error::InProgress { scope: self.spec.scope.to_owned(), key_hash: self.key.hash(), retry_after }
    }

    /// The fingerprint is checked before anything else about a record: a
    /// mismatch is a mismatch even while the first call still runs. A record
    /// written without a fingerprint (before one was declared) cannot be
    /// compared and passes.
    pub fn check_fingerprint(&self, stored: Option<&str>) -> Result<(), Error> {
        match (&self.fingerprint, stored) {
            (Some(ours), Some(theirs)) if ours.as_str() != theirs => Err(self.mismatch()),
            _ => Ok(()),
        }
    }
}

/// The scope as records store it: as given, unless it is longer than a key
/// column or holds a backslash or NUL; then `\sha256:<hex>` of it. A plain
/// scope never holds a backslash, so it never equals a hashed one.
pub(crate) fn stored_scope(scope: &str) -> Cow<'_, str> {
    if scope.len() > crate::key::MAX_PLAIN_KEY_LEN || scope.contains(['\\', '\0']) {
        Cow::Owned(crate::key::hashed(scope))
    } else {
        Cow::Borrowed(scope)
    }
}

/// Error types a guarded function can return: anything with
/// `From<idem::Error>`.
#[diagnostic::on_unimplemented(
    message = "the error type `{Self}` cannot carry idem's guard errors",
    label = "this error type needs `impl From<idem::Error>`",
    note = "add `impl From<idem::Error> for {Self}` (or a `#[from] idem::Error` variant with thiserror), so a key mismatch or a database failure in the guard reaches your caller"
)]
pub trait GuardError: From<Error> {}
impl<E: From<Error>> GuardError for E {}
