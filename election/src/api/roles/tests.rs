//! Roles through the router (`oneshot`, no socket): each request carries the credential a
//! TLS connection would give it. The election loop is stopped (its inbox dropped), so a
//! request a rule lets through reaches its handler and is answered 503 `node-stopped`
//! there (or 200 for what needs no loop): anything but the 403 of a refusal.

use std::sync::Arc;

use axum::Router;
use http::{Request, StatusCode};
use http_body_util::BodyExt as _;
use palisade_protocol::problem::kind;
use palisade_protocol::{AuditRecord, Credential, MemberList, Problem, Scope};
use palisade_server::audit::{AuditConfig, AuditLog};
use palisade_server::roles::PeerCredential;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

use super::super::{ApiState, LeaseApi, app};
use crate::audit::Observer;
use crate::leadership::Leadership;
use crate::metrics::{API_FORBIDDEN, NodeMetrics};
use crate::node::Commands;
use crate::transport::faults::LinkFaults;

/// The proxy entries of the test node: one bound to `proxy-a`, one bare URL.
const BOUND: &str = "http://127.0.0.1:9001";
const UNBOUND: &str = "http://127.0.0.1:9002";

/// Node 1 with leases on for [`BOUND`] (as `proxy-a`) and [`UNBOUND`], test faults, an
/// audit log in `dir`, and roles enforced as `enforced` says; its loop is stopped.
fn node(dir: &std::path::Path, enforced: bool) -> (Router, NodeMetrics) {
    let (tx, rx) = mpsc::channel(4);
    drop(rx);
    let metrics = NodeMetrics::new(1);
    let audit = AuditLog::open(&AuditConfig {
        path: dir.join("node.audit"),
        bytes_max: 1 << 20,
        keep: 1,
    })
    .unwrap();
    let (_, leadership) = watch::channel(Leadership {
        term: 7,
        leader_id: Some(2),
        ..Leadership::default()
    });
    let router = app(ApiState {
        node_id: 1,
        scope: Scope::default_scope(),
        leadership,
        commands: Commands::new(tx),
        metrics: metrics.clone(),
        leases: Some(LeaseApi::new(
            60_000,
            &[format!("proxy-a={BOUND}"), UNBOUND.to_owned()],
        )),
        faults: Some(Arc::new(LinkFaults::new(true, 1, [1, 2, 3]))),
        scores: None,
        members: watch::channel(MemberList::default()).1,
        announce: watch::channel(Vec::new()).1,
        observer: Arc::new(Observer::new(1, &[], Some(audit))),
        fences: crate::announce::ProxyFences::plain("default"),
        shutdown: CancellationToken::new(),
        roles_enforced: enforced,
        scopes: None,
    });
    (router, metrics)
}

/// `method uri` with `body`, as the holder of a certificate naming `names` (`None`: no
/// certificate); the status and the body.
async fn call(
    app: &Router,
    names: Option<&[&str]>,
    method: &str,
    uri: &str,
    body: &str,
) -> (StatusCode, String) {
    let mut request = Request::builder()
        .method(method)
        .uri(uri)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(axum::body::Body::from(body.to_owned()))
        .unwrap();
    if let Some(names) = names {
        request
            .extensions_mut()
            .insert(PeerCredential(Arc::new(Credential::from_names(names))));
    }
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

/// Every route of the API with a body it takes.
const ROUTES: [(&str, &str, &str); 22] = [
    ("GET", "/v1/leader", ""),
    ("POST", "/v1/sessions", r#"{"ttl_ms":5000}"#),
    ("GET", "/v1/sessions", ""),
    ("DELETE", "/v1/sessions/abc", ""),
    ("POST", "/v1/sessions/abc/keepalive", ""),
    ("GET", "/v1/scopes", ""),
    ("GET", "/v1/scopes/billing", ""),
    (
        "POST",
        "/v1/scopes/billing/campaign",
        r#"{"session":"abc"}"#,
    ),
    ("POST", "/v1/scopes/billing/resign", r#"{"session":"abc"}"#),
    ("GET", "/v1/leader?timeout_ms=1", ""),
    ("POST", "/v1/transfer", r#"{"to":2}"#),
    ("POST", "/v1/resign", ""),
    ("POST", "/v1/lease", r#"{"proxy":"http://127.0.0.1:9001"}"#),
    ("GET", "/v1/members", ""),
    ("POST", "/v1/members", r#"{"id":5,"peer":"127.0.0.1:7005"}"#),
    ("DELETE", "/v1/members/2", ""),
    ("GET", "/v1/announce", ""),
    ("POST", "/v1/announce", r#"{"proxies":[]}"#),
    ("GET", "/", ""),
    ("GET", "/v1/test/faults", ""),
    ("GET", "/metrics", ""),
    ("GET", "/healthz", ""),
];

/// The roles `ROUTES[i]` admits, for the credential names of this file.
fn admitted(name: &str, method: &str, uri: &str) -> bool {
    let leader = method == "GET" && uri.starts_with("/v1/leader");
    // Named leaderships: writers hold sessions and campaign; everyone who reads leader
    // views reads scopes; nodes forward keepalives.
    let scope_read = method == "GET" && uri.starts_with("/v1/scopes");
    let session =
        uri.starts_with("/v1/sessions") || (method == "POST" && uri.starts_with("/v1/scopes"));
    let keepalive = uri.ends_with("/keepalive");
    uri == "/healthz"
        || name == "operator-ops"
        || (name != "client" && method == "GET" && uri == "/metrics")
        || (name == "writer-app" && (leader || scope_read || session))
        || (name == "node-3"
            && (leader || scope_read || keepalive || (method == "GET" && uri == "/v1/members")))
        || (name == "proxy-a" && method == "POST" && uri == "/v1/lease")
}

/// Goal: with roles enforced, each credential reaches exactly the routes the table in
/// `roles` gives its role (healthz for any certificate, metrics for any role, leader
/// views and scope reads for writers, operators and nodes, sessions and campaigns for
/// writers, keepalives for writers and nodes, the member list for nodes, leases for
/// proxies, everything for operators), and every other request is a 403 `forbidden-role` naming
/// the role needed and the credential, from this node. Method: every route as
/// `writer-app`, `operator-ops`, `proxy-a`, `node-3`, and a certificate naming no role.
#[tokio::test]
async fn each_role_reaches_exactly_its_routes() {
    let dir = tempfile::tempdir().unwrap();
    let (app, _) = node(dir.path(), true);
    for name in ["writer-app", "operator-ops", "proxy-a", "node-3", "client"] {
        for (method, uri, body) in ROUTES {
            let names = [name, "localhost"];
            let (status, text) = call(&app, Some(&names), method, uri, body).await;
            if admitted(name, method, uri) {
                assert_ne!(
                    status,
                    StatusCode::FORBIDDEN,
                    "{name} {method} {uri}: {text}"
                );
                continue;
            }
            assert_eq!(
                status,
                StatusCode::FORBIDDEN,
                "{name} {method} {uri}: {text}"
            );
            let problem: Problem = serde_json::from_str(&text).unwrap();
            assert_eq!(problem.kind(), kind::FORBIDDEN_ROLE, "{text}");
            assert_eq!(problem.node_id, Some(1), "{text}");
            assert!(problem.detail.contains(name), "{name}: {text}");
            let path = uri.split('?').next().unwrap();
            assert!(
                problem.detail.contains(&format!("{method} {path}")),
                "{text}"
            );
        }
    }
    // Without any certificate (a request a TLS listener never passes on), nothing but
    // healthz.
    let (status, text) = call(&app, None, "GET", "/v1/leader", "").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{text}");
    assert!(text.contains("without a client certificate"), "{text}");
}

/// Goal: a node credential adds only its own node, a proxy credential leases only the
/// entry bound to its name, and an unbound entry only an operator leases; each refusal
/// says why. Method: `node-3` adding 3 and 4; `proxy-a` and `proxy-b` leasing the bound
/// and the unbound entry; an operator leasing the unbound one.
#[tokio::test]
async fn nodes_add_themselves_and_proxies_lease_their_own_entry_only() {
    let dir = tempfile::tempdir().unwrap();
    let (app, _) = node(dir.path(), true);
    let add = |id: u64| format!(r#"{{"id":{id},"peer":"127.0.0.1:7003"}}"#);
    let node3: &[&str] = &["node-3"];
    let (status, text) = call(&app, Some(node3), "POST", "/v1/members", &add(3)).await;
    assert_eq!(
        status,
        StatusCode::SERVICE_UNAVAILABLE,
        "reached the loop: {text}"
    );
    let (status, text) = call(&app, Some(node3), "POST", "/v1/members", &add(4)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{text}");
    assert!(
        text.contains("may add only its own node; adding node 4"),
        "{text}"
    );
    // A body the handler refuses anyway gets the handler's answer.
    let (status, text) = call(&app, Some(node3), "POST", "/v1/members", "{").await;
    assert!(
        status.is_client_error() && status != StatusCode::FORBIDDEN,
        "{text}"
    );

    let lease = |url: &str| format!(r#"{{"proxy":"{url}/"}}"#);
    let proxy_a: &[&str] = &["proxy-a"];
    let proxy_b: &[&str] = &["proxy-b"];
    let operator: &[&str] = &["operator-ops"];
    let (status, text) = call(&app, Some(proxy_a), "POST", "/v1/lease", &lease(BOUND)).await;
    assert_eq!(
        status,
        StatusCode::SERVICE_UNAVAILABLE,
        "reached the loop: {text}"
    );
    let (status, text) = call(&app, Some(proxy_b), "POST", "/v1/lease", &lease(BOUND)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{text}");
    assert!(text.contains("is bound to proxy-a"), "{text}");
    let (status, text) = call(&app, Some(proxy_a), "POST", "/v1/lease", &lease(UNBOUND)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{text}");
    assert!(text.contains("bound to no name"), "{text}");
    let (status, text) = call(&app, Some(operator), "POST", "/v1/lease", &lease(UNBOUND)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{text}");
    // An unknown proxy keeps its own refusal.
    let (status, text) = call(
        &app,
        Some(proxy_a),
        "POST",
        "/v1/lease",
        r#"{"proxy":"http://elsewhere:1"}"#,
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{text}");
    assert!(text.contains("unknown-proxy"), "{text}");
}

/// Goal: without enforcement (a plaintext API), every route is open to a request with no
/// credential and to one with any credential, as before roles existed. Method: every
/// route, without a certificate and as a certificate naming no role.
#[tokio::test]
async fn without_enforcement_every_route_is_open() {
    let dir = tempfile::tempdir().unwrap();
    let (app, _) = node(dir.path(), false);
    for names in [None, Some(&["client"][..]), Some(&["proxy-b"][..])] {
        for (method, uri, body) in ROUTES {
            let (status, text) = call(&app, names, method, uri, body).await;
            assert_ne!(status, StatusCode::FORBIDDEN, "{method} {uri}: {text}");
        }
    }
}

/// Goal: each refusal is counted in `palisade_node_api_forbidden_total` by route template
/// and the credential's role, and written to the audit log as a `forbidden` record with
/// the method, path, role and detail. Method: two refusals of a writer, one of a
/// certificate without a role, and one admitted request; read `/metrics` and the file.
#[tokio::test]
async fn refusals_are_counted_and_audited() {
    let dir = tempfile::tempdir().unwrap();
    let (app, metrics) = node(dir.path(), true);
    let writer: &[&str] = &["writer-app"];
    call(&app, Some(writer), "DELETE", "/v1/members/2", "").await;
    call(&app, Some(writer), "DELETE", "/v1/members/3", "").await;
    call(&app, Some(&["client"]), "GET", "/v1/leader", "").await;
    call(&app, Some(writer), "GET", "/v1/leader", "").await;
    let text = metrics.render();
    let series = |route: &str, role: &str| {
        text.lines()
            .find(|l| {
                l.starts_with(API_FORBIDDEN)
                    && l.contains(&format!("route=\"{route}\""))
                    && l.contains(&format!("role=\"{role}\""))
            })
            .and_then(|l| l.rsplit(' ').next())
            .map(ToOwned::to_owned)
    };
    assert_eq!(
        series("/v1/members/{id}", "writer").as_deref(),
        Some("2"),
        "{text}"
    );
    assert_eq!(series("/v1/leader", "none").as_deref(), Some("1"), "{text}");
    assert_eq!(series("/v1/leader", "writer"), None, "{text}");

    let path = dir.path().join("node.audit");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let records = loop {
        let records: Vec<AuditRecord> = std::fs::read_to_string(&path)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        if records.len() >= 3 {
            break records;
        }
        assert!(std::time::Instant::now() < deadline, "{records:?}");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    };
    assert_eq!(records.len(), 3, "{records:?}");
    let r = &records[0];
    assert_eq!(
        (
            r.event.as_str(),
            r.node_id,
            r.term,
            r.method.as_deref(),
            r.path.as_deref(),
            r.outcome.as_deref()
        ),
        (
            "forbidden",
            Some(1),
            Some(7),
            Some("DELETE"),
            Some("/v1/members/2"),
            Some("writer")
        )
    );
    assert!(r.reason.as_deref().unwrap().contains("writer-app"), "{r:?}");
    assert_eq!(records[2].outcome.as_deref(), Some("none"));
}
