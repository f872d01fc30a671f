//! A local cluster: `n` nodes and a proxy whose admin API they announce to, or a fleet of
//! proxies (`palisade proxy --cluster`) holding leases from nodes started with
//! `--lease-ms`.

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
    /// A command that runs the standalone proxy's binary (`env LD_PRELOAD=...`: a proxy
    /// on a faked clock); empty: run it directly. A fleet's proxies take theirs from
    /// [`Fleet::proxy_hosts`].
    pub proxy_prefix: Vec<String>,
    /// Where each node listens and how it is run, by position; empty: every node on
    /// 127.0.0.1, run directly.
    pub node_hosts: Vec<NodeHost>,
    /// Run secure: trust material in `DIR/trust` ([`Trust`]), nodes signing tokens
    /// (`--token-key`) with peer mTLS and an https API (`--cert/--key/--ca`) whose routes
    /// admit only their roles, the proxy checking proofs (`--token-pub`) with an admin
    /// token (`--admin-token-file`); in a fleet, each proxy presents `proxy-<n>` and the
    /// nodes' `--announce` entries bind its URL to that name (`proxy-<n>=URL`). The
    /// launcher's own node API calls present [`crate::OPERATOR_CERT_NAME`].
    pub secure: bool,
    /// Run a fleet of proxies in fleet mode ([`Fleet`]) instead of one standalone proxy.
    pub fleet: Option<Fleet>,
}

/// A fleet of proxies in front of the same upstream, each following the cluster: every
/// proxy runs `palisade proxy --cluster <every node's API URL> --fleet-name <its admin
/// URL>`, and every node runs with `--lease-ms` and one `--announce` per proxy (that same
/// admin URL), so every proxy of the fleet takes leases and acknowledges new terms.
#[derive(Debug, Clone)]
pub struct Fleet {
    /// Number of proxies (1 or more).
    pub proxies: usize,
    /// The nodes' `--lease-ms`: how long a granted lease holds.
    pub lease_ms: u64,
    /// The nodes' `--lease-drift-ppm`, when not their default.
    pub lease_drift_ppm: Option<u64>,
    /// The nodes' (and the proxies') `--lease-write-bound-ms`, when not their default.
    pub lease_write_bound_ms: Option<u64>,
    /// Per proxy (by position): the base URLs it reaches the nodes at (its `--cluster`),
    /// instead of the nodes' own API URLs, one per node in node order. A test points
    /// them at relays it can cut, to cut one proxy off from the cluster.
    pub cluster_urls: BTreeMap<usize, Vec<String>>,
    /// Per proxy (by position): the URL the nodes announce to and lease to, and the
    /// proxy's `--fleet-name`, instead of its own admin URL. A test points it at a relay
    /// in front of the proxy's admin listener, to cut the cluster off from that proxy.
    pub fleet_names: BTreeMap<usize, String>,
    /// Per proxy (by position): where it listens and how it is run (`ip netns exec NS`:
    /// a proxy in a network namespace of its own, which a test can cut off from the
    /// nodes with drop rules); absent: on [`ClusterOptions::proxy_host`], run directly.
    pub proxy_hosts: BTreeMap<usize, NodeHost>,
}

impl Fleet {
    /// `proxies` proxies whose leases hold `lease_ms`, everything else by default.
    pub fn new(proxies: usize, lease_ms: u64) -> Self {
        Self {
            proxies,
            lease_ms,
            lease_drift_ppm: None,
            lease_write_bound_ms: None,
            cluster_urls: BTreeMap::new(),
            fleet_names: BTreeMap::new(),
            proxy_hosts: BTreeMap::new(),
        }
    }

    /// The nodes' flags for this fleet (without the `--announce` URLs).
    fn node_flags(&self) -> Vec<String> {
        let mut flags = vec!["--lease-ms".to_owned(), self.lease_ms.to_string()];
        if let Some(ppm) = self.lease_drift_ppm {
            flags.extend(["--lease-drift-ppm".to_owned(), ppm.to_string()]);
        }
        if let Some(ms) = self.lease_write_bound_ms {
            flags.extend(["--lease-write-bound-ms".to_owned(), ms.to_string()]);
        }
        flags
    }
}

impl Default for ClusterOptions {
    fn default() -> Self {
        Self {
            announce: true,
            node_env: Vec::new(),
            proxy_env: Vec::new(),
            proxy_host: IpAddr::V4(Ipv4Addr::LOCALHOST),
            proxy_prefix: Vec::new(),
            node_hosts: Vec::new(),
            secure: false,
            fleet: None,
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

/// Nodes and a proxy (or a fleet of proxies), each a real process, in one directory.
pub struct Cluster {
    /// The proxy (the first of a fleet); every node announces its token to its admin API.
    pub proxy: ProxyProcess,
    /// The further proxies of a fleet ([`ClusterOptions::fleet`]), the second onwards;
    /// empty without a fleet. [`Cluster::proxy_at`] counts from the first.
    pub fleet: Vec<ProxyProcess>,
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

    /// Starts the proxy (or the fleet's proxies), then the nodes, in `dir`, with `options`.
    pub fn start_with(dir: &Path, spec: &ClusterSpec, options: &ClusterOptions) -> Result<Self> {
        let trust = if options.secure {
            let ids: Vec<u64> = (1..=spec.nodes as u64).collect();
            let mut hosts: Vec<IpAddr> = options.node_hosts.iter().map(|h| h.ip).collect();
            hosts.push(options.proxy_host);
            let proxies = options.fleet.as_ref().map_or(1, |f| f.proxies.max(1));
            Some(Trust::generate(&dir.join("trust"), &ids, proxies, &hosts)?)
        } else {
            None
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
        // Every address is chosen before any process starts: a fleet's proxies name the
        // nodes (`--cluster`) and the nodes name the proxies (`--announce`).
        let mut peers = BTreeMap::new();
        let mut apis = BTreeMap::new();
        for id in 1..=spec.nodes as u64 {
            let ip = host(id)?.ip;
            peers.insert(id, SocketAddr::from((ip, free_port()?)));
            apis.insert(id, SocketAddr::from((ip, free_port()?)));
        }
        let scheme = if trust.is_some() { "https" } else { "http" };
        let node_urls: Vec<String> = apis.values().map(|a| format!("{scheme}://{a}")).collect();

        let mut base_flags: Vec<String> = spec.proxy_flags.clone();
        base_flags.extend(trust.as_ref().map(Trust::proxy_flags).unwrap_or_default());
        let proxy_env: Vec<(&str, &str)> = options
            .proxy_env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let count = options.fleet.as_ref().map_or(1, |f| f.proxies.max(1));
        let mut proxies = Vec::with_capacity(count);
        let mut announce = Vec::with_capacity(count);
        for i in 0..count {
            let mut flags = base_flags.clone();
            let at = options
                .fleet
                .as_ref()
                .and_then(|f| f.proxy_hosts.get(&i).cloned())
                .unwrap_or_else(|| NodeHost {
                    ip: options.proxy_host,
                    prefix: options.proxy_prefix.clone(),
                });
            let any_port = SocketAddr::new(at.ip, 0).to_string();
            let mut admin_listen = any_port.clone();
            let mut name = None;
            if let Some(fleet) = &options.fleet {
                // The admin port is chosen in advance: its URL is the proxy's name in the
                // fleet, which it must be told before it starts. (A port free here is
                // free in a namespace of its own too: that one has no sockets at all.)
                let admin = SocketAddr::new(at.ip, free_port()?);
                admin_listen = admin.to_string();
                let fleet_name = fleet
                    .fleet_names
                    .get(&i)
                    .cloned()
                    .unwrap_or_else(|| format!("http://{admin}"));
                let urls = fleet
                    .cluster_urls
                    .get(&i)
                    .cloned()
                    .unwrap_or_else(|| node_urls.clone());
                flags.extend([
                    "--cluster".to_owned(),
                    urls.join(","),
                    "--fleet-name".to_owned(),
                    fleet_name.clone(),
                ]);
                if let Some(ms) = fleet.lease_write_bound_ms {
                    flags.extend(["--lease-write-bound-ms".to_owned(), ms.to_string()]);
                }
                if let Some(trust) = &trust {
                    flags.extend(trust.proxy_cluster_flags(i));
                    // The nodes lease this URL only to the proxy whose certificate names
                    // `proxy-<i+1>` (roles are enforced on the https node APIs).
                    name = Some(format!("{}={fleet_name}", crate::trust::proxy_cert_name(i)));
                } else {
                    name = Some(fleet_name);
                }
            }
            let proxy_dir = if i == 0 {
                dir.join("proxy")
            } else {
                dir.join(format!("proxy-{}", i + 1))
            };
            let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
            let mut proxy = ProxyProcess::start_in(
                &proxy_dir,
                &any_port,
                &admin_listen,
                &flags,
                &proxy_env,
                &at.prefix,
            )?;
            if let Some(trust) = &trust {
                proxy.set_admin_bearer(trust.admin_token());
            }
            announce.push(name.unwrap_or_else(|| format!("http://{}", proxy.admin)));
            proxies.push(proxy);
        }
        // The launcher's own calls (leadership, test faults, resign) are an operator's.
        let client_tls = match &trust {
            Some(trust) => Some(trust.operator_tls()?),
            None => None,
        };
        let mut nodes = Vec::with_capacity(spec.nodes);
        for id in 1..=spec.nodes as u64 {
            let at = host(id)?;
            let mut extra = spec.node_flags.clone();
            if let Some(fleet) = &options.fleet {
                extra.extend(fleet.node_flags());
            }
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
                api: apis[&id],
                data_dir: dir.join(format!("node-{id}")),
                announce: if options.announce {
                    announce.clone()
                } else {
                    Vec::new()
                },
                extra,
                env: options.node_env.clone(),
                prefix: at.prefix,
            };
            nodes.push(NodeProcess::start_tls(node_spec, dir, client_tls.as_ref())?);
        }
        let mut proxies = proxies.into_iter();
        let proxy = proxies.next().ok_or_else(|| ClusterError::Spawn {
            what: "proxy".to_owned(),
            source: std::io::Error::other("a cluster needs at least one proxy"),
        })?;
        Ok(Self {
            proxy,
            fleet: proxies.collect(),
            nodes,
            dir: dir.to_owned(),
            trust,
        })
    }

    /// Every proxy, the first ([`Cluster::proxy`]) first.
    pub fn proxies(&self) -> Vec<&ProxyProcess> {
        std::iter::once(&self.proxy).chain(&self.fleet).collect()
    }

    /// The proxy at position `i` (0: [`Cluster::proxy`]).
    pub fn proxy_at(&self, i: usize) -> Option<&ProxyProcess> {
        match i {
            0 => Some(&self.proxy),
            i => self.fleet.get(i - 1),
        }
    }

    /// The proxy at position `i`, mutably.
    pub fn proxy_at_mut(&mut self, i: usize) -> Option<&mut ProxyProcess> {
        match i {
            0 => Some(&mut self.proxy),
            i => self.fleet.get_mut(i - 1),
        }
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
