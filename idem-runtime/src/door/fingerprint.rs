//! What makes two requests "the same" behind one key: the fingerprint
//! stored with the record, of method, path and body (a gRPC call's method
//! is always `POST`, its path names the RPC method), JSON bodies compared
//! as JSON.

use std::sync::Arc;

use http::{HeaderMap, request};
use sha2::{Digest, Sha256};

pub(crate) type FingerprintFn = dyn Fn(&request::Parts, &[u8]) -> Vec<u8> + Send + Sync;

/// What identifies "the same request" behind one key.
#[derive(Clone)]
pub(crate) enum Fingerprint {
    /// Method, path and query, and body (the default).
    Request,
    /// Nothing: a key replays whatever request comes with it.
    None,
    /// The application's own.
    Custom(Arc<FingerprintFn>),
}

/// The request's fingerprint, as hex of its SHA-256.
pub(crate) fn fingerprint(of: &Fingerprint, parts: &request::Parts, body: &[u8]) -> Option<String> {
    let mut hash = Sha256::new();
    match of {
        Fingerprint::None => return None,
        Fingerprint::Request => {
            // Length-prefixed, so no two (method, target, body) triples
            // hash the same text.
            let target = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
            // A JSON body is compared as JSON: a client that serializes
            // its retry again (keys in another order, other spacing) sends
            // the same request.
            // The body's form is hashed too, so a raw body never matches a
            // canonical JSON one of the same bytes.
            let canonical = is_json(&parts.headers).then(|| crate::canonical::from_text(body)).flatten();
            let (form, body): (&[u8], &[u8]) = match &canonical {
                Some(json) => (b"json", json),
                None => (b"raw", body),
            };
            for part in [parts.method.as_str().as_bytes(), target.as_bytes(), form, body] {
                hash.update((part.len() as u64).to_be_bytes());
                hash.update(part);
            }
        }
        Fingerprint::Custom(f) => hash.update(f(parts, body)),
    }
    Some(crate::key::hex(&hash.finalize()))
}

/// Whether the request says its body is JSON (`application/json`, or a
/// `+json` type such as `application/merge-patch+json`).
fn is_json(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    essence == "application/json" || (essence.starts_with("application/") && essence.ends_with("+json"))
}

#[cfg(test)]
mod tests {
    use super::{Fingerprint, fingerprint};

    /// A request's fingerprint is stored with its record: a retry after an
    /// upgrade must hash as before, or every open record answers `422`.
    /// These hashes are pinned; never change them.
    #[test]
    fn request_fingerprints_hash_exactly_as_stored_records_expect() {
        let request = |content_type: Option<&str>| {
            let mut request = http::Request::post("/payments?x=1");
            if let Some(content_type) = content_type {
                request = request.header(http::header::CONTENT_TYPE, content_type);
            }
            request.body(()).unwrap().into_parts().0
        };
        let json = request(Some("application/json; charset=utf-8"));
        let patch = request(Some("application/merge-patch+json"));
        let plain = request(None);
        for (parts, body, pinned) in [
            (
                &json,
                &br#"{"b": [1, 2.5, {"y": null}], "a": -3}"#[..],
                "8a2e7a4b785b7be76462913e591a1601b559d3123bee6a848d3698fffbb85b4f",
            ),
            (
                &patch,
                br#"{"a":-3,"b":[1,2.5,{"y":null}]}"#,
                "8a2e7a4b785b7be76462913e591a1601b559d3123bee6a848d3698fffbb85b4f",
            ),
            // Would lose a difference: the bytes.
            (&json, br#"{"amount":1e2}"#, "283a012479757489eb9d3c9d849f550c10a83527f13f6bacf337815b82cfec4a"),
            (&json, br#"{"a":1,"a":2}"#, "86b66d6c56d9f2f8fd5a604b350058b6337db27840654c288dd3c11bc6feb44a"),
            (&json, b"not json", "b9b702334b6f5c39645823c604bb275e3ef41ce2b926fc91506067f747174388"),
            (&plain, br#"{"a":-3}"#, "bed2eec97506d1d2c3629751e1731e166c4ec976657a53c13873d7abb7e2efba"),
            (&plain, b"", "942bbd9292ad727076e74655e79c461940826b3147c4e12c14d360b26179240a"),
        ] {
            let hash = fingerprint(&Fingerprint::Request, parts, body).unwrap();
            assert_eq!(hash, pinned, "{}", String::from_utf8_lossy(body));
        }
        let custom = Fingerprint::Custom(std::sync::Arc::new(|_: &http::request::Parts, body: &[u8]| body.to_vec()));
        assert_eq!(
            fingerprint(&custom, &plain, b"abc").unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(fingerprint(&Fingerprint::None, &plain, b"abc"), None);
    }
}
