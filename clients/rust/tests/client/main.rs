//! The Rust client against servers in process, one test binary with a module per topic:
//! `FencedClient`'s retry rules and failure semantics against a scripted server, the node
//! API token source against a scripted node, https to a proxy with a TLS listener, and
//! token proofs and the typed admin client against a proxy that checks them; sessions
//! (named leaderships) against scripted nodes.
// Tests may unwrap: a failed step panics with its cause.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fenced_client;
mod https;
mod node_api_source;
mod proofs;
mod session;
