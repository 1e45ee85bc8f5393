//! Calls waiting for a record to change, woken by the store that saw it
//! change (the memory store's own completions, a Redis store's
//! notifications), so that a waiting duplicate does not poll.
//!
//! A waiter registers before the claim that may find the record busy
//! ([`Waiters::watch`]), under the map's lock: a completion between that
//! claim and the wait wakes it all the same.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::future::BoxFuture;

/// The waiting calls of one store, by record id: the record's `Notify`
/// and how many watches are registered on it.
#[derive(Default)]
pub(crate) struct Waiters {
    by_record: Mutex<HashMap<String, (Arc<Notify>, usize)>>,
}

impl Waiters {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Arc<Notify>, usize)>> {
        // Every change is one insert, update or remove: a poisoned map is whole.
        self.by_record.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A watch on `record`, registered now: the future ends at the next
    /// [`wake`](Self::wake) of it (or never; bound it). Dropped, early or
    /// late, it leaves nothing behind.
    pub(crate) fn watch(&self, record: &str) -> BoxFuture<'_, ()> {
        let mut map = self.map();
        let (notify, count) = map.entry(record.to_owned()).or_default();
        *count += 1;
        let mut notified = Box::pin(notify.clone().notified_owned());
        // Enabled under the lock: a wake from here on reaches it.
        notified.as_mut().enable();
        let leave = Leave { waiters: self, record: record.to_owned(), notify: notify.clone() };
        drop(map);
        Box::pin(async move {
            notified.await;
            drop(leave);
        })
    }

    /// Wake every call watching `record`.
    pub(crate) fn wake(&self, record: &str) {
        if let Some((notify, _)) = self.map().remove(record) {
            notify.notify_waiters();
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map().len()
    }
}

/// A watch's registration: the last one to go takes the record's entry.
struct Leave<'a> {
    waiters: &'a Waiters,
    record: String,
    notify: Arc<Notify>,
}

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        let mut map = self.waiters.map();
        if let Some((notify, count)) = map.get_mut(&self.record)
            && Arc::ptr_eq(notify, &self.notify)
        {
            *count -= 1;
            if *count == 0 {
                map.remove(&self.record);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_wake_before_the_wait_still_reaches_the_watch() {
        let waiters = Waiters::default();
        let watch = waiters.watch("a");
        waiters.wake("b");
        waiters.wake("a");
        tokio::time::timeout(Duration::from_secs(5), watch).await.expect("woken by the earlier wake");
        assert_eq!(waiters.len(), 0);
    }

    #[tokio::test]
    async fn a_dropped_watch_leaves_nothing_behind() {
        let waiters = Waiters::default();
        let (one, two) = (waiters.watch("a"), waiters.watch("a"));
        drop(one);
        assert_eq!(waiters.len(), 1, "the other still waits");
        assert!(tokio::time::timeout(Duration::from_millis(20), two).await.is_err());
        assert_eq!(waiters.len(), 0);
    }
}
