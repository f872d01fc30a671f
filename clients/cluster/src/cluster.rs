//! A local cluster: `n` nodes and a proxy whose admin API they announce to.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::node::{Leadership, NodeProcess, NodeSpec};
use crate::proxy::ProxyProcess;
use crate::{Result, free_port, wait};

/// How to start a cluster.
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    /// Number of nodes.
    pub nodes: usize,
    /// Further flags for every node (`--tick-ms 20`, ...).
    pub node_flags: Vec<String>,
    /// Further flags for the proxy.
    pub proxy_flags: Vec<String>,
}

impl Default for ClusterSpec {
    fn default() -> Self {
        Self {
            nodes: 3,
            node_flags: Vec::new(),
            proxy_flags: Vec::new(),
        }
    }
}

/// Nodes and a proxy, each a real process, in one directory.
pub struct Cluster {
    /// The proxy; every node announces its token to its admin API.
    pub proxy: ProxyProcess,
    /// The nodes, by position (node id = position + 1).
    pub nodes: Vec<NodeProcess>,
    /// Where data and logs live.
    pub dir: PathBuf,
}

impl Cluster {
    /// Starts the proxy, then the nodes, in `dir`.
    pub fn start(dir: &Path, spec: &ClusterSpec) -> Result<Self> {
        let proxy_dir = dir.join("proxy");
        let proxy_flags: Vec<&str> = spec.proxy_flags.iter().map(String::as_str).collect();
        let proxy = ProxyProcess::start(&proxy_dir, &proxy_flags)?;
        let mut peers = BTreeMap::new();
        for id in 1..=spec.nodes as u64 {
            peers.insert(id, ([127, 0, 0, 1], free_port()?).into());
        }
        let mut nodes = Vec::with_capacity(spec.nodes);
        for id in 1..=spec.nodes as u64 {
            let node_spec = NodeSpec {
                id,
                peers: peers.clone(),
                api: ([127, 0, 0, 1], free_port()?).into(),
                data_dir: dir.join(format!("node-{id}")),
                announce: vec![format!("http://{}", proxy.admin)],
                extra: spec.node_flags.clone(),
            };
            nodes.push(NodeProcess::start(node_spec, dir)?);
        }
        Ok(Self {
            proxy,
            nodes,
            dir: dir.to_owned(),
        })
    }

    /// The node with raft id `id`.
    pub fn node(&self, id: u64) -> Option<&NodeProcess> {
        self.nodes.iter().find(|n| n.id() == id)
    }

    /// The node with raft id `id`, mutably.
    pub fn node_mut(&mut self, id: u64) -> Option<&mut NodeProcess> {
        self.nodes.iter_mut().find(|n| n.id() == id)
    }

    /// Every answering node's leadership, by id.
    pub async fn leaderships(&self) -> BTreeMap<u64, Leadership> {
        let mut out = BTreeMap::new();
        for node in &self.nodes {
            if let Some(l) = node.leadership().await {
                out.insert(node.id(), l);
            }
        }
        out
    }

    /// The established leader with the highest term among the answering nodes, skipping
    /// `except` (a paused node that may still believe it leads).
    pub async fn established_leader(&self, except: Option<u64>) -> Option<Leadership> {
        self.leaderships()
            .await
            .into_values()
            .filter(|l| Some(l.node_id) != except && l.token.is_some())
            .max_by_key(|l| l.term)
    }

    /// Waits for an established leader whose term is above `above`, skipping `except`.
    pub async fn wait_for_leader(
        &self,
        above: u64,
        except: Option<u64>,
        timeout: Duration,
    ) -> Option<Leadership> {
        wait::poll(timeout, || async {
            self.established_leader(except)
                .await
                .filter(|l| l.term > above)
        })
        .await
    }

    /// The proxy's fence for `scope` (0 when never seen), or `None` if it does not answer.
    pub async fn proxy_fence(&self, scope: &str) -> Option<u64> {
        let url = self.proxy.admin_url(&format!("/v1/fences/{scope}"));
        let answer = crate::client::try_send_within(
            http::Method::GET,
            &url,
            &[],
            "",
            crate::node::QUERY_TIMEOUT,
        )
        .await
        .ok()?;
        answer.json()["token"].as_u64()
    }
}
