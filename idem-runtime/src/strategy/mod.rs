//! One module per strategy.

pub(crate) mod dedup;
