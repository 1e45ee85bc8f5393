//! The transactional outbox (feature `outbox`): the user-facing
//! documentation is the `idem` crate's `outbox` module; this is the runtime
//! behind it.
//!
//! - `publish`: [`Outbox`], the handle a guarded body publishes through
//!   (from a call's ticket, or a step's key), into the outbox table in the
//!   body's transaction;
//! - `publisher`: [`Publisher`], what the relay hands messages to, and
//!   [`PublishError`];
//! - `in_process`: [`InProcess`], a broker inside the process;
//! - `relay`: [`Relay`], which claims, publishes and marks;
//! - `rabbitmq` (feature `rabbitmq`): `RabbitMq`, `jetstream` (feature
//!   `nats`): `JetStream`, the real brokers' publishers;
//! - `consumer` (either feature): the message id of a delivery.
//!
//! The table's statements and the operator's functions
//! ([`list_messages`], [`find_message`], [`resend`], [`resend_all`],
//! [`count_messages`], [`oldest_pending`], [`purge_sent`],
//! [`purge_sent_preview`]) are `store/sql`'s (`outbox.rs`,
//! `outbox_admin.rs`), with the message's types.

#[cfg(any(feature = "rabbitmq", feature = "nats"))]
pub mod consumer;
mod in_process;
#[cfg(feature = "nats")]
mod jetstream;
mod publish;
mod publisher;
#[cfg(feature = "rabbitmq")]
mod rabbitmq;
mod relay;

pub use in_process::InProcess;
#[cfg(feature = "nats")]
pub use jetstream::JetStream;
pub use publish::{DEFAULT_MAX_PAYLOAD, MAX_TOPIC, Outbox};
pub use publisher::{KEY_HEADER, PublishError, Publisher};
#[cfg(feature = "rabbitmq")]
pub use rabbitmq::RabbitMq;
pub use relay::{Relay, RelayHandle, RelayReport};

pub use crate::store::sql::outbox::{Message, MessageId, ParseMessageIdError};
pub use crate::store::sql::outbox_admin::{
    Entry, MessageCounts, MessageQuery, MessageState, count_messages, find_message, list_messages, oldest_pending,
    purge_sent, purge_sent_preview, resend, resend_all,
};
