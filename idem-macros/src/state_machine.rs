//! `#[derive(StateMachine)]`: a status enum's variants, stored codes, allowed
//! transitions and storage location, checked here and emitted as one constant
//! table (`idem::StateMachine::STATES`) plus `const fn can_transition`.

use darling::FromMeta;
use darling::ast::NestedMeta;
use darling::util::{PathList, SpannedValue};
use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::spanned::Spanned;
use syn::{Data, DeriveInput, Expr, Fields, Ident, Lit, UnOp};

#[derive(Debug, Default, FromMeta)]
struct EnumArgs {
    table: Option<SpannedValue<String>>,
    key_column: Option<SpannedValue<String>>,
    status_column: Option<SpannedValue<String>>,
    /// `"code"` (default: an integer per variant) or `"name"` (text).
    stored_as: Option<SpannedValue<String>>,
}

#[derive(Debug, Default, FromMeta)]
struct VariantArgs {
    code: Option<SpannedValue<i64>>,
    name: Option<SpannedValue<String>>,
    #[darling(default)]
    to: PathList,
}

const EXAMPLE: &str = "#[state(table = \"orders\", key_column = \"order_no\", status_column = \"status\")]";

pub fn derive(input: DeriveInput) -> TokenStream {
    match expand(&input) {
        Ok(tokens) => tokens,
        Err(e) => e.write_errors(),
    }
}

/// Arguments of every `#[state(...)]` attribute in `attrs`, merged.
fn state_args<T: FromMeta + Default>(attrs: &[syn::Attribute]) -> darling::Result<T> {
    let mut items = Vec::new();
    for attr in attrs.iter().filter(|a| a.path().is_ident("state")) {
        let list = attr.meta.require_list().map_err(darling::Error::from)?;
        items.extend(NestedMeta::parse_meta_list(list.tokens.clone())?);
    }
    if items.is_empty() { Ok(T::default()) } else { T::from_list(&items) }
}

struct State {
    ident: Ident,
    code: Code,
    to: Vec<(Ident, Span)>,
}

#[derive(Clone, PartialEq)]
enum Code {
    Int(i64),
    Text(String),
}

fn expand(input: &DeriveInput) -> darling::Result<TokenStream> {
    let name = &input.ident;
    let Data::Enum(data) = &input.data else {
        return Err(darling::Error::custom(
            "#[derive(StateMachine)] goes on an enum of states, one fieldless variant per status (e.g. `enum OrderStatus { WaitPay, Paid, ... }`)",
        )
        .with_span(&input.ident));
    };
    let mut errors = darling::Error::accumulator();
    if !input.generics.params.is_empty() {
        errors.push(
            darling::Error::custom("a state enum cannot be generic: its states are stored as fixed codes")
                .with_span(&input.generics),
        );
    }
    if data.variants.is_empty() {
        errors.push(darling::Error::custom("a state machine needs at least one state (variant)").with_span(name));
    }
    // When the arguments do not parse, darling has said why: do not add
    // "missing" errors for the arguments it could not read.
    let parsed = errors.handle(state_args::<EnumArgs>(&input.attrs));
    let args_ok = parsed.is_some();
    let args = parsed.unwrap_or_default();

    let mut location = |arg: &Option<SpannedValue<String>>, what: &str, list: bool| -> Option<Vec<String>> {
        let Some(v) = arg else {
            if !args_ok {
                return None;
            }
            errors.push(
                darling::Error::custom(format!("missing `{what}`: say where the status is stored, e.g. {EXAMPLE}"))
                    .with_span(name),
            );
            return None;
        };
        let parts: Vec<String> =
            if list { v.split(',').map(|s| s.trim().to_owned()).collect() } else { vec![v.trim().to_owned()] };
        for p in &parts {
            if !is_sql_identifier(p) {
                errors.push(
                    darling::Error::custom(format!(
                        "`{what} = \"{}\"`: `{p}` is not a plain SQL identifier (letters, digits and `_`, \
                         optionally `schema.table`); idem writes it into its UPDATE as is, unquoted",
                        v.as_str()
                    ))
                    .with_span(&v.span()),
                );
                return None;
            }
        }
        Some(parts)
    };
    let table = location(&args.table, "table", false);
    let key_columns = location(&args.key_column, "key_column", true);
    let status_column = location(&args.status_column, "status_column", false);

    let by_name = match args.stored_as.as_ref().map(|s| (s.as_str(), s.span())) {
        None | Some(("code", _)) => false,
        Some(("name", _)) => true,
        Some((other, span)) => {
            errors.push(
                darling::Error::custom(format!(
                    "`stored_as = \"{other}\"`: expected \"code\" (an integer per state, the default) or \"name\" (text)"
                ))
                .with_span(&span),
            );
            false
        }
    };

    let mut states: Vec<State> = Vec::new();
    for v in &data.variants {
        if !matches!(v.fields, Fields::Unit) {
            errors.push(
                darling::Error::custom(format!(
                    "state `{}` has fields: a state is a plain name stored in one column; keep data in the entity's own columns",
                    v.ident
                ))
                .with_span(&v.fields),
            );
            continue;
        }
        let Some(vargs) = errors.handle(state_args::<VariantArgs>(&v.attrs)) else { continue };
        let discriminant = v.discriminant.as_ref().map(|(_, e)| e);
        let code = if by_name {
            if let Some(code) = &vargs.code {
                errors.push(
                    darling::Error::custom("`code` has no meaning with `stored_as = \"name\"`; use `name = \"...\"`")
                        .with_span(&code.span()),
                );
            }
            let text = match &vargs.name {
                Some(n) => {
                    if n.is_empty() || n.contains(['\'', '\\']) {
                        errors.push(
                            darling::Error::custom("a stored name must be non-empty, without quotes or backslashes")
                                .with_span(&n.span()),
                        );
                    }
                    n.as_str().to_owned()
                }
                None => screaming_snake(&v.ident.to_string()),
            };
            Code::Text(text)
        } else {
            if let Some(n) = &vargs.name {
                errors.push(
                    darling::Error::custom(
                        "`name` is for `stored_as = \"name\"` on the enum; states are stored as integer codes by default",
                    )
                    .with_span(&n.span()),
                );
            }
            let from_discriminant = match discriminant.map(int_literal) {
                None => None,
                Some(Ok(i)) => Some(i),
                Some(Err(span)) => {
                    errors.push(
                        darling::Error::custom("give the state's code as an integer literal (`WaitPay = 1`)")
                            .with_span(&span),
                    );
                    continue;
                }
            };
            match (vargs.code.as_ref().map(|c| (**c, c.span())), from_discriminant) {
                (Some((c, span)), Some(d)) if c != d => {
                    errors.push(
                        darling::Error::custom(format!(
                            "`code = {c}` contradicts the discriminant `{} = {d}`; keep one of them",
                            v.ident
                        ))
                        .with_span(&span),
                    );
                    continue;
                }
                (Some((c, _)), _) | (None, Some(c)) => Code::Int(c),
                (None, None) => {
                    errors.push(
                        darling::Error::custom(format!(
                            "state `{0}` has no stored code: write `#[state(code = 1)]` on it (or `{0} = 1`), \
                             or store names with `#[state(stored_as = \"name\")]` on the enum",
                            v.ident
                        ))
                        .with_span(&v.ident),
                    );
                    continue;
                }
            }
        };
        let same = |a: &Code, b: &Code| match (a, b) {
            (Code::Text(a), Code::Text(b)) => a.eq_ignore_ascii_case(b),
            _ => a == b,
        };
        if let Some(first) = states.iter().find(|s| same(&s.code, &code)) {
            let shown = match &code {
                Code::Int(i) => i.to_string(),
                Code::Text(t) => format!("\"{t}\""),
            };
            errors.push(
                darling::Error::custom(format!(
                    "`{}` is stored as {shown}, like `{}`: every state needs its own code, or two states \
                     would read back as one (names are compared ignoring case, as MySQL does)",
                    v.ident, first.ident
                ))
                .with_span(&v.ident),
            );
        }
        let to = vargs.to.iter().map(|p| (p.segments.last().map(|s| s.ident.clone()), p)).collect::<Vec<_>>();
        let mut targets = Vec::new();
        for (ident, path) in to {
            let Some(ident) = ident else { continue };
            let prefix_ok = path.segments.len() == 1
                || (path.segments.len() == 2 && (path.segments[0].ident == "Self" || path.segments[0].ident == *name));
            if !prefix_ok {
                errors.push(
                    darling::Error::custom(format!("name a state of `{name}` in `to(...)`, e.g. `to({ident})`"))
                        .with_span(path),
                );
                continue;
            }
            targets.push((ident, path.span()));
        }
        states.push(State { ident: v.ident.clone(), code, to: targets });
    }

    // Targets must name states, and never the state itself. Looked up among
    // all variants, so a variant with an error of its own is not reported
    // again as missing; without errors, `states` holds every variant in order.
    let idents: Vec<String> = data.variants.iter().map(|v| v.ident.to_string()).collect();
    let mut target_indexes: Vec<Vec<usize>> = Vec::new();
    for s in &states {
        let mut indexes = Vec::new();
        for (t, span) in &s.to {
            let t_str = t.to_string();
            match idents.iter().position(|i| *i == t_str) {
                Some(i) if s.ident == idents[i] => errors.push(
                    darling::Error::custom(format!(
                        "`{t}` cannot move to itself: a repeat of the transition would look like a new one \
                         and run its effects again"
                    ))
                    .with_span(span),
                ),
                Some(i) => {
                    if !indexes.contains(&i) {
                        indexes.push(i);
                    }
                }
                None => {
                    let hint = idents
                        .iter()
                        .map(|i| (strsim::damerau_levenshtein(i, &t_str), i))
                        .min()
                        .filter(|(d, _)| *d <= 3)
                        .map(|(_, i)| format!("did you mean `{i}`? "))
                        .unwrap_or_default();
                    errors.push(
                        darling::Error::custom(format!(
                            "`{name}` has no state `{t}`; {hint}the states are {}",
                            list(&idents)
                        ))
                        .with_span(span),
                    );
                }
            }
        }
        target_indexes.push(indexes);
    }

    errors.finish()?;
    let (table, key_columns, status_column) =
        (table.unwrap().remove(0), key_columns.unwrap(), status_column.unwrap().remove(0));

    let name_str = name.to_string();
    let codes = states.iter().map(|s| match &s.code {
        Code::Int(i) => quote!(::idem::state::StateCode::Int(#i)),
        Code::Text(t) => quote!(::idem::state::StateCode::Text(#t)),
    });
    let targets = target_indexes.iter().map(|t| quote!(&[#(#t),*]));
    let undeclared = states.iter().zip(&target_indexes).map(|(s, t)| {
        let allowed = if t.is_empty() {
            "it allows no transition (a final state)".to_owned()
        } else {
            format!("it allows only {}", list(&t.iter().map(|&i| idents[i].clone()).collect::<Vec<_>>()))
        };
        format!(
            "`{name}` does not declare this transition: from `{0}` {allowed}. If the move is legal, add its \
             target to `#[state(to(...))]` on `{0}`; otherwise fix `transition`",
            s.ident
        )
    });
    let unknown_variant =
        format!("this transition names a state `{name}` does not have; the states are {}", list(&idents));
    let pairs: Vec<TokenStream> = states
        .iter()
        .zip(&target_indexes)
        .flat_map(|(s, t)| {
            let from = &s.ident;
            t.iter().map(move |&i| (from.clone(), i))
        })
        .map(|(from, i)| {
            let to = &states[i].ident;
            quote!((#name::#from, #name::#to))
        })
        .collect();
    let can = if pairs.is_empty() {
        quote!({
            let _ = (from, to);
            false
        })
    } else {
        quote!(::core::matches!((from, to), #(#pairs)|*))
    };
    let variant_names = &idents;
    let variant_idents = states.iter().map(|s| &s.ident);
    Ok(quote! {
        // The states are often only named in attribute strings (a
        // transition), which the compiler does not count as a use: without
        // this, every state the code never builds warns as dead code. A
        // closure that is never called names them without running anything.
        const _: () = {
            let _ = || [#(#name::#variant_idents),*];
        };

        impl ::idem::StateMachine for #name {
            const STATES: ::idem::state::StateTable = ::idem::state::StateTable {
                name: #name_str,
                table: #table,
                key_columns: &[#(#key_columns),*],
                status_column: #status_column,
                variants: &[#(#variant_names),*],
                codes: &[#(#codes),*],
                targets: &[#(#targets),*],
                undeclared: &[#(#undeclared),*],
                unknown_variant: #unknown_variant,
            };
        }

        impl #name {
            /// True when the state machine declares the transition `from -> to`
            /// (generated by `#[derive(idem::StateMachine)]`).
            #[allow(dead_code)]
            pub const fn can_transition(from: Self, to: Self) -> bool {
                #can
            }
        }
    })
}

fn list(names: &[String]) -> String {
    names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
}

fn int_literal(e: &Expr) -> Result<i64, Span> {
    match e {
        Expr::Lit(l) => match &l.lit {
            Lit::Int(i) => i.base10_parse::<i64>().map_err(|_| i.span()),
            other => Err(other.span()),
        },
        Expr::Unary(u) if matches!(u.op, UnOp::Neg(_)) => int_literal(&u.expr).map(|i| -i),
        Expr::Group(g) => int_literal(&g.expr),
        other => Err(other.span()),
    }
}

/// `schema.table` or `column`: letters, digits, `_`, not starting with a digit.
fn is_sql_identifier(s: &str) -> bool {
    let part = |p: &str| {
        !p.is_empty()
            && p.len() <= 64
            && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !p.starts_with(|c: char| c.is_ascii_digit())
    };
    let parts: Vec<&str> = s.split('.').collect();
    parts.len() <= 2 && parts.iter().all(|p| part(p))
}

/// `WaitPay` -> `WAIT_PAY`.
fn screaming_snake(ident: &str) -> String {
    let mut out = String::new();
    let mut prev_lower = false;
    for c in ident.chars() {
        if c.is_uppercase() && prev_lower {
            out.push('_');
        }
        prev_lower = c.is_lowercase() || c.is_ascii_digit();
        out.extend(c.to_uppercase());
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn names() {
        assert_eq!(super::screaming_snake("WaitPay"), "WAIT_PAY");
        assert_eq!(super::screaming_snake("Paid"), "PAID");
        assert!(super::is_sql_identifier("shop.orders"));
        assert!(!super::is_sql_identifier("orders; DROP TABLE x"));
        assert!(!super::is_sql_identifier("1x"));
    }
}
