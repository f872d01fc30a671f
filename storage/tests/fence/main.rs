//! The fence register from outside, one test binary with a module per claim: acknowledged
//! raises survive `kill -9` (`crash`), and any interleaving of advances and reads behaves
//! like a map from scope to the maximum token (`model`).
// Test code: helpers outside `#[test]` functions may unwrap too, and a failure panics with
// its cause, as a test should.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod crash;
mod model;
