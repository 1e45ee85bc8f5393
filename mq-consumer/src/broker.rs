//! The message broker of the consumer: RabbitMQ (lapin) when a URL
//! is given, an in-process queue with the same settlement semantics
//! otherwise. Messages carry the producer's business key in the
//! [`KEY_HEADER`] header.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use lapin::options::*;
use lapin::types::{AMQPValue, FieldTable};
use tokio::sync::{Notify, mpsc};

use crate::common::BoxError;

/// The header carrying the producer's business key.
pub const KEY_HEADER: &str = "x-idempotency-key";

/// One published message: the key header (if any) and the JSON body.
#[derive(Clone)]
pub struct Message {
    pub key: Option<String>,
    pub body: Vec<u8>,
}

/// The in-process broker: one queue with RabbitMQ's settlement semantics.
/// A nacked message goes back to the head of the queue, flagged
/// redelivered; a rejected one goes to the dead letters.
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

#[derive(Clone, Copy)]
pub enum Verdict {
    Ack,
    /// `basic.nack` with requeue: the broker delivers it again.
    Requeue,
    /// `basic.reject` without requeue: to the dead-letter queue.
    DeadLetter,
}

pub struct Delivery {
    pub msg: Message,
    pub redelivered: bool,
    settle: Settle,
}

impl Delivery {
    pub fn from_amqp(d: lapin::message::Delivery) -> Delivery {
        let key = d.properties.headers().as_ref().and_then(|h| match h.inner().get(KEY_HEADER) {
            Some(AMQPValue::LongString(key)) => Some(key.to_string()),
            _ => None,
        });
        Delivery { msg: Message { key, body: d.data }, redelivered: d.redelivered, settle: Settle::Amqp(d.acker) }
    }

    pub async fn settle(self, verdict: Verdict) -> Result<(), lapin::Error> {
        match (self.settle, verdict) {
            (Settle::Amqp(acker), Verdict::Ack) => acker.ack(BasicAckOptions::default()).await.map(drop),
            (Settle::Amqp(acker), Verdict::Requeue) => {
                acker.nack(BasicNackOptions { requeue: true, multiple: false }).await.map(drop)
            }
            (Settle::Amqp(acker), Verdict::DeadLetter) => {
                acker.reject(BasicRejectOptions { requeue: false }).await.map(drop)
            }
            (Settle::Local(_), Verdict::Ack) => Ok(()),
            (Settle::Local(queue), Verdict::Requeue) => {
                queue.push(self.msg, true);
                Ok(())
            }
            (Settle::Local(queue), Verdict::DeadLetter) => {
                queue.dead.fetch_add(1, Relaxed);
                Ok(())
            }
        }
    }
}

/// Where a consumer's deliveries come from.
pub enum Source {
    /// The deliveries of a consumer on the channel, which lives as long.
    Amqp(mpsc::UnboundedReceiver<Delivery>, #[allow(dead_code)] lapin::Channel),
    Local(Arc<LocalQueue>),
}

impl Source {
    pub async fn next(&mut self) -> Option<Delivery> {
        match self {
            Source::Amqp(rx, _) => rx.recv().await,
            Source::Local(queue) => Some(queue.next().await),
        }
    }
}

#[allow(clippy::large_enum_variant)] // one per program
pub enum Broker {
    Amqp { conn: lapin::Connection, publisher: lapin::Channel, queue: String },
    Local(Arc<LocalQueue>),
}

impl Broker {
    /// RabbitMQ at `url`: the queue (dead-lettering to `{queue}.dead`), both
    /// expiring 10 minutes after their last use; the in-process queue without.
    pub async fn connect(url: Option<&str>, queue: &str) -> Result<Broker, BoxError> {
        let Some(url) = url else { return Ok(Broker::Local(Arc::default())) };
        let conn = lapin::Connection::connect(url, lapin::ConnectionProperties::default()).await?;
        let publisher = conn.create_channel().await?;
        publisher.confirm_select(ConfirmSelectOptions::default()).await?;
        let mut args = FieldTable::default();
        args.insert("x-expires".into(), AMQPValue::LongInt(600_000));
        let dead = format!("{queue}.dead");
        publisher.queue_declare(dead.as_str().into(), QueueDeclareOptions::default(), args.clone()).await?;
        args.insert("x-dead-letter-exchange".into(), AMQPValue::LongString("".into()));
        args.insert("x-dead-letter-routing-key".into(), AMQPValue::LongString(dead.as_str().into()));
        publisher.queue_declare(queue.into(), QueueDeclareOptions::default(), args).await?;
        Ok(Broker::Amqp { conn, publisher, queue: queue.to_owned() })
    }

    /// Publish and wait for the broker's confirm.
    pub async fn publish(&self, msg: &Message, message_id: &str) -> Result<(), BoxError> {
        match self {
            Broker::Local(queue) => queue.push(msg.clone(), false),
            Broker::Amqp { publisher, queue, .. } => {
                let mut headers = FieldTable::default();
                if let Some(key) = &msg.key {
                    headers.insert(KEY_HEADER.into(), AMQPValue::LongString(key.as_str().into()));
                }
                let props = lapin::BasicProperties::default().with_message_id(message_id.into()).with_headers(headers);
                let options = BasicPublishOptions::default();
                publisher.basic_publish("".into(), queue.as_str().into(), options, &msg.body, props).await?.await?;
            }
        }
        Ok(())
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
        let (tx, rx) = mpsc::unbounded_channel();
        consumer.set_delegate(move |delivery: lapin::message::DeliveryResult| {
            let tx = tx.clone();
            async move {
                if let Ok(Some(delivery)) = delivery {
                    let _ = tx.send(Delivery::from_amqp(delivery));
                }
            }
        });
        Ok(Source::Amqp(rx, channel))
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

    pub async fn close(self) {
        if let Broker::Amqp { conn, publisher, queue } = self {
            for name in [format!("{queue}.dead"), queue] {
                let _ = publisher.queue_delete(name.as_str().into(), QueueDeleteOptions::default()).await;
            }
            let _ = conn.close(200, "done".into()).await;
        }
    }
}
