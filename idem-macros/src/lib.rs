//! Procedural macros of [idem](https://docs.rs/idem). Use them through the
//! `idem` crate: `#[idem::idempotent(...)]`; the documentation lives there.
//!
//! `args.rs` parses the attribute, `validate.rs` holds every compile-time rule,
//! `expand.rs` generates the (small) guarded function.

use proc_macro::TokenStream;
use quote::ToTokens;
use syn::spanned::Spanned;

mod args;
mod expand;
mod state_machine;
mod validate;

/// Describe an entity's status enum for the `state` strategies. See the
/// `idem` crate for the attributes.
#[proc_macro_derive(StateMachine, attributes(state))]
pub fn derive_state_machine(item: TokenStream) -> TokenStream {
    match syn::parse::<syn::DeriveInput>(item) {
        Ok(input) => state_machine::derive(input).into(),
        Err(e) => e.to_compile_error().into(),
    }
}

/// Make an async function idempotent. See the `idem` crate for the arguments.
#[proc_macro_attribute]
pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    let args = proc_macro2::TokenStream::from(args);
    let mut func: syn::ItemFn = match syn::parse(item.clone()) {
        Ok(f) => f,
        Err(e) => {
            // Not a function: say so, and leave the item as it was.
            let mut out = proc_macro2::TokenStream::from(item);
            let msg = syn::Error::new(e.span(), "#[idempotent] goes on an `async fn`");
            out.extend(msg.to_compile_error());
            return out.into();
        }
    };
    let attr_span = if args.is_empty() { func.sig.fn_token.span() } else { args.span() };
    let marks = validate::strip_marks(&mut func);

    let raw = darling::ast::NestedMeta::parse_meta_list(args)
        .map_err(darling::Error::from)
        .and_then(|items| <args::RawArgs as darling::FromMeta>::from_list(&items));
    let result = match raw {
        Ok(raw) => validate::validate(raw, attr_span, &func, marks).map_err(|e| e.to_compile_error()),
        Err(e) => {
            let mut errors = e.write_errors();
            for m in marks.errors {
                errors.extend(m.to_compile_error());
            }
            Err(errors)
        }
    };
    match result {
        Ok(plan) => expand::guarded(func, plan).into(),
        Err(errors) => {
            // Emit the user's function untouched next to the errors, so call
            // sites and the IDE keep working and only the real error shows.
            let mut out = func.into_token_stream();
            out.extend(errors);
            out.into()
        }
    }
}
