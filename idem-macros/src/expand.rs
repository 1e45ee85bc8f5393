//! Code generation. The expansion keeps the signature and wraps the body in
//! calls of the runtime's public guard API: a `Guard` built from the
//! parameters, one strategy method, and the ticket that sees the body's
//! result. All logic lives in idem-runtime.

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Ident, ItemFn};

use crate::errors::respan;
use crate::validate::{Plan, Strategy, TransitionArg, UniquePlan};

pub fn guarded(mut func: ItemFn, plan: Plan) -> TokenStream {
    let fn_name = func.sig.ident.to_string();
    let receiver = func.sig.receiver().is_some();
    let params = func
        .sig
        .inputs
        .iter()
        .filter_map(|input| match input {
            syn::FnArg::Typed(pt) => match &*pt.pat {
                syn::Pat::Ident(pi) => Some(pi.ident.clone()),
                _ => None,
            },
            syn::FnArg::Receiver(_) => None,
        })
        .collect();
    let ex = Expansion { plan: &plan, fn_name, receiver, params };
    let body = match &plan.tx {
        None => ex.without_tx(&func.block),
        Some((tx, tx_ty)) => ex.in_tx(&func.block, tx, tx_ty),
    };
    // Only the body changes: name, generics, lifetimes, attributes and
    // visibility stay exactly as written.
    func.block = Box::new(syn::parse2(body).expect("generated body parses"));
    func.into_token_stream()
}

struct Expansion<'p> {
    plan: &'p Plan,
    fn_name: String,
    /// The function is a method (`self` goes first to a replay function).
    receiver: bool,
    /// The named parameters, in order.
    params: Vec<Ident>,
}

impl Expansion<'_> {
    /// The runtime crate's path: `::idem`, or `crate = "..."`.
    fn krate(&self) -> &syn::Path {
        &self.plan.krate
    }

    fn ret_span(&self) -> Span {
        self.plan.ret.span()
    }

    /// The runtime crate's path, every token at `span` (so that an error in
    /// a call spanned there is reported there, not at the attribute).
    fn krate_at(&self, span: Span) -> TokenStream {
        respan(self.krate().to_token_stream(), span)
    }

    /// `Guard::new(scope).key_source(..).retention(..).key(..)...`: every
    /// setting the attribute gives, each part spanned at its expression so
    /// that a part that is no key type is reported there.
    fn guard(&self) -> TokenStream {
        let (krate, plan) = (self.krate(), self.plan);
        let scope = match &plan.scope {
            Some(s) => quote!(#s),
            None => {
                let name = &self.fn_name;
                quote!(::core::concat!(::core::module_path!(), "::", #name))
            }
        };
        let key_source = &plan.key.source;
        // State strategies also bind each part to the entity's key column.
        let method = if plan.strategy.moves_state() { "entity_key" } else { "key" };
        let parts = plan.key.parts.iter().map(|part| {
            let method = Ident::new(method, part.span());
            quote_spanned!(part.span()=> .#method(&(#part)))
        });
        let retention = plan.retention_ms.map(|ms| quote!(.retention(#krate::__private::Duration::from_millis(#ms))));
        let claim_after = plan.claim.map(|method| {
            let method = Ident::new(method, Span::call_site());
            quote!(.#method())
        });
        let fingerprint = plan.fingerprint.as_ref().map(|fp| quote_spanned!(fp.span()=> .fingerprint(&(#fp))));
        let on_store_error =
            plan.allow_on_store_error.then(|| quote!(.on_store_error(#krate::__private::OnStoreError::Allow)));
        quote! {
            #krate::Guard::new(#scope)
                .key_source(#key_source)
                #retention #claim_after #(#parts)* #fingerprint #on_store_error
        }
    }

    /// `let __idem_store = ...;`: the expression given as `store` (spanned
    /// there, where a value that is no store of the right kind is
    /// reported), or the installed store of `role` (one failing with
    /// `Error::NoStore` if none is). `let x = &(expr);` keeps a temporary
    /// alive for the whole body.
    fn store(&self, role: &str) -> TokenStream {
        let krate = self.krate();
        match &self.plan.store {
            Some(expr) => {
                let wrap = Ident::new(&format!("{role}_store"), expr.span());
                let krate = respan(krate.to_token_stream(), expr.span());
                quote_spanned! {expr.span()=>
                    let __idem_store = &(#expr);
                    let __idem_store = #krate::__private::#wrap(__idem_store);
                }
            }
            None => {
                let installed = Ident::new(&format!("installed_{role}"), Span::call_site());
                quote!(let __idem_store = #krate::__private::#installed();)
            }
        }
    }

    /// `.precheck(store, ttl)`: the store named by `store` for `dedup` and
    /// `dedup+state`; the installed precheck store where `store` names the
    /// lease or token store.
    fn precheck(&self) -> Option<TokenStream> {
        let plan = self.plan;
        if !plan.precheck {
            return None;
        }
        let krate = self.krate();
        let ttl = millis(krate, plan.ttl_ms, quote!(#krate::precheck::DEFAULT_TTL));
        let store = match plan.strategy {
            Strategy::Dedup | Strategy::DedupState => quote!(__idem_store),
            _ => quote!(#krate::__private::installed_precheck()),
        };
        Some(quote!(.precheck(#store, #ttl)))
    }

    /// `match claim { Ok(Claim::Run(t)) => t, other => return settle(other) }`:
    /// a replay or a guard failure returns at once, converted into the
    /// function's own result at its return type.
    fn claimed(&self, claim: TokenStream) -> TokenStream {
        let krate = self.krate();
        let at_ret = self.krate_at(self.ret_span());
        let settle = quote_spanned!(self.ret_span()=> #at_ret::__private::settle(__idem_other));
        quote! {
            match #claim {
                ::core::result::Result::Ok(#krate::Claim::Run(__idem_run)) => __idem_run,
                __idem_other => return #settle,
            }
        }
    }

    /// A lock ticket, or the refusal converted into the function's error.
    fn locked(&self, lock: TokenStream) -> TokenStream {
        let refused =
            quote_spanned!(self.ret_span()=> ::core::result::Result::Err(::core::convert::From::from(__idem_e)));
        quote! {
            match #lock {
                ::core::result::Result::Ok(__idem_lock) => __idem_lock,
                ::core::result::Result::Err(__idem_e) => return #refused,
            }
        }
    }

    fn lock_args(&self) -> TokenStream {
        let krate = self.krate();
        let ttl = millis(krate, self.plan.ttl_ms, quote!(#krate::__private::Duration::ZERO));
        let wait = millis(krate, self.plan.wait_ms, quote!(#krate::__private::Duration::ZERO));
        quote!(__idem_store, #ttl, #wait)
    }

    /// `lease`, `token` and `lock` alone: no transaction; the body runs
    /// under the ticket, which settles the store afterwards.
    fn without_tx(&self, block: &syn::Block) -> TokenStream {
        let (krate, plan) = (self.krate(), self.plan);
        let guard = self.guard();
        let (setup, ticket) = match plan.strategy {
            Strategy::Token => {
                let token = token_arg(krate, plan.token.as_ref());
                (self.store("token"), self.claimed(quote!(#guard.token(__idem_store, #token).await)))
            }
            Strategy::Lock => {
                let args = self.lock_args();
                (self.store("lock"), self.locked(quote!(#guard.lock_only(#args).await)))
            }
            _ => {
                let lease = millis(krate, plan.lease_ms, quote!(#krate::lease::DEFAULT_LEASE));
                // At the return type, like `run` below: an answer that is not
                // `Replayable` is reported there, once for both.
                let lease = match plan.wait_ms {
                    None => quote_spanned!(self.ret_span()=> lease(__idem_store, #lease)),
                    Some(_) => {
                        let wait = millis(krate, plan.wait_ms, quote!(#krate::__private::Duration::ZERO));
                        quote_spanned!(self.ret_span()=> lease_or_wait(__idem_store, #lease, #wait))
                    }
                };
                let precheck = self.precheck();
                (self.store("lease"), self.claimed(quote!(#guard #precheck .#lease.await)))
            }
        };
        let ret = &plan.ret;
        if let Some(steps) = &plan.steps {
            // The body's step log under the name it gave; moved into the
            // body's future, which the ticket runs to the end.
            let run = quote_spanned!(self.ret_span()=> __idem_ticket.run_steps(
                |__idem_steps| async move { let #steps = &__idem_steps; #block }
            ).await);
            return quote! {
                {
                    #setup
                    let __idem_ticket = #ticket;
                    let __idem_result: #ret = #run;
                    __idem_result
                }
            };
        }
        let run = quote_spanned!(self.ret_span()=> __idem_ticket.run(__idem_body).await);
        quote! {
            {
                #setup
                let __idem_ticket = #ticket;
                let __idem_body = async #block;
                let __idem_result: #ret = #run;
                __idem_result
            }
        }
    }

    /// Strategies that work in the caller's transaction.
    fn in_tx(&self, block: &syn::Block, tx: &Ident, tx_ty: &syn::Type) -> TokenStream {
        let plan = self.plan;
        // The transaction is taken at its parameter's type, once per use:
        // that is where a pool or an unsupported database is reported, once
        // (every token of the call carries that span, so both uses yield the
        // same diagnostic).
        let mut tx_at_type = tx.clone();
        tx_at_type.set_span(tx_ty.span());
        let krate = self.krate_at(tx_ty.span());
        let conn = quote_spanned!(tx_ty.span()=> &mut #krate::__private::connection(&mut *#tx_at_type));
        let claim = self.claim_in_tx(&conn);
        let ret = &plan.ret;
        let finish = quote_spanned!(self.ret_span()=> __idem_ticket.finish(#conn, __idem_result).await);
        let body = self.with_locals(block, tx);
        let transition = plan.transition.as_ref().map(|t| self.transition(t));
        if let Some(unique) = &plan.unique {
            return self.unique(unique, &conn, body, tx, transition);
        }
        if plan.strategy.is_lock() {
            // The lock is taken first and held (renewed) while the claim,
            // the body and the completion run in the transaction.
            let ticket = self.claimed(quote!(__idem_guard.#claim.await));
            let args = self.lock_args();
            let lock = self.locked(quote!(__idem_guard.lock(#args).await));
            let run = quote_spanned!(self.ret_span()=> __idem_lock.run(__idem_body).await);
            let (guard, setup) = (self.guard(), self.store("lock"));
            return quote! {
                {
                    #transition
                    #setup
                    let __idem_guard = #guard;
                    let __idem_lock = #lock;
                    let __idem_body = async {
                        let __idem_ticket = #ticket;
                        let __idem_result: #ret = async #body.await;
                        #finish
                    };
                    let __idem_result: #ret = #run;
                    __idem_result
                }
            };
        }
        let setup = match plan.strategy {
            Strategy::TokenDedup => Some(self.store("token")),
            _ if plan.precheck => Some(self.store("precheck")),
            _ => None,
        };
        let (guard, precheck) = (self.guard(), self.precheck());
        let ticket = self.claimed(quote!(#guard #precheck .#claim.await));
        quote! {
            {
                #transition
                #setup
                let __idem_ticket = #ticket;
                let __idem_result: #ret = async #body.await;
                #finish
            }
        }
    }

    /// `unique` and `unique+state`: the body's insert is the claim; a
    /// duplicate's answer is the replay function's, called with the
    /// function's own parameters (the transaction reborrowed) and checked
    /// at the `replay` argument to answer the function's type.
    fn unique(
        &self,
        unique: &UniquePlan,
        conn: &TokenStream,
        body: syn::Block,
        tx: &Ident,
        transition: Option<TokenStream>,
    ) -> TokenStream {
        let (krate, plan) = (self.krate(), self.plan);
        let ret = &plan.ret;
        let ret_span = self.ret_span();
        let constraint = &unique.constraint;
        let savepoint = (!unique.savepoint).then(|| quote!(.savepoint(false)));
        let claim = match plan.strategy {
            Strategy::UniqueState => {
                quote_spanned!(ret_span=> unique_state(#conn, #constraint, &__IDEM_TRANSITION))
            }
            _ => quote_spanned!(ret_span=> unique(#conn, #constraint)),
        };
        let failed = quote_spanned!(ret_span=> ::core::result::Result::Err(::core::convert::From::from(__idem_e)));
        let finish = quote_spanned!(ret_span=> __idem_ticket.finish(#conn, __idem_result).await);
        let replay = &unique.replay;
        let replay_span = replay.span();
        let args = self.replay_args(tx);
        let call = match self.receiver() {
            Some(receiver) if matches!(replay, syn::Expr::Path(p) if p.path.segments.len() == 1) => {
                quote_spanned!(replay_span=> Self::#replay(#receiver, #(#args),*))
            }
            Some(receiver) => quote_spanned!(replay_span=> #replay(#receiver, #(#args),*)),
            None => quote_spanned!(replay_span=> #replay(#(#args),*)),
        };
        let at_replay = self.krate_at(replay_span);
        let answer = quote_spanned!(replay_span=> #at_replay::__private::replay_answer(#call.await));
        let guard = self.guard();
        quote! {
            {
                #transition
                let __idem_replaying = match #guard #savepoint .#claim.await {
                    ::core::result::Result::Ok(#krate::Claim::Run(__idem_ticket)) => {
                        let __idem_result: #ret = async #body.await;
                        match #finish {
                            #krate::unique::Completed::Answer(__idem_answer) => return __idem_answer,
                            #krate::unique::Completed::Duplicate(__idem_replaying) => __idem_replaying,
                        }
                    }
                    ::core::result::Result::Ok(#krate::Claim::Replay(__idem_replaying)) => __idem_replaying,
                    ::core::result::Result::Err(__idem_e) => return #failed,
                };
                let __idem_replayed: #ret = #answer;
                __idem_replaying.answer(__idem_replayed)
            }
        }
    }

    /// `self`, if the function is a method.
    fn receiver(&self) -> Option<TokenStream> {
        self.receiver.then(|| quote!(self))
    }

    /// The function's parameters as the replay function takes them: the
    /// transaction reborrowed, the others as they are.
    fn replay_args(&self, tx: &Ident) -> Vec<TokenStream> {
        self.params.iter().map(|p| if p == tx { quote!(&mut *#p) } else { quote!(#p) }).collect()
    }

    /// The strategy method of a guard in the caller's transaction, spanned
    /// at the return type (where `Replayable`/`SilentRepeat` are reported).
    fn claim_in_tx(&self, conn: &TokenStream) -> TokenStream {
        let plan = self.plan;
        let span = self.ret_span();
        match plan.strategy {
            Strategy::State | Strategy::LockState => quote_spanned!(span=> state(#conn, &__IDEM_TRANSITION)),
            Strategy::DedupState => quote_spanned!(span=> dedup_state(#conn, &__IDEM_TRANSITION)),
            Strategy::TokenDedup => {
                let token = token_arg(self.krate(), plan.token.as_ref());
                quote_spanned!(span=> token_dedup(#conn, __idem_store, #token))
            }
            _ => quote_spanned!(span=> dedup(#conn)),
        }
    }

    /// The transition as a constant checked at compile time against the
    /// enum's declared transitions; every token points at the attribute's
    /// `transition` string, where a mistake in it is reported.
    fn transition(&self, t: &TransitionArg) -> TokenStream {
        let krate = respan(self.krate().to_token_stream(), t.span);
        let span = t.span;
        let enum_path = respan(t.enum_path.to_token_stream(), span);
        let from = t.from.iter().map(|v| v.to_string());
        let to = t.to.to_string();
        let n_parts = self.plan.key.parts.len();
        quote_spanned! {span=>
            const __IDEM_TRANSITION: #krate::__private::Transition = #krate::__private::Transition {
                states: &<#enum_path as #krate::StateMachine>::STATES,
                from: &[#(#from),*],
                to: #to,
                key_parts: #n_parts,
            };
            const _: () = __IDEM_TRANSITION.check();
        }
    }
}

impl Expansion<'_> {
    /// The body with its locals in front of its statements: a reborrow of
    /// the transaction, so the body may move its handle and the record can
    /// still be completed after it, and with `outbox = "name"` the call's
    /// outbox handle (taken from the ticket, at the argument's span, where
    /// a build without the feature is told so). They go inside the user's
    /// own braces (which keep their spans): nesting the block in another
    /// one would make a one-line body `{ Ok(1) }` a braced tail
    /// expression, which `unused_braces` warns about at the user's code.
    fn with_locals(&self, block: &syn::Block, tx: &Ident) -> syn::Block {
        let mut body = block.clone();
        if let Some(outbox) = &self.plan.outbox {
            let krate = self.krate_at(outbox.span());
            body.stmts.insert(
                0,
                syn::parse_quote_spanned! {outbox.span()=>
                    let #outbox = #krate::__private::outbox(&__idem_ticket);
                },
            );
        }
        body.stmts.insert(
            0,
            syn::parse_quote! {
                #[allow(unused_variables)]
                let #tx = &mut *#tx;
            },
        );
        body
    }
}

/// The `#[idem(token)]` parameter, read at its span: a type that cannot
/// carry a token is reported there.
fn token_arg(krate: &syn::Path, token: Option<&Ident>) -> TokenStream {
    match token {
        Some(t) => {
            let krate = respan(krate.to_token_stream(), t.span());
            quote_spanned!(t.span()=> #krate::__private::token_param(&(#t)))
        }
        None => quote!(::core::option::Option::None),
    }
}

fn millis(krate: &syn::Path, ms: Option<u64>, default: TokenStream) -> TokenStream {
    match ms {
        Some(ms) => quote!(#krate::__private::Duration::from_millis(#ms)),
        None => default,
    }
}
