//! A `palisade node` child and its leadership, read through `palisade_client`'s node API
//! client.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use palisade_client::{ClientTls, NodeApi};
use palisade_protocol::process::NodeReady;
use palisade_protocol::{FaultSpec, LeaderView};

use crate::process::{ChildGuard, Launch, spawn_until};
use crate::{ClusterError, Result};

/// Timeout of one leadership query: short, so a paused node reads as "no answer".
pub const QUERY_TIMEOUT_MS: u64 = 500;

/// How to start one node.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    /// Raft id.
    pub id: u64,
    /// Every voter's id and raft address, this node's included.
    pub peers: BTreeMap<u64, SocketAddr>,
    /// Its HTTP API address.
    pub api: SocketAddr,
    /// Its data directory.
    pub data_dir: PathBuf,
    /// Proxy admin base URLs to announce the token to.
    pub announce: Vec<String>,
    /// Further flags (`--tick-ms 20`, ...).
    pub extra: Vec<String>,
    /// Extra environment (`PALISADE_TEST_FAULTS=1`).
    pub env: Vec<(String, String)>,
    /// A command that runs the binary (`ip netns exec NS`); empty: run it directly.
    pub prefix: Vec<String>,
}

impl NodeSpec {
    fn args(&self) -> Vec<String> {
        let peers = self
            .peers
            .iter()
            .map(|(id, addr)| format!("{id}={addr}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut args = vec![
            "node".to_owned(),
            "--id".to_owned(),
            self.id.to_string(),
            "--peers".to_owned(),
            peers,
            "--api".to_owned(),
            self.api.to_string(),
            "--data-dir".to_owned(),
            self.data_dir.display().to_string(),
        ];
        for url in &self.announce {
            args.push("--announce".to_owned());
            args.push(url.clone());
        }
        args.extend(self.extra.iter().cloned());
        args
    }
}

/// A running `palisade node`.
pub struct NodeProcess {
    /// The process.
    pub guard: ChildGuard,
    /// How it was started (to restart it the same way).
    pub spec: NodeSpec,
    /// A client of its API, with reads limited to [`QUERY_TIMEOUT_MS`].
    api: NodeApi,
    /// Directory of its logs.
    log_dir: PathBuf,
    starts: usize,
    /// `http` or, for a node serving its API with TLS, `https`.
    scheme: &'static str,
}

impl NodeProcess {
    /// Starts a node and waits until its API has answered.
    pub fn start(spec: NodeSpec, log_dir: &Path) -> Result<Self> {
        Self::start_tls(spec, log_dir, None)
    }

    /// Like [`start`](Self::start); with `tls`, the node serves its API over https
    /// (started with `--cert/--key/--ca`) and is asked with these client settings.
    pub fn start_tls(spec: NodeSpec, log_dir: &Path, tls: Option<&ClientTls>) -> Result<Self> {
        let scheme = if tls.is_some() { "https" } else { "http" };
        let url = format!("{scheme}://{}", spec.api);
        let default_tls = ClientTls::default();
        let api = NodeApi::with_tls(&url, tls.unwrap_or(&default_tls))
            .map_err(|source| ClusterError::Client {
                what: format!("a client of node {} at {url}", spec.id),
                source,
            })?
            .timeout(Duration::from_millis(QUERY_TIMEOUT_MS));
        let guard = Self::spawn(&spec, log_dir, 0)?;
        Ok(Self {
            guard,
            spec,
            api,
            log_dir: log_dir.to_owned(),
            starts: 1,
            scheme,
        })
    }

    fn spawn(spec: &NodeSpec, log_dir: &Path, n: usize) -> Result<ChildGuard> {
        let log = Self::log_path(spec.id, log_dir, n);
        let name = format!("node {}", spec.id);
        let launch = Launch {
            args: spec.args(),
            env: spec.env.clone(),
            prefix: spec.prefix.clone(),
        };
        let id = spec.id;
        let ready = move |line: &str| NodeReady::parse(line).is_some_and(|r| r.id == id);
        let (guard, _, _) = spawn_until(&launch, &log, ready, &name)?;
        Ok(guard)
    }

    fn log_path(id: u64, log_dir: &Path, n: usize) -> PathBuf {
        log_dir.join(format!("node-{id}-{n}.log"))
    }

    /// `kill -9`s the node (if running) and starts it again with the same spec and data.
    pub fn restart(&mut self) -> Result<()> {
        self.guard.kill9();
        self.guard = Self::spawn(&self.spec, &self.log_dir, self.starts)?;
        self.starts += 1;
        Ok(())
    }

    /// `kill -9`s the node and reaps it; [`restart`](Self::restart) brings it back.
    pub fn kill9(&mut self) {
        self.guard.kill9();
    }

    /// Whether the process is running (not killed, not exited).
    pub fn is_running(&mut self) -> bool {
        self.guard.is_running()
    }

    /// Every stderr log this node has written, one per start, oldest first.
    pub fn logs(&self) -> Vec<String> {
        (0..self.starts)
            .map(|n| {
                std::fs::read_to_string(Self::log_path(self.spec.id, &self.log_dir, n))
                    .unwrap_or_default()
            })
            .collect()
    }

    /// Replaces the faults of this node's raft links (`POST /v1/test/faults`); an empty
    /// [`FaultSpec`] heals them. Needs `PALISADE_TEST_FAULTS=1`
    /// ([`palisade_protocol::process::TEST_FAULTS_ENV`]) in the node's environment.
    pub async fn set_faults(&self, faults: &FaultSpec) -> Result<()> {
        self.api
            .set_faults(faults)
            .await
            .map(drop)
            .map_err(|source| ClusterError::Client {
                what: format!("set the test faults of node {}", self.id()),
                source,
            })
    }

    /// A client of this node's API (reads limited to [`QUERY_TIMEOUT_MS`]): transfer,
    /// resign, health, faults.
    pub fn api(&self) -> &NodeApi {
        &self.api
    }

    /// Its raft id.
    pub fn id(&self) -> u64 {
        self.spec.id
    }

    /// `http://API` + `path` (`https://` for a node serving its API with TLS).
    pub fn api_url(&self, path: &str) -> String {
        format!("{}://{}{path}", self.scheme, self.spec.api)
    }

    /// Its leadership, or `None` when it does not answer within [`QUERY_TIMEOUT_MS`]
    /// (paused, killed, or busy).
    pub async fn leadership(&self) -> Option<LeaderView> {
        self.api.leader().await.ok()
    }
}
