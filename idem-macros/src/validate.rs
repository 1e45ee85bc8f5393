//! Every compile-time rule of `#[idempotent]`, one `check_*` function each,
//! all pushing into one [`Errors`] accumulator, so one build shows every
//! mistake. Rules that depend on the strategy read its row of the strategy
//! table (`strategy.rs`); rules about the function itself live in
//! `signature.rs`, about text values in `values.rs`. The result is a
//! [`Plan`] for `expand.rs`.

use darling::util::SpannedValue;
use proc_macro2::Span;
use quote::ToTokens;
use syn::spanned::Spanned;
use syn::{Expr, Ident, ItemFn, Type};

use crate::args::{KeyArg, RawArgs};
use crate::errors::{Errors, did_you_mean, listed};
use crate::signature::{self, Marks};
pub use crate::strategy::Strategy;
use crate::strategy::{Claim, Precheck, Record, SOURCES, STRATEGIES, Spec, Tx, Use};
pub use crate::values::TransitionArg;
use crate::values::{self, DurationRule, LEASE, LOCK_TTL, MARKER_TTL, RETENTION, WAIT};

/// A validated attribute: everything the expansion needs.
pub struct Plan {
    pub strategy: Strategy,
    pub key: KeyArg,
    pub scope: Option<String>,
    pub fingerprint: Option<Expr>,
    /// `None`: the runtime's `DEFAULT_RETENTION`.
    pub retention_ms: Option<u64>,
    /// `claim = "after"` or `"commit"`: the builder method that says so.
    pub claim: Option<&'static str>,
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
    /// `lease` with `steps = "name"`: the step log's binding in the body.
    pub steps: Option<Ident>,
    /// `outbox = "name"`: the outbox handle's binding in the body.
    pub outbox: Option<Ident>,
    /// `unique` and `unique+state`: the constraint, the replay function
    /// and whether a savepoint is taken.
    pub unique: Option<UniquePlan>,
    pub ret: Type,
    /// Where the `idem` crate is (`crate = "..."`, default `::idem`).
    pub krate: syn::Path,
}

/// What `unique` needs beyond the other strategies.
pub struct UniquePlan {
    pub constraint: String,
    /// The replay function, every token at the `replay` argument's span.
    pub replay: Expr,
    pub savepoint: bool,
}

/// What every check reads: the arguments as written, the function, and the
/// strategy's row (`None` when the strategy itself is wrong: the rules that
/// depend on it are skipped, its error is the one to fix first).
struct Input<'a> {
    raw: &'a RawArgs,
    func: &'a ItemFn,
    spec: Option<&'static Spec>,
    attr_span: Span,
}

impl Input<'_> {
    /// Where "strategy X needs Y" points: the strategy, or the attribute.
    fn strategy_span(&self) -> Span {
        self.raw.strategy.as_ref().map_or(self.attr_span, |s| s.span())
    }

    /// `precheck` is given and fits the strategy: then `ttl` and `store`
    /// belong to it.
    fn precheck(&self) -> bool {
        self.raw.precheck.is_some() && self.spec.is_some_and(|s| s.precheck == Precheck::Fits)
    }
}

/// The values the checks computed, for the plan.
struct Checked {
    transition: Option<TransitionArg>,
    lease_ms: Option<u64>,
    ttl_ms: Option<u64>,
    wait_ms: Option<u64>,
    allow_on_store_error: bool,
    tx: Option<(Ident, Type)>,
    token: Option<Ident>,
    unique: Option<UniquePlan>,
}

/// Check the attribute and the function; `None` if anything is wrong (the
/// errors are in `errors`, which may hold some already, e.g. from the marks).
pub fn validate(raw: RawArgs, attr_span: Span, func: &ItemFn, marks: &Marks, errors: &mut Errors) -> Option<Plan> {
    let spec = check_strategy(&raw, errors);
    let input = Input { raw: &raw, func, spec, attr_span };
    signature::check_async(&func.sig, errors);
    let ret = signature::check_return_type(&func.sig, errors);
    let checked = spec.map(|spec| check_for_strategy(&input, spec, ret.as_ref(), marks, errors));
    check_key(&input, errors);
    if let Some(fp) = &raw.fingerprint {
        signature::check_rooted(&fp.0, &func.sig, "fingerprint", errors);
    }
    let retention_ms = raw.retention.as_ref().and_then(|r| check_duration(r, &RETENTION, errors));
    check_scope(&input, errors);
    check_method_scope(&input, errors);
    let claim = check_claim(&input, errors);
    let steps = spec.and_then(|spec| check_steps(&input, spec, errors));
    let outbox = spec.and_then(|spec| check_outbox(&input, spec, errors));
    let (Some(spec), Some(checked), Some(ret), true) = (spec, checked, ret, errors.is_empty()) else { return None };
    let precheck = input.precheck();
    Some(Plan {
        strategy: spec.strategy,
        // `token` keys on the token: the expansion adds it as the one part;
        // `unique` without one on its constraint (the runtime adds it).
        key: raw.key.unwrap_or_else(|| {
            let source = if spec.strategy == Strategy::Token { "<token>" } else { "key" };
            KeyArg { parts: Vec::new(), source: source.to_owned(), span: attr_span }
        }),
        scope: raw.scope.map(|s| s.as_str().to_owned()),
        fingerprint: raw.fingerprint.map(|fp| fp.0),
        retention_ms,
        claim,
        transition: checked.transition,
        tx: checked.tx,
        lease_ms: checked.lease_ms,
        store: raw.store.map(|s| s.0).filter(|_| spec.store.is_some() || precheck),
        token: checked.token,
        allow_on_store_error: checked.allow_on_store_error,
        precheck,
        ttl_ms: checked.ttl_ms,
        wait_ms: checked.wait_ms,
        steps,
        outbox,
        unique: checked.unique,
        ret,
        krate: raw.krate.unwrap_or_else(|| syn::parse_quote!(::idem)),
    })
}

/// The rules that depend on the strategy, in the order their errors show.
fn check_for_strategy(
    input: &Input,
    spec: &'static Spec,
    ret: Option<&Type>,
    marks: &Marks,
    errors: &mut Errors,
) -> Checked {
    let (raw, sig) = (input.raw, &input.func.sig);
    if let Some(ret) = ret {
        signature::check_replayable_ok(ret, spec, errors);
    }
    check_allowed(input, spec, errors);
    check_record_arguments(input, spec, errors);
    let transition = check_transition(input, spec, errors);
    check_source(input, spec, errors);
    check_required_scope(input, spec, errors);
    check_concurrency_only(input, spec, errors);
    let lease_ms = allowed(raw.lease.as_ref(), spec.lease).and_then(|l| check_duration(l, &LEASE, errors));
    let ttl_ms = check_ttl(input, spec, errors);
    check_precheck(input, errors);
    let wait_ms = allowed(raw.wait.as_ref(), spec.wait).and_then(|w| check_duration(w, &WAIT, errors));
    let allow_on_store_error = check_on_store_error(input, spec, errors);
    let tx = signature::check_tx(input.func, &marks.tx, spec, errors);
    let token = signature::check_token_param(sig, &marks.token, spec, errors);
    let unique = check_unique(input, spec, errors);
    Checked { transition, lease_ms, ttl_ms, wait_ms, allow_on_store_error, tx, token, unique }
}

/// `value`, if the strategy gives its argument a meaning (if not,
/// `check_allowed` said so).
fn allowed<T>(value: Option<T>, rule: Use) -> Option<T> {
    value.filter(|_| rule != Use::Refused)
}

/// `strategy = "..."`, one of the table's (default `dedup`).
fn check_strategy(raw: &RawArgs, errors: &mut Errors) -> Option<&'static Spec> {
    let Some(name) = &raw.strategy else { return Some(Strategy::Dedup.spec()) };
    if let Some(spec) = Spec::find(name.as_str()) {
        return Some(spec);
    }
    let normalized = name.replace(char::is_whitespace, "");
    if normalized.contains("dedup") && normalized.contains("lease") {
        let what = "`dedup` and `lease` do not combine: `dedup` works in your transaction, `lease` outside one";
        let help = "choose `dedup` for work inside one database, `lease` for work outside (an external API call)";
        errors.at(name.span(), what, help);
        return None;
    }
    let all = listed(STRATEGIES.iter().map(|s| s.name));
    let help = match did_you_mean(&normalized, STRATEGIES.iter().map(|s| s.name)) {
        Some(close) => format!("did you mean `{close}`?"),
        None => format!("the strategies are {all}"),
    };
    errors.at(name.span(), format!("unknown strategy `{}`", name.as_str()), help);
    None
}

/// Arguments the strategy gives no meaning: each one's span if given, and
/// whether the strategy's row allows it.
fn check_allowed(input: &Input, spec: &Spec, errors: &mut Errors) {
    let raw = input.raw;
    let precheck = input.precheck();
    let arguments = [
        ("transition", raw.transition.as_ref().map(|v| v.span()), spec.transition != Use::Refused),
        ("ttl", raw.ttl.as_ref().map(|v| v.span()), spec.ttl != Use::Refused || precheck),
        ("lease", raw.lease.as_ref().map(|v| v.span()), spec.lease != Use::Refused),
        ("store", raw.store.as_ref().map(|v| v.0.span()), spec.store.is_some() || precheck),
        ("precheck", raw.precheck.as_ref().map(|v| v.span()), spec.precheck == Precheck::Fits),
        ("concurrency_only", raw.concurrency_only.as_ref().map(|v| v.span()), spec.concurrency_only != Use::Refused),
        ("wait", raw.wait.as_ref().map(|v| v.span()), spec.wait != Use::Refused),
        ("on_store_error", raw.on_store_error.as_ref().map(|v| v.span()), spec.on_store_error != Use::Refused),
        ("constraint", raw.constraint.as_ref().map(|v| v.span()), spec.unique != Use::Refused),
        ("replay", raw.replay.as_ref().map(|v| v.0.span()), spec.unique != Use::Refused),
        ("savepoint", raw.savepoint.as_ref().map(|v| v.span()), spec.unique != Use::Refused),
    ];
    for (arg, span, allowed) in arguments {
        if let (Some(span), false) = (span, allowed) {
            let (why, help) = why_not(arg, spec);
            let why = why.map(|w| format!(": {w}")).unwrap_or_default();
            errors.at(span, format!("`{arg}` has no meaning for strategy `{}`{why}", spec.name), help);
        }
    }
}

/// Why `arg` has no meaning for `spec`, if that takes more than naming the
/// strategy, and what to do instead.
fn why_not(arg: &str, spec: &Spec) -> (Option<&'static str>, String) {
    let help = match arg {
        "precheck" => match spec.precheck {
            Precheck::Refused { why, help } => return (Some(why), help.to_owned()),
            Precheck::Fits => "",
        },
        "lease" if spec.ttl == Use::Required => "a lock's length is its `ttl`: write `ttl = \"30s\"` instead",
        "lease" => "`lease` is for work outside a transaction (strategy = \"lease\"): remove one of them",
        "ttl" if spec.lease != Use::Refused => "a lease's length is `lease`: write `lease = \"30s\"` instead",
        "ttl" if spec.token_param == Use::Required => "a token's TTL is given to `idem::token::issue`: remove `ttl`",
        "ttl" => "`ttl` is a lock's (`lock+...`) or a precheck marker's: remove it",
        "transition" => "a transition is made by strategy `state`, `dedup+state` or `lock+state`: remove it",
        "store" => "`store` names where a lease, token, lock or precheck marker lives: remove it",
        "concurrency_only" if spec.store == Some("lock") => {
            let part = spec.name.trim_start_matches("lock+");
            return (None, format!("`{}` already stops repeats (its `{part}` part): remove it", spec.name));
        }
        "concurrency_only" => "`concurrency_only = true` goes with strategy `lock`: remove it",
        "constraint" | "replay" | "savepoint" => {
            "`constraint`, `replay` and `savepoint` go with strategy `unique` (the body's own insert is the claim): \
             remove it"
        }
        "wait" => "`wait` is how long a `lease` or lock guard waits for the call that holds its key: remove it",
        _ => "`on_store_error` is what a token guard does while its store is down: remove it",
    };
    (None, help.to_owned())
}

/// `fingerprint` and `retention` need a dedup record.
fn check_record_arguments(input: &Input, spec: &Spec, errors: &mut Errors) {
    let Record::None { instead } = spec.record else { return };
    let raw = input.raw;
    let recordless = [
        ("fingerprint", raw.fingerprint.as_ref().map(|f| f.0.span())),
        ("retention", raw.retention.as_ref().map(|r| r.span())),
    ];
    for (arg, span) in recordless {
        if let Some(span) = span {
            let what = format!("`{arg}` needs a dedup record, and strategy `{}` keeps none", spec.name);
            errors.at(span, what, format!("use {instead} to keep one, or remove `{arg}`"));
        }
    }
}

/// `transition`, for a strategy that moves a status.
fn check_transition(input: &Input, spec: &Spec, errors: &mut Errors) -> Option<TransitionArg> {
    match (spec.transition, &input.raw.transition) {
        (Use::Required, None) => {
            let what = format!("strategy `{}` needs `transition`, the status change this call makes", spec.name);
            errors.at(
                input.strategy_span(),
                what,
                "add e.g. `transition = \"OrderStatus::WaitPay -> OrderStatus::Paid\"`",
            );
            None
        }
        (Use::Refused, _) | (_, None) => None,
        (_, Some(t)) => errors.handle(values::parse_transition(t.as_str(), t.span())),
    }
}

/// `source = "..."`: a known one, and one the strategy serves.
fn check_source(input: &Input, spec: &Spec, errors: &mut Errors) {
    let Some(source) = &input.raw.source else { return };
    let source_str = source.as_str();
    if !SOURCES.contains(&source_str) {
        let help = "use \"frontend\", \"callback\", \"mq\" or \"rpc\"";
        return errors.at(source.span(), format!("unknown source `{source_str}`"), help);
    }
    if spec.sources.contains(&source_str) {
        return;
    }
    let (who, instead) = match source_str {
        "callback" => ("a payment gateway repeats its callback", "`dedup` on the trade number, or `dedup+state`"),
        "mq" => ("a message broker redelivers a message", "`dedup` on the message's business key"),
        _ => ("an RPC framework retries a call", "`dedup` on the request id"),
    };
    let what = format!("`source = \"{source_str}\"` carries no one-time token: {who} as it was");
    errors.at(source.span(), what, format!("use {instead}, or `state` where the call moves a status"));
}

/// Tokens are issued for a scope (`idem::token::issue(store, scope, ttl)`),
/// so the guard must say which: a default derived from the module path would
/// silently change when the function moves.
fn check_required_scope(input: &Input, spec: &Spec, errors: &mut Errors) {
    if spec.scope == Use::Required && input.raw.scope.is_none() {
        let what = format!("strategy `{}` needs an explicit `scope`: tokens are issued for one", spec.name);
        let help = "add the scope you issue tokens with, e.g. `scope = \"orders.create\"`";
        errors.at(input.strategy_span(), what, help);
    }
}

/// `lock` alone must say it only wants mutual exclusion.
fn check_concurrency_only(input: &Input, spec: &Spec, errors: &mut Errors) {
    if spec.concurrency_only == Use::Required && !input.raw.concurrency_only.as_ref().is_some_and(|c| **c) {
        let what = "`lock` stops concurrency, not repetition";
        let help = "add `concurrency_only = true` to accept that, or use `lock+dedup` / `lock+state`";
        errors.at(input.strategy_span(), what, help);
    }
}

/// `unique`: the constraint the body's insert claims on, and the function
/// that reads the existing row for a duplicate, which takes the guarded
/// function's parameters (all of them, so each must have a name).
fn check_unique(input: &Input, spec: &Spec, errors: &mut Errors) -> Option<UniquePlan> {
    if spec.unique != Use::Required {
        return None;
    }
    let raw = input.raw;
    let constraint = match &raw.constraint {
        None => {
            let what =
                format!("strategy `{}` needs `constraint`: the unique key whose violation is a duplicate", spec.name);
            let help = "add the name of the business table's unique constraint (or unique index), e.g. \
                        `constraint = \"uk_pay_no\"`; on SQLite the index's name, or its columns as `\"table(a, b)\"`";
            errors.at(input.strategy_span(), what, help);
            None
        }
        Some(c) if c.trim().is_empty() || c.chars().any(|ch| ch.is_whitespace() && ch != ' ') => {
            errors.at(
                c.span(),
                "`constraint` names no constraint",
                "write its name, e.g. `constraint = \"uk_pay_no\"`",
            );
            None
        }
        Some(c) => Some(c.as_str().to_owned()),
    };
    let replay = match &raw.replay {
        None => {
            let what = format!(
                "strategy `{}` needs `replay`: the function that answers a duplicate from the existing row",
                spec.name
            );
            let help = "add e.g. `replay = \"existing_payment\"`, an async fn taking the same parameters and \
                        returning the same `Result` (it reads the row in the same transaction)";
            errors.at(input.strategy_span(), what, help);
            None
        }
        Some(r) if !matches!(r.0, Expr::Path(_)) => {
            errors.on(
                &r.0,
                "`replay` names a function",
                "write its name or path, e.g. `replay = \"existing_payment\"`",
            );
            None
        }
        Some(r) => Some(r.0.clone()),
    };
    for input in &input.func.sig.inputs {
        if let syn::FnArg::Typed(pt) = input
            && !matches!(&*pt.pat, syn::Pat::Ident(_))
        {
            let what = format!("strategy `{}` passes every parameter on to the replay function", spec.name);
            errors.on(&pt.pat, what, "bind this parameter to a name, and destructure it in the body");
        }
    }
    let savepoint = raw.savepoint.as_ref().is_none_or(|s| **s);
    Some(UniquePlan { constraint: constraint?, replay: replay?, savepoint })
}

/// `steps = "name"`: on `lease` only, a name the body can bind, and no
/// step name (a literal in `name.run("...", ...)`) run twice in the body.
fn check_steps(input: &Input, spec: &Spec, errors: &mut Errors) -> Option<Ident> {
    let name = input.raw.steps.as_ref()?;
    if spec.strategy != Strategy::Lease {
        let what = format!("`steps` records the steps of a `lease` body, not of `{}`", spec.name);
        let help = format!(
            "the body of `{}` writes in your transaction, whose commit makes it happen once; use \
             `strategy = \"lease\"` for work outside the database, or remove `steps`",
            spec.name
        );
        errors.at(name.span(), what, help);
        return None;
    }
    let ident =
        bound_name(name, "`steps` takes the name the body gives its step log", "e.g. `steps = \"steps\"`", errors)?;
    let mut seen: Vec<String> = Vec::new();
    for (step, span) in step_names(input.func.block.to_token_stream(), &ident) {
        if seen.contains(&step) {
            let what = format!("step `{step}` is run twice in this body");
            let help = "give each step its own name: a resumed call finds each recorded result by its name and place";
            errors.at(span, what, help);
        }
        seen.push(step);
    }
    Some(ident)
}

/// A name the body binds (`steps`, `outbox`), at its argument's span.
fn bound_name(name: &SpannedValue<String>, what: &str, help: &str, errors: &mut Errors) -> Option<Ident> {
    let Ok(mut ident) = syn::parse_str::<Ident>(name.as_str()) else {
        errors.at(name.span(), what, help);
        return None;
    };
    ident.set_span(name.span());
    Some(ident)
}

/// `outbox = "name"`: on a strategy that writes in the caller's
/// transaction (the messages go in it), and a name the body can bind.
fn check_outbox(input: &Input, spec: &Spec, errors: &mut Errors) -> Option<Ident> {
    let name = input.raw.outbox.as_ref()?;
    if let Tx::Outside { instead, .. } = spec.tx {
        let what = format!("`outbox` writes messages in the guarded transaction, and `{}` holds none", spec.name);
        let mut help = format!("use a strategy that writes in your transaction ({instead})");
        if spec.strategy == Strategy::Lease {
            help.push_str(
                "; in a `lease` body, publish in a recorded step's transaction: `Outbox::for_step(&key)` inside \
                 `steps.run_tx(...)`",
            );
        }
        errors.at(name.span(), what, help);
        return None;
    }
    if spec.unique == Use::Required {
        let what = format!("`outbox` is not offered with strategy `{}` yet", spec.name);
        let help = "use `dedup` (its record gives the messages their id), or write the message in the body";
        errors.at(name.span(), what, help);
        return None;
    }
    bound_name(name, "`outbox` takes the name the body gives its outbox handle", "e.g. `outbox = \"outbox\"`", errors)
}

/// The literal names of `steps.run("name", ...)` and `steps.run_tx("name", ...)` calls in `tokens`, in order.
fn step_names(tokens: proc_macro2::TokenStream, steps: &Ident) -> Vec<(String, Span)> {
    use proc_macro2::TokenTree;
    let trees: Vec<TokenTree> = tokens.into_iter().collect();
    let mut names = Vec::new();
    for (i, tree) in trees.iter().enumerate() {
        if let TokenTree::Group(group) = tree {
            names.extend(step_names(group.stream(), steps));
        }
        let [TokenTree::Ident(log), TokenTree::Punct(dot), TokenTree::Ident(run), TokenTree::Group(args)] =
            &trees[i..trees.len().min(i + 4)]
        else {
            continue;
        };
        if log != steps || dot.as_char() != '.' || (run != "run" && run != "run_tx") {
            continue;
        }
        if let Some(TokenTree::Literal(lit)) = args.stream().into_iter().next()
            && let Ok(name) = syn::parse_str::<syn::LitStr>(&lit.to_string())
        {
            names.push((name.value(), lit.span()));
        }
    }
    names
}

/// `key`: given (or, for `token`, not), not empty, and built from the
/// parameters.
fn check_key(input: &Input, errors: &mut Errors) {
    const HELP: &str = "name the business identifier that repeats share, e.g. `key = \"event.trade_no\"`";
    let rule = input.spec.map_or(Use::Required, |s| s.key);
    match (&input.raw.key, rule) {
        (Some(key), Use::Refused) => {
            let help = "remove `key`, or use `token+dedup` to also keep a record under it (a retry then replays)";
            errors.at(key.span, "strategy `token` keys on the token itself, not on `key`", help);
        }
        // `unique`: the constraint's columns are the key; one given names
        // the call in logs.
        (None, Use::Refused | Use::Optional) => {}
        (None, _) => errors.at(input.attr_span, "missing `key`", HELP),
        (Some(key), _) if key.parts.is_empty() => errors.at(key.span, "the key is empty", HELP),
        (Some(key), _) => {
            for part in &key.parts {
                signature::check_rooted(part, &input.func.sig, "key part", errors);
            }
        }
    }
}

fn check_scope(input: &Input, errors: &mut Errors) {
    if let Some(scope) = &input.raw.scope {
        errors.handle(values::check_scope_text(scope.as_str(), scope.span()));
    }
}

/// A method's default scope (module path + name) is shared by every type in
/// the module with a method of that name.
fn check_method_scope(input: &Input, errors: &mut Errors) {
    let sig = &input.func.sig;
    if let (None, Some(receiver)) = (&input.raw.scope, sig.receiver()) {
        let name = &sig.ident;
        let what =
            format!("a method needs an explicit `scope`: every `{name}` method in this module shares the default");
        errors.on(receiver, what, format!("add e.g. `scope = \"payments.{name}\"`"));
    }
}

/// `claim = "before" | "after" | "commit"`, where the strategy takes it:
/// the `Guard` method of a claim after the body.
fn check_claim(input: &Input, errors: &mut Errors) -> Option<&'static str> {
    let claim = input.raw.claim.as_ref()?;
    let span = claim.span();
    let rule = input.spec.map(|s| (s.name, s.claim));
    if let Some((name, Claim::Refused { why })) = rule {
        errors.at(span, format!("`claim` has no meaning for strategy `{name}`: {why}"), "remove `claim`");
        return None;
    }
    let method = match claim.as_str() {
        "before" => return None,
        "after" => "claim_after",
        "commit" => "claim_at_commit",
        other => {
            let help = "use \"before\" (the default), \"after\" (run the body first, then write the record with its \
                        answer) or \"commit\" (as \"after\", the record sent with an idem::Tx's COMMIT)";
            errors.at(span, format!("unknown `claim = \"{other}\"`"), help);
            return None;
        }
    };
    if let Some((name, Claim::BeforeOnly { why })) = rule {
        let what = format!("`claim = \"{}\"` does not apply to strategy `{name}`: {why}", claim.as_str());
        errors.at(span, what, "remove `claim`; only `dedup` claims after the body");
        return None;
    }
    Some(method)
}

/// A duration argument, parsed.
fn check_duration(value: &SpannedValue<String>, rule: &DurationRule, errors: &mut Errors) -> Option<u64> {
    errors.handle(values::parse_duration(rule, value.as_str(), value.span()))
}

/// `ttl`: the lock's TTL, required by lock strategies; or, with `precheck`,
/// the marker's.
fn check_ttl(input: &Input, spec: &Spec, errors: &mut Errors) -> Option<u64> {
    match (&input.raw.ttl, spec.ttl) {
        (Some(ttl), Use::Required) => check_duration(ttl, &LOCK_TTL, errors),
        (Some(ttl), _) if input.precheck() => check_duration(ttl, &MARKER_TTL, errors),
        (None, Use::Required) => {
            let what = format!("strategy `{}` needs `ttl`: how long the lock holds if its holder dies", spec.name);
            let help = "add e.g. `ttl = \"30s\"`, longer than the work usually takes (the guard renews it meanwhile)";
            errors.at(input.strategy_span(), what, help);
            None
        }
        _ => None,
    }
}

/// `precheck = "redis"`, the one marker cache.
fn check_precheck(input: &Input, errors: &mut Errors) {
    match &input.raw.precheck {
        Some(p) if input.precheck() && p.as_str() != "redis" => {
            let help =
                "use `precheck = \"redis\"`: a SET NX marker per key, in the installed precheck store or `store`";
            errors.at(p.span(), format!("unknown `precheck = \"{}\"`", p.as_str()), help);
        }
        _ => {}
    }
}

/// `on_store_error = "reject" | "allow"`, for token strategies.
fn check_on_store_error(input: &Input, spec: &Spec, errors: &mut Errors) -> bool {
    let Some(o) = allowed(input.raw.on_store_error.as_ref(), spec.on_store_error) else { return false };
    match o.as_str() {
        "reject" => false,
        "allow" => true,
        other => {
            let help = "use \"reject\" (the default: refuse calls while the token store is down) or \"allow\" (let \
                        them through)";
            errors.at(o.span(), format!("unknown `on_store_error = \"{other}\"`"), help);
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::args::ARGUMENTS;
    use crate::strategy::STRATEGIES;

    /// The reference of `#[idempotent]` (the `idem` crate's page of it)
    /// documents every argument and strategy the macro takes.
    #[test]
    fn the_reference_documents_every_argument_and_strategy() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/idempotent.md");
        let Ok(doc) = std::fs::read_to_string(path) else { return }; // outside the workspace
        for arg in ARGUMENTS {
            assert!(doc.contains(&format!("\n## `{}`\n", arg.name)), "docs/idempotent.md has no `## `{}``", arg.name);
        }
        for s in STRATEGIES {
            assert!(doc.contains(&format!("\n| `\"{}\"` |", s.name)), "docs/idempotent.md has no row for `{}`", s.name);
        }
    }
}
