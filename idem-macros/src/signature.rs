//! Rules about the guarded function itself: `async`, its return type, its
//! transaction and token parameters, and the parameters a key is built from.

use proc_macro2::Span;
use quote::ToTokens;
use syn::spanned::Spanned;
use syn::{Expr, FnArg, Ident, ItemFn, Pat, ReturnType, Signature, Type};

use crate::errors::{Errors, error, error_on, listed};
use crate::strategy::{Spec, Tx, Use};

/// Parameters marked `#[idem(...)]`, found (and stripped) before validation
/// so that the function can be emitted unchanged even when validation fails.
#[derive(Default)]
pub struct Marks {
    pub tx: Vec<(Ident, Span)>,
    pub token: Vec<(Ident, Span)>,
}

/// Remove `#[idem(...)]` from the parameters, remembering what they marked.
pub fn strip_marks(func: &mut ItemFn, errors: &mut Errors) -> Marks {
    let mut marks = Marks::default();
    for input in func.sig.inputs.iter_mut() {
        let FnArg::Typed(pt) = input else { continue };
        let (ours, kept) = pt.attrs.drain(..).partition(|a| a.path().is_ident("idem"));
        pt.attrs = kept;
        for attr in ours {
            check_mark(&attr, &pt.pat, &mut marks, errors);
        }
    }
    marks
}

/// `#[idem(tx)]` or `#[idem(token)]` on a named parameter.
fn check_mark(attr: &syn::Attribute, pat: &Pat, marks: &mut Marks, errors: &mut Errors) {
    const HELP: &str = "`#[idem(tx)]` marks the transaction the record is written in, `#[idem(token)]` the one-time \
                        token a token guard spends";
    let word = match attr.parse_args::<Ident>() {
        Ok(word) if word == "tx" || word == "token" => word,
        Ok(word) => return errors.on(&word, format!("unknown parameter mark `#[idem({word})]`"), HELP),
        Err(_) => return errors.on(attr, "expected `#[idem(tx)]` or `#[idem(token)]`", HELP),
    };
    let Pat::Ident(pi) = pat else {
        let what = format!("`#[idem({word})]` goes on a named parameter, not a pattern");
        return errors.on(pat, what, format_args!("bind it to a name, e.g. `{word}`: the guard passes it on"));
    };
    let list = if word == "tx" { &mut marks.tx } else { &mut marks.token };
    list.push((pi.ident.clone(), word.span()));
}

pub fn check_async(sig: &Signature, errors: &mut Errors) {
    if sig.asyncness.is_none() {
        errors.on(sig.fn_token, "#[idempotent] needs an `async fn`", "write `async fn`: the guard awaits its store");
    }
}

/// The return type, if it is a `Result` the guard can replay and fail with.
pub fn check_return_type(sig: &Signature, errors: &mut Errors) -> Option<Type> {
    const MUST: &str = "#[idempotent] functions must return `Result<T, E>`";
    let ty = match &sig.output {
        ReturnType::Default => {
            let help =
                "add e.g. `-> Result<(), AppError>`: repeats replay the first `Ok`, guard failures arrive as `E`";
            errors.at(sig.paren_token.span.close(), MUST, help);
            return None;
        }
        ReturnType::Type(_, ty) => &**ty,
    };
    if contains_impl_trait(ty) {
        let what = "the `Ok` type cannot be `impl Trait`: it is stored and replayed to repeats";
        errors.on(ty, what, "name a concrete type that implements `Serialize` and `Deserialize`");
        return None;
    }
    if !is_result(ty) {
        let help = "repeats replay the first `Ok(T)`, guard failures arrive as `E` (through `From<idem::Error>`)";
        errors.on(ty, MUST, help);
        return None;
    }
    if let Some(err) = sqlx_error(ty) {
        let what = "`sqlx::Error` cannot carry idem's own errors (a key mismatch, a call in progress, a lost lease)";
        let help =
            "return your own error type with `#[from] idem::Error` beside `#[from] sqlx::Error`, or `anyhow::Error`";
        errors.on(err, what, help);
    }
    Some(ty.clone())
}

/// An `Ok` type JSON cannot replay exactly, as written: `Option<()>` and
/// `Option<Option<T>>`, whose `Some(())` / `Some(None)` JSON writes as
/// `null`, like `None`. (Other shapes, hidden behind aliases or inside
/// structs, are refused by the runtime on the first call that returns one.)
pub fn check_replayable_ok(ret: &Type, spec: &Spec, errors: &mut Errors) {
    let Some(ok) = first_type_arg(ret).filter(|_| spec.keeps_record()) else { return };
    match option_inner(ok) {
        Some(Type::Tuple(t)) if t.elems.is_empty() => errors.on(
            ok,
            "`Option<()>` cannot be replayed exactly: JSON stores `Some(())` as `null`, like `None`",
            "return `bool` instead",
        ),
        Some(t) if option_inner(t).is_some() => errors.on(
            ok,
            "`Option<Option<T>>` cannot be replayed exactly: JSON stores `Some(None)` as `null`, like `None`",
            "return an enum of your own with three variants",
        ),
        _ => {}
    }
}

/// The transaction parameter and its type, for a strategy that works in the
/// caller's transaction; for one that does not, a `#[idem(tx)]` it would
/// ignore is an error.
pub fn check_tx(func: &ItemFn, marked: &[(Ident, Span)], spec: &Spec, errors: &mut Errors) -> Option<(Ident, Type)> {
    let doing = match spec.tx {
        Tx::Record => "writes its record in your transaction",
        Tx::Status => "moves the entity's status in your transaction",
        Tx::RecordAndStatus => "writes its record and moves the entity's status in your transaction",
        Tx::Insert => "claims with your body's own insert, in your transaction",
        Tx::InsertAndStatus => "moves the status and claims with your insert, in your transaction",
        Tx::Outside { instead, refuses_tx } => {
            let mut refused = Vec::new();
            if let Some(why) = refuses_tx {
                let tx_params = func.sig.inputs.iter().filter_map(|input| match input {
                    FnArg::Typed(pt) if is_db_transaction(&pt.ty) => Some(pt),
                    _ => None,
                });
                for pt in tx_params {
                    if let Pat::Ident(pi) = &*pt.pat {
                        refused.push(pi.ident.clone());
                    }
                    let ty = &*pt.ty;
                    errors.on(
                        ty,
                        format!("strategy `{}` takes no transaction: {why}", spec.name),
                        format!(
                            "use {instead}, whose record commits with your transaction (else every retry replays writes that never happened), or begin and commit the transaction inside the body"
                        ),
                    );
                }
            }
            // A marked transaction refused above needs no second error.
            if let Some((ident, _)) = marked.first().filter(|(ident, _)| !refused.contains(ident)) {
                let what = format!(
                    "`#[idem(tx)]` has no effect with strategy `{}`: it writes nothing in your transaction",
                    spec.name
                );
                errors.at(
                    ident.span(),
                    what,
                    format!("remove the mark, or use a strategy that writes in it: {instead}"),
                );
            }
            return None;
        }
    };
    errors.handle(find_tx(func, marked, spec.name, doing))
}

/// The parameter the record is written through: the one marked `#[idem(tx)]`,
/// or the one whose type is a transaction idem knows.
fn find_tx(func: &ItemFn, marked: &[(Ident, Span)], strategy: &str, doing: &str) -> syn::Result<(Ident, Type)> {
    if let Some((_, second)) = marked.get(1) {
        return Err(error(
            *second,
            "only one parameter can be `#[idem(tx)]`",
            "mark the transaction the record is written in",
        ));
    }
    let params = func.sig.inputs.iter().filter_map(|input| match input {
        FnArg::Typed(pt) => match &*pt.pat {
            Pat::Ident(pi) => Some((&pi.ident, &*pt.ty)),
            _ => None,
        },
        FnArg::Receiver(_) => None,
    });
    let params: Vec<(&Ident, &Type)> = params.collect();
    let chosen: Vec<&(&Ident, &Type)> = match marked.first() {
        Some((mark, _)) => params.iter().filter(|(ident, _)| *ident == mark).collect(),
        None => {
            // `Transaction`, `PgTx`, `idem::Tx<_>`...; a bare `Tx<..>` (an
            // imported `idem::Tx`, an alias) only if no parameter says more.
            let named: Vec<_> = params.iter().filter(|(_, ty)| names_transaction(ty)).collect();
            if named.is_empty() { params.iter().filter(|(_, ty)| is_bare_tx(ty)).collect() } else { named }
        }
    };
    match chosen.as_slice() {
        [(ident, ty)] => require_mut_ref(ty).map(|()| ((*ident).clone(), referent(ty))),
        [_, (second, _), ..] => Err(error(
            second.span(),
            "several transaction parameters",
            "mark the one the record belongs in with `#[idem(tx)]`",
        )),
        [] => Err(no_tx(func, &params, strategy, doing)),
    }
}

/// No transaction parameter: a connection or a pool where one belongs, or
/// nothing at all.
fn no_tx(func: &ItemFn, params: &[(&Ident, &Type)], strategy: &str, doing: &str) -> syn::Error {
    if let Some((ident, ty, what)) = params.iter().find_map(|(i, ty)| connection_or_pool(ty).map(|w| (i, ty, w))) {
        return error_on(
            ty,
            format!("`{ident}` is {what}, not a transaction: strategy `{strategy}` {doing}"),
            format!(
                "take `{ident}: &mut sqlx::Transaction<'_, DB>` (from `pool.begin()`) or `&mut idem::Tx<DB>` (from `idem::begin(&pool)`) and commit it after the call"
            ),
        );
    }
    error(
        func.sig.ident.span(),
        format!("strategy `{strategy}` {doing}, but `{}` takes none", func.sig.ident),
        "add a parameter `tx: &mut sqlx::Transaction<'_, DB>` or `tx: &mut idem::Tx<DB>` (or mark yours with `#[idem(tx)]`)",
    )
}

/// The `#[idem(token)]` parameter, for a strategy that spends a token; for
/// one that does not, the mark is an error.
pub fn check_token_param(sig: &Signature, marked: &[(Ident, Span)], spec: &Spec, errors: &mut Errors) -> Option<Ident> {
    let name = spec.name;
    match (spec.token_param, marked) {
        (Use::Refused, []) => None,
        (Use::Refused, [(_, span), ..]) => {
            let what = format!("`#[idem(token)]` has no effect with strategy `{name}`: it spends no token");
            errors.at(*span, what, "remove the mark, or use strategy `token` or `token+dedup`");
            None
        }
        (_, []) => {
            let what =
                format!("strategy `{name}` spends a one-time token, but no parameter of `{}` carries one", sig.ident);
            let help = "mark it: `#[idem(token)] token: &str` (the token your form got from `idem::token::issue`)";
            errors.at(sig.ident.span(), what, help);
            None
        }
        (_, [(ident, _)]) => Some(ident.clone()),
        (_, [_, (_, second), ..]) => {
            errors.at(*second, "only one parameter can be `#[idem(token)]`", "mark the one that carries the token");
            None
        }
    }
}

/// The names of the parameters, `self` included.
pub fn param_names(sig: &Signature) -> Vec<String> {
    sig.inputs
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

/// `expr` (a key part, a fingerprint) is reached from a parameter, so that
/// every repeat of one request computes the same value.
pub fn check_rooted(expr: &Expr, sig: &Signature, what: &str, errors: &mut Errors) {
    let params = param_names(sig);
    let help =
        format!("build the {what} from the parameters ({}), so every repeat computes the same value", listed(&params));
    match root(expr) {
        Ok((name, _)) if params.contains(&name) => {}
        Ok((name, span)) => errors.at(span, format!("`{name}` is not a parameter of `{}`", sig.ident), help),
        Err(span) => {
            let what = format!("a {what} must be a parameter or reached from one, not `{}`", expr.to_token_stream());
            errors.at(span, what, help);
        }
    }
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

/// The type arguments of a path type: `[T, E]` of `Result<T, E>`.
fn type_args(ty: &Type) -> Vec<&Type> {
    let Some(segment) = path_type(ty, false).and_then(|p| p.path.segments.last()) else { return Vec::new() };
    match &segment.arguments {
        syn::PathArguments::AngleBracketed(args) => args
            .args
            .iter()
            .filter_map(|a| match a {
                syn::GenericArgument::Type(t) => Some(t),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// The first type argument: `T` of `Result<T, E>` (or of an alias such as
/// `io::Result<T>`), `X` of `Option<X>`.
fn first_type_arg(ty: &Type) -> Option<&Type> {
    type_args(ty).first().copied()
}

/// `Option<X>` with the `X` inside, if `ty` is written so.
fn option_inner(ty: &Type) -> Option<&Type> {
    named(ty, false).filter(|s| s.ident == "Option").and_then(|_| first_type_arg(ty))
}

fn is_result(ty: &Type) -> bool {
    named(ty, false).is_some_and(|s| s.ident == "Result")
}

/// Where `ty` names `sqlx::Error` as its error type: `Result<T, sqlx::Error>`
/// (the error argument), or sqlx's alias `sqlx::Result<T>` (the whole type).
fn sqlx_error(ty: &Type) -> Option<&Type> {
    // `sqlx::Error`, `sqlx::error::Error`, `::sqlx::Result`.
    let is_sqlx = |p: &syn::Path, last: &str| {
        let names: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        names.len() >= 2 && names[0] == "sqlx" && names[names.len() - 1] == last
    };
    let path = &path_type(ty, false)?.path;
    match type_args(ty).as_slice() {
        [_] if is_sqlx(path, "Result") => Some(ty),
        [_, err] if path_type(err, false).is_some_and(|p| p.qself.is_none() && is_sqlx(&p.path, "Error")) => Some(*err),
        _ => None,
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
/// A transaction of sqlx's, by its shape: `Transaction<'_, DB>` (a
/// lifetime and a database) or `PgTransaction<'_>` and its kin, through
/// references; not a domain type that happens to be called `Transaction`.
/// Or one of idem's: `idem::Tx<DB>` (named through `idem`), `PgTx` and its
/// kin.
fn is_db_transaction(ty: &Type) -> bool {
    let Some(path) = path_type(ty, true) else { return false };
    let Some(segment) = path.path.segments.last() else { return false };
    match segment.ident.to_string().as_str() {
        "PgTx" | "MySqlTx" | "SqliteTx" => return segment.arguments.is_none(),
        "Tx" => return path.path.segments.iter().any(|s| s.ident == "idem"),
        _ => {}
    }
    let syn::PathArguments::AngleBracketed(args) = &segment.arguments else { return false };
    let lifetime = args.args.iter().any(|a| matches!(a, syn::GenericArgument::Lifetime(_)));
    match segment.ident.to_string().as_str() {
        "Transaction" => lifetime && args.args.iter().any(|a| matches!(a, syn::GenericArgument::Type(_))),
        "PgTransaction" | "MySqlTransaction" | "SqliteTransaction" => lifetime,
        _ => false,
    }
}

fn names_transaction(ty: &Type) -> bool {
    let Some(path) = path_type(ty, true) else { return false };
    path.path.segments.last().is_some_and(|s| {
        ["Transaction", "PgTransaction", "MySqlTransaction", "SqliteTransaction", "PgTx", "MySqlTx", "SqliteTx"]
            .iter()
            .any(|n| s.ident == n)
            || (s.ident == "Tx" && path.path.segments.iter().any(|s| s.ident == "idem"))
    })
}

/// `Tx<..>` with generic arguments, under any path: `idem::Tx` imported, or
/// an alias of the application's named so. (A bare `Tx` without arguments
/// is too common a name for other things: a channel's sender.)
fn is_bare_tx(ty: &Type) -> bool {
    path_type(ty, true).and_then(|p| p.path.segments.last()).is_some_and(|s| {
        s.ident == "Tx" && matches!(&s.arguments, syn::PathArguments::AngleBracketed(a) if !a.args.is_empty())
    })
}

fn require_mut_ref(ty: &Type) -> syn::Result<()> {
    match ty {
        Type::Reference(r) if r.mutability.is_some() => Ok(()),
        Type::Group(g) => require_mut_ref(&g.elem),
        _ => Err(error_on(
            ty,
            "take the transaction as `&mut`: the guard writes in it before and after your body",
            "write e.g. `tx: &mut sqlx::Transaction<'_, Postgres>` or `tx: &mut idem::Tx<Postgres>`",
        )),
    }
}
