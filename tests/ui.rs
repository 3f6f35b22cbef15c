//! The compile-fail suite: one case per rule, with the committed compiler output.
//!
//! The `pass` cases make trybuild run `cargo build` (not only `cargo check`), so an error that
//! appears only after monomorphization would show too. The `check` suite has no pass case, so
//! trybuild runs it with `cargo check` alone: what it rejects, `cargo check` (and so clippy and
//! rust-analyzer) rejects. Refresh the `.stderr` files with
//! `TRYBUILD=overwrite cargo test --test ui` and read every first line as a user would.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}

#[test]
fn ui_check_only() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/check/*.rs");
}

/// The candle interop's rules (feature `candle`, as `scripts/test.sh` runs the suite).
#[cfg(feature = "candle")]
#[test]
fn ui_candle() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/candle/*.rs");
}
