//! The message broker of the consumer: RabbitMQ (lapin) when a URL
//! is given, an in-process queue with the same settlement semantics
//! otherwise. Messages carry the producer's business key in the
//! [`KEY_HEADER`] header.
//!
//! A failed message is retried by publishing a copy (its attempts counted
//! in [`ATTEMPTS_HEADER`], its last error in [`ERROR_HEADER`]) to
//! `{queue}.retry`, where it waits out a backoff ([`retry_delay`], the
//! copy's expiration) before RabbitMQ dead-letters it back to the back of
//! its queue, and then acknowledging the delivery: a store that is down
//! for a moment does not use up a message's attempts in milliseconds.
//! Dead-lettered, the copy goes to `{queue}.dead` instead. A classic queue counts no
//! deliveries (a quorum queue's `x-delivery-count` would, but its own
//! dead-lettering keeps no error), and at the back of the queue a poison
//! message does not hold up the ones behind it. Published (and confirmed)
//! before the ack: a crash between the two leaves a second copy, never none.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt as _;
use lapin::options::*;
use lapin::types::{AMQPValue, FieldTable};
use tokio::sync::Notify;

use crate::common::BoxError;

/// The header carrying the producer's business key.
pub const KEY_HEADER: &str = "x-idempotency-key";
/// The attempts a retried or dead-lettered copy has had.
pub const ATTEMPTS_HEADER: &str = "x-idem-attempts";
/// The error of a retried or dead-lettered copy's last attempt.
pub const ERROR_HEADER: &str = "x-idem-error";

/// How long a copy waits before its next attempt: 200 ms after the
/// first, doubling, at most 10 s. (The in-process queue retries at once.)
pub fn retry_delay(attempts: u32) -> Duration {
    let doubled = 200u64.saturating_mul(1 << attempts.saturating_sub(1).min(16));
    Duration::from_millis(doubled.min(10_000))
}

/// One published message: the key header (if any), the JSON body, and the
/// attempts it has had, with the last one's error.
#[derive(Clone, Default)]
pub struct Message {
    pub key: Option<String>,
    pub body: Vec<u8>,
    pub attempts: u32,
    pub error: Option<String>,
    /// The producer's AMQP `message_id`, kept by retried and dead-lettered copies.
    pub message_id: Option<String>,
}

impl Message {
    /// The copy that is retried or dead-lettered after a failed attempt.
    fn after_failure(&self, error: &str) -> Message {
        Message { attempts: self.attempts + 1, error: Some(error.to_owned()), ..self.clone() }
    }

    fn headers(&self) -> FieldTable {
        let mut headers = FieldTable::default();
        if let Some(key) = &self.key {
            headers.insert(KEY_HEADER.into(), AMQPValue::LongString(key.as_str().into()));
        }
        if self.attempts > 0 {
            headers.insert(ATTEMPTS_HEADER.into(), AMQPValue::LongLongInt(self.attempts.into()));
        }
        if let Some(error) = &self.error {
            headers.insert(ERROR_HEADER.into(), AMQPValue::LongString(error.as_str().into()));
        }
        headers
    }

    fn from_headers(headers: Option<&FieldTable>, body: Vec<u8>) -> Message {
        let get = |name: &str| headers.and_then(|h| h.inner().get(name));
        let text = |name| match get(name) {
            Some(AMQPValue::LongString(text)) => Some(text.to_string()),
            _ => None,
        };
        let attempts = match get(ATTEMPTS_HEADER) {
            Some(AMQPValue::LongLongInt(n)) => u32::try_from(*n).unwrap_or(u32::MAX),
            _ => 0,
        };
        Message { key: text(KEY_HEADER), body, attempts, error: text(ERROR_HEADER), message_id: None }
    }
}

/// The in-process broker: one queue with RabbitMQ's settlement semantics.
/// A nacked message goes back to the head of the queue, flagged
/// redelivered.
#[derive(Default)]
pub struct LocalQueue {
    ready: Mutex<VecDeque<(Message, bool)>>,
    pub dead: AtomicUsize,
    more: Notify,
}

impl LocalQueue {
    pub fn push(&self, msg: Message, redelivered: bool) {
        let mut ready = self.ready.lock().unwrap();
        if redelivered {
            ready.push_front((msg, true))
        } else {
            ready.push_back((msg, false))
        }
        self.more.notify_one();
    }

    pub async fn next(self: &Arc<Self>) -> Delivery {
        loop {
            let more = self.more.notified();
            let popped = {
                let mut ready = self.ready.lock().unwrap();
                let popped = ready.pop_front();
                if !ready.is_empty() {
                    self.more.notify_one(); // let the other consumer take the next one
                }
                popped
            };
            if let Some((msg, redelivered)) = popped {
                return Delivery { msg, redelivered, settle: Settle::Local(self.clone()) };
            }
            more.await;
        }
    }
}

enum Settle {
    Amqp(lapin::Acker),
    Local(Arc<LocalQueue>),
}

pub enum Verdict {
    Ack,
    /// `basic.nack` with requeue: the broker delivers it again.
    Requeue,
    /// The attempt failed with this error: a copy to the back of the queue,
    /// after its backoff.
    Retry(String),
    /// The last attempt failed with this error: a copy to the dead letters.
    DeadLetter(String),
}

pub struct Delivery {
    pub msg: Message,
    pub redelivered: bool,
    settle: Settle,
}

impl Delivery {
    pub fn from_amqp(d: lapin::message::Delivery) -> Delivery {
        let mut msg = Message::from_headers(d.properties.headers().as_ref(), d.data);
        // A retried or dead-lettered copy keeps the producer's message id.
        msg.message_id = d.properties.message_id().as_ref().map(|id| id.to_string());
        Delivery { msg, redelivered: d.redelivered, settle: Settle::Amqp(d.acker) }
    }

    /// Settle the delivery; a retry's or a dead letter's copy is published
    /// (and confirmed) on `broker` first.
    pub async fn settle(self, verdict: Verdict, broker: &Broker) -> Result<(), BoxError> {
        let copy = match &verdict {
            Verdict::Retry(error) => Some((self.msg.after_failure(error), false)),
            Verdict::DeadLetter(error) => Some((self.msg.after_failure(error), true)),
            Verdict::Ack | Verdict::Requeue => None,
        };
        match self.settle {
            Settle::Amqp(acker) => {
                if let Some((copy, dead)) = copy {
                    broker.publish_copy(&copy, dead).await?;
                }
                match verdict {
                    Verdict::Requeue => acker.nack(BasicNackOptions { requeue: true, multiple: false }).await?,
                    _ => acker.ack(BasicAckOptions::default()).await?,
                };
            }
            Settle::Local(queue) => match (verdict, copy) {
                (Verdict::Requeue, _) => queue.push(self.msg, true),
                (_, Some((_, true))) => _ = queue.dead.fetch_add(1, Relaxed),
                (_, Some((copy, false))) => queue.push(copy, false),
                (_, None) => {}
            },
        }
        Ok(())
    }
}

/// Where a consumer's deliveries come from.
#[allow(clippy::large_enum_variant)] // one per consumer task
pub enum Source {
    /// A consumer on the channel, which lives as long. Read as a stream, in
    /// the queue's order (a delegate would be spawned per delivery, in any).
    Amqp(lapin::Consumer, #[allow(dead_code)] lapin::Channel),
    Local(Arc<LocalQueue>),
}

impl Source {
    pub async fn next(&mut self) -> Option<Delivery> {
        match self {
            Source::Amqp(consumer, _) => match consumer.next().await? {
                Ok(delivery) => Some(Delivery::from_amqp(delivery)),
                Err(e) => {
                    eprintln!("   !! the consumer stopped: {e}");
                    None
                }
            },
            Source::Local(queue) => Some(queue.next().await),
        }
    }

    /// The next delivery, and those that follow it within `linger`, up to
    /// `max` in all.
    pub async fn next_batch(&mut self, max: usize, linger: Duration) -> Option<Vec<Delivery>> {
        let mut batch = vec![self.next().await?];
        let deadline = tokio::time::Instant::now() + linger;
        while batch.len() < max {
            match tokio::time::timeout_at(deadline, self.next()).await {
                Ok(Some(delivery)) => batch.push(delivery),
                Ok(None) | Err(_) => break,
            }
        }
        Some(batch)
    }
}

#[allow(clippy::large_enum_variant)] // one per program
pub enum Broker {
    /// `owned`: the queues are this program's, deleted by [`Broker::close`].
    Amqp {
        conn: lapin::Connection,
        publisher: lapin::Channel,
        queue: String,
        owned: bool,
    },
    Local(Arc<LocalQueue>),
}

impl Broker {
    /// RabbitMQ at `url`: the queue (dead-lettering to `{queue}.dead`),
    /// its retries and its dead letters; the in-process queue without. The
    /// program deletes them when it ends. Only the queue expires (10 minutes
    /// after its last consumer, if the program died): the retry and dead-letter
    /// queues have no consumer, and an expiry would delete them, and their
    /// messages, while the program still runs.
    pub async fn connect(url: Option<&str>, queue: &str) -> Result<Broker, BoxError> {
        let Some(url) = url else { return Ok(Broker::Local(Arc::default())) };
        let (conn, publisher) = Broker::open(url).await?;
        let mut args = FieldTable::default();
        let dead = format!("{queue}.dead");
        publisher.queue_declare(dead.as_str().into(), QueueDeclareOptions::default(), args.clone()).await?;
        args.insert("x-dead-letter-exchange".into(), AMQPValue::LongString("".into()));
        // A retry's copy, its backoff passed, goes back to the queue.
        let mut retry = args.clone();
        retry.insert("x-dead-letter-routing-key".into(), AMQPValue::LongString(queue.into()));
        let retries = format!("{queue}.retry");
        publisher.queue_declare(retries.as_str().into(), QueueDeclareOptions::default(), retry).await?;
        args.insert("x-dead-letter-routing-key".into(), AMQPValue::LongString(dead.as_str().into()));
        args.insert("x-expires".into(), AMQPValue::LongInt(600_000));
        publisher.queue_declare(queue.into(), QueueDeclareOptions::default(), args).await?;
        Ok(Broker::Amqp { conn, publisher, queue: queue.to_owned(), owned: true })
    }

    /// RabbitMQ at `url`, on the queues `queue`, `{queue}.retry` and
    /// `{queue}.dead` that someone else declared (and deletes).
    pub async fn attach(url: &str, queue: &str) -> Result<Broker, BoxError> {
        let (conn, publisher) = Broker::open(url).await?;
        let passive = QueueDeclareOptions { passive: true, ..Default::default() };
        for name in [queue.to_owned(), format!("{queue}.retry"), format!("{queue}.dead")] {
            publisher.queue_declare(name.as_str().into(), passive, FieldTable::default()).await?;
        }
        Ok(Broker::Amqp { conn, publisher, queue: queue.to_owned(), owned: false })
    }

    /// A connection and a channel with publisher confirms.
    async fn open(url: &str) -> Result<(lapin::Connection, lapin::Channel), BoxError> {
        let conn = lapin::Connection::connect(url, lapin::ConnectionProperties::default()).await?;
        let publisher = conn.create_channel().await?;
        publisher.confirm_select(ConfirmSelectOptions::default()).await?;
        Ok((conn, publisher))
    }

    /// Publish and wait for the broker's confirm.
    pub async fn publish(&self, msg: &Message, message_id: &str) -> Result<(), BoxError> {
        match self {
            Broker::Local(queue) => queue.push(msg.clone(), false),
            Broker::Amqp { queue, .. } => {
                let msg = Message { message_id: Some(message_id.to_owned()), ..msg.clone() };
                self.publish_to(queue, &msg, None).await?
            }
        }
        Ok(())
    }

    /// A failed message's copy: to wait out its backoff and then the back
    /// of the queue, or to the dead letters.
    async fn publish_copy(&self, copy: &Message, dead: bool) -> Result<(), BoxError> {
        let Broker::Amqp { queue, .. } = self else { unreachable!("local copies are pushed by the delivery") };
        if dead {
            return self.publish_to(&format!("{queue}.dead"), copy, None).await;
        }
        self.publish_to(&format!("{queue}.retry"), copy, Some(retry_delay(copy.attempts))).await
    }

    async fn publish_to(&self, name: &str, msg: &Message, expiration: Option<Duration>) -> Result<(), BoxError> {
        let Broker::Amqp { publisher, .. } = self else { unreachable!() };
        let mut props = lapin::BasicProperties::default().with_headers(msg.headers());
        if let Some(id) = &msg.message_id {
            props = props.with_message_id(id.as_str().into());
        }
        if let Some(wait) = expiration {
            props = props.with_expiration(wait.as_millis().to_string().into());
        }
        // Mandatory: a copy no queue takes (its queue gone) comes back, and
        // the delivery it replaces is not acknowledged.
        let options = BasicPublishOptions { mandatory: true, ..Default::default() };
        match publisher.basic_publish("".into(), name.into(), options, &msg.body, props).await?.await? {
            lapin::Confirmation::Ack(None) => Ok(()),
            lapin::Confirmation::Ack(Some(_)) => Err(format!("no queue `{name}` took the message").into()),
            other => Err(format!("the broker did not take the message for `{name}`: {other:?}").into()),
        }
    }

    /// A consumer of its own (a channel with `prefetch` unacked deliveries).
    pub async fn subscribe(&self, tag: &str, prefetch: u16) -> Result<Source, BoxError> {
        let Broker::Amqp { conn, queue, .. } = self else {
            let Broker::Local(queue) = self else { unreachable!() };
            return Ok(Source::Local(queue.clone()));
        };
        let channel = conn.create_channel().await?;
        channel.basic_qos(prefetch, BasicQosOptions::default()).await?;
        let options = BasicConsumeOptions::default();
        let consumer = channel.basic_consume(queue.as_str().into(), tag.into(), options, FieldTable::default()).await?;
        Ok(Source::Amqp(consumer, channel))
    }

    /// Messages in the dead-letter queue.
    pub async fn dead_letters(&self) -> Result<usize, BoxError> {
        match self {
            Broker::Local(queue) => Ok(queue.dead.load(Relaxed)),
            Broker::Amqp { publisher, queue, .. } => {
                let passive = QueueDeclareOptions { passive: true, ..Default::default() };
                let dead = format!("{queue}.dead");
                let declared = publisher.queue_declare(dead.as_str().into(), passive, FieldTable::default()).await?;
                Ok(declared.message_count() as usize)
            }
        }
    }

    /// Close the connection, deleting the queues if they are this program's.
    pub async fn close(&self) {
        if let Broker::Amqp { conn, publisher, queue, owned } = self {
            for name in
                [format!("{queue}.dead"), format!("{queue}.retry"), queue.clone()].into_iter().filter(|_| *owned)
            {
                let _ = publisher.queue_delete(name.as_str().into(), QueueDeleteOptions::default()).await;
            }
            let _ = conn.close(200, "done".into()).await;
        }
    }
}
