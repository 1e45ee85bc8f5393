//! The broker side of the consumer tests (`tests/mq.rs`, `tests/batch.rs`):
//! a queue of the test's own on the real RabbitMQ, dead-lettering to
//! `{queue}.dead`, expiring a minute after its last use should the test
//! fail, deleted by [`Bus::close`]; and consumers on it.

// Each test file uses its own part of this module.
#![allow(dead_code)]

use std::time::Duration;

use futures_util::StreamExt as _;
use idem_test_support::unique;
use lapin::message::Delivery;
use lapin::options::*;
use lapin::types::{AMQPValue, FieldTable};

pub const KEY_HEADER: &str = "x-idempotency-key";

pub const DEFAULT_AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// A connection to RabbitMQ at `IDEM_AMQP_URL` (default: the local broker),
/// or `None`: the test skips (see `common::reach`).
pub async fn amqp() -> Option<lapin::Connection> {
    let url = std::env::var("IDEM_AMQP_URL").unwrap_or_else(|_| DEFAULT_AMQP_URL.to_owned());
    idem_test_support::reach("RabbitMQ", &url, lapin::Connection::connect(&url, lapin::ConnectionProperties::default()))
        .await
}

/// A test's queue on the broker, dead-lettering to `{queue}.dead`.
pub struct Bus {
    pub conn: lapin::Connection,
    pub channel: lapin::Channel,
    pub queue: String,
}

impl Bus {
    pub async fn new() -> Option<Bus> {
        let conn = amqp().await?;
        let channel = conn.create_channel().await.unwrap();
        channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
        let queue = unique("idem-test-mq");
        let mut args = FieldTable::default();
        args.insert("x-expires".into(), AMQPValue::LongInt(60_000));
        let dead = format!("{queue}.dead");
        channel.queue_declare(dead.as_str().into(), QueueDeclareOptions::default(), args.clone()).await.unwrap();
        args.insert("x-dead-letter-exchange".into(), AMQPValue::LongString("".into()));
        let mut retry = args.clone();
        retry.insert("x-dead-letter-routing-key".into(), AMQPValue::LongString(queue.as_str().into()));
        let retries = format!("{queue}.retry");
        channel.queue_declare(retries.as_str().into(), QueueDeclareOptions::default(), retry).await.unwrap();
        args.insert("x-dead-letter-routing-key".into(), AMQPValue::LongString(dead.as_str().into()));
        channel.queue_declare(queue.as_str().into(), QueueDeclareOptions::default(), args).await.unwrap();
        Some(Bus { conn, channel, queue })
    }

    /// Publish a new message (a message id of its own) with the business
    /// key `key` in its header, and wait for the broker's confirm.
    pub async fn publish(&self, key: Option<&str>) {
        self.publish_body(key, b"{}").await
    }

    /// The same with a body.
    pub async fn publish_body(&self, key: Option<&str>, body: &[u8]) {
        let mut headers = FieldTable::default();
        if let Some(key) = key {
            headers.insert(KEY_HEADER.into(), AMQPValue::LongString(key.into()));
        }
        let props = lapin::BasicProperties::default().with_message_id(unique("m").into()).with_headers(headers);
        let queue = self.queue.as_str().into();
        let confirm = self.channel.basic_publish("".into(), queue, Default::default(), body, props).await.unwrap();
        confirm.await.unwrap();
    }

    /// A consumer on a channel of its own, holding up to `prefetch` unacked deliveries.
    pub async fn consumer(&self, prefetch: u16) -> Consumer {
        let channel = self.conn.create_channel().await.unwrap();
        channel.basic_qos(prefetch, BasicQosOptions::default()).await.unwrap();
        let tag = unique("consumer");
        let queue = self.queue.as_str().into();
        let consumer =
            channel.basic_consume(queue, tag.into(), Default::default(), FieldTable::default()).await.unwrap();
        Consumer { consumer, _channel: channel }
    }

    /// The next message of the dead-letter queue (dead-lettering is asynchronous).
    pub async fn dead_letter(&self) -> Option<Delivery> {
        let dead = format!("{}.dead", self.queue);
        for _ in 0..100 {
            let got = self.channel.basic_get(dead.as_str().into(), BasicGetOptions::default()).await.unwrap();
            if let Some(got) = got {
                return Some(got.delivery);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }

    pub async fn close(self) {
        for name in [format!("{}.dead", self.queue), format!("{}.retry", self.queue), self.queue.clone()] {
            let _ = self.channel.queue_delete(name.as_str().into(), QueueDeleteOptions::default()).await;
        }
        let _ = self.conn.close(200, "done".into()).await;
    }
}

/// Read as a stream, in the queue's order (a delegate would be spawned per
/// delivery, in any order).
pub struct Consumer {
    consumer: lapin::Consumer,
    _channel: lapin::Channel,
}

impl Consumer {
    pub async fn next(&mut self) -> Delivery {
        let next = tokio::time::timeout(Duration::from_secs(5), self.consumer.next()).await;
        next.expect("a delivery within 5s").expect("the consumer is open").unwrap()
    }

    /// Nothing more is delivered within `ms`.
    pub async fn idle(&mut self, ms: u64) -> bool {
        tokio::time::timeout(Duration::from_millis(ms), self.consumer.next()).await.is_err()
    }
}
