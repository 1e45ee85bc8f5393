//! The layer's refusals as `application/problem+json` answers (RFC 9457),
//! and which status answers each error of a guard.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode};

use super::{REPLAYED, ResponseBody};
use crate::error::Error;

/// A guard's refusal as an HTTP answer (`lease`: the layer's).
pub(super) fn refused(e: &Error, lease: Duration) -> Response<ResponseBody> {
    match e {
        Error::LeaseLost { .. } => {
            // The handler was stopped: its lease could not be renewed (the
            // store is down) or was taken over. A retry once the lease has
            // passed takes the record over, or replays another's answer.
            tracing::warn!(target: "idem", error = %e, "idempotency layer: the handler was stopped, its lease lost");
            let response = problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "the request was stopped: its idempotency record could not be kept alive (the store did not answer); \
                 retry after the time given",
            );
            retry_after(response, lease.as_secs().max(1))
        }
        Error::InProgress { .. } => {
            let response = problem(
                StatusCode::CONFLICT,
                "a request with this idempotency key is being processed; retry after it is done",
            );
            // Not the lease left (30 s by default): a first request
            // usually ends long before its lease, so ask again in a second.
            retry_after(response, 1)
        }
        Error::KeyMismatch { .. } => problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            "this idempotency key was first used with another request; a retry must repeat the request, a new request needs a new key",
        ),
        Error::AnswerNotKept { .. } => {
            let mut response = problem(
                StatusCode::GONE,
                "the first request with this idempotency key was processed, but its response was not kept (too \
                 large to store); it will not run again: look its outcome up instead of retrying",
            );
            response.headers_mut().insert(REPLAYED, HeaderValue::from_static("true"));
            response
        }
        Error::InvalidKey { reason, .. } => {
            problem(StatusCode::BAD_REQUEST, &format!("invalid idempotency key: {reason}"))
        }
        Error::NoStore { .. } => {
            tracing::error!(target: "idem", error = %e, "idempotency layer: no store for its records");
            problem(StatusCode::INTERNAL_SERVER_ERROR, &format!("the idempotency layer is misconfigured: {e}"))
        }
        e if e.is_retryable() => {
            tracing::warn!(target: "idem", error = %e, "idempotency layer: the store failed");
            let response =
                problem(StatusCode::SERVICE_UNAVAILABLE, "the idempotency store is not available; retry later");
            retry_after(response, 1)
        }
        e => {
            tracing::error!(target: "idem", error = %e, "idempotency layer: the request could not be guarded");
            problem(StatusCode::INTERNAL_SERVER_ERROR, "the request could not be guarded against repeats")
        }
    }
}

/// An `application/problem+json` answer (RFC 9457).
pub(super) fn problem(status: StatusCode, detail: &str) -> Response<ResponseBody> {
    let body = serde_json::json!({
        "type": "about:blank",
        "title": status.canonical_reason().unwrap_or("Error"),
        "status": status.as_u16(),
        "detail": detail,
    });
    let mut response = Response::new(ResponseBody::full(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response.headers_mut().insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
    response
}

/// `response`, telling its client to retry after `seconds`.
fn retry_after(mut response: Response<ResponseBody>, seconds: u64) -> Response<ResponseBody> {
    response.headers_mut().insert(http::header::RETRY_AFTER, HeaderValue::from(seconds));
    response
}
