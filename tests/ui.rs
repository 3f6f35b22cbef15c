//! The compile-fail suite: one case per rule, with the committed compiler output.
//!
//! The `pass` cases make trybuild run `cargo build` (not only `cargo check`), so an error that
//! appears only after monomorphization would show too. Refresh the `.stderr` files with
//! `TRYBUILD=overwrite cargo test --test ui` and read every first line as a user would.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
