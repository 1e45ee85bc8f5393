//! `strategy = "dedup"` (and every strategy that keeps a dedup record in
//! the caller's transaction: `dedup+state`, `token+dedup`, `lock+dedup`):
//!
//! - `context`: [`TxContext`](context::TxContext), the caller's
//!   transaction and the guard's steps on it (claim, store the answer,
//!   start over), shared with `state`, `token` and `idem::Tx`;
//! - `guard`: [`Guard::dedup`](crate::guard::Guard::dedup);
//! - `record`: judging a repeat, the precheck, keeping or not keeping an
//!   answer, removing a record, shared with `state` and `token`;
//! - `ticket`: a first call's ticket, completed with the body's result;
//! - `token`: [`Guard::token_dedup`](crate::guard::Guard::token_dedup), the
//!   record first, then the one-time token.

pub(crate) mod context;
pub(crate) mod guard;
pub(crate) mod record;
pub(crate) mod ticket;
pub(crate) mod token;
