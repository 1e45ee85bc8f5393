//! Duplicates fired at one operation, and what each got.

use std::fmt::{Debug, Write as _};
use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

/// One copy of the operation, as [`Duplicates::fire`] hands it out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attempt {
    /// The copy's number, in the order the copies were started: the
    /// concurrent wave first, then the sequential ones.
    pub index: usize,
    /// Started together with the rest of the wave (`true`), or alone
    /// after the wave had finished.
    pub concurrent: bool,
}

/// How many duplicates to fire: a wave of concurrent copies (the gateway
/// that retries while the first call still runs), then sequential ones
/// (the retries that come after it answered).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Duplicates {
    concurrent: usize,
    sequential: usize,
}

impl Default for Duplicates {
    /// 100 concurrent copies, then 3 sequential ones.
    fn default() -> Self {
        Duplicates { concurrent: 100, sequential: 3 }
    }
}

impl Duplicates {
    /// 100 concurrent copies, then 3 sequential ones.
    pub fn new() -> Duplicates {
        Duplicates::default()
    }

    /// The size of the concurrent wave (0 for none).
    pub fn concurrent(mut self, copies: usize) -> Duplicates {
        self.concurrent = copies;
        self
    }

    /// How many copies follow the wave, one at a time (0 for none).
    pub fn sequential(mut self, copies: usize) -> Duplicates {
        self.sequential = copies;
        self
    }

    /// Run the copies and keep each one's answer.
    ///
    /// The wave's copies are polled together in the calling task, so they
    /// overlap at every `.await`: at the store and the database, which is
    /// where duplicates race. An operation that must also run on threads
    /// of its own can `tokio::spawn` inside `op` and await the handle.
    pub async fn fire<F, Fut, T>(&self, op: F) -> Report<T>
    where
        F: Fn(Attempt) -> Fut,
        Fut: Future<Output = T>,
    {
        let wave = (0..self.concurrent).map(|index| Attempt { index, concurrent: true });
        let mut answers: Vec<(Attempt, T)> = wave.clone().zip(join_all(wave.map(&op).collect()).await).collect();
        for index in self.concurrent..self.concurrent + self.sequential {
            let attempt = Attempt { index, concurrent: false };
            answers.push((attempt, op(attempt).await));
        }
        Report { answers }
    }
}

/// Every future of `futures` to its end, polled together; the answers in
/// the futures' order.
async fn join_all<Fut: Future>(futures: Vec<Fut>) -> Vec<Fut::Output> {
    let mut running: Vec<Pin<Box<Fut>>> = futures.into_iter().map(Box::pin).collect();
    let mut done: Vec<Option<Fut::Output>> = running.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (future, answer) in running.iter_mut().zip(done.iter_mut()) {
            if answer.is_none() {
                match future.as_mut().poll(cx) {
                    Poll::Ready(value) => *answer = Some(value),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending { Poll::Pending } else { Poll::Ready(()) }
    })
    .await;
    done.into_iter().map(|answer| answer.expect("every future finished")).collect()
}

/// What each copy got, in the order the copies were started.
///
/// Answers are compared by their `Debug` text, so a `Result` whose error
/// type has no `PartialEq` compares too; map away what may differ between
/// a first call and its replay by design (a timestamp of the reply) before
/// the operation returns it.
#[derive(Debug)]
pub struct Report<T> {
    answers: Vec<(Attempt, T)>,
}

impl<T> Report<T> {
    /// Every copy and its answer.
    pub fn answers(&self) -> &[(Attempt, T)] {
        &self.answers
    }

    /// The answers themselves, in order.
    pub fn into_answers(self) -> Vec<T> {
        self.answers.into_iter().map(|(_, answer)| answer).collect()
    }
}

impl<T: Debug> Report<T> {
    /// The distinct answers (by `Debug` text), each with how many copies
    /// got it and the first copy that did, most common first.
    pub fn distinct(&self) -> Vec<(String, usize, Attempt)> {
        let mut seen: Vec<(String, usize, Attempt)> = Vec::new();
        for (attempt, answer) in &self.answers {
            let text = format!("{answer:?}");
            match seen.iter_mut().find(|(t, _, _)| *t == text) {
                Some((_, count, _)) => *count += 1,
                None => seen.push((text, 1, *attempt)),
            }
        }
        seen.sort_by(|a, b| b.1.cmp(&a.1).then(a.2.index.cmp(&b.2.index)));
        seen
    }

    /// The copies whose answer differs from the first copy's.
    pub fn differences(&self) -> Vec<(Attempt, &T)> {
        let Some((_, first)) = self.answers.first() else { return Vec::new() };
        let first = format!("{first:?}");
        self.answers.iter().filter(|(_, answer)| format!("{answer:?}") != first).map(|(a, t)| (*a, t)).collect()
    }

    /// `Err` with a message listing the distinct answers (and which copy
    /// first got each) unless every copy got the same answer.
    pub fn check_same_answers(&self) -> Result<(), String> {
        let distinct = self.distinct();
        if distinct.len() <= 1 {
            return Ok(());
        }
        let mut message =
            format!("{} copies of one call got {} different answers:", self.answers.len(), distinct.len());
        for (text, count, first) in &distinct {
            let when = if first.concurrent { "in the concurrent wave" } else { "after the wave" };
            let _ = write!(message, "\n  {count} x {text} (first: copy #{}, {when})", first.index);
        }
        Err(message)
    }

    /// [`check_same_answers`](Self::check_same_answers), and that the
    /// operation's effect happened once: `executions` is what the test
    /// counted (rows the body wrote, a counter it bumps).
    pub fn check_idempotent(&self, executions: usize) -> Result<(), String> {
        let mut failures: Vec<String> = self.check_same_answers().err().into_iter().collect();
        if executions != 1 {
            failures.push(format!(
                "the effect happened {executions} times for {} copies of one call (expected once)",
                self.answers.len()
            ));
        }
        if failures.is_empty() { Ok(()) } else { Err(failures.join("\n")) }
    }

    /// Panics with [`check_same_answers`](Self::check_same_answers)'s
    /// message unless every copy got the same answer.
    #[track_caller]
    pub fn assert_same_answers(&self) {
        if let Err(message) = self.check_same_answers() {
            panic!("{message}");
        }
    }

    /// Panics with [`check_idempotent`](Self::check_idempotent)'s message
    /// unless every copy got the same answer and the effect happened once.
    #[track_caller]
    pub fn assert_idempotent(&self, executions: usize) {
        if let Err(message) = self.check_idempotent(executions) {
            panic!("{message}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

    #[tokio::test]
    async fn the_wave_overlaps_and_the_sequential_copies_follow_it() {
        let (running, most) = (&AtomicUsize::new(0), &AtomicUsize::new(0));
        let report = Duplicates::new()
            .concurrent(10)
            .sequential(2)
            .fire(|attempt| async move {
                let now = running.fetch_add(1, SeqCst) + 1;
                most.fetch_max(now, SeqCst);
                tokio::task::yield_now().await;
                running.fetch_sub(1, SeqCst);
                attempt.concurrent
            })
            .await;
        assert_eq!(most.load(SeqCst), 10, "the wave's copies ran at once");
        let kinds: Vec<bool> = report.into_answers();
        assert_eq!(kinds, [vec![true; 10], vec![false; 2]].concat());
    }

    #[tokio::test]
    async fn a_differing_answer_is_named_with_its_copy() {
        let report = Duplicates::new().concurrent(4).sequential(1).fire(|a| async move { a.index == 2 }).await;
        assert_eq!(report.differences().len(), 1);
        let text = report.check_same_answers().unwrap_err();
        assert!(text.contains("5 copies of one call got 2 different answers"), "{text}");
        assert!(text.contains("1 x true (first: copy #2, in the concurrent wave)"), "{text}");
        let once = Report { answers: vec![(Attempt { index: 0, concurrent: false }, 1)] };
        assert!(once.check_idempotent(2).unwrap_err().contains("happened 2 times"));
        assert_eq!(once.check_idempotent(1), Ok(()));
    }
}
