//! Membership changes that cannot brick the cluster, on real `palisade node` processes
//! while workers write through the proxy, every history checked: unreachable new members
//! (closed ports) never cost the leader its token, and a real one is promoted once caught
//! up; a removal below three voters needs force; and a survivor of a cluster that lost
//! its quorum for good (`kill -9`) comes back alone with `--force-new-cluster`, under a
//! token higher than every one before, while the old token is refused.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use palisade_client::{LeaderView, MemberRole, NodeApi, Role};
use palisade_cluster::{free_port, wait};
use palisade_protocol::FaultSpec;
use palisade_tests::scenario::Scenario;

use crate::membership::{
    STEP, Shown, add_and_join, api, settle_and_finish, start_three, view_of,
    wait_members_everywhere,
};

/// How often the watcher below asks every node for its leader view.
const WATCH_EVERY: Duration = Duration::from_millis(25);

/// Asks every node for its leader view every [`WATCH_EVERY`] until `stop`, and answers
/// every view that came back.
fn watch_views(
    nodes: Vec<NodeApi>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Vec<LeaderView>> {
    tokio::spawn(async move {
        let mut seen = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            for node in &nodes {
                if let Ok(view) = node.leader().await {
                    seen.push(view);
                }
            }
            tokio::time::sleep(WATCH_EVERY).await;
        }
        seen
    })
}

/// Runs `palisade` with `args`; answers its exit code, stdout and stderr.
async fn palisade(args: &[&str]) -> (Option<i32>, String, String) {
    let out = tokio::process::Command::new(crate::PALISADE)
        .args(args)
        .output()
        .await
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `palisade member remove --force --json` of `id` through the node at `url`. A leader
/// elected a moment ago may not have heard from every follower yet (a follower's own
/// connection to it can come up after the election), and then it rightly refuses a
/// removal that would need them; that refusal, and only that one, is waited out.
async fn remove_forced(url: &str, id: &str) -> (Option<i32>, String, String) {
    wait::poll(STEP, || async move {
        let (code, out, stderr) = palisade(&[
            "member", "remove", "--node", url, "--id", id, "--force", "--json",
        ])
        .await;
        (code == Some(0) || !stderr.contains("heard from only")).then_some((code, out, stderr))
    })
    .await
    .expect("the leader still had not heard from every follower")
}

/// Goal: adding three members at unreachable addresses (closed ports) leaves the cluster
/// with its leader and token throughout (they join as learners: the voters never change),
/// and a real new node started with `--join` afterwards catches up and is promoted to
/// voter while the unreachable ones stay learners. Method: once every node shows the
/// leader's term, watch every node's leader view every 25 ms; add 4, 5, 6 at closed ports through the leader; let the workers write for
/// a few seconds; check every view: the leader always answered its first term and token,
/// no other node ever showed a token; add 7 and start it with `--join`; wait until every
/// node lists it a voter; `palisade member list` shows the roles; check the history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_new_members_keep_the_token_and_a_joined_one_is_promoted() {
    let (mut s, leader, _, term) = start_three().await;
    let token = view_of(&s, leader).await.token;
    assert_eq!(token, Some(term));
    // A follower that has not heard from the leader yet still shows term 0; the watch
    // starts once every node has, so that any other term it sees is a change.
    s.pump_until("every node to show the leader's term", STEP, async |s| {
        for node in &s.cluster.nodes {
            (node.leadership().await?.term == term).then_some(())?;
        }
        Some(())
    })
    .await;
    let stop = Arc::new(AtomicBool::new(false));
    let nodes = s.cluster.nodes.iter().map(|n| n.api().clone()).collect();
    let watcher = watch_views(nodes, Arc::clone(&stop));
    for id in 4..=6 {
        let peer = format!("127.0.0.1:{}", free_port().unwrap());
        let list = api(&s, leader).add_member(id, &peer).await.unwrap();
        let added = list.members.iter().find(|m| m.id == id).unwrap();
        assert_eq!(
            (added.voter, added.role),
            (false, Some(MemberRole::Learner))
        );
        s.say(&format!(
            "node {id} added at the closed port of {peer}: a learner"
        ));
    }
    s.run_for(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    let views = watcher.await.unwrap();
    let of_leader: Vec<&LeaderView> = views.iter().filter(|v| v.node_id == leader).collect();
    assert!(
        of_leader.len() > 20,
        "the leader answered {} views",
        of_leader.len()
    );
    for view in &of_leader {
        assert_eq!(
            (view.role, view.term, view.token),
            (Role::Leader, term, token),
            "the leader's view changed: {view:?}"
        );
    }
    for view in views.iter().filter(|v| v.node_id != leader) {
        assert_eq!((view.token, view.term), (None, term), "{view:?}");
    }
    s.say("the leader kept its term and token throughout");

    add_and_join(&mut s, leader, 7, &[]).await;
    for id in 4..=6 {
        wait_members_everywhere(&mut s, id, Shown::Member(MemberRole::Learner)).await;
    }
    let url = s.cluster.node(leader).unwrap().api_url("");
    let (code, out, err) = palisade(&["member", "list", "--node", &url]).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("7\t") && l.ends_with("\tvoter")),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("4\t") && l.ends_with("\tlearner")),
        "{out}"
    );
    settle_and_finish(s, "unreachable learners").await;
}

/// Goal: removing a voter of three is refused (409 `voters-below-three`, naming force)
/// through the API and `palisade member remove`, and done with `--force`; the leader keeps
/// its token. Method: remove a follower through the API and the command line without
/// force; then with `--force`; kill its process; wait until every node lists it removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_below_three_voters_needs_force() {
    let (mut s, leader, follower, term) = start_three().await;
    let err = api(&s, follower).remove_member(follower).await.unwrap_err();
    assert_eq!(err.status().map(|s| s.as_u16()), Some(409), "{err}");
    assert_eq!(err.problem().unwrap().kind(), "voters-below-three");
    assert!(err.to_string().contains("force"), "{err}");
    let url = s.cluster.node(leader).unwrap().api_url("");
    let id = follower.to_string();
    let (code, _, stderr) = palisade(&["member", "remove", "--node", &url, "--id", &id]).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("fewer than 3") && stderr.contains("--force"),
        "{stderr}"
    );
    s.say("removal below three voters refused without force");

    let (code, out, stderr) = remove_forced(&url, &id).await;
    assert_eq!(code, Some(0), "{stderr}");
    let list: palisade_client::MemberList = serde_json::from_str(&out).unwrap();
    assert!(list.removed.contains(&follower), "{list:?}");
    assert_eq!(list.members.len(), 2);
    let i = s
        .cluster
        .nodes
        .iter()
        .position(|n| n.id() == follower)
        .unwrap();
    s.cluster.nodes.remove(i).kill9();
    wait_members_everywhere(&mut s, follower, Shown::Removed).await;
    s.say("removed with --force");
    let now = s.wait_announced_leader(0, None).await;
    assert_eq!(
        (now.node_id, now.term),
        (leader, term),
        "the leader kept its term"
    );
    settle_and_finish(s, "remove below three").await;
}

/// Goal: a cluster that lost two of its three nodes for good comes back through its
/// survivor started once with `--force-new-cluster`: it leads alone under a token higher
/// than every token and term before, a write with that token through the proxy succeeds
/// and one with the old token is refused; restarted without the flag it stays the
/// cluster. Method: `kill -9` the leader and the other follower; wait until the survivor
/// knows no leader and check it gets no token; restart it with the flag; wait for its
/// announced token; probe the proxy with both tokens; restart it without the flag and
/// wait for a leader again; check the history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_new_cluster_brings_back_a_lone_survivor_with_a_higher_token() {
    let (mut s, leader, survivor, old) = start_three().await;
    s.run_for(Duration::from_millis(300)).await;
    for id in s.cluster.ids() {
        if id != survivor {
            let i = s.cluster.nodes.iter().position(|n| n.id() == id).unwrap();
            s.cluster.nodes.remove(i).kill9();
        }
    }
    s.say(&format!(
        "leader {leader} and the other follower killed for good"
    ));
    let lost = s
        .pump_until("the survivor to know no leader", STEP, async |s| {
            let view = s.cluster.node(survivor)?.leadership().await?;
            view.leader_id.is_none().then_some(view)
        })
        .await;
    // The survivor campaigns and cannot win: show that no token appears for a while.
    s.run_for(Duration::from_secs(1)).await;
    let view = view_of(&s, survivor).await;
    assert_eq!((view.token, lost.token), (None, None), "{view:?}");
    let highest = view.term.max(old);
    s.say(&format!("the survivor has no leader (term {})", view.term));

    let node = s.cluster.node_mut(survivor).unwrap();
    node.spec.extra.push("--force-new-cluster".to_owned());
    node.restart().unwrap();
    let log = node.guard.log_text();
    assert!(log.contains("FORCING A NEW CLUSTER"), "{log}");
    let alone = s.wait_announced_leader(highest, None).await;
    let token = alone.token.unwrap();
    assert_eq!(alone.node_id, survivor);
    assert!(
        token > highest,
        "token {token} above every term before ({highest})"
    );
    s.say(&format!("the survivor leads alone with token {token}"));
    let members = api(&s, survivor).members().await.unwrap();
    assert_eq!(members.members.len(), 1, "{members:?}");
    assert_eq!(members.removed.len(), 2, "{members:?}");

    let (_, fresh) = s.probe(0, token).await;
    let fresh = fresh.unwrap();
    assert!(
        fresh.status.is_success(),
        "{}: {}",
        fresh.status,
        fresh.text()
    );
    let (_, stale) = s.probe(0, old).await;
    let stale = stale.unwrap();
    assert_eq!(stale.status.as_u16(), 409, "{}", stale.text());
    s.say("the new token writes through the proxy; the old one is refused");

    let node = s.cluster.node_mut(survivor).unwrap();
    node.spec.extra.retain(|a| a != "--force-new-cluster");
    node.restart().unwrap();
    let again = s.wait_announced_leader(token, None).await;
    assert_eq!(again.node_id, survivor);
    let members = api(&s, survivor).clone();
    wait::poll(STEP, || {
        let members = members.clone();
        async move {
            let m = members.members().await.ok()?;
            (m.members.len() == 1).then_some(())
        }
    })
    .await
    .expect("the survivor is still the only member");
    settle_and_finish(s, "force a new cluster").await;
}

/// Goal: `palisade member remove` of the leader works, as etcd's does: leadership moves to
/// another voter first, then the old leader is removed, and the token only grows.
/// Method: three nodes with workers; remove the leader through its own API (`--force`:
/// two voters remain); kill the removed process; wait until every remaining node shows it
/// removed and a leader of a higher term is announced; check the history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_the_leader_moves_leadership_first() {
    let (s, leader, _follower, term) = start_three().await;
    let url = s.cluster.node(leader).unwrap().api_url("");
    let id = leader.to_string();
    let removed = remove_forced(&url, &id).await;
    s.say("the leader was asked to remove itself through its own API");
    finish_leader_removal(s, leader, term, removed, "remove the leader").await;
}

/// The end of a test that removed `leader` (whose term was `term`): `removed`, the
/// output of `palisade member remove --json`, must show it removed; the removed process is
/// killed; every node must show it removed, and a leader of a higher term be announced;
/// then the history is checked.
async fn finish_leader_removal(
    mut s: Scenario,
    leader: u64,
    term: u64,
    (code, out, stderr): (Option<i32>, String, String),
    what: &str,
) {
    assert_eq!(code, Some(0), "removing the leader: {stderr}");
    let list: palisade_client::MemberList = serde_json::from_str(&out).unwrap();
    assert!(list.removed.contains(&leader), "{list:?}");
    s.say("the leader was removed");
    let i = s
        .cluster
        .nodes
        .iter()
        .position(|n| n.id() == leader)
        .unwrap();
    s.cluster.nodes.remove(i).kill9();
    wait_members_everywhere(&mut s, leader, Shown::Removed).await;
    let now = s.wait_announced_leader(term, Some(leader)).await;
    assert_ne!(now.node_id, leader);
    assert!(now.term > term, "the token grew: {} after {term}", now.term);
    settle_and_finish(s, what).await;
}

/// Goal: removing the leader completes even when the node that takes over cannot remove
/// it at first. A leader refuses a removal that would need a voter it has not heard from
/// lately, and it drops such a proposal forwarded by a follower without an answer (raft
/// has none to give); the old leader, now a follower, proposes the removal again until it
/// is applied, instead of waiting out the whole timeout (504). Method: three nodes with
/// workers; the two followers cut off from each other (test faults), so the one that takes
/// over hears only from the old leader; remove the leader through its own API; once the
/// new leader's log shows the forwarded removal refused, heal the cut; the removal answers
/// success; kill the removed process; every node shows it removed, a leader of a higher
/// term is announced, and the history checks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_the_leader_outlasts_a_new_leader_that_cannot_remove_it_yet() {
    let (s, leader, _follower, term) = start_three().await;
    let followers: Vec<u64> = s
        .cluster
        .ids()
        .into_iter()
        .filter(|&i| i != leader)
        .collect();
    for (one, other) in [(followers[0], followers[1]), (followers[1], followers[0])] {
        let cut = FaultSpec {
            drop: [other].into(),
            ..FaultSpec::default()
        };
        s.cluster.node(one).unwrap().set_faults(&cut).await.unwrap();
    }
    s.say("the two followers are cut off from each other");
    let url = s.cluster.node(leader).unwrap().api_url("");
    let id = leader.to_string();
    let remove = tokio::spawn(async move {
        palisade(&[
            "member", "remove", "--node", &url, "--id", &id, "--force", "--json",
        ])
        .await
    });
    let refused = wait::poll(STEP, || {
        let logs: Vec<String> = followers
            .iter()
            .map(|&f| s.cluster.node(f).unwrap().guard.log_text())
            .collect();
        std::future::ready(
            logs.iter()
                .any(|log| log.contains("forwarded membership change refused"))
                .then_some(()),
        )
    })
    .await;
    assert!(
        refused.is_some(),
        "the new leader never refused the forwarded removal"
    );
    s.cluster.heal().await.unwrap();
    s.say("the new leader refused the forwarded removal; the cut is healed");
    let removed = remove.await.unwrap();
    finish_leader_removal(s, leader, term, removed, "remove the leader past a refusal").await;
}
