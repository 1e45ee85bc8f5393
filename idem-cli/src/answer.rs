//! What a record's stored answer is: none yet, not kept, a response the
//! HTTP layer stored (decoded), or any other answer's JSON.

use idem_runtime::admin::Record;
use idem_runtime::admin::RecordStatus;
use serde_json::Value;

/// A record's answer, as shown.
pub(crate) enum Answer<'a> {
    /// None yet (not done).
    Pending,
    /// Done, and its answer was not kept (NULL or empty): "completed,
    /// answer not kept".
    NotKept,
    /// A response the HTTP layer stored, decoded.
    Http(HttpResponse),
    /// Any other answer: its JSON.
    Json(&'a str),
}

pub(crate) fn answer(r: &Record) -> Answer<'_> {
    match r.response.as_deref() {
        None | Some("") if r.status == RecordStatus::Done => Answer::NotKept,
        None | Some("") => Answer::Pending,
        Some(text) => http_response(text).map_or(Answer::Json(text), Answer::Http),
    }
}

/// A response as the HTTP layer (`idem::http`) stores it.
pub(crate) struct HttpResponse {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, Vec<u8>)>,
    pub(crate) body: Vec<u8>,
}

/// `text` decoded if it is the HTTP layer's stored form, JSON
/// `{"status": 201, "headers": [[name, base64]], "body": base64}` (and
/// `expires_at_ms`, since it says when the key expires; no other field,
/// the base64 valid); `None` for any other answer.
fn http_response(text: &str) -> Option<HttpResponse> {
    use base64::Engine as _;
    let base64 = base64::engine::general_purpose::STANDARD;
    let Value::Object(fields) = serde_json::from_str::<Value>(text).ok()? else { return None };
    let known = ["status", "headers", "body", "expires_at_ms"];
    if fields.len() < 3 || fields.keys().any(|k| !known.contains(&k.as_str())) {
        return None;
    }
    let status = u16::try_from(fields.get("status")?.as_u64()?).ok().filter(|s| (100..=999).contains(s))?;
    let headers = fields
        .get("headers")?
        .as_array()?
        .iter()
        .map(|pair| match pair.as_array()?.as_slice() {
            [name, value] => Some((name.as_str()?.to_owned(), base64.decode(value.as_str()?).ok()?)),
            _ => None,
        })
        .collect::<Option<Vec<_>>>()?;
    let body = base64.decode(fields.get("body")?.as_str()?).ok()?;
    Some(HttpResponse { status, headers, body })
}
