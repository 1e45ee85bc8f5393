//! Recorded steps in Redis: a hash `<prefix>{<key>}steps:<scope>` beside
//! the lease record (the same hash tag, so one Cluster slot a call), field
//! = the step's number, value = `<name>\n<result>`. A step is written by
//! one script (`step_record.lua`) that checks the holder's owner, fence and
//! lease on the record, by Redis's clock, in the same call.

use std::sync::LazyLock;

use super::{Lua, RedisStore, int, store_error, unexpected};
use crate::error::Error;
use crate::lease::store::HeldLease;
use crate::lease::store::{NewStep, RecordedStep};
use crate::store::{RecordKind, millis};

static RECORD: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("step_record.lua")));

impl<C> RedisStore<C>
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    pub(super) async fn read_steps(&self, scope: &str, key: &str) -> Result<Vec<RecordedStep>, Error> {
        let name = self.key(RecordKind::Steps, scope, key);
        let mut conn = self.connection();
        let fields: Vec<(u64, Vec<u8>)> = self
            .bounded(async { redis::cmd("HGETALL").arg(&name).query_async(&mut conn).await.map_err(store_error) })
            .await?;
        let mut steps = Vec::with_capacity(fields.len());
        for (number, value) in fields {
            let text = String::from_utf8(value).map_err(|_| not_a_step(&name))?;
            let (step, result) = text.split_once('\n').ok_or_else(|| not_a_step(&name))?;
            steps.push((number, RecordedStep { name: step.to_owned(), result: result.to_owned() }));
        }
        steps.sort_by_key(|(number, _)| *number);
        // Numbers run from 0 without a gap: the script writes only the next.
        if steps.iter().enumerate().any(|(i, (n, _))| *n != i as u64) {
            return Err(not_a_step(&name));
        }
        Ok(steps.into_iter().map(|(_, step)| step).collect())
    }

    pub(super) async fn write_step(&self, held: &HeldLease<'_>, step: &NewStep<'_>) -> Result<bool, Error> {
        let (record, steps) =
            (self.key(RecordKind::Lease, held.scope, held.key), self.key(RecordKind::Steps, held.scope, held.key));
        let value = format!("{}\n{}", step.name, step.result);
        let keep = millis(held.retention).max(1);
        let mut conn = self.connection();
        // Safe to repeat: the same step written again by its holder is 1.
        let reply = self
            .bounded(async {
                RECORD
                    .eval_retrying(&mut conn, |c| {
                        c.arg(2).arg(&record).arg(&steps).arg(held.owner).arg(held.fence);
                        c.arg(step.number).arg(&value).arg(keep);
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
