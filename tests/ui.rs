//! Compile-time behaviour of `#[rate_limit]`: each error message (tests/ui/fail, with
//! reviewed .stderr files) and each accepted form (tests/ui/pass).

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/fail/*.rs");
    t.pass("tests/ui/pass/*.rs");
}
