//! Canonical text: one text per payload, objects' keys sorted at every
//! level and no whitespace, so equal payloads hash alike whatever order
//! their maps iterate in or their client wrote them in. Every fingerprint
//! is hashed over it: a guard's ([`Fingerprint::of`], from a serializable
//! value) and the doors' (from a request body's JSON text). Their hashes
//! are stored with records, so a version's text never changes: version 2
//! is what fingerprints hash now (see `writer`), version 1 what 0.2 hashed,
//! still compared with the records 0.2 wrote.
//!
//! A leaf: it uses nothing of the crate.
//!
//! [`Fingerprint::of`]: crate::key::Fingerprint::of

use std::cell::Cell;

use serde::Serialize;
use sha2::{Digest, Sha256};

#[cfg(any(feature = "http", feature = "grpc"))]
mod text;
mod writer;

#[cfg(any(feature = "http", feature = "grpc"))]
pub(crate) use text::from_text;
use writer::{Hashes, Writer};

/// SHA-256 of a value's canonical text, in each version.
pub(crate) struct Digests {
    pub(crate) v2: [u8; 32],
    /// `None` where 0.2 had no fingerprint for the value (it refused it).
    pub(crate) v1: Option<[u8; 32]>,
}

/// Both versions' hashes of `value`, in one pass over it: where version 1's
/// text does not differ from version 2's (most payloads: no `None`, no
/// non-finite float, no key twice) they are one hash. Only a value 0.2
/// could not hash that way (an integer past 64 bits, an `f32`, a raw JSON
/// value) is serialized a second time, for version 1.
pub(crate) fn digests<T: Serialize + ?Sized>(value: &T) -> Result<Digests, serde_json::Error> {
    let mut hashes = Hashes { v2: Sha256::new(), v1: None };
    let v1_apart = Cell::new(false);
    value.serialize(Writer { out: &mut hashes, v1_apart: &v1_apart, in_some: false })?;
    let v2 = hashes.v2.finalize().into();
    let v1 = match (v1_apart.get(), hashes.v1) {
        (true, _) => v1_text(value).ok().map(|text| Sha256::digest(text).into()),
        (false, Some(v1)) => Some(v1.finalize().into()),
        (false, None) => Some(v2),
    };
    Ok(Digests { v2, v1 })
}

/// `value`'s canonical text (version 2), for the doors.
#[cfg(any(feature = "http", feature = "grpc"))]
fn to_vec<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, serde_json::Error> {
    let mut text = Vec::new();
    value.serialize(Writer { out: &mut text, v1_apart: &Cell::new(false), in_some: false })?;
    Ok(text)
}

/// The text 0.2 hashed: the value as a `serde_json::Value` (a `None`, a
/// unit, NaN and the infinities all `null`; of a key written twice, the
/// last value), every object's keys sorted; or, for a value a `Value`
/// cannot hold (an integer past 64 bits), its plain JSON.
fn v1_text<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, serde_json::Error> {
    match serde_json::to_value(value) {
        Ok(mut tree) => {
            tree.sort_all_objects();
            serde_json::to_vec(&tree)
        }
        Err(_) => serde_json::to_vec(value),
    }
}

#[cfg(test)]
mod tests;
