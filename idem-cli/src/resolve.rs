//! `idem steps resolve`: say what became of a step in flight, once the
//! outside system was asked about its key, in each store given that holds
//! the call's steps.

use idem_runtime::admin::{Record, RecordId, RecordState};
use idem_runtime::lease::{Resolve, StepKey, StepLog, StepOutcome};
use serde_json::{Value, json};

use crate::error::Failure;
use crate::inspect::read_each;
use crate::opt::ResolveArgs;
use crate::release::ask;
use crate::render::{
    Done, Out, each_store, json_record, json_steps, log_steps, meaning, scope_and_key, span, step_lines, text_record,
};
use crate::store::Store;

/// What became of a store's step, as the JSON names it.
#[derive(Clone, Copy, PartialEq)]
enum Outcome {
    Resolved,
    /// Neither a record nor steps of the call in this store.
    NotFound,
    NotInFlight,
    Held,
    NotConfirmed,
    /// An outcome this build does not know (`Resolve` may grow).
    Unknown,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Resolved => "resolved",
            Outcome::NotFound => "not_found",
            Outcome::NotInFlight => "not_in_flight",
            Outcome::Held => "held",
            Outcome::NotConfirmed => "not_confirmed",
            Outcome::Unknown => "unknown",
        }
    }
}

/// One store's part: its outcome, the call as it was read, and why the
/// step was not resolved.
struct Part {
    store: &'static str,
    outcome: Outcome,
    document: Value,
    refused: Option<String>,
}

pub(crate) async fn run(stores: &[Store], id: &RecordId, args: &ResolveArgs, out: &Out) -> Result<Done, Failure> {
    let outcome = match &args.result {
        Some(result) if args.done => StepOutcome::Done { result },
        _ => StepOutcome::NotDone,
    };
    let mut parts = Vec::new();
    for (store, record) in read_each(stores, id).await? {
        parts.push(resolve_one(store, id, record, args, outcome, out).await?);
    }
    let resolved = parts.iter().filter(|part| part.outcome == Outcome::Resolved).count();
    let documents: Vec<Value> = parts.iter().map(|part| part.document.clone()).collect();
    let refused = parts.into_iter().filter_map(|part| Some((part.store, part.refused?)));
    let none = format!("no call of {} in any store given", scope_and_key(id.scope(), id.key()));
    Ok(each_store("steps resolve", ("resolved", resolved), refused, none, documents))
}

/// Show `store`'s call of `id`, and resolve its step if it is in flight,
/// no worker holds the call, and the operator agrees.
async fn resolve_one(
    store: &Store,
    id: &RecordId,
    record: Option<Record>,
    args: &ResolveArgs,
    outcome: StepOutcome<'_>,
    out: &Out,
) -> Result<Part, Failure> {
    let name = store.name();
    let log = store.steps(id).await?;
    let steps = log_steps(id.scope(), id.key(), &log);
    match &record {
        Some(r) => out.say(text_record(name, r)),
        None => {
            out.say(format_args!("{name}: no record for {}", scope_and_key(id.scope(), id.key())));
            step_lines(&steps).into_iter().for_each(|line| out.say(line));
        }
    }
    let (json_recorded, json_in_flight) = json_steps(&steps);
    let document = json!({
        "store": name,
        "record": record.as_ref().map(json_record),
        "steps": json_recorded,
        "in_flight": json_in_flight,
    });
    let part = |outcome: Outcome, refused: Option<String>| {
        let mut document = document.clone();
        document["outcome"] = json!(outcome.as_str());
        Part { store: name, outcome, document, refused }
    };
    if record.is_none() && log == StepLog::default() {
        return Ok(part(Outcome::NotFound, None));
    }
    if let Some(r) = record.as_ref().filter(|r| r.state == RecordState::Running) {
        let why = format!("the call is {}; resolve its step once the lease has passed", meaning(r));
        return Ok(part(Outcome::Held, Some(why)));
    }
    let Some(started) = log.started.as_ref().filter(|started| started.name == args.step) else {
        return Ok(part(Outcome::NotInFlight, Some(not_in_flight(&args.step, &log))));
    };
    let key = StepKey::for_step(id.scope(), id.key(), &started.name);
    let (done_as, next) = match outcome {
        StepOutcome::Done { result } => {
            (format!("as done, with the result {result}"), "the next call replays that result and resumes after it")
        }
        StepOutcome::NotDone => ("as not done".to_owned(), "the next call runs it"),
    };
    let step = format!("step {} `{}` (key {key})", started.number, started.name);
    if !args.yes
        && let Err(why) = ask(&format!("Resolve {step} in {name} {done_as}? Then {next}."), "resolve")
    {
        return Ok(part(Outcome::NotConfirmed, Some(why)));
    }
    Ok(match store.resolve_step(id, &args.step, outcome).await? {
        Resolve::Resolved(_) => {
            out.say(format_args!("{name}: resolved {step} {done_as}: {next}"));
            part(Outcome::Resolved, None)
        }
        Resolve::NotInFlight(now) => {
            part(Outcome::NotInFlight, Some(format!("it changed meanwhile: {}", not_in_flight(&args.step, &now))))
        }
        Resolve::Held { lease_left } => {
            let left = span(i64::try_from(lease_left.as_millis()).unwrap_or(i64::MAX));
            let why = format!("a worker took the call over meanwhile (its lease is live for {left} more); look again");
            part(Outcome::Held, Some(why))
        }
        _ => part(Outcome::Unknown, Some("the store answered an outcome this idem does not know".to_owned())),
    })
}

/// Why `step` cannot be resolved in a call whose steps are `log`.
fn not_in_flight(step: &str, log: &StepLog) -> String {
    match &log.started {
        Some(other) => format!("no step `{step}` is in flight (step {} `{}` is)", other.number, other.name),
        None if log.recorded.iter().any(|recorded| recorded.name == step) => {
            format!("step `{step}` is recorded already: the call replays its result")
        }
        None => format!("no step `{step}` is in flight (a step in flight is marked only with a check or at-most-once)"),
    }
}
