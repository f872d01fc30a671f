//! Header names. HTTP header names are case-insensitive; these are the lowercase forms
//! that `http::HeaderName` uses, and the docs spell them in title case.

use http::HeaderName;

/// `Fencing-Token: <decimal u64>`: the fencing token a write carries. *(fixed)*
pub const FENCING_TOKEN: HeaderName = HeaderName::from_static("fencing-token");
/// `Fencing-Scope: <scope>`: the scope a client chooses, where the proxy allows it. *(fixed)*
pub const FENCING_SCOPE: HeaderName = HeaderName::from_static("fencing-scope");
/// `Fencing-Token-Current: <u64>`: on a rejection, the scope's current fence. *(fixed)*
pub const FENCING_TOKEN_CURRENT: HeaderName = HeaderName::from_static("fencing-token-current");
/// `Fencing-Token-Proof: <base64url>`: the signature that proves a token was issued by
/// the cluster. *(fixed)*
pub const FENCING_TOKEN_PROOF: HeaderName = HeaderName::from_static("fencing-token-proof");
/// `Palisade-Revision: <u64>`: on a read from the embedded object store, the store-wide
/// revision of the put that wrote the object (apply order across keys).
pub const REVISION: HeaderName = HeaderName::from_static("palisade-revision");

/// `application/problem+json` (RFC 9457): the content type of every error body.
pub const PROBLEM_JSON: &str = "application/problem+json";
/// The content type of every other API body.
pub const JSON: &str = "application/json";
/// Prometheus' text exposition format, for `/metrics`.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";
