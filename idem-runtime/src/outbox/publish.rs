//! [`Outbox`]: the handle a guarded body publishes through, into the
//! outbox table, in the body's own transaction. A call's handle comes from
//! its ticket ([`Ticket::outbox`]), a step's from its key
//! ([`Outbox::for_step`]); each message's id is the call's (or the step's)
//! and the message's ordinal in it, so an attempt that runs again after a
//! failure publishes the same ids.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::dedup::context::TxContext;
use crate::dedup::ticket::Ticket;
use crate::error::Error;
use crate::lease::StepKey;
use crate::store::sql::outbox::{MessageId, NewMessage, Published, insert};
use crate::store::sql::{SqlBackend, in_transaction};

/// The most bytes of payload and headers a message takes unless its
/// handle says otherwise ([`Outbox::max_payload`]): 1 MiB, what NATS
/// takes by default and far below what every database and RabbitMQ take.
pub const DEFAULT_MAX_PAYLOAD: usize = 1 << 20;

/// The longest topic, in bytes (an AMQP routing key's limit).
pub const MAX_TOPIC: usize = 255;

/// Where a guarded body publishes messages for other services: each
/// [`publish`](Self::publish) writes one into the outbox table in the
/// body's transaction, so it commits with the body's writes, or not at all
/// (a rollback publishes nothing; a repeat, which replays without running
/// the body, publishes nothing). A relay ([`Relay`](crate::outbox::Relay))
/// hands it to the broker after the commit.
///
/// A call's handle comes from its ticket ([`Ticket::outbox`], or
/// `outbox = "name"` on the attribute); a step's from its key
/// ([`Outbox::for_step`]). Clones share the count of messages published.
/// Publish on the transaction the call's guard claimed in (the step's):
/// a message written in another would commit apart from the call.
#[derive(Clone)]
pub struct Outbox {
    from: Arc<Source>,
    max_payload: usize,
}

/// The call (or step) a handle publishes for.
struct Source {
    /// The scope as given, for errors.
    scope: String,
    /// The aggregate: the call's scope and key as stored.
    stored_scope: String,
    key: String,
    /// The call's record's: a sent message is kept as long.
    retention: Duration,
    ids: Ids,
}

/// Where the ids and the ordinals come from.
enum Ids {
    /// A call's attempt: what it published, removed by its ticket if the
    /// body fails.
    Call(Arc<Published>),
    /// A step's attempt ([`StepKey`]): its transaction rolls back whole
    /// if the step fails.
    Step(StepKey),
}

impl<DB: SqlBackend> Ticket<DB> {
    /// The outbox handle of this call: messages published through it are
    /// written in the call's transaction, their ids the call's (scope,
    /// key, and their order: 0, 1, 2 ... in this attempt). If the body
    /// fails, the ticket removes them with the record, even if the caller
    /// commits anyway. Every handle of a ticket counts the same messages.
    /// (Feature `outbox`.)
    pub fn outbox(&self) -> Outbox {
        let p = &self.prepared;
        let published = self.published.get_or_init(Default::default).clone();
        Outbox::new(Source {
            scope: p.scope.to_string(),
            stored_scope: p.stored_scope.clone(),
            key: p.key.as_str().to_owned(),
            retention: p.retention,
            ids: Ids::Call(published),
        })
    }
}

impl Outbox {
    fn new(from: Source) -> Outbox {
        Outbox { from: Arc::new(from), max_payload: DEFAULT_MAX_PAYLOAD }
    }

    /// The handle of a recorded step ([`Steps::run_tx`](crate::lease::Steps::run_tx)),
    /// from the key it gives the step: messages published through it are
    /// written in the step's transaction and committed with its record.
    /// Their ids are the step's (its key, and their order in this attempt
    /// of the step), their aggregate the call's scope and key. A step that
    /// fails rolls them back with its writes.
    ///
    /// ```no_run
    /// # extern crate idem_runtime as idem;
    /// # async fn demo(steps: &idem::lease::Steps<'_>, pool: &sqlx::PgPool) -> Result<(), idem::Error> {
    /// use idem::outbox::Outbox;
    /// steps
    ///     .run_tx("grant", pool, |tx, key| {
    ///         Box::pin(async move {
    ///             Outbox::for_step(&key).publish(&mut *tx, "coupons.grant", b"order 42").await?;
    ///             Ok::<_, idem::Error>(())
    ///         })
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn for_step(step: &StepKey) -> Outbox {
        let call = &step.call;
        Outbox::new(Source {
            scope: call.scope.clone(),
            stored_scope: call.scope.clone(),
            key: call.key.clone(),
            retention: call.retention,
            ids: Ids::Step(step.clone()),
        })
    }

    /// Refuse messages over `bytes` of payload and headers (default
    /// [`DEFAULT_MAX_PAYLOAD`]): the size your broker takes, less room for
    /// its own framing.
    pub fn max_payload(mut self, bytes: usize) -> Outbox {
        self.max_payload = bytes;
        self
    }

    /// Publish `payload` (any bytes, kept exactly) to `topic`: written into
    /// the outbox in `tx`, handed to the broker by the relay after `tx`
    /// commits. Returns the message's id.
    ///
    /// Errors: [`Error::MessageTooLarge`] over the handle's limit,
    /// [`Error::InvalidMessage`] for an empty topic, one over
    /// [`MAX_TOPIC`] bytes or with a control character, [`Error::NoTransaction`]
    /// outside a transaction, database errors. Nothing is written then.
    pub async fn publish<C: TxContext + ?Sized>(
        &self,
        tx: &mut C,
        topic: &str,
        payload: impl AsRef<[u8]>,
    ) -> Result<MessageId, Error> {
        self.send(tx, topic, payload.as_ref(), Vec::new()).await
    }

    /// [`publish`](Self::publish) `value` as JSON, with the header
    /// `content-type: application/json`.
    pub async fn publish_json<C: TxContext + ?Sized, T: serde::Serialize + ?Sized>(
        &self,
        tx: &mut C,
        topic: &str,
        value: &T,
    ) -> Result<MessageId, Error> {
        let payload = serde_json::to_vec(value)
            .map_err(|e| invalid(topic, format!("its payload does not serialize as JSON: {e}")))?;
        self.send(tx, topic, &payload, vec![("content-type".to_owned(), "application/json".to_owned())]).await
    }

    /// [`publish`](Self::publish) with headers, handed to the broker with
    /// the message (AMQP headers, NATS headers) in this order. A name is
    /// not empty; neither holds a control character.
    pub async fn publish_with_headers<C: TxContext + ?Sized>(
        &self,
        tx: &mut C,
        topic: &str,
        payload: impl AsRef<[u8]>,
        headers: &[(&str, &str)],
    ) -> Result<MessageId, Error> {
        let headers = headers.iter().map(|&(name, value)| (name.to_owned(), value.to_owned())).collect();
        self.send(tx, topic, payload.as_ref(), headers).await
    }

    async fn send<C: TxContext + ?Sized>(
        &self,
        tx: &mut C,
        topic: &str,
        payload: &[u8],
        headers: Vec<(String, String)>,
    ) -> Result<MessageId, Error> {
        self.check(topic, payload, &headers)?;
        let conn = tx.connection();
        if !in_transaction::<C::Db>(conn) {
            return Err(Error::NoTransaction { scope: self.from.scope.clone() });
        }
        let from = &self.from;
        let (id, published) = match &from.ids {
            Ids::Call(published) => {
                (MessageId::for_call(&from.stored_scope, &from.key, published.next_ordinal()), Some(&**published))
            }
            Ids::Step(step) => {
                let ordinal = step.call.next_message.fetch_add(1, Ordering::Relaxed);
                (MessageId::for_step(step.as_str(), ordinal), None)
            }
        };
        let message = NewMessage {
            id: &id,
            scope: &from.stored_scope,
            key: &from.key,
            topic,
            payload,
            headers: &headers,
            retention: from.retention,
        };
        insert::<C::Db>(conn, &message, published).await?;
        Ok(id)
    }

    /// A message the relay can hand over as it is, within the limit.
    fn check(&self, topic: &str, payload: &[u8], headers: &[(String, String)]) -> Result<(), Error> {
        if topic.is_empty() || topic.len() > MAX_TOPIC || topic.chars().any(char::is_control) {
            let reason = format!("a topic is 1 to {MAX_TOPIC} bytes without control characters");
            return Err(invalid(topic, reason));
        }
        if headers.iter().any(|(name, value)| name.is_empty() || format!("{name}{value}").chars().any(char::is_control))
        {
            return Err(invalid(topic, "a header's name is not empty, and neither holds a control character".into()));
        }
        let len = payload.len() + headers.iter().map(|(name, value)| name.len() + value.len()).sum::<usize>();
        if len > self.max_payload {
            return Err(Error::MessageTooLarge { topic: topic.to_owned(), len, limit: self.max_payload });
        }
        Ok(())
    }
}

fn invalid(topic: &str, reason: String) -> Error {
    Error::InvalidMessage { topic: topic.escape_default().to_string(), reason }
}

impl std::fmt::Debug for Outbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbox")
            .field("scope", &self.from.scope)
            .field("step", &matches!(self.from.ids, Ids::Step(_)))
            .field("max_payload", &self.max_payload)
            .finish_non_exhaustive()
    }
}
