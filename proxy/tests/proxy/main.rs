//! The proxy in process over real HTTP, one test binary with a module per topic: the
//! admin API, TLS on the admin listener, trust (token proofs, the admin bearer token,
//! the audited reset) and the upstream connection pool. Each test starts a proxy on
//! port 0 with a temporary data directory (`harness`) and calls it as an operator, an
//! election node or a client on the network would.
// Test code outside `#[test]` functions: a failed step should fail the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod harness;

mod admin_api;
mod admin_tls;
mod trust;
mod upstream_pool;
