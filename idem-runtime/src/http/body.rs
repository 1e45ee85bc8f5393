//! Response bodies: one type for every answer the layer gives (a stored
//! response, a problem, a response passed through), and reading a
//! handler's body up to a limit without losing what was read.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};

use super::BoxError;

/// The body of every response of the layer.
pub struct ResponseBody(UnsyncBoxBody<Bytes, BoxError>);

impl std::fmt::Debug for ResponseBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseBody").field("size_hint", &self.0.size_hint()).finish()
    }
}

impl ResponseBody {
    /// A body of `bytes`, whole.
    pub(crate) fn full(bytes: Bytes) -> ResponseBody {
        ResponseBody(Full::new(bytes).map_err(|never| match never {}).boxed_unsync())
    }

    /// Another body, frame by frame as it comes.
    pub(crate) fn stream<B>(body: B) -> ResponseBody
    where
        B: HttpBody<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        ResponseBody(body.map_err(Into::into).boxed_unsync())
    }
}

impl HttpBody for ResponseBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.0).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.0.size_hint()
    }
}

/// A handler's body, read up to a limit.
pub(crate) enum Collected {
    /// All of it, within the limit, data only.
    Whole(Bytes),
    /// Over the limit, with trailers, or failing: what was read, then the
    /// rest as it comes (or the error), to pass on unstored; never cut
    /// short. With why it cannot be stored.
    Partial(ResponseBody, &'static str),
}

/// Why [`Collected::Partial`]: the body is longer than the limit.
pub(crate) const OVER_LIMIT: &str = "the response body is longer than the layer's max_response_body";

/// Read `body` to its end if it holds at most `max` bytes of data and no
/// trailers.
pub(crate) async fn collect_up_to<B>(body: B, max: usize) -> Collected
where
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let mut body = Box::pin(body);
    let mut read: VecDeque<Frame<Bytes>> = VecDeque::new();
    let mut len = 0usize;
    loop {
        match body.frame().await {
            None => {
                let mut whole = BytesMut::with_capacity(len);
                for frame in read {
                    if let Ok(data) = frame.into_data() {
                        whole.extend_from_slice(&data);
                    }
                }
                return Collected::Whole(whole.freeze());
            }
            Some(Ok(frame)) => {
                let data = frame.data_ref().map(Bytes::len);
                read.push_back(frame);
                match data {
                    Some(n) => {
                        len += n;
                        if len > max {
                            let rest = ResponseBody::stream(Prefixed { read, error: None, rest: Some(body) });
                            return Collected::Partial(rest, OVER_LIMIT);
                        }
                    }
                    // Trailers: not kept (a replay could not carry them the same way).
                    None => {
                        let rest = ResponseBody::stream(Prefixed { read, error: None, rest: Some(body) });
                        return Collected::Partial(rest, "the response has trailers, which a replay cannot carry");
                    }
                }
            }
            Some(Err(e)) => {
                let error = Some(e.into());
                let rest = ResponseBody::stream(Prefixed::<B> { read, error, rest: None });
                return Collected::Partial(rest, "the response body failed before its end");
            }
        }
    }
}

/// The frames already read, then the error that stopped the reading or the
/// rest of the body.
struct Prefixed<B> {
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
