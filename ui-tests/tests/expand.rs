//! Expansion snapshots: what `#[idempotent]` generates for a few representative
//! functions, pinned in `expand/*.expanded.rs` (readable `cargo expand` output
//! is part of the product). Regenerate with
//! `MACROTEST=overwrite cargo test -p idem-ui-tests --test expand`.
//!
//! Needs `cargo-expand` (`cargo install cargo-expand --locked`); `.ci/run`
//! installs a pinned version. Without it the test says it skipped, and why,
//! unless `IDEM_REQUIRE_EXPAND=1` makes that a failure.

#[test]
fn expansions_match_their_snapshots() {
    let installed = std::process::Command::new("cargo")
        .args(["expand", "--version"])
        .output()
        .is_ok_and(|out| out.status.success());
    if !installed {
        let reason = "cargo-expand is not installed (cargo install cargo-expand --locked)";
        if std::env::var("IDEM_REQUIRE_EXPAND").is_ok_and(|v| v == "1") {
            panic!("{reason}, and IDEM_REQUIRE_EXPAND=1");
        }
        // Written past the harness's capture, in the form .ci/run counts
        // as a skip (as tests/support/lib.rs, `skip`, does).
        use std::io::Write as _;
        let line = format!("SKIPPED: expansions_match_their_snapshots: {reason}\n");
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
        return;
    }
    macrotest::expand("expand/*.rs");
}
