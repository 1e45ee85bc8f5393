//! What a guard tells the `metrics` facade, and `observe`: first runs,
//! replays and refusals, by scope, strategy and store.

use std::time::Duration;

use idem_runtime::store::MemoryStore;
use idem_runtime::{Claim, Error, Guard, Outcome, observe};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

/// One metric as recorded: name, labels, value.
type Recorded = (String, Vec<(String, String)>, DebugValue);

fn counter(snapshot: &[Recorded], name: &str, outcome: Option<&str>) -> u64 {
    snapshot
        .iter()
        .filter(|(n, labels, _)| {
            n == name
                && labels.iter().any(|(k, v)| k == "scope" && v == "tests.metrics")
                && outcome.is_none_or(|o| labels.iter().any(|(k, v)| k == "outcome" && v == o))
        })
        .map(|(_, _, value)| match value {
            DebugValue::Counter(n) => *n,
            _ => 0,
        })
        .sum()
}

#[test]
fn a_lease_guard_reports_runs_replays_and_refusals() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let store = MemoryStore::new();
            let guard = |payload: &'static str| Guard::new("tests.metrics").key("k-1").fingerprint(payload);
            let lease = Duration::from_secs(5);
            // First run, then a replay.
            let Claim::Run(ticket) = guard("a").lease::<u8>(&store, lease).await.unwrap() else { panic!("first") };
            let (ran, outcome) = observe(ticket.run(async { Ok::<u8, Error>(1) })).await;
            assert_eq!((ran.unwrap(), outcome), (1, Some(Outcome::Executed)));
            let (replay, outcome) = observe(guard("a").lease::<u8>(&store, lease)).await;
            assert!(matches!(replay, Ok(Claim::Replay(1))));
            assert_eq!(outcome, Some(Outcome::Replayed));
            // Refused: the same key with another payload; a key held by a running call.
            let (mismatch, outcome) = observe(guard("b").lease::<u8>(&store, lease)).await;
            assert!(matches!(mismatch, Err(Error::KeyMismatch { .. })));
            assert_eq!(outcome, Some(Outcome::Mismatched));
            let held = Guard::new("tests.metrics").key("k-2").lease::<u8>(&store, lease).await.unwrap();
            let (busy, outcome) = observe(Guard::new("tests.metrics").key("k-2").lease::<u8>(&store, lease)).await;
            assert!(matches!(busy, Err(Error::InProgress { .. })));
            assert_eq!(outcome, Some(Outcome::InProgress));
            drop(held);
        });
    });
    let snapshot: Vec<Recorded> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let key = key.key();
            let labels = key.labels().map(|l| (l.key().to_owned(), l.value().to_owned())).collect();
            (key.name().to_owned(), labels, value)
        })
        .collect();
    assert_eq!(counter(&snapshot, "idem_calls_total", Some("executed")), 1);
    assert_eq!(counter(&snapshot, "idem_calls_total", Some("replayed")), 1);
    assert_eq!(counter(&snapshot, "idem_calls_total", Some("mismatched")), 1);
    assert_eq!(counter(&snapshot, "idem_calls_total", Some("in_progress")), 1);
    let labelled = snapshot.iter().find(|(n, _, _)| n == "idem_calls_total").unwrap();
    assert!(labelled.1.contains(&("strategy".to_owned(), "lease".to_owned())), "{labelled:?}");
    assert!(labelled.1.contains(&("store".to_owned(), "memory".to_owned())), "{labelled:?}");
    let claims = snapshot.iter().filter(|(n, _, _)| n == "idem_claim_seconds").count();
    let completions = snapshot.iter().filter(|(n, _, _)| n == "idem_complete_seconds").count();
    assert!(claims >= 1 && completions >= 1, "latency histograms recorded");
}
