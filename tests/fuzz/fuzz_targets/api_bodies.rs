//! Requests of any method, path and body through the proxy's admin API and the node API,
//! in process (`tower::ServiceExt::oneshot` on their axum routers, as their tests call
//! them; the node API in front of a stand-in election loop that drops what it is sent).
//!
//! Input: a flags byte (which API; the proxy's admin token and whether the request
//! carries it; the node's leadership, test faults, leases and role checks), a method
//! byte, then the path up to the first newline and the body after it.
//!
//! Property: every request is answered (no panic), and every answer that is not 2xx is
//! `application/problem+json` with a problem body.
#![no_main]

use std::sync::{Arc, LazyLock};

use axum::body::Body;
use http::{Method, Request, header};
use http_body_util::BodyExt;
use libfuzzer_sys::fuzz_target;
use palisade_election::Leadership;
use palisade_election::fuzzing::{NodeApiOptions, node_api};
use palisade_protocol::headers::PROBLEM_JSON;
use palisade_protocol::{Problem, Role};
use palisade_storage::FenceRegister;
use tower::ServiceExt;

/// The proxy admin token, when the flags ask for one.
const ADMIN_TOKEN: &[u8] = b"fuzzing-admin-token-0123456789";
/// Scopes the proxy's register takes.
const SCOPES_MAX: usize = 16;
/// Largest answer read back; every answer of these APIs is far smaller.
const ANSWER_BYTES_MAX: usize = 1 << 20;

const METHODS: [Method; 7] = [
    Method::GET,
    Method::POST,
    Method::PUT,
    Method::DELETE,
    Method::HEAD,
    Method::OPTIONS,
    Method::PATCH,
];

static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a runtime")
});

fn leadership(flags: u8) -> Leadership {
    match (flags >> 1) & 3 {
        0 => Leadership {
            term: 7,
            leader_id: Some(2),
            ..Leadership::default()
        },
        1 => Leadership {
            term: 9,
            leader_id: Some(1),
            role: Role::Leader,
            token: Some(9),
            established: Some(9),
            ..Leadership::default()
        },
        2 => Leadership {
            term: 3,
            role: Role::Candidate,
            ..Leadership::default()
        },
        _ => Leadership::default(),
    }
}

fn router(flags: u8) -> axum::Router {
    if flags & 1 == 0 {
        let db = Arc::new(
            redb::Database::builder()
                .create_with_backend(redb::backends::InMemoryBackend::new())
                .expect("an in-memory database"),
        );
        let register = FenceRegister::open(db, SCOPES_MAX).expect("the register opens");
        palisade_proxy::fuzzing::admin_app(register, (flags & 2 != 0).then_some(ADMIN_TOKEN))
    } else {
        node_api(NodeApiOptions {
            leadership: leadership(flags),
            faults: flags & 8 != 0,
            leases: flags & 16 != 0,
            roles_enforced: flags & 32 != 0,
        })
    }
}

async fn run(data: &[u8]) {
    let [flags, method, rest @ ..] = data else {
        return;
    };
    let method = METHODS[usize::from(*method) % METHODS.len()].clone();
    let (path, body) = match rest.iter().position(|&b| b == b'\n') {
        Some(at) => (&rest[..at], &rest[at + 1..]),
        None => (rest, &[][..]),
    };
    let mut request = Request::builder()
        .method(method.clone())
        .uri(path)
        .header(header::CONTENT_TYPE, "application/json");
    if flags & 64 != 0 {
        let mut bearer = b"Bearer ".to_vec();
        bearer.extend_from_slice(ADMIN_TOKEN);
        request = request.header(header::AUTHORIZATION, bearer);
    }
    let Ok(request) = request.body(Body::from(body.to_vec())) else {
        return;
    };
    let Ok(response) = router(*flags).oneshot(request).await;
    let status = response.status();
    if status.is_success() {
        return;
    }
    let content_type = response.headers().get(header::CONTENT_TYPE).cloned();
    assert_eq!(
        content_type.as_ref().and_then(|v| v.to_str().ok()),
        Some(PROBLEM_JSON),
        "{method} {:?}: {status} without problem+json",
        String::from_utf8_lossy(path)
    );
    let bytes = http_body_util::Limited::new(response.into_body(), ANSWER_BYTES_MAX)
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    if method != Method::HEAD {
        let problem: Result<Problem, _> = serde_json::from_slice(&bytes);
        assert!(
            problem.is_ok(),
            "{method} {:?}: {status} with a body that is not a problem: {:?}",
            String::from_utf8_lossy(path),
            String::from_utf8_lossy(&bytes)
        );
    }
}

fuzz_target!(|data: &[u8]| {
    RUNTIME.block_on(run(data));
});
