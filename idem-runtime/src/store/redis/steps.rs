//! Recorded steps in Redis: a hash `<prefix>{<key>}steps:<scope>` beside
//! the lease record (the same hash tag, so one Cluster slot a call), field
//! = the step's number, value = `<name>\n<result>`; the field `started`
//! marks the step after them started (`<number>\n<fence>\n<name>`, the
//! fence of the holder that marked it). A step is written by one script
//! (`step_write.lua`) that checks the holder's owner, fence and lease on
//! the record, by Redis's clock, in the same call.

use std::sync::LazyLock;

use super::{Lua, RedisStore, int, store_error, unexpected};
use crate::error::Error;
use crate::lease::store::HeldLease;
use crate::lease::store::{NewStep, RecordedStep, StartedStep, StepLog};
use crate::store::{RecordKind, millis};

static WRITE: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("step_write.lua")));

/// Remove the mark in the hash KEYS[1] if it starts with ARGV[1]
/// (`<number>\n<fence>\n`: the holder's own).
static UNMARK: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r"local mark = redis.call('HGET', KEYS[1], 'started')
if mark and string.sub(mark, 1, #ARGV[1]) == ARGV[1] then redis.call('HDEL', KEYS[1], 'started') end
return 1",
    )
});

/// The field of the mark.
const STARTED: &str = "started";

/// A mark as the hash holds it.
pub(super) struct Mark {
    pub(super) number: usize,
    pub(super) name: String,
    /// The field's value, as written (what a resolution compares).
    pub(super) value: String,
}

impl<C> RedisStore<C>
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    pub(super) async fn read_steps(&self, scope: &str, key: &str) -> Result<StepLog, Error> {
        let (recorded, mark) = self.read_step_hash(scope, key).await?;
        Ok(StepLog { recorded, started: mark.map(|mark| StartedStep { number: mark.number, name: mark.name }) })
    }

    /// The call's steps, and the mark of the step after them (one of an
    /// earlier step, recorded since, left out).
    pub(super) async fn read_step_hash(
        &self,
        scope: &str,
        key: &str,
    ) -> Result<(Vec<RecordedStep>, Option<Mark>), Error> {
        let name = self.key(RecordKind::Steps, scope, key);
        let mut conn = self.connection();
        let fields: Vec<(String, Vec<u8>)> = self
            .bounded(async { redis::cmd("HGETALL").arg(&name).query_async(&mut conn).await.map_err(store_error) })
            .await?;
        let mut steps = Vec::with_capacity(fields.len());
        let mut mark = None;
        for (field, value) in fields {
            let text = String::from_utf8(value).map_err(|_| not_a_step(&name))?;
            if field == STARTED {
                let mut parts = text.splitn(3, '\n');
                let (number, _fence, step) = (parts.next(), parts.next(), parts.next());
                let number = number.and_then(|n| n.parse().ok()).ok_or_else(|| not_a_step(&name))?;
                let step = step.ok_or_else(|| not_a_step(&name))?.to_owned();
                mark = Some(Mark { number, name: step, value: text });
                continue;
            }
            let number: u64 = field.parse().map_err(|_| not_a_step(&name))?;
            let (step, result) = text.split_once('\n').ok_or_else(|| not_a_step(&name))?;
            steps.push((number, RecordedStep { name: step.to_owned(), result: result.to_owned() }));
        }
        steps.sort_by_key(|(number, _)| *number);
        // Numbers run from 0 without a gap: the script writes only the next.
        if steps.iter().enumerate().any(|(i, (n, _))| *n != i as u64) {
            return Err(not_a_step(&name));
        }
        let mark = mark.filter(|mark| mark.number == steps.len());
        Ok((steps.into_iter().map(|(_, step)| step).collect(), mark))
    }

    pub(super) async fn write_step(&self, held: &HeldLease<'_>, step: &NewStep<'_>) -> Result<bool, Error> {
        let value = format!("{}\n{}", step.name, step.result);
        self.write(held, step.number, &value, 'r').await
    }

    pub(super) async fn write_mark(&self, held: &HeldLease<'_>, number: usize, name: &str) -> Result<bool, Error> {
        let value = format!("{number}\n{}\n{name}", held.fence);
        self.write(held, number, &value, 'm').await
    }

    async fn write(&self, held: &HeldLease<'_>, number: usize, value: &str, what: char) -> Result<bool, Error> {
        let (record, steps) =
            (self.key(RecordKind::Lease, held.scope, held.key), self.key(RecordKind::Steps, held.scope, held.key));
        let keep = millis(held.retention).max(1);
        let mut conn = self.connection();
        // Safe to repeat: the same step written again by its holder is 1.
        let reply = self
            .bounded(async {
                WRITE
                    .eval_retrying(&mut conn, |c| {
                        c.arg(2).arg(&record).arg(&steps).arg(held.owner).arg(held.fence);
                        c.arg(number).arg(value).arg(keep).arg(what.to_string());
                    })
                    .await
                    .map_err(store_error)
            })
            .await?;
        match int(&reply) {
            Some(n) => Ok(n == 1),
            None => Err(unexpected(&reply)),
        }
    }

    pub(super) async fn drop_mark(&self, held: &HeldLease<'_>, number: usize) -> Result<(), Error> {
        let steps = self.key(RecordKind::Steps, held.scope, held.key);
        let own = format!("{number}\n{}\n", held.fence);
        let mut conn = self.connection();
        self.bounded(async {
            UNMARK
                .eval_retrying(&mut conn, |c| {
                    c.arg(1).arg(&steps).arg(&own);
                })
                .await
                .map_err(store_error)
        })
        .await?;
        Ok(())
    }

    pub(super) async fn drop_steps(&self, scope: &str, key: &str) -> Result<(), Error> {
        let name = self.key(RecordKind::Steps, scope, key);
        let mut conn = self.connection();
        self.bounded(async { redis::cmd("DEL").arg(&name).query_async::<i64>(&mut conn).await.map_err(store_error) })
            .await?;
        Ok(())
    }
}

fn not_a_step(name: &str) -> Error {
    Error::Store { store: "redis", source: format!("{name} does not hold idem's recorded steps").into() }
}
