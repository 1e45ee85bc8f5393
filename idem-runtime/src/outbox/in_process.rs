//! [`InProcess`]: a broker inside the process, for tests and the embedded
//! demo. It confirms a message once every subscriber has it queued, and
//! can be told to misbehave as real brokers do (down for a while, a topic
//! refused, a confirmation lost, a slow confirm).

use std::collections::HashSet;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use super::publisher::{PublishError, Publisher};
use crate::future::BoxFuture;
use crate::store::sql::outbox::{Message, MessageId};

/// A broker inside the process: every [`subscribe`](Self::subscribe)r
/// receives every message published after it subscribed, with its id, in
/// the order of publishing. For tests, and for demos that run with no
/// server. Clones are the same broker.
///
/// Its knobs make it fail as a real broker does, for the relay's tests
/// (and a demo's story): [`down_for`](Self::down_for),
/// [`fail_next`](Self::fail_next), [`refuse`](Self::refuse),
/// [`lose_confirms`](Self::lose_confirms), [`latency`](Self::latency); what happened is counted
/// ([`delivered`](Self::delivered), [`overlapping`](Self::overlapping)).
#[derive(Clone, Default)]
pub struct InProcess {
    broker: Arc<Broker>,
}

#[derive(Default)]
struct Broker {
    subscribers: Mutex<Vec<UnboundedSender<Message>>>,
    refused: Mutex<Vec<(String, String)>>,
    down_until: Mutex<Option<Instant>>,
    fail_next: AtomicU32,
    lose_confirms: AtomicU32,
    latency: Mutex<Duration>,
    in_flight: Mutex<HashSet<MessageId>>,
    delivered: AtomicU64,
    overlapping: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl InProcess {
    /// A broker with no subscriber yet (a message published to none is
    /// confirmed and gone, as a fan-out exchange with no queue would).
    pub fn new() -> InProcess {
        InProcess::default()
    }

    /// Receive every message published from now on.
    pub fn subscribe(&self) -> UnboundedReceiver<Message> {
        let (tx, rx) = unbounded_channel();
        lock(&self.broker.subscribers).push(tx);
        rx
    }

    /// Be out of reach for `duration`: every publish fails as unavailable
    /// (the relay tries again later) until then.
    pub fn down_for(&self, duration: Duration) {
        *lock(&self.broker.down_until) = Some(Instant::now() + duration);
    }

    /// Be reachable again at once.
    pub fn up(&self) {
        *lock(&self.broker.down_until) = None;
    }

    /// Fail the next `n` publishes as unavailable, delivering nothing (a
    /// connection that dropped for a moment).
    pub fn fail_next(&self, n: u32) {
        self.broker.fail_next.store(n, Ordering::SeqCst);
    }

    /// Refuse every message to `topic`, saying `reason` (the relay
    /// dead-letters them).
    pub fn refuse(&self, topic: &str, reason: &str) {
        lock(&self.broker.refused).push((topic.to_owned(), reason.to_owned()));
    }

    /// Deliver the next `n` messages but lose their confirmations: the
    /// publisher reports them unavailable, as a client whose connection
    /// dropped after the broker took the message does.
    pub fn lose_confirms(&self, n: u32) {
        self.broker.lose_confirms.store(n, Ordering::SeqCst);
    }

    /// Confirm each message this long after delivering it.
    pub fn latency(&self, latency: Duration) {
        *lock(&self.broker.latency) = latency;
    }

    /// Messages delivered so far (each copy of a message sent again counts).
    pub fn delivered(&self) -> u64 {
        self.broker.delivered.load(Ordering::SeqCst)
    }

    /// How many times a message was published while another publish of the
    /// same id was still unconfirmed: two relays sending one message at
    /// once. The relay's claims keep it at 0.
    pub fn overlapping(&self) -> u64 {
        self.broker.overlapping.load(Ordering::SeqCst)
    }

    async fn accept(&self, message: &Message) -> Result<(), PublishError> {
        let broker = &*self.broker;
        if lock(&broker.down_until).is_some_and(|until| Instant::now() < until) {
            return Err(PublishError::unavailable("the in-process broker is down"));
        }
        if take_one(&broker.fail_next) {
            return Err(PublishError::unavailable("the in-process broker dropped the connection"));
        }
        if let Some((_, reason)) = lock(&broker.refused).iter().find(|(topic, _)| *topic == message.topic) {
            return Err(PublishError::refused(reason));
        }
        let _in_flight = InFlight::enter(broker, &message.id);
        lock(&broker.subscribers).retain(|subscriber| subscriber.send(message.clone()).is_ok());
        broker.delivered.fetch_add(1, Ordering::SeqCst);
        let latency = *lock(&broker.latency);
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        if take_one(&broker.lose_confirms) {
            return Err(PublishError::unavailable("the in-process broker's confirmation was lost"));
        }
        Ok(())
    }
}

/// Count one down from `n`, if it is not 0 yet.
fn take_one(n: &AtomicU32) -> bool {
    n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok()
}

/// A message between its delivery and its confirmation (or its publish
/// dropped).
struct InFlight<'a> {
    broker: &'a Broker,
    id: MessageId,
}

impl<'a> InFlight<'a> {
    fn enter(broker: &'a Broker, id: &MessageId) -> InFlight<'a> {
        if !lock(&broker.in_flight).insert(id.clone()) {
            broker.overlapping.fetch_add(1, Ordering::SeqCst);
        }
        InFlight { broker, id: id.clone() }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        lock(&self.broker.in_flight).remove(&self.id);
    }
}

impl Publisher for InProcess {
    fn kind(&self) -> &'static str {
        "in-process"
    }

    fn publish<'a>(&'a self, message: &'a Message) -> BoxFuture<'a, Result<(), PublishError>> {
        Box::pin(self.accept(message))
    }
}

impl std::fmt::Debug for InProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InProcess")
            .field("subscribers", &lock(&self.broker.subscribers).len())
            .field("delivered", &self.delivered())
            .finish_non_exhaustive()
    }
}
