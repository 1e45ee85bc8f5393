//! `idem release`: delete one stuck record, in each store given that holds
//! it, so that the next call of its key runs again.

use std::io::{IsTerminal, Write};

use idem_runtime::admin::{Record, RecordId, RecordState, Release};
use serde_json::{Value, json};

use crate::error::Failure;
use crate::inspect::read_each;
use crate::render::{Done, Out, each_store, json_record, meaning, scope_and_key, span, text_record};
use crate::store::Store;

/// What became of a store's record, as the JSON names it.
#[derive(Clone, Copy, PartialEq)]
enum Outcome {
    Released,
    NotFound,
    NotStuck,
    NotConfirmed,
    FenceChanged,
    /// A release outcome this build does not know (`Release` may grow).
    Unknown,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Released => "released",
            Outcome::NotFound => "not_found",
            Outcome::NotStuck => "not_stuck",
            Outcome::NotConfirmed => "not_confirmed",
            Outcome::FenceChanged => "fence_changed",
            Outcome::Unknown => "unknown",
        }
    }
}

/// One store's part: its outcome, the record (as read, or as it is now
/// when it changed meanwhile), and why it was not released.
struct Step {
    store: &'static str,
    outcome: Outcome,
    record: Option<Record>,
    refused: Option<String>,
}

impl Step {
    fn new(store: &'static str, outcome: Outcome, record: Option<Record>) -> Step {
        Step { store, outcome, record, refused: None }
    }

    fn refused(self, why: String) -> Step {
        Step { refused: Some(why), ..self }
    }

    fn document(&self) -> Value {
        json!({ "store": self.store, "outcome": self.outcome.as_str(), "record": self.record.as_ref().map(json_record) })
    }
}

pub(crate) async fn run(stores: &[Store], id: &RecordId, yes: bool, out: &Out) -> Result<Done, Failure> {
    let mut steps = Vec::new();
    for (store, record) in read_each(stores, id).await? {
        steps.push(release_one(store, id, record, yes, out).await?);
    }
    let released = steps.iter().filter(|step| step.outcome == Outcome::Released).count();
    let documents: Vec<Value> = steps.iter().map(Step::document).collect();
    let refused = steps.into_iter().filter_map(|step| Some((step.store, step.refused?)));
    let none = format!("no record for {} in any store given", scope_and_key(id.scope(), id.key()));
    Ok(each_store("release", ("released", released), refused, none, documents))
}

/// Show `store`'s record of `id`, and release it if it is stuck and the
/// operator agrees.
async fn release_one(
    store: &Store,
    id: &RecordId,
    record: Option<Record>,
    yes: bool,
    out: &Out,
) -> Result<Step, Failure> {
    let name = store.name();
    let Some(record) = record else {
        out.say(format_args!("{name}: no record for {}", scope_and_key(id.scope(), id.key())));
        return Ok(Step::new(name, Outcome::NotFound, None));
    };
    out.say(text_record(name, &record));
    if !record.state.is_stuck() {
        let why = not_stuck_reason(&record);
        return Ok(Step::new(name, Outcome::NotStuck, Some(record)).refused(why));
    }
    let next = next_call(&record);
    if !yes && let Err(why) = confirm(name, &next) {
        return Ok(Step::new(name, Outcome::NotConfirmed, Some(record)).refused(why));
    }
    let release = store.release(id, record.fence).await?;
    if matches!(release, Release::Released(_)) {
        out.say(format_args!("{name}: released: {next}"));
    }
    Ok(released(name, record, release))
}

/// What the next call of a released record does: runs its body again,
/// replaying the steps its call recorded (they stay) and resuming after
/// them; a step marked in flight is checked first, or stops it in doubt.
fn next_call(r: &Record) -> String {
    let mut next = "the next call of this key runs its body again".to_owned();
    if let Some(last) = r.steps.last() {
        let names: Vec<String> = r.steps.iter().map(|step| format!("`{}`", step.name)).collect();
        let (n, names) = (r.steps.len(), names.join(", "));
        next.push_str(&match n {
            1 => format!("; its 1 recorded step stays ({names}): it replays it and resumes after it"),
            _ => format!(
                "; its {n} recorded steps stay ({names}): it replays them and resumes after step {} `{}`",
                last.number, last.name
            ),
        });
    }
    if let Some(step) = &r.in_flight {
        next.push_str(&format!(
            "; step {} `{}` stays marked in flight: a step with a check is checked first, an at-most-once step \
             stops the call in doubt until `idem steps resolve`",
            step.number, step.name
        ));
    }
    next
}

/// What the store did with the `read` record it was asked to release.
fn released(store: &'static str, read: Record, release: Release) -> Step {
    match release {
        Release::Released(_) => Step::new(store, Outcome::Released, Some(read)),
        Release::NotFound => {
            Step::new(store, Outcome::NotFound, Some(read)).refused("the record was removed meanwhile".to_owned())
        }
        Release::NotStuck(now) => {
            let why = format!("it changed meanwhile: {}", not_stuck_reason(&now));
            Step::new(store, Outcome::NotStuck, Some(now)).refused(why)
        }
        Release::FenceChanged(now) => {
            let why = format!("a worker took it over meanwhile (fence {} -> {}); look again", read.fence, now.fence);
            Step::new(store, Outcome::FenceChanged, Some(now)).refused(why)
        }
        _ => Step::new(store, Outcome::Unknown, Some(read)),
    }
}

/// Ask on the terminal; `Err` with why not when the answer is no, or when
/// there is no terminal to ask on.
fn confirm(store: &str, next: &str) -> Result<(), String> {
    ask(&format!("Release this record in {store}? After the release, {next}."), "release")
}

/// Ask `question` on the terminal; `Err` with why not when the answer is
/// no, or when there is no terminal to ask on (`--yes` would `act` without
/// asking).
pub(crate) fn ask(question: &str, act: &str) -> Result<(), String> {
    if !std::io::stdin().is_terminal() {
        return Err(format!("confirmation needed and stdin is not a terminal: pass --yes to {act} without asking"));
    }
    eprint!("{question} [y/N] ");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    std::io::stdin().read_line(&mut answer).map_err(|_| "could not read the answer".to_owned())?;
    if matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes") { Ok(()) } else { Err("not confirmed".to_owned()) }
}

fn not_stuck_reason(r: &Record) -> String {
    match r.state {
        RecordState::Running => format!(
            "it is held: its lease is live for {} more ({}); a record is released only once its lease has passed",
            span(r.lease_left_ms().unwrap_or(0)),
            meaning(r)
        ),
        RecordState::Done => "it is DONE: repeats replay its answer; `idem purge` deletes completed records".to_owned(),
        RecordState::Expired => {
            "it is past its retention: guards ignore it already, and `idem purge` deletes it".to_owned()
        }
        state => format!("it is {} (only stuck records are released)", state.as_str()),
    }
}
