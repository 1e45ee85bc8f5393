//! [`JetStream`]: the relay's publisher for NATS JetStream (feature
//! `nats`), on async-nats: the message's id as `Nats-Msg-Id`, so the
//! stream's duplicate window drops a re-send, and the `PubAck` awaited.

use std::time::Duration;

use async_nats::header::NATS_MESSAGE_ID;
use async_nats::jetstream::context::PublishErrorKind;
use async_nats::{HeaderMap, HeaderName};

use super::publisher::{KEY_HEADER, PublishError, Publisher};
use crate::future::BoxFuture;
use crate::store::sql::outbox::Message;

/// The relay's publisher for NATS JetStream (feature `nats`): to the
/// subject [`subject_prefix`](Self::subject_prefix) + topic, with
/// [`Message::id`] as `Nats-Msg-Id` (the stream's duplicate window drops a
/// re-send), the message's headers and its key ([`KEY_HEADER`]); it
/// returns once the stream's `PubAck` came. The client reconnects on its
/// own. What each answer of the server means for the relay, and the
/// duplicate window: see `docs/outbox.md`, "Publishers".
///
/// ```no_run
/// # extern crate idem_runtime as idem;
/// # async fn run<DB: idem::sql::SqlBackend>(pool: sqlx::Pool<DB>) -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use idem::outbox::{JetStream, Relay};
///
/// let nats = JetStream::connect("nats://127.0.0.1:4222").await?;
/// // The stream that captures the messages, if no one has created it.
/// nats.ensure_stream("COUPONS", &["coupons.>"], Duration::from_secs(120)).await?;
/// let relay = Relay::new(pool, nats).start();
/// # relay.stop().await;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct JetStream {
    context: async_nats::jetstream::Context,
    prefix: String,
}

impl JetStream {
    /// Connect to the NATS server at `url` (`nats://host:4222`; several,
    /// comma-separated). An error here is a server out of reach or a URL
    /// it cannot take; after that the client reconnects on its own.
    pub async fn connect(url: &str) -> Result<JetStream, PublishError> {
        let client = async_nats::connect(url)
            .await
            .map_err(|e| PublishError::unavailable(format_args!("NATS at {url}: {e}")))?;
        Ok(JetStream::from_client(client))
    }

    /// Publish through a client of yours.
    pub fn from_client(client: async_nats::Client) -> JetStream {
        JetStream::new(async_nats::jetstream::new(client)).ack_timeout(Duration::from_secs(10))
    }

    /// Publish through a JetStream context of yours (its domain or API
    /// prefix, and its timeout as the wait for a `PubAck`).
    pub fn new(context: async_nats::jetstream::Context) -> JetStream {
        JetStream { context, prefix: String::new() }
    }

    /// Publish to `prefix` + the message's topic (`"orders."` and
    /// `coupons.grant` make `orders.coupons.grant`). Default: none.
    pub fn subject_prefix(mut self, prefix: impl Into<String>) -> JetStream {
        self.prefix = prefix.into();
        self
    }

    /// How long a publish waits for the stream's `PubAck` before it is
    /// reported unavailable (tried again later); default 10 s (a context
    /// given to [`new`](Self::new) keeps its own timeout). Keep it
    /// under the relay's claim lease, which bounds the wait anyway.
    pub fn ack_timeout(mut self, timeout: Duration) -> JetStream {
        self.context.set_timeout(timeout);
        self
    }

    /// The JetStream context it publishes through.
    pub fn context(&self) -> &async_nats::jetstream::Context {
        &self.context
    }

    /// Create the stream `name` capturing `subjects` (`coupons.>`) with
    /// `duplicate_window`, unless a stream of that name exists (left as it
    /// is): for tests, examples and a first start. Production streams are
    /// better declared by their owner.
    pub async fn ensure_stream(
        &self,
        name: &str,
        subjects: &[&str],
        duplicate_window: Duration,
    ) -> Result<(), PublishError> {
        let config = async_nats::jetstream::stream::Config {
            name: name.to_owned(),
            subjects: subjects.iter().map(|s| (*s).to_owned()).collect(),
            duplicate_window,
            ..Default::default()
        };
        self.context
            .get_or_create_stream(config)
            .await
            .map(drop)
            .map_err(|e| PublishError::unavailable(format_args!("NATS: the stream `{name}`: {e}")))
    }

    async fn send(&self, m: &Message) -> Result<(), PublishError> {
        let subject = format!("{}{}", self.prefix, m.topic);
        let mut headers = HeaderMap::new();
        for (name, value) in &m.headers {
            let name: HeaderName = name.parse().map_err(|_| {
                PublishError::refused(format_args!(
                    "NATS cannot carry the header `{}`: a NATS header name is printable ASCII without `:`",
                    name.escape_default()
                ))
            })?;
            headers.append(name, value.as_str());
        }
        headers.insert(KEY_HEADER, m.key.as_str());
        headers.insert(NATS_MESSAGE_ID, m.id.as_str());
        let ack = self
            .context
            .publish_with_headers(subject.clone(), headers, m.payload.clone().into())
            .await
            .map_err(|e| nats_error(&subject, &e))?;
        ack.await.map(drop).map_err(|e| nats_error(&subject, &e))
    }
}

/// What a failed publish means for the relay.
fn nats_error(subject: &str, e: &async_nats::jetstream::context::PublishError) -> PublishError {
    use std::error::Error as _;
    match e.kind() {
        PublishErrorKind::StreamNotFound => PublishError::refused(format_args!(
            "NATS: no stream captures the subject `{subject}` (no responders): create one whose subjects match it"
        )),
        PublishErrorKind::MaxPayloadExceeded => PublishError::refused(format_args!("NATS, subject `{subject}`: {e}")),
        PublishErrorKind::Other => {
            let source = e.source();
            let api = source.and_then(|s| s.downcast_ref::<async_nats::jetstream::Error>());
            let bad_subject = source.is_some_and(|s| s.is::<async_nats::SubjectError>());
            // 503: JetStream is there but cannot answer now (no quorum,
            // starting up); any other answer of the server refuses this
            // message.
            if bad_subject || api.is_some_and(|api| api.code() != 503) {
                PublishError::refused(format_args!("NATS refused the message to `{subject}`: {e}"))
            } else {
                PublishError::unavailable(format_args!("NATS, subject `{subject}`: {e}"))
            }
        }
        _ => PublishError::unavailable(format_args!("NATS, subject `{subject}`: {e}")),
    }
}

impl Publisher for JetStream {
    fn kind(&self) -> &'static str {
        "nats"
    }

    fn publish<'a>(&'a self, message: &'a Message) -> BoxFuture<'a, Result<(), PublishError>> {
        Box::pin(self.send(message))
    }
}

impl std::fmt::Debug for JetStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JetStream").field("prefix", &self.prefix).finish_non_exhaustive()
    }
}
