//! The layer's answers of its own: a stored response again, and refusals
//! as `application/problem+json` answers (RFC 9457), with which status
//! answers each error of a guard.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode};

use super::layer::Config;
use super::{EXPIRES_IN, REPLAYED, ResponseBody};
use crate::door::settings::Refusal;
use crate::door::stored::StoredResponse;
use crate::error::{Error, LostLease};

/// A stored response again: for the first request (from what was stored,
/// so it and every replay are the same bytes) and, `replayed`, for a
/// repeat, marked `Idempotent-Replayed: true`; both say how long the key
/// is kept (`Idempotency-Key-Expires-In`).
pub(super) fn stored(stored: StoredResponse, replayed: bool) -> Response<ResponseBody> {
    let left = stored.expires_in();
    let mut response = match stored.decode() {
        Some(decoded) => {
            let mut response = Response::new(ResponseBody::full(decoded.body));
            *response.status_mut() = decoded.status;
            *response.headers_mut() = decoded.headers;
            response
        }
        None => {
            let mut response = Response::new(ResponseBody::full(Bytes::from_static(b"")));
            *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
            response
        }
    };
    if replayed {
        response.headers_mut().insert(REPLAYED, HeaderValue::from_static("true"));
    }
    if let Some(left) = left {
        expires_in(&mut response, left);
    }
    response
}

/// `Idempotency-Key-Expires-In: <seconds>`, rounded up.
pub(super) fn expires_in(response: &mut Response<ResponseBody>, left: Duration) {
    let seconds = left.as_millis().div_ceil(1000);
    response.headers_mut().insert(EXPIRES_IN, HeaderValue::from(u64::try_from(seconds).unwrap_or(u64::MAX)));
}

/// A request refused before its key is claimed, as an HTTP answer.
pub(super) fn refused_before(config: &Config, refusal: Refusal) -> Response<ResponseBody> {
    match refusal {
        Refusal::NoKey => {
            problem(StatusCode::BAD_REQUEST, &format!("this request needs an `{}` header", config.door.header))
        }
        Refusal::BadKey(why) | Refusal::Unreadable(why) => problem(StatusCode::BAD_REQUEST, &why),
        Refusal::TooLarge(why) => problem(StatusCode::PAYLOAD_TOO_LARGE, &why),
        Refusal::NoTenant(why) => problem(StatusCode::UNAUTHORIZED, why),
    }
}

/// A guard's refusal as an HTTP answer (`lease`: the layer's).
pub(super) fn refused(e: &Error, lease: Duration) -> Response<ResponseBody> {
    match e {
        Error::LeaseLost { why: LostLease::TakenOver, .. } => {
            // The store answered: another request with this key took the
            // record over (this one was paused past its lease). A retry
            // gets that request's answer, or waits for it.
            tracing::warn!(target: "idem", error = %e, "idempotency layer: the handler's lease was taken over");
            let response = problem(
                StatusCode::CONFLICT,
                "another request with this idempotency key took this one over (its handler was paused for longer \
                 than its lease); nothing of this one was kept: retry to get that request's answer",
            );
            retry_after(response, 1)
        }
        Error::LeaseLost { .. } => {
            // Not renewed in time: the store did not answer. A retry once
            // the lease has passed takes the record over, or replays
            // another's answer.
            tracing::warn!(target: "idem", error = %e, "idempotency layer: the handler was stopped, its lease lost");
            let response = problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "the request was stopped: its idempotency record could not be renewed (the store did not answer); \
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
        Error::InDoubt { step, step_key, .. } => {
            // Not retryable, and no Retry-After: every retry stops the same
            // way until an operator resolves the step.
            tracing::error!(target: "idem", error = %e, "idempotency layer: a step of the request is in doubt");
            problem(
                StatusCode::CONFLICT,
                &format!(
                    "an earlier attempt of this request stopped in step `{step}`, which may or may not have taken \
                     effect and is not run twice: an operator must resolve it (idem steps resolve; step key \
                     {step_key}) before the request can complete"
                ),
            )
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

#[cfg(test)]
mod tests {
    use http::StatusCode;
    use http_body_util::BodyExt as _;

    use super::refused;
    use crate::error::Error;

    /// A request stopped in doubt is a conflict an operator must resolve:
    /// no retry is suggested, and the step's key is named.
    #[tokio::test]
    async fn a_step_in_doubt_answers_a_conflict_for_an_operator() {
        let e = Error::InDoubt {
            scope: "pay".into(),
            key_hash: "0123".into(),
            step: "charge".into(),
            step_key: "idem-step-42".into(),
        };
        let response = refused(&e, std::time::Duration::from_secs(30));
        assert_eq!(response.status(), StatusCode::CONFLICT);
        assert!(response.headers().get(http::header::RETRY_AFTER).is_none());
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let body = String::from_utf8_lossy(&body);
        assert!(body.contains("operator must resolve") && body.contains("idem-step-42"), "{body}");
    }
}
