//! A local cluster: `n` nodes and a proxy whose admin API they announce to.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use palisade_protocol::{FaultSpec, LeaderView, Role};

use crate::node::{NodeProcess, NodeSpec};
use crate::proxy::ProxyProcess;
use crate::trust::Trust;
use crate::{ClusterError, Result, free_port, wait};

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

/// Further choices when starting a cluster, beyond [`ClusterSpec`]. The default is what
/// [`Cluster::start`] does.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Whether nodes announce their token to the proxy (`--announce`).
    pub announce: bool,
    /// Extra environment of every node (`PALISADE_TEST_FAULTS=1`).
    pub node_env: Vec<(String, String)>,
    /// Extra environment of the proxy (`FAILPOINTS=...`).
    pub proxy_env: Vec<(String, String)>,
    /// The address the proxy listens on (port chosen by the kernel).
    pub proxy_host: IpAddr,
    /// Where each node listens and how it is run, by position; empty: every node on
    /// 127.0.0.1, run directly.
    pub node_hosts: Vec<NodeHost>,
    /// Run secure: trust material in `DIR/trust` ([`Trust`]), nodes signing tokens
    /// (`--token-key`) with peer mTLS and an https API (`--cert/--key/--ca`), the proxy
    /// checking proofs (`--token-pub`) with an admin token (`--admin-token-file`).
    pub secure: bool,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        Self {
            announce: true,
            node_env: Vec::new(),
            proxy_env: Vec::new(),
            proxy_host: IpAddr::V4(Ipv4Addr::LOCALHOST),
            node_hosts: Vec::new(),
            secure: false,
        }
    }
}

/// Where one node listens (raft and API) and the command that runs it.
#[derive(Debug, Clone)]
pub struct NodeHost {
    /// Its address.
    pub ip: IpAddr,
    /// A command that runs the binary (`ip netns exec NS`); empty: run it directly.
    pub prefix: Vec<String>,
}

/// Nodes and a proxy, each a real process, in one directory.
pub struct Cluster {
    /// The proxy; every node announces its token to its admin API.
    pub proxy: ProxyProcess,
    /// The nodes, by position (node id = position + 1).
    pub nodes: Vec<NodeProcess>,
    /// Where data and logs live.
    pub dir: PathBuf,
    /// The trust material, when the cluster runs secure.
    pub trust: Option<Trust>,
}

impl Cluster {
    /// Starts the proxy, then the nodes, in `dir`.
    pub fn start(dir: &Path, spec: &ClusterSpec) -> Result<Self> {
        Self::start_with(dir, spec, &ClusterOptions::default())
    }

    /// Starts the proxy, then the nodes, in `dir`, with `options`.
    pub fn start_with(dir: &Path, spec: &ClusterSpec, options: &ClusterOptions) -> Result<Self> {
        let proxy_dir = dir.join("proxy");
        let trust = if options.secure {
            let ids: Vec<u64> = (1..=spec.nodes as u64).collect();
            let mut hosts: Vec<IpAddr> = options.node_hosts.iter().map(|h| h.ip).collect();
            hosts.push(options.proxy_host);
            Some(Trust::generate(&dir.join("trust"), &ids, &hosts)?)
        } else {
            None
        };
        let mut proxy_flags: Vec<&str> = spec.proxy_flags.iter().map(String::as_str).collect();
        let trust_proxy_flags = trust.as_ref().map(Trust::proxy_flags).unwrap_or_default();
        proxy_flags.extend(trust_proxy_flags.iter().map(String::as_str));
        let proxy_env: Vec<(&str, &str)> = options
            .proxy_env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let any_port = std::net::SocketAddr::new(options.proxy_host, 0).to_string();
        let mut proxy =
            ProxyProcess::start_with(&proxy_dir, &any_port, &any_port, &proxy_flags, &proxy_env)?;
        let client_tls = match &trust {
            Some(trust) => {
                proxy.set_admin_bearer(trust.admin_token());
                Some(trust.client_tls()?)
            }
            None => None,
        };
        let host = |id: u64| -> Result<NodeHost> {
            if options.node_hosts.is_empty() {
                return Ok(NodeHost {
                    ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
                    prefix: Vec::new(),
                });
            }
            options
                .node_hosts
                .get(usize::try_from(id - 1).unwrap_or(usize::MAX))
                .cloned()
                .ok_or_else(|| ClusterError::Spawn {
                    what: format!("node {id}"),
                    source: std::io::Error::other("no NodeHost for this node"),
                })
        };
        let mut peers = BTreeMap::new();
        for id in 1..=spec.nodes as u64 {
            peers.insert(id, (host(id)?.ip, free_port()?).into());
        }
        let mut nodes = Vec::with_capacity(spec.nodes);
        for id in 1..=spec.nodes as u64 {
            let at = host(id)?;
            let mut extra = spec.node_flags.clone();
            match &trust {
                Some(trust) => extra.extend(trust.node_flags(id)),
                // Nodes on test hosts of their own (network namespaces with veth
                // addresses) speak plaintext off loopback, which a node refuses unless
                // told that it is meant: these hosts exist only inside this machine.
                None if peers.values().any(|a: &SocketAddr| !a.ip().is_loopback()) => {
                    extra.push("--insecure".to_owned());
                }
                None => {}
            }
            let node_spec = NodeSpec {
                id,
                peers: peers.clone(),
                api: (at.ip, free_port()?).into(),
                data_dir: dir.join(format!("node-{id}")),
                announce: if options.announce {
                    vec![format!("http://{}", proxy.admin)]
                } else {
                    Vec::new()
                },
                extra,
                env: options.node_env.clone(),
                prefix: at.prefix,
            };
            nodes.push(NodeProcess::start_tls(node_spec, dir, client_tls.as_ref())?);
        }
        Ok(Self {
            proxy,
            nodes,
            dir: dir.to_owned(),
            trust,
        })
    }

    /// The raft ids of the nodes.
    pub fn ids(&self) -> Vec<u64> {
        self.nodes.iter().map(NodeProcess::id).collect()
    }

    /// Cuts the nodes of `side` off from every other node, both ways, by test faults on
    /// every node (each side drops what it sends to and receives from the other). The
    /// proxy stays reachable from both sides. Needs `PALISADE_TEST_FAULTS=1` on the nodes.
    pub async fn partition(&self, side: &[u64]) -> Result<()> {
        let ids = self.ids();
        for node in &self.nodes {
            let mine = side.contains(&node.id());
            let faults = FaultSpec {
                drop: ids
                    .iter()
                    .copied()
                    .filter(|&id| id != node.id() && side.contains(&id) != mine)
                    .collect(),
                ..FaultSpec::default()
            };
            node.set_faults(&faults).await?;
        }
        Ok(())
    }

    /// Removes every test fault from every node.
    pub async fn heal(&self) -> Result<()> {
        for node in &self.nodes {
            node.set_faults(&FaultSpec::default()).await?;
        }
        Ok(())
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
    pub async fn leaderships(&self) -> BTreeMap<u64, LeaderView> {
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
    pub async fn established_leader(&self, except: Option<u64>) -> Option<LeaderView> {
        // `except` is not even asked: a paused node would only cost a query timeout.
        let mut best: Option<LeaderView> = None;
        for node in self.nodes.iter().filter(|n| Some(n.id()) != except) {
            if let Some(l) = node.leadership().await
                && l.token.is_some()
                && best.as_ref().is_none_or(|b| l.term > b.term)
            {
                best = Some(l);
            }
        }
        best
    }

    /// The established leader among the nodes `ids` when they have settled: every one of
    /// them answers, exactly one holds a token, and every other follows it in its term.
    pub async fn settled_leader(&self, ids: &[u64]) -> Option<LeaderView> {
        let all = self.leaderships().await;
        let views: Vec<&LeaderView> = ids.iter().filter_map(|id| all.get(id)).collect();
        if views.len() != ids.len() {
            return None;
        }
        let leaders: Vec<&&LeaderView> = views.iter().filter(|l| l.token.is_some()).collect();
        let [leader] = leaders.as_slice() else {
            return None;
        };
        views
            .iter()
            .all(|l| {
                l.node_id == leader.node_id
                    || (l.term == leader.term
                        && l.leader_id == Some(leader.node_id)
                        && l.role == Role::Follower)
            })
            .then(|| (**leader).clone())
    }

    /// Waits for an established leader whose term is above `above`, skipping `except`.
    pub async fn wait_for_leader(
        &self,
        above: u64,
        except: Option<u64>,
        timeout: Duration,
    ) -> Option<LeaderView> {
        wait::poll(timeout, || async {
            self.established_leader(except)
                .await
                .filter(|l| l.term > above)
        })
        .await
    }

    /// The proxy's fence for `scope` (0 when never seen), or `None` if it does not answer.
    pub async fn proxy_fence(&self, scope: &str) -> Option<u64> {
        self.proxy.fence(scope).await
    }
}
