//! The consumer's side (features `rabbitmq`, `nats`): the message id a
//! delivery carries, as the key of the consumer's own dedup record.
//!
//! A message the relay published carries its [`MessageId`] as the AMQP
//! `message_id` property (RabbitMQ) or the `Nats-Msg-Id` header (NATS);
//! [`message_id`] reads it back as a `MessageId`, an idempotency key:
//! `Guard::new(scope).key(&id)`, the attribute's `key = "id"`, a
//! `batch::dedup` guard's key. Every copy of a message (the relay's
//! re-send, the broker's redelivery, an operator's re-send) carries the
//! same id, so the consumer's record takes it once.
//!
//! ```no_run
//! # extern crate idem_runtime as idem;
//! # #[cfg(all(feature = "rabbitmq", feature = "sqlite"))]
//! # async fn run(pool: sqlx::SqlitePool, delivery: lapin::message::Delivery) -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use idem::{Claim, Guard};
//! use idem::outbox::consumer;
//!
//! // Refuse (dead-letter) a delivery without an id: it cannot be deduplicated.
//! let id = consumer::message_id(&delivery)?;
//! let marks = idem::Stores::installed()?.precheck()?;
//! let mut tx = pool.begin().await?;
//! let guard = Guard::new("coupons.grant").key(&id).precheck(marks, Duration::from_secs(2 * 86_400));
//! match guard.dedup::<(), _>(&mut tx).await? {
//!     Claim::Replay(()) => {} // a copy already taken: acknowledge it, change nothing
//!     Claim::Run(ticket) => {
//!         sqlx::query("INSERT INTO coupons (message_id) VALUES (?)").bind(id.as_str()).execute(&mut *tx).await?;
//!         ticket.complete(&mut tx, Ok::<(), idem::Error>(())).await??;
//!     }
//! }
//! tx.commit().await?;
//! delivery.acker.ack(lapin::options::BasicAckOptions::default()).await?;
//! # Ok(()) }
//! ```

use crate::error::Error;
use crate::store::sql::outbox::MessageId;

/// A message as a consumer receives it, which may carry a message id:
/// lapin's `Delivery` (the AMQP `message_id` property), async-nats's
/// `Message` and JetStream `Message` (the `Nats-Msg-Id` header).
pub trait Delivered {
    /// The id it carries, if any.
    fn carried_id(&self) -> Option<&str>;

    /// What it is and where its id would be, for the error: "the AMQP
    /// delivery ... has no `message_id` property".
    fn describe(&self) -> String;
}

/// The message id `delivery` carries, as the consumer's idempotency key;
/// [`Error::NoMessageId`] when it carries none (or an empty one), naming
/// the delivery and where the id was looked for: refuse such a delivery
/// (dead-letter it), it cannot be deduplicated.
pub fn message_id(delivery: &impl Delivered) -> Result<MessageId, Error> {
    match delivery.carried_id() {
        Some(id) if !id.trim().is_empty() => Ok(MessageId(id.to_owned())),
        _ => Err(Error::NoMessageId { delivery: delivery.describe() }),
    }
}

#[cfg(feature = "rabbitmq")]
impl Delivered for lapin::message::Delivery {
    fn carried_id(&self) -> Option<&str> {
        self.properties.message_id().as_ref().map(|id| id.as_str())
    }

    fn describe(&self) -> String {
        format!(
            "the AMQP delivery from exchange `{}` with routing key `{}` has no `message_id` property",
            self.exchange, self.routing_key
        )
    }
}

#[cfg(feature = "rabbitmq")]
impl Delivered for lapin::message::BasicGetMessage {
    fn carried_id(&self) -> Option<&str> {
        self.delivery.carried_id()
    }

    fn describe(&self) -> String {
        self.delivery.describe()
    }
}

#[cfg(feature = "nats")]
impl Delivered for async_nats::Message {
    fn carried_id(&self) -> Option<&str> {
        self.headers.as_ref()?.get(async_nats::header::NATS_MESSAGE_ID).map(|id| id.as_str())
    }

    fn describe(&self) -> String {
        format!("the NATS message on subject `{}` has no `Nats-Msg-Id` header", self.subject)
    }
}

#[cfg(feature = "nats")]
impl Delivered for async_nats::jetstream::Message {
    fn carried_id(&self) -> Option<&str> {
        self.message.carried_id()
    }

    fn describe(&self) -> String {
        self.message.describe()
    }
}
