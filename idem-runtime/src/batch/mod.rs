//! A broker's batch, each message under its own dedup guard: the
//! user-facing documentation is the `idem` crate's `batch` module; this is
//! the runtime behind it.
//!
//! - `handled`: what became of each message ([`Handled`], [`Failure`]);
//! - `run`: [`dedup`], one transaction per message, one after another.

mod handled;
mod run;

pub use handled::{Failure, Handled};
pub use run::dedup;
