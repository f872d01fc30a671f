//! Palisade's wire contract, written once.
//!
//! The proxy, the election nodes, the Rust client, the process launcher and the tests
//! all speak the same HTTP contract. Everything that must be spelled the same on both
//! sides of a socket lives here, and nowhere else: header names, the scope rule, token
//! parsing, the problem+json body, the request and response types of the admin API and
//! the node API, and the lines and environment variables that a parent process and a
//! `palisade` child agree on.
//!
//! The crate is data and nothing else: it depends on `http` (status codes and header
//! names) and `serde`, and on two small data crates, `base64` for the text form of token
//! proofs and `time` for the audit line's RFC 3339 times, so that any client can use it
//! without pulling in a runtime. The servers that speak this contract (axum, hyper,
//! tokio, rustls) are `palisade-server`'s.
//!
//! The Python client (`clients/python/palisade.py`) keeps its own copy of the names; a
//! test there checks it against `protocol/cases.json`, which a test here checks against
//! these definitions.
//!
//! # Layout
//! - `headers`: the header names (`Fencing-Token`, `Fencing-Scope`, ...).
//! - `scope`: [`Scope`], the one validator of scope names.
//! - `token`: parsing `Fencing-Token` from a request head.
//! - `uri`: the RFC 3986 character classes the announce entry and the proxy's `Host` check share.
//! - `problem`: [`Problem`], the RFC 9457 error body every API answers with, and
//!   `problem::kind`, the problem kinds of the proxy and the control plane.
//! - `admin`: the proxy's admin API: paths and bodies.
//! - `announce`: [`announce::parse_announce_entry`], the one rule for an `--announce`
//!   entry (`URL` or `NAME=URL`) and its normal form.
//! - `node`: the node API: paths, [`LeaderView`], [`Role`], transfers, test faults.
//! - `lease`: fleet leases: [`LeaseRequest`], [`LeaseGrant`], `POST /v1/lease`, and the
//!   kinds of its refusals.
//! - `store`: the embedded object store's answers: [`StoredObject`], [`KeyList`].
//! - `proof`: the bytes a token proof signs ([`proof::proof_message`]) and its text form
//!   in `Fencing-Token-Proof` ([`proof::encode_proof`], [`proof::decode_proof`]).
//! - `audit`: the audit log's line, [`AuditRecord`], its event names, RFC 3339 times
//!   and the names of rotated files.
//! - `status`: a proxy's status snapshot ([`ProxyStatus`], `GET /v1/status`), which its
//!   HTML status page renders.
//! - `process`: ready lines, failpoint lines, environment variable names, log event names.
//! - `roles`: a credential's role from its certificate's name ([`CredentialRole`],
//!   [`Credential`]) and the 403 problem of a request its role does not allow.
#![deny(missing_docs)]

pub mod admin;
pub mod announce;
pub mod audit;
pub mod headers;
pub mod lease;
pub mod node;
pub mod problem;
pub mod process;
pub mod proof;
pub mod roles;
pub mod scope;
pub mod scopes;
pub mod status;
pub mod store;
pub mod token;
pub mod uri;

pub use admin::{
    AdvanceRequest, AdvanceResponse, FenceList, FenceView, ResetRequest, ResetResponse,
};
pub use audit::AuditRecord;
pub use lease::{LeaseGrant, LeaseRequest, LeaseView};
pub use node::{
    AnnounceChange, AnnounceChanged, AnnounceList, FaultSpec, Health, LeaderView, LongPoll, Member,
    MemberAdd, MemberList, MemberRemove, MemberRole, RemovedProxy, Role, TransferRequest,
    Transferred,
};
pub use problem::Problem;
pub use roles::{Credential, CredentialRole};
pub use scope::{DEFAULT_SCOPE, SCOPE_BYTES_MAX, Scope, ScopeError};
pub use status::ProxyStatus;
pub use store::{KeyList, StoredObject};
pub use token::{TokenError, parse_token, parse_token_header};
