//! A `palisade node` child and its leadership, as its HTTP API reports it.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::{Method, StatusCode};
use serde::{Deserialize, Deserializer, Serialize};

use crate::client::try_send_within;
use crate::process::{ChildGuard, Launch, spawn_launch};
use crate::{ClusterError, Result};

/// What a node prints on stdout once its API listens: `palisade node ID listening on ...`.
pub const READY_LINE: &str = "palisade node";
/// Timeout of one leadership query: short, so a paused node reads as "no answer".
pub const QUERY_TIMEOUT: Duration = Duration::from_millis(500);
/// Timeout of setting a node's test faults: a paused node cannot answer.
pub const FAULTS_TIMEOUT: Duration = Duration::from_secs(5);

/// `GET /v1/leader`, as CONTRACT.md fixes it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Leadership {
    /// The answering node.
    pub node_id: u64,
    /// The fencing scope of the cluster.
    pub scope: String,
    /// Its raft term.
    pub term: u64,
    /// The leader it knows of (0: none; the API sends `null`).
    #[serde(deserialize_with = "null_as_zero")]
    pub leader_id: u64,
    /// `leader`, `follower` or `candidate` (`pre-candidate` while probing).
    pub role: String,
    /// The fencing token: `Some(term)` only on an established leader.
    pub token: Option<u64>,
    /// Whether every `--announce` proxy has accepted the token.
    pub announced: bool,
}

/// `null` (no leader known) as 0, so that a candidate's answer still parses.
fn null_as_zero<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<u64, D::Error> {
    Ok(Option::<u64>::deserialize(d)?.unwrap_or(0))
}

/// The environment variable that enables a node's test-fault route (`POST /v1/test/faults`).
pub const TEST_FAULTS_ENV: &str = "PALISADE_TEST_FAULTS";

/// The faults of one node's raft links, as `POST /v1/test/faults` takes them (the node
/// must run with `PALISADE_TEST_FAULTS=1`): peers cut off both ways, and extra latency of
/// what it sends to each peer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkFaults {
    /// Peers whose traffic this node discards, both what it sends and what it receives.
    pub drop: BTreeSet<u64>,
    /// Milliseconds of delay of what this node sends, per peer.
    pub delay_ms: BTreeMap<u64, u64>,
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
        let log = Self::log_path(spec.id, log_dir, n);
        let name = format!("node {}", spec.id);
        let launch = Launch {
            args: spec.args(),
            env: spec.env.clone(),
            prefix: spec.prefix.clone(),
        };
        let (guard, _, _) = spawn_launch(&launch, &log, READY_LINE, &name)?;
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
    /// [`LinkFaults`] heals them. Needs `PALISADE_TEST_FAULTS=1` in the node's environment.
    pub async fn set_faults(&self, faults: &LinkFaults) -> Result<()> {
        let url = self.api_url("/v1/test/faults");
        let body = serde_json::to_vec(faults).map_err(|e| ClusterError::Http {
            url: url.clone(),
            cause: e.to_string(),
        })?;
        let answer = try_send_within(
            Method::POST,
            &url,
            &[("content-type", "application/json")],
            body,
            FAULTS_TIMEOUT,
        )
        .await?;
        if answer.status == StatusCode::OK {
            Ok(())
        } else {
            Err(ClusterError::Http {
                url,
                cause: format!("{}: {}", answer.status, answer.text()),
            })
        }
    }

    /// Its raft id.
    pub fn id(&self) -> u64 {
        self.spec.id
    }

    /// `http://API` + `path`.
    pub fn api_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.spec.api)
    }

    /// Its leadership, or `None` when it does not answer within `QUERY_TIMEOUT`
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
