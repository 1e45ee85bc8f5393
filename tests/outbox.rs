//! The transactional outbox on SQLite, PostgreSQL and MariaDB, with the
//! in-process broker: a message is written in the guarded transaction and
//! goes out after its commit, once per commit, in its key's order, and
//! whatever stops on the way (the relay before publishing, the relay after
//! publishing, the broker), it goes out later with the same id, so a
//! consumer that deduplicates by id takes it once.
//!
//! Each test works in a scope of its own, and its relays relay that scope
//! only: the outbox table of PostgreSQL and MariaDB is shared.

use idem_test_support as common;

#[macro_use]
mod outbox_calls;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use common::{AppError, unique};
use idem::outbox::{InProcess, Message, MessageId, MessageQuery, MessageState, Outbox, Relay};
use idem::{Claim, Guard};
use outbox_calls::{End, everything};
use tokio::sync::mpsc::UnboundedReceiver;

/// Receive until `n` distinct ids came (or `within` passed): every
/// delivery, in order.
async fn receive(rx: &mut UnboundedReceiver<Message>, n: usize, within: Duration) -> Vec<Message> {
    let deadline = Instant::now() + within;
    let (mut got, mut ids) = (Vec::new(), HashSet::new());
    while ids.len() < n {
        match tokio::time::timeout_at(deadline.into(), rx.recv()).await {
            Ok(Some(m)) => {
                ids.insert(m.id.clone());
                got.push(m);
            }
            _ => break,
        }
    }
    got
}

/// Nothing more arrives within `quiet`.
async fn nothing_more(rx: &mut UnboundedReceiver<Message>, quiet: Duration) {
    if let Ok(Some(m)) = tokio::time::timeout(quiet, rx.recv()).await {
        panic!("unexpected delivery of {} ({})", m.id, m.topic);
    }
}

/// A consumer that keeps a dedup record per message id: the effects it
/// applied, per id.
#[derive(Default)]
struct Consumer {
    effects: HashMap<MessageId, usize>,
}

impl Consumer {
    /// A delivery: its effect applied unless its id was seen.
    fn take(&mut self, m: &Message) {
        let seen = self.effects.contains_key(&m.id);
        *self.effects.entry(m.id.clone()).or_default() += usize::from(!seen);
    }
}

macro_rules! outbox_suite {
    (mod $m:ident; db = $db:ty; placeholder = $ph:literal; pool = $pool:expr;) => {
        mod $m {
            use super::*;

            macro_rules! pool {
                () => {
                    match $pool.await {
                        Some(pool) => pool,
                        None => return,
                    }
                };
            }

            outbox_calls!($db, $ph);

            /// The attribute's way: `outbox = "outbox"` names the call's handle.
            #[idem::idempotent(key = "trade_no", scope = "tests.outbox.attribute", outbox = "outbox")]
            async fn grant(tx: &mut sqlx::Transaction<'_, Db>, trade_no: &str, fail: bool) -> Result<u32, AppError> {
                outbox.publish(&mut *tx, "coupons", trade_no).await?;
                if fail {
                    return Err(AppError::Rule("declined".into()));
                }
                Ok(1)
            }

            fn relay(pool: &Pool, broker: &InProcess, scope: &str) -> Relay<Db> {
                Relay::new(pool.clone(), broker.clone())
                    .scope(scope)
                    .poll_interval(Duration::from_millis(50))
                    .backoff(Duration::from_millis(20), Duration::from_millis(200))
            }

            #[tokio::test]
            async fn a_rolled_back_body_publishes_nothing() {
                let pool = pool!();
                let scope = unique("outbox.rollback");
                let broker = InProcess::new();
                let mut rx = broker.subscribe();
                call(&pool, &scope, "T-1", &[("coupons", b"a"), ("coupons", b"b")], End::Rollback).await.unwrap();
                // The body failed and the caller committed anyway: the
                // ticket removed what the body published, with the record.
                call(&pool, &scope, "T-2", &[("coupons", b"c")], End::FailCommit).await.unwrap();
                assert_eq!(idem::outbox::list_messages(&pool, &everything(&scope)).await.unwrap(), []);
                let report = relay(&pool, &broker, &scope).drain().await.unwrap();
                assert_eq!(report.claimed, 0);
                nothing_more(&mut rx, Duration::from_millis(100)).await;
                // Both keys run again: their records went too.
                assert!(call(&pool, &scope, "T-1", &[("coupons", b"a")], End::Commit).await.is_some());
                assert!(call(&pool, &scope, "T-2", &[("coupons", b"c")], End::Commit).await.is_some());
                forget(&pool, &scope).await;
            }

            #[tokio::test]
            async fn a_replayed_duplicate_publishes_nothing() {
                let pool = pool!();
                let scope = unique("outbox.replay");
                let broker = InProcess::new();
                let mut rx = broker.subscribe();
                let first = call(&pool, &scope, "T-1", &[("coupons", b"grant")], End::Commit).await.unwrap();
                for _ in 0..3 {
                    assert_eq!(call(&pool, &scope, "T-1", &[("coupons", b"grant")], End::Commit).await, None);
                }
                assert_eq!(idem::outbox::list_messages(&pool, &everything(&scope)).await.unwrap().len(), 1);
                relay(&pool, &broker, &scope).drain().await.unwrap();
                let got = receive(&mut rx, 1, Duration::from_secs(5)).await;
                assert_eq!(got.iter().map(|m| &m.id).collect::<Vec<_>>(), [&first[0]]);
                nothing_more(&mut rx, Duration::from_millis(100)).await;
                forget(&pool, &scope).await;
            }

            #[tokio::test]
            async fn the_attributes_handle_publishes_once_per_call() {
                let pool = pool!();
                let trade_no = unique("T");
                let id = MessageId::for_call("tests.outbox.attribute", &trade_no, 0);
                let mut tx = pool.begin().await.unwrap();
                assert!(matches!(grant(&mut tx, &trade_no, true).await, Err(AppError::Rule(_))));
                tx.commit().await.unwrap(); // committed anyway: the failed body's message went
                assert!(idem::outbox::find_message(&pool, &id).await.unwrap().is_none());
                for _ in 0..3 {
                    let mut tx = pool.begin().await.unwrap();
                    assert_eq!(grant(&mut tx, &trade_no, false).await.unwrap(), 1);
                    tx.commit().await.unwrap();
                }
                let (entry, message) = idem::outbox::find_message(&pool, &id).await.unwrap().unwrap();
                assert_eq!((entry.state, message.payload), (MessageState::Pending, trade_no.clone().into_bytes()));
                let query = MessageQuery { scope: Some("tests.outbox.attribute".into()), ..everything("") };
                let mine = idem::outbox::list_messages(&pool, &query).await.unwrap();
                assert_eq!(mine.iter().filter(|e| e.key == trade_no).count(), 1, "the repeats published nothing");
                forget(&pool, "tests.outbox.attribute").await;
            }

            #[tokio::test]
            async fn a_message_id_is_the_same_for_a_failed_attempt_and_its_retry() {
                let pool = pool!();
                let scope = unique("outbox.stable");
                let messages: &[(&str, &[u8])] = &[("coupons", b"one"), ("points", b"two")];
                let failed = call(&pool, &scope, "T-1", messages, End::FailCommit).await.unwrap();
                let retried = call(&pool, &scope, "T-1", messages, End::Commit).await.unwrap();
                assert_eq!(failed, retried);
                let stored = idem::key::stored_scope(&scope);
                assert_eq!(retried, [MessageId::for_call(&stored, "T-1", 0), MessageId::for_call(&stored, "T-1", 1)]);
                assert!(retried[0].as_str().starts_with("idem-msg-") && retried[0].as_str().len() == 41);
                assert_ne!(retried[0], MessageId::for_call(&stored, "T-2", 0));
                let rows = idem::outbox::list_messages(&pool, &everything(&scope)).await.unwrap();
                assert_eq!(rows.iter().map(|e| &e.id).collect::<Vec<_>>(), [&retried[0], &retried[1]]);
                forget(&pool, &scope).await;
            }

            #[tokio::test]
            async fn committed_with_no_relay_running_it_goes_out_once_a_relay_starts() {
                let pool = pool!();
                let scope = unique("outbox.late");
                let ids = call(&pool, &scope, "T-1", &[("coupons", b"grant")], End::Commit).await.unwrap();
                // The process stopped here: committed, never published.
                let broker = InProcess::new();
                let mut rx = broker.subscribe();
                let relay = relay(&pool, &broker, &scope).start();
                let got = receive(&mut rx, 1, Duration::from_secs(10)).await;
                relay.stop().await;
                assert_eq!(got.iter().map(|m| &m.id).collect::<Vec<_>>(), [&ids[0]]);
                assert_eq!(got[0].payload, b"grant");
                nothing_more(&mut rx, Duration::from_millis(100)).await;
                let rows = idem::outbox::list_messages(&pool, &everything(&scope)).await.unwrap();
                assert_eq!(rows[0].state, MessageState::Sent);
                forget(&pool, &scope).await;
            }

            #[tokio::test]
            async fn a_lost_confirmation_sends_it_again_with_its_id_and_one_effect() {
                let pool = pool!();
                let scope = unique("outbox.lost_confirm");
                let ids = call(&pool, &scope, "T-1", &[("coupons", b"grant")], End::Commit).await.unwrap();
                let broker = InProcess::new();
                let mut rx = broker.subscribe();
                broker.lose_confirms(1);
                let relay = relay(&pool, &broker, &scope);
                let first = relay.run_once().await.unwrap();
                assert_eq!((first.claimed, first.sent, first.retried), (1, 0, 1));
                tokio::time::sleep(Duration::from_millis(50)).await;
                let second = relay.drain().await.unwrap();
                assert_eq!(second.sent, 1);
                let got = receive(&mut rx, 2, Duration::from_millis(500)).await;
                assert_eq!(got.len(), 2, "delivered twice");
                assert!(got.iter().all(|m| m.id == ids[0]), "with one id");
                assert_eq!(got.iter().map(|m| m.attempt).collect::<Vec<_>>(), [1, 2]);
                let mut consumer = Consumer::default();
                got.iter().for_each(|m| consumer.take(m));
                assert_eq!(consumer.effects.values().sum::<usize>(), 1, "one effect");
                forget(&pool, &scope).await;
            }

            #[tokio::test]
            async fn a_relay_stopped_after_publishing_leaves_it_to_the_next_after_its_claim() {
                let pool = pool!();
                let scope = unique("outbox.killed");
                let ids = call(&pool, &scope, "T-1", &[("coupons", b"grant")], End::Commit).await.unwrap();
                let broker = InProcess::new();
                let mut rx = broker.subscribe();
                // Delivered at once, confirmed 600 ms later: the relay dies
                // in between.
                broker.latency(Duration::from_millis(600));
                let lease = Duration::from_secs(1);
                let doomed = relay(&pool, &broker, &scope).claim_lease(lease).start();
                let first = receive(&mut rx, 1, Duration::from_secs(10)).await;
                drop(doomed);
                let dropped = Instant::now();
                assert_eq!(first.len(), 1);
                broker.latency(Duration::ZERO);
                let next = relay(&pool, &broker, &scope).claim_lease(lease);
                assert_eq!(next.run_once().await.unwrap().claimed, 0, "claimed by the relay that stopped");
                let mut again = Vec::new();
                while again.is_empty() && dropped.elapsed() < Duration::from_secs(10) {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    next.drain().await.unwrap();
                    again = receive(&mut rx, 1, Duration::from_millis(10)).await;
                }
                assert!(dropped.elapsed() >= lease - Duration::from_millis(200), "not before the claim ran out");
                assert_eq!(again.len(), 1);
                assert_eq!((&first[0].id, &again[0].id), (&ids[0], &ids[0]));
                let mut consumer = Consumer::default();
                first.iter().chain(&again).for_each(|m| consumer.take(m));
                assert_eq!(consumer.effects.values().sum::<usize>(), 1, "one effect");
                assert_eq!(broker.overlapping(), 0);
                forget(&pool, &scope).await;
            }

            #[tokio::test]
            async fn a_relay_gives_up_a_slow_publish_before_another_may_claim_it() {
                let pool = pool!();
                let scope = unique("outbox.slow");
                let ids = call(&pool, &scope, "T-1", &[("coupons", b"grant")], End::Commit).await.unwrap();
                let broker = InProcess::new();
                let mut rx = broker.subscribe();
                // Confirmations slower than the claim: each relay must stop
                // waiting before its claim runs out and another takes it.
                broker.latency(Duration::from_secs(3));
                let lease = Duration::from_millis(500);
                let relays: Vec<_> = (0..2).map(|_| relay(&pool, &broker, &scope).claim_lease(lease).start()).collect();
                let tries = receive(&mut rx, 1, Duration::from_secs(10)).await;
                tokio::time::sleep(Duration::from_millis(1500)).await;
                assert_eq!(broker.overlapping(), 0, "published by two relays at once");
                let rows = idem::outbox::list_messages(&pool, &everything(&scope)).await.unwrap();
                assert_eq!(rows[0].state, MessageState::Failing, "{rows:?}");
                assert!(rows[0].last_error.as_deref().unwrap().contains("no confirmation"), "{rows:?}");
                assert!(broker.delivered() >= 2, "tried again");
                broker.latency(Duration::ZERO);
                let deadline = Instant::now() + Duration::from_secs(10);
                while idem::outbox::oldest_pending(&pool, Some(&scope)).await.unwrap().is_some() {
                    assert!(Instant::now() < deadline, "sent once the broker is quick again");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                for relay in relays {
                    relay.stop().await;
                }
                assert_eq!(tries[0].id, ids[0]);
                assert_eq!(broker.overlapping(), 0);
                forget(&pool, &scope).await;
            }

            #[tokio::test]
            async fn four_relays_hand_over_10_000_messages_of_500_keys_in_order() {
                let pool = pool!();
                let scope = unique("outbox.fleet");
                let (keys, per_key) = (500, 20);
                let started = Instant::now();
                let payloads: Vec<Vec<u8>> = (0..per_key).map(|i: u32| i.to_be_bytes().to_vec()).collect();
                let mut writers = tokio::task::JoinSet::new();
                for w in 0..4 {
                    let (pool, scope, payloads) = (pool.clone(), scope.clone(), payloads.clone());
                    writers.spawn(async move {
                        let messages: Vec<(&str, &[u8])> = payloads.iter().map(|p| ("coupons", p.as_slice())).collect();
                        for k in (w..keys).step_by(4) {
                            call(&pool, &scope, &format!("K-{k}"), &messages, End::Commit).await.unwrap();
                        }
                    });
                }
                let broker = InProcess::new();
                let mut rx = broker.subscribe();
                // Some publishes fail: their keys' later messages must wait.
                broker.fail_next(300);
                let relays: Vec<_> = (0..4)
                    .map(|_| relay(&pool, &broker, &scope).batch_size(250).claim_lease(Duration::from_secs(30)).start())
                    .collect();
                writers.join_all().await;
                let written = started.elapsed();
                let got = receive(&mut rx, keys * per_key as usize, Duration::from_secs(60)).await;
                for relay in relays {
                    relay.stop().await;
                }
                let mut consumer = Consumer::default();
                let mut order: HashMap<&str, Vec<u32>> = HashMap::new();
                for m in &got {
                    if !consumer.effects.contains_key(&m.id) {
                        order.entry(&m.key).or_default().push(u32::from_be_bytes(m.payload[..4].try_into().unwrap()));
                    }
                    consumer.take(m);
                }
                assert_eq!(consumer.effects.len(), keys * per_key as usize, "none lost");
                assert!(consumer.effects.values().all(|&n| n == 1));
                assert_eq!(order.len(), keys);
                assert!(order.values().all(|seen| *seen == (0..per_key).collect::<Vec<_>>()), "per-key order");
                assert_eq!(broker.overlapping(), 0, "no message published by two relays at once");
                eprintln!("10,000 messages: written in {written:?}, all delivered after {:?}", started.elapsed());
                forget(&pool, &scope).await;
            }

            #[tokio::test]
            async fn a_broker_down_for_a_while_loses_nothing() {
                let pool = pool!();
                let scope = unique("outbox.down");
                let broker = InProcess::new();
                let mut rx = broker.subscribe();
                broker.down_for(Duration::from_millis(1500));
                let relay = relay(&pool, &broker, &scope).max_attempts(100).start();
                let mut ids = HashSet::new();
                for k in 0..5 {
                    ids.extend(call(&pool, &scope, &format!("K-{k}"), &[("coupons", b"x")], End::Commit).await.unwrap());
                }
                let down = Instant::now();
                tokio::time::sleep(Duration::from_millis(500)).await;
                let rows = idem::outbox::list_messages(&pool, &everything(&scope)).await.unwrap();
                assert!(rows.iter().any(|e| e.state == MessageState::Failing), "{rows:?}");
                let got = receive(&mut rx, 5, Duration::from_secs(10)).await;
                relay.stop().await;
                assert!(down.elapsed() >= Duration::from_millis(900), "not while it was down");
                assert_eq!(got.iter().map(|m| m.id.clone()).collect::<HashSet<_>>(), ids);
                let rows = idem::outbox::list_messages(&pool, &everything(&scope)).await.unwrap();
                assert!(rows.iter().all(|e| e.state == MessageState::Sent && e.attempts > 1), "{rows:?}");
                forget(&pool, &scope).await;
            }

            #[tokio::test]
            async fn a_refused_message_goes_dead_with_the_brokers_error_and_the_rest_go_on() {
                let pool = pool!();
                let scope = unique("outbox.refused");
                let broker = InProcess::new();
                let mut rx = broker.subscribe();
                broker.refuse("poison", "no route to `poison` (mandatory)");
                // The poison first, and after it a message of its own key.
                let poison =
                    call(&pool, &scope, "T-1", &[("poison", b"p"), ("coupons", b"after")], End::Commit).await.unwrap();
                let other = call(&pool, &scope, "T-2", &[("coupons", b"other")], End::Commit).await.unwrap();
                let report = relay(&pool, &broker, &scope).drain().await.unwrap();
                assert_eq!((report.dead, report.sent), (1, 2), "{report:?}");
                let got = receive(&mut rx, 2, Duration::from_secs(5)).await;
                assert_eq!(
                    got.iter().map(|m| m.id.clone()).collect::<HashSet<_>>(),
                    HashSet::from([poison[1].clone(), other[0].clone()])
                );
                let query = MessageQuery { scope: Some(scope.clone()), ..MessageQuery::default() };
                let listed = idem::outbox::list_messages(&pool, &query).await.unwrap();
                assert_eq!(listed.len(), 1, "{listed:?}");
                assert_eq!((&listed[0].id, listed[0].state), (&poison[0], MessageState::Dead));
                assert!(listed[0].last_error.as_deref().unwrap().contains("no route to `poison`"), "{listed:?}");
                // An operator re-sends it: pending again, tried from 0, its
                // error kept until the next try.
                assert_eq!(idem::outbox::resend(&pool, &poison[0]).await.unwrap(), 1);
                let (entry, message) = idem::outbox::find_message(&pool, &poison[0]).await.unwrap().unwrap();
                assert_eq!((entry.state, entry.attempts), (MessageState::Pending, 0));
                assert_eq!(message.payload, b"p");
                forget(&pool, &scope).await;
            }

            #[tokio::test]
            async fn payload_bytes_come_out_exactly_as_published() {
                let pool = pool!();
                let scope = unique("outbox.bytes");
                let binary: &[u8] = &[0xff, 0x00, 0xfe, b'\'', b'\\', 0x80, 0x00];
                let mut tx = pool.begin().await.unwrap();
                let Claim::Run(ticket) = Guard::new(scope.clone()).key("T-1").dedup::<(), _>(&mut tx).await.unwrap()
                else {
                    panic!("first call")
                };
                let outbox = ticket.outbox();
                outbox.publish(&mut tx, "bytes", binary).await.unwrap();
                outbox.publish(&mut tx, "bytes", b"").await.unwrap();
                outbox.publish_json(&mut tx, "json", &serde_json::json!({"order": 42, "name": "Zoë"})).await.unwrap();
                let headers = [("trace-id", "abc"), ("x-ünï", "välue")];
                outbox.publish_with_headers(&mut tx, "headers", b"h", &headers).await.unwrap();
                ticket.complete(&mut tx, Ok::<_, AppError>(())).await.unwrap().unwrap();
                tx.commit().await.unwrap();
                let broker = InProcess::new();
                let mut rx = broker.subscribe();
                relay(&pool, &broker, &scope).drain().await.unwrap();
                let mut got = receive(&mut rx, 4, Duration::from_secs(5)).await;
                got.sort_by_key(|m| m.seq);
                assert_eq!(got[0].payload, binary);
                assert_eq!(got[1].payload, b"");
                assert_eq!(serde_json::from_slice::<serde_json::Value>(&got[2].payload).unwrap()["name"], "Zoë");
                assert_eq!(got[2].headers, [("content-type".to_owned(), "application/json".to_owned())]);
                assert_eq!(got[3].headers, [("trace-id".into(), "abc".into()), ("x-ünï".into(), "välue".into())]);
                let (_, found) = idem::outbox::find_message(&pool, &got[0].id).await.unwrap().unwrap();
                assert_eq!(found.payload, binary);
                forget(&pool, &scope).await;
            }

            #[tokio::test]
            async fn an_oversized_or_malformed_message_fails_at_publish() {
                let pool = pool!();
                let scope = unique("outbox.limits");
                let mut tx = pool.begin().await.unwrap();
                let Claim::Run(ticket) = Guard::new(scope.clone()).key("T-1").dedup::<(), _>(&mut tx).await.unwrap()
                else {
                    panic!("first call")
                };
                let outbox = ticket.outbox();
                let big = vec![7u8; idem::outbox::DEFAULT_MAX_PAYLOAD + 1];
                let e = outbox.publish(&mut tx, "coupons", &big).await.unwrap_err();
                assert!(
                    matches!(e, idem::Error::MessageTooLarge { len, limit, .. }
                        if len == big.len() && limit == idem::outbox::DEFAULT_MAX_PAYLOAD),
                    "{e}"
                );
                assert!(e.to_string().contains("over the limit of 1048576"), "{e}");
                let small = outbox.clone().max_payload(10);
                assert!(small.publish(&mut tx, "coupons", [0u8; 10]).await.is_ok());
                let e = small.publish(&mut tx, "coupons", [0u8; 11]).await.unwrap_err();
                assert!(matches!(e, idem::Error::MessageTooLarge { limit: 10, .. }), "{e}");
                for topic in ["", "a\nb", &"t".repeat(256)] {
                    let e = outbox.publish(&mut tx, topic, b"x").await.unwrap_err();
                    assert!(matches!(e, idem::Error::InvalidMessage { .. }), "{e}");
                    assert!(e.to_string().contains("a topic is 1 to 255 bytes"), "{e}");
                }
                assert!(outbox.publish(&mut tx, &"t".repeat(255), b"x").await.is_ok());
                ticket.complete(&mut tx, Ok::<_, AppError>(())).await.unwrap().unwrap();
                tx.commit().await.unwrap();
                let rows = idem::outbox::list_messages(&pool, &everything(&scope)).await.unwrap();
                assert_eq!(rows.len(), 2, "only the two that passed: {rows:?}");
                // Their ordinals are 0 and 1: a refused message takes none.
                let stored = idem::key::stored_scope(&scope);
                assert_eq!(rows[1].id, MessageId::for_call(&stored, "T-1", 1));
                forget(&pool, &scope).await;
            }

            #[tokio::test]
            async fn an_idem_tx_publishes_with_its_call() {
                let pool = pool!();
                let scope = unique("outbox.idem_tx");
                for _ in 0..2 {
                    let mut tx = idem::begin(&pool).await.unwrap();
                    match Guard::new(scope.clone()).key("T-1").dedup::<u8, _>(&mut tx).await.unwrap() {
                        Claim::Replay(n) => assert_eq!(n, 1),
                        Claim::Run(ticket) => {
                            ticket.outbox().publish(&mut tx, "coupons", b"grant").await.unwrap();
                            ticket.complete(&mut tx, Ok::<u8, AppError>(1)).await.unwrap().unwrap();
                        }
                    }
                    tx.commit().await.unwrap();
                }
                let rows = idem::outbox::list_messages(&pool, &everything(&scope)).await.unwrap();
                assert_eq!(rows.len(), 1);
                assert_eq!(rows[0].payload_len, 5);
                forget(&pool, &scope).await;
            }

            #[tokio::test]
            async fn the_operator_lists_resends_and_purges() {
                let pool = pool!();
                let scope = unique("outbox.operator");
                let broker = InProcess::new();
                let mut rx = broker.subscribe();
                assert_eq!(idem::outbox::oldest_pending(&pool, Some(&scope)).await.unwrap(), None);
                let ids = call(&pool, &scope, "T-1", &[("coupons", b"a"), ("coupons", b"b")], End::Commit).await.unwrap();
                tokio::time::sleep(Duration::from_millis(30)).await;
                let age = idem::outbox::oldest_pending(&pool, Some(&scope)).await.unwrap().unwrap();
                assert!(age >= Duration::from_millis(20) && age < Duration::from_secs(60), "{age:?}");
                let pending = idem::outbox::list_messages(&pool, &MessageQuery { scope: Some(scope.clone()), ..MessageQuery::default() }).await.unwrap();
                assert_eq!(pending.iter().map(|e| (&e.id, e.state)).collect::<Vec<_>>(), [(&ids[0], MessageState::Pending), (&ids[1], MessageState::Pending)]);
                // A page after the first.
                let page = MessageQuery { scope: Some(scope.clone()), after: Some(pending[0].seq), ..MessageQuery::default() };
                assert_eq!(idem::outbox::list_messages(&pool, &page).await.unwrap().len(), 1);
                relay(&pool, &broker, &scope).drain().await.unwrap();
                assert_eq!(receive(&mut rx, 2, Duration::from_secs(5)).await.len(), 2);
                assert_eq!(idem::outbox::oldest_pending(&pool, Some(&scope)).await.unwrap(), None);
                // Re-send all: harmless, the ids are the same.
                let sent = MessageQuery { states: vec![MessageState::Sent], scope: Some(scope.clone()), ..MessageQuery::default() };
                assert_eq!(idem::outbox::resend_all(&pool, &sent).await.unwrap(), 2);
                relay(&pool, &broker, &scope).drain().await.unwrap();
                let again = receive(&mut rx, 2, Duration::from_secs(5)).await;
                assert_eq!(again.iter().map(|m| &m.id).collect::<Vec<_>>(), [&ids[0], &ids[1]]);
                // Sent messages go with their retention (here: published
                // longer ago than `older_than`).
                let options = idem::sql::PurgeOptions {
                    scope: Some(scope.clone()),
                    older_than: Some(Duration::from_millis(1)),
                    batch_size: 1,
                    ..Default::default()
                };
                let purged = idem::outbox::purge_sent(&pool, options).await.unwrap();
                assert_eq!((purged.deleted, purged.batches), (2, 2));
                assert_eq!(idem::outbox::list_messages(&pool, &everything(&scope)).await.unwrap(), []);
                forget(&pool, &scope).await;
            }

            #[tokio::test]
            async fn a_steps_message_commits_with_the_step() {
                use idem::lease::LeaseStore;
                let pool = pool!();
                let scope = unique("outbox.step");
                let store = idem::store::SqlStore::new(pool.clone());
                let mut published = Vec::new();
                for attempt in 0..2 {
                    let claim = Guard::new(scope.clone()).key("T-1").lease::<u8>(&store, Duration::from_secs(30));
                    let Claim::Run(ticket) = claim.await.unwrap() else { panic!("runs") };
                    let pool = &pool;
                    let published = &mut published;
                    let done: Result<u8, idem::Error> = ticket
                        .run_steps(|steps| async move {
                            steps
                                .run_tx("grant", pool, |tx, key| {
                                    Box::pin(async move {
                                        let id = Outbox::for_step(&key).publish(&mut *tx, "coupons", b"g").await?;
                                        published.push(id);
                                        if attempt == 0 {
                                            return Err(idem::Error::TokenRejected);
                                        }
                                        Ok::<u8, idem::Error>(1)
                                    })
                                })
                                .await
                        })
                        .await;
                    assert_eq!(done.is_ok(), attempt == 1, "{done:?}");
                    let _ = store.kind();
                }
                assert_eq!(published[0], published[1], "the step's attempts publish one id");
                let rows = idem::outbox::list_messages(&pool, &everything(&scope)).await.unwrap();
                assert_eq!(rows.iter().map(|e| &e.id).collect::<Vec<_>>(), [&published[1]], "the failed step's went");
                assert_eq!(rows[0].key, "T-1");
                forget(&pool, &scope).await;
            }
        }
    };
}

outbox_suite! {
    mod sqlite;
    db = sqlx::Sqlite;
    placeholder = "?";
    pool = common::sqlite();
}

outbox_suite! {
    mod postgres;
    db = sqlx::Postgres;
    placeholder = "$1";
    pool = common::postgres();
}

outbox_suite! {
    mod mysql;
    db = sqlx::MySql;
    placeholder = "?";
    pool = common::mysql();
}

/// On PostgreSQL a commit wakes the relay: the message goes out long
/// before the relay would have looked again.
#[tokio::test]
async fn a_commit_wakes_the_postgres_relay() {
    let Some(pool) = common::postgres().await else { return };
    let scope = unique("outbox.notify");
    let broker = InProcess::new();
    let mut rx = broker.subscribe();
    let relay = Relay::new(pool.clone(), broker.clone()).scope(&scope).poll_interval(Duration::from_secs(60)).start();
    // Its first round, and its LISTEN.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let committed = Instant::now();
    let mut tx = pool.begin().await.unwrap();
    let Claim::Run(ticket) = Guard::new(scope.clone()).key("T-1").dedup::<(), _>(&mut tx).await.unwrap() else {
        panic!("first call")
    };
    ticket.outbox().publish(&mut tx, "coupons", b"grant").await.unwrap();
    ticket.complete(&mut tx, Ok::<_, AppError>(())).await.unwrap().unwrap();
    tx.commit().await.unwrap();
    let got = receive(&mut rx, 1, Duration::from_secs(10)).await;
    let waited = committed.elapsed();
    relay.stop().await;
    assert_eq!(got.len(), 1);
    assert!(waited < Duration::from_secs(3), "woken by the commit, not the 60 s poll: {waited:?}");
    sqlx::query("DELETE FROM idem_outbox WHERE scope = $1").bind(&scope).execute(&pool).await.unwrap();
}
