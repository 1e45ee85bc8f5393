//! [`Publisher`]: what the relay hands messages to (a broker's client), and
//! [`PublishError`], which says whether a failure is worth another try.

use std::sync::Arc;

use crate::future::BoxFuture;
use crate::store::sql::outbox::Message;

/// The header that carries [`Message::key`] (the call's key, as its record
/// stores it) with a message the RabbitMQ and JetStream publishers send.
pub const KEY_HEADER: &str = "idem-key";

/// A broker's client, as the relay uses it: hand over one message and
/// return once the broker has confirmed it (RabbitMQ's publisher confirm,
/// JetStream's ack, Kafka's acks=all), never before: the relay marks the
/// message sent on `Ok` and never sends it again.
///
/// Send [`Message::id`] as the broker's message id, so that a consumer
/// (or the broker itself: JetStream's duplicate window, Kafka's
/// idempotent producer) drops a re-send: the relay sends a message again
/// when it cannot know whether the broker took it (a lost confirmation, a
/// relay that stopped before marking it). Use [`Message::key`] as the
/// partitioning key where the broker has one: a key's messages then stay
/// in order there too.
///
/// Object safe: the relay keeps it as `Arc<dyn Publisher>`.
pub trait Publisher: Send + Sync {
    /// What it publishes to, for logs: `rabbitmq`, `nats`, `in-process`.
    fn kind(&self) -> &'static str;

    /// Hand `message` over and wait for the broker's confirmation.
    fn publish<'a>(&'a self, message: &'a Message) -> BoxFuture<'a, Result<(), PublishError>>;
}

impl<P: Publisher + ?Sized> Publisher for Arc<P> {
    fn kind(&self) -> &'static str {
        (**self).kind()
    }

    fn publish<'a>(&'a self, message: &'a Message) -> BoxFuture<'a, Result<(), PublishError>> {
        (**self).publish(message)
    }
}

/// Why a message was not confirmed: the broker could not be reached or did
/// not answer ([`unavailable`](Self::unavailable): the relay tries again
/// after a pause, up to its bound), or it refused this message
/// ([`refused`](Self::refused): no route for a mandatory message, too
/// large, a subject it forbids; the relay dead-letters it at once). The
/// broker's own words are kept with the message either way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishError {
    refused: bool,
    message: String,
}

impl PublishError {
    /// The broker is down, out of reach, or its confirmation did not come:
    /// another try later may succeed.
    pub fn unavailable(why: impl std::fmt::Display) -> PublishError {
        PublishError { refused: false, message: why.to_string() }
    }

    /// The broker refused this message: trying it again would fail the same
    /// way. The relay dead-letters it, keeping `why`, and goes on with the
    /// others.
    pub fn refused(why: impl std::fmt::Display) -> PublishError {
        PublishError { refused: true, message: why.to_string() }
    }

    /// Whether the broker refused the message (else: try again later).
    pub fn is_refused(&self) -> bool {
        self.refused
    }

    /// What the broker (or its client) said.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl std::fmt::Display for PublishError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = if self.refused { "refused by the broker" } else { "broker unavailable" };
        write!(f, "{what}: {}", self.message)
    }
}

impl std::error::Error for PublishError {}
