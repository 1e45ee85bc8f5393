//! [`RabbitMq`]: the relay's publisher for RabbitMQ (feature `rabbitmq`),
//! on lapin: publisher confirms, `mandatory`, the message's id as AMQP
//! `message_id`; it opens its connection again after one dropped.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};

use super::publisher::{KEY_HEADER, PublishError, Publisher};
use crate::future::BoxFuture;
use crate::store::sql::outbox::Message;

/// AMQP's delivery mode of a message the broker writes to disk (on a
/// durable queue).
const PERSISTENT: u8 = 2;

/// The relay's publisher for RabbitMQ (feature `rabbitmq`): publisher
/// confirms on, `mandatory`, persistent, [`Message::id`] as the AMQP
/// `message_id`, the message's headers and its key ([`KEY_HEADER`]), to
/// the [`exchange`](Self::exchange) (the default one unless told) with the
/// topic as the routing key. Built with [`connect`](Self::connect), it
/// reopens its connection and channel on the next publish after either was
/// lost. How it reopens, and what each answer of the broker means for the
/// relay: see `docs/outbox.md`, "Publishers".
///
/// ```no_run
/// # extern crate idem_runtime as idem;
/// # async fn run<DB: idem::sql::SqlBackend>(pool: sqlx::Pool<DB>) -> Result<(), Box<dyn std::error::Error>> {
/// use idem::outbox::{RabbitMq, Relay};
///
/// let rabbit = RabbitMq::connect("amqp://guest:guest@127.0.0.1:5672/%2f").await?.exchange("coupons");
/// let relay = Relay::new(pool, rabbit).start();
/// # relay.stop().await;
/// # Ok(()) }
/// ```
pub struct RabbitMq {
    url: Option<String>,
    exchange: String,
    confirm_timeout: Duration,
    connect_timeout: Duration,
    /// The link publishes go through; replaced (one opening at a time)
    /// once its channel is no longer open.
    link: tokio::sync::Mutex<Option<Arc<Link>>>,
    /// The last opening that failed, and why: the publishes of the next
    /// [`REOPEN_AFTER`] fail with it instead of each waiting for an
    /// opening of its own (a broker that does not answer would hold every
    /// one for `connect_timeout`, one after another).
    failed: std::sync::Mutex<Option<(Instant, PublishError)>>,
}

/// How long after a failed opening the next is tried.
const REOPEN_AFTER: Duration = Duration::from_secs(1);

struct Link {
    /// `None` for a channel given to [`RabbitMq::from_channel`].
    connection: Option<Arc<Connection>>,
    channel: Channel,
}

impl RabbitMq {
    /// Connect to the broker at `url` (`amqp://user:password@host:port/vhost`)
    /// and open a channel in confirm mode: an error here is a broker out of
    /// reach or a URL it cannot take. After that it reconnects on its own.
    pub async fn connect(url: &str) -> Result<RabbitMq, PublishError> {
        let rabbit = RabbitMq::with(Some(url.to_owned()));
        let link = rabbit.open(None).await?;
        *rabbit.link.lock().await = Some(link);
        Ok(rabbit)
    }

    /// Publish on `channel`, a channel of yours (confirm mode is turned on
    /// here). It cannot be reopened: once it is closed, every publish is
    /// unavailable; [`connect`](Self::connect) reopens its own.
    pub async fn from_channel(channel: Channel) -> Result<RabbitMq, PublishError> {
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| PublishError::unavailable(format_args!("RabbitMQ: cannot turn on publisher confirms: {e}")))?;
        let rabbit = RabbitMq::with(None);
        *rabbit.link.lock().await = Some(Arc::new(Link { connection: None, channel }));
        Ok(rabbit)
    }

    fn with(url: Option<String>) -> RabbitMq {
        RabbitMq {
            url,
            exchange: String::new(),
            confirm_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            link: tokio::sync::Mutex::new(None),
            failed: std::sync::Mutex::new(None),
        }
    }

    /// Publish to `exchange` (declared by you, before the relay starts),
    /// with each message's topic as the routing key. Default: the default
    /// exchange `""`, which routes to the queue named as the topic.
    pub fn exchange(mut self, exchange: impl Into<String>) -> RabbitMq {
        self.exchange = exchange.into();
        self
    }

    /// How long a publish waits for the broker's confirmation before it is
    /// reported unavailable (tried again later); default 10 s. Keep it
    /// under the relay's claim lease, which bounds the wait anyway.
    pub fn confirm_timeout(mut self, timeout: Duration) -> RabbitMq {
        self.confirm_timeout = timeout;
        self
    }

    /// How long opening the connection again may take; default 5 s.
    pub fn connect_timeout(mut self, timeout: Duration) -> RabbitMq {
        self.connect_timeout = timeout;
        self
    }

    /// The open link, opened again if its channel closed.
    async fn link(&self) -> Result<Arc<Link>, PublishError> {
        let mut link = self.link.lock().await;
        if let Some(open) = link.as_ref().filter(|l| l.channel.status().connected()) {
            return Ok(open.clone());
        }
        if let Some((at, why)) = &*self.failed.lock().unwrap_or_else(|e| e.into_inner())
            && at.elapsed() < REOPEN_AFTER
        {
            return Err(why.clone());
        }
        let old = link.take();
        let opened = self.open(old).await;
        *self.failed.lock().unwrap_or_else(|e| e.into_inner()) =
            opened.as_ref().err().map(|why| (Instant::now(), why.clone()));
        let fresh = opened?;
        *link = Some(fresh.clone());
        Ok(fresh)
    }

    /// A channel in confirm mode: on `old`'s connection if it is still
    /// open, else on a new connection (the old one closed).
    async fn open(&self, old: Option<Arc<Link>>) -> Result<Arc<Link>, PublishError> {
        let Some(url) = &self.url else {
            return Err(PublishError::unavailable(
                "RabbitMQ: the channel given to RabbitMq::from_channel is closed, and it cannot be reopened \
                 (RabbitMq::connect reopens its own)",
            ));
        };
        let opened = tokio::time::timeout(self.connect_timeout, async {
            let reusable = old.as_ref().and_then(|l| l.connection.as_ref()).filter(|c| c.status().connected());
            let connection = match reusable {
                Some(connection) => connection.clone(),
                None => {
                    if let Some(connection) = old.as_ref().and_then(|l| l.connection.clone()) {
                        tokio::spawn(async move { connection.close(200, "idem: reconnecting".into()).await });
                    }
                    Arc::new(Connection::connect(url, ConnectionProperties::default()).await?)
                }
            };
            let channel = connection.create_channel().await?;
            channel.confirm_select(ConfirmSelectOptions::default()).await?;
            Ok::<_, lapin::Error>(Link { connection: Some(connection), channel })
        })
        .await;
        match opened {
            Ok(Ok(link)) => Ok(Arc::new(link)),
            Ok(Err(e)) => Err(PublishError::unavailable(format_args!("RabbitMQ at {}: {e}", redact(url)))),
            Err(_) => Err(PublishError::unavailable(format_args!(
                "RabbitMQ at {}: no connection within {:?}",
                redact(url),
                self.connect_timeout
            ))),
        }
    }

    /// Forget `link` (if it is still the one in use) and close its
    /// connection: a confirmation that does not come may be a connection
    /// that died without a word.
    async fn drop_link(&self, link: &Arc<Link>) {
        let mut current = self.link.lock().await;
        if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, link)) && self.url.is_some() {
            *current = None;
            if let Some(connection) = link.connection.clone() {
                tokio::spawn(async move { connection.close(200, "idem: no confirmation".into()).await });
            }
        }
    }

    async fn send(&self, m: &Message) -> Result<(), PublishError> {
        let properties = properties(m)?;
        let link = self.link().await?;
        let options = BasicPublishOptions { mandatory: true, immediate: false };
        let exchange = ShortString::try_new(self.exchange.as_str()).map_err(|e| refused_name("exchange", e))?;
        let routing_key = ShortString::try_new(m.topic.as_str()).map_err(|e| refused_name("routing key", e))?;
        let published = link.channel.basic_publish(exchange, routing_key, options, &m.payload, properties).await;
        let confirm = published.map_err(|e| broker_error(&self.exchange, &m.topic, &e))?;
        match tokio::time::timeout(self.confirm_timeout, confirm).await {
            Err(_) => {
                self.drop_link(&link).await;
                Err(PublishError::unavailable(format_args!(
                    "RabbitMQ: no confirmation within {:?}",
                    self.confirm_timeout
                )))
            }
            Ok(Err(e)) => Err(broker_error(&self.exchange, &m.topic, &e)),
            Ok(Ok(Confirmation::Ack(None))) => Ok(()),
            Ok(Ok(Confirmation::Ack(Some(returned)) | Confirmation::Nack(Some(returned)))) => {
                Err(PublishError::refused(format_args!(
                    "RabbitMQ returned the message: {} {} (exchange `{}`, routing key `{}`: no queue is bound to it)",
                    returned.reply_code, returned.reply_text, self.exchange, m.topic
                )))
            }
            Ok(Ok(Confirmation::Nack(None))) => Err(PublishError::refused(format_args!(
                "RabbitMQ nacked the message (exchange `{}`, routing key `{}`): the broker could not take it",
                self.exchange, m.topic
            ))),
            Ok(Ok(Confirmation::NotRequested)) => {
                Err(PublishError::unavailable("RabbitMQ: the channel is not in confirm mode; no confirmation came"))
            }
        }
    }
}

/// The message's AMQP properties: id, persistent, headers and key.
fn properties(m: &Message) -> Result<BasicProperties, PublishError> {
    let mut headers = FieldTable::default();
    for (name, value) in &m.headers {
        let name = ShortString::try_new(name.as_str()).map_err(|e| refused_name("header name", e))?;
        headers.insert(name, AMQPValue::LongString(LongString::from(value.as_str())));
    }
    headers.insert(KEY_HEADER.into(), AMQPValue::LongString(LongString::from(m.key.as_str())));
    let mut properties = BasicProperties::default()
        .with_message_id(m.id.as_str().into())
        .with_delivery_mode(PERSISTENT)
        .with_headers(headers);
    if let Some((_, content_type)) = m.headers.iter().find(|(name, _)| name.eq_ignore_ascii_case("content-type")) {
        let content_type = ShortString::try_new(content_type.as_str()).map_err(|e| refused_name("content-type", e))?;
        properties = properties.with_content_type(content_type);
    }
    Ok(properties)
}

fn refused_name(what: &str, e: impl std::fmt::Display) -> PublishError {
    PublishError::refused(format_args!("RabbitMQ cannot carry this message's {what}: {e}"))
}

/// A lapin error: the broker refusing this message (it closed the channel
/// saying so: no such exchange, access refused, the message too large), or
/// anything else (a lost connection: worth another try).
fn broker_error(exchange: &str, topic: &str, e: &lapin::Error) -> PublishError {
    use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
    if let lapin::ErrorKind::ProtocolError(amqp) = e.kind()
        && let AMQPErrorKind::Soft(
            AMQPSoftError::NOTFOUND
            | AMQPSoftError::ACCESSREFUSED
            | AMQPSoftError::PRECONDITIONFAILED
            | AMQPSoftError::CONTENTTOOLARGE,
        ) = amqp.kind()
    {
        return PublishError::refused(format_args!(
            "RabbitMQ refused the message (exchange `{exchange}`, routing key `{topic}`): {}",
            amqp.get_message()
        ));
    }
    PublishError::unavailable(format_args!("RabbitMQ: {e}"))
}

/// `url` without its password, for errors and logs.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{}{user}:***{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_owned(),
    }
}

impl Publisher for RabbitMq {
    fn kind(&self) -> &'static str {
        "rabbitmq"
    }

    fn publish<'a>(&'a self, message: &'a Message) -> BoxFuture<'a, Result<(), PublishError>> {
        Box::pin(self.send(message))
    }
}

impl std::fmt::Debug for RabbitMq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RabbitMq")
            .field("url", &self.url.as_deref().map(redact))
            .field("exchange", &self.exchange)
            .field("confirm_timeout", &self.confirm_timeout)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_url_is_shown_without_its_password() {
        assert_eq!(super::redact("amqp://guest:secret@host:5672/%2f"), "amqp://guest:***@host:5672/%2f");
        assert_eq!(super::redact("amqp://host:5672"), "amqp://host:5672");
    }
}
