//! Fleet leases and the token release, on real raft nodes in process: the in-memory
//! network between nodes, each node's API on loopback, and proxies faked with plain
//! sockets (or an address where nothing listens).
//!
//! Real time except where a test says otherwise; waits are for conditions, with
//! deadlines.
// Metric samples compared here are small integer counts, exact in an f64.
#![allow(clippy::float_cmp)]

use std::collections::BTreeMap;
use std::future::ready;
use std::sync::Arc;
use std::time::Duration;

use palisade_cluster::wait;
use palisade_election::{Leadership, MemNetwork, NodeConfig, NodeHandle, Problem, ReleasedBy};
use palisade_protocol::LeaderView;
use palisade_protocol::lease::{LeaseGrant, LeaseRequest};

use crate::support::{self, SCOPE, advance_of, fake_proxy, leadership, token_holder};

/// A proxy URL where nothing listens: every announcement to it fails.
fn silent_proxy() -> String {
    format!(
        "http://127.0.0.1:{}",
        palisade_cluster::free_port().unwrap()
    )
}

struct Settings {
    nodes: u64,
    tick_ms: u64,
    lease_ms: u64,
    write_bound_ms: u64,
    announce: Vec<String>,
}

impl Settings {
    /// Three nodes with one-second leases, announcing to `proxy`.
    fn three_nodes(proxy: &str) -> Self {
        Self {
            nodes: 3,
            tick_ms: 20,
            lease_ms: 1_000,
            write_bound_ms: 100,
            announce: vec![proxy.to_owned()],
        }
    }
}

fn config(id: u64, s: &Settings) -> NodeConfig {
    let ids: Vec<u64> = (1..=s.nodes).collect();
    NodeConfig {
        api: Some("127.0.0.1:0".parse().unwrap()),
        scope: SCOPE.into(),
        announce: s.announce.clone(),
        tick_ms: s.tick_ms,
        election_ticks: 10,
        lease_ms: s.lease_ms,
        lease_write_bound_ms: s.write_bound_ms,
        ..support::config(id, &ids)
    }
}

struct Cluster {
    net: MemNetwork,
    nodes: BTreeMap<u64, NodeHandle>,
    http: reqwest::Client,
}

impl Cluster {
    async fn start(s: &Settings) -> Self {
        let net = MemNetwork::new();
        let mut nodes = BTreeMap::new();
        for id in 1..=s.nodes {
            nodes.insert(id, support::start_in_memory(config(id, s), &net).await);
        }
        Self {
            net,
            nodes,
            http: reqwest::Client::new(),
        }
    }

    /// Waits until one node holds a released token; its id and leadership.
    async fn leader(&self) -> (u64, Leadership) {
        token_holder(self.nodes.values(), |_| true).await
    }

    fn url(&self, id: u64, path: &str) -> String {
        format!("http://{}{path}", self.nodes[&id].api_addr().unwrap())
    }

    /// `POST /v1/lease` to node `id` for `proxy`: the status and the body.
    async fn lease(&self, id: u64, proxy: &str) -> (u16, String) {
        let answer = self
            .http
            .post(self.url(id, "/v1/lease"))
            .json(&LeaseRequest {
                proxy: proxy.to_owned(),
                urgent: false,
            })
            .send()
            .await
            .unwrap();
        (answer.status().as_u16(), answer.text().await.unwrap())
    }

    async fn view(&self, id: u64) -> serde_json::Value {
        let answer = self.http.get(self.url(id, "/v1/leader")).send().await;
        answer.unwrap().json().await.unwrap()
    }

    /// A counter or gauge of node `id` (the first sample whose line starts with `name`).
    fn metric(&self, id: u64, name: &str) -> f64 {
        metric(&self.nodes[&id].metrics_text(), name)
    }

    async fn stop(self) {
        for node in self.nodes.into_values() {
            node.stop().await.unwrap();
        }
    }
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next())
        .map_or(0.0, |v| v.parse().unwrap())
}

/// Goal: the leader grants a lease on its own term, only after a quorum round (the rounds
/// metric moved), naming itself and the lease duration; a follower answers 503
/// not-leader naming the leader; a proxy not in `--announce` gets 403 unknown-proxy; the
/// leader view shows the additive lease fields.
/// Method: three nodes with leases and one accepting proxy; ask each node.
#[tokio::test]
async fn leader_grants_after_a_quorum_round_and_followers_refuse() {
    let (proxy, _) = fake_proxy(200).await;
    let cluster = Cluster::start(&Settings::three_nodes(&proxy)).await;
    let (leader, l) = cluster.leader().await;
    let rounds = cluster.metric(leader, "palisade_node_lease_rounds_total");
    let (status, body) = cluster.lease(leader, &format!("{proxy}/")).await;
    assert_eq!(status, 200, "{body}");
    let grant: LeaseGrant = serde_json::from_str(&body).unwrap();
    assert_eq!(grant.term, l.term);
    assert_eq!(grant.leader_id, leader);
    assert_eq!(grant.lease_ms, 1_000);
    assert_eq!(grant.scope.as_str(), "orders");
    assert!(cluster.metric(leader, "palisade_node_lease_rounds_total") > rounds);
    assert_eq!(
        cluster.metric(leader, "palisade_node_lease_grants_total"),
        1.0
    );

    let follower = (1..=3).find(|&id| id != leader).unwrap();
    let (status, body) = cluster.lease(follower, &proxy).await;
    assert_eq!(status, 503, "{body}");
    let problem: Problem = serde_json::from_str(&body).unwrap();
    assert_eq!(problem.kind(), "not-leader");
    assert_eq!(problem.leader_id, Some(leader));

    let (status, body) = cluster.lease(leader, "http://127.0.0.1:1").await;
    assert_eq!(status, 403, "{body}");
    let problem: Problem = serde_json::from_str(&body).unwrap();
    assert_eq!(problem.kind(), "unknown-proxy");

    let view = cluster.view(leader).await;
    assert_eq!(view["lease_ms"], 1_000, "{view}");
    assert_eq!(view["released"], true, "{view}");
    let view: LeaderView = serde_json::from_value(view).unwrap();
    assert_eq!(view.token, Some(l.term));
    cluster.stop().await;
}

/// Goal: a leader cut off from its quorum grants nothing: its renewal times out or is
/// answered not-leader, and no grant is counted.
/// Method: three nodes; cut the leader's links both ways; ask it for a lease.
#[tokio::test]
async fn leader_cut_off_from_its_quorum_grants_nothing() {
    let (proxy, _) = fake_proxy(200).await;
    let cluster = Cluster::start(&Settings::three_nodes(&proxy)).await;
    let (leader, _) = cluster.leader().await;
    let (status, body) = cluster.lease(leader, &proxy).await;
    assert_eq!(status, 200, "the healthy leader grants: {body}");
    let grants = cluster.metric(leader, "palisade_node_lease_grants_total");
    cluster.net.partition(&[leader], &[1, 2, 3]);
    let (status, body) = cluster.lease(leader, &proxy).await;
    assert_eq!(status, 503, "{body}");
    let problem: Problem = serde_json::from_str(&body).unwrap();
    assert!(
        ["lease-timeout", "not-leader"].contains(&problem.kind()),
        "{body}"
    );
    assert_eq!(
        cluster.metric(leader, "palisade_node_lease_grants_total"),
        grants
    );
    cluster.stop().await;
}

/// Goal: concurrent renewals share one `ReadIndex` round: N requests arriving while a
/// round is pending cost at most two rounds (the pending one and one for the batch).
/// Method: cut the leader's links so its rounds cannot complete, send N requests, wait
/// until the loop holds all N (the pending gauge), heal; every request is granted and
/// the rounds metric moved by at most two.
#[tokio::test]
async fn concurrent_renewals_share_one_round() {
    const N: u32 = 20;
    let (proxy, _) = fake_proxy(200).await;
    let settings = Settings {
        nodes: 3,
        // Long election timeout (10 x 100 ms): the cut below must not depose the leader.
        tick_ms: 100,
        lease_ms: 5_000,
        write_bound_ms: 100,
        announce: vec![proxy.clone()],
    };
    let cluster = Arc::new(Cluster::start(&settings).await);
    let (leader, l) = cluster.leader().await;
    let rounds = cluster.metric(leader, "palisade_node_lease_rounds_total");
    cluster.net.partition(&[leader], &[1, 2, 3]);
    let mut requests = Vec::new();
    for _ in 0..N {
        let cluster = Arc::clone(&cluster);
        let proxy = proxy.clone();
        requests.push(tokio::spawn(
            async move { cluster.lease(leader, &proxy).await },
        ));
    }
    wait::poll(support::SETTLE_TIMEOUT, || {
        let pending = cluster.metric(leader, "palisade_node_lease_pending");
        ready((pending >= f64::from(N)).then_some(()))
    })
    .await
    .expect("every request to arrive at the leader's loop");
    cluster.net.heal();
    for request in requests {
        let (status, body) = request.await.unwrap();
        assert_eq!(status, 200, "{body}");
        let grant: LeaseGrant = serde_json::from_str(&body).unwrap();
        assert_eq!(grant.term, l.term);
    }
    let used = cluster.metric(leader, "palisade_node_lease_rounds_total") - rounds;
    assert!(
        (1.0..=2.0).contains(&used),
        "{N} requests used {used} rounds"
    );
    Arc::into_inner(cluster).unwrap().stop().await;
}

/// Goal: with a proxy that never acknowledges, the token is held back after
/// establishment for the whole release wait (lease * (1 + drift) + write bound), then
/// released by lease expiry, counted by cause.
/// Method: one node on tokio's paused clock (the wait plays out in virtual time, exactly),
/// announcing to an address where nothing listens; time establishment and release.
#[tokio::test(start_paused = true)]
async fn token_is_released_after_the_wait_when_a_proxy_never_acknowledges() {
    let settings = Settings {
        nodes: 1,
        tick_ms: 10,
        lease_ms: 300,
        write_bound_ms: 200,
        announce: vec![silent_proxy()],
    };
    let wait = config(1, &settings).lease_release_wait().unwrap();
    assert_eq!(wait, Duration::from_millis(303 + 200));
    let node = support::start_in_memory(config(1, &settings), &MemNetwork::new()).await;
    let established = leadership(&node, "establishment", |l| l.established.is_some()).await;
    let at = tokio::time::Instant::now();
    assert_eq!(established.token, None, "held back at establishment");
    assert_eq!(established.released_by, None);
    let released = leadership(&node, "release", |l| l.token.is_some()).await;
    let waited = at.elapsed();
    assert!(
        waited >= wait,
        "released after {waited:?}, the wait is {wait:?}"
    );
    assert_eq!(released.token, released.established);
    assert_eq!(released.released_by, Some(ReleasedBy::LeaseExpiry));
    assert!(!released.announced);
    let text = node.metrics_text();
    let line = text
        .lines()
        .find(|l| l.starts_with("palisade_node_token_releases_total") && l.contains("lease-expiry"))
        .unwrap_or_else(|| panic!("no lease-expiry release counted:\n{text}"));
    assert!(line.ends_with(" 1"), "{line}");
    node.stop().await.unwrap();
}

/// Goal: with every proxy acknowledging, the token is released at once (long before a
/// one-minute release wait), by announce, and the proxy saw the term first.
/// Method: one node with a minute-long lease and an accepting fake proxy.
#[tokio::test]
async fn token_is_released_at_once_when_every_proxy_acknowledges() {
    let (proxy, seen) = fake_proxy(200).await;
    let settings = Settings {
        nodes: 1,
        tick_ms: 10,
        lease_ms: 60_000,
        write_bound_ms: 500,
        announce: vec![proxy],
    };
    let node = support::start_in_memory(config(1, &settings), &MemNetwork::new()).await;
    let released = leadership(&node, "release", |l| l.token.is_some()).await;
    assert_eq!(released.released_by, Some(ReleasedBy::Announce));
    assert!(released.announced);
    let tokens: Vec<u64> = seen
        .lock()
        .unwrap()
        .iter()
        .filter_map(|r| advance_of(r))
        .map(|a| a.token)
        .collect();
    assert_eq!(
        tokens,
        [released.token.unwrap()],
        "the proxy accepted the term before its release"
    );
    node.stop().await.unwrap();
}

/// Goal: with leases off nothing changes: the token is available at establishment even
/// though a proxy never acknowledges, and the leader view has no lease fields.
/// Method: one node without `lease_ms`, announcing to an address where nothing listens.
#[tokio::test]
async fn leases_off_release_the_token_at_establishment() {
    let settings = Settings {
        nodes: 1,
        tick_ms: 10,
        lease_ms: 0,
        write_bound_ms: 500,
        announce: vec![silent_proxy()],
    };
    let cluster = Cluster::start(&settings).await;
    let node = &cluster.nodes[&1];
    let l = leadership(node, "establishment", |l| l.established.is_some()).await;
    assert_eq!(l.token, l.established, "released with establishment");
    assert_eq!(l.released_by, Some(ReleasedBy::Establishment));
    assert!(!l.announced);
    let view = cluster.view(1).await;
    assert_eq!(view["token"], l.token.unwrap(), "{view}");
    assert!(view.get("lease_ms").is_none(), "{view}");
    assert!(view.get("released").is_none(), "{view}");
    let (status, body) = cluster.lease(1, &settings.announce[0]).await;
    assert_eq!(status, 409, "{body}");
    cluster.stop().await;
}
