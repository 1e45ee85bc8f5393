//! `loadgen --scenario steps`: what recorded steps cost a lease-guarded
//! call (issue 27: "a step adds one store write"). First calls of one call
//! two ways, in interleaved slices of the same run on the store given: its
//! body as `--steps` recorded steps (3 by default; `steps = "steps"`, each
//! step's result written to the store before the next starts), and as one
//! lease body doing the same actions unrecorded. The actions are in-process
//! and return a small number, so the difference is the store's work.
//! `--steps 0` leaves what recording costs whatever the steps: the read of
//! the steps before the body and their removal after it.
//!
//! The store is wrapped in `idem::testing::Faults` with no fault injected:
//! it forwards every call and counts it by operation, so the line shows
//! what the steps add per call (claims, completions, the steps read, one
//! write per step, the forget), as the runtime really sends them.

use std::sync::Arc;
use std::time::Duration;

use idem::idempotent;
use idem::lease::LeaseStore;
use idem::testing::{Faults, Op};

use crate::common::{AppError, BoxError, Store};
use crate::lease_bench::{Ack, Measured, Under, measure_calls, median, open};

/// One step's work: in-process, a small value out.
async fn action(n: u64) -> u64 {
    std::hint::black_box(n.wrapping_mul(31).wrapping_add(7))
}

/// `count` actions in one lease body, nothing recorded between them.
#[idempotent(
    key = "key",
    strategy = "lease",
    lease = "30s",
    retention = "10m",
    scope = "loadgen.steps.one_body",
    store = "store"
)]
async fn one_body(store: &dyn LeaseStore, key: &str, n: u64, count: usize) -> Result<Ack, AppError> {
    let mut value = n;
    for _ in 0..count {
        value = action(value).await;
    }
    Ok(Ack { id: value })
}

/// The same actions, each a recorded step.
#[idempotent(
    key = "key",
    strategy = "lease",
    lease = "30s",
    retention = "10m",
    scope = "loadgen.steps.in_steps",
    store = "store",
    steps = "steps"
)]
async fn in_steps(store: &dyn LeaseStore, key: &str, n: u64, count: usize) -> Result<Ack, AppError> {
    let mut value = n;
    for i in 0..count {
        value = steps.run(&format!("step{i}"), |_| async move { Ok::<_, AppError>(action(value).await) }).await?;
    }
    Ok(Ack { id: value })
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    OneBody,
    Steps,
}

const SIDES: [Side; 2] = [Side::OneBody, Side::Steps];

/// The store operations counted, in the order a call in steps makes them;
/// reads (the steps read, a precheck's peek) apart from writes.
const OPS: [(Op, &str, bool); 8] = [
    (Op::Peek, "peek", false),
    (Op::Claim, "claim", true),
    (Op::Steps, "steps", false),
    (Op::RecordStep, "record_step", true),
    (Op::Extend, "extend", true),
    (Op::Complete, "complete", true),
    (Op::Release, "release", true),
    (Op::ForgetSteps, "forget_steps", true),
];

/// One side's slices.
#[derive(Default)]
struct Tally {
    tps: Vec<f64>,
    calls: u64,
    latencies_us: Vec<u32>,
    /// Store operations, by `OPS` index.
    ops: [u64; OPS.len()],
    /// On Redis, the lease script's calls (claims and completions batch
    /// under load; the steps' commands are not in it).
    script_calls: u64,
}

impl Tally {
    fn per_call(&self, n: u64) -> f64 {
        n as f64 / self.calls.max(1) as f64
    }

    /// Writes (`true`) or reads per call.
    fn per_call_of(&self, writes: bool) -> f64 {
        self.per_call(OPS.iter().zip(self.ops).filter(|((_, _, write), _)| *write == writes).map(|(_, n)| n).sum())
    }

    /// `claim:1.00,steps:1.00,...`: the operations this side made, per call.
    fn breakdown(&self) -> String {
        let parts = OPS.iter().zip(self.ops).filter(|(_, n)| *n > 0);
        parts.map(|((_, name, _), n)| format!("{name}:{:.2}", self.per_call(n))).collect::<Vec<_>>().join(",")
    }

    fn percentile_ms(&mut self, q: f64) -> f64 {
        self.latencies_us.sort_unstable();
        f64::from(crate::percentile(&self.latencies_us, q)) / 1000.0
    }
}

/// What a slice runs.
struct Slice<'a> {
    side: Side,
    /// Actions a call does, recorded or not.
    count: usize,
    clients: usize,
    length: Duration,
    run: &'a str,
}

/// First calls for the slice's length, every call a fresh key; an error if
/// any call failed.
async fn slice(store: &Arc<dyn LeaseStore>, s: Slice<'_>) -> Result<Measured, BoxError> {
    let Slice { side, count, clients, length, run } = s;
    let (store, run) = (store.clone(), run.to_owned());
    let mut m = measure_calls(clients, length, true, move |n| {
        let (store, key) = (store.clone(), format!("S{run}-{n}"));
        async move {
            match side {
                Side::OneBody => one_body(&*store, &key, n, count).await?,
                Side::Steps => in_steps(&*store, &key, n, count).await?,
            };
            Ok(())
        }
    })
    .await;
    let mode = match side {
        Side::OneBody => "one body",
        Side::Steps => "steps",
    };
    std::mem::take(&mut m.errors).check("steps", mode)?;
    Ok(m)
}

pub async fn run(
    database_url: Option<&str>,
    redis_url: Option<&str>,
    count: usize,
    clients: usize,
    (seconds, rounds): (u64, u32),
) -> Result<(), BoxError> {
    if count > idem::lease::MAX_STEPS {
        return Err(format!("--steps: a call records at most {} steps", idem::lease::MAX_STEPS).into());
    }
    let run = crate::common::run_id();
    let Under { name, store, sql, redis_stats } = open(database_url, redis_url, clients).await?;
    let faults = Faults::new();
    let store: Arc<dyn LeaseStore> = Arc::new(faults.wrap(store));
    let counted = || OPS.map(|(op, _, _)| faults.calls(op) as u64);
    let script_calls = || redis_stats.as_ref().map_or(0, |s| s().script_calls);
    let rounds = rounds.max(1);
    let per_slice = crate::slice_length(seconds, rounds, SIDES.len() as f64, 0.5);
    // Warm-up: connections open, scripts loaded, statements prepared.
    let warm = format!("{run}w");
    for side in SIDES {
        slice(&store, Slice { side, count, clients, length: Duration::from_millis(300), run: &warm }).await?;
    }
    let mut tallies: [Tally; 2] = Default::default();
    let mut ratios = Vec::new();
    for round in 0..rounds as usize {
        let mut tps = [0.0; 2];
        // Rotated each round (A B, B A, ...): neither side always follows the other.
        for i in 0..SIDES.len() {
            let s = (i + round) % SIDES.len();
            let (ops, scripts) = (counted(), script_calls());
            let tag = format!("{run}r{round}");
            let m = slice(&store, Slice { side: SIDES[s], count, clients, length: per_slice, run: &tag }).await?;
            let t = &mut tallies[s];
            for (total, (after, before)) in t.ops.iter_mut().zip(counted().into_iter().zip(ops)) {
                *total += after - before;
            }
            t.script_calls += script_calls() - scripts;
            t.calls += m.calls;
            t.latencies_us.extend(m.latencies_us);
            t.tps.push(m.tps);
            tps[s] = m.tps;
        }
        ratios.push(tps[1] / tps[0]);
    }
    let [mut one, mut steps] = tallies;
    let (one_tps, steps_tps, ratio) = (median(one.tps.clone()), median(steps.tps.clone()), median(ratios));
    let (one_p50, steps_p50, one_p99, steps_p99) =
        (one.percentile_ms(0.50), steps.percentile_ms(0.50), one.percentile_ms(0.99), steps.percentile_ms(0.99));
    println!(
        "steps on {name}: {clients} clients: one lease body {one_tps:.0} calls/s (p50 {one_p50:.3} ms), {count} \
         recorded steps {steps_tps:.0} calls/s (p50 {steps_p50:.3} ms); store operations per call: {} / {}",
        one.breakdown(),
        steps.breakdown()
    );
    let mut line = format!(
        "scenario=steps store={name} clients={clients} steps={count} one_body_tps={one_tps:.0} steps_tps={steps_tps:.0} \
         ratio={ratio:.3} one_body_p50_ms={one_p50:.3} steps_p50_ms={steps_p50:.3} one_body_p99_ms={one_p99:.3} \
         steps_p99_ms={steps_p99:.3} writes_per_call_one_body={:.2} writes_per_call_steps={:.2} \
         reads_per_call_one_body={:.2} reads_per_call_steps={:.2} ops_one_body={} ops_steps={}",
        one.per_call_of(true),
        steps.per_call_of(true),
        one.per_call_of(false),
        steps.per_call_of(false),
        one.breakdown(),
        steps.breakdown()
    );
    if redis_stats.is_some() {
        line.push_str(&format!(
            " lease_scripts_per_call_one_body={:.2} lease_scripts_per_call_steps={:.2}",
            one.per_call(one.script_calls),
            steps.per_call(steps.script_calls)
        ));
    }
    println!("{line}");
    if let Some(db) = sql {
        // Other benchmarks share this database: leave them no records.
        forget_records(&db).await?;
        db.close().await;
    }
    Ok(())
}

/// Remove this scenario's records (its steps went as each call completed).
async fn forget_records(db: &Store) -> Result<(), BoxError> {
    let text = crate::common::sql(db.name(), "DELETE FROM idem_records WHERE scope LIKE ?");
    crate::common::on_pool!(db, pool => sqlx::query(text).bind("loadgen.steps.%").execute(pool).await.map(drop))?;
    Ok(())
}
