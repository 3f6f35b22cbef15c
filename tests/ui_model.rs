//! Compile-time model definitions (`shapeproof::model!`) and user-declared kernels: the
//! definitions that must compile, and the errors of those that must not, as a user reads them.

#[test]
fn model_definitions() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/model_*.rs");
    t.compile_fail("tests/ui/fail/model_*.rs");
}
