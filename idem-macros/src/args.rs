//! The attributes' arguments, as written. Parsing only: what they mean and
//! which go together is checked in `validate.rs` (and, for the derive, in
//! `state_machine.rs`).

use darling::FromMeta;
use darling::ast::NestedMeta;
use darling::util::SpannedValue;
use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Expr, Token};

use crate::errors::{Errors, did_you_mean, listed, respan};

/// `#[idempotent(...)]`, every argument (see `ARGUMENTS`).
#[derive(Debug, FromMeta)]
pub struct RawArgs {
    pub key: Option<KeyArg>,
    pub strategy: Option<SpannedValue<String>>,
    pub scope: Option<SpannedValue<String>>,
    pub fingerprint: Option<ExprArg>,
    pub retention: Option<SpannedValue<String>>,
    pub ttl: Option<SpannedValue<String>>,
    pub lease: Option<SpannedValue<String>>,
    pub transition: Option<SpannedValue<String>>,
    pub source: Option<SpannedValue<String>>,
    pub store: Option<ExprArg>,
    pub precheck: Option<SpannedValue<String>>,
    pub concurrency_only: Option<SpannedValue<bool>>,
    /// `lease` and the lock strategies: how long to wait for the call that
    /// holds the key (default: not at all).
    pub wait: Option<SpannedValue<String>>,
    /// Token strategies: `"reject"` (default) or `"allow"` when the store is down.
    pub on_store_error: Option<SpannedValue<String>>,
    /// `"before"` (default) or `"after"` the body: when the dedup record is written.
    pub claim: Option<SpannedValue<String>>,
    /// `lease`: the name the body gives its step log (`steps = "steps"`).
    pub steps: Option<SpannedValue<String>>,
    /// Strategies in a transaction: the name the body gives the call's
    /// outbox handle (`outbox = "outbox"`).
    pub outbox: Option<SpannedValue<String>>,
    /// `unique`: the business table's unique constraint (or index) whose
    /// violation is the duplicate.
    pub constraint: Option<SpannedValue<String>>,
    /// `unique`: the function that reads the existing row for a duplicate.
    pub replay: Option<ExprArg>,
    /// `unique`: whether to take a savepoint before the body (default true).
    pub savepoint: Option<SpannedValue<bool>>,
    /// `crate = "path"`: where the `idem` crate is, for a crate that
    /// re-exports it under another name (default `::idem`).
    #[darling(rename = "crate")]
    pub krate: Option<syn::Path>,
}

/// An argument an attribute takes: its name, what its value is, and an
/// example (for the message when it is misspelt or its value has the wrong
/// form).
pub struct Argument {
    pub name: &'static str,
    pub takes: &'static str,
    pub example: &'static str,
}

const fn arg(name: &'static str, takes: &'static str, example: &'static str) -> Argument {
    Argument { name, takes, example }
}

/// Every argument of `#[idempotent]`, each documented in `docs/idempotent.md`.
pub const ARGUMENTS: &[Argument] = &[
    arg("key", "Rust expressions over the parameters", "`key = \"event.trade_no\"`"),
    arg("strategy", "a strategy's name", "`strategy = \"dedup\"`"),
    arg("scope", "a name, as a string", "`scope = \"payments.on_pay\"`"),
    arg("fingerprint", "an expression over the parameters", "`fingerprint = \"event\"`"),
    arg("retention", "a duration", "`retention = \"7d\"`"),
    arg("claim", "\"before\", \"after\" or \"commit\"", "`claim = \"after\"`"),
    arg("transition", "a status change, as a string", "`transition = \"OrderStatus::WaitPay -> OrderStatus::Paid\"`"),
    arg("lease", "a duration", "`lease = \"30s\"`"),
    arg("steps", "the name the body gives its step log", "`steps = \"steps\"`"),
    arg("outbox", "the name the body gives its outbox handle", "`outbox = \"outbox\"`"),
    arg("store", "an expression naming a store", "`store = \"self.redis\"`"),
    arg("ttl", "a duration", "`ttl = \"30s\"`"),
    arg("wait", "a duration", "`wait = \"2s\"`"),
    arg("precheck", "the name of a marker cache", "`precheck = \"redis\"`"),
    arg("on_store_error", "\"reject\" or \"allow\"", "`on_store_error = \"allow\"`"),
    arg("concurrency_only", "`true` or `false`", "`concurrency_only = true`"),
    arg("source", "who sends the requests", "`source = \"callback\"`"),
    arg("constraint", "a unique constraint's (or index's) name", "`constraint = \"uk_pay_no\"`"),
    arg("replay", "the function that reads the existing row", "`replay = \"existing_payment\"`"),
    arg("savepoint", "`true` or `false`", "`savepoint = false`"),
    arg("crate", "the path of the idem crate", "`crate = \"my_crate::idem\"`"),
];

/// Parse `#[idempotent(...)]`'s arguments; `None` (with the errors kept)
/// when they do not parse.
pub fn parse_attribute(args: TokenStream, errors: &mut Errors) -> Option<RawArgs> {
    let items = errors.handle(NestedMeta::parse_meta_list(args))?;
    parse_list(&items, ARGUMENTS, errors)
}

/// The arguments of one attribute: each must be a known one, given once, with
/// a value of the right form. Checked one by one, so each error names its
/// argument; then parsed together.
pub fn parse_list<T: FromMeta>(items: &[NestedMeta], known: &[Argument], errors: &mut Errors) -> Option<T> {
    let mut seen: Vec<String> = Vec::new();
    let mut ok = true;
    for item in items {
        let Some(argument) = check_known(item, known, errors) else {
            ok = false;
            continue;
        };
        if seen.iter().any(|s| s == argument.name) {
            errors.on(item, format!("`{}` is given twice", argument.name), "keep one of them");
            ok = false;
            continue;
        }
        seen.push(argument.name.to_owned());
        ok &= check_value::<T>(item, argument, errors);
    }
    if !ok {
        return None;
    }
    errors.handle(T::from_list(items).map_err(syn::Error::from))
}

/// The argument `item` names, if the attribute knows it.
fn check_known<'k>(item: &NestedMeta, known: &'k [Argument], errors: &mut Errors) -> Option<&'k Argument> {
    let path = match item {
        NestedMeta::Meta(meta) => meta.path(),
        NestedMeta::NameValueInvalidExpr(nv) => &nv.path,
        NestedMeta::Lit(lit) => {
            let example = known.first().map_or("", |a| a.example);
            errors.on(
                lit,
                "expected an argument `name = value`, found a literal",
                format_args!("write e.g. {example}"),
            );
            return None;
        }
    };
    let name = path.to_token_stream().to_string().replace(' ', "");
    if let Some(argument) = known.iter().find(|a| a.name == name) {
        return Some(argument);
    }
    let help = match did_you_mean(&name, known.iter().map(|a| a.name)) {
        Some(close) => format!("did you mean {}?", known.iter().find(|a| a.name == close).map_or("", |a| a.example)),
        None => format!("the arguments are {}", listed(known.iter().map(|a| a.name))),
    };
    errors.on(path, format!("unknown argument `{name}`"), help);
    None
}

/// Parse `item` alone, so that an error in its value is reported with its
/// argument's expected form.
fn check_value<T: FromMeta>(item: &NestedMeta, argument: &Argument, errors: &mut Errors) -> bool {
    let Err(e) = T::from_list(std::slice::from_ref(item)) else { return true };
    let what = |found: String| format!("`{}` takes {} ({})", argument.name, argument.takes, lowercase_first(found));
    let help = format!("write e.g. {}", argument.example);
    if let NestedMeta::NameValueInvalidExpr(nv) = item {
        // No expression after `=`: point at the argument, not at the attribute.
        errors.on(item, what(syn::Error::from(nv.error.clone()).to_string()), help);
        return false;
    }
    for e in e.flatten() {
        let e = syn::Error::from(e.with_span(item));
        errors.at(e.span(), what(e.to_string()), &help);
    }
    false
}

fn lowercase_first(mut text: String) -> String {
    if let Some(first) = text.get(..1) {
        text.replace_range(..1, &first.to_lowercase());
    }
    text
}

/// `key = "a.b, c"` (a string holding comma-separated expressions),
/// `key = a.b` (a bare expression) or `key = (a.b, c)` (a tuple of parts).
#[derive(Debug)]
pub struct KeyArg {
    pub parts: Vec<Expr>,
    /// The key as the user wrote it, for runtime error messages.
    pub source: String,
    pub span: Span,
}

impl FromMeta for KeyArg {
    fn from_expr(expr: &Expr) -> darling::Result<Self> {
        match expr {
            Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(lit), .. }) => {
                let parts = lit
                    .parse_with(Punctuated::<Expr, Token![,]>::parse_terminated)
                    .map_err(|e| darling::Error::custom(e).with_span(lit))?;
                let parts = parts.into_iter().map(|part| placed_in(part, lit.span())).collect();
                Ok(KeyArg { parts, source: lit.value(), span: lit.span() })
            }
            Expr::Group(g) => Self::from_expr(&g.expr),
            Expr::Tuple(t) => Ok(KeyArg {
                parts: t.elems.iter().cloned().collect(),
                source: t.elems.iter().map(|e| quote::quote!(#e).to_string()).collect::<Vec<_>>().join(", "),
                span: t.span(),
            }),
            other => {
                Ok(KeyArg { parts: vec![other.clone()], source: quote::quote!(#other).to_string(), span: other.span() })
            }
        }
    }
}

/// `fingerprint` and `store`: an expression, in a string or bare.
#[derive(Debug)]
pub struct ExprArg(pub Expr);

impl FromMeta for ExprArg {
    fn from_expr(expr: &Expr) -> darling::Result<Self> {
        let parsed = Expr::from_expr(expr)?;
        Ok(ExprArg(match string_literal(expr) {
            Some(lit) => placed_in(parsed, lit.span()),
            None => parsed,
        }))
    }
}

fn string_literal(expr: &Expr) -> Option<&syn::LitStr> {
    match expr {
        Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(lit), .. }) => Some(lit),
        Expr::Group(g) => string_literal(&g.expr),
        _ => None,
    }
}

/// An expression parsed from the string literal at `lit`, its tokens placed
/// in the literal so that rustc reports errors in them there. Only the first
/// token has the literal's own span; the others are at the macro's call
/// site, located in the literal. A fix-it of rustc's replaces its token's
/// span, which for a token inside a string is the whole string: a misspelt
/// field (`key = "cb.order_id"`, the field being `order_no`) would be
/// "fixed" into `key = order_no`, which does not compile; tokens of a
/// macro's expansion get none. (A span inside the string, a subspan of the
/// literal, is nightly-only.) The first token stays the user's, so what is
/// reported at the whole part (not a key type, not a store) reads without
/// "this error originates in the attribute macro".
fn placed_in(expr: Expr, lit: Span) -> Expr {
    let inside = Span::call_site().located_at(lit);
    let mut tokens = expr.into_token_stream().into_iter();
    let first = tokens.next().map(|tt| match tt {
        proc_macro2::TokenTree::Group(g) => {
            let mut group = proc_macro2::Group::new(g.delimiter(), respan(g.stream(), inside));
            group.set_span(lit);
            proc_macro2::TokenTree::Group(group)
        }
        other => other,
    });
    let rest = respan(tokens.collect(), inside);
    syn::parse2(first.into_iter().chain(rest).collect()).expect("the same tokens parse again")
}
