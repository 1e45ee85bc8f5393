//! `strategy = "dedup"` (and every strategy that keeps a dedup record in
//! the caller's transaction: `dedup+state`, `token+dedup`, `lock+dedup`):
//!
//! - `guard`: [`Guard::dedup`](crate::guard::Guard::dedup);
//! - `record`: the record's steps (claim, judge a repeat, precheck, keep or
//!   not keep an answer, remove), shared with `state` and `token`;
//! - `ticket`: a first call's ticket, completed with the body's result.

pub(crate) mod guard;
pub(crate) mod record;
pub(crate) mod ticket;
