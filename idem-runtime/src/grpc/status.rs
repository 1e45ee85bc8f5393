//! The layer's answers of its own: a stored call's response again, and
//! refusals as gRPC statuses, with which code answers each error of a
//! guard.

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response};
use http_body_util::{BodyExt, Full};
use tonic::Status;
use tonic::body::Body;

use super::layer::Config;
use super::{REPLAYED, RETRY_PUSHBACK};
use crate::door::settings::Refusal;
use crate::door::stored::StoredResponse;
use crate::error::{Error, LostLease};

/// A stored call's response again (headers, messages, trailers): for the
/// first call (from what was stored, so it and every replay are the same
/// bytes) and, `replayed`, for a repeat, marked `idempotent-replayed: true`.
pub(super) fn stored(stored: StoredResponse, replayed: bool) -> Response<Body> {
    let Some(decoded) = stored.decode() else {
        return answer(Status::internal("the stored response of this idempotency key does not decode"));
    };
    let mut response = Response::new(with_trailers(decoded.body, decoded.trailers));
    *response.status_mut() = decoded.status;
    *response.headers_mut() = decoded.headers;
    if replayed {
        response.headers_mut().insert(REPLAYED, HeaderValue::from_static("true"));
    }
    response
}

/// A call refused before its key is claimed, as a gRPC status.
pub(super) fn refused_before(config: &Config, refusal: Refusal) -> Response<Body> {
    answer(match refusal {
        Refusal::NoKey => {
            Status::invalid_argument(format!("this call needs `{}` metadata (its idempotency key)", config.door.header))
        }
        Refusal::BadKey(why) | Refusal::Unreadable(why) => Status::invalid_argument(why),
        Refusal::TooLarge(why) => Status::resource_exhausted(why),
        Refusal::NoTenant(why) => Status::unauthenticated(why),
    })
}

/// A guard's refusal as a gRPC status (`lease_ms`: the layer's lease).
pub(super) fn refused(e: &Error, lease_ms: u128) -> Response<Body> {
    match e {
        Error::LeaseLost { why: LostLease::TakenOver, .. } => {
            // The store answered: another call with this key took the record
            // over (this one was paused past its lease). A retry gets that
            // call's answer, or waits for it.
            tracing::warn!(target: "idem", error = %e, "idempotency layer: the handler's lease was taken over");
            let status = Status::aborted(
                "another call with this idempotency key took this one over (its handler was paused for longer than \
                 its lease); nothing of this one was kept: retry to get that call's answer",
            );
            pushback(answer(status), 1000)
        }
        Error::LeaseLost { .. } => {
            // Not renewed in time: the store did not answer. A retry once
            // the lease has passed takes the record over, or replays
            // another's answer.
            tracing::warn!(target: "idem", error = %e, "idempotency layer: the handler was stopped, its lease lost");
            let status = Status::unavailable(
                "the call was stopped: its idempotency record could not be renewed (the store did not answer); \
                 retry after the pushback given",
            );
            pushback(answer(status), lease_ms)
        }
        // Not the lease left (30 s by default): a first call usually ends
        // long before its lease, so ask again in a second.
        Error::InProgress { .. } => pushback(
            answer(Status::aborted("a call with this idempotency key is being processed; retry after it is done")),
            1000,
        ),
        Error::KeyMismatch { .. } => answer(Status::failed_precondition(
            "this idempotency key was first used with another call; a retry must repeat the call, a new call needs \
             a new key",
        )),
        Error::AnswerNotKept { .. } => {
            let mut response = answer(Status::already_exists(
                "the first call with this idempotency key was processed, but its response was not kept (too large \
                 to store); it will not run again: look its outcome up instead of retrying",
            ));
            response.headers_mut().insert(REPLAYED, HeaderValue::from_static("true"));
            response
        }
        Error::InDoubt { step, step_key, .. } => {
            // FAILED_PRECONDITION: not to be retried until the system's
            // state is fixed, here by an operator.
            tracing::error!(target: "idem", error = %e, "idempotency layer: a step of the call is in doubt");
            answer(Status::failed_precondition(format!(
                "an earlier attempt of this call stopped in step `{step}`, which may or may not have taken effect \
                 and is not run twice: an operator must resolve it (idem steps resolve; step key {step_key}) \
                 before the call can complete"
            )))
        }
        Error::InvalidKey { reason, .. } => {
            answer(Status::invalid_argument(format!("invalid idempotency key: {reason}")))
        }
        Error::NoStore { .. } => {
            tracing::error!(target: "idem", error = %e, "idempotency layer: no store for its records");
            answer(Status::internal(format!("the idempotency layer is misconfigured: {e}")))
        }
        e if e.is_retryable() => {
            tracing::warn!(target: "idem", error = %e, "idempotency layer: the store failed");
            pushback(answer(Status::unavailable("the idempotency store is not available; retry later")), 1000)
        }
        e => {
            tracing::error!(target: "idem", error = %e, "idempotency layer: the call could not be guarded");
            answer(Status::internal("the call could not be guarded against repeats"))
        }
    }
}

/// `status` as a trailers-only response, as tonic answers an `Err(Status)`.
pub(super) fn answer(status: Status) -> Response<Body> {
    status.into_http()
}

/// `response`, telling its client to retry after `ms` milliseconds.
pub(super) fn pushback(mut response: Response<Body>, ms: u128) -> Response<Body> {
    response.headers_mut().insert(RETRY_PUSHBACK, HeaderValue::from_str(&ms.to_string()).expect("digits"));
    response
}

/// A body of `bytes`, then `trailers` if any.
pub(super) fn with_trailers(bytes: Bytes, trailers: Option<HeaderMap>) -> Body {
    let data = Full::new(bytes);
    match trailers {
        Some(trailers) => Body::new(data.with_trailers(std::future::ready(Some(Ok(trailers))))),
        None => Body::new(data),
    }
}

#[cfg(test)]
mod tests {
    use super::refused;
    use crate::error::Error;

    /// A call stopped in doubt fails its precondition (not to be retried
    /// until fixed), naming the step's key for the operator.
    #[test]
    fn a_step_in_doubt_fails_its_precondition_for_an_operator() {
        let e = Error::InDoubt {
            scope: "pay".into(),
            key_hash: "0123".into(),
            step: "charge".into(),
            step_key: "idem-step-42".into(),
        };
        let status = tonic::Status::from_header_map(refused(&e, 30_000).headers()).expect("a status");
        assert_eq!(status.code(), tonic::Code::FailedPrecondition);
        assert!(status.message().contains("operator must resolve") && status.message().contains("idem-step-42"));
        assert!(refused(&e, 30_000).headers().get(super::RETRY_PUSHBACK).is_none());
    }
}
