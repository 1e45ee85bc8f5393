//! Testing your own code for idempotency (feature `testing`): a harness
//! that fires duplicates at an operation and compares what they got, and a
//! store wrapper that injects faults on demand. The user-facing
//! documentation is the `idem` crate's `testing` module
//! (`docs/testing.md`).

mod faults;
mod harness;

pub use faults::{Call, Fault, Faults, Faulty, Op};
pub use harness::{Attempt, Duplicates, Report};
