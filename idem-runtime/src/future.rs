//! [`BoxFuture`]: what the store traits' methods return (lease, lock,
//! token and precheck stores), so that a store can sit behind a `dyn`.

use std::future::Future;
use std::pin::Pin;

/// A boxed, `Send` future: what the store traits' methods return, so that a
/// store can sit behind `dyn LeaseStore` (or any other store trait).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;
