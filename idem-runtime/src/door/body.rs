//! Reading a handler's response body up to a limit without losing what was
//! read: whole (to store), or what was read and then the rest as it comes
//! (to pass on unstored).

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http_body::{Body as HttpBody, Frame};
use http_body_util::BodyExt;

use super::BoxError;

/// A handler's body, read up to a limit.
pub(crate) enum Collected<B> {
    /// All of it, within the limit: its data, and its trailers where the
    /// door keeps them (gRPC's only).
    Whole(Bytes, #[cfg_attr(not(feature = "grpc"), allow(dead_code))] Option<HeaderMap>),
    /// Over the limit, with trailers the door cannot keep, or failing: what
    /// was read, then the rest as it comes (or the error), to pass on
    /// unstored; never cut short. With why it cannot be stored.
    Partial(Prefixed<B>, &'static str),
}

/// Why [`Collected::Partial`]: the body is longer than the limit.
pub(crate) const OVER_LIMIT: &str = "the response body is longer than the layer's max_response_body";

/// Read `body` to its end if it holds at most `max` bytes of data, and
/// trailers only if `trailers` (gRPC keeps them: they carry its status).
pub(crate) async fn collect_up_to<B>(body: B, max: usize, trailers: bool) -> Collected<B>
where
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let mut body = Box::pin(body);
    let mut read: VecDeque<Frame<Bytes>> = VecDeque::new();
    let mut len = 0usize;
    let partial = |read, body, why| Collected::Partial(Prefixed { read, error: None, rest: Some(body) }, why);
    loop {
        match body.frame().await {
            None => return Collected::Whole(joined(read, len), None),
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => {
                    len += data.len();
                    read.push_back(Frame::data(data));
                    if len > max {
                        return partial(read, body, OVER_LIMIT);
                    }
                }
                Err(frame) => {
                    // A trailers frame ends the body.
                    let Ok(map) = frame.into_trailers() else { continue };
                    if trailers {
                        return Collected::Whole(joined(read, len), Some(map));
                    }
                    read.push_back(Frame::trailers(map));
                    return partial(read, body, "the response has trailers, which a replay cannot carry");
                }
            },
            Some(Err(e)) => {
                let rest = Prefixed { read, error: Some(e.into()), rest: None };
                return Collected::Partial(rest, "the response body failed before its end");
            }
        }
    }
}

/// The data frames read, as one.
fn joined(read: VecDeque<Frame<Bytes>>, len: usize) -> Bytes {
    let mut whole = BytesMut::with_capacity(len);
    for frame in read {
        if let Ok(data) = frame.into_data() {
            whole.extend_from_slice(&data);
        }
    }
    whole.freeze()
}

/// The frames already read, then the error that stopped the reading or the
/// rest of the body.
pub(crate) struct Prefixed<B> {
    read: VecDeque<Frame<Bytes>>,
    error: Option<BoxError>,
    rest: Option<Pin<Box<B>>>,
}

impl<B> HttpBody for Prefixed<B>
where
    B: HttpBody<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        // Every field is Unpin (the rest is boxed).
        let this = &mut *self;
        if let Some(frame) = this.read.pop_front() {
            return Poll::Ready(Some(Ok(frame)));
        }
        if let Some(e) = this.error.take() {
            return Poll::Ready(Some(Err(e)));
        }
        match &mut this.rest {
            Some(rest) => rest.as_mut().poll_frame(cx).map(|frame| frame.map(|f| f.map_err(Into::into))),
            None => Poll::Ready(None),
        }
    }
}
