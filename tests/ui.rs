//! Compile-time behaviour of `#[rate_limit]`: each error message (tests/ui/fail, with
//! reviewed .stderr files) and each accepted form (tests/ui/pass). The .stderr files
//! are those of the README's test command, with every feature on (rustc lists the
//! `FromRateLimited` impls the features add).

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/fail/*.rs");
    t.pass("tests/ui/pass/*.rs");
}
