//! What the layer reads from a guarded request before it claims its key:
//! the key from its header, the body (up to the layer's limit) and the
//! tenant it belongs to. Each says why it refuses; the service answers.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use http::{HeaderMap, StatusCode, request};
use http_body::Body as HttpBody;
use http_body_util::BodyExt;

use super::BoxError;
use super::layer::Config;

/// The key from its header: a Structured Field string (`"..."`), or bare
/// text for clients that send it so; 1 to 255 visible ASCII characters.
/// `None` without the header; `Err` naming what is wrong.
pub(super) fn key_of(config: &Config, headers: &HeaderMap) -> Result<Option<String>, String> {
    let mut values = headers.get_all(&config.header).iter();
    let Some(value) = values.next() else { return Ok(None) };
    let name = &config.header;
    if values.next().is_some() {
        return Err(format!("the request has more than one `{name}` header"));
    }
    let text = value.to_str().map_err(|_| format!("`{name}` holds bytes that are not visible ASCII"))?;
    let key = match text.strip_prefix('"') {
        Some(quoted) => {
            quoted.strip_suffix('"').ok_or_else(|| format!("`{name}` opens a quoted string it does not close"))?
        }
        None => text,
    };
    if key.is_empty()
        || key.len() > 255
        || !key.bytes().all(|b| b.is_ascii_graphic() || b == b' ')
        || key.trim().is_empty()
    {
        return Err(format!("`{name}` must hold 1 to 255 visible ASCII characters, e.g. a UUID in quotes"));
    }
    if key.contains(['"', '\\']) {
        return Err(format!("`{name}` holds a quote or a backslash; send the key as a plain quoted string"));
    }
    Ok(Some(key.to_owned()))
}

/// The request body, whole, if it is within the layer's limit (`413`
/// otherwise) and can be read (`400`); `Err`: the status and why.
pub(super) async fn body_of<B>(config: &Config, body: B) -> Result<Bytes, (StatusCode, String)>
where
    B: HttpBody<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    match http_body_util::Limited::new(body, config.max_request).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            let detail = format!(
                "the request body is over {} bytes, the most kept for an idempotent request",
                config.max_request
            );
            Err((StatusCode::PAYLOAD_TOO_LARGE, detail))
        }
        Err(e) => Err((StatusCode::BAD_REQUEST, format!("the request body could not be read: {e}"))),
    }
}

/// The tenant the request's key belongs to: `None` for a layer
/// without a tenant function (warned about once); `Err` (a `401`, and why)
/// for a request its function names nobody for.
pub(super) fn tenant_of(config: &Config, parts: &request::Parts) -> Result<Option<String>, &'static str> {
    let Some(tenant) = &config.tenant else {
        if !config.warned_shared.swap(true, Ordering::Relaxed) {
            tracing::warn!(target: "idem", scope = %config.scope,
                "idempotency layer without a tenant function: keys are shared by every caller, so one \
                 client's key replays another's response; set IdempotencyLayer::tenant on APIs with more than one caller");
        }
        return Ok(None);
    };
    match tenant(parts) {
        Some(tenant) if !tenant.trim().is_empty() => Ok(Some(tenant)),
        _ => Err("an idempotency key belongs to a caller, and this request names none"),
    }
}
