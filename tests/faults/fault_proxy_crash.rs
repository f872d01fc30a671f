//! `kill -9` of the proxy at each of its failpoints, then a restart on the same data
//! directory and ports: the fence it comes back with is never behind a token that
//! reached the storage, and the storage never applies a lower token after a higher one.
//!
//! The proxy runs with `PALISADE_FAILPOINT_STOP=<failpoint>`: on reaching it, it prints
//! a line and stops itself whole (`SIGSTOP`), so the `kill -9` lands exactly there.

use std::time::Duration;

use palisade_cluster::ProxyProcess;
use palisade_cluster::history::{self, History, Op, Outcome, Recorder};
use palisade_cluster::wait;
use palisade_protocol::DEFAULT_SCOPE;
use palisade_protocol::process::FAILPOINT_STOP_ENV;
use palisade_tests::fixtures::admin;
use palisade_tests::process::wait_for_failpoint;
use palisade_tests::scenario::{outcome_of, tagged_put};
use palisade_tests::upstream::RecordingUpstream;

/// The proxy's failpoints, in request order.
pub(crate) const FAILPOINTS: [&str; 5] = [
    "proxy-before-fence-commit",
    "proxy-after-fence-commit",
    "proxy-before-forward",
    "proxy-after-forward",
    "proxy-before-reply",
];
/// Kills per failpoint.
const ROUNDS: usize = 2;
/// Bound on one step (a write, a stop, a restart).
const STEP: Duration = Duration::from_secs(20);
/// The writer name of this test's writes.
const WRITER: &str = "crash";

async fn fence(proxy: &ProxyProcess) -> u64 {
    admin(proxy)
        .timeout(STEP)
        .fence(DEFAULT_SCOPE)
        .await
        .unwrap()
        .token
}

/// Goal: after a `kill -9` at any proxy failpoint and a restart, the fence is at least
/// every token that reached the upstream, and what the upstream applied keeps token
/// order. Method: for each failpoint, twice: restart the proxy stopping there, send a
/// write with a token above the fence (so every failpoint is on its path), wait for the
/// stop line, `kill -9`, restart on the same data and ports, compare the fence with the
/// tokens that arrived upstream, and try the previous token (rejected whenever the
/// higher one reached the upstream). All writes go through the history checker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_killed_at_each_failpoint_restarts_with_a_fence_at_least_what_reached_upstream() {
    crate::use_tested_binary();
    palisade_cluster::require_failpoints().unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap();
    let upstream = RecordingUpstream::start().await;
    let mut proxy = ProxyProcess::start(dir.path(), &["--upstream", &upstream.url()]).unwrap();
    let mut recorder = Recorder::default();
    let mut seq = 0;
    let mut token = 1;
    let mut kills = 0;

    seq += 1;
    let first = tagged_put(
        &proxy.url(""),
        &format!("/crash/{seq}"),
        token,
        WRITER,
        seq,
        STEP,
    )
    .await;
    recorder.record(Op {
        scope: DEFAULT_SCOPE.to_owned(),
        token,
        writer: WRITER.to_owned(),
        seq,
        outcome: outcome_of(&first),
    });
    assert!(first.unwrap().status.is_success());

    for round in 0..ROUNDS {
        for failpoint in FAILPOINTS {
            proxy
                .restart_with_env(&[(FAILPOINT_STOP_ENV, failpoint)])
                .unwrap();
            token += 1;
            seq += 1;
            recorder.invoke(DEFAULT_SCOPE, token, WRITER, seq);
            let url = proxy.url("");
            let (t, q) = (token, seq);
            let doomed = tokio::spawn(async move {
                tagged_put(&url, &format!("/crash/{q}"), t, WRITER, q, STEP).await
            });
            let stop = wait_for_failpoint(proxy.lines(), failpoint, STEP).await;
            assert_eq!(stop.name, failpoint);
            let frozen = &proxy;
            wait::poll(STEP, || async { frozen.guard.is_stopped().then_some(()) })
                .await
                .expect("timed out waiting for the proxy to be stopped");
            proxy.guard.kill9();
            kills += 1;
            let answer = doomed.await.unwrap();
            recorder.complete(WRITER, seq, outcome_of(&answer));
            assert!(
                answer.is_err(),
                "the write answered although the proxy was killed at {failpoint}: {answer:?}"
            );

            proxy.restart().unwrap();
            let fence = fence(&proxy).await;
            let reached = upstream
                .arrived()
                .iter()
                .filter_map(|a| a.token.as_deref()?.parse::<u64>().ok())
                .max()
                .unwrap_or(0);
            eprintln!(
                "round {round}, {failpoint}: killed with token {token} in flight; restarted with fence {fence}; highest token upstream {reached}"
            );
            assert!(
                fence >= reached,
                "after kill -9 at {failpoint} the fence {fence} is behind token {reached}, which reached the upstream"
            );

            // The previous token: refused whenever the fence moved past it.
            seq += 1;
            let stale = tagged_put(
                &proxy.url(""),
                &format!("/crash/{seq}"),
                token - 1,
                WRITER,
                seq,
                STEP,
            )
            .await;
            let o = outcome_of(&stale);
            recorder.record(Op {
                scope: DEFAULT_SCOPE.to_owned(),
                token: token - 1,
                writer: WRITER.to_owned(),
                seq,
                outcome: o,
            });
            if reached >= token || fence >= token {
                assert_eq!(
                    o,
                    Outcome::Rejected,
                    "token {} after {failpoint}",
                    token - 1
                );
            } else {
                assert_eq!(o, Outcome::Ok, "token {} after {failpoint}", token - 1);
            }
        }
    }

    let report = history::check(&History {
        ops: recorder.ops(),
        applied: upstream.apply_log(),
    });
    eprintln!(
        "proxy crash: {kills} kills at {} failpoints; history: {}",
        FAILPOINTS.len(),
        report.summary()
    );
    assert!(report.holds(), "{report}");
}
