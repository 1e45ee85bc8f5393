//! Calls waiting for a record to change, woken by the store that saw it
//! change (the memory store's own completions, a Redis store's
//! notifications), so that a waiting duplicate does not poll.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

/// The waiting calls of one store, by record id.
#[derive(Default)]
pub(crate) struct Waiters {
    by_record: Mutex<HashMap<String, Arc<Notify>>>,
}

impl Waiters {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Notify>>> {
        // Every change is one insert or remove: a poisoned map is whole.
        self.by_record.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wait for [`wake`](Self::wake) of `record`, at most `up_to`.
    pub(crate) async fn wait(&self, record: &str, up_to: Duration) {
        let notify = self.map().entry(record.to_owned()).or_default().clone();
        let _ = tokio::time::timeout(up_to, notify.notified()).await;
        let mut map = self.map();
        // The last waiter gone (the map holds one more), the entry goes.
        if map.get(record).is_some_and(|n| Arc::ptr_eq(n, &notify) && Arc::strong_count(n) == 2) {
            map.remove(record);
        }
    }

    /// Wake every call waiting for `record`.
    pub(crate) fn wake(&self, record: &str) {
        if let Some(notify) = self.map().remove(record) {
            notify.notify_waiters();
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_waiter_wakes_on_its_record_and_leaves_nothing_behind() {
        let waiters = Arc::new(Waiters::default());
        let started = tokio::time::Instant::now();
        let waiting = tokio::spawn({
            let waiters = waiters.clone();
            async move { waiters.wait("a", Duration::from_secs(10)).await }
        });
        while waiters.len() == 0 {
            tokio::task::yield_now().await;
        }
        waiters.wake("b");
        waiters.wake("a");
        waiting.await.unwrap();
        assert!(started.elapsed() < Duration::from_secs(5));
        waiters.wait("c", Duration::from_millis(5)).await;
        assert_eq!(waiters.len(), 0);
    }
}
