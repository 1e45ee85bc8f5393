//! [`Relay`]: hands the outbox's messages to a [`Publisher`] after their
//! transactions committed, and marks them sent once the broker confirmed.
//!
//! A round: claim a batch (each row by lease: owner and deadline, in one
//! short statement or transaction), publish its messages, each awaited to
//! the broker's confirmation, then mark the confirmed ones sent and settle
//! the others, each conditional on this round's claim. No lock is held
//! while the broker is busy (a SQLite write lock would stop every writer).
//! A relay stops publishing a tenth of its lease before the lease ends, so
//! no other relay, which may claim the message once the lease has passed,
//! ever publishes it at the same time; a relay that stopped (a crash, a
//! deploy) leaves its claims to run out, and the messages it published but
//! did not mark are published again, with the same ids.

use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;

use super::publisher::{PublishError, Publisher};
use crate::error::Error;
use crate::store::sql::SqlBackend;
use crate::store::sql::outbox::{
    BatchRequest, HOT_FOR, HOT_POLL, Message, OutboxSql, claim, mark_sent, release, settle,
};

/// Takes the outbox's messages to a broker: a task a service starts
/// ([`start`](Self::start)), or rounds run one at a time
/// ([`run_once`](Self::run_once), [`drain`](Self::drain)). Several relays
/// (of one process or several) share the work safely; see `docs/outbox.md`
/// for the protocol.
///
/// It works on the outbox beside the installed record table
/// ([`RecordTable::outbox`](crate::sql::RecordTable::outbox)). On
/// PostgreSQL it listens for commits (`LISTEN`, on a connection of `pool`
/// held for it) and polls as well; elsewhere it polls.
pub struct Relay<DB: SqlBackend> {
    pool: sqlx::Pool<DB>,
    publisher: Arc<dyn Publisher>,
    /// The relay's name in the table's `claimed_by`, and its rounds.
    name: String,
    rounds: AtomicU64,
    scopes: Vec<String>,
    batch_size: u32,
    poll_interval: Duration,
    backoff: (Duration, Duration),
    max_attempts: u32,
    claim_lease: Duration,
    max_in_flight: usize,
    listen: bool,
    claim: OnceLock<DB::BatchClaim>,
}

/// What a round (or [`Relay::drain`]'s rounds) did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayReport {
    /// Messages claimed.
    pub claimed: usize,
    /// Confirmed by the broker and marked sent.
    pub sent: usize,
    /// Failed, to be tried again after a pause.
    pub retried: usize,
    /// Refused by the broker, or failed too often: dead-lettered.
    pub dead: usize,
    /// Claimed but not tried (the claim's lease was running out): handed back.
    pub released: usize,
}

impl std::ops::AddAssign for RelayReport {
    fn add_assign(&mut self, other: RelayReport) {
        self.claimed += other.claimed;
        self.sent += other.sent;
        self.retried += other.retried;
        self.dead += other.dead;
        self.released += other.released;
    }
}

/// How one message of a round went.
enum Outcome {
    Sent,
    Failed(PublishError),
    NotTried,
}

impl<DB: SqlBackend> Relay<DB> {
    /// A relay of the messages in `pool`'s outbox to `publisher`, with the
    /// defaults: batches of 100, a poll every second, tries after 1 s,
    /// 2 s, 4 s ... up to 5 minutes apart, dead after 20 tries, claims of
    /// 30 s, 32 messages in flight.
    pub fn new(pool: sqlx::Pool<DB>, publisher: impl Publisher + 'static) -> Relay<DB> {
        Relay {
            pool,
            publisher: Arc::new(publisher),
            name: format!("relay-{}", crate::lease::new_owner()),
            rounds: AtomicU64::new(0),
            scopes: Vec::new(),
            batch_size: 100,
            poll_interval: Duration::from_secs(1),
            backoff: (Duration::from_secs(1), Duration::from_secs(300)),
            max_attempts: 20,
            claim_lease: Duration::from_secs(30),
            max_in_flight: 32,
            listen: true,
            claim: OnceLock::new(),
        }
    }

    /// Claim at most `n` messages a round (at least 1). Only a key's first
    /// pending message is claimable, so a batch holds one message a key.
    pub fn batch_size(mut self, n: u32) -> Relay<DB> {
        self.batch_size = n.max(1);
        self
    }

    /// How long an idle relay waits before it looks again (on PostgreSQL a
    /// commit wakes it sooner). A round that sent something is followed by
    /// the next at once.
    pub fn poll_interval(mut self, interval: Duration) -> Relay<DB> {
        self.poll_interval = interval;
        self
    }

    /// The pause before a failed message's next try: `base` after its first
    /// try, doubling after each one, never over `max`.
    pub fn backoff(mut self, base: Duration, max: Duration) -> Relay<DB> {
        self.backoff = (base, max.max(base));
        self
    }

    /// Dead-letter a message once this many tries failed (at least 1).
    /// With the backoff, it bounds how long a broker may be down before
    /// messages go dead (the defaults: about an hour).
    pub fn max_attempts(mut self, n: u32) -> Relay<DB> {
        self.max_attempts = n.max(1);
        self
    }

    /// How long a claim keeps a message from other relays (at least 10
    /// ms). It bounds how long a relay that stopped mid-round holds its
    /// messages back, and how long a broker may take to confirm one: a
    /// publish still unconfirmed when a tenth of the lease is left is
    /// given up and tried again later.
    pub fn claim_lease(mut self, lease: Duration) -> Relay<DB> {
        self.claim_lease = lease.max(Duration::from_millis(10));
        self
    }

    /// Publish at most `n` messages of a round at once (at least 1).
    pub fn max_in_flight(mut self, n: usize) -> Relay<DB> {
        self.max_in_flight = n.max(1);
        self
    }

    /// Whether a started relay listens for commits on PostgreSQL (default:
    /// yes, on a connection of its pool held for it). Off, it polls only,
    /// as on the other databases: one connection fewer, a commit waits up
    /// to `poll_interval`.
    pub fn listen(mut self, listen: bool) -> Relay<DB> {
        self.listen = listen;
        self
    }

    /// Relay only the messages of `scope` (as the guard names it); call
    /// again to add more. None named: every scope's. For services that
    /// share a database and each relay their own messages.
    pub fn scope(mut self, scope: &str) -> Relay<DB> {
        self.scopes.push(crate::key::stored_scope(scope).into_owned());
        self
    }

    /// One round: claim a batch, publish it, mark what the broker
    /// confirmed. What it did; an error is the database's (messages
    /// claimed by a round that failed go back when their claim runs out).
    pub async fn run_once(&self) -> Result<RelayReport, Error> {
        let owner = format!("{}-{:x}", self.name, self.rounds.fetch_add(1, Ordering::Relaxed));
        let started = Instant::now();
        let statements =
            self.claim.get_or_init(|| <DB as OutboxSql>::claim_statements(self.outbox(), self.scopes.len()));
        let request =
            BatchRequest { owner: &owner, lease: self.claim_lease, batch: self.batch_size, scopes: &self.scopes };
        let messages = claim::<DB>(&mut *self.pool.acquire().await?, statements, &request).await?;
        let mut report = RelayReport { claimed: messages.len(), ..RelayReport::default() };
        if messages.is_empty() {
            return Ok(report);
        }
        // Measured from before the claim: the database's lease began later.
        let deadline = started + self.claim_lease - self.claim_lease / 10;
        let outcomes: Vec<(Message, Outcome)> = futures_util::stream::iter(messages)
            .map(|message| async move {
                let outcome = self.hand_over(&message, deadline).await;
                (message, outcome)
            })
            .buffer_unordered(self.max_in_flight)
            .collect()
            .await;
        let mut conn = self.pool.acquire().await?;
        let (mut sent, mut not_tried) = (Vec::new(), Vec::new());
        for (message, outcome) in &outcomes {
            match outcome {
                Outcome::Sent => sent.push(message.seq),
                Outcome::NotTried => not_tried.push(message.seq),
                Outcome::Failed(e) => {
                    let dead = e.is_refused() || message.attempt >= self.max_attempts;
                    let delay = self.pause_after(message.attempt);
                    settle::<DB>(&mut conn, message.seq, &owner, dead, delay, &e.to_string()).await?;
                    self.failed(message, e, dead, delay);
                    if dead { report.dead += 1 } else { report.retried += 1 }
                }
            }
        }
        report.sent = usize::try_from(mark_sent::<DB>(&mut conn, &owner, &sent).await?).unwrap_or(usize::MAX);
        release::<DB>(&mut conn, &owner, &not_tried).await?;
        report.released = not_tried.len();
        Ok(report)
    }

    /// Run rounds until one claims nothing: every message due now has been
    /// handed over (or failed, and waits for its next try). For tests and
    /// for a relay run by hand.
    pub async fn drain(&self) -> Result<RelayReport, Error> {
        let mut total = RelayReport::default();
        loop {
            let round = self.run_once().await?;
            total += round;
            if round.claimed == 0 {
                return Ok(total);
            }
        }
    }

    /// Run rounds on a task of its own until the handle stops it: at once
    /// after a round that sent something, else after the poll interval or
    /// when a commit wakes it (PostgreSQL). A round that fails (the
    /// database is down) is logged and tried again after the poll
    /// interval. Needs a Tokio runtime.
    pub fn start(self) -> RelayHandle
    where
        DB: 'static,
    {
        let relay = Arc::new(self);
        let wake = Arc::new(tokio::sync::Notify::new());
        let listener = if relay.listen { DB::wake_on_commit(&relay.pool, relay.outbox(), wake.clone()) } else { None };
        let listening = listener.is_some();
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let total = Arc::new(std::sync::Mutex::new(RelayReport::default()));
        let sum = total.clone();
        let task = tokio::spawn(async move { relay.run(wake, listening, stopped, &sum).await });
        RelayHandle { stop, task: Some(task), listener, total }
    }

    /// Rounds until stopped. `listening`: commits wake it; then, for
    /// [`HOT_FOR`] after a wake or a round that found messages, it looks
    /// again every [`HOT_POLL`] (a process notifies at most once per
    /// [`WAKE_EVERY`](crate::store::sql::outbox::WAKE_EVERY), so a message
    /// committed just after another may not wake it).
    async fn run(
        &self,
        wake: Arc<tokio::sync::Notify>,
        listening: bool,
        mut stopped: tokio::sync::watch::Receiver<bool>,
        total: &std::sync::Mutex<RelayReport>,
    ) {
        let mut hot_until = None;
        while !*stopped.borrow() {
            let round = self.run_once().await;
            if let Ok(round) = &round {
                *total.lock().unwrap_or_else(std::sync::PoisonError::into_inner) += *round;
            }
            match round {
                Ok(round) if round.claimed > 0 => {
                    hot_until = listening.then(|| Instant::now() + HOT_FOR);
                    if round.sent > 0 {
                        continue;
                    }
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(target: "idem", error = %e, publisher = self.publisher.kind(),
                    "outbox relay: a round failed; trying again after the poll interval"),
            }
            let pause = match hot_until {
                Some(until) if Instant::now() < until => HOT_POLL.min(self.poll_interval),
                _ => self.poll_interval,
            };
            tokio::select! {
                () = wake.notified() => hot_until = Some(Instant::now() + HOT_FOR),
                () = tokio::time::sleep(pause) => {}
                _ = stopped.changed() => {}
            }
        }
    }

    /// Publish `message` unless the claim's lease is running out; a publish
    /// still unconfirmed then is given up (and tried again later).
    async fn hand_over(&self, message: &Message, deadline: Instant) -> Outcome {
        if Instant::now() >= deadline {
            return Outcome::NotTried;
        }
        match tokio::time::timeout_at(deadline.into(), self.publisher.publish(message)).await {
            Ok(Ok(())) => Outcome::Sent,
            Ok(Err(e)) => Outcome::Failed(e),
            Err(_) => Outcome::Failed(PublishError::unavailable(format_args!(
                "no confirmation before the relay's claim ({:?}) ran out",
                self.claim_lease
            ))),
        }
    }

    /// The pause after a message's `attempt`-th try failed.
    fn pause_after(&self, attempt: u32) -> Duration {
        let (base, max) = self.backoff;
        let doublings = attempt.saturating_sub(1).min(32);
        base.saturating_mul(1 << doublings.min(31)).min(max)
    }

    fn failed(&self, message: &Message, e: &PublishError, dead: bool, delay: Duration) {
        let publisher = self.publisher.kind();
        if dead {
            tracing::warn!(target: "idem", id = %message.id, topic = %message.topic, attempt = message.attempt,
                publisher, error = %e, "outbox message dead-lettered; an operator can re-send it");
        } else {
            tracing::debug!(target: "idem", id = %message.id, topic = %message.topic, attempt = message.attempt,
                publisher, error = %e, retry_in = ?delay, "outbox message not confirmed; tried again later");
        }
    }

    fn outbox(&self) -> &'static str {
        crate::stores::record_sql().table().outbox()
    }
}

impl<DB: SqlBackend> std::fmt::Debug for Relay<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("name", &self.name)
            .field("publisher", &self.publisher.kind())
            .field("scopes", &self.scopes)
            .field("batch_size", &self.batch_size)
            .field("poll_interval", &self.poll_interval)
            .field("backoff", &self.backoff)
            .field("max_attempts", &self.max_attempts)
            .field("claim_lease", &self.claim_lease)
            .field("max_in_flight", &self.max_in_flight)
            .field("listen", &self.listen)
            .finish_non_exhaustive()
    }
}

/// A started relay ([`Relay::start`]). [`stop`](Self::stop) ends it after
/// its round; dropping the handle stops it at once, mid-round if it is in
/// one (as a crash would: what it claimed waits for its claim to run out,
/// and what it published but did not mark is published again).
#[derive(Debug)]
pub struct RelayHandle {
    stop: tokio::sync::watch::Sender<bool>,
    task: Option<tokio::task::JoinHandle<()>>,
    listener: Option<tokio::task::JoinHandle<()>>,
    total: Arc<std::sync::Mutex<RelayReport>>,
}

impl RelayHandle {
    /// What its rounds did so far, added up.
    pub fn report(&self) -> RelayReport {
        *self.total.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Stop after the round in progress (its messages marked), and wait
    /// for it.
    pub async fn stop(mut self) {
        let _ = self.stop.send(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for RelayHandle {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
        if let Some(listener) = &self.listener {
            listener.abort();
        }
    }
}
