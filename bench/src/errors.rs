//! Failed calls while measuring. Any one fails the run: a ratio measured
//! beside failed calls compares different work (a call that fails early is
//! cheap), so it is no figure to print.

use crate::common::BoxError;

/// How many calls failed, and the first one's error.
#[derive(Default)]
pub(crate) struct Errors {
    count: u64,
    first: Option<String>,
}

impl Errors {
    pub(crate) fn add(&mut self, e: impl std::fmt::Display) {
        self.count += 1;
        self.first.get_or_insert_with(|| e.to_string());
    }

    pub(crate) fn count(&self) -> u64 {
        self.count
    }

    pub(crate) fn absorb(&mut self, other: Errors) {
        self.count += other.count;
        if let Some(e) = other.first {
            self.first.get_or_insert(e);
        }
    }

    /// `Ok` when no call failed; otherwise the error that ends the run,
    /// naming the scenario and the mode measured.
    pub(crate) fn check(self, scenario: &str, mode: &str) -> Result<(), BoxError> {
        match self.first {
            None => Ok(()),
            Some(first) => {
                Err(format!("scenario {scenario}, mode {mode}: {} failed calls, the first: {first}", self.count).into())
            }
        }
    }
}
