//! Classification that fails closed, end to end: every spelling of a routed path, every
//! method and every scope trick that used to slip past the fence gets the safe answer
//! from a real `palisade proxy`, and the recording upstream shows that nothing reached
//! the storage. Requests go out as raw bytes, so that no client library normalises the
//! hostile paths first.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, Method, Request, StatusCode, Version};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use palisade_protocol::DEFAULT_SCOPE;
use palisade_protocol::headers::{FENCING_SCOPE, FENCING_TOKEN, PROBLEM_JSON};
use palisade_tests::client::{put, send};
use palisade_tests::fixtures::{admin, proxy_with_upstream};
use palisade_tests::upstream::RecordingUpstream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `Fencing-Token`, in a static so that the raw requests below can borrow its name.
static TOKEN: HeaderName = FENCING_TOKEN;
/// `Fencing-Scope`, likewise.
static SCOPE: HeaderName = FENCING_SCOPE;

/// Longest a raw exchange may take; the proxy answers these at once.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(10);

/// A route `/billing/` to scope `billing`, matched without regard to case.
const BILLING_ROUTE: &str =
    "[[routes]]\nprefix = \"/billing/\"\nscope = \"billing\"\ncase_insensitive = true\n";

/// The status and the head of a raw answer.
struct RawAnswer {
    status: u16,
    text: String,
}

/// Sends `method target` with `headers` and a one-byte body (none on GET and HEAD) on a
/// fresh connection, as raw bytes, and reads the answer until the proxy closes the
/// connection.
async fn raw(addr: SocketAddr, method: &str, target: &str, headers: &[(&str, &str)]) -> RawAnswer {
    let mut request = format!("{method} {target} HTTP/1.1\r\nHost: storage.test\r\n");
    for (name, value) in headers {
        request.extend([*name, ": ", *value, "\r\n"]);
    }
    // GET and HEAD carry no body: the proxy would refuse it (400 `body-on-read`).
    if matches!(method, "GET" | "HEAD") {
        request.push_str("Connection: close\r\n\r\n");
    } else {
        request.push_str("Content-Length: 1\r\nConnection: close\r\n\r\nx");
    }
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        // A reset after the answer is fine: the answer is what is checked.
        let _ = stream.read_to_end(&mut answer).await;
        answer
    };
    let answer = tokio::time::timeout(EXCHANGE_TIMEOUT, exchange)
        .await
        .unwrap_or_else(|_| panic!("{method} {target}: no answer within {EXCHANGE_TIMEOUT:?}"));
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{method} {target}: not an HTTP answer: {text:?}"));
    RawAnswer { status, text }
}

fn arrived_paths(upstream: &RecordingUpstream) -> Vec<String> {
    upstream.arrived().into_iter().map(|a| a.path).collect()
}

/// Goal: every spelling of a routed path that the storage reads as the same resource is
/// either fenced by the route's scope or refused: a stale token gets 400, 409 or 428 and
/// nothing reaches the upstream; an admitted write is forwarded with its original path.
/// Method: route `/billing/` (case-insensitive) to scope `billing`, raise its fence to
/// 100 through the admin API, send a token-1 PUT on each bypass spelling as raw bytes,
/// and read the upstream's log; then a token-100 PUT on `/%62illing/b`.
#[tokio::test]
async fn bypass_paths_are_refused_and_never_forwarded() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let (upstream, proxy) = proxy_with_upstream(dir.path(), BILLING_ROUTE).await;
    admin(&proxy).advance("billing", 100).await.unwrap();
    let token = [(TOKEN.as_str(), "1")];
    let cases = [
        ("/billing/a", 409),
        // The directory itself: a WebDAV DELETE of it would remove everything under it.
        ("/billing", 409),
        ("/billing/..", 400),
        ("/%62illing/a", 409),
        ("/BILLING/a", 409),
        ("//billing/a", 400),
        ("/x/../billing/a", 400),
        ("/./billing/a", 400),
        ("/billing%2Fa", 400),
        ("/%2e%2e/billing/a", 400),
        ("/x/..;/billing/a", 400),
        ("/billing/%C0%AF", 400),
        ("/billing/a%00", 400),
        ("/billing/a%zz", 400),
        ("/billing\\a", 400),
    ];
    for (path, want) in cases {
        let answer = raw(proxy.addr, "PUT", path, &token).await;
        assert!(
            [400, 409, 428].contains(&answer.status),
            "{path}: {}",
            answer.text
        );
        assert_eq!(answer.status, want, "{path}: {}", answer.text);
        assert!(
            answer.text.contains(PROBLEM_JSON),
            "{path}: {}",
            answer.text
        );
        if want == 400 {
            assert!(answer.text.contains("bad-path"), "{path}: {}", answer.text);
        }
    }
    // Absolute-form targets are routed by their path.
    let absolute = raw(proxy.addr, "PUT", "http://storage.test/%62illing/a", &token).await;
    assert_eq!(absolute.status, 409, "{}", absolute.text);
    assert!(
        upstream.arrived().is_empty(),
        "nothing reached the upstream: {:?}",
        arrived_paths(&upstream)
    );

    // The admitted write keeps its spelling: the upstream (S3 signs the raw path) sees
    // exactly what the client sent.
    let admitted = raw(
        proxy.addr,
        "PUT",
        "/%62illing/b",
        &[(TOKEN.as_str(), "100")],
    )
    .await;
    assert_eq!(admitted.status, 200, "{}", admitted.text);
    assert_eq!(arrived_paths(&upstream), vec!["/%62illing/b".to_owned()]);
    assert_eq!(admin(&proxy).fence(DEFAULT_SCOPE).await.unwrap().token, 0);
}

/// Goal: over cleartext HTTP/2 (whose targets are absolute), bypass spellings and
/// unlisted methods get the same safe answers as over HTTP/1.1, and nothing is forwarded.
/// Method: the `/billing/` route with its fence at 100; an h2-only client sends token-1
/// PUTs on bypass spellings and a MOVE without a token; read the statuses, the problem
/// types and the upstream's log.
#[tokio::test]
async fn bypasses_over_h2c_get_the_same_answers() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let (upstream, proxy) = proxy_with_upstream(dir.path(), BILLING_ROUTE).await;
    admin(&proxy).advance("billing", 100).await.unwrap();
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let cases = [
        ("PUT", "/%62illing/a", Some("1"), 409, "stale-token"),
        ("PUT", "/BILLING/a", Some("1"), 409, "stale-token"),
        ("PUT", "//billing/a", Some("1"), 400, "bad-path"),
        ("PUT", "/x/../billing/a", Some("1"), 400, "bad-path"),
        ("PUT", "/billing%2Fa", Some("1"), 400, "bad-path"),
        ("MOVE", "/billing/a", None, 428, "missing-token"),
        ("put", "/k", None, 428, "missing-token"),
    ];
    for (method, path, token, want, kind) in cases {
        let mut request = Request::builder()
            .method(Method::from_bytes(method.as_bytes()).unwrap())
            .uri(proxy.url(path));
        if let Some(token) = token {
            request = request.header(FENCING_TOKEN, token);
        }
        let request = request.body(Full::new(Bytes::from_static(b"x"))).unwrap();
        let response = client.request(request).await.unwrap();
        assert_eq!(response.version(), Version::HTTP_2);
        let status = response.status().as_u16();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let body = String::from_utf8_lossy(&body);
        assert_eq!(status, want, "{method} {path}: {body}");
        assert!(body.contains(kind), "{method} {path}: {body}");
    }
    assert!(
        upstream.arrived().is_empty(),
        "nothing reached the upstream: {:?}",
        arrived_paths(&upstream)
    );
}

/// A raw request and the status it must get: method, target, headers, status.
type Case<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)], u16);

/// Goal: every method that is not a configured read (any case, any extension, an
/// override naming a write, an upgrade) needs a token, and CONNECT is refused; none of
/// them reaches the upstream.
/// Method: raw requests without a token to a default proxy; then a plain GET, which
/// must arrive, to show that the upstream does record what it is sent.
#[tokio::test]
async fn unlisted_methods_are_fenced_and_never_forwarded() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let (upstream, proxy) = proxy_with_upstream(dir.path(), "").await;
    let none: &[(&str, &str)] = &[];
    let cases: [Case; 12] = [
        ("put", "/k", none, 428),
        ("get", "/k", none, 428),
        ("MOVE", "/k", &[("Destination", "/l")], 428),
        ("COPY", "/k", &[("Destination", "/l")], 428),
        ("MKCOL", "/d/", none, 428),
        ("PROPPATCH", "/k", none, 428),
        ("LOCK", "/k", none, 428),
        ("FROB", "/k", none, 428),
        ("CONNECT", "storage.test:443", none, 405),
        ("GET", "/k", &[("X-HTTP-Method-Override", "DELETE")], 428),
        (
            "GET",
            "/k",
            &[("Upgrade", "websocket"), ("Connection", "Upgrade")],
            405,
        ),
        (
            "GET",
            "/k",
            &[
                ("X-HTTP-Method-Override", "GET"),
                ("X-HTTP-Method-Override", "DELETE"),
            ],
            400,
        ),
    ];
    for (method, target, headers, want) in cases {
        let answer = raw(proxy.addr, method, target, headers).await;
        assert_eq!(answer.status, want, "{method} {target}: {}", answer.text);
        if want == 405 {
            assert!(
                answer.text.contains("tunnel-refused"),
                "{method}: {}",
                answer.text
            );
        }
    }
    assert!(
        upstream.arrived().is_empty(),
        "nothing reached the upstream: {:?}",
        upstream
            .arrived()
            .into_iter()
            .map(|a| (a.method, a.path))
            .collect::<Vec<_>>()
    );
    let read = raw(proxy.addr, "GET", "/k", &[]).await;
    assert_eq!(read.status, 200, "{}", read.text);
    assert_eq!(arrived_paths(&upstream), vec!["/k".to_owned()]);
}

/// Goal: a client cannot escape a fence by naming another scope: with client scopes off
/// (the default) `Fencing-Scope` is refused with 400, so a token-1 write cannot overwrite
/// an object written with token MAX.
/// Method: write `/obj` with token `u64::MAX`, then with token 1 and `Fencing-Scope:
/// other`; read the answer, the upstream's log and both fences.
#[tokio::test]
async fn a_chosen_scope_cannot_escape_the_fence() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let (upstream, proxy) = proxy_with_upstream(dir.path(), "").await;
    let max = put(&proxy.url("/obj"), u64::MAX, "first").await;
    assert_eq!(max.status, StatusCode::OK);
    let trick = send(
        Method::PUT,
        &proxy.url("/obj"),
        &[(TOKEN.as_str(), "1"), (SCOPE.as_str(), "other")],
        "overwrite",
    )
    .await;
    assert_eq!(trick.status, StatusCode::BAD_REQUEST, "{}", trick.text());
    let problem = trick.problem().expect("a problem+json body");
    assert_eq!(problem.kind(), "bad-scope");
    assert!(
        trick.text().contains("--client-scopes"),
        "the refusal says how to enable client scopes: {}",
        trick.text()
    );
    let tokens: Vec<Option<String>> = upstream.arrived().into_iter().map(|a| a.token).collect();
    assert_eq!(tokens, vec![Some(u64::MAX.to_string())]);
    let admin = admin(&proxy);
    assert_eq!(admin.fence(DEFAULT_SCOPE).await.unwrap().token, u64::MAX);
    assert_eq!(admin.fence("other").await.unwrap().token, 0);
}

/// Goal: at `limits.scopes_max` a new scope is a 507 problem+json `scopes-full`, counted
/// as a rejection and not forwarded, while `default` and a route's scope (reserved, not
/// counted) still work, also after a restart.
/// Method: `scopes_max = 2` with client scopes on and a route `/billing/`; write scopes
/// `a` and `b`, then `c`; then `default` and `/billing/x`; read the metrics; restart and
/// try `c` (on the data path and the admin API) and raises of `billing` and `default`.
#[tokio::test]
async fn scope_limit_is_507_and_reserved_scopes_stay_available() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let config = format!("client_scopes = true\n{BILLING_ROUTE}[limits]\nscopes_max = 2\n");
    let (upstream, mut proxy) = proxy_with_upstream(dir.path(), &config).await;
    let scoped = |scope: &'static str, token: &'static str| {
        let url = proxy.url("/k");
        async move {
            send(
                Method::PUT,
                &url,
                &[(TOKEN.as_str(), token), (SCOPE.as_str(), scope)],
                "x",
            )
            .await
        }
    };
    assert_eq!(scoped("a", "1").await.status, StatusCode::OK);
    assert_eq!(scoped("b", "1").await.status, StatusCode::OK);
    let full = scoped("c", "1").await;
    assert_eq!(
        full.status,
        StatusCode::INSUFFICIENT_STORAGE,
        "{}",
        full.text()
    );
    assert_eq!(full.header("content-type").as_deref(), Some(PROBLEM_JSON));
    let problem = full.problem().expect("a problem+json body");
    assert_eq!((problem.status, problem.kind()), (507, "scopes-full"));
    assert!(
        full.text().contains("limits.scopes_max"),
        "the answer names the limit: {}",
        full.text()
    );
    assert_eq!(
        upstream.arrived().len(),
        2,
        "the refused write was not forwarded"
    );

    assert_eq!(put(&proxy.url("/k"), 1, "d").await.status, StatusCode::OK);
    assert_eq!(
        put(&proxy.url("/billing/x"), 1, "e").await.status,
        StatusCode::OK
    );
    let metrics = send(Method::GET, &proxy.admin_url("/metrics"), &[], "").await;
    assert!(
        metrics
            .text()
            .lines()
            .any(|l| l.starts_with("palisade_proxy_rejections_total")
                && l.contains("reason=\"scopes-full\"")
                && l.ends_with(" 1")),
        "one scopes-full rejection counted: {}",
        metrics.text()
    );

    proxy.restart_with_env(&[]).unwrap();
    let full = scoped_after_restart(&proxy, "c").await;
    assert_eq!(full, StatusCode::INSUFFICIENT_STORAGE);
    assert_eq!(
        put(&proxy.url("/billing/x"), 2, "f").await.status,
        StatusCode::OK
    );
    let admin = admin(&proxy);
    assert_eq!(admin.fence("billing").await.unwrap().token, 2);
    assert_eq!(admin.fence(DEFAULT_SCOPE).await.unwrap().token, 1);
    assert_eq!(admin.fence("c").await.unwrap().token, 0);
    // The admin API's advance is the same admission, so the same answer.
    let refused = admin.advance("c", 1).await.unwrap_err();
    assert_eq!(
        refused.status(),
        Some(StatusCode::INSUFFICIENT_STORAGE),
        "{refused}"
    );
    assert_eq!(admin.advance(DEFAULT_SCOPE, 5).await.unwrap().token, 5);
}

async fn scoped_after_restart(
    proxy: &palisade_tests::process::ProxyProcess,
    scope: &str,
) -> StatusCode {
    send(
        Method::PUT,
        &proxy.url("/k"),
        &[(TOKEN.as_str(), "1"), (SCOPE.as_str(), scope)],
        "x",
    )
    .await
    .status
}
