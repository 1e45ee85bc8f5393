//! The stores a command acts on, each able to do what the commands ask of
//! it: a command says what, the store's kind decides how.

use idem_runtime::admin::{self, PurgePreview, Record, RecordId, Release, StuckQuery};
use idem_runtime::lease::{LeaseStore as _, Resolve, StepLog, StepOutcome};
use idem_runtime::outbox::{self, Entry, Message, MessageCounts, MessageId, MessageQuery};
use idem_runtime::sql::{PurgeOptions, PurgeReport};
use idem_runtime::store::{RedisStore, SqlStore};
use sqlx::{MySqlPool, PgPool, SqlitePool};

use crate::error::{Failure, store_failure};

/// One store given: the SQL database of `--database-url`, the Redis
/// server of `--redis-url`, or the etcd cluster of `--etcd-url`.
pub(crate) enum Store {
    Sql(Sql),
    Redis(RedisStore),
    #[cfg(feature = "etcd")]
    Etcd(idem_runtime::store::EtcdStore),
}

/// etcd's name in the output.
#[cfg(feature = "etcd")]
const ETCD: &str = "etcd";

/// The SQL database of `--database-url`.
pub(crate) enum Sql {
    Postgres(PgPool),
    Mysql(MySqlPool),
    Sqlite(SqlitePool),
}

/// Redis's name in the output.
const REDIS: &str = "redis";

/// The runtime's SQL functions are generic over the pool: the same call on
/// whichever pool the URL named.
macro_rules! on_pool {
    ($sql:expr, |$pool:ident| $body:expr) => {
        match $sql {
            Sql::Postgres($pool) => $body,
            Sql::Mysql($pool) => $body,
            Sql::Sqlite($pool) => $body,
        }
    };
}

impl Store {
    /// The store's name in the output.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Store::Sql(sql) => sql.name(),
            Store::Redis(_) => REDIS,
            #[cfg(feature = "etcd")]
            Store::Etcd(_) => ETCD,
        }
    }

    /// The record of `id`, if there is one.
    pub(crate) async fn inspect(&self, id: &RecordId) -> Result<Option<Record>, Failure> {
        match self {
            Store::Sql(sql) => sql.inspect(id).await,
            Store::Redis(redis) => redis.inspect_lease(id).await.map_err(|e| store_failure(REDIS, e)),
            #[cfg(feature = "etcd")]
            Store::Etcd(etcd) => etcd.inspect_lease(id).await.map_err(|e| store_failure(ETCD, e)),
        }
    }

    /// At most `limit` stuck records, of `scope` alone if given.
    pub(crate) async fn stuck(&self, scope: Option<&str>, limit: usize) -> Result<Vec<Record>, Failure> {
        match self {
            Store::Sql(sql) => {
                // At most one over u32::MAX (--limit is a u32, and one more is
                // asked for): no store holds that many, so saturate.
                let limit = u32::try_from(limit).unwrap_or(u32::MAX);
                sql.stuck(&StuckQuery { scope: scope.map(str::to_owned), limit, after: None }).await
            }
            Store::Redis(redis) => redis.stuck_leases(scope, limit).await.map_err(|e| store_failure(REDIS, e)),
            #[cfg(feature = "etcd")]
            Store::Etcd(etcd) => etcd.stuck_leases(scope, limit).await.map_err(|e| store_failure(ETCD, e)),
        }
    }

    /// Delete the record of `id` if it is stuck and still has `fence`.
    pub(crate) async fn release(&self, id: &RecordId, fence: i64) -> Result<Release, Failure> {
        match self {
            Store::Sql(sql) => sql.release(id, fence).await,
            Store::Redis(redis) => redis.release_lease(id, fence).await.map_err(|e| store_failure(REDIS, e)),
            #[cfg(feature = "etcd")]
            Store::Etcd(etcd) => etcd.release_lease(id, fence).await.map_err(|e| store_failure(ETCD, e)),
        }
    }

    /// The steps of the call of `id`, whether or not its record is there.
    pub(crate) async fn steps(&self, id: &RecordId) -> Result<StepLog, Failure> {
        let read = match self {
            Store::Sql(sql) => on_pool!(sql, |pool| SqlStore::new(pool.clone()).steps(id.scope(), id.key()).await),
            Store::Redis(redis) => redis.steps(id.scope(), id.key()).await,
            #[cfg(feature = "etcd")]
            Store::Etcd(etcd) => etcd.steps(id.scope(), id.key()).await,
        };
        read.map_err(|e| store_failure(self.name(), e))
    }

    /// Resolve the step `step` in flight in the call of `id`.
    pub(crate) async fn resolve_step(
        &self,
        id: &RecordId,
        step: &str,
        outcome: StepOutcome<'_>,
    ) -> Result<Resolve, Failure> {
        let (scope, key) = (id.scope(), id.key());
        let resolved = match self {
            Store::Sql(sql) => {
                on_pool!(sql, |pool| SqlStore::new(pool.clone()).resolve_step(scope, key, step, outcome).await)
            }
            Store::Redis(redis) => redis.resolve_step(scope, key, step, outcome).await,
            #[cfg(feature = "etcd")]
            Store::Etcd(etcd) => etcd.resolve_step(scope, key, step, outcome).await,
        };
        resolved.map_err(|e| store_failure(self.name(), e))
    }
}

impl Sql {
    /// `postgres`, `mysql` or `sqlite`: the store's name in the output.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Sql::Postgres(_) => "postgres",
            Sql::Mysql(_) => "mysql",
            Sql::Sqlite(_) => "sqlite",
        }
    }

    fn failure(&self, e: idem_runtime::Error) -> Failure {
        store_failure(self.name(), e)
    }

    pub(crate) async fn migrate(&self) -> Result<(), Failure> {
        on_pool!(self, |pool| idem_runtime::migrate(pool).await).map_err(|e| self.failure(e))
    }

    async fn inspect(&self, id: &RecordId) -> Result<Option<Record>, Failure> {
        on_pool!(self, |pool| admin::inspect(pool, id).await).map_err(|e| self.failure(e))
    }

    async fn stuck(&self, query: &StuckQuery) -> Result<Vec<Record>, Failure> {
        on_pool!(self, |pool| admin::stuck(pool, query).await).map_err(|e| self.failure(e))
    }

    async fn release(&self, id: &RecordId, fence: i64) -> Result<Release, Failure> {
        on_pool!(self, |pool| admin::release(pool, id, fence).await).map_err(|e| self.failure(e))
    }

    pub(crate) async fn purge_preview(&self, options: &PurgeOptions) -> Result<PurgePreview, Failure> {
        on_pool!(self, |pool| admin::purge_preview(pool, options).await).map_err(|e| self.failure(e))
    }

    pub(crate) async fn purge(&self, options: PurgeOptions) -> Result<PurgeReport, Failure> {
        on_pool!(self, |pool| idem_runtime::sql::purge_expired(pool, options).await).map_err(|e| self.failure(e))
    }

    /// `result`, `None` where the outbox table is missing (a database
    /// migrated before there was one): a command that also looks at the
    /// outbox (`stuck`, `purge`) says so and goes on.
    fn unless_no_outbox<T>(&self, result: Result<T, idem_runtime::Error>) -> Result<Option<T>, Failure> {
        match result {
            Ok(value) => Ok(Some(value)),
            Err(idem_runtime::Error::NotMigrated { .. }) => Ok(None),
            Err(e) => Err(self.failure(e)),
        }
    }

    pub(crate) async fn messages(&self, query: &MessageQuery) -> Result<Vec<Entry>, Failure> {
        on_pool!(self, |pool| outbox::list_messages(pool, query).await).map_err(|e| self.failure(e))
    }

    pub(crate) async fn message(&self, id: &MessageId) -> Result<Option<(Entry, Message)>, Failure> {
        on_pool!(self, |pool| outbox::find_message(pool, id).await).map_err(|e| self.failure(e))
    }

    /// The messages of `query` by state (all that `query`'s states and
    /// scope name).
    pub(crate) async fn count_messages(&self, query: &MessageQuery) -> Result<MessageCounts, Failure> {
        on_pool!(self, |pool| outbox::count_messages(pool, query).await).map_err(|e| self.failure(e))
    }

    pub(crate) async fn resend(&self, id: &MessageId) -> Result<u64, Failure> {
        on_pool!(self, |pool| outbox::resend(pool, id).await).map_err(|e| self.failure(e))
    }

    pub(crate) async fn resend_all(&self, query: &MessageQuery) -> Result<u64, Failure> {
        on_pool!(self, |pool| outbox::resend_all(pool, query).await).map_err(|e| self.failure(e))
    }

    /// The outbox's messages waiting (of `scope`, if given), and how long the
    /// oldest unsent one has waited; `None`: no outbox table.
    pub(crate) async fn outbox_waiting(
        &self,
        scope: Option<&str>,
    ) -> Result<Option<(MessageCounts, Option<std::time::Duration>)>, Failure> {
        let query = MessageQuery { scope: scope.map(str::to_owned), ..MessageQuery::default() };
        let Some(counts) = self.unless_no_outbox(on_pool!(self, |pool| outbox::count_messages(pool, &query).await))?
        else {
            return Ok(None);
        };
        let oldest = on_pool!(self, |pool| outbox::oldest_pending(pool, scope).await).map_err(|e| self.failure(e))?;
        Ok(Some((counts, oldest)))
    }

    /// How many sent messages a purge with `options` would delete; `None`:
    /// no outbox table.
    pub(crate) async fn purge_sent_preview(&self, options: &PurgeOptions) -> Result<Option<u64>, Failure> {
        self.unless_no_outbox(on_pool!(self, |pool| outbox::purge_sent_preview(pool, options).await))
    }

    /// Delete sent messages past their retention; `None`: no outbox table.
    pub(crate) async fn purge_sent(&self, options: PurgeOptions) -> Result<Option<PurgeReport>, Failure> {
        self.unless_no_outbox(on_pool!(self, |pool| outbox::purge_sent(pool, options).await))
    }
}
