//! Set-ups several tests share: a proxy in front of a recording upstream (or with a
//! config file), a proxy serving TLS with a certificate of a CA issued here, a write held
//! in flight at that upstream, and a typed client of the proxy's admin API; and, on a
//! cluster, its first announced leader, its fence at the proxy, a settled leader and a
//! resignation.

use std::path::Path;
use std::time::Duration;

use palisade_client::ProxyAdmin;
use palisade_cluster::{Cluster, LeaderView, Pki, wait};
use palisade_protocol::DEFAULT_SCOPE;
use tokio::task::JoinHandle;

use crate::client::{Answer, put};
use crate::process::{ProxyProcess, start_proxy};
use crate::upstream::RecordingUpstream;

/// Longest a held write may take to reach the upstream.
const ARRIVAL_TIMEOUT: Duration = Duration::from_secs(10);

/// A recording upstream, and a proxy in front of it started with `config_toml` (empty:
/// the defaults) written to `dir/proxy.toml`.
pub async fn proxy_with_upstream(
    dir: &Path,
    config_toml: &str,
) -> (RecordingUpstream, ProxyProcess) {
    let config = write_config(dir, config_toml);
    proxy_with_upstream_args(dir, &["--config", &config]).await
}

/// A recording upstream, and a proxy in front of it started in `dir` with `args` besides
/// `--upstream`.
pub async fn proxy_with_upstream_args(
    dir: &Path,
    args: &[&str],
) -> (RecordingUpstream, ProxyProcess) {
    let upstream = RecordingUpstream::start().await;
    let url = upstream.url();
    let mut all = vec!["--upstream", &url];
    all.extend_from_slice(args);
    let proxy = start_proxy(dir, &all);
    (upstream, proxy)
}

/// Writes `text` to `dir/proxy.toml`; the file's path, for `--config`.
pub fn write_config(dir: &Path, text: &str) -> String {
    let path = dir.join("proxy.toml");
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// A CA issued in `dir/pki` with a `proxy` certificate (for 127.0.0.1 and localhost), and
/// a proxy started in `dir` serving TLS with it (`--tls-cert`, `--tls-key`) and `extra`
/// flags besides.
pub fn tls_proxy(dir: &Path, extra: &[&str]) -> (ProxyProcess, Pki) {
    let pki = Pki::issue(&dir.join("pki"), &["proxy"]).unwrap();
    let (cert, key) = (pki.cert("proxy"), pki.key("proxy"));
    let mut args = vec![
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    (start_proxy(dir, &args), pki)
}

/// Holds writes to `path` at the upstream, sends a PUT with `token` to it through the
/// proxy, and returns once it has arrived upstream (and so is in flight at the proxy).
/// Release it with `upstream.release(path)`; the handle yields the client's answer.
pub async fn hold_in_flight(
    upstream: &RecordingUpstream,
    proxy: &ProxyProcess,
    path: &str,
    token: u64,
) -> JoinHandle<Answer> {
    upstream.hold(path);
    let before = upstream.arrived().len();
    let url = proxy.url(path);
    let handle = tokio::spawn(async move { put(&url, token, "held").await });
    wait::poll(ARRIVAL_TIMEOUT, || async {
        (upstream.arrived().len() > before).then_some(())
    })
    .await
    .unwrap_or_else(|| {
        panic!("timed out waiting for the token-{token} write to {path} to arrive upstream")
    });
    handle
}

/// A typed client of `proxy`'s admin API with the client's default timeout (long enough
/// for an advance that waits at the barrier), or panics with the cause.
pub fn admin(proxy: &ProxyProcess) -> ProxyAdmin {
    ProxyAdmin::new(&proxy.admin_url("")).unwrap_or_else(|e| panic!("{e}"))
}

/// Waits, within `timeout`, until the cluster's proxy holds a fence of the default scope
/// that `accept` takes; that fence. A timeout panics naming `what`.
pub async fn fence_at_proxy(
    cluster: &Cluster,
    timeout: Duration,
    what: &str,
    accept: impl Fn(u64) -> bool,
) -> u64 {
    wait::poll(timeout, || async {
        cluster
            .proxy_fence(DEFAULT_SCOPE)
            .await
            .filter(|&f| accept(f))
    })
    .await
    .unwrap_or_else(|| panic!("timed out waiting for {what} at the proxy"))
}

/// Waits, within `timeout` each, for the cluster's first established leader and for its
/// token at the proxy; the leader's view.
pub async fn first_announced_leader(cluster: &Cluster, timeout: Duration) -> LeaderView {
    let first = cluster
        .wait_for_leader(0, None, timeout)
        .await
        .expect("a first leader");
    let token = first.token.expect("an established leader holds a token");
    fence_at_proxy(cluster, timeout, "the first token", |f| f == token).await;
    first
}

/// Asks node `id` of `cluster` to resign its leadership, or panics with the cause.
pub async fn resign(cluster: &Cluster, id: u64) {
    cluster
        .node(id)
        .unwrap_or_else(|| panic!("no node {id}"))
        .api()
        .resign()
        .await
        .unwrap_or_else(|e| panic!("node {id} resigns: {e}"));
}

/// Waits, within `timeout`, until the nodes `ids` of `cluster` agree on one established
/// leader (asking only them); its view. A timeout panics naming `what`.
pub async fn settled_leader(
    cluster: &Cluster,
    ids: &[u64],
    timeout: Duration,
    what: &str,
) -> LeaderView {
    wait::poll(timeout, || cluster.settled_leader(ids))
        .await
        .unwrap_or_else(|| panic!("timed out waiting for {what}"))
}
