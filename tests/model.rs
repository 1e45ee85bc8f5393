//! The lease protocol, model-checked: claims, renewal, fencing, take-over
//! and recorded steps, over the stores' abstract semantics (one record per
//! key, each store operation one atomic step, leases on the store's clock),
//! with every interleaving of three workers that crash and restart, a clock
//! that moves on its own, and a body of recorded steps calling an outside
//! system.
//!
//! What the stores must hold, checked in every reachable state:
//! - only the holder of the newest fence writes (a step's result, the
//!   completion), and only while its lease lasts by the store's clock;
//! - no live lease is taken over;
//! - a recorded step is recorded once, and the call completes only after
//!   every step is recorded;
//! - a worker that takes over never calls the outside system for a step
//!   that was recorded before it claimed (it resumes at the first step
//!   without a result).
//!
//! Then each known bug is put back, one per test, and the checker must
//! find the state that breaks a property: a completion or a step written
//! without its fence check, a take-over decided on the client's clock, a
//! take-over of a live lease, a step recorded after the lease was lost (a
//! check and a write in two operations, a take-over in between).

use std::hash::Hash;

use stateright::{Checker, Model, Property};

/// Workers racing on one key (each may crash and start over).
const WORKERS: usize = 3;
/// Steps of the body.
const STEPS: usize = 3;
/// A lease's length, in ticks of the store's clock.
const LEASE: u8 = 2;
/// The clock's end: the model is finite.
const END: u8 = 8;
/// Crashes in one history, at most.
const CRASHES: u8 = 2;

/// A bug put back into the protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bug {
    /// The completion is accepted from any owner, whatever its fence.
    CompleteWithoutFence,
    /// A step's result is accepted from any owner, whatever its fence.
    StepWithoutFence,
    /// A worker reclaims a record when its own clock (one tick ahead of
    /// the store's) says the lease passed.
    ClientClockReclaim,
    /// A claim takes over a held record whether or not its lease passed.
    TakeOverLive,
    /// A step is recorded in two operations: the holder checks its lease,
    /// then writes; a take-over can come in between.
    StepAfterLeaseLost,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Record {
    Free,
    Held { owner: usize, fence: u8, until: u8 },
    Done,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Worker {
    /// Not started yet, or starting over after a crash.
    Idle,
    /// Holds (or believes it holds) the lease of `fence`; `next` is the
    /// step it runs next; `called` when that step's outside call went out;
    /// `checked` when (with `StepAfterLeaseLost`) it checked its lease
    /// for the write that follows.
    Holding {
        fence: u8,
        next: usize,
        called: bool,
        checked: bool,
    },
    /// Told by the store that the lease is no longer its own: stopped.
    Stopped,
    Crashed,
    /// Got the answer: its own completion, or a replay.
    Finished,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    now: u8,
    fences: u8,
    record: Record,
    /// Each step's result, as the fence that recorded it.
    steps: [Option<u8>; STEPS],
    workers: [Worker; WORKERS],
    crashes: u8,
    /// A write (step or completion) accepted from a worker that was not
    /// the holder of the newest fence with a live lease.
    stale_write: bool,
    /// A claim replaced a record whose lease was live.
    live_take_over: bool,
    /// A step's result written over another.
    step_rewritten: bool,
    /// The record completed with a step missing.
    completed_early: bool,
    /// A worker called the outside system for a step recorded before it
    /// claimed the key.
    reran_recorded: bool,
    /// A take-over that resumed past the first step (the interesting case).
    resumed: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Action {
    Tick,
    Claim(usize),
    Call(usize),
    Check(usize),
    Record(usize),
    Renew(usize),
    Complete(usize),
    Crash(usize),
    Restart(usize),
}

struct Protocol {
    bug: Option<Bug>,
    /// Check this property alone (the checker stops at its first
    /// counterexample instead of exploring everything a bug opens up).
    only: Option<&'static str>,
}

impl State {
    /// Whether `w` holds the record's newest fence with a live lease, by
    /// the store's clock.
    fn holds(&self, w: usize, fence: u8) -> bool {
        matches!(self.record, Record::Held { owner, fence: f, until } if owner == w && f == fence && until > self.now)
    }
}

impl Protocol {
    fn claim(&self, s: &mut State, w: usize) {
        let passed = |until: u8| match self.bug {
            Some(Bug::ClientClockReclaim) => until <= s.now + 1,
            Some(Bug::TakeOverLive) => true,
            _ => until <= s.now,
        };
        let take = match s.record {
            Record::Free => true,
            Record::Held { until, .. } if passed(until) => {
                if until > s.now {
                    s.live_take_over = true;
                }
                true
            }
            Record::Held { .. } => false,
            Record::Done => {
                s.workers[w] = Worker::Finished;
                return;
            }
        };
        if take {
            s.fences += 1;
            s.record = Record::Held { owner: w, fence: s.fences, until: s.now + LEASE };
            // The take-over reads the recorded steps: it resumes at the
            // first one without a result.
            let next = s.steps.iter().position(Option::is_none).unwrap_or(STEPS);
            s.resumed |= next > 0;
            s.workers[w] = Worker::Holding { fence: s.fences, next, called: false, checked: false };
        }
    }

    /// The store's answer to a write of `w` at `fence`: accepted or not.
    fn accepts(&self, s: &State, w: usize, fence: u8, without_fence: bool) -> bool {
        if without_fence {
            return matches!(s.record, Record::Held { .. });
        }
        s.holds(w, fence)
    }

    fn record_step(&self, s: &mut State, w: usize) {
        let Worker::Holding { fence, next, called: true, checked } = s.workers[w] else { return };
        let accepted = match self.bug {
            // The check was its own operation: the write goes in as it is.
            Some(Bug::StepAfterLeaseLost) => checked,
            Some(Bug::StepWithoutFence) => self.accepts(s, w, fence, true),
            _ => self.accepts(s, w, fence, false),
        };
        if !accepted {
            s.workers[w] = Worker::Stopped;
            return;
        }
        s.stale_write |= !s.holds(w, fence);
        if s.steps[next].is_some() {
            s.step_rewritten = true;
        }
        s.steps[next] = Some(fence);
        s.workers[w] = Worker::Holding { fence, next: next + 1, called: false, checked: false };
    }

    fn complete(&self, s: &mut State, w: usize) {
        let Worker::Holding { fence, next, .. } = s.workers[w] else { return };
        if next < STEPS {
            return;
        }
        if !self.accepts(s, w, fence, self.bug == Some(Bug::CompleteWithoutFence)) {
            s.workers[w] = Worker::Stopped;
            return;
        }
        s.stale_write |= !s.holds(w, fence);
        s.completed_early |= s.steps.iter().any(Option::is_none);
        s.record = Record::Done;
        s.workers[w] = Worker::Finished;
    }
}

impl Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            now: 0,
            fences: 0,
            record: Record::Free,
            steps: [None; STEPS],
            workers: std::array::from_fn(|_| Worker::Idle),
            crashes: 0,
            stale_write: false,
            live_take_over: false,
            step_rewritten: false,
            completed_early: false,
            reran_recorded: false,
            resumed: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        if s.now < END {
            actions.push(Action::Tick);
        }
        for (w, worker) in s.workers.iter().enumerate() {
            match *worker {
                Worker::Idle => actions.push(Action::Claim(w)),
                Worker::Holding { next, called, checked, .. } => {
                    actions.push(Action::Renew(w));
                    if next == STEPS {
                        actions.push(Action::Complete(w));
                    } else if !called {
                        actions.push(Action::Call(w));
                    } else if self.bug == Some(Bug::StepAfterLeaseLost) && !checked {
                        actions.push(Action::Check(w));
                    } else {
                        actions.push(Action::Record(w));
                    }
                    if s.crashes < CRASHES {
                        actions.push(Action::Crash(w));
                    }
                }
                Worker::Crashed | Worker::Stopped => actions.push(Action::Restart(w)),
                Worker::Finished => {}
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Tick => s.now += 1,
            Action::Claim(w) => self.claim(&mut s, w),
            Action::Call(w) => {
                let Worker::Holding { fence, next, checked, .. } = s.workers[w] else { return None };
                // The outside system is called with the step's own key (the
                // same for every attempt): it deduplicates a re-sent call.
                if let Some(by) = s.steps[next]
                    && by < fence
                {
                    s.reran_recorded = true;
                }
                s.workers[w] = Worker::Holding { fence, next, called: true, checked };
            }
            Action::Check(w) => {
                let Worker::Holding { fence, next, called, .. } = s.workers[w] else { return None };
                if !s.holds(w, fence) {
                    s.workers[w] = Worker::Stopped;
                } else {
                    s.workers[w] = Worker::Holding { fence, next, called, checked: true };
                }
            }
            Action::Record(w) => self.record_step(&mut s, w),
            Action::Renew(w) => {
                let Worker::Holding { fence, .. } = s.workers[w] else { return None };
                if s.holds(w, fence) {
                    s.record = Record::Held { owner: w, fence, until: s.now + LEASE };
                } else {
                    // The renewal says the lease is gone: the body stops.
                    s.workers[w] = Worker::Stopped;
                }
            }
            Action::Complete(w) => self.complete(&mut s, w),
            Action::Crash(w) => {
                s.workers[w] = Worker::Crashed;
                s.crashes += 1;
            }
            Action::Restart(w) => s.workers[w] = Worker::Idle,
        }
        (s != *last).then_some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let all = vec![
            Property::always("only the live holder of the newest fence writes", |_, s: &State| !s.stale_write),
            Property::always("no live lease is taken over", |_, s: &State| !s.live_take_over),
            Property::always("a step is recorded once", |_, s: &State| !s.step_rewritten),
            Property::always("the call completes after every step", |_, s: &State| !s.completed_early),
            Property::always("a take-over never reruns a recorded step", |_, s: &State| !s.reran_recorded),
            Property::sometimes("a take-over resumes past the first step", |_, s: &State| s.resumed),
            Property::sometimes("the call completes", |_, s: &State| s.record == Record::Done),
        ];
        all.into_iter().filter(|p| self.only.is_none_or(|only| p.name == only)).collect()
    }
}

fn check(bug: Option<Bug>, only: Option<&'static str>) -> impl Checker<Protocol> {
    Protocol { bug, only }.checker().spawn_bfs().join()
}

#[test]
fn the_protocol_holds_in_every_interleaving() {
    let checked = check(None, None);
    checked.assert_properties();
    assert!(checked.unique_state_count() > 1_000, "{} states", checked.unique_state_count());
    eprintln!("lease protocol: {} states, every property holds", checked.unique_state_count());
}

/// The checker finds a state that breaks `property` once `bug` is back.
fn caught(bug: Bug, property: &'static str) {
    let checked = check(Some(bug), Some(property));
    let found = checked.discovery(property);
    assert!(found.is_some(), "{bug:?} was not caught by {property:?}");
    eprintln!("{bug:?} breaks {property:?} after {} actions", found.unwrap().into_actions().len());
}

#[test]
fn a_completion_without_its_fence_check_is_caught() {
    caught(Bug::CompleteWithoutFence, "only the live holder of the newest fence writes");
}

#[test]
fn a_step_without_its_fence_check_is_caught() {
    caught(Bug::StepWithoutFence, "only the live holder of the newest fence writes");
}

#[test]
fn a_reclaim_on_the_clients_clock_is_caught() {
    caught(Bug::ClientClockReclaim, "no live lease is taken over");
}

#[test]
fn a_take_over_of_a_live_lease_is_caught() {
    caught(Bug::TakeOverLive, "no live lease is taken over");
}

#[test]
fn a_step_recorded_after_the_lease_was_lost_is_caught() {
    caught(Bug::StepAfterLeaseLost, "only the live holder of the newest fence writes");
}
