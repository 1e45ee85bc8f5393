//! The strategies, each a method of [`Guard`](crate::Guard) in a module of
//! its own, over the shared record, transition and ticket steps:
//!
//! - `record`: the dedup record in the caller's transaction (claim, judge a
//!   repeat, precheck, remove);
//! - `transition`: an entity's status moved by compare-and-set, and undone;
//! - `ticket`: a first call's ticket in a transaction, completed with the
//!   body's result;
//! - `dedup`, `state`, `token`, `lease`, `lock`: the strategy methods;
//! - `renew`: keeping a lease or a lock alive while a body runs.

pub(crate) mod dedup;
pub(crate) mod lease;
pub(crate) mod lock;
mod record;
mod renew;
pub(crate) mod state;
pub(crate) mod ticket;
pub(crate) mod token;
mod transition;
