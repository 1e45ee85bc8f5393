//! The one error accumulator of the crate. Every rule pushes into it instead
//! of returning at its first error, so one build shows every mistake; every
//! message has the same form: one short line saying what is wrong, then a
//! line starting `help:` saying what to do.

use std::fmt::Display;

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;

/// The errors found so far (`None`: none), combined into one `syn::Error`.
#[derive(Default)]
pub struct Errors(Option<syn::Error>);

impl Errors {
    pub fn push(&mut self, error: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(error),
            None => self.0 = Some(error),
        }
    }

    /// An error at `span`: `what` is wrong, `help` says what to do.
    pub fn at(&mut self, span: Span, what: impl Display, help: impl Display) {
        self.push(error(span, what, help));
    }

    /// An error spanning `tokens` (all of them, not only the first).
    pub fn on(&mut self, tokens: impl ToTokens, what: impl Display, help: impl Display) {
        self.push(error_on(tokens, what, help));
    }

    /// The value of `result`, or `None` with its error kept.
    pub fn handle<T>(&mut self, result: syn::Result<T>) -> Option<T> {
        result.map_err(|e| self.push(e)).ok()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    pub fn into_compile_error(self) -> TokenStream {
        self.0.map(|e| e.into_compile_error()).unwrap_or_default()
    }
}

/// `"<what is wrong>\nhelp: <what to do>"`, the form of every message.
fn message(what: impl Display, help: impl Display) -> String {
    format!("{what}\nhelp: {help}")
}

pub fn error(span: Span, what: impl Display, help: impl Display) -> syn::Error {
    syn::Error::new(span, message(what, help))
}

pub fn error_on(tokens: impl ToTokens, what: impl Display, help: impl Display) -> syn::Error {
    syn::Error::new_spanned(tokens, message(what, help))
}

/// `` `a`, `b`, `c` ``.
pub fn listed<T: Display>(names: impl IntoIterator<Item = T>) -> String {
    names.into_iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
}

/// The name in `candidates` closest to `name`, if one is close enough to be
/// a typo of it.
pub fn did_you_mean<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (strsim::damerau_levenshtein(name, c), c))
        .min()
        .filter(|(d, _)| *d <= 3)
        .map(|(_, c)| c)
}

/// The same tokens, all pointing at `span`: where rustc reports an error
/// in them.
pub fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut tt| {
            if let proc_macro2::TokenTree::Group(g) = &tt {
                let mut group = proc_macro2::Group::new(g.delimiter(), respan(g.stream(), span));
                group.set_span(span);
                tt = proc_macro2::TokenTree::Group(group);
            } else {
                tt.set_span(span);
            }
            tt
        })
        .collect()
}
