//! `#[derive(StateMachine)]`: a status enum's variants, stored codes, allowed
//! transitions and storage location, checked here (one `check_*` function
//! per rule, one error accumulator) and emitted as one constant table
//! (`idem::StateMachine::STATES`) plus `const fn can_transition`.

use darling::FromMeta;
use darling::ast::NestedMeta;
use darling::util::{PathList, SpannedValue};
use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::spanned::Spanned;
use syn::{Data, DataEnum, DeriveInput, Expr, Fields, Ident, Lit, UnOp, Variant};

use crate::args::{Argument, parse_list};
use crate::errors::{Errors, did_you_mean, listed};

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

const ENUM_ARGUMENTS: &[Argument] = &[
    Argument { name: "table", takes: "a table name", example: "`table = \"orders\"`" },
    Argument { name: "key_column", takes: "column names", example: "`key_column = \"order_no\"`" },
    Argument { name: "status_column", takes: "a column name", example: "`status_column = \"status\"`" },
    Argument { name: "stored_as", takes: "\"code\" or \"name\"", example: "`stored_as = \"name\"`" },
];

const VARIANT_ARGUMENTS: &[Argument] = &[
    Argument { name: "code", takes: "an integer", example: "`code = 1`" },
    Argument { name: "name", takes: "a name, as a string", example: "`name = \"WAIT_PAY\"`" },
    Argument { name: "to", takes: "a list of states", example: "`to(Paid, Canceled)`" },
];

const EXAMPLE: &str = "#[state(table = \"orders\", key_column = \"order_no\", status_column = \"status\")]";

/// One state as declared: its variant, its stored code, and the targets its
/// `to(...)` names.
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

/// A checked state machine: where its status is stored, its states in
/// declaration order, and each state's targets (indexes into `states`).
struct Machine {
    table: String,
    key_columns: Vec<String>,
    status_column: String,
    states: Vec<State>,
    targets: Vec<Vec<usize>>,
}

pub fn derive(input: DeriveInput) -> TokenStream {
    let mut errors = Errors::default();
    match check(&input, &mut errors) {
        Some(machine) if errors.is_empty() => emit(&input.ident, &machine),
        _ => errors.into_compile_error(),
    }
}

fn check(input: &DeriveInput, errors: &mut Errors) -> Option<Machine> {
    let name = &input.ident;
    let Data::Enum(data) = &input.data else {
        let help = "one fieldless variant per status, e.g. `enum OrderStatus { WaitPay, Paid }`";
        errors.on(name, "#[derive(StateMachine)] goes on an enum of states", help);
        return None;
    };
    check_shape(input, data, errors);
    // When the arguments do not parse, their error is the one to fix: no
    // "missing" errors for the arguments that could not be read.
    let args = state_args::<EnumArgs>(&input.attrs, ENUM_ARGUMENTS, errors);
    let location = args.as_ref().and_then(|args| check_location(name, args, errors));
    let by_name = args.as_ref().is_some_and(|args| check_stored_as(args, errors));
    let mut states: Vec<State> = Vec::new();
    for variant in &data.variants {
        if let Some(state) = check_state(name, variant, by_name, &states, errors) {
            states.push(state);
        }
    }
    let targets = check_targets(name, data, &states, errors);
    let (table, key_columns, status_column) = location?;
    Some(Machine { table, key_columns, status_column, states, targets })
}

/// A plain enum with at least one state.
fn check_shape(input: &DeriveInput, data: &DataEnum, errors: &mut Errors) {
    if !input.generics.params.is_empty() {
        let what = "a state enum cannot be generic: its states are stored as fixed codes";
        errors.on(&input.generics, what, "remove the generic parameters");
    }
    if data.variants.is_empty() {
        errors.on(&input.ident, "a state machine needs at least one state", "add a variant per status");
    }
}

/// Arguments of every `#[state(...)]` attribute in `attrs`, merged; `None`
/// if they do not parse.
fn state_args<T: FromMeta + Default>(attrs: &[syn::Attribute], known: &[Argument], errors: &mut Errors) -> Option<T> {
    let mut items = Vec::new();
    for attr in attrs.iter().filter(|a| a.path().is_ident("state")) {
        let parsed = attr.meta.require_list().and_then(|list| NestedMeta::parse_meta_list(list.tokens.clone()));
        match parsed {
            Ok(list) => items.extend(list),
            Err(e) => {
                let help = format!("write its arguments as `name = value`, e.g. {}", known[0].example);
                errors.at(e.span(), format!("`#[state]` does not parse: {e}"), help);
                return None;
            }
        }
    }
    if items.is_empty() { Some(T::default()) } else { parse_list(&items, known, errors) }
}

/// `table`, `key_column` and `status_column`: given, and plain SQL names
/// (idem writes them into its SQL unquoted).
fn check_location(name: &Ident, args: &EnumArgs, errors: &mut Errors) -> Option<(String, Vec<String>, String)> {
    let table = check_sql_names(name, &args.table, "table", false, errors);
    let key_columns = check_sql_names(name, &args.key_column, "key_column", true, errors);
    let status_column = check_sql_names(name, &args.status_column, "status_column", false, errors);
    Some((table?.remove(0), key_columns?, status_column?.remove(0)))
}

fn check_sql_names(
    name: &Ident,
    arg: &Option<SpannedValue<String>>,
    what: &str,
    list: bool,
    errors: &mut Errors,
) -> Option<Vec<String>> {
    let Some(v) = arg else {
        errors.on(name, format!("missing `{what}`: where the status is stored"), format_args!("write e.g. {EXAMPLE}"));
        return None;
    };
    let parts: Vec<String> =
        if list { v.split(',').map(|s| s.trim().to_owned()).collect() } else { vec![v.trim().to_owned()] };
    if let Some(bad) = parts.iter().find(|p| !is_sql_identifier(p)) {
        let what = format!("`{what} = \"{}\"`: `{bad}` is not a plain SQL name", v.as_str());
        let help = "use letters, digits and `_` (or `schema.table`): idem writes it into its SQL unquoted";
        errors.at(v.span(), what, help);
        return None;
    }
    Some(parts)
}

/// `stored_as`: `"code"` (the default) or `"name"`; true for names.
fn check_stored_as(args: &EnumArgs, errors: &mut Errors) -> bool {
    match args.stored_as.as_ref().map(|s| (s.as_str(), s.span())) {
        None | Some(("code", _)) => false,
        Some(("name", _)) => true,
        Some((other, span)) => {
            let help = "use \"code\" (an integer per state, the default) or \"name\" (text)";
            errors.at(span, format!("unknown `stored_as = \"{other}\"`"), help);
            false
        }
    }
}

/// One variant: fieldless, with its stored code (unique), and targets that
/// name states of this enum.
fn check_state(name: &Ident, v: &Variant, by_name: bool, states: &[State], errors: &mut Errors) -> Option<State> {
    if !matches!(v.fields, Fields::Unit) {
        let help = "a state is a plain name stored in one column: keep data in the entity's own columns";
        errors.on(&v.fields, format!("state `{}` has fields", v.ident), help);
        return None;
    }
    let args = state_args::<VariantArgs>(&v.attrs, VARIANT_ARGUMENTS, errors)?;
    let code = if by_name { name_code(v, &args, errors) } else { int_code(v, &args, errors)? };
    check_unique_code(v, &code, states, errors);
    let to = check_to_paths(name, &args.to, errors);
    Some(State { ident: v.ident.clone(), code, to })
}

/// `stored_as = "name"`: the variant's `name`, or its name in SCREAMING_SNAKE.
fn name_code(v: &Variant, args: &VariantArgs, errors: &mut Errors) -> Code {
    if let Some(code) = &args.code {
        errors.at(code.span(), "`code` has no meaning with `stored_as = \"name\"`", "use `name = \"...\"` instead");
    }
    match &args.name {
        Some(n) => {
            if n.is_empty() || n.contains(['\'', '\\']) {
                let what = "a stored name cannot be empty or hold quotes or backslashes";
                errors.at(n.span(), what, "use letters, digits and `_`, e.g. `name = \"WAIT_PAY\"`");
            }
            Code::Text(n.as_str().to_owned())
        }
        None => Code::Text(screaming_snake(&v.ident.to_string())),
    }
}

/// Stored as integers (the default): `code = N` or the discriminant `X = N`.
fn int_code(v: &Variant, args: &VariantArgs, errors: &mut Errors) -> Option<Code> {
    if let Some(n) = &args.name {
        let what = "`name` has no meaning with integer codes (the default)";
        errors.at(n.span(), what, "add `#[state(stored_as = \"name\")]` on the enum, or use `code = N`");
    }
    let discriminant = match v.discriminant.as_ref().map(|(_, e)| int_literal(e)) {
        None => None,
        Some(Ok(i)) => Some(i),
        Some(Err(span)) => {
            errors.at(span, "a state's code must be an integer literal", "write e.g. `WaitPay = 1`");
            return None;
        }
    };
    match (args.code.as_ref().map(|c| (**c, c.span())), discriminant) {
        (Some((c, span)), Some(d)) if c != d => {
            errors.at(
                span,
                format!("`code = {c}` contradicts the discriminant `{} = {d}`", v.ident),
                "keep one of them",
            );
            None
        }
        (Some((c, _)), _) | (None, Some(c)) => Some(Code::Int(c)),
        (None, None) => {
            let help = format!(
                "write `#[state(code = 1)]` on it (or `{} = 1`), or store names: `#[state(stored_as = \"name\")]` \
                 on the enum",
                v.ident
            );
            errors.on(&v.ident, format!("state `{}` has no stored code", v.ident), help);
            None
        }
    }
}

/// Two states stored alike would read back as one (names compare ignoring
/// case, as MySQL does).
fn check_unique_code(v: &Variant, code: &Code, states: &[State], errors: &mut Errors) {
    let same = |a: &Code, b: &Code| match (a, b) {
        (Code::Text(a), Code::Text(b)) => a.eq_ignore_ascii_case(b),
        _ => a == b,
    };
    if let Some(first) = states.iter().find(|s| same(&s.code, code)) {
        let shown = match code {
            Code::Int(i) => i.to_string(),
            Code::Text(t) => format!("\"{t}\""),
        };
        let what = format!("`{}` is stored as {shown}, like `{}`", v.ident, first.ident);
        errors.on(&v.ident, what, "give every state its own code, or the two read back as one (names ignore case)");
    }
}

/// `to(...)` names states of this enum: `X`, `Self::X` or `Enum::X`.
fn check_to_paths(name: &Ident, to: &PathList, errors: &mut Errors) -> Vec<(Ident, Span)> {
    let mut targets = Vec::new();
    for path in to.iter() {
        let Some(ident) = path.segments.last().map(|s| s.ident.clone()) else { continue };
        let segments = &path.segments;
        let ours =
            segments.len() == 1 || (segments.len() == 2 && (segments[0].ident == "Self" || segments[0].ident == *name));
        if !ours {
            let what = format!("`to(...)` names a path that is not a state of `{name}`");
            errors.on(path, what, format_args!("name the state alone, e.g. `to({ident})`"));
            continue;
        }
        targets.push((ident, path.span()));
    }
    targets
}

/// Targets must name states, and never the state itself. Looked up among all
/// variants, so a variant with an error of its own is not reported again as
/// missing; without errors, `states` holds every variant in order.
fn check_targets(name: &Ident, data: &DataEnum, states: &[State], errors: &mut Errors) -> Vec<Vec<usize>> {
    let idents: Vec<String> = data.variants.iter().map(|v| v.ident.to_string()).collect();
    let mut all = Vec::new();
    for s in states {
        let mut indexes = Vec::new();
        for (t, span) in &s.to {
            match idents.iter().position(|i| *t == i) {
                Some(i) if s.ident == idents[i] => {
                    let help = "remove it from `to(...)`: a repeat would look like a new transition and run again";
                    errors.at(*span, format!("`{t}` cannot move to itself"), help);
                }
                Some(i) if !indexes.contains(&i) => indexes.push(i),
                Some(_) => {}
                None => {
                    let all = listed(&idents);
                    let help = match did_you_mean(&t.to_string(), idents.iter().map(String::as_str)) {
                        Some(close) => format!("did you mean `{close}`? The states are {all}"),
                        None => format!("the states are {all}"),
                    };
                    errors.at(*span, format!("`{name}` has no state `{t}`"), help);
                }
            }
        }
        all.push(indexes);
    }
    all
}

/// `impl StateMachine` (the table the runtime reads) and `can_transition`.
fn emit(name: &Ident, m: &Machine) -> TokenStream {
    let idents: Vec<String> = m.states.iter().map(|s| s.ident.to_string()).collect();
    let (name_str, table, key_columns, status_column) = (name.to_string(), &m.table, &m.key_columns, &m.status_column);
    let codes = m.states.iter().map(|s| match &s.code {
        Code::Int(i) => quote!(::idem::state::StateCode::Int(#i)),
        Code::Text(t) => quote!(::idem::state::StateCode::Text(#t)),
    });
    let targets = m.targets.iter().map(|t| quote!(&[#(#t),*]));
    let undeclared = undeclared_messages(name, m, &idents);
    let unknown_variant =
        format!("this transition names a state `{name}` does not have\nhelp: the states are {}", listed(&idents));
    let can = can_transition_body(name, m);
    let variant_idents = m.states.iter().map(|s| &s.ident);
    quote! {
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
                variants: &[#(#idents),*],
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
    }
}

/// Per state, the compile-time error of a `transition` leaving it for a state
/// it does not declare.
fn undeclared_messages(name: &Ident, m: &Machine, idents: &[String]) -> Vec<String> {
    m.states
        .iter()
        .zip(&m.targets)
        .map(|(s, t)| {
            let allowed = if t.is_empty() {
                "no transition (a final state)".to_owned()
            } else {
                format!("only {}", listed(t.iter().map(|&i| &idents[i])))
            };
            format!(
                "`{name}` does not declare this transition: from `{0}` it allows {allowed}\nhelp: if the move is \
                 legal, add its target to `#[state(to(...))]` on `{0}`; otherwise fix `transition`",
                s.ident
            )
        })
        .collect()
}

/// `matches!((from, to), (A, B) | ...)` over the declared transitions.
fn can_transition_body(name: &Ident, m: &Machine) -> TokenStream {
    let pairs: Vec<TokenStream> = m
        .states
        .iter()
        .zip(&m.targets)
        .flat_map(|(s, t)| t.iter().map(move |&i| (&s.ident, &m.states[i].ident)))
        .map(|(from, to)| quote!((#name::#from, #name::#to)))
        .collect();
    if pairs.is_empty() {
        quote!({
            let _ = (from, to);
            false
        })
    } else {
        quote!(::core::matches!((from, to), #(#pairs)|*))
    }
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
