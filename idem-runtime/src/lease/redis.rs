//! Lease records in Redis: every step is one Lua script call (one round
//! trip), so claim, take-over, completion and release are each atomic on the
//! server, with the lease on Redis's clock (`TIME`).
//!
//! A record is one string at `{prefix}{<key>}:<scope>`: the business key is
//! the hash tag, so on Redis Cluster every record of one business key lives
//! in one slot. It holds the status, fingerprint, fence, lease deadline and
//! owner (or, once done, the response); retention is the key's TTL.
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

// A record is one string, written with its TTL by one SET ... PX:
// `P<fp 64><fence>:<lease deadline ms>:<owner>` while held,
// `D<fp 64><fence>:<owner>|<response JSON>` once done (owner ids hold no
// `|`); `<fp 64>` is the hex fingerprint, or
// 64 dots without one. One string (rather than a hash plus PEXPIRE) keeps
// every script to two or three cheap commands.
const NO_FP: &str = "local nofp = string.rep('.', 64) ";

// A completed record (the replay, the common repeat) is answered before the
// clock is asked.
static CLAIM: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{NO_FP}
        local v = redis.call('GET', KEYS[1])
        local fp = ARGV[1] if fp == '' then fp = nofp end
        local fence = 1 local reclaimed = 0
        local lease = tonumber(ARGV[3]) local keep = tonumber(ARGV[4])
        if v then
          local theirs = string.sub(v, 2, 65)
          if fp ~= nofp and theirs ~= nofp and theirs ~= fp then return {{'M'}} end
          if string.sub(v, 1, 1) == 'D' then return {{'D', string.sub(v, string.find(v, '|', 66, true) + 1)}} end
          {NOW}
          local f, lu, owner = string.match(v, '^(%d+):(%d+):(.*)$', 66)
          if owner == ARGV[2] then return {{'A', tonumber(f), 0}} end
          lu = tonumber(lu)
          if lu > now then return {{'B', lu - now}} end
          fence = tonumber(f) + 1 reclaimed = 1
          redis.call('SET', KEYS[1], 'P' .. fp .. fence .. ':' .. (now + lease) .. ':' .. ARGV[2], 'PX', math.max(lease, keep))
          return {{'A', fence, reclaimed}}
        end
        {NOW}
        redis.call('SET', KEYS[1], 'P' .. fp .. fence .. ':' .. (now + lease) .. ':' .. ARGV[2], 'PX', math.max(lease, keep))
        return {{'A', fence, reclaimed}}"
    ))
});

/// Runs the rest of the script only if `ARGV[1]` (owner) and `ARGV[2]`
/// (fence) still hold the record; returns 0 if it is another's or gone.
const HELD: &str = "local v = redis.call('GET', KEYS[1])
    if not v or string.sub(v, 1, 1) ~= 'P' then return 0 end
    local fence, lu, owner = string.match(v, '^(%d+):(%d+):(.*)$', 66)
    if owner ~= ARGV[1] or fence ~= ARGV[2] then return 0 end ";

// A completion repeated by the same holder (its reply was lost) finds its
// own `D` record and succeeds again.
static COMPLETE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "local d = redis.call('GET', KEYS[1])
        if d and string.sub(d, 1, 1) == 'D' and string.sub(d, 66, 65 + #ARGV[2] + #ARGV[1] + 2) == ARGV[2] .. ':' .. ARGV[1] .. '|' then
          return 1
        end
        {HELD} redis.call('SET', KEYS[1], 'D' .. string.sub(v, 2, 65) .. fence .. ':' .. owner .. '|' .. ARGV[3],
          'PX', tonumber(ARGV[4])) return 1"
    ))
});

static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(&format!("{HELD} redis.call('DEL', KEYS[1]) return 1")));

static EXTEND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{HELD} {NOW} local lease = tonumber(ARGV[3])
        local ttl = math.max(redis.call('PTTL', KEYS[1]), lease)
        redis.call('SET', KEYS[1], 'P' .. string.sub(v, 2, 65) .. fence .. ':' .. (now + lease) .. ':' .. owner, 'PX', ttl)
        return 1"
    ))
});

/// Lease records in Redis: standalone through a
/// [`ConnectionManager`](redis::aio::ConnectionManager) (reconnects after a
/// restart) or a `MultiplexedConnection` (no reconnect layer: measurably
/// faster under load, see BENCHMARKS.md), or Cluster through
/// `redis::cluster_async::ClusterConnection`.
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

    /// A handle on the connection (cheap: connections are shared handles).
    pub(crate) fn connection(&self) -> C {
        self.conn.clone()
    }

    /// The prefix every key of this store starts with.
    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The Redis key of a record: `{prefix}{<key>}:<scope>`.
    pub fn record_key(&self, scope: &str, key: &str) -> String {
        format!("{}{{{key}}}:{scope}", self.prefix)
    }

    /// One script call. A connection that dropped (the server restarted) is
    /// tried once more: a `ConnectionManager` reconnects in between, and
    /// every script is safe to repeat (a claim finds its own record, the
    /// others are conditional on owner and fence).
    pub(crate) async fn call(&self, invocation: redis::ScriptInvocation<'_>) -> Result<redis::Value, Error> {
        let mut conn = self.conn.clone();
        match invocation.invoke_async(&mut conn).await {
            Err(e) if e.is_connection_dropped() || e.is_io_error() => {
                tracing::warn!(target: "idem", error = %e, "redis connection dropped; trying the script once more");
                invocation.invoke_async(&mut conn).await.map_err(store_error)
            }
            other => other.map_err(store_error),
        }
    }

    /// `script` on the record's key, with the holder's owner and fence as
    /// its first arguments.
    fn held<'s>(&self, script: &'s Script, held: &HeldLease<'_>) -> redis::ScriptInvocation<'s> {
        let mut invocation = script.key(self.record_key(held.scope, held.key));
        invocation.arg(held.owner).arg(held.fence);
        invocation
    }

    async fn done(&self, invocation: redis::ScriptInvocation<'_>) -> Result<bool, Error> {
        Ok(matches!(self.call(invocation).await?, redis::Value::Int(1)))
    }
}

pub(crate) fn store_error(e: redis::RedisError) -> Error {
    Error::Store { store: "redis", source: Box::new(e) }
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

impl<C> LeaseStore for RedisStore<C>
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    fn kind(&self) -> &'static str {
        "redis"
    }

    fn claim<'a>(&'a self, req: &'a LeaseRequest<'a>) -> BoxFuture<'a, Result<LeaseClaim, Error>> {
        Box::pin(async move {
            let mut invocation = CLAIM.key(self.record_key(req.scope, req.key));
            invocation
                .arg(req.fingerprint.unwrap_or(""))
                .arg(req.owner)
                .arg(millis(req.lease))
                .arg(millis(req.retention));
            let reply = self.call(invocation).await?;
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
        let mut invocation = self.held(&COMPLETE, held);
        invocation.arg(response).arg(millis(held.retention));
        Box::pin(self.done(invocation))
    }

    fn release<'a>(&'a self, held: &'a HeldLease<'a>) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.done(self.held(&RELEASE, held)))
    }

    fn extend<'a>(&'a self, held: &'a HeldLease<'a>) -> BoxFuture<'a, Result<bool, Error>> {
        let mut invocation = self.held(&EXTEND, held);
        invocation.arg(millis(held.lease));
        Box::pin(self.done(invocation))
    }
}
