//! The failpoints the fault scenarios rely on, in the very `palisade` binary the tests
//! run: Cargo builds it for these tests with the `failpoints` features (palisade-cli's
//! dev-dependencies turn them on), and these tests fail, saying so, if it has none.
//! Binaries made with a plain `cargo build` or `cargo build --release` have none:
//! docs/testing.md says how to check.

use std::time::Duration;

use palisade_cluster::{Launch, ProxyProcess, spawn_launch, wait};
use palisade_protocol::headers;
use palisade_protocol::process::{FAILPOINT_STOP_ENV, FailpointStop};
use palisade_tests::client::{put, try_send_within};
use palisade_tests::process::wait_for_failpoint;
use palisade_tests::scenario::CLIENT_FAILPOINT;
use palisade_tests::upstream::RecordingUpstream;

/// Bound on a child reaching a failpoint or finishing.
const STEP: Duration = Duration::from_secs(20);

/// What a failure here most likely means.
fn no_failpoints_help() -> String {
    format!(
        "the palisade binary at {} seems to have no failpoints compiled in, although \
         palisade-cli's dev-dependencies turn the `failpoints` features on for its tests",
        crate::PALISADE
    )
}

/// Goal: the failpoint probe the scenarios start with finds the failpoints in the binary
/// Cargo built for these tests. Method: `require_failpoints` on it.
#[test]
fn the_tested_binary_has_failpoints_compiled_in() {
    crate::use_tested_binary();
    palisade_cluster::require_failpoints().unwrap_or_else(|e| panic!("{e}"));
}

/// Goal: a proxy failpoint fires in the binary the tests run, and only when configured.
/// Method: a proxy started with `FAILPOINTS=proxy-before-forward=panic` answers a write
/// with a 5xx and its upstream never sees it; the same proxy restarted without
/// `FAILPOINTS` forwards it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_failpoint_fires_in_the_tested_binary_only_when_configured() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let upstream = RecordingUpstream::start().await;
    let url = upstream.url();
    let mut proxy = ProxyProcess::start_with(
        dir.path(),
        "127.0.0.1:0",
        "127.0.0.1:0",
        &["--upstream", &url],
        &[("FAILPOINTS", "proxy-before-forward=panic")],
    )
    .unwrap();
    let failed = put(&proxy.url("/fp"), 1, "x").await;
    assert!(
        failed.status.is_server_error(),
        "{} (answered {})",
        no_failpoints_help(),
        failed.status
    );
    assert!(upstream.arrived().is_empty(), "nothing was forwarded");

    proxy.restart().unwrap();
    let ok = put(&proxy.url("/fp"), 1, "x").await;
    assert!(ok.status.is_success(), "{}", ok.status);
    assert_eq!(upstream.applied().len(), 1);
}

/// Goal: `PALISADE_FAILPOINT_STOP` freezes a client between reading its token and
/// sending, tells the test so on stdout, and the write goes out only on `SIGCONT`.
/// Method: `palisade put` with the stop variable; wait for its line; see it stopped and
/// nothing upstream (for a while, to show that nothing happens); continue it; it exits 0
/// and the write is applied with its token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_stops_before_send_until_continued() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let upstream = RecordingUpstream::start().await;
    let proxy =
        ProxyProcess::start(&dir.path().join("proxy"), &["--upstream", &upstream.url()]).unwrap();
    let launch = Launch {
        args: [
            "put",
            "held/key",
            "--data",
            "late",
            "--token",
            "7",
            "--proxy",
            &proxy.url(""),
        ]
        .iter()
        .map(ToString::to_string)
        .collect(),
        env: vec![(FAILPOINT_STOP_ENV.to_owned(), CLIENT_FAILPOINT.to_owned())],
        prefix: Vec::new(),
    };
    // The failpoint's name appears in no other line the client prints.
    let (mut client, line, _) = spawn_launch(
        &launch,
        &dir.path().join("put.log"),
        CLIENT_FAILPOINT,
        "put",
    )
    .unwrap_or_else(|e| panic!("{}: {e}", no_failpoints_help()));
    let stop =
        FailpointStop::parse(&line).unwrap_or_else(|| panic!("not a failpoint line: {line}"));
    assert_eq!(stop.name, CLIENT_FAILPOINT);
    assert_eq!(
        i64::from(stop.pid),
        i64::from(client.pid().as_raw()),
        "{line}"
    );
    wait::poll(STEP, || async { client.is_stopped().then_some(()) })
        .await
        .expect("timed out waiting for the client to be stopped");
    // Show that nothing is sent while it is stopped.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        upstream.arrived().is_empty(),
        "a stopped client sent nothing"
    );

    client.resume().unwrap();
    let code = tokio::task::spawn_blocking(move || client.wait_exit(STEP))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(code, Some(0));
    let applied = upstream.applied();
    assert_eq!(applied.len(), 1);
    assert_eq!(applied[0].token.as_deref(), Some("7"));
}

/// Goal: a misspelt failpoint in `PALISADE_FAILPOINT_STOP` is a usage error (exit 2)
/// naming it, not a scenario that silently never stops. Method: run `palisade fence`
/// with a misspelt name; read the exit code and stderr.
#[test]
fn unknown_stop_failpoint_is_a_usage_error() {
    crate::use_tested_binary();
    let out = std::process::Command::new(crate::PALISADE)
        .args(["fence", "--admin", "http://127.0.0.1:9"])
        .env(FAILPOINT_STOP_ENV, "proxy-before-forwrd")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{} / {stderr}",
        no_failpoints_help()
    );
    assert!(stderr.contains("proxy-before-forwrd"), "{stderr}");
}

/// Goal: the admin API of a proxy stopped at a failpoint does not answer (the whole
/// process is frozen), which is what makes a `kill -9` there land exactly at that point.
/// Method: stop a proxy at `proxy-after-fence-commit`; its admin API times out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_stopped_at_a_failpoint_is_frozen_whole() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let upstream = RecordingUpstream::start().await;
    let url = upstream.url();
    let proxy = ProxyProcess::start_with(
        dir.path(),
        "127.0.0.1:0",
        "127.0.0.1:0",
        &["--upstream", &url],
        &[(FAILPOINT_STOP_ENV, "proxy-after-fence-commit")],
    )
    .unwrap();
    let write_url = proxy.url("/frozen");
    let write = tokio::spawn(async move {
        try_send_within(
            http::Method::PUT,
            &write_url,
            &[(headers::FENCING_TOKEN.as_str(), "3")],
            "x",
            STEP,
        )
        .await
    });
    let stop = wait_for_failpoint(proxy.lines(), "the proxy", STEP).await;
    assert_eq!(stop.name, "proxy-after-fence-commit");
    assert_eq!(i64::from(stop.pid), i64::from(proxy.guard.pid().as_raw()));
    wait::poll(STEP, || async { proxy.guard.is_stopped().then_some(()) })
        .await
        .expect("timed out waiting for the proxy to be stopped");
    let admin = try_send_within(
        http::Method::GET,
        &proxy.admin_url(palisade_protocol::admin::HEALTHZ_PATH),
        &[],
        "",
        Duration::from_millis(300),
    )
    .await;
    assert!(admin.is_err(), "a frozen proxy answered: {admin:?}");
    proxy.guard.resume().unwrap();
    let answer = write.await.unwrap().unwrap();
    assert!(answer.status.is_success(), "{}", answer.status);
}
