//! Every compile-time rule of `#[idempotent]`, each error at the offending
//! token with a message that says what to do. Errors accumulate, so one build
//! shows all of them.

use proc_macro2::Span;
use quote::ToTokens;
use syn::spanned::Spanned;
use syn::{Expr, FnArg, Ident, ItemFn, Pat, ReturnType, Type};

use crate::args::{KeyArg, RawArgs};

/// Every strategy DESIGN.md names.
const STRATEGIES: &[(&str, Strategy)] = &[
    ("dedup", Strategy::Dedup),
    ("state", Strategy::State),
    ("dedup+state", Strategy::DedupState),
    ("token", Strategy::Token),
    ("token+dedup", Strategy::TokenDedup),
    ("lock+dedup", Strategy::LockDedup),
    ("lock+state", Strategy::LockState),
    ("lease", Strategy::Lease),
    ("lock", Strategy::Lock),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    Dedup,
    State,
    DedupState,
    Token,
    TokenDedup,
    LockDedup,
    LockState,
    Lease,
    Lock,
}

impl Strategy {
    fn name(self) -> &'static str {
        STRATEGIES.iter().find(|(_, s)| *s == self).map_or("?", |(n, _)| n)
    }

    pub fn moves_state(self) -> bool {
        matches!(self, Strategy::State | Strategy::DedupState | Strategy::LockState)
    }

    pub fn is_token(self) -> bool {
        matches!(self, Strategy::Token | Strategy::TokenDedup)
    }

    pub fn is_lock(self) -> bool {
        matches!(self, Strategy::LockDedup | Strategy::LockState | Strategy::Lock)
    }

    /// Works in the caller's transaction (a dedup record or a state change).
    fn needs_tx(self) -> bool {
        !matches!(self, Strategy::Token | Strategy::Lease | Strategy::Lock)
    }

    /// Keeps a record: something to fingerprint and retain.
    fn keeps_record(self) -> bool {
        matches!(
            self,
            Strategy::Dedup | Strategy::DedupState | Strategy::TokenDedup | Strategy::LockDedup | Strategy::Lease
        )
    }

    /// Uses a store besides the caller's database (`store = "..."`).
    fn has_store(self) -> bool {
        self.is_token() || self.is_lock() || self == Strategy::Lease
    }
}

/// `transition = "OrderStatus::WaitPay | OrderStatus::Paid -> OrderStatus::Canceled"`.
pub struct TransitionArg {
    /// `OrderStatus`: the path before the variant names.
    pub enum_path: syn::Path,
    pub from: Vec<Ident>,
    pub to: Ident,
    pub span: Span,
}

/// Why each duration argument needs no more than [`MAX_DURATION`], for the
/// "too long" message.
const RETENTION_WHY: &str = "every store writes now + `retention` as the record's expiry (MySQL's DATETIME ends in \
                             year 9999), and a record only has to outlive the retries of its request (days are usual)";
const LEASE_WHY: &str = "stores write now + `lease` as the lease's end, and the guard renews a lease while the body \
                         runs, so it only has to outlast a renewal (seconds are usual)";
const LOCK_TTL_WHY: &str = "stores write now + `ttl` as the lock's expiry, and the guard renews a lock while the body \
                            runs, so it only has to outlast a renewal (seconds are usual)";
const MARKER_TTL_WHY: &str = "the precheck store writes now + `ttl` as the marker's expiry, and a marker only has to \
                              outlive the retries of its request (hours or days are usual)";
const WAIT_WHY: &str = "`wait` is how long a call waits for a busy lock (seconds are usual)";

/// A validated attribute: everything the expansion needs.
pub struct Plan {
    pub strategy: Strategy,
    pub key: KeyArg,
    pub scope: Option<String>,
    pub fingerprint: Option<Expr>,
    /// `None`: the runtime's `DEFAULT_RETENTION`.
    pub retention_ms: Option<u64>,
    pub claim_after: bool,
    pub transition: Option<TransitionArg>,
    /// The transaction parameter and its type (where errors about it point);
    /// `None` for `lease`, which keeps its record outside any transaction.
    pub tx: Option<(Ident, Type)>,
    /// `lease`: the lease length (`None`: the runtime's default).
    pub lease_ms: Option<u64>,
    /// `lease`, token and lock strategies: the store expression (`None`: the
    /// installed store).
    pub store: Option<Expr>,
    /// Token strategies: the `#[idem(token)]` parameter.
    pub token: Option<Ident>,
    /// Token strategies: `on_store_error = "allow"`.
    pub allow_on_store_error: bool,
    /// `precheck = "redis"` on `dedup`, `dedup+state`, `token+dedup` or `lease`.
    pub precheck: bool,
    /// Lock strategies: the lock's TTL and how long to wait for it; with
    /// `precheck`, the marker's TTL.
    pub ttl_ms: Option<u64>,
    pub wait_ms: Option<u64>,
    pub ret: Type,
    /// Where the `idem` crate is (`crate = "..."`, default `::idem`).
    pub krate: syn::Path,
}

/// Parameters marked `#[idem(...)]`, found (and stripped) before validation so
/// that the function can be emitted unchanged even when validation fails.
pub struct Marks {
    pub tx: Vec<(Ident, Span)>,
    pub token: Vec<(Ident, Span)>,
    pub errors: Vec<syn::Error>,
}

/// Remove `#[idem(...)]` from the parameters, remembering what they marked.
pub fn strip_marks(func: &mut ItemFn) -> Marks {
    let mut marks = Marks { tx: Vec::new(), token: Vec::new(), errors: Vec::new() };
    for input in func.sig.inputs.iter_mut() {
        let FnArg::Typed(pt) = input else { continue };
        let mut kept = Vec::new();
        for attr in pt.attrs.drain(..) {
            if !attr.path().is_ident("idem") {
                kept.push(attr);
                continue;
            }
            let parsed = attr.parse_args::<Ident>();
            match parsed {
                Ok(word) if word == "tx" || word == "token" => match &*pt.pat {
                    Pat::Ident(pi) if word == "tx" => marks.tx.push((pi.ident.clone(), attr.span())),
                    Pat::Ident(pi) => marks.token.push((pi.ident.clone(), attr.span())),
                    other => marks.errors.push(syn::Error::new_spanned(
                        other,
                        format!(
                            "name the `#[idem({word})]` parameter (e.g. `{word}`): the guard passes it to the store"
                        ),
                    )),
                },
                Ok(word) => marks.errors.push(syn::Error::new_spanned(
                    &word,
                    format!(
                        "unknown parameter marker `{word}`; `#[idem(tx)]` marks the transaction the record is \
                         written in, `#[idem(token)]` the one-time token a token guard consumes"
                    ),
                )),
                Err(_) => marks.errors.push(syn::Error::new_spanned(
                    &attr,
                    "expected `#[idem(tx)]` (the transaction the record is written in) or `#[idem(token)]` \
                     (the one-time token a token guard consumes)",
                )),
            }
        }
        pt.attrs = kept;
    }
    marks
}

pub fn validate(raw: RawArgs, attr_span: Span, func: &ItemFn, marks: Marks) -> Result<Plan, syn::Error> {
    let mut errors = marks.errors;
    let sig = &func.sig;
    let fn_name = &sig.ident;

    if sig.asyncness.is_none() {
        errors.push(syn::Error::new_spanned(
            sig.fn_token,
            "#[idempotent] needs an `async fn`: the guard awaits its store; write `async fn`",
        ));
    }

    let ret = match &sig.output {
        ReturnType::Type(_, ty) if contains_impl_trait(ty) => {
            errors.push(syn::Error::new_spanned(
                ty,
                "#[idempotent] functions must name their `Ok` type: it is stored and replayed to repeats, \
                 so it must be a concrete type implementing `Serialize` and `Deserialize`, not `impl Trait`",
            ));
            None
        }
        ReturnType::Type(_, ty) if is_result(ty) => {
            if let Some(err) = sqlx_error(ty) {
                errors.push(syn::Error::new_spanned(
                    err,
                    "`sqlx::Error` cannot carry idem's own errors (a key used with another payload, a call still \
                     in progress, a lost lease): it converts only from database errors. Return an error type of \
                     your own with a `#[from] idem::Error` variant (thiserror) beside `#[from] sqlx::Error`, or \
                     `anyhow::Error`",
                ));
            }
            Some((**ty).clone())
        }
        ReturnType::Type(_, ty) => {
            errors.push(syn::Error::new_spanned(
                ty,
                "#[idempotent] functions must return `Result<T, E>`: repeats replay the first `Ok(T)`, \
                 and guard failures reach the caller as `E` (through `From<idem::Error>`)",
            ));
            None
        }
        ReturnType::Default => {
            errors.push(syn::Error::new(
                sig.paren_token.span.close(),
                "#[idempotent] functions must return `Result<T, E>`: add e.g. `-> Result<(), AppError>`; \
                 repeats replay the first `Ok(T)` and guard failures reach the caller as `E`",
            ));
            None
        }
    };

    let strategy = match &raw.strategy {
        None => Some(Strategy::Dedup),
        Some(s) => parse_strategy(s.as_str(), s.span()).map_err(|e| errors.push(e)).ok(),
    };

    if let (Some(ret), Some(s)) = (&ret, strategy)
        && s.keeps_record()
        && let Some(e) = lossy_ok_type(ret)
    {
        errors.push(e);
    }

    // Arguments that belong to other strategies.
    let is_lease = strategy == Some(Strategy::Lease);
    let is_lock = strategy.is_some_and(Strategy::is_lock);
    let is_token = strategy.is_some_and(Strategy::is_token);
    // `precheck` puts a marker cache in front of a record: dedup, lease, and
    // the record of dedup+state and token+dedup. Not lock+dedup: there the
    // read would come before the lock, in the caller's transaction, and on
    // SQLite hold the write lock while waiting for the other lock.
    let precheck_fits =
        matches!(strategy, Some(Strategy::Dedup | Strategy::Lease | Strategy::DedupState | Strategy::TokenDedup));
    let precheck = raw.precheck.is_some() && precheck_fits;
    let foreign: [(&str, Option<Span>); 8] = [
        (
            "transition",
            raw.transition.as_ref().filter(|_| !strategy.is_some_and(Strategy::moves_state)).map(|v| v.span()),
        ),
        ("ttl", raw.ttl.as_ref().filter(|_| !is_lock && !precheck).map(|v| v.span())),
        ("lease", raw.lease.as_ref().filter(|_| !is_lease).map(|v| v.span())),
        (
            "store",
            raw.store.as_ref().filter(|_| !strategy.is_some_and(Strategy::has_store) && !precheck).map(|v| v.span()),
        ),
        ("precheck", raw.precheck.as_ref().filter(|_| !precheck_fits).map(|v| v.span())),
        (
            "concurrency_only",
            raw.concurrency_only.as_ref().filter(|_| strategy != Some(Strategy::Lock)).map(|v| v.span()),
        ),
        ("wait", raw.wait.as_ref().filter(|_| !is_lock).map(|v| v.span())),
        ("on_store_error", raw.on_store_error.as_ref().filter(|_| !is_token).map(|v| v.span())),
    ];
    if let Some(strategy) = strategy {
        let name = strategy.name();
        for (arg, span) in foreign {
            let Some(span) = span else { continue };
            let hint = match arg {
                "lease" if is_lock => "a lock's length is its `ttl`; write `ttl = \"30s\"` instead".to_owned(),
                "lease" if strategy.needs_tx() => format!(
                    "`{name}` works in your transaction, so it needs no lease; `lease` is for work outside a \
                     transaction (strategy = \"lease\"). Remove one of them"
                ),
                "lease" => format!(
                    "`{name}` needs no lease; `lease` is for work outside a transaction (strategy = \"lease\"). \
                     Remove one of them"
                ),
                "ttl" if is_lease => "a lease's length is `lease`; write `lease = \"30s\"` instead".to_owned(),
                "ttl" => "`ttl` is how long a lock holds (strategies `lock+dedup`, `lock+state`, `lock`) or a \
                          precheck marker lives (with `precheck`); a token's TTL is given when it is issued \
                          (`idem::token::issue`). Remove it"
                    .to_owned(),
                "precheck" if strategy.keeps_record() => format!(
                    "`precheck` works in front of strategies `dedup`, `dedup+state`, `token+dedup` and `lease`; \
                     `{name}` does not support it yet (its record is read only once the lock is held). Remove \
                     `precheck`; the lock already keeps repeats of a key in line"
                ),
                "precheck" => format!(
                    "`precheck` is a cache in front of a record (strategies `dedup`, `dedup+state`, \
                     `token+dedup`, `lease`), and the cache is not the source of truth: a \"seen\" marker must \
                     be confirmed against that record, which `{name}` does not keep. Use one of those \
                     strategies with it, or remove `precheck`"
                ),
                "transition" => "a transition is made by strategy `state`, `dedup+state` or `lock+state`; remove \
                                 it, or choose one of those"
                    .to_owned(),
                "store" => "the record is written in your transaction; `store` names where a lease, token, \
                            lock or precheck marker lives (strategies `lease`, `token`, `lock+...`, or \
                            `precheck`). Remove one of them"
                    .to_owned(),
                "concurrency_only" if is_lock => format!(
                    "`{name}` already stops repeats (its `{}` part); `concurrency_only = true` is for `lock` \
                     alone. Remove it",
                    name.trim_start_matches("lock+")
                ),
                "concurrency_only" => "`concurrency_only = true` goes with strategy `lock`; remove it".to_owned(),
                "wait" => "`wait` is how long a lock guard waits for a busy lock; remove it".to_owned(),
                "on_store_error" => "`on_store_error` is what a token guard does when its token store is \
                                     down; remove it"
                    .to_owned(),
                _ => "remove it, or choose the strategy it belongs to".to_owned(),
            };
            errors.push(syn::Error::new(span, format!("`{arg}` has no meaning for strategy `{name}`: {hint}")));
        }
    }
    // `state`, `token` and `lock` alone keep no record: nothing to
    // fingerprint or retain.
    if let Some(s) = strategy.filter(|s| !s.keeps_record()) {
        let recordless = [
            ("fingerprint", raw.fingerprint.as_ref().map(|f| f.span())),
            ("retention", raw.retention.as_ref().map(|r| r.span())),
        ];
        let (memory, with_record) = match s {
            Strategy::Token => {
                ("the spent token is its only memory", "use strategy = \"token+dedup\" to keep a record too")
            }
            Strategy::Lock => {
                ("a lock remembers nothing once released", "use strategy = \"lock+dedup\" to keep a record too")
            }
            Strategy::LockState => {
                ("the entity's status is its only memory", "use `lock+dedup` or `dedup+state` to keep a record")
            }
            _ => ("the entity's status is its only memory", "use strategy = \"dedup+state\" to keep a record too"),
        };
        for (arg, span) in recordless {
            let Some(span) = span else { continue };
            errors.push(syn::Error::new(
                span,
                format!(
                    "`{arg}` needs a dedup record, and strategy `{}` keeps none ({memory}); {with_record}, or \
                     remove `{arg}`",
                    s.name()
                ),
            ));
        }
    }
    let transition = match (strategy, &raw.transition) {
        (Some(s), None) if s.moves_state() => {
            errors.push(syn::Error::new(
                raw.strategy.as_ref().map_or(attr_span, |s| s.span()),
                format!(
                    "strategy `{}` needs `transition`: the status change this call makes, e.g. \
                     `transition = \"OrderStatus::WaitPay -> OrderStatus::Paid\"`",
                    s.name()
                ),
            ));
            None
        }
        (Some(s), Some(t)) if s.moves_state() => {
            parse_transition(t.as_str(), t.span()).map_err(|e| errors.push(e)).ok()
        }
        _ => None,
    };

    if let Some(source) = &raw.source
        && !["frontend", "callback", "mq", "rpc"].contains(&source.as_str())
    {
        errors.push(syn::Error::new(
            source.span(),
            format!("unknown source `{}`; expected \"frontend\", \"callback\", \"mq\" or \"rpc\"", source.as_str()),
        ));
    }
    if let Some(source) = &raw.source
        && is_token
        && ["callback", "mq", "rpc"].contains(&source.as_str())
    {
        let (who, fix) = match source.as_str() {
            "callback" => ("a payment gateway's callback", "`dedup` on the trade number, or `dedup+state`"),
            "mq" => ("a message broker's redelivery", "`dedup` on the message's business key"),
            _ => ("an RPC framework's retry", "`dedup` on the request id"),
        };
        errors.push(syn::Error::new(
            source.span(),
            format!(
                "a one-time token stops a user's double submit, but {who} never fetched a token (it repeats the \
                 request as it was): with `source = \"{}\"` use {fix}, or `state` where the call moves a status",
                source.as_str()
            ),
        ));
    }
    // Tokens are issued for a scope (`idem::token::issue(store, scope, ttl)`),
    // so the guard must say which: a default derived from the module path
    // would silently change when the function moves.
    if is_token && raw.scope.is_none() {
        errors.push(syn::Error::new(
            raw.strategy.as_ref().map_or(attr_span, |s| s.span()),
            format!(
                "strategy `{}` needs an explicit `scope`: tokens are issued for a scope \
                 (`idem::token::issue(&store, \"orders.create\", ttl)`) and this guard only accepts that scope's; \
                 add e.g. `scope = \"orders.create\"`, the same string you issue with",
                strategy.map_or("token", Strategy::name)
            ),
        ));
    }
    if strategy == Some(Strategy::Lock) && !raw.concurrency_only.as_ref().is_some_and(|c| **c) {
        errors.push(syn::Error::new(
            raw.strategy.as_ref().map_or(attr_span, |s| s.span()),
            "a lock stops concurrency, not repetition: once it is released, the same request runs again. \
             To stop repeats use `lock+dedup` or `lock+state` (or plain `dedup`); if you only need mutual \
             exclusion, say so with `concurrency_only = true`",
        ));
    }

    let params = param_names(func);
    let key = match raw.key {
        // The token is the key: two submits are the same request when they
        // carry the same token.
        Some(key) if strategy == Some(Strategy::Token) => {
            errors.push(syn::Error::new(
                key.span,
                "strategy `token` keys on the token itself (the `#[idem(token)]` parameter); remove `key`, or use \
                 `token+dedup` to also keep a record under this key (a retry then replays the first answer)",
            ));
            None
        }
        None if strategy == Some(Strategy::Token) => None,
        None => {
            errors.push(syn::Error::new(
                attr_span,
                "missing `key`: name the business identifier that repeats share, e.g. `key = \"event.trade_no\"`",
            ));
            None
        }
        Some(key) if key.parts.is_empty() => {
            errors.push(syn::Error::new(
                key.span,
                "the key is empty: name the business identifier that repeats share, e.g. `key = \"event.trade_no\"`",
            ));
            None
        }
        Some(key) => {
            for part in &key.parts {
                check_rooted(part, &params, fn_name, "key part", &mut errors);
            }
            Some(key)
        }
    };
    if let Some(fp) = &raw.fingerprint {
        check_rooted(fp, &params, fn_name, "fingerprint", &mut errors);
    }

    let retention_ms = match &raw.retention {
        None => None,
        Some(r) => parse_duration("retention", r.as_str(), r.span(), RETENTION_WHY).map_err(|e| errors.push(e)).ok(),
    };
    if raw.scope.is_none()
        && let Some(receiver) = sig.receiver()
    {
        errors.push(syn::Error::new_spanned(
            receiver,
            format!(
                "a method needs an explicit `scope`: the default (module path + `{fn_name}`) is the same for \
                 every type in this module with a method `{fn_name}`, and their records would replay each \
                 other's answers; add e.g. `scope = \"payments.{fn_name}\"`"
            ),
        ));
    }
    if let Some(scope) = &raw.scope
        && scope.trim().is_empty()
    {
        errors.push(syn::Error::new(
            scope.span(),
            "`scope` is empty: give the guard a stable name, e.g. \"payments.on_pay\"",
        ));
    }
    if let Some(scope) = &raw.scope
        && let Err(e) = check_scope(scope.as_str(), scope.span())
    {
        errors.push(e);
    }

    let claim_after = match &raw.claim {
        None => false,
        Some(c) if c.as_str() == "before" => false,
        Some(c) if c.as_str() == "after" && strategy.is_some_and(Strategy::moves_state) => {
            errors.push(syn::Error::new(
                c.span(),
                "`claim = \"after\"` applies to strategy `dedup` only: a state change is checked before the \
                 body runs, so that the body's effects hang off the transition; remove `claim`",
            ));
            false
        }
        Some(c) if c.as_str() == "after" && (is_token || is_lock) => {
            errors.push(syn::Error::new(
                c.span(),
                "`claim = \"after\"` applies to strategy `dedup` only: a token is spent, and a lock taken, \
                 before the body runs; remove `claim`",
            ));
            false
        }
        Some(c) if c.as_str() == "after" => true,
        Some(c) => {
            errors.push(syn::Error::new(
                c.span(),
                format!(
                    "`claim = \"{}\"`: expected \"before\" (the default: claim, run the body, store the response) \
                     or \"after\" (run the body, then write the record with its response in one statement)",
                    c.as_str()
                ),
            ));
            false
        }
    };

    let lease_ms = match &raw.lease {
        Some(l) if is_lease => match parse_duration("lease", l.as_str(), l.span(), LEASE_WHY) {
            Ok(ms) if ms < 100 => {
                errors.push(syn::Error::new(
                    l.span(),
                    format!(
                        "`lease = \"{}\"` is too short: the runtime renews a lease every third of its length, \
                         and a store round trip can take longer than that; use at least \"100ms\" (seconds are usual)",
                        l.as_str()
                    ),
                ));
                None
            }
            Ok(ms) => Some(ms),
            Err(e) => {
                errors.push(e);
                None
            }
        },
        _ => None,
    };
    let ttl_ms = match &raw.ttl {
        Some(t) if is_lock => match parse_duration("ttl", t.as_str(), t.span(), LOCK_TTL_WHY) {
            Ok(ms) if ms < 100 => {
                errors.push(syn::Error::new(
                    t.span(),
                    format!(
                        "`ttl = \"{}\"` is too short: the guard renews its lock every third of the TTL, and a \
                         store round trip can take longer than that; use at least \"100ms\" (seconds are usual)",
                        t.as_str()
                    ),
                ));
                None
            }
            Ok(ms) => Some(ms),
            Err(e) => {
                errors.push(e);
                None
            }
        },
        None if is_lock => {
            errors.push(syn::Error::new(
                raw.strategy.as_ref().map_or(attr_span, |s| s.span()),
                format!(
                    "strategy `{}` needs `ttl`: how long the lock holds if its holder dies. Make it longer than \
                     the work usually takes (the guard renews it while the body runs), e.g. `ttl = \"30s\"`",
                    strategy.map_or("lock", Strategy::name)
                ),
            ));
            None
        }
        _ => None,
    };
    if let Some(p) = &raw.precheck
        && precheck_fits
        && p.as_str() != "redis"
    {
        errors.push(syn::Error::new(
            p.span(),
            format!(
                "`precheck = \"{}\"`: the one precheck is \"redis\" (a SET NX marker per key, in the store \
                 installed with `idem::Stores`, or for `dedup` the one named by `store`)",
                p.as_str()
            ),
        ));
    }
    let ttl_ms = match &raw.ttl {
        Some(t) if precheck => {
            parse_duration("ttl", t.as_str(), t.span(), MARKER_TTL_WHY).map_err(|e| errors.push(e)).ok()
        }
        _ => ttl_ms,
    };
    let wait_ms = match &raw.wait {
        Some(w) if is_lock => parse_duration("wait", w.as_str(), w.span(), WAIT_WHY).map_err(|e| errors.push(e)).ok(),
        _ => None,
    };
    let allow_on_store_error = match &raw.on_store_error {
        Some(o) if is_token => match o.as_str() {
            "reject" => false,
            "allow" => true,
            other => {
                errors.push(syn::Error::new(
                    o.span(),
                    format!(
                        "`on_store_error = \"{other}\"`: expected \"reject\" (the default: refuse the call while \
                         the token store is down) or \"allow\" (let it through unchecked, with a unique index \
                         behind the guard as the backstop)"
                    ),
                ));
                false
            }
        },
        _ => false,
    };
    if is_lease && let Some(c) = &raw.claim {
        errors.push(syn::Error::new(
            c.span(),
            "`claim` applies to strategy `dedup` only: a lease record is always claimed before the body, \
             on its own, so that a duplicate sees it while the body runs; remove `claim`",
        ));
    }
    // No transaction check when the strategy itself is wrong: its error is
    // the one to fix first.
    let tx = match strategy {
        Some(s) if s.needs_tx() => find_tx(func, &marks.tx, s).map_err(|e| errors.push(e)).ok(),
        Some(s) => {
            // The marker would be silently ignored: say what the strategy
            // writes instead, and which one writes in the transaction.
            if let Some((ident, _)) = marks.tx.first() {
                let (writes, instead) = match s {
                    Strategy::Lease => (
                        "commits its record on its own, outside any transaction of yours (a lease guards work \
                         that cannot share one)",
                        "`dedup` writes its record in your transaction",
                    ),
                    Strategy::Token => (
                        "consumes a token in the token store, not in a transaction",
                        "`token+dedup` also writes a record in your transaction",
                    ),
                    _ => (
                        "takes a lock in the lock store and writes no record",
                        "`lock+dedup` or `lock+state` also writes in your transaction",
                    ),
                };
                errors.push(syn::Error::new(
                    ident.span(),
                    format!(
                        "`#[idem(tx)]` has no effect with strategy `{}`: it {writes}; remove the marker, or choose \
                         a strategy that uses it ({instead})",
                        s.name()
                    ),
                ));
            }
            None
        }
        None => None,
    };
    let token = match (strategy, marks.token.as_slice()) {
        (Some(s), [(ident, _)]) if s.is_token() => Some(ident.clone()),
        (Some(s), [_, (_, second), ..]) if s.is_token() => {
            errors.push(syn::Error::new(*second, "only one parameter can be `#[idem(token)]`"));
            None
        }
        (Some(s), []) if s.is_token() => {
            errors.push(syn::Error::new(
                sig.ident.span(),
                format!(
                    "strategy `{}` consumes a one-time token, but no parameter of `{fn_name}` carries it: mark \
                     it with `#[idem(token)]`, e.g. `#[idem(token)] token: &str` (the token your form got from \
                     `idem::token::issue`)",
                    s.name()
                ),
            ));
            None
        }
        (Some(s), [(_, span), ..]) => {
            errors.push(syn::Error::new(
                *span,
                format!(
                    "`#[idem(token)]` marks the one-time token of strategy `token` or `token+dedup`, and this \
                     guard is `{}`; remove the marker, or choose a token strategy",
                    s.name()
                ),
            ));
            None
        }
        _ => None,
    };

    let mut all = errors.into_iter();
    if let Some(mut first) = all.next() {
        for e in all {
            first.combine(e);
        }
        return Err(first);
    }
    let strategy = strategy.expect("no error means a strategy");
    Ok(Plan {
        strategy,
        // `token` keys on the token: the expansion adds it as the one part.
        key: key.unwrap_or(KeyArg { parts: Vec::new(), source: "<token>".to_owned(), span: attr_span }),
        scope: raw.scope.map(|s| s.as_str().to_owned()),
        fingerprint: raw.fingerprint,
        retention_ms,
        claim_after,
        transition,
        tx,
        lease_ms,
        store: raw.store.filter(|_| strategy.has_store() || precheck),
        token,
        allow_on_store_error,
        precheck,
        ttl_ms,
        wait_ms,
        ret: ret.expect("no error means a return type"),
        krate: raw.krate.unwrap_or_else(|| syn::parse_quote!(::idem)),
    })
}

fn contains_impl_trait(ty: &Type) -> bool {
    struct Finder(bool);
    impl<'ast> syn::visit::Visit<'ast> for Finder {
        fn visit_type_impl_trait(&mut self, _: &'ast syn::TypeImplTrait) {
            self.0 = true;
        }
    }
    let mut finder = Finder(false);
    syn::visit::Visit::visit_type(&mut finder, ty);
    finder.0
}

/// `ty` as a path type (`a::b::Name<..>`), seen through groups and
/// parentheses, and with `through_refs` through references too.
fn path_type(ty: &Type, through_refs: bool) -> Option<&syn::TypePath> {
    match ty {
        Type::Path(p) => Some(p),
        Type::Group(g) => path_type(&g.elem, through_refs),
        Type::Paren(p) => path_type(&p.elem, through_refs),
        Type::Reference(r) if through_refs => path_type(&r.elem, through_refs),
        _ => None,
    }
}

/// The last segment of a path type with no `<T as Trait>::` qualifier.
fn named(ty: &Type, through_refs: bool) -> Option<&syn::PathSegment> {
    path_type(ty, through_refs).filter(|p| p.qself.is_none())?.path.segments.last()
}

/// The first type argument: `T` of `Result<T, E>` (or of an alias such as
/// `io::Result<T>`), `X` of `Option<X>`.
fn first_type_arg(ty: &Type) -> Option<&Type> {
    match &path_type(ty, false)?.path.segments.last()?.arguments {
        syn::PathArguments::AngleBracketed(args) => args.args.iter().find_map(|a| match a {
            syn::GenericArgument::Type(t) => Some(t),
            _ => None,
        }),
        _ => None,
    }
}

/// `Option<X>` with the `X` inside, if `ty` is written so.
fn option_inner(ty: &Type) -> Option<&Type> {
    named(ty, false).filter(|s| s.ident == "Option").and_then(|_| first_type_arg(ty))
}

/// An `Ok` type JSON cannot replay exactly, as written: `Option<()>` and
/// `Option<Option<T>>`, whose `Some(())` / `Some(None)` JSON writes as
/// `null`, like `None`. (Other shapes, hidden behind aliases or inside
/// structs, are refused by the runtime on the first call that returns one.)
fn lossy_ok_type(ret: &Type) -> Option<syn::Error> {
    let ok = first_type_arg(ret)?;
    let inner = option_inner(ok)?;
    let message = match inner {
        Type::Tuple(t) if t.elems.is_empty() => {
            "`Option<()>` cannot be replayed exactly: JSON writes `Some(())` as `null`, like `None`, so a \
             repeat of a `Some(())` answer would get `None`; return `bool` instead"
        }
        t if option_inner(t).is_some() => {
            "`Option<Option<T>>` cannot be replayed exactly: JSON writes `Some(None)` as `null`, like `None`, \
             so a repeat of a `Some(None)` answer would get `None`; return an enum of your own with three variants"
        }
        _ => return None,
    };
    Some(syn::Error::new_spanned(ok, message))
}

fn is_result(ty: &Type) -> bool {
    named(ty, false).is_some_and(|s| s.ident == "Result")
}

/// Where `ty` names `sqlx::Error` as its error type: `Result<T, sqlx::Error>`
/// (the error argument), or sqlx's alias `sqlx::Result<T>` (the whole type).
fn sqlx_error(ty: &Type) -> Option<&dyn ToTokens> {
    let path = &path_type(ty, false)?.path;
    // `sqlx::Error`, `sqlx::error::Error`, `::sqlx::Result`.
    let is_sqlx = |p: &syn::Path, last: &str| {
        let names: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        names.len() >= 2 && names[0] == "sqlx" && names[names.len() - 1] == last
    };
    let args: Vec<&Type> = match &path.segments.last()?.arguments {
        syn::PathArguments::AngleBracketed(args) => args
            .args
            .iter()
            .filter_map(|a| match a {
                syn::GenericArgument::Type(t) => Some(t),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    match args.as_slice() {
        [_] if is_sqlx(path, "Result") => Some(ty),
        [_, err] if path_type(err, false).is_some_and(|p| p.qself.is_none() && is_sqlx(&p.path, "Error")) => Some(*err),
        _ => None,
    }
}

fn parse_strategy(name: &str, span: Span) -> Result<Strategy, syn::Error> {
    let normalized: String = name.chars().filter(|c| !c.is_whitespace()).collect();
    match STRATEGIES.iter().find(|(n, _)| *n == normalized) {
        Some((_, s)) => Ok(*s),
        None if normalized.contains("dedup") && normalized.contains("lease") => Err(syn::Error::new(
            span,
            "`dedup` and `lease` contradict each other: `dedup` writes its record in your transaction \
             (work inside one database), `lease` guards work outside a transaction (an external API call). \
             Choose one",
        )),
        None => {
            let best = STRATEGIES
                .iter()
                .map(|(n, _)| (strsim::damerau_levenshtein(&normalized, n), *n))
                .min()
                .filter(|(d, _)| *d <= 3);
            let all = STRATEGIES.iter().map(|(n, _)| format!("`{n}`")).collect::<Vec<_>>().join(", ");
            let hint = best.map(|(_, n)| format!("did you mean `{n}`? ")).unwrap_or_default();
            Err(syn::Error::new(span, format!("unknown strategy `{name}`; {hint}strategies are {all}")))
        }
    }
}

/// `"A::X | A::Y -> A::Z"`: sources and target, variants of one enum.
fn parse_transition(text: &str, span: Span) -> Result<TransitionArg, syn::Error> {
    const FORM: &str = "write it as `\"OrderStatus::WaitPay -> OrderStatus::Paid\"`, several sources joined by `|`";
    let fail = |what: String| syn::Error::new(span, format!("`transition = \"{text}\"` {what}; {FORM}"));
    let Some((left, right)) = text.split_once("->") else {
        return Err(fail("has no `->` between the source and the target state".to_owned()));
    };
    if right.contains("->") {
        return Err(fail("has more than one `->`: a transition goes from its source(s) to one target".to_owned()));
    }
    let variant = |part: &str| -> Result<(syn::Path, Ident), syn::Error> {
        let part = part.trim();
        if part.is_empty() {
            return Err(fail("is missing a state".to_owned()));
        }
        let path: syn::Path = syn::parse_str(part).map_err(|_| fail(format!("has `{part}`, which is not a path")))?;
        if path.segments.len() < 2 || path.segments.iter().any(|s| !s.arguments.is_none()) {
            return Err(fail(format!(
                "has `{part}`: name each state with its enum, e.g. `OrderStatus::{}`",
                path.segments.last().map(|s| s.ident.to_string()).unwrap_or_default()
            )));
        }
        let n = path.segments.len();
        let last = path.segments[n - 1].ident.clone();
        let prefix = syn::Path {
            leading_colon: path.leading_colon,
            segments: path.segments.iter().take(n - 1).cloned().collect(),
        };
        Ok((prefix, last))
    };
    let (enum_path, to) = variant(right)?;
    let mut from = Vec::new();
    for part in left.split('|') {
        let (p, v) = variant(part)?;
        if quote::quote!(#p).to_string() != quote::quote!(#enum_path).to_string() {
            return Err(fail(format!(
                "mixes `{}` and `{}`: a transition moves one status enum",
                quote::quote!(#p),
                quote::quote!(#enum_path)
            )));
        }
        if v == to {
            return Err(fail(format!("goes from `{v}` to itself: a repeat of it could not be told from a first call")));
        }
        if !from.contains(&v) {
            from.push(v);
        }
    }
    Ok(TransitionArg { enum_path, from, to, span })
}

/// The longest duration any argument takes: 100 years as humantime counts
/// them (`"100y"`, 365.25 days each, so `"36500d"` fits too). Every store
/// holds an expiry that far out with a wide margin: the tightest is MySQL,
/// whose `DATETIME(6)` columns end in year 9999 (now + the duration); then
/// PostgreSQL's `interval` and `timestamptz` (i64 microseconds, year 294276),
/// Redis `PX` and SQLite's epoch milliseconds (i64); the memory stores
/// saturate.
const MAX_DURATION: std::time::Duration = std::time::Duration::from_secs(100 * 31_557_600);

/// A scope names a guard's records wherever they are kept (any text is
/// safe there: stores escape or hash it), and people read it in logs, in
/// `idem_records` and in Redis keys. An empty one names nothing, and a
/// control character (a newline, a tab, NUL) is a slip nobody could read
/// back or type in a query.
fn check_scope(scope: &str, span: Span) -> Result<(), syn::Error> {
    let problem = if scope.trim().is_empty() {
        "is empty".to_owned()
    } else if let Some(c) = scope.chars().find(|c| c.is_control()) {
        format!("contains the control character `{}`", c.escape_default())
    } else {
        return Ok(());
    };
    Err(syn::Error::new(
        span,
        format!(
            "`scope = \"{}\"` {problem}: a scope is a name people read in logs and queries\n\
             help: use letters, digits and punctuation, e.g. \"payments.on_pay\"",
            scope.escape_default()
        ),
    ))
}

/// A duration argument such as `"30s"` or `"7d"`, refusing zero and anything
/// over [`MAX_DURATION`]. `why` says how long the argument usually needs to be.
pub fn parse_duration(arg: &str, text: &str, span: Span, why: &str) -> Result<u64, syn::Error> {
    let d = humantime::parse_duration(text).map_err(|e| {
        syn::Error::new(
            span,
            format!("`{arg} = \"{text}\"` is not a duration ({e}); write e.g. \"30s\", \"15m\", \"24h\", \"7d\""),
        )
    })?;
    if d.is_zero() {
        return Err(syn::Error::new(span, format!("`{arg}` must be longer than zero")));
    }
    if d.as_millis() == 0 {
        return Err(syn::Error::new(
            span,
            format!("`{arg} = \"{text}\"` is under a millisecond, the stores' resolution"),
        ));
    }
    if d > MAX_DURATION {
        return Err(syn::Error::new(
            span,
            format!(
                "`{arg} = \"{text}\"` is longer than 100 years, the maximum of every idem duration: {why}; use at \
                 most \"100y\" (or \"36500d\")"
            ),
        ));
    }
    u64::try_from(d.as_millis()).map_err(|_| syn::Error::new(span, format!("`{arg}` is too long")))
}

fn param_names(func: &ItemFn) -> Vec<String> {
    func.sig
        .inputs
        .iter()
        .filter_map(|input| match input {
            FnArg::Receiver(_) => Some("self".to_owned()),
            FnArg::Typed(pt) => match &*pt.pat {
                Pat::Ident(pi) => Some(pi.ident.to_string()),
                _ => None,
            },
        })
        .collect()
}

/// The parameter an expression is reached from: `event` in `event.trade_no`,
/// `req` in `req.id().to_string()`.
fn root(expr: &Expr) -> Result<(String, Span), Span> {
    match expr {
        Expr::Path(p) if p.qself.is_none() && p.path.segments.len() == 1 => {
            let seg = &p.path.segments[0];
            Ok((seg.ident.to_string(), seg.ident.span()))
        }
        Expr::Field(f) => root(&f.base),
        Expr::MethodCall(m) => root(&m.receiver),
        Expr::Index(i) => root(&i.expr),
        Expr::Reference(r) => root(&r.expr),
        Expr::Paren(p) => root(&p.expr),
        Expr::Group(g) => root(&g.expr),
        Expr::Unary(u) => root(&u.expr),
        Expr::Cast(c) => root(&c.expr),
        Expr::Try(t) => root(&t.expr),
        other => Err(other.span()),
    }
}

fn check_rooted(expr: &Expr, params: &[String], fn_name: &Ident, what: &str, errors: &mut Vec<syn::Error>) {
    let listed = params.iter().map(|p| format!("`{p}`")).collect::<Vec<_>>().join(", ");
    match root(expr) {
        Ok((name, _)) if params.contains(&name) => {}
        Ok((name, span)) => errors.push(syn::Error::new(
            span,
            format!(
                "`{name}` is not a parameter of `{fn_name}`: a {what} must come from the call's own arguments \
                 ({listed}), so that every repeat of one request computes the same value"
            ),
        )),
        Err(span) => errors.push(syn::Error::new(
            span,
            format!(
                "a {what} must be a parameter or reached from one (`event.trade_no`, `req.id()`), not `{}`; \
                 the parameters are {listed}",
                expr.to_token_stream()
            ),
        )),
    }
}

/// The parameter the record is written through.
fn find_tx(func: &ItemFn, marked: &[(Ident, Span)], strategy: Strategy) -> Result<(Ident, Type), syn::Error> {
    let sig = &func.sig;
    if marked.len() > 1 {
        return Err(syn::Error::new(marked[1].1, "only one parameter can be `#[idem(tx)]`"));
    }
    let mut by_type = Vec::new();
    let mut not_a_tx = None;
    for input in &sig.inputs {
        let FnArg::Typed(pt) = input else { continue };
        let Pat::Ident(pi) = &*pt.pat else { continue };
        if not_a_tx.is_none() {
            not_a_tx = connection_or_pool(&pt.ty).map(|what| (pi.ident.clone(), &pt.ty, what));
        }
        if let Some((ident, _)) = marked.first() {
            if *ident == pi.ident {
                return require_mut_ref(&pt.ty).map(|()| (pi.ident.clone(), referent(&pt.ty)));
            }
            continue;
        }
        if names_transaction(&pt.ty) {
            by_type.push((pi.ident.clone(), &pt.ty));
        }
    }
    let doing = match strategy {
        Strategy::State | Strategy::LockState => "moves the entity's status in your transaction",
        Strategy::DedupState => "writes its record and moves the entity's status in your transaction",
        _ => "writes its record in your transaction",
    };
    match by_type.as_slice() {
        [(ident, ty)] => require_mut_ref(ty).map(|()| (ident.clone(), referent(ty))),
        [] if marked.is_empty()
            && let Some((ident, ty, what)) = not_a_tx =>
        {
            Err(syn::Error::new_spanned(
                ty,
                format!(
                    "`{ident}` is {what}, not a transaction: strategy `{}` {doing}, so that it commits or \
                     rolls back with your change; take `{ident}: &mut sqlx::Transaction<'_, DB>` (from \
                     `pool.begin()`) instead, and commit it after the call (a transaction type of your own: mark \
                     that parameter `#[idem(tx)]`)",
                    strategy.name()
                ),
            ))
        }
        [] => Err(syn::Error::new(
            sig.ident.span(),
            format!(
                "strategy `{}` {doing}, but no parameter of `{}` is one idem knows as a transaction \
                 (`&mut sqlx::Transaction<'_, DB>`, `&mut sqlx::PgTransaction<'_>` and the like): add a parameter \
                 `tx: &mut sqlx::Transaction<'_, DB>`, or mark yours with `#[idem(tx)]` if it is one under another \
                 name (a type alias; a wrapper of your own implementing `idem::TxContext`), so {} with your change",
                strategy.name(),
                sig.ident,
                if strategy.moves_state() {
                    "the status change commits or rolls back"
                } else {
                    "the record commits or rolls back"
                }
            ),
        )),
        [_, (second, _), ..] => Err(syn::Error::new(
            second.span(),
            "several transaction parameters: mark the one the dedup record belongs in with `#[idem(tx)]`",
        )),
    }
}

/// `T` of `&mut T`: where errors about the transaction's type point.
fn referent(ty: &Type) -> Type {
    match ty {
        Type::Reference(r) => (*r.elem).clone(),
        other => other.clone(),
    }
}

/// "a connection" or "a pool", if `ty` names one of sqlx's (by its last
/// path segment, behind any references).
fn connection_or_pool(ty: &Type) -> Option<&'static str> {
    match path_type(ty, true)?.path.segments.last()?.ident.to_string().as_str() {
        "PgConnection" | "MySqlConnection" | "SqliteConnection" | "AnyConnection" | "PoolConnection" => {
            Some("a connection")
        }
        "Pool" | "PgPool" | "MySqlPool" | "SqlitePool" | "AnyPool" => Some("a pool"),
        _ => None,
    }
}

/// `Transaction<'_, DB>`, or one of sqlx's aliases for it.
fn names_transaction(ty: &Type) -> bool {
    path_type(ty, true).and_then(|p| p.path.segments.last()).is_some_and(|s| {
        s.ident == "Transaction"
            || s.ident == "PgTransaction"
            || s.ident == "MySqlTransaction"
            || s.ident == "SqliteTransaction"
    })
}

fn require_mut_ref(ty: &Type) -> Result<(), syn::Error> {
    match ty {
        Type::Reference(r) if r.mutability.is_some() => Ok(()),
        Type::Group(g) => require_mut_ref(&g.elem),
        _ => Err(syn::Error::new_spanned(
            ty,
            "take the transaction as `&mut`: the guard writes the record before your body and its response \
             after it, in this same transaction (e.g. `tx: &mut sqlx::Transaction<'_, Postgres>`)",
        )),
    }
}
