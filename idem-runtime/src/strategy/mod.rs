//! One module per strategy.

pub(crate) mod dedup;
pub(crate) mod lease;
pub(crate) mod lock;
mod renew;
pub(crate) mod state;
pub(crate) mod token;
