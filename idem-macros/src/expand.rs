//! Code generation. The expansion keeps the signature and wraps the body: it
//! builds the key and fingerprint from the parameters and calls the runtime
//! (`Guard::dedup`, then `Ticket::complete`). All logic lives in idem-runtime.

use proc_macro2::TokenStream;
use quote::{ToTokens, quote, quote_spanned};
use syn::ItemFn;
use syn::spanned::Spanned;

use crate::validate::{Plan, Strategy};

pub fn guarded(mut func: ItemFn, plan: Plan) -> TokenStream {
    let fn_name = func.sig.ident.to_string();
    let block = &func.block;
    let Plan {
        strategy,
        key,
        scope,
        fingerprint,
        retention_ms,
        claim_after,
        transition,
        tx,
        lease_ms,
        store,
        token,
        allow_on_store_error,
        precheck,
        ttl_ms,
        wait_ms,
        ret,
    } = plan;

    let scope = match scope {
        Some(s) => quote!(#s),
        None => quote!(::core::concat!(::core::module_path!(), "::", #fn_name)),
    };
    let key_source = &key.source;
    let retention = match retention_ms {
        Some(ms) => quote!(::idem::__private::Duration::from_millis(#ms)),
        None => quote!(::idem::DEFAULT_RETENTION),
    };
    // Each part is spanned at its own expression, so a part that is no key type
    // is reported there (with the message of `IdempotencyKey`).
    // State strategies also bind each part to the entity's key column.
    let key_method = if strategy.moves_state() { "entity_key" } else { "key" };
    let key_parts = key.parts.iter().map(|part| {
        let method = syn::Ident::new(key_method, part.span());
        quote_spanned!(part.span()=> .#method(&(#part)))
    });
    // The transition is a constant checked at compile time against the
    // enum's declared transitions; every token points at the attribute's
    // `transition` string, where a mistake in it is reported.
    let n_parts = key.parts.len();
    let transition = transition.map(|t| {
        let span = t.span;
        let enum_path = respan(t.enum_path.to_token_stream(), span);
        let from = t.from.iter().map(|v| v.to_string());
        let to = t.to.to_string();
        quote_spanned! {span=>
            const __IDEM_TRANSITION: ::idem::__private::Transition = ::idem::__private::Transition {
                states: &<#enum_path as ::idem::StateMachine>::STATES,
                from: &[#(#from),*],
                to: #to,
                key_parts: #n_parts,
            };
            const _: () = __IDEM_TRANSITION.check();
        }
    });
    let fingerprint = fingerprint.map(|fp| quote_spanned!(fp.span()=> .fingerprint(&(#fp))));
    // Conversions into the function's error type are spanned at its return
    // type: that is where `From<idem::Error>` is missing if it is.
    let ret_span = ret.span();
    let settle = quote_spanned!(ret_span=> ::idem::__private::settle(__idem_other));
    let completed = syn::Ident::new("__idem_completed", ret_span);
    let finish = quote_spanned!(ret_span=> ::idem::__private::finish(#completed));
    let spec = quote! {
        static __IDEM_SPEC: ::idem::__private::GuardSpec = ::idem::__private::GuardSpec {
            scope: #scope,
            key_source: #key_source,
            retention: #retention,
            claim_after: #claim_after,
        };
    };
    let guard = quote! {
        ::idem::__private::Guard::new(&__IDEM_SPEC)
            #(#key_parts)*
            #fingerprint
    };
    // Strategies with a store of their own (lease, token, lock) name it
    // `__idem_store`: the expression given as `store`, or the installed one
    // (a store failing with `Error::NoStore` if none is).
    // `let x = &(expr);` keeps a temporary alive for the whole body.
    let store = |wrap: &str, module: &str| {
        match &store {
            Some(expr) => {
                // Spanned at the expression: a value that is no store of the
                // right kind is reported there.
                let wrap = syn::Ident::new(wrap, expr.span());
                quote_spanned! {expr.span()=>
                let __idem_store = &(#expr);
                let __idem_store = ::idem::__private::#wrap(__idem_store);
                }
            }
            None => {
                let installed = syn::Ident::new(&format!("installed_{module}"), proc_macro2::Span::call_site());
                quote!(let __idem_store = ::idem::__private::#installed();)
            }
        }
    };
    let millis = |ms: Option<u64>, default: TokenStream| match ms {
        Some(ms) => quote!(::idem::__private::Duration::from_millis(#ms)),
        None => default,
    };
    let on_store_error = if allow_on_store_error {
        quote!(::idem::__private::OnStoreError::Allow)
    } else {
        quote!(::idem::__private::OnStoreError::Reject)
    };
    // The token is read at its parameter's span: a type that cannot carry a
    // token is reported there.
    let token = token.map(|t| quote_spanned!(t.span()=> ::idem::__private::token_param(&(#t))));
    let ttl = if precheck {
        millis(ttl_ms, quote!(::idem::precheck::DEFAULT_TTL))
    } else {
        millis(ttl_ms, quote!(::idem::__private::Duration::ZERO))
    };
    let wait = millis(wait_ms, quote!(::idem::__private::Duration::ZERO));
    // `Claim::Run` goes on; a replay or a guard failure returns at once.
    let claimed = |claim: TokenStream| {
        quote! {
            match #claim {
                ::core::result::Result::Ok(::idem::__private::Claim::Run(__idem_run)) => __idem_run,
                __idem_other => return #settle,
            }
        }
    };
    let body = match tx {
        None => {
            // `lease`, `token` and `lock` alone: no transaction; the body
            // runs under the ticket, which settles the store afterwards.
            let (setup, claim) = match strategy {
                Strategy::Token => {
                    (store("token_store", "token"), quote!(token(__idem_store, #token, #on_store_error)))
                }
                Strategy::Lock => (store("lock_store", "lock"), quote!(lock_only(__idem_store, #ttl, #wait))),
                _ => {
                    let lease = millis(lease_ms, quote!(::idem::lease::DEFAULT_LEASE));
                    let setup = store("lease_store", "lease");
                    if precheck {
                        // `store` names the lease store; markers go to the
                        // installed precheck store.
                        let setup = quote! {
                            #setup
                            let __idem_precheck = ::idem::__private::installed_precheck();
                        };
                        (setup, quote!(lease_prechecked(__idem_store, #lease, __idem_precheck, #ttl)))
                    } else {
                        (setup, quote!(lease(__idem_store, #lease)))
                    }
                }
            };
            let ticket = claimed(quote!(#guard.#claim.await));
            let run = quote_spanned!(ret_span=> __idem_ticket.run(__idem_body).await);
            quote! {
                {
                    #spec
                    #setup
                    let __idem_ticket = #ticket;
                    let __idem_body = async #block;
                    let __idem_result: #ret = #run;
                    __idem_result
                }
            }
        }
        Some((tx, tx_ty)) => {
            // The transaction is taken at its parameter's type: that is where
            // a pool or an unsupported database is reported, once (every token
            // of the call carries that span, so both uses yield the same
            // diagnostic).
            let tx_span = tx_ty.span();
            let mut tx_at_type = tx.clone();
            tx_at_type.set_span(tx_span);
            let conn = quote_spanned!(tx_span=> ::idem::__private::connection(&mut *#tx_at_type));
            let claim = match strategy {
                Strategy::State | Strategy::LockState => quote_spanned!(ret_span=> state(#conn, &__IDEM_TRANSITION)),
                Strategy::DedupState if precheck => {
                    quote_spanned!(ret_span=> dedup_state_prechecked(#conn, &__IDEM_TRANSITION, __idem_store, #ttl))
                }
                Strategy::DedupState => quote_spanned!(ret_span=> dedup_state(#conn, &__IDEM_TRANSITION)),
                Strategy::TokenDedup if precheck => quote_spanned!(ret_span=>
                    dedup_token_prechecked(#conn, __idem_store, #token, #on_store_error, __idem_precheck, #ttl)
                ),
                Strategy::TokenDedup => {
                    quote_spanned!(ret_span=> dedup_token(#conn, __idem_store, #token, #on_store_error))
                }
                _ if precheck => quote_spanned!(ret_span=> dedup_prechecked(#conn, __idem_store, #ttl)),
                _ => quote_spanned!(ret_span=> dedup(#conn)),
            };
            let locked = strategy.is_lock();
            let ticket =
                if locked { claimed(quote!(__idem_guard.#claim.await)) } else { claimed(quote!(#guard.#claim.await)) };
            // The body may move its transaction handle; it gets a reborrow,
            // so the record can still be completed after it. The reborrow is
            // put in front of the body's own statements, within its own braces
            // (which keep their spans): nesting the user's block in another
            // one would make a one-line body `{ Ok(1) }` a braced tail
            // expression, which `unused_braces` warns about at the user's code.
            let mut body = (**block).clone();
            body.stmts.insert(
                0,
                syn::parse_quote! {
                    #[allow(unused_variables)]
                    let #tx = &mut *#tx;
                },
            );
            let in_tx = quote! {
                let __idem_ticket = #ticket;
                let __idem_result: #ret = async #body.await;
                let #completed = __idem_ticket.complete(#conn, __idem_result).await;
                #finish
            };
            if locked {
                // The lock is taken first and held (renewed) while the claim,
                // the body and the completion run in the transaction.
                let setup = store("lock_store", "lock");
                let lock = claimed(quote!(__idem_guard.lock(__idem_store, #ttl, #wait).await));
                let run = quote_spanned!(ret_span=> __idem_lock.run(__idem_body).await);
                quote! {
                    {
                        #spec
                        #transition
                        #setup
                        let __idem_guard = #guard;
                        let __idem_lock = #lock;
                        let __idem_body = async { #in_tx };
                        let __idem_result: #ret = #run;
                        __idem_result
                    }
                }
            } else {
                let setup = if strategy.is_token() && precheck {
                    // `store` names the token store; markers go to the
                    // installed precheck store.
                    let setup = store("token_store", "token");
                    Some(quote! {
                        #setup
                        let __idem_precheck = ::idem::__private::installed_precheck();
                    })
                } else if strategy.is_token() {
                    Some(store("token_store", "token"))
                } else if precheck {
                    Some(store("precheck_store", "precheck"))
                } else {
                    None
                };
                quote! {
                    {
                        #spec
                        #transition
                        #setup
                        #in_tx
                    }
                }
            }
        }
    };
    // Only the body changes: name, generics, lifetimes, attributes and
    // visibility stay exactly as written.
    func.block = Box::new(syn::parse2(body).expect("generated body parses"));
    func.into_token_stream()
}

/// The same tokens, all pointing at `span`.
fn respan(tokens: TokenStream, span: proc_macro2::Span) -> TokenStream {
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
