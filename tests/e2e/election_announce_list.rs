//! The announce list cannot drop fencing, end to end: real `palisade node` processes and
//! real proxies (each with its own embedded store), plaintext on loopback.
//!
//! - A proxy removed from the list (`POST /v1/announce`) is retired first: after the next
//!   election no token, the old leader's included, reaches its storage.
//! - A bad entry is refused at the API and at the flag; an unreachable proxy never keeps
//!   the others from being announced, and removing it needs `force`.

use std::path::Path;
use std::time::Duration;

use http::{Method, StatusCode};
use palisade_cluster::client::try_send_within;
use palisade_cluster::{Cluster, ClusterOptions, ClusterSpec, wait};
use palisade_protocol::announce::RETIRED_FENCE;
use palisade_protocol::node::ANNOUNCE_PATH;
use palisade_protocol::{AnnounceChanged, AnnounceList, DEFAULT_SCOPE, KeyList, LeaderView};
use palisade_tests::client::{put, send};
use palisade_tests::fixtures::{first_announced_leader, resign, write_config};
use palisade_tests::process::{ProxyProcess, start_cluster, start_proxy};

/// Generous bound for an election at 20 ms ticks on a loaded 2-core machine.
const ELECTION_TIMEOUT: Duration = Duration::from_secs(20);
/// Bound of one `POST /v1/announce`: a retirement (5 s at most) and the change's own
/// wait (10 s at most), with room to spare.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound for `palisade node` to refuse its flags and exit.
const EXIT_TIMEOUT: Duration = Duration::from_secs(20);

/// Three nodes at 20 ms ticks announcing to the cluster's proxy and to `extra_announce`.
fn cluster(dir: &Path, extra_announce: &[String]) -> Cluster {
    crate::use_tested_binary();
    let mut node_flags = vec!["--tick-ms".to_owned(), "20".to_owned()];
    for url in extra_announce {
        node_flags.extend(["--announce".to_owned(), url.clone()]);
    }
    let spec = ClusterSpec {
        nodes: 3,
        node_flags,
        proxy_flags: Vec::new(),
    };
    start_cluster(dir, &spec, &ClusterOptions::default())
}

/// `POST /v1/announce` on node `id` with `body` (JSON); the answer.
async fn change(
    cluster: &Cluster,
    id: u64,
    body: &serde_json::Value,
) -> palisade_tests::client::Answer {
    let url = cluster.node(id).unwrap().api_url(ANNOUNCE_PATH);
    try_send_within(
        Method::POST,
        &url,
        &[("content-type", "application/json")],
        serde_json::to_vec(body).unwrap(),
        CHANGE_TIMEOUT,
    )
    .await
    .unwrap_or_else(|e| panic!("POST {url}: {e}"))
}

/// Node `id`'s announce list.
async fn listed(cluster: &Cluster, id: u64) -> Vec<String> {
    let url = cluster.node(id).unwrap().api_url(ANNOUNCE_PATH);
    let answer = send(Method::GET, &url, &[], "").await;
    serde_json::from_slice::<AnnounceList>(&answer.body)
        .unwrap_or_else(|e| panic!("GET {url}: {e}: {}", answer.text()))
        .proxies
}

/// Waits until `proxy`'s fence of the default scope is `token`.
async fn fence_is(proxy: &ProxyProcess, token: u64, what: &str) {
    wait::poll(ELECTION_TIMEOUT, || async {
        proxy.fence(DEFAULT_SCOPE).await.filter(|&f| f == token)
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "timed out waiting for {what} ({token}) at {}",
            proxy.admin_url("")
        )
    });
}

/// The keys `proxy`'s embedded store holds under `/ledger/`, in key order.
async fn stored_keys(proxy: &ProxyProcess) -> Vec<String> {
    let answer = send(Method::GET, &proxy.url("/ledger/?list"), &[], "").await;
    let listing: KeyList = serde_json::from_slice(&answer.body)
        .unwrap_or_else(|e| panic!("not a listing: {e}: {}", answer.text()));
    listing.keys.into_iter().map(|k| k.key).collect()
}

/// Waits for an established leader other than `except` whose term is above `above`,
/// announced to every listed proxy; its view.
async fn announced_leader_after(cluster: &Cluster, above: u64, except: u64) -> LeaderView {
    let next = cluster
        .wait_for_leader(above, Some(except), ELECTION_TIMEOUT)
        .await
        .expect("a new leader after the resignation");
    let node = cluster.node(next.node_id).unwrap();
    wait::poll(ELECTION_TIMEOUT, || async {
        node.leadership()
            .await
            .filter(|l| l.token == next.token && l.announced)
    })
    .await
    .expect("timed out waiting for the new leader to be announced")
}

/// Goal: a proxy that leaves the announce list admits no token after the next election,
/// the deposed leader's old token least of all (the issue: B stayed at the old term and
/// admitted the old leader's write). Method: three nodes announcing to proxies A and B
/// (each its own store); a write with the first token T through B is admitted; a
/// follower shrinks the list to A (the answer says B was retired, and B's fence is the
/// retired fence); the leader resigns; once the new token T2 is announced at A, T through
/// B and through A is 409, and so is T2 through B; T2 through A is admitted; B's store
/// holds only the write from before the removal.
#[tokio::test]
async fn removed_proxy_is_retired_and_admits_no_old_token() {
    let dir = tempfile::tempdir().unwrap();
    let proxy_b = {
        crate::use_tested_binary();
        start_proxy(&dir.path().join("proxy-b"), &[])
    };
    let b_url = proxy_b.admin_url("");
    let cluster = cluster(&dir.path().join("cluster"), std::slice::from_ref(&b_url));
    let first = first_announced_leader(&cluster, ELECTION_TIMEOUT).await;
    let t = first.token.unwrap();
    fence_is(&proxy_b, t, "the first token at B").await;
    let before = put(&proxy_b.url("/ledger/b-before"), t, "while listed").await;
    assert_eq!(before.status, StatusCode::OK, "{}", before.text());

    let a_url = cluster.proxy.admin_url("");
    let follower = cluster
        .ids()
        .into_iter()
        .find(|&id| id != first.node_id)
        .unwrap();
    let answer = change(
        &cluster,
        follower,
        &serde_json::json!({ "proxies": [a_url] }),
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    let changed: AnnounceChanged = serde_json::from_slice(&answer.body).unwrap();
    assert_eq!(changed.proxies, [a_url.trim_end_matches('/')]);
    assert_eq!(changed.removed.len(), 1, "{changed:?}");
    assert!(changed.removed[0].retired, "{changed:?}");
    assert_eq!(
        changed.removed[0].proxy.trim_end_matches('/'),
        b_url.trim_end_matches('/')
    );
    assert_eq!(proxy_b.fence(DEFAULT_SCOPE).await, Some(RETIRED_FENCE));
    for id in cluster.ids() {
        let list = wait::poll(ELECTION_TIMEOUT, || async {
            Some(listed(&cluster, id).await).filter(|l| l.len() == 1)
        })
        .await;
        assert!(list.is_some(), "node {id} applies the new list");
    }
    let current_at_b = put(&proxy_b.url("/ledger/b-current"), t, "current token").await;
    assert_eq!(
        current_at_b.status,
        StatusCode::CONFLICT,
        "{}",
        current_at_b.text()
    );

    resign(&cluster, first.node_id).await;
    let next = announced_leader_after(&cluster, t, first.node_id).await;
    let t2 = next.token.unwrap();
    assert!(t2 > t, "terms only grow: {t2} > {t}");
    fence_is(&cluster.proxy, t2, "the new token at A").await;

    for (proxy, name) in [(&proxy_b, "B"), (&cluster.proxy, "A")] {
        let stale = put(&proxy.url("/ledger/stale"), t, "from the old leader").await;
        assert_eq!(
            stale.status,
            StatusCode::CONFLICT,
            "old token at {name}: {}",
            stale.text()
        );
    }
    let new_at_b = put(&proxy_b.url("/ledger/b-new"), t2, "new token").await;
    assert_eq!(new_at_b.status, StatusCode::CONFLICT, "{}", new_at_b.text());
    let new_at_a = put(&cluster.proxy.url("/ledger/a-new"), t2, "new token").await;
    assert_eq!(new_at_a.status, StatusCode::OK, "{}", new_at_a.text());
    assert_eq!(stored_keys(&proxy_b).await, ["ledger/b-before"]);
    assert_eq!(proxy_b.fence(DEFAULT_SCOPE).await, Some(RETIRED_FENCE));
}

/// Goal: a bad entry (user information, a fragment, a query) is refused up front, at
/// `POST /v1/announce` with a 400 naming the entry without its password, and at
/// `--announce` and the config file with exit status 2 naming `announce`; the list is
/// unchanged. An unreachable proxy beside a working one never stops the announcement to
/// the working one: after an election it holds the new token and the old token is
/// refused there and never stored. Removing the unreachable proxy is refused (409) until
/// `force`. Method: a cluster whose nodes also announce to a closed port; the bad
/// requests; resign; the stale write; the removal without and with `force`; then the
/// `palisade node` processes with bad flags and a bad file.
#[tokio::test]
async fn bad_entries_are_refused_and_an_unreachable_proxy_stops_no_announce() {
    let dir = tempfile::tempdir().unwrap();
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", listener.local_addr().unwrap())
    };
    let cluster = cluster(&dir.path().join("cluster"), std::slice::from_ref(&closed));
    let first = first_announced_leader(&cluster, ELECTION_TIMEOUT).await;
    let t = first.token.unwrap();
    let leader = cluster.node(first.node_id).unwrap();
    assert!(
        !leader.leadership().await.unwrap().announced,
        "the closed port never accepts"
    );
    let ok = put(&cluster.proxy.url("/ledger/first"), t, "first").await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.text());
    let page = send(Method::GET, &leader.api_url("/"), &[], "")
        .await
        .text();
    assert!(
        page.contains(&closed),
        "the status page names the unreachable proxy"
    );

    let before = listed(&cluster, first.node_id).await;
    for bad in [
        "http://u:s3cret@127.0.0.1:1",
        "http://127.0.0.1:1/#frag",
        "http://127.0.0.1:1/?q",
        "http://127.0.0.1:1/a/../b",
    ] {
        let a_url = cluster.proxy.admin_url("");
        let body = serde_json::json!({ "proxies": [a_url, bad] });
        let answer = change(&cluster, first.node_id, &body).await;
        assert_eq!(
            answer.status,
            StatusCode::BAD_REQUEST,
            "{bad}: {}",
            answer.text()
        );
        let problem = answer.problem().expect("problem+json");
        assert_eq!(problem.kind(), "bad-announce", "{bad}: {problem:?}");
        assert!(
            problem.detail.contains("announce entry"),
            "{bad}: {problem:?}"
        );
        assert!(!problem.detail.contains("s3cret"), "{bad}: {problem:?}");
    }
    assert_eq!(
        listed(&cluster, first.node_id).await,
        before,
        "the list is unchanged"
    );

    resign(&cluster, first.node_id).await;
    let next = cluster
        .wait_for_leader(t, Some(first.node_id), ELECTION_TIMEOUT)
        .await
        .expect("a new leader after the resignation");
    let t2 = next.token.unwrap();
    fence_is(&cluster.proxy, t2, "the new token at the working proxy").await;
    let stale = put(
        &cluster.proxy.url("/ledger/stale"),
        t,
        "from the old leader",
    )
    .await;
    assert_eq!(stale.status, StatusCode::CONFLICT, "{}", stale.text());
    assert_eq!(stored_keys(&cluster.proxy).await, ["ledger/first"]);

    // Removing the unreachable proxy would leave it unfenced: refused without `force`.
    let only_a = serde_json::json!({ "proxies": [cluster.proxy.admin_url("")] });
    let refused = change(&cluster, next.node_id, &only_a).await;
    assert_eq!(refused.status, StatusCode::CONFLICT, "{}", refused.text());
    let problem = refused.problem().expect("problem+json");
    assert_eq!(problem.kind(), "proxy-not-retired", "{problem:?}");
    assert!(problem.detail.contains(&closed), "{problem:?}");
    assert_eq!(
        listed(&cluster, next.node_id).await.len(),
        2,
        "nothing proposed"
    );
    let forced = serde_json::json!({ "proxies": [cluster.proxy.admin_url("")], "force": true });
    let answer = change(&cluster, next.node_id, &forced).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    let changed: AnnounceChanged = serde_json::from_slice(&answer.body).unwrap();
    assert_eq!(changed.removed.len(), 1, "{changed:?}");
    assert!(
        !changed.removed[0].retired && changed.removed[0].error.is_some(),
        "{changed:?}"
    );
    let new_leader = cluster.node(next.node_id).unwrap();
    wait::poll(ELECTION_TIMEOUT, || async {
        new_leader.leadership().await.filter(|l| l.announced)
    })
    .await
    .expect("with the unreachable proxy gone, the token is announced");

    bad_flags_exit_2(dir.path());
}

/// `palisade node` with a bad `--announce`, and with a bad `announce` in its file: exit
/// status 2, naming `announce`, without the password.
fn bad_flags_exit_2(dir: &Path) {
    let file = write_config(dir, "announce = [\"http://127.0.0.1:1/#frag\"]\n");
    let cases: [&[&str]; 3] = [
        &["--announce", "http://u:s3cret@127.0.0.1:1"],
        &["--announce", "http://127.0.0.1:1?q"],
        &["--config", &file],
    ];
    for extra in cases {
        let mut child = std::process::Command::new(crate::PALISADE)
            .args([
                "node",
                "--id",
                "1",
                "--peers",
                "1=127.0.0.1:1",
                "--api",
                "127.0.0.1:0",
            ])
            .arg("--data-dir")
            .arg(dir.join("bad-node"))
            .args(extra)
            .env_remove("PALISADE_ANNOUNCE")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + EXIT_TIMEOUT;
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                panic!("{extra:?}: palisade node did not exit");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
        assert_eq!(status.code(), Some(2), "{extra:?}: {stderr}");
        assert!(stderr.contains("announce"), "{extra:?}: {stderr}");
        assert!(!stderr.contains("s3cret"), "{extra:?}: {stderr}");
    }
}
