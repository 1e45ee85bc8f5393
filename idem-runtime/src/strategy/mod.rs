//! One module per strategy.

pub(crate) mod dedup;
pub(crate) mod lease;
pub(crate) mod state;
