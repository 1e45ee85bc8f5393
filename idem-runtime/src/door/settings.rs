//! What a door's layer was configured with, as far as every door reads it
//! alike: where its records live, the key's header (gRPC: metadata entry)
//! and whether it is required, the tenant, the fingerprint, the limits and
//! the durations; and what each request reads from them before its key is
//! claimed (its key, its body, its tenant), in that order for every door.

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, Request, request};
use http_body::Body as HttpBody;
use http_body_util::BodyExt;

use super::BoxError;
use super::fingerprint::{Fingerprint, fingerprint};
use crate::error::Error;
use crate::guard::Guard;
use crate::lease::store::LeaseStore;
use crate::stores::Stores;

pub(crate) type TenantFn = dyn Fn(&request::Parts) -> Option<String> + Send + Sync;

/// Where a layer's lease records live.
#[derive(Clone)]
pub(crate) enum Records {
    /// The store given to the layer's `new`.
    Store(Arc<dyn LeaseStore>),
    /// The lease store of a [`Stores`] value.
    Stores(Stores),
    /// The lease store installed at start-up, looked up at each request.
    Installed,
}

impl std::fmt::Debug for Records {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = |stores: &Stores| stores.lease().map_or("none", |store| store.kind());
        match self {
            Records::Store(store) => write!(f, "{:?}", store.kind()),
            Records::Stores(stores) => write!(f, "Stores({:?})", kind(stores)),
            Records::Installed => write!(f, "installed({:?})", Stores::installed().map_or("none", kind)),
        }
    }
}

/// The settings of a door's layer that every door reads alike.
pub(crate) struct Settings {
    pub(crate) store: Records,
    pub(crate) scope: Cow<'static, str>,
    /// The key's header (a gRPC metadata entry is a header too).
    pub(crate) header: HeaderName,
    pub(crate) required: bool,
    pub(crate) tenant: Option<Arc<TenantFn>>,
    pub(crate) fingerprint: Fingerprint,
    pub(crate) max_request: usize,
    pub(crate) max_response: usize,
    pub(crate) lease: Duration,
    pub(crate) retention: Duration,
    /// How long a duplicate of a call still running waits for it (zero:
    /// refused at once as in progress).
    pub(crate) wait: Duration,
    /// Whether a response of `max_response` bytes fits the store's records,
    /// once asked (`Err`: the detail to refuse every guarded call with).
    fits: OnceLock<Result<(), String>>,
    /// Whether the warning about keys shared by every caller was logged.
    warned_shared: AtomicBool,
}

/// A copy for a layer configured after it was cloned: what was learnt of
/// the store (whether responses fit) is asked again, the settings may
/// have changed.
impl Clone for Settings {
    fn clone(&self) -> Settings {
        Settings {
            store: self.store.clone(),
            scope: self.scope.clone(),
            header: self.header.clone(),
            required: self.required,
            tenant: self.tenant.clone(),
            fingerprint: self.fingerprint.clone(),
            max_request: self.max_request,
            max_response: self.max_response,
            lease: self.lease,
            retention: self.retention,
            wait: self.wait,
            fits: OnceLock::new(),
            warned_shared: AtomicBool::new(false),
        }
    }
}

/// A request a door guards, read: to pass on, to refuse, or to guard.
// Made once per request and matched at once: boxing the guarded variant
// would cost an allocation and save nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Read<B> {
    /// Without a key, where none is required: passed to the service as it
    /// came, unguarded.
    Pass(Request<B>),
    /// Refused before anything runs.
    Refused(Refusal),
    /// Its record's guard, and the request's head and body (read whole) to
    /// hand the service.
    Guarded(Guard<'static>, request::Parts, Bytes),
}

/// Why a request is refused before its key is claimed (with the detail).
pub(crate) enum Refusal {
    /// No key, where one is required.
    NoKey,
    /// A key that is not one.
    BadKey(String),
    /// A body longer than the layer's `max_request_body`.
    TooLarge(String),
    /// A body that failed as it was read.
    Unreadable(String),
    /// A tenant function that names nobody for the request.
    NoTenant(&'static str),
}

impl Settings {
    /// The defaults both doors start from, in `scope`, with 1 MiB limits,
    /// a 30 s lease and 24 h retention.
    pub(crate) fn new(store: Records, scope: &'static str) -> Settings {
        Settings {
            store,
            scope: Cow::Borrowed(scope),
            header: HeaderName::from_static("idempotency-key"),
            required: false,
            tenant: None,
            fingerprint: Fingerprint::Request,
            max_request: 1 << 20,
            max_response: 1 << 20,
            lease: Duration::from_secs(30),
            retention: Duration::from_secs(24 * 3600),
            wait: Duration::ZERO,
            fits: OnceLock::new(),
            warned_shared: AtomicBool::new(false),
        }
    }

    /// The lease store of the layer's records, or [`Error::NoStore`].
    pub(crate) fn store(&self) -> Result<&dyn LeaseStore, Error> {
        match &self.store {
            Records::Store(store) => Ok(&**store),
            Records::Stores(stores) => stores.lease(),
            // Not installed yet, or installed without a lease store: the
            // error a guard naming no store gets, which says what to install.
            Records::Installed => Stores::installed().map_err(|_| Error::NoStore { role: "lease" })?.lease(),
        }
    }

    /// Whether a first call found the store unable to hold the layer's
    /// responses: the detail to refuse every call with.
    pub(crate) fn misfit(&self) -> Option<&str> {
        self.fits.get()?.as_ref().err().map(String::as_str)
    }

    /// Whether the store's records hold a response of `max_response` bytes
    /// (asked of the store once): its body in base64, a third longer, and
    /// room for its metadata.
    pub(crate) async fn fits_store(&self, store: &dyn LeaseStore) -> Result<(), &str> {
        if let Some(fits) = self.fits.get() {
            return fits.as_ref().map_err(String::as_str).copied();
        }
        let limit = store.answer_limit().await;
        let stored = self.max_response.div_ceil(3).saturating_mul(4).saturating_add(HEADROOM);
        let fits = if stored <= limit {
            Ok(())
        } else {
            let detail = format!(
                "the idempotency layer is misconfigured: max_response_body ({} bytes) would be stored as up to {stored} \
                 bytes, more than its {} store holds ({limit}); lower max_response_body",
                self.max_response,
                store.kind()
            );
            tracing::error!(target: "idem", scope = %self.scope, "{detail}");
            Err(detail)
        };
        self.fits.get_or_init(|| fits).as_ref().map_err(String::as_str).copied()
    }

    /// The key from its header: a Structured Field string (`"..."`), or
    /// bare text for clients that send it so; 1 to 255 visible ASCII
    /// characters. `None` without the header; `Err` naming what is wrong.
    fn key_of(&self, headers: &HeaderMap) -> Result<Option<String>, String> {
        let mut values = headers.get_all(&self.header).iter();
        let Some(value) = values.next() else { return Ok(None) };
        let name = &self.header;
        if values.next().is_some() {
            return Err(format!("the request carries `{name}` more than once"));
        }
        let text = value.to_str().map_err(|_| format!("`{name}` holds bytes that are not visible ASCII"))?;
        let key = match text.strip_prefix('"') {
            Some(quoted) => {
                quoted.strip_suffix('"').ok_or_else(|| format!("`{name}` opens a quoted string it does not close"))?
            }
            None => text,
        };
        if key.is_empty()
            || key.len() > 255
            || !key.bytes().all(|b| b.is_ascii_graphic() || b == b' ')
            || key.trim().is_empty()
        {
            return Err(format!("`{name}` must hold 1 to 255 visible ASCII characters, e.g. a UUID in quotes"));
        }
        if key.contains(['"', '\\']) {
            return Err(format!("`{name}` holds a quote or a backslash; send the key as a plain quoted string"));
        }
        Ok(Some(key.to_owned()))
    }

    /// The tenant the request's key belongs to: `None` for a layer
    /// without a tenant function (warned about once); `Err` (why) for a
    /// request its function names nobody for.
    fn tenant_of(&self, parts: &request::Parts) -> Result<Option<String>, &'static str> {
        let Some(tenant) = &self.tenant else {
            if !self.warned_shared.swap(true, Ordering::Relaxed) {
                tracing::warn!(target: "idem", scope = %self.scope,
                    "idempotency layer without a tenant function: keys are shared by every caller, so one \
                     client's key replays another's response; set IdempotencyLayer::tenant on APIs with more than one caller");
            }
            return Ok(None);
        };
        match tenant(parts) {
            Some(tenant) if !tenant.trim().is_empty() => Ok(Some(tenant)),
            _ => Err("an idempotency key belongs to a caller, and this request names none"),
        }
    }

    /// Read a request the door guards: its key (it passes without one,
    /// unless one is required), its body (up to the limit), its tenant; so
    /// its guard.
    pub(crate) async fn read<B>(&self, request: Request<B>) -> Read<B>
    where
        B: HttpBody<Data = Bytes>,
        B::Error: Into<BoxError>,
    {
        let key = match self.key_of(request.headers()) {
            Ok(Some(key)) => key,
            Ok(None) if !self.required => return Read::Pass(request),
            Ok(None) => return Read::Refused(Refusal::NoKey),
            Err(why) => return Read::Refused(Refusal::BadKey(why)),
        };
        let (parts, body) = request.into_parts();
        let body = match self.body_of(body).await {
            Ok(body) => body,
            Err(refusal) => return Read::Refused(refusal),
        };
        match self.guard(&parts, &body, &key) {
            Ok(guard) => Read::Guarded(guard, parts, body),
            Err(why) => Read::Refused(Refusal::NoTenant(why)),
        }
    }

    /// The request body, whole, if it is within the layer's limit and can
    /// be read.
    async fn body_of<B>(&self, body: B) -> Result<Bytes, Refusal>
    where
        B: HttpBody<Data = Bytes>,
        B::Error: Into<BoxError>,
    {
        match http_body_util::Limited::new(body, self.max_request).collect().await {
            Ok(collected) => Ok(collected.to_bytes()),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(Refusal::TooLarge(format!(
                "the request body is over {} bytes, the most kept for an idempotent request",
                self.max_request
            ))),
            Err(e) => Err(Refusal::Unreadable(format!("the request body could not be read: {e}"))),
        }
    }

    /// The guard of a request's record: the layer's scope and retention,
    /// keyed by its tenant (if any) then `key`, with its fingerprint; `Err`
    /// (why) for a request whose tenant function names nobody.
    fn guard<'s>(&self, parts: &request::Parts, body: &[u8], key: &str) -> Result<Guard<'s>, &'static str> {
        let tenant = self.tenant_of(parts)?;
        let mut guard = Guard::new(self.scope.clone()).retention(self.retention);
        if let Some(tenant) = &tenant {
            guard = guard.key(tenant);
        }
        guard = guard.key(key);
        if let Some(fingerprint) = fingerprint(&self.fingerprint, parts, body) {
            guard = guard.fingerprint(&fingerprint);
        }
        Ok(guard)
    }
}

/// Room for a stored response's status and metadata beside its body.
const HEADROOM: usize = 64 * 1024;
