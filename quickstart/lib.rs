//! The first examples of redlimit, in a package of their own: `cargo run --example
//! quickstart` and `cargo run --example multi_rule` from the workspace root build the
//! library and Tokio only, not the test suite's HTTP, gRPC and benchmark dependencies.
