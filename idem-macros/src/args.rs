//! The attribute's arguments, as written. Parsing only: every rule about what
//! they mean lives in `validate.rs`.

use darling::FromMeta;
use darling::util::SpannedValue;
use proc_macro2::Span;
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Expr, Token};

/// `#[idempotent(...)]`, every argument DESIGN.md names. Unknown names are
/// refused by darling with a "did you mean" hint.
#[derive(Debug, FromMeta)]
pub struct RawArgs {
    pub key: Option<KeyArg>,
    pub strategy: Option<SpannedValue<String>>,
    pub scope: Option<SpannedValue<String>>,
    pub fingerprint: Option<Expr>,
    pub retention: Option<SpannedValue<String>>,
    pub ttl: Option<SpannedValue<String>>,
    pub lease: Option<SpannedValue<String>>,
    pub transition: Option<SpannedValue<String>>,
    pub source: Option<SpannedValue<String>>,
    pub store: Option<Expr>,
    pub precheck: Option<SpannedValue<String>>,
    pub concurrency_only: Option<SpannedValue<bool>>,
    /// Lock strategies: how long to wait for a busy lock (default: not at all).
    pub wait: Option<SpannedValue<String>>,
    /// Token strategies: `"reject"` (default) or `"allow"` when the store is down.
    pub on_store_error: Option<SpannedValue<String>>,
    /// `"before"` (default) or `"after"` the body: when the dedup record is written.
    pub claim: Option<SpannedValue<String>>,
    /// `crate = "path"`: where the `idem` crate is, for a crate that
    /// re-exports it under another name (default `::idem`).
    #[darling(rename = "crate")]
    pub krate: Option<syn::Path>,
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
                let parts = lit.parse_with(Punctuated::<Expr, Token![,]>::parse_terminated).map_err(|e| {
                    darling::Error::custom(format!("`key` does not parse as Rust expressions: {e}")).with_span(lit)
                })?;
                Ok(KeyArg { parts: parts.into_iter().collect(), source: lit.value(), span: lit.span() })
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
