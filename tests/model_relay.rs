//! The outbox relay's protocol, model-checked: commits, claims by lease,
//! publishes, the broker's confirmations, marks, crashes and the
//! consumer's dedup by message id, over the table's abstract semantics
//! (each statement one atomic step, leases on the database's clock), with
//! every interleaving of two relays that crash and start over, a broker
//! that loses a confirmation or drops a connection, a consumer that stops
//! between its effect and its ack, an operator's re-send, and a clock that
//! moves on its own.
//!
//! What the relay must hold, checked in every reachable state:
//! - a message marked sent was delivered (the mark follows the broker's
//!   confirmation, never precedes it);
//! - a key's messages are first delivered in the order they were
//!   committed;
//! - no message is published by two relays at once (a relay publishes
//!   only while its claim lasts, by a margin, and gives up a publish the
//!   broker has not confirmed by then);
//! - a message takes effect once at the consumer, however often it is
//!   delivered (the effect and the dedup record commit together).
//!
//! And it can get there: every message delivered, consumed once and
//! marked sent, with one taken twice by the consumer on the way.
//!
//! Then each rule is broken, one per test, and the checker must find the
//! state that breaks a property: a mark before the broker's confirmation,
//! a claim without its condition (a live claim of another relay, the row
//! lock of `FOR UPDATE SKIP LOCKED`), a claim of a key's later message
//! while an earlier one is pending.

use std::hash::Hash;

use stateright::{Checker, Model, Property};

/// The messages, in commit order, as the key each belongs to: one key's
/// two messages (another key's would only add states: a key's order is
/// checked against its own messages).
const KEYS: [u8; MESSAGES] = [0, 0];
const MESSAGES: usize = 2;
/// Relays sharing the outbox.
const RELAYS: usize = 2;
/// A claim's length, in ticks of the database's clock. A relay publishes
/// only before its last tick (the margin: the relay stops a tenth of its
/// lease early, measured from before its claim).
const LEASE: u8 = 3;
/// The clock's end: the model is finite.
const END: u8 = 3;
/// Faults in one history, at most, each kind: relay crashes, publishes
/// that fail (a lost confirmation, a dropped connection), consumer
/// crashes between effect and ack, operator re-sends.
const CRASHES: u8 = 1;
const FAILURES: u8 = 1;
const CONSUMER_CRASHES: u8 = 1;
const RESENDS: u8 = 1;

/// A rule of the protocol broken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bug {
    /// The relay marks a message sent before the broker confirmed it (in
    /// fact before it published it).
    MarkBeforeConfirm,
    /// A claim takes a message whatever holds it: no claim condition, no
    /// row lock.
    ClaimWithoutLock,
    /// A claim takes any pending message, not only its key's first.
    ClaimOutOfOrder,
}

/// A relay's claim of a row: whose, and until when by the database's
/// clock. (The relay's conditional statements match its round's owner
/// name; the relay's own id does here: a relay holds one claim at a time,
/// and a claim of its own on that row can only be that one.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Lease {
    relay: u8,
    until: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Row {
    /// Its transaction has not committed yet.
    Uncommitted,
    Pending(Option<Lease>),
    Sent,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Relay {
    Idle,
    /// Claimed `msg` until `until`; `marked` with
    /// `MarkBeforeConfirm` once it marked it sent already.
    Holding {
        msg: u8,
        until: u8,
        marked: bool,
    },
    /// Handed `msg` to the broker; `taken` once the broker delivered it.
    Publishing {
        msg: u8,
        until: u8,
        taken: bool,
        marked: bool,
    },
    /// The broker confirmed `msg`: the mark comes next.
    Confirmed {
        msg: u8,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    now: u8,
    rows: [Row; MESSAGES],
    relays: [Relay; RELAYS],
    /// The messages the broker ever took (as bits), and its queue: the
    /// deliveries the consumer has not acked yet, in order.
    delivered: u8,
    queue: Vec<u8>,
    /// The consumer: whether it applied the queue's first delivery
    /// (committed its effect and its dedup record) and not yet acked it;
    /// the effects per message (a dedup record exists where one is 1);
    /// the messages it acked (as bits), and whether it took one twice.
    applied: bool,
    effects: [u8; MESSAGES],
    acked: u8,
    taken_twice: bool,
    crashes: u8,
    failures: u8,
    consumer_crashes: u8,
    resends: u8,
    /// A message first delivered while an earlier one of its key was not
    /// delivered yet.
    overtaken: bool,
    /// A publish started while another relay's publish of that message was
    /// unconfirmed.
    overlapping: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Action {
    Tick,
    Commit(u8),
    Claim(usize, u8),
    MarkEarly(usize),
    Publish(usize),
    /// The broker takes the message: delivered to its queue.
    Take(usize),
    Confirm(usize),
    /// The publish fails: the connection dropped (before or after the
    /// broker took it), the confirmation was lost, or the relay gave it up
    /// at its deadline. The relay puts the message back.
    Fail(usize),
    /// Its claim is running out before it published: handed back.
    Release(usize),
    Mark(usize),
    Crash(usize),
    Consume,
    Ack,
    ConsumerCrash,
    Resend(u8),
}

struct Protocol {
    bug: Option<Bug>,
    /// Check this property alone (the checker stops at its first
    /// counterexample instead of exploring everything a bug opens up).
    only: Option<&'static str>,
}

impl State {
    /// A conditional statement of `relay` on `msg`'s row: it changes the
    /// row only while the row's claim is the relay's.
    fn settle(&mut self, msg: u8, relay: usize, to: Row) {
        if matches!(self.rows[msg as usize], Row::Pending(Some(l)) if l.relay as usize == relay) {
            self.rows[msg as usize] = to;
        }
    }

    fn was_delivered(&self, msg: u8) -> bool {
        self.delivered & (1 << msg) != 0
    }

    /// Whether another relay's publish of `msg` is unconfirmed now.
    fn in_flight_elsewhere(&self, msg: u8, relay: usize) -> bool {
        self.relays
            .iter()
            .enumerate()
            .any(|(r, s)| r != relay && matches!(*s, Relay::Publishing { msg: m, .. } if m == msg))
    }
}

impl Protocol {
    /// Whether `relay` may claim `msg` now.
    fn claimable(&self, s: &State, msg: u8) -> bool {
        let free = match s.rows[msg as usize] {
            Row::Pending(None) => true,
            Row::Pending(Some(lease)) => lease.until <= s.now || self.bug == Some(Bug::ClaimWithoutLock),
            Row::Uncommitted | Row::Sent => return false,
        };
        let first_of_key = self.bug == Some(Bug::ClaimOutOfOrder)
            || (0..msg)
                .all(|m| KEYS[m as usize] != KEYS[msg as usize] || !matches!(s.rows[m as usize], Row::Pending(_)));
        free && first_of_key
    }
}

impl Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            now: 0,
            rows: [Row::Uncommitted; MESSAGES],
            relays: [Relay::Idle; RELAYS],
            delivered: 0,
            queue: Vec::new(),
            applied: false,
            effects: [0; MESSAGES],
            acked: 0,
            taken_twice: false,
            crashes: 0,
            failures: 0,
            consumer_crashes: 0,
            resends: 0,
            overtaken: false,
            overlapping: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        // The clock moves unless a publish is still unconfirmed at its
        // claim's last tick: the relay's own deadline comes first.
        let publish_due = s.relays.iter().any(|r| matches!(*r, Relay::Publishing { until, .. } if s.now + 1 >= until));
        if s.now < END && !publish_due {
            actions.push(Action::Tick);
        }
        if let Some(next) = s.rows.iter().position(|r| *r == Row::Uncommitted) {
            actions.push(Action::Commit(next as u8));
        }
        for (r, relay) in s.relays.iter().enumerate() {
            match *relay {
                Relay::Idle => {
                    for m in 0..MESSAGES as u8 {
                        if self.claimable(s, m) {
                            actions.push(Action::Claim(r, m));
                        }
                    }
                }
                Relay::Holding { until, marked, .. } => {
                    if self.bug == Some(Bug::MarkBeforeConfirm) && !marked {
                        actions.push(Action::MarkEarly(r));
                    } else if s.now + 1 < until {
                        actions.push(Action::Publish(r));
                    } else {
                        actions.push(Action::Release(r));
                    }
                }
                Relay::Publishing { taken, until, .. } => {
                    if taken {
                        actions.push(Action::Confirm(r));
                    } else {
                        actions.push(Action::Take(r));
                    }
                    // A publish the relay's deadline ends is given up: a
                    // failure that the fault budget does not count.
                    if s.failures < FAILURES || s.now + 1 >= until {
                        actions.push(Action::Fail(r));
                    }
                }
                Relay::Confirmed { .. } => actions.push(Action::Mark(r)),
            }
            if *relay != Relay::Idle && s.crashes < CRASHES {
                actions.push(Action::Crash(r));
            }
        }
        if !s.queue.is_empty() {
            if s.applied {
                actions.push(Action::Ack);
                if s.consumer_crashes < CONSUMER_CRASHES {
                    actions.push(Action::ConsumerCrash);
                }
            } else {
                actions.push(Action::Consume);
            }
        }
        if s.resends < RESENDS {
            for m in 0..MESSAGES as u8 {
                if s.rows[m as usize] == Row::Sent {
                    actions.push(Action::Resend(m));
                }
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Tick => s.now += 1,
            Action::Commit(m) => s.rows[m as usize] = Row::Pending(None),
            Action::Claim(r, m) => {
                let lease = Lease { relay: r as u8, until: s.now + LEASE };
                s.rows[m as usize] = Row::Pending(Some(lease));
                s.relays[r] = Relay::Holding { msg: m, until: lease.until, marked: false };
            }
            Action::MarkEarly(r) => {
                let Relay::Holding { msg, until, .. } = s.relays[r] else { return None };
                s.settle(msg, r, Row::Sent);
                s.relays[r] = Relay::Holding { msg, until, marked: true };
            }
            Action::Publish(r) => {
                let Relay::Holding { msg, until, marked } = s.relays[r] else { return None };
                s.overlapping |= s.in_flight_elsewhere(msg, r);
                s.relays[r] = Relay::Publishing { msg, until, taken: false, marked };
            }
            Action::Take(r) => {
                let Relay::Publishing { msg, until, marked, .. } = s.relays[r] else { return None };
                if !s.was_delivered(msg) {
                    let key = KEYS[msg as usize];
                    s.overtaken |= (0..msg).any(|m| KEYS[m as usize] == key && !s.was_delivered(m));
                }
                s.delivered |= 1 << msg;
                s.queue.push(msg);
                s.relays[r] = Relay::Publishing { msg, until, taken: true, marked };
            }
            Action::Confirm(r) => {
                let Relay::Publishing { msg, marked, .. } = s.relays[r] else { return None };
                s.relays[r] = if marked { Relay::Idle } else { Relay::Confirmed { msg } };
            }
            Action::Fail(r) => {
                let Relay::Publishing { msg, until, .. } = s.relays[r] else { return None };
                if s.now + 1 < until {
                    s.failures += 1;
                }
                // Settled: pending again, in no relay's hands (due after
                // the backoff, which the model leaves out).
                s.settle(msg, r, Row::Pending(None));
                s.relays[r] = Relay::Idle;
            }
            Action::Release(r) => {
                let Relay::Holding { msg, .. } = s.relays[r] else { return None };
                s.settle(msg, r, Row::Pending(None));
                s.relays[r] = Relay::Idle;
            }
            Action::Mark(r) => {
                let Relay::Confirmed { msg } = s.relays[r] else { return None };
                s.settle(msg, r, Row::Sent);
                s.relays[r] = Relay::Idle;
            }
            Action::Crash(r) => {
                // Its claims stay until they run out; it starts over idle.
                s.relays[r] = Relay::Idle;
                s.crashes += 1;
            }
            Action::Consume => {
                // One transaction of the coupon database: the dedup record
                // (a unique key on the id) and the effect, or neither.
                let msg = s.queue[0];
                if s.effects[msg as usize] == 0 {
                    s.effects[msg as usize] += 1;
                } else {
                    s.taken_twice = true;
                }
                s.applied = true;
            }
            Action::Ack => {
                s.acked |= 1 << s.queue.remove(0);
                s.applied = false;
            }
            Action::ConsumerCrash => {
                // Applied, not acked: the broker delivers it again.
                s.applied = false;
                s.consumer_crashes += 1;
            }
            Action::Resend(m) => {
                s.rows[m as usize] = Row::Pending(None);
                s.resends += 1;
            }
        }
        (s != *last).then_some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let all = vec![
            Property::always("a message marked sent was delivered", |_, s: &State| {
                (0..MESSAGES as u8).all(|m| s.rows[m as usize] != Row::Sent || s.was_delivered(m))
            }),
            Property::always("a key's messages are first delivered in commit order", |_, s: &State| !s.overtaken),
            Property::always("no message is published by two relays at once", |_, s: &State| !s.overlapping),
            Property::always("a message takes effect once", |_, s: &State| {
                (0..MESSAGES).all(|m| s.effects[m] <= 1 && (s.acked & (1 << m) == 0 || s.effects[m] == 1))
            }),
            Property::sometimes("every message sent and consumed once", |_, s: &State| {
                s.rows.iter().all(|r| *r == Row::Sent) && s.effects.iter().all(|&e| e == 1)
            }),
            Property::sometimes("a message is taken twice and takes effect once", |_, s: &State| s.taken_twice),
        ];
        all.into_iter().filter(|p| self.only.is_none_or(|only| p.name == only)).collect()
    }
}

fn check(bug: Option<Bug>, only: Option<&'static str>) -> impl Checker<Protocol> {
    Protocol { bug, only }.checker().spawn_bfs().join()
}

#[test]
fn the_relay_protocol_holds_in_every_interleaving() {
    let checked = check(None, None);
    checked.assert_properties();
    assert!(checked.unique_state_count() > 10_000, "{} states", checked.unique_state_count());
    eprintln!("relay protocol: {} states, every property holds", checked.unique_state_count());
}

/// The checker finds a state that breaks `property` once `bug` is back.
fn caught(bug: Bug, property: &'static str) {
    let checked = check(Some(bug), Some(property));
    let found = checked.discovery(property);
    assert!(found.is_some(), "{bug:?} was not caught by {property:?}");
    eprintln!("{bug:?} breaks {property:?} after {} actions", found.unwrap().into_actions().len());
}

#[test]
fn a_mark_before_the_brokers_confirmation_is_caught() {
    caught(Bug::MarkBeforeConfirm, "a message marked sent was delivered");
}

#[test]
fn a_claim_without_its_condition_is_caught() {
    caught(Bug::ClaimWithoutLock, "no message is published by two relays at once");
}

#[test]
fn a_claim_of_a_keys_later_message_is_caught() {
    caught(Bug::ClaimOutOfOrder, "a key's messages are first delivered in commit order");
}
