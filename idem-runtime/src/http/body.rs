//! Response bodies: one type for every answer the layer gives (a stored
//! response, a problem, a response passed through).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
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
