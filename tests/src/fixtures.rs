//! Set-ups several proxy tests share: a proxy in front of a recording upstream, a write
//! held in flight at that upstream, and a typed client of the proxy's admin API.

use std::path::Path;
use std::time::Duration;

use palisade_client::ProxyAdmin;
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
    let upstream = RecordingUpstream::start().await;
    let config = dir.join("proxy.toml");
    std::fs::write(&config, config_toml).unwrap();
    let proxy = start_proxy(
        dir,
        &[
            "--upstream",
            &upstream.url(),
            "--config",
            config.to_str().unwrap(),
        ],
    );
    (upstream, proxy)
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
    crate::wait::until(
        &format!("the token-{token} write to {path} to arrive upstream"),
        ARRIVAL_TIMEOUT,
        || async { (upstream.arrived().len() > before).then_some(()) },
    )
    .await;
    handle
}

/// A typed client of `proxy`'s admin API with the client's default timeout (long enough
/// for an advance that waits at the barrier), or panics with the cause.
pub fn admin(proxy: &ProxyProcess) -> ProxyAdmin {
    ProxyAdmin::new(&proxy.admin_url("")).unwrap_or_else(|e| panic!("{e}"))
}
