//! Peers nobody can impersonate, end to end: a hostile client speaks the nodes' peer wire
//! by hand (`palisade_tests::peer_wire`). With `--cert/--key/--ca` (certificates from
//! `palisade certs generate`) a caller without a certificate, or with one whose name is
//! not the id it claims, gets nowhere, and the node API wants a client certificate. In
//! plaintext loopback mode, where any local process may claim a peer id, the frames that
//! used to panic or hijack a node are dropped and every node keeps running at its term,
//! and so are frames nested 500,000 groups deep (RUSTSEC-2024-0437's kind of input).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use http::Method;
use palisade_client::NodeApi;
use palisade_cluster::Pki;
use palisade_cluster::wait::{self, poll};
use palisade_cluster::{ClusterOptions, ClusterSpec, LeaderView, NodeProcess, NodeSpec, free_port};
use palisade_tests::client::send;
use palisade_tests::peer_wire::{
    MessageType, NESTED_GROUPS, Outcome, heartbeat, hello, nested_envelope_frame,
    nested_payload_frame, raft_frame, send_plain, send_tls,
};
use palisade_tests::process::start_cluster;
use palisade_tests::trust::generate_certs;

/// Generous bound for a cluster to settle on a loaded 2-core machine.
const SETTLE: Duration = Duration::from_secs(20);
/// How long a node is watched after a forged frame for a term change or a crash: several
/// election timeouts at the ticks below, far longer than a node takes to act on a frame.
const WATCH: Duration = Duration::from_secs(1);
/// The tick of these clusters: slow enough that no spurious election changes a term while
/// a test watches for one.
const TICK_MS: &str = "50";
/// The node's counter of dropped peer messages, labelled by reason.
const DROPPED_METRIC: &str = "palisade_node_peer_messages_dropped_total";
/// A term jump small enough that a node would follow it from an accepted peer: the probe
/// that shows a frame got through.
const PROBE_JUMP: u64 = 5;

/// Every answering node's view, by id.
type Views = BTreeMap<u64, LeaderView>;

/// A client certificate and its key (PEM files), or none.
type Identity<'a> = Option<(&'a Path, &'a Path)>;

/// Watches `read` for [`WATCH`]; panics if any node stops answering or its term leaves
/// `term`.
async fn stays_at<F, Fut>(what: &str, term: u64, n: usize, read: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Views>,
{
    let broken = poll(WATCH, || async {
        let views = read().await;
        if views.len() != n {
            return Some(format!(
                "only {} of {n} nodes answer: {views:?}",
                views.len()
            ));
        }
        views
            .values()
            .find(|v| v.term != term)
            .map(|v| format!("node {} moved to term {} from {term}", v.node_id, v.term))
    })
    .await;
    if let Some(broken) = broken {
        panic!("after {what}: {broken}");
    }
}

/// The drops `node` counted for `reason` (`palisade_node_peer_messages_dropped_total`).
async fn drops(url: &str, reason: &str) -> u64 {
    let text = send(Method::GET, url, &[], "").await.text();
    let label = format!("reason=\"{reason}\"");
    text.lines()
        .filter(|l| l.starts_with(DROPPED_METRIC) && l.contains(&label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Goal: in plaintext loopback mode, a forged heartbeat with commit 10^9, one at term
/// 2^64-2, one 5000 terms ahead, a forged `MsgTimeoutNow` from a peer that is not the
/// leader or from a non-peer (by its hello, or by its frame on a peer's connection), and
/// a local-only `MsgHup` leave every running node running at its term, each drop counted
/// by reason; a small, well-formed term jump from the same claimed peer does get through
/// (plaintext has no authentication), which shows the forged frames were well-formed and
/// reached the node's checks. Method: three nodes on 127.0.0.1 without certificates; one
/// follower is killed so that its id has no live connection a forger would have to
/// replace (plaintext never replaces a live peer's); each forgery written on a raw TCP
/// connection claiming that id, to the other follower and to the leader; the drop counters
/// awaited in `/metrics`; the nodes watched for a crash or a term change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_peer_frames_leave_every_node_running_at_its_term() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let spec = ClusterSpec {
        nodes: 3,
        node_flags: vec!["--tick-ms".into(), TICK_MS.into()],
        proxy_flags: Vec::new(),
    };
    let options = ClusterOptions {
        announce: false,
        ..ClusterOptions::default()
    };
    let mut cluster = start_cluster(dir.path(), &spec, &options);
    let ids = cluster.ids();
    let leader = wait::poll(SETTLE, || cluster.settled_leader(&ids))
        .await
        .expect("timed out waiting for a settled leader");
    let l = leader.node_id;
    let mut followers = ids.iter().copied().filter(|&id| id != l);
    let (f1, gone) = (followers.next().unwrap(), followers.next().unwrap());
    cluster.node_mut(gone).unwrap().kill9();
    let running = [l, f1];
    let settled = wait::poll(SETTLE, || cluster.settled_leader(&running))
        .await
        .expect("timed out waiting for the two running nodes to settle");
    let term = settled.term;
    let peers = cluster.nodes[0].spec.peers.clone();
    let stranger = 99;
    let two_alive = || async {
        let mut views = cluster.leaderships().await;
        views.remove(&gone);
        views
    };

    let hup = MessageType::MsgHup;
    let now = MessageType::MsgTimeoutNow;
    let forgeries: Vec<(&str, u64, u64, Vec<u8>, &str)> = vec![
        (
            "commit 10^9",
            f1,
            gone,
            heartbeat(gone, f1, term, 1_000_000_000),
            "commit_beyond_log",
        ),
        (
            "commit 10^9",
            l,
            gone,
            heartbeat(gone, l, term, 1_000_000_000),
            "commit_beyond_log",
        ),
        (
            "term 2^64-2",
            f1,
            gone,
            heartbeat(gone, f1, u64::MAX - 1, 0),
            "term_overflow",
        ),
        (
            "term 2^64-2",
            l,
            gone,
            heartbeat(gone, l, u64::MAX - 1, 0),
            "term_overflow",
        ),
        (
            "5000 terms ahead",
            f1,
            gone,
            heartbeat(gone, f1, term + 5000, 0),
            "term_too_far_ahead",
        ),
        (
            "MsgTimeoutNow not from the leader",
            f1,
            gone,
            raft_frame(now, gone, f1, term, 0),
            "timeout_now_not_from_leader",
        ),
        (
            "MsgTimeoutNow from a non-peer",
            f1,
            stranger,
            raft_frame(now, stranger, f1, term, 0),
            "",
        ),
        (
            "a non-peer's frame on a peer's connection",
            f1,
            gone,
            raft_frame(now, stranger, f1, term, 0),
            "",
        ),
        (
            "a local-only MsgHup",
            f1,
            gone,
            raft_frame(hup, gone, f1, term, 0),
            "",
        ),
    ];
    for (what, to, claimed, frame, reason) in &forgeries {
        let metrics = cluster.node(*to).unwrap().api_url("/metrics");
        let before = drops(&metrics, reason).await;
        let outcome = send_plain(peers[to], &[hello(*claimed, *to), frame.clone()].concat()).await;
        eprintln!("{what} to node {to}, as {claimed}: {outcome:?}");
        if !reason.is_empty() {
            wait::poll(SETTLE, || async {
                (drops(&metrics, reason).await > before).then_some(())
            })
            .await
            .unwrap_or_else(|| panic!("timed out waiting for node {to} to count a {reason} drop"));
        }
        stays_at(what, term, running.len(), two_alive).await;
    }
    for id in running {
        assert!(
            cluster.node_mut(id).unwrap().is_running(),
            "node {id} is running"
        );
    }

    // The control: the same wire and claimed id, a small jump, is followed.
    let probe = term + PROBE_JUMP;
    send_plain(
        peers[&f1],
        &[hello(gone, f1), heartbeat(gone, f1, probe, 0)].concat(),
    )
    .await;
    wait::poll(SETTLE, || async {
        cluster
            .node(f1)
            .unwrap()
            .leadership()
            .await
            .filter(|v| v.term >= probe)
    })
    .await
    .expect("timed out waiting for the probe's term at the node");
}

/// Goal: RUSTSEC-2024-0437 (protobuf: a stack overflow on deeply nested groups) cannot
/// be reached from the peer port: a frame whose raft payload ends in 500,000 nested
/// groups (protobuf 2 skips an unknown group in a loop and refuses a group inside it),
/// and one whose envelope does (prost stops at its recursion limit of 100), are refused,
/// the connection closed, and every running node keeps running at its term; the same
/// wire with a small term jump gets through (the control). Method: as in
/// `forged_peer_frames_leave_every_node_running_at_its_term`, three plaintext nodes, one
/// follower killed so that its id is free to claim; each frame (about 1 MB, under the
/// 4 MiB frame limit) written after a hello claiming that id, to the leader and to the
/// other follower; the nodes watched for a crash or a term change, and their logs read
/// for the two causes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_frames_nested_500000_deep_are_refused_and_every_node_keeps_its_term() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let spec = ClusterSpec {
        nodes: 3,
        node_flags: vec!["--tick-ms".into(), TICK_MS.into()],
        proxy_flags: Vec::new(),
    };
    let options = ClusterOptions {
        announce: false,
        ..ClusterOptions::default()
    };
    let mut cluster = start_cluster(dir.path(), &spec, &options);
    let ids = cluster.ids();
    let leader = wait::poll(SETTLE, || cluster.settled_leader(&ids))
        .await
        .expect("timed out waiting for a settled leader");
    let l = leader.node_id;
    let mut followers = ids.iter().copied().filter(|&id| id != l);
    let (f1, gone) = (followers.next().unwrap(), followers.next().unwrap());
    cluster.node_mut(gone).unwrap().kill9();
    let running = [l, f1];
    let term = wait::poll(SETTLE, || cluster.settled_leader(&running))
        .await
        .expect("timed out waiting for the two running nodes to settle")
        .term;
    let peers = cluster.nodes[0].spec.peers.clone();
    let two_alive = || async {
        let mut views = cluster.leaderships().await;
        views.remove(&gone);
        views
    };
    for to in running {
        for (what, frame) in [
            ("the raft payload", nested_payload_frame(gone, to, term)),
            ("the envelope", nested_envelope_frame(gone, to, term)),
        ] {
            let outcome = send_plain(peers[&to], &[hello(gone, to), frame].concat()).await;
            eprintln!("{NESTED_GROUPS} nested groups in {what}, to node {to}: {outcome:?}");
            assert!(
                matches!(outcome, Outcome::Refused(_)),
                "node {to} kept the connection of a frame with {NESTED_GROUPS} nested groups in {what}"
            );
            stays_at(
                &format!("nested groups in {what} to node {to}"),
                term,
                running.len(),
                two_alive,
            )
            .await;
        }
    }
    for id in running {
        assert!(
            cluster.node_mut(id).unwrap().is_running(),
            "node {id} is running"
        );
        // The refusals' causes, as the node logged them: protobuf 2 refusing the group in
        // a group, prost stopping at its recursion limit.
        let logs = cluster.node(id).unwrap().logs().concat();
        for cause in ["unexpected wire type", "recursion limit"] {
            assert!(
                logs.lines()
                    .any(|l| l.contains("peer connection closed") && l.contains(cause)),
                "node {id} logged no refusal for {cause:?}"
            );
        }
    }
    // The control: the same hello and a small term jump are followed, so the frames above
    // were refused for their nesting, not for who sent them.
    let probe = term + PROBE_JUMP;
    send_plain(
        peers[&f1],
        &[hello(gone, f1), heartbeat(gone, f1, probe, 0)].concat(),
    )
    .await;
    wait::poll(SETTLE, || async {
        cluster
            .node(f1)
            .unwrap()
            .leadership()
            .await
            .filter(|v| v.term >= probe)
    })
    .await
    .expect("timed out waiting for the probe's term at the node");
}

/// Three nodes with certificates `node-1..3`, their API clients (with the
/// `writer-client` certificate) and peer addresses.
struct Secure {
    nodes: Vec<NodeProcess>,
    apis: BTreeMap<u64, NodeApi>,
    raft: BTreeMap<u64, SocketAddr>,
}

impl Secure {
    fn start(dir: &Path, certs: &Pki) -> Self {
        let raft: BTreeMap<u64, SocketAddr> = (1..=3)
            .map(|id| (id, SocketAddr::from(([127, 0, 0, 1], free_port().unwrap()))))
            .collect();
        let tls = certs.client_tls(Some("writer-client")).unwrap();
        let mut nodes = Vec::new();
        let mut apis = BTreeMap::new();
        for id in 1..=3u64 {
            let api = SocketAddr::from(([127, 0, 0, 1], free_port().unwrap()));
            let mut extra = vec!["--tick-ms".to_owned(), TICK_MS.to_owned()];
            extra.extend(certs.node_flags(&format!("node-{id}")));
            let spec = NodeSpec {
                id,
                peers: raft.clone(),
                api,
                data_dir: dir.join(format!("node-{id}")),
                announce: Vec::new(),
                extra,
                env: Vec::new(),
                prefix: Vec::new(),
            };
            nodes.push(NodeProcess::start(spec, dir).unwrap_or_else(|e| panic!("{e}")));
            let client = NodeApi::with_tls(&format!("https://{api}"), &tls)
                .unwrap()
                .timeout(Duration::from_millis(500));
            apis.insert(id, client);
        }
        Self { nodes, apis, raft }
    }

    async fn views(&self) -> Views {
        let mut out = BTreeMap::new();
        for (&id, api) in &self.apis {
            if let Ok(v) = api.leader().await {
                out.insert(id, v);
            }
        }
        out
    }

    async fn settled(&self) -> Option<LeaderView> {
        let views = self.views().await;
        let leaders: Vec<&LeaderView> = views.values().filter(|v| v.token.is_some()).collect();
        match leaders.as_slice() {
            [leader] if views.len() == 3 && views.values().all(|v| v.term == leader.term) => {
                Some((*leader).clone())
            }
            _ => None,
        }
    }
}

/// Goal: with peer mTLS, a raw TCP client without a certificate and a TLS client without
/// one cannot speak to a peer port; a client holding `node-2`'s certificate cannot claim
/// to be node 1 (at node 3, or node 1 itself); every node keeps its term; the node API
/// refuses a call without a client certificate (over TLS, and in plain HTTP) and answers
/// one with a certificate from the CA; and the same wire with `node-2`'s certificate
/// naming node 2 does get through (the control). Method: `palisade certs generate`, three
/// nodes with `--cert/--key/--ca`, forged hellos and a probe heartbeat a few terms ahead
/// that a node would follow if it accepted the frame; watch the terms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_and_the_node_api_refuse_callers_without_the_right_certificate() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let certs = generate_certs(
        &dir.path().join("certs"),
        &["node-1", "node-2", "node-3", "writer-client"],
    );
    let mut secure = Secure::start(dir.path(), &certs);
    let leader = wait::poll(SETTLE, || secure.settled())
        .await
        .expect("timed out waiting for a settled leader over mTLS");
    let term = leader.term;
    let probe = term + PROBE_JUMP;

    // The node API.
    let api1 = secure.nodes[0].spec.api;
    let anonymous = NodeApi::with_tls(&format!("https://{api1}"), &certs.client_tls(None).unwrap())
        .unwrap()
        .timeout(Duration::from_secs(2));
    let refused = anonymous.leader().await;
    assert!(refused.is_err(), "no client certificate: {refused:?}");
    let plain = NodeApi::new(&format!("http://{api1}"))
        .unwrap()
        .timeout(Duration::from_secs(2));
    let refused = plain.leader().await;
    assert!(refused.is_err(), "plain HTTP to the TLS API: {refused:?}");
    assert!(
        secure.apis[&1].leader().await.is_ok(),
        "with the client certificate"
    );

    let node2 = Some((certs.cert("node-2"), certs.key("node-2")));
    let node2 = node2.as_ref().map(|(c, k)| (c.as_path(), k.as_path()));
    let client = Some((certs.cert("writer-client"), certs.key("writer-client")));
    let client = client.as_ref().map(|(c, k)| (c.as_path(), k.as_path()));
    let raft = secure.raft.clone();
    let attempts: Vec<(&str, u64, Option<Identity>, Vec<u8>)> = vec![
        (
            "raw TCP, no certificate",
            1,
            None,
            [hello(2, 1), heartbeat(2, 1, probe, 0)].concat(),
        ),
        (
            "TLS without a client certificate",
            1,
            Some(None),
            [hello(2, 1), heartbeat(2, 1, probe, 0)].concat(),
        ),
        (
            "node-2's certificate claiming node 1, at node 3",
            3,
            Some(node2),
            [hello(1, 3), heartbeat(1, 3, probe, 0)].concat(),
        ),
        (
            "node-2's certificate claiming node 1, at node 1",
            1,
            Some(node2),
            [hello(1, 1), heartbeat(1, 1, probe, 0)].concat(),
        ),
        (
            "a client certificate claiming node 2",
            1,
            Some(client),
            [hello(2, 1), heartbeat(2, 1, probe, 0)].concat(),
        ),
    ];
    for (what, to, tls, bytes) in &attempts {
        let outcome = match tls {
            None => send_plain(raft[to], bytes).await,
            Some(identity) => send_tls(raft[to], *identity, bytes).await,
        };
        assert!(
            matches!(outcome, Outcome::Refused(_)),
            "{what}: the node let the caller in ({outcome:?})"
        );
        stays_at(what, term, 3, || secure.views()).await;
    }
    for node in &mut secure.nodes {
        assert!(node.is_running(), "node {} is running", node.id());
    }

    // The control: node-2's certificate naming node 2 is a peer, and its probe is followed.
    let outcome = send_tls(
        raft[&3],
        node2,
        &[hello(2, 3), heartbeat(2, 3, probe, 0)].concat(),
    )
    .await;
    eprintln!("the control: {outcome:?}");
    wait::poll(SETTLE, || async {
        secure.apis[&3]
            .leader()
            .await
            .ok()
            .filter(|v| v.term >= probe)
    })
    .await
    .expect("timed out waiting for the probe's term at node 3");
}
