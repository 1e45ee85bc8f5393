//! Lease records in Redis: every step is one Lua script call (one round
//! trip), so claim, take-over, completion and release are each atomic on the
//! server, with the lease on Redis's clock (`TIME`).
//!
//! A record is a hash at `{prefix}{<key>}:<scope>`: the business key is the
//! hash tag, so on Redis Cluster every record of one business key lives in
//! one slot. Fields: `s` status (`P`/`D`), `f` fingerprint, `r` response, `o`
//! owner, `n` fence, `l` lease deadline (ms). Retention is the key's TTL.
//!
//! Redis is not a database of record: a restart without persistence or a
//! failover can lose records. A completion that finds its record gone is
//! refused ([`Error::LeaseLost`]), never written blindly; for work that must
//! never run twice, keep the record in SQL (or put `precheck = "redis"` in
//! front of a SQL store, when that strategy lands).

use std::sync::LazyLock;

use redis::Script;

use super::{BoxFuture, HeldLease, LeaseClaim, LeaseRequest, LeaseStore, millis};
use crate::Error;

const NOW: &str = "local t = redis.call('TIME') local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) ";

static CLAIM: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{NOW}
        local lease = tonumber(ARGV[3]) local keep = tonumber(ARGV[4])
        local r = redis.call('HMGET', KEYS[1], 's', 'f', 'r', 'n', 'l')
        local fence = 1 local reclaimed = 0
        if r[1] then
          if ARGV[1] ~= '' and r[2] and r[2] ~= '' and r[2] ~= ARGV[1] then return {{'M'}} end
          if r[1] == 'D' then return {{'D', r[3]}} end
          local lu = tonumber(r[5])
          if lu > now then return {{'B', lu - now}} end
          fence = tonumber(r[4]) + 1 reclaimed = 1
        end
        redis.call('HSET', KEYS[1], 's', 'P', 'f', ARGV[1], 'r', '', 'o', ARGV[2], 'n', fence, 'l', now + lease)
        redis.call('PEXPIRE', KEYS[1], math.max(lease, keep))
        return {{'A', fence, reclaimed}}"
    ))
});

/// Runs `ARGV[3]`'s action if `ARGV[1]` (owner) and `ARGV[2]` (fence) still
/// hold the record: 1 if done, 0 if the record is another's or gone.
const HELD: &str = "local h = redis.call('HMGET', KEYS[1], 's', 'o', 'n')
    if h[1] ~= 'P' or h[2] ~= ARGV[1] or h[3] ~= ARGV[2] then return 0 end ";

static COMPLETE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{HELD} redis.call('HSET', KEYS[1], 's', 'D', 'r', ARGV[3])
        redis.call('HDEL', KEYS[1], 'l') redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[4])) return 1"
    ))
});

static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(&format!("{HELD} redis.call('DEL', KEYS[1]) return 1")));

static EXTEND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{HELD} {NOW} local lease = tonumber(ARGV[3])
        redis.call('HSET', KEYS[1], 'l', now + lease)
        if redis.call('PTTL', KEYS[1]) < lease then redis.call('PEXPIRE', KEYS[1], lease) end
        return 1"
    ))
});

/// Lease records in Redis (standalone through a
/// [`ConnectionManager`](redis::aio::ConnectionManager), or Cluster through
/// `redis::cluster_async::ClusterConnection`).
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let client = redis::Client::open("redis://127.0.0.1/")?;
/// let conn = redis::aio::ConnectionManager::new(client).await?;
/// idem_runtime::lease::install(idem_runtime::lease::RedisStore::new(conn, "idem:"));
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisStore<C = redis::aio::ConnectionManager> {
    conn: C,
    prefix: String,
}

impl<C> std::fmt::Debug for RedisStore<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore").field("prefix", &self.prefix).finish_non_exhaustive()
    }
}

impl<C> RedisStore<C>
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    /// A store on `conn`, its keys starting with `prefix` (e.g. `"idem:"`).
    pub fn new(conn: C, prefix: impl Into<String>) -> RedisStore<C> {
        RedisStore { conn, prefix: prefix.into() }
    }

    /// The Redis key of a record: `{prefix}{<key>}:<scope>`.
    pub fn record_key(&self, scope: &str, key: &str) -> String {
        format!("{}{{{key}}}:{scope}", self.prefix)
    }

    async fn call(&self, script: &Script, key: String, args: &[String]) -> Result<redis::Value, Error> {
        let mut invocation = script.key(key);
        for a in args {
            invocation.arg(a);
        }
        let mut conn = self.conn.clone();
        invocation.invoke_async(&mut conn).await.map_err(store_error)
    }

    async fn if_held(&self, script: &Script, held: &HeldLease<'_>, extra: Vec<String>) -> Result<bool, Error> {
        let mut args = vec![held.owner.to_owned(), held.fence.to_string()];
        args.extend(extra);
        let done = self.call(script, self.record_key(held.scope, held.key), &args).await?;
        Ok(matches!(done, redis::Value::Int(1)))
    }
}

fn store_error(e: redis::RedisError) -> Error {
    Error::Store { store: "redis", source: Box::new(e) }
}

fn unexpected(what: &redis::Value) -> Error {
    Error::Store { store: "redis", source: format!("unexpected reply from the claim script: {what:?}").into() }
}

fn text(v: &redis::Value) -> Option<String> {
    match v {
        redis::Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        redis::Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

fn int(v: &redis::Value) -> Option<i64> {
    match v {
        redis::Value::Int(i) => Some(*i),
        other => text(other).and_then(|t| t.parse().ok()),
    }
}

impl<C> LeaseStore for RedisStore<C>
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    fn kind(&self) -> &'static str {
        "redis"
    }

    fn claim<'a>(&'a self, req: &'a LeaseRequest<'a>) -> BoxFuture<'a, Result<LeaseClaim, Error>> {
        Box::pin(async move {
            let args = [
                req.fingerprint.unwrap_or("").to_owned(),
                req.owner.to_owned(),
                millis(req.lease).to_string(),
                millis(req.retention).to_string(),
            ];
            let reply = self.call(&CLAIM, self.record_key(req.scope, req.key), &args).await?;
            let redis::Value::Array(items) = &reply else { return Err(unexpected(&reply)) };
            let kind = items.first().and_then(text).ok_or_else(|| unexpected(&reply))?;
            Ok(match kind.as_str() {
                "A" => LeaseClaim::Acquired {
                    fence: items.get(1).and_then(int).ok_or_else(|| unexpected(&reply))?,
                    reclaimed: items.get(2).and_then(int) == Some(1),
                },
                "D" => LeaseClaim::Done { response: items.get(1).and_then(text).ok_or_else(|| unexpected(&reply))? },
                "B" => LeaseClaim::Busy {
                    retry_after: std::time::Duration::from_millis(items.get(1).and_then(int).unwrap_or(0).max(0) as u64),
                },
                "M" => LeaseClaim::Mismatch,
                _ => return Err(unexpected(&reply)),
            })
        })
    }

    fn complete<'a>(&'a self, held: &'a HeldLease<'a>, response: &'a str) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.if_held(&COMPLETE, held, vec![response.to_owned(), millis(held.retention).to_string()]))
    }

    fn release<'a>(&'a self, held: &'a HeldLease<'a>) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.if_held(&RELEASE, held, Vec::new()))
    }

    fn extend<'a>(&'a self, held: &'a HeldLease<'a>) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.if_held(&EXTEND, held, vec![millis(held.lease).to_string()]))
    }
}
