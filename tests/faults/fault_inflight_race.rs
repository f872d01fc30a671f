//! The in-flight race: the old leader's writes are still on their way to a slow storage
//! when the new leader's first write arrives at the proxy. The proxy must not let the
//! higher token overtake them: the storage applies them in token order. Real processes
//! (three nodes announcing to a proxy) in front of the recording upstream, which delays
//! the old leader's writes.

use std::time::{Duration, Instant};

use http::StatusCode;
use palisade_cluster::wait;
use palisade_protocol::DEFAULT_SCOPE;
use palisade_tests::scenario::{
    ELECTION_TIMEOUT, STEP_TIMEOUT, Scenario, ScenarioSpec, outcome_of, tagged_put,
};

/// How long the storage takes to apply each of the old leader's writes: long enough for
/// a leadership transfer and the new leader's write to happen meanwhile, short enough to
/// stay under the proxy's barrier deadline (5 s).
const SLOW_APPLY: Duration = Duration::from_millis(2500);
/// The old leader's writes in flight.
const OLD_WRITES: u64 = 3;

/// Goal: a lower-token write still in flight to the upstream when a higher-token write
/// arrives is applied first; the higher one reaches the upstream only after it; a
/// lower-token write arriving after the higher one was admitted is rejected. Method: the
/// upstream delays the old leader's three writes; while they are in flight, leadership
/// moves (`/v1/resign`) and the new leader writes with its token at once; then the old
/// token is tried again. Check the apply order on the upstream's clock and the history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lower_token_write_in_flight_is_applied_before_the_higher_one() {
    crate::use_tested_binary();
    let mut s = Scenario::start(&ScenarioSpec {
        workers: false,
        ..ScenarioSpec::default()
    })
    .await;
    let leader = s.wait_announced_leader(0, None).await;
    let old_token = leader.token.unwrap();
    let proxy = s.cluster.proxy.url("");
    s.upstream.delay("/race/old", SLOW_APPLY);

    let mut old_writes = Vec::new();
    for seq in 1..=OLD_WRITES {
        s.recorder.invoke(DEFAULT_SCOPE, old_token, "old", seq);
        let proxy = proxy.clone();
        old_writes.push(tokio::spawn(async move {
            tagged_put(
                &proxy,
                &format!("/race/old-{seq}"),
                old_token,
                "old",
                seq,
                STEP_TIMEOUT,
            )
            .await
        }));
    }
    let upstream = &s.upstream;
    wait::poll(STEP_TIMEOUT, || async {
        (upstream
            .arrived()
            .iter()
            .filter(|a| a.writer.as_deref() == Some("old"))
            .count()
            == usize::try_from(OLD_WRITES).unwrap())
        .then_some(())
    })
    .await
    .expect("timed out waiting for the old writes to reach the upstream");

    // Leadership moves while they are in flight; the new leader writes at once, without
    // waiting for its announcement (which waits at the proxy's barrier too).
    let resigned = s
        .cluster
        .node(leader.node_id)
        .unwrap()
        .api()
        .resign()
        .await
        .unwrap();
    assert_eq!(resigned.from, leader.node_id);
    let new_node = s.cluster.node(resigned.to).unwrap();
    let new_token = wait::poll(ELECTION_TIMEOUT, || async {
        new_node.leadership().await.and_then(|l| l.token)
    })
    .await
    .expect("timed out waiting for the new leader's token");
    assert!(new_token > old_token);
    let still_in_flight = s
        .upstream
        .applied()
        .iter()
        .all(|a| a.writer.as_deref() != Some("old"));
    assert!(
        still_in_flight,
        "the old writes were applied before the new leader could write: the race was not set up (a very slow machine?)"
    );
    s.recorder.invoke(DEFAULT_SCOPE, new_token, "new", 1);
    let sent_at = Instant::now();
    let new_write = {
        let proxy = proxy.clone();
        tokio::spawn(async move {
            tagged_put(&proxy, "/race/new-1", new_token, "new", 1, STEP_TIMEOUT).await
        })
    };

    // Once the higher token is admitted (the fence is raised before the barrier), the old
    // token is refused outright.
    let cluster = &s.cluster;
    wait::poll(STEP_TIMEOUT, || async {
        cluster
            .proxy_fence(DEFAULT_SCOPE)
            .await
            .filter(|&f| f >= new_token)
    })
    .await
    .expect("timed out waiting for the fence to reach the new token");
    let stale = tagged_put(
        &proxy,
        "/race/old-late",
        old_token,
        "old",
        OLD_WRITES + 1,
        STEP_TIMEOUT,
    )
    .await;
    s.recorder.record(palisade_cluster::history::Op {
        scope: DEFAULT_SCOPE.to_owned(),
        token: old_token,
        writer: "old".to_owned(),
        seq: OLD_WRITES + 1,
        outcome: outcome_of(&stale),
    });
    assert_eq!(stale.unwrap().status, StatusCode::CONFLICT);

    for (i, w) in old_writes.into_iter().enumerate() {
        let answer = w.await.unwrap();
        s.recorder
            .complete("old", i as u64 + 1, outcome_of(&answer));
        assert!(answer.unwrap().status.is_success());
    }
    let answer = new_write.await.unwrap();
    let waited = sent_at.elapsed();
    s.recorder.complete("new", 1, outcome_of(&answer));
    assert!(answer.unwrap().status.is_success());

    let applied = s.upstream.applied();
    let last_old = applied
        .iter()
        .filter(|a| a.writer.as_deref() == Some("old"))
        .map(|a| a.applied_at)
        .max()
        .unwrap();
    let new = applied
        .iter()
        .find(|a| a.writer.as_deref() == Some("new"))
        .unwrap();
    assert!(
        new.arrived_at > last_old,
        "the token-{new_token} write reached the upstream (clock {}) before the last token-{old_token} write was applied (clock {last_old})",
        new.arrived_at
    );
    s.say(&format!(
        "the token-{new_token} write waited {waited:?} at the proxy for {OLD_WRITES} token-{old_token} writes in flight"
    ));
    s.finish("in-flight race");
}
