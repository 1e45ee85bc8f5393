//! What the outbox's test files (`outbox.rs`, `outbox_brokers.rs`) share:
//! a guarded call that publishes, and reading back and deleting what a
//! test wrote in the shared outbox table. Included by each as a module.

use idem::outbox::{MessageQuery, MessageState};

/// Every state, for reading back what a test wrote.
pub fn everything(scope: &str) -> MessageQuery {
    MessageQuery {
        states: vec![MessageState::Pending, MessageState::Failing, MessageState::Sent, MessageState::Dead],
        scope: Some(scope.to_owned()),
        limit: 100_000,
        ..MessageQuery::default()
    }
}

/// How the body of a test's `call` ends.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum End {
    /// Ok, and the caller commits.
    Commit,
    /// Ok, and the caller rolls back.
    Rollback,
    /// The body fails, and the caller commits anyway.
    FailCommit,
}

/// `Db`, `Pool`, `forget` and `call` for the database `$db`, whose
/// placeholder is `$ph`, in the module of one database's tests (which
/// imports `Guard`, `Claim`, `MessageId`, `AppError` and `End`).
macro_rules! outbox_calls {
    ($db:ty, $ph:literal) => {
        type Db = $db;
        type Pool = sqlx::Pool<Db>;

        /// Delete what the test left in the shared outbox (pending rows
        /// are never purged, and sent ones only after their retention).
        async fn forget(pool: &Pool, scope: &str) {
            sqlx::query(concat!("DELETE FROM idem_outbox WHERE scope = ", $ph))
                .bind(idem::key::stored_scope(scope).as_ref())
                .execute(pool)
                .await
                .unwrap();
        }

        /// A guarded call of `scope` and `key` whose body publishes
        /// `messages` (topic, payload) through the ticket's handle,
        /// then ends as `end` says: the ids it published, or `None`
        /// for a replay.
        async fn call(
            pool: &Pool,
            scope: &str,
            key: &str,
            messages: &[(&str, &[u8])],
            end: End,
        ) -> Option<Vec<MessageId>> {
            let mut tx = pool.begin().await.unwrap();
            let scope = scope.to_owned();
            let ticket = match Guard::new(scope).key(key).dedup::<usize, _>(&mut tx).await.unwrap() {
                Claim::Replay(_) => return None,
                Claim::Run(ticket) => ticket,
            };
            let outbox = ticket.outbox();
            let mut ids = Vec::new();
            for (topic, payload) in messages {
                ids.push(outbox.publish(&mut tx, topic, payload).await.unwrap());
            }
            let result: Result<usize, AppError> = match end {
                End::FailCommit => Err(AppError::Rule("the body failed".into())),
                _ => Ok(ids.len()),
            };
            let _ = ticket.complete(&mut tx, result).await.unwrap();
            match end {
                End::Rollback => tx.rollback().await.unwrap(),
                _ => tx.commit().await.unwrap(),
            }
            Some(ids)
        }
    };
}
