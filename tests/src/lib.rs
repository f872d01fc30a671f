//! Harness for Palisade's end-to-end tests: real `palisade` processes on loopback, a
//! recording upstream that logs what really reached the storage, and an HTTP helper.
//!
//! # Layout
//! - `process`: locating the binary, child guards that SIGCONT then kill on drop, and
//!   starting a `palisade proxy` that reports its bound addresses.
//! - `upstream`: the recording upstream, with per-path hold gates to keep a request in flight.
//! - `client`: a small HTTP client returning status, headers and body.
//! - `wait`: waiting for a condition with a deadline.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::missing_panics_doc)]

pub mod client;
pub mod process;
pub mod upstream;
pub mod wait;
