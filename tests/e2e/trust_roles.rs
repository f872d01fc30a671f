//! Roles on the node API, end to end: three `palisade node` processes with mutual TLS and
//! certificates from `palisade certs generate` whose names carry their roles (`node-N`,
//! `proxy-a`, `proxy-b`, `writer-app`, `operator-ops`), plus one the CA signed for a name
//! without a role. Each credential calls every route over HTTPS, and each route admits
//! exactly its roles; every refusal is a 403 `forbidden-role` that names the role needed,
//! is counted in `palisade_node_api_forbidden_total` and is written to the node's audit
//! log. A session belongs to the writer certificate that opened it: another writer's
//! credential gets 403 `session-owner` for every use of it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt as _, Full};
use hyper_util::rt::TokioIo;
use palisade_cluster::{NodeProcess, NodeSpec, Pki, Role, free_port, wait};
use palisade_protocol::problem::kind;
use palisade_protocol::process::TEST_FAULTS_ENV;
use palisade_protocol::{AuditRecord, Problem};
use palisade_tests::trust::{generate_certs, issue_outside_the_binary};
use tokio_rustls::TlsConnector;

/// Generous bound for a cluster to settle on a loaded 2-core machine.
const SETTLE: Duration = Duration::from_secs(20);
/// The nodes' tick.
const TICK_MS: &str = "50";
/// The nodes' lease (fleet leases on, so that `POST /v1/lease` grants).
const LEASE_MS: &str = "1000";
/// The writer, operator, proxies and the certificate without a role.
const WRITER: &str = "writer-app";
/// A second writer, for sessions that belong to the first.
const WRITER_B: &str = "writer-other";
const OPERATOR: &str = "operator-ops";
const PROXY_A: &str = "proxy-a";
const PROXY_B: &str = "proxy-b";
const NO_ROLE: &str = "client-app";
/// The counter of refusals.
const FORBIDDEN_METRIC: &str = "palisade_node_api_forbidden_total";

/// How the nodes of [`Roles`] run.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Fleet leases on (so that `POST /v1/lease` grants), announcing to `proxy-a=BOUND`
    /// and the bare `UNBOUND` (nothing listens there: the announce keeps retrying, which
    /// does not matter here).
    Fleet,
    /// Named leaderships: no leases and no announce list, so every grant is fenced at once.
    Scopes,
}

/// Three nodes with mutual TLS, in a [`Mode`].
struct Roles {
    pki: Pki,
    nodes: Vec<NodeProcess>,
    /// The URL bound to `proxy-a`.
    bound: String,
    /// The URL bound to no name.
    unbound: String,
    dir: PathBuf,
}

impl Roles {
    fn start(dir: &Path, mode: Mode) -> Self {
        let pki = generate_certs(
            &dir.join("pki"),
            &[
                "node-1", "node-2", "node-3", PROXY_A, PROXY_B, WRITER, WRITER_B, OPERATOR,
            ],
        );
        issue_outside_the_binary(&pki, NO_ROLE);
        let bound = format!("http://127.0.0.1:{}", free_port().unwrap());
        let unbound = format!("http://127.0.0.1:{}", free_port().unwrap());
        let raft: BTreeMap<u64, SocketAddr> = (1..=3)
            .map(|id| (id, SocketAddr::from(([127, 0, 0, 1], free_port().unwrap()))))
            .collect();
        let operator = pki.client_tls(Some(OPERATOR)).unwrap();
        let nodes = (1..=3u64)
            .map(|id| {
                let mut extra = vec![
                    "--tick-ms".to_owned(),
                    TICK_MS.to_owned(),
                    "--audit-log".to_owned(),
                    audit_path(dir, id).display().to_string(),
                ];
                if mode == Mode::Fleet {
                    extra.extend(["--lease-ms".to_owned(), LEASE_MS.to_owned()]);
                }
                extra.extend(pki.node_flags(&format!("node-{id}")));
                let spec = NodeSpec {
                    id,
                    peers: raft.clone(),
                    api: SocketAddr::from(([127, 0, 0, 1], free_port().unwrap())),
                    data_dir: dir.join(format!("node-{id}")),
                    announce: match mode {
                        Mode::Fleet => vec![format!("{PROXY_A}={bound}"), unbound.clone()],
                        Mode::Scopes => Vec::new(),
                    },
                    extra,
                    env: vec![(TEST_FAULTS_ENV.to_owned(), "1".to_owned())],
                    prefix: Vec::new(),
                };
                NodeProcess::start_tls(spec, dir, Some(&operator)).unwrap_or_else(|e| panic!("{e}"))
            })
            .collect();
        Self {
            pki,
            nodes,
            bound,
            unbound,
            dir: dir.to_owned(),
        }
    }

    /// The raft leader that every node follows.
    async fn leader(&self) -> u64 {
        wait::poll(SETTLE, || async {
            let mut views = Vec::new();
            for node in &self.nodes {
                views.push(node.leadership().await?);
            }
            let leader = views.iter().find(|v| v.role == Role::Leader)?;
            views
                .iter()
                .all(|v| v.term == leader.term && v.leader_id == Some(leader.node_id))
                .then_some(leader.node_id)
        })
        .await
        .expect("timed out waiting for a settled leader")
    }

    fn api(&self, id: u64) -> SocketAddr {
        self.nodes[usize::try_from(id - 1).unwrap()].spec.api
    }

    /// `method path` with `body` at node `id`, over TLS as the holder of `name`.
    async fn call(&self, id: u64, name: &str, method: &str, path: &str, body: &str) -> Answer {
        call(self.api(id), &self.pki, name, method, path, body).await
    }
}

fn audit_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("node-{id}.audit"))
}

/// A status and a body.
#[derive(Debug)]
struct Answer {
    status: StatusCode,
    body: String,
}

impl Answer {
    /// The 403 `forbidden-role` problem this must be, naming `name` and `role`.
    fn forbidden(&self, what: &str, name: &str, role: &str) -> Problem {
        assert_eq!(self.status, StatusCode::FORBIDDEN, "{what}: {}", self.body);
        let problem: Problem = serde_json::from_str(&self.body).unwrap();
        assert_eq!(
            problem.kind(),
            kind::FORBIDDEN_ROLE,
            "{what}: {}",
            self.body
        );
        assert!(
            problem.detail.contains(name) && problem.detail.contains(role),
            "{what}: the detail names {name} and {role}: {}",
            self.body
        );
        problem
    }
}

/// One HTTP/1.1 request over a fresh mutual-TLS connection to `addr`, presenting
/// `name`'s certificate from `pki`.
async fn call(
    addr: SocketAddr,
    pki: &Pki,
    name: &str,
    method: &str,
    path: &str,
    body: &str,
) -> Answer {
    let mut config = pki.client_config(Some(name)).unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let server = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let tls = TlsConnector::from(Arc::new(config))
        .connect(server, tcp)
        .await
        .unwrap_or_else(|e| panic!("TLS to {addr} as {name}: {e}"));
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(connection);
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::HOST, addr.to_string())
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    let response = tokio::time::timeout(SETTLE, sender.send_request(request))
        .await
        .unwrap_or_else(|_| panic!("{method} {path} as {name}: no answer"))
        .unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// The refusals node `id` counted for `route` and `role`.
async fn refusals(roles: &Roles, id: u64, route: &str, role: &str) -> u64 {
    let text = roles.call(id, OPERATOR, "GET", "/metrics", "").await.body;
    let labels = [format!("route=\"{route}\""), format!("role=\"{role}\"")];
    text.lines()
        .filter(|l| l.starts_with(FORBIDDEN_METRIC) && labels.iter().all(|x| l.contains(x)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Goal: a writer's certificate reads leadership (views and long polls), metrics and
/// health, and gets 403 `forbidden-role` naming the operator role on the announce list
/// (GET, POST), membership (GET, POST, DELETE), transfer, resign, the status page, the
/// test faults and leases (naming the proxy role); an operator's certificate gets each
/// route's own answer there (200, or its usual refusal: 409 for a member that exists and
/// an announce list fixed by leases, 404 for an unknown member), leases an unbound entry
/// and resigns; a certificate naming no role gets 403 everywhere but `/healthz`. Each
/// refusal is counted by route and role and audited. Method: three nodes with mutual TLS
/// and fleet leases; every route over HTTPS as each certificate, on the leader; read the
/// leader's `/metrics` and audit log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_write_operators_administer_and_no_role_gets_nothing() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let roles = Roles::start(dir.path(), Mode::Fleet);
    let l = roles.leader().await;
    let lease = format!(r#"{{"proxy":"{}"}}"#, roles.bound);
    // The administration, with bodies whose own answer (for an operator) moves nothing:
    // member 1 exists, member 99 and node 99 do not, the announce list is fixed by leases.
    // With each, what an operator gets: `None` for "anything but 403".
    let admin: [(&str, &str, &str, Option<StatusCode>); 8] = [
        ("GET", "/v1/announce", "", Some(StatusCode::OK)),
        ("POST", "/v1/announce", r#"{"proxies":[]}"#, None),
        ("GET", "/v1/members", "", Some(StatusCode::OK)),
        (
            "POST",
            "/v1/members",
            r#"{"id":1,"peer":"127.0.0.1:1"}"#,
            Some(StatusCode::CONFLICT),
        ),
        ("DELETE", "/v1/members/99", "", Some(StatusCode::NOT_FOUND)),
        ("POST", "/v1/transfer", r#"{"to":99}"#, None),
        ("GET", "/", "", Some(StatusCode::OK)),
        ("GET", "/v1/test/faults", "", Some(StatusCode::OK)),
    ];

    // The writer.
    for path in [
        "/v1/leader",
        "/v1/leader?after_term=0&timeout_ms=100",
        "/metrics",
        "/healthz",
    ] {
        let answer = roles.call(l, WRITER, "GET", path, "").await;
        assert_eq!(
            answer.status,
            StatusCode::OK,
            "writer GET {path}: {}",
            answer.body
        );
    }
    for (method, path, body, _) in &admin {
        let what = format!("writer {method} {path}");
        let answer = roles.call(l, WRITER, method, path, body).await;
        answer.forbidden(&what, WRITER, "operator");
    }
    let answer = roles.call(l, WRITER, "POST", "/v1/resign", "").await;
    answer.forbidden("writer resign", WRITER, "operator");
    let answer = roles.call(l, WRITER, "POST", "/v1/lease", &lease).await;
    answer.forbidden("writer lease", WRITER, "proxy");

    // No role: only health.
    let answer = roles.call(l, NO_ROLE, "GET", "/healthz", "").await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    let more = [
        ("GET", "/v1/leader", ""),
        ("GET", "/metrics", ""),
        ("POST", "/v1/resign", ""),
        ("POST", "/v1/lease", lease.as_str()),
    ];
    for (method, path, body) in admin.iter().map(|(m, p, b, _)| (*m, *p, *b)).chain(more) {
        let what = format!("no role {method} {path}");
        let answer = roles.call(l, NO_ROLE, method, path, body).await;
        let problem = answer.forbidden(&what, NO_ROLE, "no role");
        assert_eq!(problem.node_id, Some(l), "{}", answer.body);
    }

    // The operator: each route's own answer.
    for (method, path, body, status) in &admin {
        let answer = roles.call(l, OPERATOR, method, path, body).await;
        match status {
            Some(status) => assert_eq!(
                answer.status, *status,
                "operator {method} {path}: {}",
                answer.body
            ),
            None => assert!(
                answer.status != StatusCode::FORBIDDEN
                    && !answer.body.contains(kind::FORBIDDEN_ROLE),
                "operator {method} {path}: {}",
                answer.body
            ),
        }
    }
    for path in ["/v1/leader", "/metrics"] {
        let answer = roles.call(l, OPERATOR, "GET", path, "").await;
        assert_eq!(
            answer.status,
            StatusCode::OK,
            "operator GET {path}: {}",
            answer.body
        );
    }
    let unbound = format!(r#"{{"proxy":"{}"}}"#, roles.unbound);
    let answer = roles.call(l, OPERATOR, "POST", "/v1/lease", &unbound).await;
    assert_eq!(
        answer.status,
        StatusCode::OK,
        "operator lease: {}",
        answer.body
    );

    // Counted, by route template and role, and audited.
    assert!(refusals(&roles, l, "/v1/members/{id}", "writer").await >= 1);
    assert!(refusals(&roles, l, "/v1/transfer", "writer").await >= 1);
    assert!(refusals(&roles, l, "/v1/leader", "none").await >= 1);
    assert_eq!(refusals(&roles, l, "/v1/leader", "writer").await, 0);
    let records = wait::poll(SETTLE, || async {
        let text = std::fs::read_to_string(audit_path(&roles.dir, l)).ok()?;
        let records: Vec<AuditRecord> = text
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .filter(|r: &AuditRecord| r.event == "forbidden")
            .collect();
        (records.len() >= admin.len() + 2).then_some(records)
    })
    .await
    .expect("timed out waiting for the refusals in the audit log");
    let transfer_refused = records
        .iter()
        .find(|r| r.path.as_deref() == Some("/v1/transfer"))
        .expect("the writer's transfer is audited");
    assert_eq!(transfer_refused.method.as_deref(), Some("POST"));
    assert_eq!(transfer_refused.outcome.as_deref(), Some("writer"));
    assert_eq!(transfer_refused.node_id, Some(l));
    assert_eq!(transfer_refused.peer.as_deref(), Some("127.0.0.1"));
    assert!(
        transfer_refused
            .reason
            .as_deref()
            .is_some_and(|r| r.contains(WRITER) && r.contains("operator")),
        "{transfer_refused:?}"
    );

    // Last, as it moves leadership: the operator resigns.
    let answer = roles.call(l, OPERATOR, "POST", "/v1/resign", "").await;
    assert_eq!(
        answer.status,
        StatusCode::OK,
        "operator resign: {}",
        answer.body
    );
}

/// Goal: a proxy's certificate takes a lease only for the announce entry bound to its
/// name (`--announce proxy-a=URL`): `proxy-a` gets its lease, `proxy-b` asking for
/// `proxy-a`'s URL and `proxy-a` asking for the unbound URL get 403 naming the binding,
/// and a proxy reaches no other route; a node's certificate reads the members and leader
/// views and adds itself (409: it is a member), but adding another node is 403. Method:
/// the same cluster; lease requests at the leader as each proxy; member adds as `node-2`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxies_lease_their_own_entry_and_nodes_add_only_themselves() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let roles = Roles::start(dir.path(), Mode::Fleet);
    let l = roles.leader().await;
    let bound = format!(r#"{{"proxy":"{}"}}"#, roles.bound);
    let unbound = format!(r#"{{"proxy":"{}"}}"#, roles.unbound);

    let answer = roles.call(l, PROXY_A, "POST", "/v1/lease", &bound).await;
    assert_eq!(
        answer.status,
        StatusCode::OK,
        "proxy-a's own lease: {}",
        answer.body
    );
    let grant: serde_json::Value = serde_json::from_str(&answer.body).unwrap();
    assert_eq!(grant["leader_id"], l);
    let answer = roles.call(l, PROXY_B, "POST", "/v1/lease", &bound).await;
    let problem = answer.forbidden("proxy-b leasing proxy-a's URL", PROXY_B, "proxy-a");
    assert!(
        problem.detail.contains("only under its own name"),
        "{problem}"
    );
    let answer = roles.call(l, PROXY_A, "POST", "/v1/lease", &unbound).await;
    let problem = answer.forbidden("proxy-a leasing the unbound URL", PROXY_A, "operator");
    assert!(problem.detail.contains("bound to no name"), "{problem}");
    for (method, path) in [
        ("GET", "/v1/leader"),
        ("POST", "/v1/resign"),
        ("GET", "/v1/members"),
    ] {
        let answer = roles.call(l, PROXY_A, method, path, "").await;
        answer.forbidden(&format!("proxy-a {method} {path}"), PROXY_A, "operator");
    }
    assert!(refusals(&roles, l, "/v1/lease", "proxy").await >= 2);

    let node2 = "node-2";
    let peer2 = roles.nodes[1].spec.peers[&2];
    for path in ["/v1/members", "/v1/leader"] {
        let answer = roles.call(l, node2, "GET", path, "").await;
        assert_eq!(
            answer.status,
            StatusCode::OK,
            "node-2 GET {path}: {}",
            answer.body
        );
    }
    let itself = format!(r#"{{"id":2,"peer":"{peer2}"}}"#);
    let answer = roles.call(l, node2, "POST", "/v1/members", &itself).await;
    assert_eq!(
        answer.status,
        StatusCode::CONFLICT,
        "node-2 adding itself: {}",
        answer.body
    );
    let another = r#"{"id":7,"peer":"127.0.0.1:1"}"#;
    let answer = roles.call(l, node2, "POST", "/v1/members", another).await;
    let problem = answer.forbidden("node-2 adding node 7", node2, "operator");
    assert!(problem.detail.contains("only its own node"), "{problem}");
    for (method, path) in [
        ("DELETE", "/v1/members/3"),
        ("POST", "/v1/transfer"),
        ("GET", "/"),
    ] {
        let answer = roles.call(l, node2, method, path, r#"{"to":3}"#).await;
        answer.forbidden(&format!("node-2 {method} {path}"), node2, "operator");
    }
    assert!(refusals(&roles, l, "/v1/members", "node").await >= 1);
}

/// The answer `answer` must be: the 403 `session-owner` naming `owner`.
fn not_the_owner(answer: &Answer, what: &str, owner: &str) {
    assert_eq!(
        answer.status,
        StatusCode::FORBIDDEN,
        "{what}: {}",
        answer.body
    );
    let problem: Problem = serde_json::from_str(&answer.body).unwrap();
    assert_eq!(
        problem.kind(),
        kind::SESSION_OWNER,
        "{what}: {}",
        answer.body
    );
    assert!(
        problem.detail.contains(owner),
        "{what}: names {owner}: {problem}"
    );
}

/// Goal: a session opened over mutual TLS belongs to the certificate name that opened
/// it. Another writer's legitimate credential cannot keep it alive (on the leader, or
/// through a follower, which would forward it with its own node credential), campaign or
/// resign with it, or revoke it: each try is a 403 `session-owner` naming the owner, and
/// changes nothing. The owner can do all of it, through the follower too. Method: three
/// nodes with mutual TLS and named leaderships (no fleet leases, no announce proxies, so
/// every grant is fenced at once); two writer certificates; every call over HTTPS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_belongs_to_the_writer_that_opened_it() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let roles = Roles::start(dir.path(), Mode::Scopes);
    let l = roles.leader().await;
    let f = (1..=3).find(|&id| id != l).unwrap();
    let opened = roles
        .call(l, WRITER, "POST", "/v1/sessions", r#"{"ttl_ms":60000}"#)
        .await;
    assert_eq!(opened.status, StatusCode::OK, "open: {}", opened.body);
    let opened: serde_json::Value = serde_json::from_str(&opened.body).unwrap();
    let id = opened["id"].as_str().unwrap().to_owned();
    let session = format!(r#"{{"session":"{id}"}}"#);
    let keepalive = format!("/v1/sessions/{id}/keepalive");
    let revoke = format!("/v1/sessions/{id}");
    let granted = roles
        .call(l, WRITER, "POST", "/v1/scopes/billing/campaign", &session)
        .await;
    assert_eq!(granted.status, StatusCode::OK, "campaign: {}", granted.body);
    let token = serde_json::from_str::<serde_json::Value>(&granted.body).unwrap()["token"]
        .as_u64()
        .unwrap();
    // The follower has applied the session once the owner's keepalive through it is
    // answered (before that it answers 503 `not-leader`: the session is not known there).
    // The poll's pace is above the leader's shortest keepalive interval.
    let through_follower = wait::poll(SETTLE, || async {
        let answer = roles.call(f, WRITER, "POST", &keepalive, "").await;
        (answer.status == StatusCode::OK).then_some(())
    })
    .await;
    assert!(
        through_follower.is_some(),
        "the owner's keepalive through follower {f} was never answered 200"
    );

    let stranger_tries = [
        (l, "POST", keepalive.as_str(), ""),
        (f, "POST", keepalive.as_str(), ""),
        (l, "POST", "/v1/scopes/billing/campaign", session.as_str()),
        (l, "POST", "/v1/scopes/other/campaign", session.as_str()),
        (l, "POST", "/v1/scopes/billing/resign", session.as_str()),
        (l, "DELETE", revoke.as_str(), ""),
    ];
    for (node, method, path, body) in stranger_tries {
        let answer = roles.call(node, WRITER_B, method, path, body).await;
        not_the_owner(
            &answer,
            &format!("{WRITER_B} {method} {path} at node {node}"),
            WRITER,
        );
    }
    // Nothing moved: the owner still holds `billing` at its token, holds nothing else,
    // and the session is still there.
    let view = roles.call(l, WRITER, "GET", "/v1/scopes/billing", "").await;
    let view: serde_json::Value = serde_json::from_str(&view.body).unwrap();
    assert_eq!(view["session"], id.as_str(), "billing's holder: {view}");
    assert_eq!(view["token"], token, "billing's token: {view}");
    let other = roles.call(l, WRITER, "GET", "/v1/scopes/other", "").await;
    let other: serde_json::Value = serde_json::from_str(&other.body).unwrap();
    assert!(other["session"].is_null(), "nobody holds other: {other}");

    // The owner resigns and revokes; after that the session is unknown to everyone.
    let resigned = roles
        .call(l, WRITER, "POST", "/v1/scopes/billing/resign", &session)
        .await;
    assert_eq!(resigned.status, StatusCode::OK, "resign: {}", resigned.body);
    let revoked = roles.call(l, WRITER, "DELETE", &revoke, "").await;
    assert_eq!(revoked.status, StatusCode::OK, "revoke: {}", revoked.body);
    let gone = roles.call(l, WRITER_B, "POST", &keepalive, "").await;
    assert_eq!(
        gone.status,
        StatusCode::NOT_FOUND,
        "after revoke: {}",
        gone.body
    );
}
