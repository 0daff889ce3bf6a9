//! Compile-time behaviour of `#[rate_limit]`: each error message (tests/ui/fail, with
//! reviewed .stderr files). The .stderr files are those of the README's test command,
//! with every feature on (rustc lists the `FromRateLimited` impls the features add).
//! The accepted forms are tests/forms.rs, compiled with the tests: trybuild checks a
//! set of failing cases alone in one `cargo check` of them all, where a set with
//! passing cases builds and runs each case on its own.

#[test]
fn ui() {
    trybuild::TestCases::new().compile_fail("tests/ui/fail/*.rs");
}
