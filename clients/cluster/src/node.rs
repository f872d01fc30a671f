//! A `palisade node` child and its leadership, as its HTTP API reports it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::{Method, StatusCode};
use serde::Deserialize;

use crate::Result;
use crate::client::try_send_within;
use crate::process::{ChildGuard, spawn_until_line};

/// What a node prints on stdout once its API listens: `palisade node ID listening on ...`.
pub const READY_LINE: &str = "palisade node";
/// Timeout of one leadership query: short, so a paused node reads as "no answer".
pub const QUERY_TIMEOUT: Duration = Duration::from_millis(500);

/// `GET /v1/leader`, as CONTRACT.md fixes it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Leadership {
    /// The answering node.
    pub node_id: u64,
    /// The fencing scope of the cluster.
    pub scope: String,
    /// Its raft term.
    pub term: u64,
    /// The leader it knows of (0: none).
    pub leader_id: u64,
    /// `leader`, `follower` or `candidate` (`pre-candidate` while probing).
    pub role: String,
    /// The fencing token: `Some(term)` only on an established leader.
    pub token: Option<u64>,
    /// Whether every `--announce` proxy has accepted the token.
    pub announced: bool,
}

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
    /// Directory of its logs.
    log_dir: PathBuf,
    starts: usize,
}

impl NodeProcess {
    /// Starts a node and waits until its API has answered.
    pub fn start(spec: NodeSpec, log_dir: &Path) -> Result<Self> {
        let guard = Self::spawn(&spec, log_dir, 0)?;
        Ok(Self {
            guard,
            spec,
            log_dir: log_dir.to_owned(),
            starts: 1,
        })
    }

    fn spawn(spec: &NodeSpec, log_dir: &Path, n: usize) -> Result<ChildGuard> {
        let log = log_dir.join(format!("node-{}-{n}.log", spec.id));
        let name = format!("node {}", spec.id);
        let (guard, _, _) = spawn_until_line(&spec.args(), &log, READY_LINE, &name)?;
        Ok(guard)
    }

    /// `kill -9`s the node (if running) and starts it again with the same spec and data.
    pub fn restart(&mut self) -> Result<()> {
        self.guard.kill9();
        self.guard = Self::spawn(&self.spec, &self.log_dir, self.starts)?;
        self.starts += 1;
        Ok(())
    }

    /// Its raft id.
    pub fn id(&self) -> u64 {
        self.spec.id
    }

    /// `http://API` + `path`.
    pub fn api_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.spec.api)
    }

    /// Its leadership, or `None` when it does not answer within [`QUERY_TIMEOUT`]
    /// (paused, killed, or busy).
    pub async fn leadership(&self) -> Option<Leadership> {
        let answer = try_send_within(
            Method::GET,
            &self.api_url("/v1/leader"),
            &[],
            "",
            QUERY_TIMEOUT,
        )
        .await
        .ok()?;
        if answer.status != StatusCode::OK {
            return None;
        }
        serde_json::from_slice(&answer.body).ok()
    }
}
