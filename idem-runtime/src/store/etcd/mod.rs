//! etcd: one [`EtcdStore`] holds lease records (with their steps), one-time
//! tokens, locks with fencing, and precheck markers on an etcd cluster.
//! Every step that reads and then writes is an etcd transaction that
//! compares what it read (a key's `mod_revision` or `create_revision`), so
//! no update is lost to a concurrent one; fences are etcd revisions; and
//! every expiry is an etcd lease, decided by the cluster's leader, never by
//! this process's clock.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::RecordKind;
use super::keyspace::Keyspace;
use crate::error::Error;

mod admin;
mod lease;
mod lock;
mod precheck;
mod steps;
mod token;

/// Lease records, one-time tokens, locks and precheck markers on etcd
/// (v3 API, etcd 3.4 or newer), through an [`etcd_client::Client`].
///
/// **What it guarantees.** etcd replicates every write through Raft to a
/// majority before it answers: a write acknowledged to idem survives the
/// loss of the leader or of any minority of members (the failover test
/// kills the leader, then a follower, under load, and loses nothing). A
/// member that cannot reach a majority refuses writes, and idem's calls
/// fail with a retryable [`Error::Store`] until one can.
///
/// **Records.** Every record is one etcd key, named as in Redis
/// (`<prefix>{<key>}<kind>:<scope>`, see [`EtcdStore::key`]): one business
/// key's records under one prefix, and no scope or key, whatever it holds,
/// names another record.
///
/// - A **lease record** holds its state, fence, owner and fingerprint (and
///   the answer once done). While it is held, its lease is an etcd lease of
///   its own (granted with the claim, renewed by keep-alive): the lease has
///   passed when etcd has expired it, and only then may another call take
///   the record over. The record itself is attached to a lease of the
///   retention's length, so etcd drops it when that has run out. A new
///   record's fence is the revision of the transaction that wrote it; a
///   take-over adds one.
/// - A **lock** is a key attached to an etcd lease of its TTL, written only
///   where no key was (`create_revision == 0`); its fence is that write's
///   revision, above every earlier grant's.
/// - A **token** or a **marker** is a key attached to an etcd lease of its
///   TTL; a token is spent by deleting it (the delete reports whether it
///   was there: one atomic step), a marker is written only where none was.
///
/// etcd leases count whole seconds, and the server raises a TTL below its
/// minimum (one and a half election timeouts, rounded up: 2 s with the
/// default 1 s election timeout). So a lease, a lock's TTL or a token's TTL
/// lasts at least what was asked, rounded up to the second, and ends once
/// the leader has expired it (it checks every 500 ms); a leader elected
/// after a failover renews every lease for its whole TTL. A lease ends
/// late, never early.
///
/// **Waiting.** A call that waits for a busy record
/// ([`Guard::lease_or_wait`](crate::Guard::lease_or_wait)) polls, as on the
/// SQL stores; it does not watch the key.
///
/// ```no_run
/// # extern crate idem_runtime as idem;
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let store = idem::store::EtcdStore::connect(["http://10.0.0.1:2379", "http://10.0.0.2:2379"], None).await?;
/// idem::Stores::builder().all(store.prefix("idem/")).install()?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct EtcdStore {
    /// Boxed: a client is some 3.6 KB, and a store is held in enums and
    /// futures.
    client: Box<etcd_client::Client>,
    /// The endpoints, for errors.
    endpoints: Arc<str>,
    timeout: Duration,
    prefix: String,
    names: Keyspace,
    retention_leases: Arc<Mutex<HashMap<i64, (i64, Instant)>>>,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl EtcdStore {
    /// A store on the etcd cluster at `endpoints` (`http://host:port`, or
    /// `host:port`), with etcd-client's `options` (user, TLS, timeouts), and
    /// the prefix `idem/` (see [`prefix`](Self::prefix)). Connecting waits
    /// at most [`DEFAULT_TIMEOUT`](crate::store::DEFAULT_TIMEOUT): an etcd
    /// that is down is an [`Error::Store`] naming it.
    ///
    /// Without `options`, requests ask for a leader (`require_leader`): a
    /// member cut off from the majority answers at once that it has none,
    /// rather than holding the call.
    pub async fn connect<E: AsRef<str>, S: AsRef<[E]>>(
        endpoints: S,
        options: Option<etcd_client::ConnectOptions>,
    ) -> Result<EtcdStore, Error> {
        let list: Vec<String> = endpoints.as_ref().iter().map(|e| e.as_ref().to_owned()).collect();
        let named = list.join(",");
        if list.is_empty() {
            return Err(Error::Store { store: "etcd", source: "no etcd endpoint given".into() });
        }
        let options = options.unwrap_or_else(|| {
            etcd_client::ConnectOptions::new()
                .with_require_leader(true)
                .with_connect_timeout(super::DEFAULT_TIMEOUT)
                .with_keep_alive(Duration::from_secs(5), Duration::from_secs(3))
        });
        let connected =
            tokio::time::timeout(super::DEFAULT_TIMEOUT, etcd_client::Client::connect(&list, Some(options)));
        let client = match connected.await {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => return Err(store_error(&named, e)),
            Err(_) => return Err(no_answer(&named, super::DEFAULT_TIMEOUT, None)),
        };
        Ok(EtcdStore::from_client(client, named))
    }

    /// A store on a client you connected (cheap to clone: it shares the
    /// connections); `endpoints` names it in errors.
    pub fn from_client(client: etcd_client::Client, endpoints: impl Into<String>) -> EtcdStore {
        let prefix = "idem/".to_owned();
        EtcdStore {
            client: Box::new(client),
            endpoints: endpoints.into().into(),
            timeout: super::DEFAULT_TIMEOUT,
            names: Keyspace::new(&prefix),
            prefix,
            retention_leases: Arc::default(),
        }
    }

    /// Keys start with `prefix` (default `idem/`): stores of different
    /// services, or tests, on one cluster keep apart by it.
    pub fn prefix(mut self, prefix: impl Into<String>) -> EtcdStore {
        self.prefix = prefix.into();
        self.names = Keyspace::new(&self.prefix);
        self
    }

    /// How long one operation may take, its retries included, before the
    /// guard fails with a retryable [`Error::Store`] (default
    /// [`DEFAULT_TIMEOUT`](crate::store::DEFAULT_TIMEOUT), 3 s). Within it,
    /// an operation that is safe to repeat is sent again after a transient
    /// failure (no leader yet, the leader changed, a member unreachable):
    /// an election after a leader's loss takes about one election timeout.
    pub fn timeout(mut self, timeout: Duration) -> EtcdStore {
        self.timeout = timeout;
        self
    }

    /// The etcd key of the record of `kind` for `scope` and `key`, both as
    /// stored: `<prefix>{<key>}<kind>:<scope>` (as
    /// [`RedisStore`][crate::store::RedisStore] names them). For
    /// operators and tests.
    #[doc = links!()]
    pub fn key(&self, kind: RecordKind, scope: &str, key: &str) -> String {
        self.names.name(kind, scope, key)
    }

    /// The client, for tests and operators (a clone: it shares the
    /// connections).
    pub fn client(&self) -> etcd_client::Client {
        (*self.client).clone()
    }

    /// `op` within this store's timeout; `op` gets a client and says, with
    /// each failure, whether it may be sent again. Transient failures are
    /// retried after a short pause until the timeout, which then reports
    /// the last one.
    pub(crate) async fn run<T, F, Fut>(&self, repeatable: bool, mut op: F) -> Result<T, Error>
    where
        F: FnMut(etcd_client::Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let mut pause = Duration::from_millis(20);
        let mut last: Option<etcd_client::Error> = None;
        loop {
            match tokio::time::timeout_at(deadline, op(self.client())).await {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(e)) if repeatable && transient(&e) => {
                    tracing::debug!(target: "idem", error = %e, "etcd call failed; trying again");
                    last = Some(e);
                }
                Ok(Err(e)) => return Err(store_error(&self.endpoints, e)),
                Err(_) => return Err(no_answer(&self.endpoints, self.timeout, last)),
            }
            if tokio::time::Instant::now() + pause >= deadline {
                return Err(no_answer(&self.endpoints, self.timeout, last));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(250));
        }
    }

    /// An etcd lease for a record kept at least `keep`: shared by the
    /// records written within a window after it was granted (an eighth of
    /// its length, at most a minute), so that most writes need no grant of
    /// their own; it lasts `keep` plus that window, so every record on it
    /// is kept at least `keep`.
    pub(crate) async fn keep_lease(&self, keep: Duration) -> Result<i64, Error> {
        let secs = seconds(keep);
        let window = (secs / 8).min(60);
        if window > 0
            && let Some(&(id, at)) = self.retention_leases.lock().unwrap_or_else(|e| e.into_inner()).get(&secs)
            && at.elapsed() < Duration::from_secs(window as u64)
        {
            return Ok(id);
        }
        let granted = self.grant(secs + window).await?;
        self.retention_leases.lock().unwrap_or_else(|e| e.into_inner()).insert(secs, (granted, Instant::now()));
        Ok(granted)
    }

    /// Forget the shared leases (one was not found: expired or revoked by
    /// hand); the next write grants anew.
    fn forget_keep_leases(&self) {
        self.retention_leases.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// A new etcd lease of `secs` seconds (as the server grants it: at least
    /// its minimum). Safe to repeat: a lease granted by a lost reply is never
    /// used, and expires.
    pub(crate) async fn grant(&self, secs: i64) -> Result<i64, Error> {
        let granted = self.run(true, |mut c| async move { c.lease_grant(secs, None).await }).await?;
        if !granted.error().is_empty() {
            return Err(self.message(&format!("granting a lease failed: {}", granted.error())));
        }
        Ok(granted.id())
    }

    /// Seconds left on etcd lease `id`, by the leader's clock: `None` once it
    /// has expired (or was revoked). The lease ends within a second after
    /// the figure.
    pub(crate) async fn lease_left(&self, id: i64) -> Result<Option<i64>, Error> {
        let left = self.run(true, |mut c| async move { c.lease_time_to_live(id, None).await }).await?;
        Ok((left.ttl() >= 0).then_some(left.ttl()))
    }

    /// Renew etcd lease `id` for its whole TTL: `false` when it has
    /// expired.
    pub(crate) async fn renew(&self, id: i64) -> Result<bool, Error> {
        self.run(true, |mut c| async move {
            match c.lease_keep_alive(id).await {
                // The client reads the first answer, and refuses a TTL of 0:
                // the lease is gone.
                Ok(_) => Ok(true),
                Err(etcd_client::Error::LeaseKeepAliveError(_)) => Ok(false),
                Err(e) => Err(e),
            }
        })
        .await
    }

    /// `txn`'s answer; sent again after a transient failure if
    /// `repeatable` (it compares what it read, so a repeat of one that
    /// landed finds its own write and fails its comparison, or is
    /// harmless).
    pub(crate) async fn txn(&self, txn: etcd_client::Txn, repeatable: bool) -> Result<etcd_client::TxnResponse, Error> {
        self.run(repeatable, |mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })
        .await
    }

    /// `txn(kept_by)`, a transaction whose writes are attached to a lease
    /// that keeps them at least `keep` (see [`keep_lease`](Self::keep_lease));
    /// if that lease is gone meanwhile (expired, revoked by hand), once more
    /// on a new one.
    pub(crate) async fn txn_kept(
        &self,
        keep: Duration,
        txn: impl Fn(i64) -> etcd_client::Txn,
    ) -> Result<etcd_client::TxnResponse, Error> {
        for _ in 0..2 {
            let kept_by = self.keep_lease(keep).await?;
            match self.txn(txn(kept_by), true).await {
                Err(e) if lease_not_found(&e) => self.forget_keep_leases(),
                answer => return answer,
            }
        }
        Err(self.message("the lease a record was to be kept by expired twice in a row"))
    }

    /// The key's value, if there is one.
    pub(crate) async fn get(&self, name: &str) -> Result<Option<etcd_client::KeyValue>, Error> {
        let mut got = self.run(true, |mut c| async move { c.get(name, None).await }).await?;
        Ok(got.take_kvs().into_iter().next())
    }

    /// A store error of this store's endpoints.
    pub(crate) fn message(&self, message: &str) -> Error {
        Error::Store { store: "etcd", source: format!("etcd at {}: {message}", self.endpoints).into() }
    }
}

/// The whole seconds an etcd lease needs to last at least `d` (at least 1).
pub(crate) fn seconds(d: Duration) -> i64 {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    i64::try_from(secs.max(1)).unwrap_or(i64::MAX / 2)
}

/// Whether a failed call may succeed if sent again: the cluster had no
/// leader, changed it, or a member was unreachable.
fn transient(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        etcd_client::Error::GRpcStatus(status) => {
            use tonic::Code;
            matches!(status.code(), Code::Unavailable | Code::DeadlineExceeded | Code::Aborted | Code::Unknown)
                || status.message().contains("leader")
                || status.message().contains("timed out")
        }
        _ => false,
    }
}

/// Whether `e` says a lease a write named does not exist (expired, revoked).
fn lease_not_found(e: &Error) -> bool {
    matches!(e, Error::Store { store: "etcd", source } if source.to_string().contains("requested lease not found"))
}

fn store_error(endpoints: &str, e: etcd_client::Error) -> Error {
    Error::Store { store: "etcd", source: format!("etcd at {endpoints}: {e}").into() }
}

fn no_answer(endpoints: &str, timeout: Duration, last: Option<etcd_client::Error>) -> Error {
    let last = last.map(|e| format!(" (last error: {e})")).unwrap_or_default();
    Error::Store { store: "etcd", source: format!("etcd at {endpoints}: no answer within {timeout:?}{last}").into() }
}

/// The value of a transaction's `Get` answer (its first key), if any.
pub(crate) fn got(response: &etcd_client::TxnResponse) -> Option<etcd_client::KeyValue> {
    response.op_responses().into_iter().find_map(|op| match op {
        etcd_client::TxnOpResponse::Get(mut get) => get.take_kvs().into_iter().next(),
        _ => None,
    })
}

/// The revision a transaction's writes got.
pub(crate) fn revision(response: &etcd_client::TxnResponse) -> i64 {
    response.header().map_or(0, etcd_client::ResponseHeader::revision)
}
