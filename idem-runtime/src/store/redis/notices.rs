//! Notices of completed and released lease records over Redis pub/sub:
//! a duplicate waiting for the call that holds its key
//! ([`Guard::lease_or_wait`](crate::Guard::lease_or_wait), the HTTP
//! layer's `wait`) wakes when that call ends, instead of asking again.

use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_core::Stream;

use super::{RedisStore, store_error};
use crate::error::Error;
use crate::lease::store::Watch;
use crate::store::RecordKind;
use crate::store::waiters::Waiters;

/// The waiting calls of a store with notices, and its channel.
pub(super) struct Notices {
    pub(super) waiters: Waiters,
    pub(super) channel: String,
}

impl<C> RedisStore<C>
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Tell waiting duplicates at once when the call they wait for ends:
    /// each completion and release is published on the channel
    /// `<prefix>changed` (a `PUBLISH` after the write, sent without
    /// holding up the caller), and a connection of `client`'s own
    /// subscribes to it (one per store and its clones, reconnected if it
    /// drops). Without notices, a waiting duplicate asks again after
    /// pauses of 10 ms doubling up to 250 ms.
    ///
    /// For standalone Redis (and a Cluster's clients where every node
    /// forwards classic pub/sub, which Cluster does). A notice lost with
    /// its connection costs a waiter at most 500 ms: it asks again then.
    pub async fn notifications(self, client: &redis::Client) -> Result<RedisStore<C>, Error> {
        if self.shared.notices.get().is_some() {
            return Ok(self);
        }
        let channel = format!("{}changed", self.prefix);
        let subscribed = self.bounded(subscribe(client, &channel)).await?;
        let notices = Arc::new(Notices { waiters: Waiters::default(), channel });
        if self.shared.notices.set(notices.clone()).is_ok() {
            tokio::spawn(listen(client.clone(), Arc::downgrade(&notices), subscribed));
        }
        Ok(self)
    }

    /// Publish that the record of `scope` and `key` changed, if this store
    /// sends notices; detached (a lost notice costs a waiter one pause).
    pub(super) fn announce(&self, scope: &str, key: &str) {
        let Some(notices) = self.shared.notices.get() else { return };
        let (mut conn, channel, bound) = (self.conn.clone(), notices.channel.clone(), self.timeout);
        let record = self.names.name(RecordKind::Lease, scope, key);
        tokio::spawn(async move {
            let mut cmd = redis::cmd("PUBLISH");
            cmd.arg(channel).arg(record);
            let publish = cmd.query_async::<i64>(&mut conn);
            // Bounded as every call of the store is: a stalled Redis does
            // not pile up publishing tasks.
            match tokio::time::timeout(bound, publish).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::debug!(target: "idem", error = %e, "a lease notice could not be published"),
                Err(_) => tracing::debug!(target: "idem", "a lease notice was not published within the store's bound"),
            }
        });
    }

    /// Whether notices are on (see [`notifications`](Self::notifications)).
    pub(super) fn sends_notices(&self) -> bool {
        self.shared.notices.get().is_some()
    }

    /// A watch for a notice about the record of `scope` and `key` (none
    /// without notices).
    pub(super) fn notice(&self, scope: &str, key: &str) -> Watch<'_> {
        match self.shared.notices.get() {
            Some(notices) => Watch::on(notices.waiters.watch(&self.names.name(RecordKind::Lease, scope, key))),
            None => Watch::none(),
        }
    }
}

async fn subscribe(client: &redis::Client, channel: &str) -> Result<redis::aio::PubSub, Error> {
    let mut pubsub = client.get_async_pubsub().await.map_err(store_error)?;
    pubsub.subscribe(channel).await.map_err(store_error)?;
    Ok(pubsub)
}

/// Wake the waiters of each record a notice names, for as long as the
/// store lives; a dropped subscription is made again, every second.
async fn listen(client: redis::Client, notices: Weak<Notices>, subscribed: redis::aio::PubSub) {
    let mut stream = subscribed.into_on_message();
    loop {
        // Wake up now and then to see whether the store is gone.
        let next = tokio::time::timeout(
            Duration::from_secs(5),
            std::future::poll_fn(|cx| Pin::new(&mut stream).poll_next(cx)),
        )
        .await;
        let Some(live) = notices.upgrade() else { return };
        match next {
            Err(_) => {}
            Ok(Some(message)) => live.waiters.wake(&String::from_utf8_lossy(message.get_payload_bytes())),
            Ok(None) => {
                tracing::warn!(target: "idem", channel = %live.channel,
                    "the subscription to lease notices dropped; subscribing again");
                let channel = live.channel.clone();
                drop(live);
                loop {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    if notices.strong_count() == 0 {
                        return;
                    }
                    if let Ok(Ok(again)) =
                        tokio::time::timeout(Duration::from_secs(3), subscribe(&client, &channel)).await
                    {
                        stream = again.into_on_message();
                        break;
                    }
                }
            }
        }
    }
}
