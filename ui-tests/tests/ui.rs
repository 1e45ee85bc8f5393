//! Compile-time rules of `#[idempotent]`: every rule has a `fail/` case whose
//! `.stderr` pins the message; `pass/` holds signatures that must keep working.
//! Regenerate the `.stderr` files with `TRYBUILD=overwrite cargo test -p idem-ui-tests --test ui`.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("fail/*.rs");
    t.pass("pass/*.rs");
}
