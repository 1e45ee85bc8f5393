//! Which stores the guards use: one explicit configuration, read in one
//! place.
//!
//! Dedup and state records live in your SQL transaction and need no
//! configuration. Lease records, one-time tokens, locks and precheck
//! markers live in a store of their own, which a guard takes from
//! `store = "..."` on the attribute, or else from the [`Stores`] installed
//! once at start-up:
//!
//! ```no_run
//! # extern crate idem_runtime as idem;
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let client = redis::Client::open("redis://127.0.0.1/")?;
//! let redis = idem::store::RedisStore::new(redis::aio::ConnectionManager::new(client).await?, "idem:");
//! idem::Stores::builder().all(redis).install()?;
//! # Ok(()) }
//! ```
//!
//! There is no fallback: a guard that needs a store, names none, and finds
//! none installed for its role fails with [`Error::NoStore`], which says
//! what to install. (An in-process store nobody else can see would
//! deduplicate per process, and a service of several instances would run a
//! repeat once per instance.) [`MemoryStore`](crate::store::MemoryStore) is there
//! for tests and one-process services, chosen like any other store.
//!
//! The installed `Stores` also name the record table of the process's SQL
//! records ([`StoresBuilder::record_table`], `idem_records` by default),
//! and hold the statements built for it: guards in your transaction,
//! [`SqlStore`](crate::store::SqlStore), migrations, purges and the admin
//! functions all take them from here (from a default `Stores` on
//! `idem_records` while none is installed).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::error::Error;
use crate::future::BoxFuture;
use crate::lease::store::{HeldLease, LeaseClaim, LeaseRequest, LeaseStore, Watch};
use crate::lease::store::{NewStep, Resolve, StepLog, StepOutcome};
use crate::lock::store::{LockAttempt, LockStore};
use crate::precheck::store::PrecheckStore;
#[cfg(feature = "sql")]
use crate::table::{RecordSql, RecordTable};
use crate::token::store::TokenStore;

/// The stores guards use when the attribute names no `store`: one per role
/// (lease records, tokens, locks, precheck markers), each optional. Built
/// with [`Stores::builder`], then either [installed](StoresBuilder::install)
/// process-wide, once, or [built](StoresBuilder::build) into a value that a
/// guard names as its `store` (`store = "self.stores"`): a `Stores` is a
/// store of every kind, each operation going to the store of its role (or
/// failing with [`Error::NoStore`] if it has none).
#[derive(Clone, Default)]
pub struct Stores {
    lease: Option<Arc<dyn LeaseStore>>,
    token: Option<Arc<dyn TokenStore>>,
    lock: Option<Arc<dyn LockStore>>,
    precheck: Option<Arc<dyn PrecheckStore>>,
    /// The record table and the statements built for it.
    #[cfg(feature = "sql")]
    records: Arc<RecordSql>,
}

impl std::fmt::Debug for Stores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut stores = f.debug_struct("Stores");
        stores
            .field("lease", &self.lease.as_ref().map(|s| s.kind()))
            .field("token", &self.token.as_ref().map(|s| s.kind()))
            .field("lock", &self.lock.as_ref().map(|s| s.kind()))
            .field("precheck", &self.precheck.as_ref().map(|s| s.kind()));
        #[cfg(feature = "sql")]
        stores.field("record_table", &self.records.table().qualified());
        stores.finish()
    }
}

/// Builds a [`Stores`]; see [`Stores::builder`].
#[derive(Default)]
#[must_use = "a builder does nothing until it is installed or built"]
pub struct StoresBuilder {
    stores: Stores,
}

static INSTALLED: OnceLock<Stores> = OnceLock::new();

/// The record table's statements SQL steps used while no `Stores` was
/// installed (`idem_records`); once used, a `Stores` naming another table
/// can no longer be installed.
#[cfg(feature = "sql")]
static DEFAULT_RECORDS: OnceLock<RecordSql> = OnceLock::new();

/// Held while a SQL step settles for the default table and while `Stores`
/// are installed, so that a step cannot use `idem_records` after another
/// table was installed.
#[cfg(feature = "sql")]
static SETTLING: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl Stores {
    /// A configuration with no store yet.
    ///
    /// ```
    /// # extern crate idem_runtime as idem;
    /// # fn demo() -> Result<(), idem::Error> {
    /// use std::sync::Arc;
    /// let memory = Arc::new(idem::store::MemoryStore::new());
    /// let stores = idem::Stores::builder().lease(memory.clone()).token(memory).build();
    /// assert!(stores.lock().is_err()); // no lock store: a lock guard using these fails
    /// # Ok(()) }
    /// ```
    pub fn builder() -> StoresBuilder {
        StoresBuilder::default()
    }

    /// The installed stores: [`Error::StoresNotInstalled`] if
    /// [`StoresBuilder::install`] has not run.
    pub fn installed() -> Result<&'static Stores, Error> {
        INSTALLED.get().ok_or(Error::StoresNotInstalled)
    }

    /// The lease store, or [`Error::NoStore`].
    pub fn lease(&self) -> Result<&dyn LeaseStore, Error> {
        self.lease.as_deref().ok_or(Error::NoStore { role: "lease" })
    }

    /// The token store, or [`Error::NoStore`]. To issue a token from the
    /// installed one: `idem::token::issue(Stores::installed()?.token()?, scope, ttl)`.
    pub fn token(&self) -> Result<&dyn TokenStore, Error> {
        self.token.as_deref().ok_or(Error::NoStore { role: "token" })
    }

    /// The lock store, or [`Error::NoStore`].
    pub fn lock(&self) -> Result<&dyn LockStore, Error> {
        self.lock.as_deref().ok_or(Error::NoStore { role: "lock" })
    }

    /// The precheck store, or [`Error::NoStore`].
    pub fn precheck(&self) -> Result<&dyn PrecheckStore, Error> {
        self.precheck.as_deref().ok_or(Error::NoStore { role: "precheck" })
    }

    /// The record table of SQL records: `idem_records` unless
    /// [`StoresBuilder::record_table`] named another.
    #[cfg(feature = "sql")]
    pub fn record_table(&self) -> &RecordTable {
        self.records.table()
    }

    fn lease_or_missing(&self) -> &dyn LeaseStore {
        self.lease.as_deref().unwrap_or(&Missing("lease"))
    }

    fn token_or_missing(&self) -> &dyn TokenStore {
        self.token.as_deref().unwrap_or(&Missing("token"))
    }

    fn lock_or_missing(&self) -> &dyn LockStore {
        self.lock.as_deref().unwrap_or(&Missing("lock"))
    }

    fn precheck_or_missing(&self) -> &dyn PrecheckStore {
        self.precheck.as_deref().unwrap_or(&Missing("precheck"))
    }
}

impl StoresBuilder {
    /// Where `strategy = "lease"` keeps its records: a
    /// [`SqlStore`][crate::store::SqlStore] for records that must survive
    /// anything, [`RedisStore`][crate::store::RedisStore],
    /// [`Routed`](crate::store::Routed), or [`MemoryStore`](crate::store::MemoryStore).
    #[doc = links!()]
    pub fn lease(mut self, store: impl LeaseStore + 'static) -> StoresBuilder {
        self.stores.lease = Some(Arc::new(store));
        self
    }

    /// Where one-time tokens live (`token`, `token+dedup`, `token::issue`).
    pub fn token(mut self, store: impl TokenStore + 'static) -> StoresBuilder {
        self.stores.token = Some(Arc::new(store));
        self
    }

    /// Where locks and their fencing counters live (`lock+dedup`, `lock+state`, `lock`).
    pub fn lock(mut self, store: impl LockStore + 'static) -> StoresBuilder {
        self.stores.lock = Some(Arc::new(store));
        self
    }

    /// Where precheck markers live (`precheck = "redis"`).
    pub fn precheck(mut self, store: impl PrecheckStore + 'static) -> StoresBuilder {
        self.stores.precheck = Some(Arc::new(store));
        self
    }

    /// One store for every role: a [`RedisStore`][crate::store::RedisStore] or a
    /// [`MemoryStore`](crate::store::MemoryStore), which keep each kind of record
    /// under names of its own.
    #[doc = links!()]
    pub fn all<S>(self, store: S) -> StoresBuilder
    where
        S: LeaseStore + TokenStore + LockStore + PrecheckStore + 'static,
    {
        let store = Arc::new(store);
        self.lease(store.clone()).token(store.clone()).lock(store.clone()).precheck(store)
    }

    /// Keep SQL records in `table` instead of `idem_records` (e.g.
    /// `RecordTable::new("billing.idem_records")?`; the archive goes to
    /// `<table>_archive`): dedup and state records, lease records of a
    /// [`SqlStore`](crate::store::SqlStore), migrations
    /// ([`migrate`](crate::migrate), [`migrator`](crate::sql::migrator)),
    /// purges and the admin functions.
    ///
    /// It takes effect when these stores are [installed](Self::install),
    /// for the whole process: guards in your transaction name no store, so
    /// one table serves them all (a `Stores` that is only
    /// [built](Self::build) does not change it). Install them at start-up, before the
    /// first migration or guard: once a SQL step has used `idem_records`,
    /// installing another table is [`Error::InvalidTable`], since guards
    /// writing to two tables would run a repeat of a call the other table
    /// saw. Every process of a service must name the same table.
    ///
    /// On SQLite a table takes no schema (`"name"` only); on PostgreSQL the
    /// schema must exist; on MySQL/MariaDB the schema is a database.
    #[cfg(feature = "sql")]
    pub fn record_table(mut self, table: RecordTable) -> StoresBuilder {
        self.stores.records = Arc::new(RecordSql::new(table));
        self
    }

    /// The configuration as a value, for `store = "..."` on guards (or
    /// several configurations in one process, as tests have).
    pub fn build(self) -> Stores {
        self.stores
    }

    /// Make this the configuration of every guard that names no `store`,
    /// for the rest of the process. Once: a second call is
    /// [`Error::StoresAlreadyInstalled`] and changes nothing (guards may
    /// already have used the first configuration). A record table other
    /// than `idem_records` after a SQL step has used that one is
    /// [`Error::InvalidTable`] (see [`record_table`][crate::StoresBuilder::record_table]).
    #[doc = links!()]
    pub fn install(self) -> Result<&'static Stores, Error> {
        #[cfg(feature = "sql")]
        let _settling = SETTLING.lock().unwrap_or_else(|e| e.into_inner());
        if INSTALLED.get().is_some() {
            return Err(Error::StoresAlreadyInstalled);
        }
        #[cfg(feature = "sql")]
        if let Some(used) = DEFAULT_RECORDS.get().filter(|_| !self.stores.record_table().is_default()) {
            return Err(Error::InvalidTable {
                table: self.stores.record_table().to_string(),
                reason: format!(
                    "this process already keeps its records in `{}` (install the stores, with their record table, \
                     at start-up, before the first migration or guard)",
                    used.table()
                ),
            });
        }
        let mut fresh = false;
        let stores = INSTALLED.get_or_init(|| {
            fresh = true;
            self.stores
        });
        if fresh { Ok(stores) } else { Err(Error::StoresAlreadyInstalled) }
    }
}

/// The record table of this process and its statements: the installed
/// `Stores`' or, while none is installed, the default (`idem_records`),
/// which is then fixed (see [`StoresBuilder::record_table`]).
#[cfg(feature = "sql")]
pub(crate) fn record_sql() -> &'static RecordSql {
    if let Some(stores) = INSTALLED.get() {
        return &stores.records;
    }
    if let Some(default) = DEFAULT_RECORDS.get() {
        return default;
    }
    let _settling = SETTLING.lock().unwrap_or_else(|e| e.into_inner());
    match INSTALLED.get() {
        Some(stores) => &stores.records,
        None => DEFAULT_RECORDS.get_or_init(RecordSql::default),
    }
}

/// The installed store of a role, for guards that name none: a store whose
/// every operation fails with [`Error::NoStore`] if nothing was installed.
#[doc(hidden)]
pub fn installed_lease() -> &'static dyn LeaseStore {
    INSTALLED.get().map_or(&Missing("lease"), Stores::lease_or_missing)
}

#[doc(hidden)]
pub fn installed_token() -> &'static dyn TokenStore {
    INSTALLED.get().map_or(&Missing("token"), Stores::token_or_missing)
}

#[doc(hidden)]
pub fn installed_lock() -> &'static dyn LockStore {
    INSTALLED.get().map_or(&Missing("lock"), Stores::lock_or_missing)
}

#[doc(hidden)]
pub fn installed_precheck() -> &'static dyn PrecheckStore {
    INSTALLED.get().map_or(&Missing("precheck"), Stores::precheck_or_missing)
}

/// No store for a role: every operation is [`Error::NoStore`].
struct Missing(&'static str);

impl Missing {
    fn fail<'a, T: Send + 'a>(&self) -> BoxFuture<'a, Result<T, Error>> {
        Box::pin(std::future::ready(Err(Error::NoStore { role: self.0 })))
    }
}

impl LeaseStore for Missing {
    fn kind(&self) -> &'static str {
        "none"
    }
    fn claim<'a>(&'a self, _: &'a LeaseRequest<'a>) -> BoxFuture<'a, Result<LeaseClaim, Error>> {
        self.fail()
    }
    fn complete<'a>(&'a self, _: &'a HeldLease<'a>, _: Option<&'a str>) -> BoxFuture<'a, Result<bool, Error>> {
        self.fail()
    }
    fn release<'a>(&'a self, _: &'a HeldLease<'a>) -> BoxFuture<'a, Result<bool, Error>> {
        self.fail()
    }
    fn extend<'a>(&'a self, _: &'a HeldLease<'a>) -> BoxFuture<'a, Result<bool, Error>> {
        self.fail()
    }
}

impl TokenStore for Missing {
    fn kind(&self) -> &'static str {
        "none"
    }
    fn put<'a>(&'a self, _: &'a str, _: &'a str, _: Duration) -> BoxFuture<'a, Result<(), Error>> {
        self.fail()
    }
    fn consume<'a>(&'a self, _: &'a str, _: &'a str) -> BoxFuture<'a, Result<bool, Error>> {
        self.fail()
    }
}

impl LockStore for Missing {
    fn kind(&self) -> &'static str {
        "none"
    }
    fn acquire<'a>(
        &'a self,
        _: &'a str,
        _: &'a str,
        _: &'a str,
        _: Duration,
    ) -> BoxFuture<'a, Result<LockAttempt, Error>> {
        self.fail()
    }
    fn release<'a>(&'a self, _: &'a str, _: &'a str, _: &'a str) -> BoxFuture<'a, Result<bool, Error>> {
        self.fail()
    }
    fn extend<'a>(&'a self, _: &'a str, _: &'a str, _: &'a str, _: Duration) -> BoxFuture<'a, Result<bool, Error>> {
        self.fail()
    }
}

impl PrecheckStore for Missing {
    fn kind(&self) -> &'static str {
        "none"
    }
    fn mark<'a>(&'a self, _: &'a str, _: &'a str, _: Duration) -> BoxFuture<'a, Result<bool, Error>> {
        self.fail()
    }
}

/// A `Stores` value named as a guard's `store`: each operation goes to the
/// store of its role.
impl LeaseStore for Stores {
    fn kind(&self) -> &'static str {
        self.lease_or_missing().kind()
    }
    fn claim<'a>(&'a self, req: &'a LeaseRequest<'a>) -> BoxFuture<'a, Result<LeaseClaim, Error>> {
        self.lease_or_missing().claim(req)
    }
    fn complete<'a>(
        &'a self,
        held: &'a HeldLease<'a>,
        response: Option<&'a str>,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        self.lease_or_missing().complete(held, response)
    }
    fn release<'a>(&'a self, held: &'a HeldLease<'a>) -> BoxFuture<'a, Result<bool, Error>> {
        self.lease_or_missing().release(held)
    }
    fn extend<'a>(&'a self, held: &'a HeldLease<'a>) -> BoxFuture<'a, Result<bool, Error>> {
        self.lease_or_missing().extend(held)
    }
    fn peek<'a>(&'a self, req: &'a LeaseRequest<'a>) -> BoxFuture<'a, Result<Option<LeaseClaim>, Error>> {
        self.lease_or_missing().peek(req)
    }
    fn answer_limit(&self) -> BoxFuture<'_, usize> {
        self.lease_or_missing().answer_limit()
    }
    fn steps<'a>(&'a self, scope: &'a str, key: &'a str) -> BoxFuture<'a, Result<StepLog, Error>> {
        self.lease_or_missing().steps(scope, key)
    }
    fn record_step<'a>(&'a self, held: &'a HeldLease<'a>, step: &'a NewStep<'a>) -> BoxFuture<'a, Result<bool, Error>> {
        self.lease_or_missing().record_step(held, step)
    }
    fn mark_step<'a>(
        &'a self,
        held: &'a HeldLease<'a>,
        number: usize,
        name: &'a str,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        self.lease_or_missing().mark_step(held, number, name)
    }
    fn unmark_step<'a>(&'a self, held: &'a HeldLease<'a>, number: usize) -> BoxFuture<'a, Result<(), Error>> {
        self.lease_or_missing().unmark_step(held, number)
    }
    fn resolve_step<'a>(
        &'a self,
        scope: &'a str,
        key: &'a str,
        step: &'a str,
        outcome: StepOutcome<'a>,
    ) -> BoxFuture<'a, Result<Resolve, Error>> {
        self.lease_or_missing().resolve_step(scope, key, step, outcome)
    }
    fn forget_steps<'a>(&'a self, scope: &'a str, key: &'a str) -> BoxFuture<'a, Result<(), Error>> {
        self.lease_or_missing().forget_steps(scope, key)
    }
    fn notifies(&self) -> bool {
        self.lease_or_missing().notifies()
    }
    fn watch<'a>(&'a self, scope: &'a str, key: &'a str) -> Watch<'a> {
        self.lease_or_missing().watch(scope, key)
    }
    fn shared(&self) -> Option<Arc<dyn LeaseStore>> {
        // The installed store is shared already, whoever wrote it.
        self.lease.clone()
    }
}

impl TokenStore for Stores {
    fn kind(&self) -> &'static str {
        self.token_or_missing().kind()
    }
    fn put<'a>(&'a self, scope: &'a str, token: &'a str, ttl: Duration) -> BoxFuture<'a, Result<(), Error>> {
        self.token_or_missing().put(scope, token, ttl)
    }
    fn consume<'a>(&'a self, scope: &'a str, token: &'a str) -> BoxFuture<'a, Result<bool, Error>> {
        self.token_or_missing().consume(scope, token)
    }
}

impl LockStore for Stores {
    fn kind(&self) -> &'static str {
        self.lock_or_missing().kind()
    }
    fn acquire<'a>(
        &'a self,
        scope: &'a str,
        key: &'a str,
        owner: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<LockAttempt, Error>> {
        self.lock_or_missing().acquire(scope, key, owner, ttl)
    }
    fn release<'a>(&'a self, scope: &'a str, key: &'a str, owner: &'a str) -> BoxFuture<'a, Result<bool, Error>> {
        self.lock_or_missing().release(scope, key, owner)
    }
    fn extend<'a>(
        &'a self,
        scope: &'a str,
        key: &'a str,
        owner: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        self.lock_or_missing().extend(scope, key, owner, ttl)
    }
    fn release_detached(&self, scope: &str, key: &str, owner: &str) {
        self.lock_or_missing().release_detached(scope, key, owner)
    }
    fn shared(&self) -> Option<Arc<dyn LockStore>> {
        self.lock.clone()
    }
}

impl PrecheckStore for Stores {
    fn kind(&self) -> &'static str {
        self.precheck_or_missing().kind()
    }
    fn mark<'a>(&'a self, scope: &'a str, key: &'a str, ttl: Duration) -> BoxFuture<'a, Result<bool, Error>> {
        self.precheck_or_missing().mark(scope, key, ttl)
    }
}
