//! Lease records spread over several stores (shards) by key.

use std::sync::Arc;

use sha2::{Digest as _, Sha256};

use super::BoxFuture;
use crate::error::Error;
use crate::lease::store::{HeldLease, LeaseClaim, LeaseRequest, LeaseStore, Watch};
use crate::lease::store::{NewStep, Resolve, StepLog, StepOutcome};

type Route = Arc<dyn Fn(&str, &str) -> usize + Send + Sync>;

/// Lease records over several stores, each record on the one its key routes
/// to: with sharded SQL databases, keep a key's record on the shard of its
/// business row. Every operation on a key goes to the same shard, so each
/// stays one atomic step there.
///
/// The route sees the record's scope and key **as stored**: a single key's
/// text (`:` and `\` escaped with `\`), a composite key's parts joined by
/// `:`, and a key over 128 bytes as `\sha256:<hex>` (route those by
/// [`Routed::hashed`], or keep routed keys short).
///
/// ```no_run
/// # extern crate idem_runtime as idem;
/// # async fn demo(eu: sqlx::PgPool, us: sqlx::PgPool) -> Result<(), idem::Error> {
/// use idem::store::{Routed, SqlStore};
/// // Orders "EU-..." live in the EU database, the rest in the US one.
/// let store = Routed::new(vec![SqlStore::new(eu), SqlStore::new(us)], |_scope, key| {
///     if key.starts_with("EU-") { 0 } else { 1 }
/// });
/// idem::Stores::builder().lease(store).install()?;
/// # Ok(()) }
/// ```
///
/// Stores of different kinds go in as `Arc<dyn LeaseStore>`. Changing the
/// list of shards (or the route) moves keys: a repeat routed elsewhere
/// finds no record and runs again, so drain or copy records first.
pub struct Routed<S> {
    shards: Vec<S>,
    route: Route,
}

impl<S> std::fmt::Debug for Routed<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Routed").field("shards", &self.shards.len()).finish_non_exhaustive()
    }
}

impl<S: LeaseStore> Routed<S> {
    /// Records over `shards`, `route(scope, key)` giving the index of a
    /// record's shard. A route outside `shards` fails that call with
    /// [`Error::Store`] (`store: "routed"`), nothing written.
    ///
    /// # Panics
    /// If `shards` is empty.
    pub fn new(shards: Vec<S>, route: impl Fn(&str, &str) -> usize + Send + Sync + 'static) -> Routed<S> {
        assert!(!shards.is_empty(), "idem::store::Routed needs at least one store");
        Routed { shards, route: Arc::new(route) }
    }

    /// Records over `shards` by a stable hash of scope and key (SHA-256):
    /// the same key lands on the same shard in every process, as long as
    /// every process lists the same shards in the same order.
    ///
    /// # Panics
    /// If `shards` is empty.
    pub fn hashed(shards: Vec<S>) -> Routed<S> {
        let n = shards.len() as u64;
        Routed::new(shards, move |scope, key| {
            let digest = Sha256::new().chain_update(scope).chain_update([0]).chain_update(key).finalize();
            let head = u64::from_be_bytes(digest[..8].try_into().expect("a SHA-256 digest has 8 bytes"));
            (head % n.max(1)) as usize
        })
    }

    /// The stores, in the order the route indexes them (e.g. to purge each).
    pub fn shards(&self) -> &[S] {
        &self.shards
    }

    fn shard(&self, scope: &str, key: &str) -> Result<&S, Error> {
        let i = (self.route)(scope, key);
        self.shards.get(i).ok_or_else(|| Error::Store {
            store: "routed",
            source: format!(
                "the route sent a record of scope `{scope}` to shard {i}, but there are {} (0 to {})",
                self.shards.len(),
                self.shards.len() - 1
            )
            .into(),
        })
    }
}

impl<S: LeaseStore> Routed<S> {
    /// `op` on the shard of `(scope, key)`, or the routing error.
    fn on<'a, T: Send + 'a>(
        &'a self,
        scope: &str,
        key: &str,
        op: impl FnOnce(&'a S) -> BoxFuture<'a, Result<T, Error>>,
    ) -> BoxFuture<'a, Result<T, Error>> {
        match self.shard(scope, key) {
            Ok(s) => op(s),
            Err(e) => Box::pin(std::future::ready(Err(e))),
        }
    }
}

impl<S: LeaseStore> LeaseStore for Routed<S> {
    fn kind(&self) -> &'static str {
        "routed"
    }

    fn claim<'a>(&'a self, req: &'a LeaseRequest<'a>) -> BoxFuture<'a, Result<LeaseClaim, Error>> {
        self.on(req.scope, req.key, |s| s.claim(req))
    }

    fn complete<'a>(
        &'a self,
        held: &'a HeldLease<'a>,
        response: Option<&'a str>,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        self.on(held.scope, held.key, |s| s.complete(held, response))
    }

    fn release<'a>(&'a self, held: &'a HeldLease<'a>) -> BoxFuture<'a, Result<bool, Error>> {
        self.on(held.scope, held.key, |s| s.release(held))
    }

    fn extend<'a>(&'a self, held: &'a HeldLease<'a>) -> BoxFuture<'a, Result<bool, Error>> {
        self.on(held.scope, held.key, |s| s.extend(held))
    }

    fn peek<'a>(&'a self, req: &'a LeaseRequest<'a>) -> BoxFuture<'a, Result<Option<LeaseClaim>, Error>> {
        self.on(req.scope, req.key, |s| s.peek(req))
    }

    fn steps<'a>(&'a self, scope: &'a str, key: &'a str) -> BoxFuture<'a, Result<StepLog, Error>> {
        self.on(scope, key, |s| s.steps(scope, key))
    }

    fn record_step<'a>(&'a self, held: &'a HeldLease<'a>, step: &'a NewStep<'a>) -> BoxFuture<'a, Result<bool, Error>> {
        self.on(held.scope, held.key, |s| s.record_step(held, step))
    }

    fn mark_step<'a>(
        &'a self,
        held: &'a HeldLease<'a>,
        number: usize,
        name: &'a str,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        self.on(held.scope, held.key, |s| s.mark_step(held, number, name))
    }

    fn unmark_step<'a>(&'a self, held: &'a HeldLease<'a>, number: usize) -> BoxFuture<'a, Result<(), Error>> {
        self.on(held.scope, held.key, |s| s.unmark_step(held, number))
    }

    fn resolve_step<'a>(
        &'a self,
        scope: &'a str,
        key: &'a str,
        step: &'a str,
        outcome: StepOutcome<'a>,
    ) -> BoxFuture<'a, Result<Resolve, Error>> {
        self.on(scope, key, |s| s.resolve_step(scope, key, step, outcome))
    }

    fn forget_steps<'a>(&'a self, scope: &'a str, key: &'a str) -> BoxFuture<'a, Result<(), Error>> {
        self.on(scope, key, |s| s.forget_steps(scope, key))
    }

    /// Only if every shard does.
    fn notifies(&self) -> bool {
        self.shards.iter().all(|s| s.notifies())
    }

    fn watch<'a>(&'a self, scope: &'a str, key: &'a str) -> Watch<'a> {
        match self.shard(scope, key) {
            Ok(s) => s.watch(scope, key),
            Err(_) => Watch::none(),
        }
    }

    /// Only if every shard gives one.
    fn shared(&self) -> Option<Arc<dyn LeaseStore>> {
        let shards = self.shards.iter().map(LeaseStore::shared).collect::<Option<Vec<_>>>()?;
        Some(Arc::new(Routed { shards, route: self.route.clone() }))
    }

    fn answer_limit(&self) -> BoxFuture<'_, usize> {
        Box::pin(async move {
            let mut limit = usize::MAX;
            for shard in &self.shards {
                limit = limit.min(shard.answer_limit().await);
            }
            limit
        })
    }
}
