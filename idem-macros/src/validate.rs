//! Every compile-time rule of `#[idempotent]`, each error at the offending
//! token with a message that says what to do. Errors accumulate, so one build
//! shows all of them.

use proc_macro2::Span;
use quote::ToTokens;
use syn::spanned::Spanned;
use syn::{Expr, FnArg, Ident, ItemFn, Pat, ReturnType, Type};

use crate::args::{KeyArg, RawArgs};

/// Every strategy DESIGN.md names, with whether this version implements it.
const STRATEGIES: &[(&str, bool)] = &[
    ("dedup", true),
    ("state", true),
    ("dedup+state", true),
    ("token", false),
    ("token+dedup", false),
    ("lock+dedup", false),
    ("lock+state", false),
    ("lease", true),
    ("lock", false),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    Dedup,
    State,
    DedupState,
    Lease,
}

impl Strategy {
    fn name(self) -> &'static str {
        match self {
            Strategy::Dedup => "dedup",
            Strategy::State => "state",
            Strategy::DedupState => "dedup+state",
            Strategy::Lease => "lease",
        }
    }

    fn moves_state(self) -> bool {
        matches!(self, Strategy::State | Strategy::DedupState)
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
    /// `lease`: the store expression (`None`: the installed store).
    pub store: Option<Expr>,
    pub ret: Type,
}

/// Parameters marked `#[idem(...)]`, found (and stripped) before validation so
/// that the function can be emitted unchanged even when validation fails.
pub struct Marks {
    pub tx: Vec<(Ident, Span)>,
    pub errors: Vec<syn::Error>,
}

/// Remove `#[idem(...)]` from the parameters, remembering what they marked.
pub fn strip_marks(func: &mut ItemFn) -> Marks {
    let mut marks = Marks { tx: Vec::new(), errors: Vec::new() };
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
                Ok(word) if word == "tx" => match &*pt.pat {
                    Pat::Ident(pi) => marks.tx.push((pi.ident.clone(), attr.span())),
                    other => marks.errors.push(syn::Error::new_spanned(
                        other,
                        "name the transaction parameter (e.g. `tx`): the guard passes it to the store",
                    )),
                },
                Ok(word) => marks.errors.push(syn::Error::new_spanned(
                    &word,
                    format!("unknown parameter marker `{word}`; `#[idem(tx)]` marks the transaction the record is written in"),
                )),
                Err(_) => marks.errors.push(syn::Error::new_spanned(
                    &attr,
                    "expected `#[idem(tx)]`, marking the transaction the record is written in",
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
        ReturnType::Type(_, ty) if is_result(ty) => Some((**ty).clone()),
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

    // Arguments that belong to other strategies.
    let is_lease = strategy == Some(Strategy::Lease);
    let foreign: [(&str, Option<Span>); 6] = [
        (
            "transition",
            raw.transition.as_ref().filter(|_| !strategy.is_some_and(Strategy::moves_state)).map(|v| v.span()),
        ),
        ("ttl", raw.ttl.as_ref().map(|v| v.span())),
        ("lease", raw.lease.as_ref().filter(|_| !is_lease).map(|v| v.span())),
        ("store", raw.store.as_ref().filter(|_| !is_lease).map(|v| v.span())),
        ("precheck", raw.precheck.as_ref().map(|v| v.span())),
        ("concurrency_only", raw.concurrency_only.as_ref().map(|v| v.span())),
    ];
    if let Some(strategy) = strategy {
        let name = strategy.name();
        for (arg, span) in foreign {
            let Some(span) = span else { continue };
            let hint = match arg {
                "lease" => format!(
                    "`{name}` works in your transaction, so it needs no lease; `lease` is for work outside a \
                     transaction (strategy = \"lease\"). Remove one of them"
                ),
                "transition" => "a transition is made by strategy `state` or `dedup+state`; remove it, or choose \
                                 one of those"
                    .to_owned(),
                "store" => "the record is written in your transaction; `store` names where a `lease` record lives \
                            (strategy = \"lease\", for work outside a transaction). Remove one of them"
                    .to_owned(),
                _ => "remove it, or choose the strategy it belongs to".to_owned(),
            };
            errors.push(syn::Error::new(span, format!("`{arg}` has no meaning for strategy `{name}`: {hint}")));
        }
    }
    // `state` alone keeps no record: nothing to fingerprint or retain.
    if strategy == Some(Strategy::State) {
        let recordless = [
            ("fingerprint", raw.fingerprint.as_ref().map(|f| f.span())),
            ("retention", raw.retention.as_ref().map(|r| r.span())),
        ];
        for (arg, span) in recordless {
            let Some(span) = span else { continue };
            errors.push(syn::Error::new(
                span,
                format!(
                    "`{arg}` needs a dedup record, and strategy `state` keeps none (the entity's status is its \
                     only memory); use strategy = \"dedup+state\" to keep a record too, or remove `{arg}`"
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

    let params = param_names(func);
    let key = match raw.key {
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
        Some(r) => parse_duration("retention", r.as_str(), r.span()).map_err(|e| errors.push(e)).ok(),
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
        Some(l) if is_lease => match parse_duration("lease", l.as_str(), l.span()) {
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
        Some(Strategy::Lease) | None => None,
        Some(s) => find_tx(func, &marks.tx, s).map_err(|e| errors.push(e)).ok(),
    };

    let mut all = errors.into_iter();
    if let Some(mut first) = all.next() {
        for e in all {
            first.combine(e);
        }
        return Err(first);
    }
    Ok(Plan {
        strategy: strategy.expect("no error means a strategy"),
        key: key.expect("no error means a key"),
        scope: raw.scope.map(|s| s.as_str().to_owned()),
        fingerprint: raw.fingerprint,
        retention_ms,
        claim_after,
        transition,
        tx,
        lease_ms,
        store: raw.store.filter(|_| is_lease),
        ret: ret.expect("no error means a return type"),
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

fn is_result(ty: &Type) -> bool {
    match ty {
        Type::Path(p) => p.qself.is_none() && p.path.segments.last().is_some_and(|s| s.ident == "Result"),
        Type::Group(g) => is_result(&g.elem),
        Type::Paren(p) => is_result(&p.elem),
        _ => false,
    }
}

fn parse_strategy(name: &str, span: Span) -> Result<Strategy, syn::Error> {
    let normalized: String = name.chars().filter(|c| !c.is_whitespace()).collect();
    match STRATEGIES.iter().find(|(n, _)| *n == normalized) {
        Some(("dedup", true)) => Ok(Strategy::Dedup),
        Some(("state", true)) => Ok(Strategy::State),
        Some(("dedup+state", true)) => Ok(Strategy::DedupState),
        Some(("lease", true)) => Ok(Strategy::Lease),
        Some((n, true)) => unreachable!("strategy `{n}` is marked available but has no Strategy variant"),
        Some((n, false)) => {
            let available = STRATEGIES.iter().filter(|(_, a)| *a).map(|(n, _)| format!("`{n}`")).collect::<Vec<_>>();
            Err(syn::Error::new(
                span,
                format!("strategy `{n}` is not available in this version of idem; {} are", available.join(", ")),
            ))
        }
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

/// A duration argument such as `"30s"` or `"7d"`, refusing zero.
pub fn parse_duration(arg: &str, text: &str, span: Span) -> Result<u64, syn::Error> {
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
    for input in &sig.inputs {
        let FnArg::Typed(pt) = input else { continue };
        let Pat::Ident(pi) = &*pt.pat else { continue };
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
    match by_type.as_slice() {
        [(ident, ty)] => require_mut_ref(ty).map(|()| (ident.clone(), referent(ty))),
        [] => Err(syn::Error::new(
            sig.ident.span(),
            format!(
                "strategy `{}` {}, but `{}` takes none: add a parameter `tx: &mut sqlx::Transaction<'_, DB>` \
                 (or mark yours with `#[idem(tx)]`) so {} with your change",
                strategy.name(),
                match strategy {
                    Strategy::Dedup | Strategy::Lease => "writes its record in your transaction",
                    Strategy::State => "moves the entity's status in your transaction",
                    Strategy::DedupState => "writes its record and moves the entity's status in your transaction",
                },
                sig.ident,
                match strategy {
                    Strategy::Dedup => "the record commits or rolls back",
                    _ => "the status change commits or rolls back",
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

fn names_transaction(ty: &Type) -> bool {
    match ty {
        Type::Reference(r) => names_transaction(&r.elem),
        Type::Path(p) => p.path.segments.last().is_some_and(|s| s.ident == "Transaction"),
        Type::Group(g) => names_transaction(&g.elem),
        Type::Paren(p) => names_transaction(&p.elem),
        _ => false,
    }
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
