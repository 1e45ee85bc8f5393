//! One module per strategy.

pub(crate) mod dedup;
pub(crate) mod state;
