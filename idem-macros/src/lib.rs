//! Procedural macros of [idem](https://docs.rs/idem-guard). Use them through the
//! `idem-guard` crate (`use idem::idempotent`); the documentation lives there.
//!
//! `#[idempotent]` goes through three steps: `args.rs` parses the attribute;
//! `validate.rs` checks every rule (one `check_*` function per rule, reading
//! the strategy table of `strategy.rs` where the rule depends on the
//! strategy; rules about the function in `signature.rs`, about text values in
//! `values.rs`), all errors into one accumulator (`errors.rs`), and returns a
//! `Plan`; `expand.rs` turns the plan into the (small) guarded function.
//! `state_machine.rs` is `#[derive(StateMachine)]`.

use proc_macro::TokenStream;
use quote::ToTokens;
use syn::spanned::Spanned;

mod args;
mod errors;
mod expand;
mod signature;
mod state_machine;
mod strategy;
mod validate;
mod values;

// Documented where it is re-exported, in the `idem` crate (a doc comment
// here would be appended to that page).
#[proc_macro_derive(StateMachine, attributes(state))]
pub fn derive_state_machine(item: TokenStream) -> TokenStream {
    match syn::parse::<syn::DeriveInput>(item) {
        Ok(input) => state_machine::derive(input).into(),
        Err(e) => e.to_compile_error().into(),
    }
}

// Documented in the `idem` crate: `docs/idempotent.md`.
#[proc_macro_attribute]
pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    let args = proc_macro2::TokenStream::from(args);
    let mut func: syn::ItemFn = match syn::parse(item.clone()) {
        Ok(f) => f,
        Err(e) => {
            // Not a function: say so, and leave the item as it was.
            let mut out = proc_macro2::TokenStream::from(item);
            let help = "put it on the `async fn` whose repeats it should make harmless";
            out.extend(errors::error(e.span(), "#[idempotent] goes on an `async fn`", help).to_compile_error());
            return out.into();
        }
    };
    let attr_span = if args.is_empty() { func.sig.fn_token.span() } else { args.span() };
    let mut errors = errors::Errors::default();
    let marks = signature::strip_marks(&mut func, &mut errors);
    let plan = args::parse_attribute(args, &mut errors)
        .and_then(|raw| validate::validate(raw, attr_span, &func, &marks, &mut errors));
    match plan {
        Some(plan) => expand::guarded(func, plan).into(),
        None => {
            // Emit the user's function untouched next to the errors, so call
            // sites and the IDE keep working and only the real error shows.
            let mut out = func.into_token_stream();
            out.extend(errors.into_compile_error());
            out.into()
        }
    }
}
