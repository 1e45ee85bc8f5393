//! Operating the lease records in Redis: look one up, list the stuck ones
//! (with `SCAN`, in bounded pages), release one. The counterparts of
//! [`admin`](crate::admin)'s SQL functions.
//!
//! Redis keeps no unfinished dedup records (those live in SQL) and drops a
//! record when its retention (its key's TTL) runs out, so a lease record
//! here is running, done, or stuck with its lease passed.

use std::sync::LazyLock;

use super::{Lua, RedisStore, store_error, store_message, unexpected};
use crate::error::Error;
use crate::lease::store::{Resolve, StartedStep, StepLog, StepOutcome};
use crate::record::RecordStatus;
use crate::record::{Record, RecordId, RecordState, Release};
use crate::store::RecordKind;

/// The clock, then each key's record and TTL (ms; -1 none, -2 gone), in one
/// atomic call: `[seconds, microseconds, record 1, pttl 1, ...]`. A key of
/// another type reads as no record.
static READ: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r"local t = redis.call('TIME')
local out = {t[1], t[2]}
for i = 1, #KEYS do
  local v = redis.pcall('GET', KEYS[i])
  if type(v) == 'table' then v = false end
  out[#out + 1] = v
  out[#out + 1] = redis.call('PTTL', KEYS[i])
end
return out",
    )
});

/// Delete a held record only if its fence is `ARGV[1]` and its lease has
/// passed (the key's TTL less the record's retention, as the lease script
/// reckons it). Replies `D` (deleted), `N` (no record), `F` (another fence),
/// `S` (not stuck: live, or done), `X<message>`.
static RELEASE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r"local v = redis.call('GET', KEYS[1])
if not v then return 'N' end
local f, tail = string.match(v, '^P(%d+)%.%d+:[^|]*|%d+:(%d+):')
if not f then
  if string.byte(v) == 68 then return 'S' end
  return 'Xnot an idem lease record'
end
if f ~= ARGV[1] then return 'F' end
if redis.call('PTTL', KEYS[1]) - tonumber(tail) > 0 then return 'S' end
redis.call('DEL', KEYS[1])
return 'D'",
    )
});

/// Resolve the step marked `ARGV[1]` (the mark's value as read; empty:
/// none) in the steps hash KEYS[2] of the lease record KEYS[1]: with a
/// field `ARGV[2]`,
/// its result `ARGV[3]` recorded there; with none, only the mark removed.
/// Replies 0 (resolved), -1 (the mark changed, or the step was recorded),
/// or the milliseconds left on a live lease (a worker holds the record).
static RESOLVE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r"local v = redis.call('GET', KEYS[1])
local tail = v and string.match(v, '^P%d+%.%d+:[^|]*|%d+:(%d+):')
if tail then
  local left = redis.call('PTTL', KEYS[1]) - tonumber(tail)
  if left > 0 then return left end
end
if ARGV[1] == '' or redis.call('HGET', KEYS[2], 'started') ~= ARGV[1] then return -1 end
if ARGV[2] ~= '' then
  if redis.call('HEXISTS', KEYS[2], ARGV[2]) == 1 then return -1 end
  redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
end
redis.call('HDEL', KEYS[2], 'started')
return 0",
    )
});

/// Keys asked of `SCAN` per call: each call is short on the server.
const SCAN_COUNT: usize = 500;

impl<C> RedisStore<C>
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    /// The lease record of `id` with its state, by Redis's clock (one
    /// atomic script call). `None` when there is none. Redis keeps no
    /// timestamps, but a record's fence is Redis's clock in microseconds
    /// when it was first claimed (a take-over adds one): that is
    /// [`Record::created_at_ms`]. While it is held,
    /// [`Record::lease_until_ms`] is the key's TTL less the retention, and
    /// [`Record::updated_at_ms`] that less the lease (when the lease was last
    /// claimed, taken over or extended); [`Record::expires_at_ms`] is when
    /// the key's TTL runs out. With the steps its call recorded
    /// ([`Record::steps`]), read just after (on a `ClusterConnection` too:
    /// they share the record's slot).
    pub async fn inspect_lease(&self, id: &RecordId) -> Result<Option<Record>, Error> {
        let name = self.names.name(RecordKind::Lease, id.scope(), id.key());
        let mut read = self.read(std::slice::from_ref(&name)).await?;
        match read.pop().and_then(|(value, pttl, now_ms)| decode(id, value?, pttl, now_ms)) {
            Some(record) => Ok(Some(self.with_steps(record).await?)),
            None => Ok(None),
        }
    }

    /// `record` with the steps its call recorded ([`Record::steps`]) and
    /// the one in flight ([`Record::in_flight`]), read just after it (the
    /// hash beside it, in its Cluster slot).
    async fn with_steps(&self, mut record: Record) -> Result<Record, Error> {
        let log = self.read_steps(&record.scope, &record.key).await?;
        let marked = log.started.map(|step| (step.number, step.name));
        record.set_steps(log.recorded.into_iter().map(|step| (step.name, step.result)), marked);
        Ok(record)
    }

    /// [`LeaseStore::resolve_step`](crate::lease::LeaseStore::resolve_step):
    /// the steps read, then one script call that checks that no worker
    /// holds the record with a live lease and that the mark is still the
    /// one read, and resolves it.
    pub(super) async fn resolve_marked(
        &self,
        scope: &str,
        key: &str,
        step: &str,
        outcome: StepOutcome<'_>,
    ) -> Result<Resolve, Error> {
        let (recorded, mark) = self.read_step_hash(scope, key).await?;
        let started = mark.as_ref().map(|mark| StartedStep { number: mark.number, name: mark.name.clone() });
        let before = StepLog { recorded, started };
        // Without the step's mark the script still says whether the record
        // is held (no mark matches the empty one).
        let mark = mark.filter(|mark| mark.name == step);
        let (field, value) = match (&mark, outcome) {
            (Some(mark), StepOutcome::Done { result }) => (mark.number.to_string(), format!("{step}\n{result}")),
            _ => (String::new(), String::new()),
        };
        let seen = mark.as_ref().map_or("", |mark| mark.value.as_str());
        let (record, steps) =
            (self.names.name(RecordKind::Lease, scope, key), self.names.name(RecordKind::Steps, scope, key));
        // Not repeated on a dropped connection: a repeat of a resolution
        // that went through would report the step as not in flight.
        let reply = RESOLVE
            .eval(&mut self.connection(), |c| {
                c.arg(2).arg(&record).arg(&steps).arg(seen).arg(&field).arg(&value);
            })
            .await
            .map_err(store_error)?;
        match super::int(&reply) {
            Some(0) => Ok(Resolve::Resolved(before)),
            Some(-1) if mark.is_none() => Ok(Resolve::NotInFlight(before)),
            Some(-1) => Ok(Resolve::NotInFlight(self.read_steps(scope, key).await?)),
            Some(left) if left > 0 => Ok(Resolve::Held { lease_left: std::time::Duration::from_millis(left as u64) }),
            _ => Err(unexpected(&reply)),
        }
    }

    /// Lease records whose lease has passed (their worker died or was
    /// dropped; the next call of the key would take them over), at most
    /// `limit`, optionally of one scope (as the guard names it), each with
    /// the steps its call recorded ([`Record::steps`]): where it stopped.
    ///
    /// Scans the keyspace with `SCAN MATCH <prefix>{*}lease:...` (never
    /// `KEYS`), 500 keys a call, reading each page's records in
    /// one script call (on a Cluster node, whose page spans slots, one call
    /// a record), until `limit` records are found or the scan ends.
    /// Standalone connections only: on a `ClusterConnection` it is an
    /// error (a `SCAN` covers one node); build a standalone store on each
    /// primary's address, with the same prefix, and ask each. In no particular order; a record changed during the scan may be
    /// missed or reported once more, as `SCAN` goes.
    pub async fn stuck_leases(&self, scope: Option<&str>, limit: usize) -> Result<Vec<Record>, Error> {
        if std::any::TypeId::of::<C>() == std::any::TypeId::of::<redis::cluster_async::ClusterConnection>() {
            return Err(store_message(
                "stuck_leases scans one server's keys: on Redis Cluster, ask a standalone store on each primary \
                 (same prefix)",
            ));
        }
        let stored_scope = scope.map(crate::key::stored_scope);
        let pattern = self.lease_pattern(stored_scope.as_deref());
        let mut conn = self.connection();
        let mut found = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, names): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(SCAN_COUNT)
                .query_async(&mut conn)
                .await
                .map_err(store_error)?;
            for record in self.stuck_among(names, stored_scope.as_deref()).await? {
                found.push(record);
                if found.len() >= limit {
                    return Ok(found);
                }
            }
            if next == 0 {
                return Ok(found);
            }
            cursor = next;
        }
    }

    /// The `SCAN MATCH` pattern of the lease records of `stored_scope`, or
    /// of every scope.
    fn lease_pattern(&self, stored_scope: Option<&str>) -> String {
        let mut pattern = glob_escape(self.names.escaped_prefix());
        pattern.push_str("{*}");
        pattern.push_str(RecordKind::Lease.word());
        pattern.push(':');
        match stored_scope {
            Some(scope) => pattern.push_str(&glob_escape(scope)),
            None => pattern.push('*'),
        }
        pattern
    }

    /// The stuck lease records among one `SCAN` page's `names`, read in one
    /// script call, in the page's order.
    async fn stuck_among(&self, names: Vec<Vec<u8>>, stored_scope: Option<&str>) -> Result<Vec<Record>, Error> {
        // The pattern's `*` can span a `}`: keep the names that read back
        // as lease records of the scope asked for.
        let mut ids = Vec::new();
        let mut keys = Vec::new();
        for name in names {
            let Ok(name) = String::from_utf8(name) else { continue };
            match self.names.read(&name) {
                Some((RecordKind::Lease, s, k)) if stored_scope.is_none_or(|want| want == s) => {
                    ids.push(RecordId::stored(s, k));
                    keys.push(name);
                }
                _ => {}
            }
        }
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let read = self.read_page(&keys).await?;
        let records = ids.iter().zip(read).filter_map(|(id, (value, pttl, now_ms))| decode(id, value?, pttl, now_ms));
        let mut stuck = Vec::new();
        for record in records.filter(|record| record.state.is_stuck()) {
            stuck.push(self.with_steps(record).await?);
        }
        Ok(stuck)
    }

    /// Delete the lease record of `id` only if its lease has passed and its
    /// fence is still `fence` (the one the caller saw), in one atomic
    /// script call: a record a worker took over meanwhile, one that
    /// completed, or one whose lease is live is left alone. A done record
    /// is never released. After a release the next call of the key runs its
    /// body again.
    pub async fn release_lease(&self, id: &RecordId, fence: i64) -> Result<Release, Error> {
        let seen = self.inspect_lease(id).await?;
        let name = self.names.name(RecordKind::Lease, id.scope(), id.key());
        // Not repeated on a dropped connection: a repeat of a release that
        // went through would report the record as not found.
        let reply = RELEASE
            .eval(&mut self.connection(), |c| {
                c.arg(1).arg(&name).arg(fence);
            })
            .await
            .map_err(store_error)?;
        let code = super::text(&reply).ok_or_else(|| unexpected(&reply))?;
        match code.as_bytes().first() {
            Some(b'D') => {
                // Released: the record as it was read just before (a missing
                // read means it changed in between; read again to say how).
                if let Some(seen) = seen.filter(|s| s.fence == fence) {
                    return Ok(Release::Released(seen));
                }
                Err(store_message("released a lease record that could not be read just before"))
            }
            Some(b'X') => Err(store_message(&format!("releasing a lease record failed on the server: {}", &code[1..]))),
            Some(b'N' | b'F' | b'S') => Ok(match self.inspect_lease(id).await? {
                None => Release::NotFound,
                Some(now) if now.fence != fence => Release::FenceChanged(now),
                Some(now) => Release::NotStuck(now),
            }),
            _ => Err(unexpected(&reply)),
        }
    }

    /// Each name of one `SCAN` page's record, as [`read`](Self::read): in
    /// one script call, or, on a node of a Redis Cluster, which refuses a
    /// call over keys of several slots (`CROSSSLOT`), in one call a name.
    async fn read_page(&self, names: &[String]) -> Result<Vec<(Option<Vec<u8>>, i64, i64)>, Error> {
        match self.read(names).await {
            Err(e) if cross_slot(&e) => {
                let mut read = Vec::with_capacity(names.len());
                for name in names {
                    read.extend(self.read(std::slice::from_ref(name)).await?);
                }
                Ok(read)
            }
            read => read,
        }
    }

    /// Each name's record (if any), TTL and the clock, in one script call.
    async fn read(&self, names: &[String]) -> Result<Vec<(Option<Vec<u8>>, i64, i64)>, Error> {
        let reply = READ
            .eval_retrying(&mut self.connection(), |c| {
                c.arg(names.len());
                for name in names {
                    c.arg(name);
                }
            })
            .await
            .map_err(store_error)?;
        let redis::Value::Array(items) = &reply else { return Err(unexpected(&reply)) };
        if items.len() != 2 + 2 * names.len() {
            return Err(unexpected(&reply));
        }
        let (secs, micros) = (super::int(&items[0]), super::int(&items[1]));
        let now_ms = match (secs, micros) {
            (Some(s), Some(us)) => s * 1000 + us / 1000,
            _ => return Err(unexpected(&reply)),
        };
        items[2..]
            .chunks(2)
            .map(|pair| {
                let value = match &pair[0] {
                    redis::Value::BulkString(b) => Some(b.clone()),
                    redis::Value::Nil => None,
                    other => return Err(unexpected(other)),
                };
                let pttl = super::int(&pair[1]).ok_or_else(|| unexpected(&pair[1]))?;
                Ok((value, pttl, now_ms))
            })
            .collect()
    }
}

/// A lease record read back: `P<fence>.<TTL>:<owner>|<lease>:<retention>:<fp 64>`
/// while held, `D<fp 64><fence>:<retention>:<owner>|<response>` once done
/// (see `lease.rs`). `None` for a key that is gone or not an idem record.
fn decode(id: &RecordId, value: Vec<u8>, pttl: i64, now_ms: i64) -> Option<Record> {
    if pttl == -2 {
        return None;
    }
    let expires_at_ms = (pttl >= 0).then(|| now_ms + pttl);
    let value = String::from_utf8(value).ok()?;
    let fingerprint = |fp: &str| (!fp.bytes().all(|b| b == b'.')).then(|| fp.to_owned());
    let mut record = Record {
        scope: id.scope().to_owned(),
        key: id.key().to_owned(),
        status: RecordStatus::Processing,
        state: RecordState::Running,
        fingerprint: None,
        response: None,
        owner: None,
        fence: 0,
        lease_until_ms: None,
        created_at_ms: None,
        updated_at_ms: None,
        expires_at_ms,
        now_ms,
        steps: Vec::new(),
        in_flight: None,
    };
    if let Some(held) = value.strip_prefix('P') {
        let (fence, rest) = held.split_once('.')?;
        let (_ttl, rest) = rest.split_once(':')?;
        let (owner, rest) = rest.split_once('|')?;
        let mut times = rest.splitn(3, ':');
        let (lease, retention, fp) = (times.next()?, times.next()?, times.next()?);
        let (lease, retention): (i64, i64) = (lease.parse().ok()?, retention.parse().ok()?);
        // The lease left is the TTL less the retention (the lease script's
        // reckoning); a key without a TTL counts as passed, as it does there.
        let left = pttl - retention;
        record.fence = fence.parse().ok()?;
        record.owner = Some(owner.to_owned());
        record.fingerprint = fingerprint(fp);
        record.lease_until_ms = Some(now_ms + left);
        record.updated_at_ms = (pttl >= 0).then(|| now_ms + left - lease);
        record.state = if left > 0 { RecordState::Running } else { RecordState::LeasePassed };
    } else if let Some(done) = value.strip_prefix('D') {
        let fp = done.get(..64)?;
        let (fence, rest) = done.get(64..)?.split_once(':')?;
        let (_retention, rest) = rest.split_once(':')?;
        let (owner, response) = rest.split_once('|')?;
        record.status = RecordStatus::Done;
        record.state = RecordState::Done;
        record.fence = fence.parse().ok()?;
        record.owner = Some(owner.to_owned());
        record.fingerprint = fingerprint(fp);
        record.response = Some(response.to_owned());
    } else {
        return None;
    }
    record.created_at_ms = claimed_at_ms(record.fence, now_ms);
    // The update time is reckoned from a TTL Redis truncates to the
    // millisecond, the claim time from its clock in microseconds: a lease
    // granted at the claim can read as a millisecond before it.
    if let (Some(created), Some(updated)) = (record.created_at_ms, record.updated_at_ms) {
        record.updated_at_ms = Some(updated.max(created));
    }
    Some(record)
}

/// The server refused a call over keys of several slots: a Cluster node.
fn cross_slot(e: &Error) -> bool {
    let Error::Store { source, .. } = e else { return false };
    source
        .downcast_ref::<redis::RedisError>()
        .is_some_and(|e| e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::CrossSlot))
}

/// When a record with `fence` was first claimed: a new record's fence is
/// Redis's `TIME` in microseconds (see `lease.rs`), and each take-over adds
/// one. `None` for a fence that is no such reading (before 2001, or more
/// than a day ahead of the clock: a record written otherwise).
fn claimed_at_ms(fence: i64, now_ms: i64) -> Option<i64> {
    const YEAR_2001_US: i64 = 978_307_200_000_000;
    let at_ms = fence / 1000;
    (fence >= YEAR_2001_US && at_ms <= now_ms + 24 * 3600 * 1000).then_some(at_ms)
}

/// `text` matched literally by a `SCAN MATCH` pattern.
fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\' | '^') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_and_done_records_decode() {
        let id = RecordId::stored("s", "k");
        let fp = "a".repeat(64);
        let held = format!("P17.3000:owner-1|1000:2000:{fp}");
        let r = decode(&id, held.into_bytes(), 2500, 10_000).unwrap();
        assert_eq!((r.fence, r.owner.as_deref(), r.state), (17, Some("owner-1"), RecordState::Running));
        assert_eq!((r.lease_until_ms, r.expires_at_ms), (Some(10_500), Some(12_500)));
        assert_eq!(r.fingerprint.as_deref(), Some(fp.as_str()));
        let passed = format!("P17.3000:owner-1|1000:2000:{}", ".".repeat(64));
        let r = decode(&id, passed.into_bytes(), 1500, 10_000).unwrap();
        assert_eq!((r.state, r.fingerprint), (RecordState::LeasePassed, None));
        let done = format!("D{fp}18:2000:owner-2|{{\"a\":\"x|y\"}}");
        let r = decode(&id, done.into_bytes(), 1500, 10_000).unwrap();
        assert_eq!((r.status, r.state, r.fence), (RecordStatus::Done, RecordState::Done, 18));
        assert_eq!(r.response.as_deref(), Some("{\"a\":\"x|y\"}"));
        assert!(decode(&id, b"something else".to_vec(), 10, 0).is_none());
    }

    #[test]
    fn times_come_from_the_fence_and_the_ttl() {
        let id = RecordId::stored("s", "k");
        // Claimed at 1_700_000_000.123456 s (Redis TIME) and taken over
        // twice since; read 5 s later, its 1 s lease passed half a second ago.
        let now_ms = 1_700_000_005_123;
        let held = format!("P1700000000123458.3000:o|1000:2000:{}", ".".repeat(64));
        let r = decode(&id, held.into_bytes(), 1500, now_ms).unwrap();
        assert_eq!(r.created_at_ms, Some(1_700_000_000_123));
        assert_eq!(r.age_ms(), Some(5000));
        assert_eq!(r.lease_left_ms(), Some(-500));
        assert_eq!(r.updated_at_ms, Some(now_ms - 1500), "the lease last granted 1.5 s ago");
        let done = format!("D{}1700000000123456:2000:o|7", "a".repeat(64));
        let r = decode(&id, done.into_bytes(), 1500, now_ms).unwrap();
        assert_eq!((r.created_at_ms, r.updated_at_ms), (Some(1_700_000_000_123), None));
        // A TTL truncated to the millisecond puts the grant a millisecond
        // before the claim; a record is never updated before it was made.
        let fresh = format!("P1700000005123456.3000:o|1000:2000:{}", ".".repeat(64));
        let r = decode(&id, fresh.into_bytes(), 2999, now_ms).unwrap();
        assert_eq!((r.created_at_ms, r.updated_at_ms), (Some(now_ms), Some(now_ms)));
        // A fence that is no clock reading gives no time.
        let small = format!("P17.3000:o|1000:2000:{}", ".".repeat(64));
        assert_eq!(decode(&id, small.into_bytes(), 1500, now_ms).unwrap().created_at_ms, None);
    }

    #[test]
    fn glob_metacharacters_are_escaped() {
        assert_eq!(glob_escape("a*b?[c]\\^"), "a\\*b\\?\\[c\\]\\\\\\^");
    }
}
