//! Redis: one [`RedisStore`] holds lease records, one-time tokens, locks
//! with their fencing counters, and precheck markers, each kind under keys
//! of its own (see [`keyspace`](crate::store)). Every step that reads and
//! writes is one Lua script call (or one command), atomic on the server,
//! on Redis's clock.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::RecordKind;
use super::keyspace::Keyspace;
use crate::error::Error;

mod admin;
mod lease;
mod lock;
mod notices;
mod precheck;
mod steps;
mod token;

pub(super) struct Shared {
    batcher: Mutex<lease::Batcher>,
    /// Off for Redis Cluster (a batch would span slots), or when asked.
    batching: AtomicBool,
    calls: AtomicU64,
    operations: AtomicU64,
    /// The longest answer a record holds, once the server said.
    answer_limit: std::sync::OnceLock<usize>,
    /// Lease notices, once [`RedisStore::notifications`] turned them on.
    notices: std::sync::OnceLock<Arc<notices::Notices>>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, lease::Batcher> {
        self.batcher.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn count(&self, operations: usize) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.operations.fetch_add(operations as u64, Ordering::Relaxed);
    }
}

/// Script calls a [`RedisStore`] made for lease operations, and the
/// operations they carried: `operations / script_calls` is the mean batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RedisStats {
    /// `EVALSHA` calls of lease operations (a batch is one).
    pub script_calls: u64,
    /// Claims, completions, releases and extensions sent.
    pub operations: u64,
}

/// Lease records, one-time tokens, locks and precheck markers in Redis:
/// standalone through a
/// [`ConnectionManager`](redis::aio::ConnectionManager) (reconnects after a
/// restart) or a `MultiplexedConnection` (no reconnect layer: measurably
/// faster under load, see BENCHMARKS.md), or Cluster through
/// `redis::cluster_async::ClusterConnection`. Needs Redis 6.2 or newer (or
/// Valkey): a completion swaps its record in with `SET ... GET`.
///
/// **Batching.** Every operation is one call of one script. While two calls
/// are in flight, further operations (from any task using this store or its
/// clones) queue, and the next call carries all of them: Redis runs each
/// item atomically on its own key, as it would run a call of its own, and
/// one item failing does not fail the others. A lone caller never waits for
/// a batch; under load the server parses, dispatches and answers one command
/// for many operations. A batch spans keys of different hash slots, so it is
/// off for `ClusterConnection` (and after a `CROSSSLOT` reply, e.g. from a
/// proxy in front of a cluster); [`batching(false)`](Self::batching) turns
/// it off by hand.
///
/// **Scripts.** Each runs by `EVALSHA`; a server or cluster node that does
/// not have it (restarted, a replica just promoted, `SCRIPT FLUSH`) is sent
/// its source (`EVAL`) instead, so nothing depends on every node being up
/// to load scripts. Every step is safe to repeat (as a cluster client does
/// after a dropped connection), except spending a token, which a repeat
/// finds spent.
///
/// **Keys.** Every record is at `<prefix>{<key>}<kind>:<scope>` (see
/// [`RedisStore::key`]): the business key is the hash tag, so one key's
/// lease record, marker, lock and fencing counter share a Cluster slot, and
/// no scope or key, whatever it holds, can name another record's key.
///
/// ```no_run
/// # extern crate idem_runtime as idem;
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let client = redis::Client::open("redis://127.0.0.1/")?;
/// let conn = redis::aio::ConnectionManager::new(client).await?;
/// let store = idem::store::RedisStore::new(conn, "idem:");
/// idem::Stores::builder().all(store).install()?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisStore<C = redis::aio::ConnectionManager> {
    conn: C,
    /// The bound on each call (see [`RedisStore::timeout`]).
    timeout: std::time::Duration,
    prefix: String,
    names: Keyspace,
    shared: Arc<Shared>,
}

impl<C> std::fmt::Debug for RedisStore<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .field("batching", &self.shared.batching.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl<C> RedisStore<C>
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    /// A store on `conn`, its keys starting with `prefix` (e.g. `"idem:"`).
    pub fn new(conn: C, prefix: impl Into<String>) -> RedisStore<C> {
        let prefix = prefix.into();
        let cluster = std::any::TypeId::of::<C>() == std::any::TypeId::of::<redis::cluster_async::ClusterConnection>();
        RedisStore {
            conn,
            timeout: super::DEFAULT_TIMEOUT,
            names: Keyspace::new(&prefix),
            prefix,
            shared: Arc::new(Shared {
                batcher: Mutex::default(),
                batching: AtomicBool::new(!cluster),
                calls: AtomicU64::new(0),
                operations: AtomicU64::new(0),
                answer_limit: std::sync::OnceLock::new(),
                notices: std::sync::OnceLock::new(),
            }),
        }
    }

    /// How long one call may take before the guard fails with a retryable
    /// [`Error::Store`] (default [`DEFAULT_TIMEOUT`](crate::store::DEFAULT_TIMEOUT), 3 s): a Redis that is
    /// down is reported within it, not after the connection's own
    /// reconnect cycle.
    pub fn timeout(mut self, timeout: std::time::Duration) -> RedisStore<C> {
        self.timeout = timeout;
        self
    }

    /// `call`, within this store's [`timeout`](Self::timeout).
    pub(crate) async fn bounded<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        super::within(self.timeout, "redis", call).await
    }

    /// Batch lease operations under load (the default, except on a
    /// `ClusterConnection`), or send each as a call of its own. The setting
    /// is shared with this store's clones, which share its queue.
    pub fn batching(self, on: bool) -> RedisStore<C> {
        self.shared.batching.store(on, Ordering::Relaxed);
        self
    }

    /// Script calls and operations so far, over this store and its clones.
    pub fn stats(&self) -> RedisStats {
        RedisStats {
            script_calls: self.shared.calls.load(Ordering::Relaxed),
            operations: self.shared.operations.load(Ordering::Relaxed),
        }
    }

    /// A handle on the connection (cheap: connections are shared handles).
    pub(crate) fn connection(&self) -> C {
        self.conn.clone()
    }

    /// The Redis key of the record of `kind` for `scope` and `key`, both
    /// as stored (a scope as [`stored_scope`](crate::key::stored_scope)
    /// gives it, a key as [`Key::as_str`](crate::Key::as_str)):
    /// `<prefix>{<key>}<kind>:<scope>`, with `%`, `{` and `}` in the prefix
    /// and the key written `%25`, `%7B`, `%7D`. For operators and tests.
    pub fn key(&self, kind: RecordKind, scope: &str, key: &str) -> String {
        self.names.name(kind, scope, key)
    }
}

/// Whether a failed call is worth sending once more: the connection
/// dropped (a restart, a failover), so a reconnect may get through. Not
/// when the server refused the connection: a `ConnectionManager` has just
/// spent its whole reconnect cycle getting that answer, and a second cycle
/// would only double the caller's wait while Redis is down.
pub(crate) fn worth_retrying(e: &redis::RedisError) -> bool {
    (e.is_connection_dropped() || e.is_io_error()) && !e.is_connection_refusal()
}

/// A Lua script with its source. It runs by `EVALSHA`; a node that does
/// not have it (`NOSCRIPT`: restarted, a replica just promoted, its cache
/// flushed) gets `EVAL` of the source instead, on that same node, which
/// caches it there. Not `SCRIPT LOAD`: a cluster client sends that to every
/// node, so it fails while any one of them is down, failover or not.
pub(crate) struct Lua {
    script: redis::Script,
    source: &'static str,
}

impl Lua {
    pub(crate) fn new(source: &'static str) -> Lua {
        Lua { script: redis::Script::new(source), source }
    }

    /// `EVALSHA` of the script, `fill` adding the number of keys, the keys
    /// and the arguments; `EVAL` of its source if the node lacks it.
    pub(crate) async fn eval<C: redis::aio::ConnectionLike + Send>(
        &self,
        conn: &mut C,
        fill: impl Fn(&mut redis::Cmd),
    ) -> redis::RedisResult<redis::Value> {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.script.get_hash());
        fill(&mut cmd);
        match cmd.query_async(conn).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                let mut cmd = redis::cmd("EVAL");
                cmd.arg(self.source);
                fill(&mut cmd);
                cmd.query_async(conn).await
            }
            other => other,
        }
    }

    /// As [`eval`](Self::eval); a dropped connection is tried once more
    /// (for scripts that are safe to repeat).
    pub(crate) async fn eval_retrying<C: redis::aio::ConnectionLike + Send>(
        &self,
        conn: &mut C,
        fill: impl Fn(&mut redis::Cmd),
    ) -> redis::RedisResult<redis::Value> {
        match self.eval(conn, &fill).await {
            Err(e) if worth_retrying(&e) => {
                tracing::warn!(target: "idem", error = %e, "redis connection dropped; trying the script once more");
                self.eval(conn, &fill).await
            }
            other => other,
        }
    }
}

pub(crate) fn store_error(e: redis::RedisError) -> Error {
    Error::Store { store: "redis", source: Box::new(e) }
}

pub(crate) fn store_message(message: &str) -> Error {
    Error::Store { store: "redis", source: message.to_owned().into() }
}

pub(crate) fn unexpected(what: &redis::Value) -> Error {
    Error::Store { store: "redis", source: format!("unexpected reply from a script: {what:?}").into() }
}

pub(crate) fn text(v: &redis::Value) -> Option<String> {
    match v {
        redis::Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        redis::Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

pub(crate) fn int(v: &redis::Value) -> Option<i64> {
    match v {
        redis::Value::Int(i) => Some(*i),
        other => text(other).and_then(|t| t.parse().ok()),
    }
}
