//! No anonymous or slow client can hold a control-plane door, end to end: hundreds of
//! connections that send a head and then a body a byte at a time cannot keep an operator
//! or an announce off a proxy's admin port, and hundreds of long polls cannot keep other
//! calls off a node's API. Raw TCP clients, a real proxy and a real cluster.

use std::net::SocketAddr;
use std::time::Duration;

use palisade_protocol::DEFAULT_SCOPE;
use palisade_tests::fixtures::{proxy_with_upstream_args, settled_leader};
use palisade_tests::trust::{TokenKeys, admin_token_file};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::task::JoinSet;

/// Hostile connections each test holds open.
const HOSTILE: usize = 500;
/// The bound on an operator's read, an announce, or a plain API call under load.
const ANSWER_WITHIN: Duration = Duration::from_secs(1);
/// How long the hostile clients keep at it.
const HOLD: Duration = Duration::from_secs(12);
/// Deadline for a cluster to elect a leader.
const SETTLE: Duration = Duration::from_secs(15);

/// Sends `request` on a new connection and reads until the end of the answer's head;
/// the status line, or why none came within [`ANSWER_WITHIN`] (connecting included).
async fn status_within(addr: SocketAddr, request: &str) -> Result<String, String> {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let mut text = Vec::new();
        let mut buf = [0u8; 4096];
        while !text.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = stream.read(&mut buf).await.map_err(|e| e.to_string())?;
            if n == 0 {
                return Err(format!(
                    "closed before a head: {:?}",
                    String::from_utf8_lossy(&text)
                ));
            }
            text.extend_from_slice(&buf[..n]);
        }
        let text = String::from_utf8_lossy(&text).into_owned();
        Ok(text.lines().next().unwrap_or_default().to_owned())
    };
    tokio::time::timeout(ANSWER_WITHIN, exchange)
        .await
        .map_err(|_| format!("no answer within {ANSWER_WITHIN:?}"))?
}

/// [`HOSTILE`] clients holding (and renewing, for [`HOLD`]) long polls of
/// `GET /v1/leader?after_term=TERM&timeout_ms=60000` on the node API at `api`. Dropping
/// the set aborts them.
fn hold_long_polls(api: SocketAddr, term: u64) -> JoinSet<()> {
    let poll =
        format!("GET /v1/leader?after_term={term}&timeout_ms=60000 HTTP/1.1\r\nhost: x\r\n\r\n");
    let until = tokio::time::Instant::now() + HOLD;
    let mut hostile = JoinSet::new();
    for _ in 0..HOSTILE {
        hostile.spawn(hostile_client(api, poll.clone(), until));
    }
    hostile
}

/// What every test here starts with: the tested binary, room for the flood's file
/// descriptors, and a temporary directory.
fn prepare() -> tempfile::TempDir {
    crate::use_tested_binary();
    crate::proxy_connections::raise_own_fd_limit(4096);
    tempfile::tempdir().unwrap()
}

/// Asserts that `status` (from [`status_within`]) is a 200 status line, saying `what`.
fn assert_ok(status: &Result<String, String>, what: &str) {
    assert!(
        status.as_ref().is_ok_and(|s| s.contains(" 200 ")),
        "{what}: {status:?}"
    );
}

/// Pause of a hostile client between a closed connection and its next one. These tests
/// measure clients that hold connections; a flood of new connections at the full rate two
/// loopback cores allow (500 clients reconnecting the instant they are closed) starves the
/// server of CPU whatever it does, and belongs to a connection-rate limit in front of it.
const RECONNECT_PAUSE: Duration = Duration::from_millis(200);

/// Keeps connecting to `addr` until `until`: each connection sends `head`, then one
/// byte every second, and is replaced [`RECONNECT_PAUSE`] after the server closes it.
async fn hostile_client(addr: SocketAddr, head: String, until: tokio::time::Instant) {
    let mut first = true;
    while tokio::time::Instant::now() < until {
        if !std::mem::take(&mut first) {
            tokio::time::sleep(RECONNECT_PAUSE).await;
        }
        let Ok(mut stream) = TcpStream::connect(addr).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        if stream.write_all(head.as_bytes()).await.is_err() {
            continue;
        }
        let mut buf = [0u8; 1024];
        loop {
            tokio::select! {
                read = stream.read(&mut buf) => {
                    if matches!(read, Ok(0) | Err(_)) {
                        break;
                    }
                }
                () = tokio::time::sleep(Duration::from_secs(1)) => {
                    if stream.write_all(b" ").await.is_err() {
                        break;
                    }
                }
                () = tokio::time::sleep_until(until) => return,
            }
        }
    }
}

/// Goal: slow bodies with no credential cannot hold a proxy's admin port: under
/// [`HOSTILE`] connections each sending `POST /v1/fences/default` with a 4000-byte
/// `content-length` a byte a second, an operator's `GET /v1/fences` with the bearer
/// token and an announce with a valid proof each land within one second.
/// Method: a proxy with `--token-pub` and `--admin-token-file`; 500 raw TCP clients that
/// reconnect whenever the proxy closes them; after 3 s of that, five rounds of one read
/// and one announce (of a rising token), each on a new connection, each bounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_bodies_cannot_keep_an_operator_or_an_announce_off_the_admin_port() {
    let dir = prepare();
    let keys = TokenKeys::generate(&dir.path().join("keys"));
    let (token_file, bearer) = admin_token_file(dir.path());
    let (_upstream, proxy) = proxy_with_upstream_args(
        &dir.path().join("proxy"),
        &[
            "--token-pub",
            keys.public_arg(),
            "--admin-token-file",
            token_file.to_str().unwrap(),
        ],
    )
    .await;
    let admin = proxy.admin;
    let signer = keys.signer();
    let until = tokio::time::Instant::now() + HOLD;
    let head = format!(
        "POST /v1/fences/{DEFAULT_SCOPE} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 4000\r\n\r\n{{"
    );
    // Dropped at the end of the test, which aborts every hostile client.
    let mut hostile = JoinSet::new();
    for _ in 0..HOSTILE {
        hostile.spawn(hostile_client(admin, head.clone(), until));
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    for token in 10..15_u64 {
        let read = format!(
            "GET /v1/fences HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {bearer}\r\nconnection: close\r\n\r\n"
        );
        let status = status_within(admin, &read).await;
        assert_ok(
            &status,
            &format!("operator's read, round {token}: {status:?}"),
        );
        let body = format!(
            "{{\"token\":{token},\"proof\":\"{}\"}}",
            signer.prove(DEFAULT_SCOPE, token)
        );
        let announce = format!(
            "POST /v1/fences/{DEFAULT_SCOPE} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let status = status_within(admin, &announce).await;
        assert_ok(&status, &format!("announce of token {token}"));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Goal: long polls cannot lock out a node's API: under [`HOSTILE`] long polls of
/// `GET /v1/leader` on the leader, a plain `GET /v1/leader` is answered within one
/// second, and long polls over the limit are refused 429 at once.
/// Method: a three-node plaintext cluster; 500 raw TCP clients each holding
/// `GET /v1/leader?after_term=T&timeout_ms=60000` (T the current term) and re-polling
/// when answered; after 3 s, five plain reads, each on a new connection, each bounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_polls_cannot_lock_out_a_nodes_api() {
    let dir = prepare();
    // Three nodes at the default tick (not the fast ticks of other tests): 500 busy
    // connections on a loaded machine must not cause a spurious election, which would
    // answer every long poll at once and leave none held.
    let cluster = palisade_tests::process::start_cluster(
        dir.path(),
        &palisade_cluster::ClusterSpec {
            nodes: 3,
            ..palisade_cluster::ClusterSpec::default()
        },
        &palisade_cluster::ClusterOptions {
            announce: false,
            ..palisade_cluster::ClusterOptions::default()
        },
    );
    let leader = settled_leader(&cluster, &cluster.ids(), SETTLE, "a settled leader").await;
    let leader_id = leader.leader_id.unwrap();
    let url = cluster.node(leader_id).unwrap().api_url("");
    let api: SocketAddr = url.trim_start_matches("http://").parse().unwrap();
    // Dropped at the end of the test, which aborts every hostile client.
    let _hostile = hold_long_polls(api, leader.term);
    tokio::time::sleep(Duration::from_secs(3)).await;
    // One more long poll, for the term the leader holds now, is refused at once. (Should
    // the term have moved meanwhile, the poll is answered 200 with the new view, which is
    // right too; then ask again for the new term, a few times.)
    let node = palisade_client::NodeApi::new(&url).unwrap();
    let mut answers = Vec::new();
    for _ in 0..5 {
        let term = node.leader().await.map_or(leader.term, |view| view.term);
        let over = format!(
            "GET /v1/leader?after_term={term}&timeout_ms=60000 HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
        );
        let answer = status_within(api, &over).await;
        let refused = answer.as_ref().is_ok_and(|s| s.contains(" 429 "));
        answers.push(answer);
        if refused {
            break;
        }
    }
    assert!(
        answers
            .last()
            .is_some_and(|a| a.as_ref().is_ok_and(|s| s.contains(" 429 "))),
        "a long poll over the limit is refused at once: {answers:?}"
    );
    for round in 0..5 {
        let read = "GET /v1/leader HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n";
        let status = status_within(api, read).await;
        assert_ok(&status, &format!("plain read, round {round}"));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Goal: in fleet mode, [`HOSTILE`] long polls held on the leader's API do not stop the
/// proxies' lease renewals: fleet writes keep succeeding, each within one second, for
/// longer than several leases.
/// Method: three nodes with `--lease-ms 1000` announcing to one fleet proxy (`--cluster`)
/// in front of a recording upstream; once a write with the leader's token is admitted,
/// 500 raw clients hold and renew long polls on the leader; for 8 s, a write every
/// 400 ms through the proxy, each answered 200 within [`ANSWER_WITHIN`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_polls_on_the_leader_cannot_stop_fleet_writes() {
    let dir = prepare();
    let upstream = palisade_tests::upstream::RecordingUpstream::start().await;
    let admin_port = palisade_cluster::free_port().unwrap();
    let (cluster, nodes) = crate::fleet_proxy::start_leased_cluster(
        dir.path(),
        1_000,
        &[format!("http://127.0.0.1:{admin_port}")],
    );
    let proxy = palisade_cluster::ProxyProcess::start_with(
        &dir.path().join("proxy"),
        "127.0.0.1:0",
        &format!("127.0.0.1:{admin_port}"),
        &["--upstream", &upstream.url(), "--cluster", &nodes],
        &[],
    )
    .unwrap();
    let leader = settled_leader(&cluster, &cluster.ids(), SETTLE, "a settled leader").await;
    let token = leader.token.expect("the settled leader holds a token");
    let first = palisade_cluster::wait::poll(SETTLE, || async {
        let answer = palisade_tests::client::put(&proxy.url("/k"), token, "first").await;
        (answer.status == http::StatusCode::OK).then_some(())
    })
    .await;
    assert!(
        first.is_some(),
        "the leader's token was never admitted by the fleet proxy"
    );

    let api: SocketAddr = cluster
        .node(leader.leader_id.unwrap())
        .unwrap()
        .api_url("")
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .unwrap();
    // Dropped at the end of the test, which aborts every hostile client.
    let _hostile = hold_long_polls(api, leader.term);
    let writes_until = tokio::time::Instant::now() + Duration::from_secs(8);
    let mut round = 0;
    while tokio::time::Instant::now() < writes_until {
        let write = tokio::time::timeout(
            ANSWER_WITHIN,
            palisade_tests::client::put(&proxy.url("/k"), token, format!("w{round}")),
        )
        .await;
        let (status, text) = match write {
            Ok(answer) => (Some(answer.status), answer.text()),
            Err(_) => (None, format!("no answer within {ANSWER_WITHIN:?}")),
        };
        assert_eq!(
            status,
            Some(http::StatusCode::OK),
            "fleet write {round} under the long polls: {text}"
        );
        round += 1;
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    assert!(round >= 10, "only {round} writes were tried");
}
