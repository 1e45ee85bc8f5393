//! A response as a record keeps it: status, headers, body and (gRPC)
//! trailers, exactly (the bytes of metadata values and body in base64, so
//! any bytes replay as they were).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode, response};

/// The stored form, JSON `{"status", "headers": [[name, base64]], "body":
/// base64, "expires_at_ms"}`, and `"trailers"` (the same pairs) for a
/// response that ended with trailers.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct StoredResponse {
    status: u16,
    /// Name and base64 of the value, in the order the handler set them.
    headers: Vec<(String, String)>,
    /// Base64 of the body.
    body: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    trailers: Option<Vec<(String, String)>>,
    /// When the record expires, in Unix milliseconds by the clock of the
    /// server that stored it (absent in records of earlier versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    expires_at_ms: Option<i64>,
}

/// Milliseconds since the Unix epoch on this server's clock.
fn unix_ms() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

/// Headers about one connection, not the response: not stored, not replayed.
fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection" | "keep-alive" | "proxy-connection" | "transfer-encoding" | "upgrade" | "te" | "trailer"
    )
}

fn encoded(map: &HeaderMap) -> Vec<(String, String)> {
    map.iter()
        .filter(|(name, _)| !hop_by_hop(name))
        .map(|(name, value)| (name.as_str().to_owned(), STANDARD.encode(value.as_bytes())))
        .collect()
}

fn decoded(pairs: &[(String, String)]) -> Option<HeaderMap> {
    let mut map = HeaderMap::with_capacity(pairs.len());
    for (name, value) in pairs {
        let name = HeaderName::from_bytes(name.as_bytes()).ok()?;
        map.append(name, HeaderValue::from_bytes(&STANDARD.decode(value).ok()?).ok()?);
    }
    Some(map)
}

/// A stored response decoded: its status, headers, body and trailers.
pub(crate) struct Decoded {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
    /// A gRPC response's (an HTTP response's are not kept).
    #[cfg_attr(not(feature = "grpc"), allow(dead_code))]
    pub(crate) trailers: Option<HeaderMap>,
}

impl StoredResponse {
    /// The response, to be kept for `retention` from now.
    pub(crate) fn of(
        parts: &response::Parts,
        body: &Bytes,
        trailers: Option<&HeaderMap>,
        retention: std::time::Duration,
    ) -> StoredResponse {
        let retention = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
        StoredResponse {
            status: parts.status.as_u16(),
            headers: encoded(&parts.headers),
            body: STANDARD.encode(body),
            trailers: trailers.map(encoded),
            expires_at_ms: Some(unix_ms().saturating_add(retention)),
        }
    }

    /// How long the record is kept from now, by this server's clock (`None`
    /// for a record of an earlier version, which did not say).
    // The HTTP layer sends it (`Idempotency-Key-Expires-In`); gRPC does not.
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) fn expires_in(&self) -> Option<std::time::Duration> {
        let left = self.expires_at_ms?.saturating_sub(unix_ms()).max(0);
        Some(std::time::Duration::from_millis(u64::try_from(left).unwrap_or(0)))
    }

    /// The response again, or `None` for a record that does not decode (a
    /// stored record was written by a layer: one that does not decode was
    /// edited by hand, and is answered as what it is, an error).
    pub(crate) fn decode(&self) -> Option<Decoded> {
        let decoded = || -> Option<Decoded> {
            Some(Decoded {
                status: StatusCode::from_u16(self.status).ok()?,
                headers: decoded(&self.headers)?,
                body: Bytes::from(STANDARD.decode(&self.body).ok()?),
                trailers: match &self.trailers {
                    Some(pairs) => Some(decoded(pairs)?),
                    None => None,
                },
            })
        };
        let response = decoded();
        if response.is_none() {
            tracing::error!(target: "idem", "a stored response does not decode");
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::StoredResponse;

    /// A response kept and read back is the same: status, headers (a name
    /// twice, in order; any bytes), body, trailers; and an HTTP response's
    /// stored JSON has no `trailers`, as `idem inspect` reads it.
    #[test]
    fn a_stored_response_decodes_as_it_was() {
        let response = http::Response::builder()
            .status(201)
            .header("x-audit", "first")
            .header("x-audit", "second")
            .header("x-bytes", http::HeaderValue::from_bytes(b"\xff\xfe").unwrap())
            .body(())
            .unwrap();
        let (parts, ()) = response.into_parts();
        let body = bytes::Bytes::from_static(b"\x00\x00\x00\x00\x02hi");
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", "0".parse().unwrap());
        trailers.append("x-trailing", "t".parse().unwrap());

        for trailers in [None, Some(&trailers)] {
            let hour = std::time::Duration::from_secs(3600);
            let kept = StoredResponse::of(&parts, &body, trailers, hour);
            assert!(kept.expires_in().is_some_and(|left| left <= hour && left > hour / 2));
            let json = serde_json::to_string(&kept).unwrap();
            let fields = serde_json::from_str::<serde_json::Value>(&json).unwrap().as_object().unwrap().len();
            assert_eq!(fields, if trailers.is_some() { 5 } else { 4 }, "{json}");
            let decoded = serde_json::from_str::<StoredResponse>(&json).unwrap().decode().unwrap();
            assert_eq!(decoded.status, 201);
            assert_eq!(decoded.headers, parts.headers);
            assert_eq!(decoded.body, body);
            assert_eq!(decoded.trailers.as_ref(), trailers);
        }
    }
}
