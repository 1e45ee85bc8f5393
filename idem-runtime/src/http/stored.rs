//! A response as a record keeps it: status, headers and body, exactly (the
//! bytes of header values and body in base64, so any bytes replay as they
//! were).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use http::{HeaderName, HeaderValue, Response, StatusCode, response};

use super::{EXPIRES_IN, REPLAYED, ResponseBody};

#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct StoredResponse {
    status: u16,
    /// Name and base64 of the value, in the order the handler set them.
    headers: Vec<(String, String)>,
    /// Base64 of the body.
    body: String,
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

/// `Idempotency-Key-Expires-In: <seconds>`, rounded up.
pub(crate) fn expires_in(response: &mut Response<ResponseBody>, left_ms: i64) {
    let seconds = left_ms.max(0).saturating_add(999) / 1000;
    response.headers_mut().insert(EXPIRES_IN, HeaderValue::from(seconds));
}

/// Headers about one connection, not the response: not stored, not replayed.
fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection" | "keep-alive" | "proxy-connection" | "transfer-encoding" | "upgrade" | "te" | "trailer"
    )
}

impl StoredResponse {
    /// The response, to be kept for `retention` from now.
    pub(crate) fn of(parts: &response::Parts, body: Bytes, retention: std::time::Duration) -> StoredResponse {
        let retention = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
        StoredResponse {
            expires_at_ms: Some(unix_ms().saturating_add(retention)),
            status: parts.status.as_u16(),
            headers: parts
                .headers
                .iter()
                .filter(|(name, _)| !hop_by_hop(name))
                .map(|(name, value)| (name.as_str().to_owned(), STANDARD.encode(value.as_bytes())))
                .collect(),
            body: STANDARD.encode(&body),
        }
    }

    /// The response again: for the first request (from what was stored, so
    /// it and every replay are the same bytes) and, `replayed`, for a
    /// repeat, marked `Idempotent-Replayed: true`; both say how long the
    /// key is kept (`Idempotency-Key-Expires-In`).
    pub(crate) fn into_response(self, replayed: bool) -> Response<ResponseBody> {
        // A stored record was written by this layer; one that does not
        // decode (edited by hand) is answered as what it is, an error.
        let decoded = || -> Option<Response<ResponseBody>> {
            let body = STANDARD.decode(&self.body).ok()?;
            let mut response = Response::new(ResponseBody::full(Bytes::from(body)));
            *response.status_mut() = StatusCode::from_u16(self.status).ok()?;
            for (name, value) in &self.headers {
                let name = HeaderName::from_bytes(name.as_bytes()).ok()?;
                let value = HeaderValue::from_bytes(&STANDARD.decode(value).ok()?).ok()?;
                response.headers_mut().append(name, value);
            }
            Some(response)
        };
        let mut response = decoded().unwrap_or_else(|| {
            tracing::error!(target: "idem", "a stored HTTP response does not decode");
            let mut response = Response::new(ResponseBody::full(Bytes::from_static(b"")));
            *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
            response
        });
        if replayed {
            response.headers_mut().insert(REPLAYED, HeaderValue::from_static("true"));
        }
        if let Some(at) = self.expires_at_ms {
            expires_in(&mut response, at.saturating_sub(unix_ms()));
        }
        response
    }
}
