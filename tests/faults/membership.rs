//! Membership changes on real `palisade node` processes while workers write through the
//! proxy, every history checked: growing 3 -> 5 -> 3 (each new member a learner first,
//! promoted once caught up), replacing a node whose data directory was wiped, adding a
//! member after the log was compacted (it catches up from a snapshot), refusing a reused
//! id, and changing the `--announce` proxy list.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use palisade_client::{LeaderView, MemberList, MemberRole, NodeApi};
use palisade_cluster::{NodeProcess, NodeSpec, ProxyProcess, free_port};
use palisade_protocol::AnnounceList;
use palisade_protocol::node::ANNOUNCE_PATH;
use palisade_protocol::process::{TEST_LOG_RETAINED_ENV, events};
use palisade_tests::scenario::{Scenario, ScenarioSpec};

/// Longest a membership change, a join or an exit may take here: a few elections on a
/// loaded machine.
pub(crate) const STEP: Duration = Duration::from_secs(30);

/// Some node's API client, by id.
pub(crate) fn api(s: &Scenario, id: u64) -> &NodeApi {
    s.cluster.node(id).unwrap().api()
}

/// Node `id`'s leader view now (the node must be running and answer).
pub(crate) async fn view_of(s: &Scenario, id: u64) -> LeaderView {
    s.cluster
        .node(id)
        .unwrap()
        .leadership()
        .await
        .unwrap_or_else(|| panic!("node {id} did not answer its leader view"))
}

/// The default scenario (three nodes, a proxy, workers) on the tested binary, once its
/// leader is announced: the scenario, the leader, one follower and the term.
pub(crate) async fn start_three() -> (Scenario, u64, u64, u64) {
    crate::use_tested_binary();
    let mut s = Scenario::start(&ScenarioSpec::default()).await;
    let (leader, follower, term) = leader_and_follower(&mut s, 0).await;
    (s, leader, follower, term)
}

/// The id of an established leader and of one follower.
pub(crate) async fn leader_and_follower(s: &mut Scenario, above: u64) -> (u64, u64, u64) {
    let leader = s.wait_announced_leader(above, None).await;
    let follower = s
        .cluster
        .ids()
        .into_iter()
        .find(|&id| id != leader.node_id)
        .unwrap();
    (leader.node_id, follower, leader.term)
}

/// What a node's member list shows for an id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shown {
    /// A member with this role.
    Member(MemberRole),
    /// Removed.
    Removed,
}

/// Waits until every running node shows `id` as `want`, with no change under way; pumps
/// the workers meanwhile.
pub(crate) async fn wait_members_everywhere(s: &mut Scenario, id: u64, want: Shown) {
    s.pump_until(
        &format!("every node to show member {id} as {want:?}"),
        STEP,
        async |s| {
            for node in &s.cluster.nodes {
                let list = node.api().members().await.ok()?;
                let shown = match want {
                    Shown::Member(role) => list
                        .members
                        .iter()
                        .any(|m| m.id == id && m.role == Some(role)),
                    Shown::Removed => list.removed.contains(&id),
                };
                (shown && !list.joint).then_some(())?;
            }
            Some(())
        },
    )
    .await;
}

/// Adds member `id` through the node `via` (a learner), then starts it with `--join` (the
/// URL of `via`), an empty data directory and `--peers` naming only itself, with the
/// flags and environment of the first node plus `env`; waits until every node shows it
/// promoted to voter.
pub(crate) async fn add_and_join(s: &mut Scenario, via: u64, id: u64, env: &[(&str, &str)]) {
    let peer = SocketAddr::from(([127, 0, 0, 1], free_port().unwrap()));
    let api_addr = SocketAddr::from(([127, 0, 0, 1], free_port().unwrap()));
    let list = api(s, via).add_member(id, &peer.to_string()).await.unwrap();
    assert!(
        list.members
            .iter()
            .any(|m| m.id == id && m.role == Some(MemberRole::Learner)),
        "{list:?}"
    );
    let first = &s.cluster.nodes[0].spec;
    let mut extra = first.extra.clone();
    extra.extend([
        "--join".to_owned(),
        s.cluster.node(via).unwrap().api_url(""),
    ]);
    let mut node_env = first.env.clone();
    node_env.extend(env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
    let spec = NodeSpec {
        id,
        peers: [(id, peer)].into_iter().collect(),
        api: api_addr,
        data_dir: s.cluster.dir.join(format!("node-{id}")),
        announce: first.announce.clone(),
        extra,
        env: node_env,
        prefix: Vec::new(),
    };
    let node = NodeProcess::start(spec, &s.cluster.dir).unwrap();
    s.cluster.nodes.push(node);
    s.say(&format!(
        "node {id} added through node {via} and started with --join"
    ));
    wait_members_everywhere(s, id, Shown::Member(MemberRole::Voter)).await;
}

/// Removes member `id` through node `via` (`force`: even below three voters), waits until
/// every other node applied it, then stops the removed node's process.
async fn remove(s: &mut Scenario, via: u64, id: u64, force: bool) -> MemberList {
    let list = if force {
        api(s, via).remove_member_forced(id).await.unwrap()
    } else {
        api(s, via).remove_member(id).await.unwrap()
    };
    assert!(list.removed.contains(&id), "{list:?}");
    if let Some(mut node) = s
        .cluster
        .nodes
        .iter()
        .position(|n| n.id() == id)
        .map(|i| s.cluster.nodes.remove(i))
    {
        node.kill9();
    }
    wait_members_everywhere(s, id, Shown::Removed).await;
    s.say(&format!("node {id} removed through node {via}"));
    list
}

/// Ends a scenario: lets the workers write a little more, waits for an announced
/// leader, checks that no node panicked, then checks the history (the workers wrote).
pub(crate) async fn settle_and_finish(mut s: Scenario, name: &str) {
    s.run_for(Duration::from_millis(500)).await;
    s.wait_announced_leader(0, None).await;
    assert_no_panic(&s);
    let report = s.finish(name);
    assert!(report.ops() > 0, "the workers wrote");
}

/// No node log of the scenario shows a panic.
pub(crate) fn assert_no_panic(s: &Scenario) {
    for node in &s.cluster.nodes {
        for log in node.logs() {
            assert!(
                !log.contains("panicked"),
                "node {} panicked:\n{log}",
                node.id()
            );
        }
    }
}

/// Goal: the cluster grows from 3 to 5 voters and back to 3 while a worker writes, each
/// new member a learner until it caught up, and a new member can lead. Method: add 4
/// through a follower and 5 through the leader (each started with `--join`), wait until
/// every node lists them as voters (promoted); hand leadership to 5; remove 4, hand leadership back
/// to 1, remove 5; the workers write throughout; check the history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grow_three_to_five_and_back_while_writing() {
    let (mut s, leader, follower, term) = start_three().await;
    add_and_join(&mut s, follower, 4, &[]).await;
    add_and_join(&mut s, leader, 5, &[]).await;
    s.run_for(Duration::from_millis(500)).await;
    let moved = api(&s, leader).transfer(5).await.unwrap();
    assert_eq!(moved.to, 5);
    let five = s.wait_announced_leader(term, None).await;
    assert_eq!(five.node_id, 5, "node 5 leads after the transfer");
    remove(&mut s, 1, 4, false).await;
    api(&s, 5).transfer(1).await.unwrap();
    let one = s.wait_announced_leader(five.term, None).await;
    let list = remove(&mut s, one.node_id, 5, false).await;
    assert_eq!(
        list.members.iter().map(|m| m.id).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    settle_and_finish(s, "grow 3 -> 5 -> 3").await;
}

/// Goal: a node restarted under its old id with a wiped data directory refuses to go on
/// (exit 1, a message that says what to do, no panic anywhere) while the others keep
/// their leader; it is then replaced: removed (with force: two voters are left for a
/// moment), and the machine added under a new id with `--join`. Method: wipe a follower's
/// data directory and restart it; wait for its exit; check its log, the others' leader and
/// every log; remove its id through the other follower; add id 4 and start it with
/// `--join`; check the history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wiped_node_is_refused_then_replaced_under_a_new_id() {
    let (mut s, leader, victim, term) = start_three().await;
    s.run_for(Duration::from_millis(300)).await;
    let node = s.cluster.node_mut(victim).unwrap();
    node.kill9();
    std::fs::remove_dir_all(&node.spec.data_dir).unwrap();
    node.restart().unwrap();
    let code = node.guard.wait_exit(STEP).unwrap();
    assert_eq!(code, Some(1), "the wiped node exits 1");
    let log = node.guard.log_text();
    for needle in [
        "was wiped or replaced",
        "palisade member remove",
        "--join",
        events::STORAGE_LOST,
    ] {
        assert!(log.contains(needle), "{needle:?} missing from:\n{log}");
    }
    s.say(&format!("wiped node {victim} refused to go on"));
    let still = s.cluster.established_leader(Some(victim)).await.unwrap();
    assert_eq!(
        (still.node_id, still.term),
        (leader, term),
        "the others keep their leader"
    );
    assert_no_panic(&s);

    let other = s
        .cluster
        .ids()
        .into_iter()
        .find(|&id| id != leader && id != victim)
        .unwrap();
    remove(&mut s, other, victim, true).await;
    add_and_join(&mut s, leader, 4, &[]).await;
    settle_and_finish(s, "replace a wiped node").await;
}

/// Goal: a member added after the log was compacted catches up from a snapshot (which
/// carries the members table) and becomes a voter. Method: restart the three nodes one by
/// one with a compaction threshold of 2 entries (`PALISADE_TEST_LOG_RETAINED`); move
/// leadership around until a node logged a compaction; add node 4 with `--join`; check
/// its log for `snapshot-applied`, its metric, and that it votes; check the history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_added_after_compaction_catches_up_from_a_snapshot() {
    let (mut s, _, _, mut term) = start_three().await;
    for id in s.cluster.ids() {
        let node = s.cluster.node_mut(id).unwrap();
        node.spec
            .env
            .push((TEST_LOG_RETAINED_ENV.to_owned(), "2".to_owned()));
        node.restart().unwrap();
        term = s.wait_announced_leader(0, None).await.term.max(term);
    }
    // Each new term appends an entry; a few transfers make the log longer than the
    // threshold, so the leader compacts.
    let deadline = Instant::now() + STEP;
    while !s
        .cluster
        .nodes
        .iter()
        .any(|n| n.logs().iter().any(|l| l.contains("raft log compacted")))
    {
        assert!(Instant::now() < deadline, "no node compacted its log");
        let (leader, follower, _) = leader_and_follower(&mut s, 0).await;
        api(&s, leader).transfer(follower).await.unwrap();
        term = s.wait_announced_leader(term, None).await.term;
    }
    s.say("the log was compacted");
    let (leader, _, _) = leader_and_follower(&mut s, 0).await;
    add_and_join(&mut s, leader, 4, &[(TEST_LOG_RETAINED_ENV, "2")]).await;
    let four = s.cluster.node(4).unwrap();
    let log = four.guard.log_text();
    assert!(
        log.contains(events::SNAPSHOT_APPLIED),
        "node 4 did not log {}:\n{log}",
        events::SNAPSHOT_APPLIED
    );
    let metrics = palisade_cluster::client::try_send(
        palisade_client::Method::GET,
        &four.api_url("/metrics"),
        &[],
        Vec::new(),
    )
    .await
    .unwrap()
    .text();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("palisade_node_snapshots_applied_total") && !l.ends_with(" 0")),
        "{metrics}"
    );
    s.run_for(Duration::from_millis(500)).await;
    assert_no_panic(&s);
    let report = s.finish("add after compaction");
    assert!(report.ops() > 0, "the workers wrote");
}

/// Goal: a removed id is never accepted again: 409 with a detail that says so, through
/// the API and through `palisade member add`, and `member list --json` shows it removed.
/// Method: add id 4 (never started: it stays a learner) and remove it; add 4 again
/// through the API and the command line; list the members; check the history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reused_id_is_refused() {
    let (mut s, leader, follower, _) = start_three().await;
    let bin = crate::PALISADE;
    let peer = format!("127.0.0.1:{}", free_port().unwrap());
    api(&s, leader).add_member(4, &peer).await.unwrap();
    wait_members_everywhere(&mut s, 4, Shown::Member(MemberRole::Learner)).await;
    remove(&mut s, follower, 4, false).await;

    let err = api(&s, follower).add_member(4, &peer).await.unwrap_err();
    let problem = err.problem().expect("a problem+json answer");
    assert_eq!(err.status().map(|s| s.as_u16()), Some(409));
    assert_eq!(problem.kind(), "member-id-reused");
    assert!(err.to_string().contains("never reused"), "{err}");

    let url = s.cluster.node(leader).unwrap().api_url("");
    let out = tokio::process::Command::new(bin)
        .args([
            "member", "add", "--node", &url, "--id", "4", "--peer", &peer,
        ])
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("never reused"), "{stderr}");
    let out = tokio::process::Command::new(bin)
        .args(["member", "list", "--node", &url, "--json"])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list: MemberList = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(list.removed, vec![4]);
    assert_eq!(list.members.len(), 3);
    s.run_for(Duration::from_millis(300)).await;
    let report = s.finish("reused id");
    assert!(report.ops() > 0, "the workers wrote");
}

/// Goal: the `--announce` proxy list changes on a running cluster, agreed through raft:
/// every node answers the new list, the leader's current token is announced to the new
/// proxy at once, and the next term is fenced at both. Method: start a second proxy in
/// front of the same upstream; `POST /v1/announce` with both admin URLs through a
/// follower; wait until every node lists both and the second proxy's fence equals the
/// leader's token; hand leadership over; wait until both proxies hold the new term;
/// check the history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn announce_list_changes_on_a_running_cluster() {
    let (mut s, leader, follower, _) = start_three().await;
    let upstream = s.upstream.url();
    let second =
        ProxyProcess::start(&s.cluster.dir.join("proxy-2"), &["--upstream", &upstream]).unwrap();
    let proxies = vec![
        s.cluster.proxy_at(0).unwrap().admin_url(""),
        second.admin_url(""),
    ];
    let body = serde_json::to_vec(&AnnounceList {
        proxies: proxies.clone(),
    })
    .unwrap();
    let url = s.cluster.node(follower).unwrap().api_url(ANNOUNCE_PATH);
    let answer = palisade_cluster::client::try_send_within(
        palisade_client::Method::POST,
        &url,
        &[("content-type", "application/json")],
        body,
        STEP,
    )
    .await
    .unwrap();
    assert_eq!(answer.status.as_u16(), 200, "{}", answer.text());
    s.pump_until("the new announce list to take effect", STEP, async |s| {
        for node in &s.cluster.nodes {
            let list = palisade_cluster::client::try_send(
                palisade_client::Method::GET,
                &node.api_url(ANNOUNCE_PATH),
                &[],
                Vec::new(),
            )
            .await
            .map(|a| serde_json::from_slice::<AnnounceList>(a.text().as_bytes()).ok());
            matches!(list, Ok(Some(l)) if l.proxies == proxies).then_some(())?;
        }
        let token = s.cluster.node(leader)?.leadership().await?.token?;
        (second.fence("default").await == Some(token)).then_some(())
    })
    .await;
    s.say("every node follows the new announce list; the second proxy holds the token");
    let before = view_of(&s, leader).await.term;
    api(&s, leader).transfer(follower).await.unwrap();
    let next = s.wait_announced_leader(before, None).await;
    s.pump_until(
        &format!("the second proxy to get term {}", next.term),
        STEP,
        async |_| (second.fence("default").await == next.token).then_some(()),
    )
    .await;
    s.run_for(Duration::from_millis(300)).await;
    assert_no_panic(&s);
    drop(second);
    let report = s.finish("announce list change");
    assert!(report.ops() > 0, "the workers wrote");
}
