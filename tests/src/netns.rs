//! Real network partitions: each node in a network namespace of its own, joined to the
//! test's namespace by a veth pair on a private bridge, and cut off by `nft` drop rules
//! inside its namespace. Needs root, iproute2 (`ip netns`) and nftables (`nft`); without
//! them [`NetnsNet::create`] says why. The test that uses it is `#[ignore]`d, and run with
//! `--ignored` where it can run (`.ci/run` does, as root).
//!
//! Addresses are private to this test: `10.213.X.0/24` on a bridge `plbrX` that has no
//! other port, with `X` taken from the process id, the nodes at `.1`, `.2`, ... and the
//! test's side (the proxy, the workers, the test itself) at `.254`. Nothing touches `lo`
//! or any interface the machine already had. Everything is removed on drop.

use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;

use palisade_cluster::NodeHost;

/// A private network of namespaces, one per node.
pub struct NetnsNet {
    /// The third octet of the subnet and the suffix of every name.
    x: u8,
    nodes: usize,
    /// Names of the namespaces created so far (for cleanup).
    namespaces: Vec<String>,
    bridge: Option<String>,
}

/// Runs a command; its stderr on failure.
fn run(program: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`{program} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl NetnsNet {
    /// Creates a bridge and `nodes` namespaces, or says why it cannot.
    pub fn create(nodes: usize) -> Result<Self, String> {
        // One subnet per test process, and per network within it.
        static NEXT: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);
        // `/proc/self` belongs to the effective user.
        let euid = std::os::unix::fs::MetadataExt::uid(
            &std::fs::metadata("/proc/self").map_err(|e| format!("cannot read /proc/self: {e}"))?,
        );
        if euid != 0 {
            return Err(format!("not running as root (uid {euid})"));
        }
        run("nft", &["--version"]).map_err(|e| format!("nftables is missing: {e}"))?;
        let base = u8::try_from(std::process::id() % 200).unwrap_or(0);
        let x = base
            .wrapping_add(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
            .max(1);
        let mut net = Self {
            x,
            nodes,
            namespaces: Vec::new(),
            bridge: None,
        };
        let bridge = format!("plbr{x}");
        run("ip", &["link", "add", &bridge, "type", "bridge"])?;
        net.bridge = Some(bridge.clone());
        run(
            "ip",
            &["addr", "add", &format!("10.213.{x}.254/24"), "dev", &bridge],
        )?;
        run("ip", &["link", "set", &bridge, "up"])?;
        for i in 1..=nodes {
            let ns = net.namespace(i);
            run("ip", &["netns", "add", &ns])?;
            net.namespaces.push(ns.clone());
            let (inner, outer) = (format!("pv{x}n{i}a"), format!("pv{x}n{i}b"));
            run(
                "ip",
                &[
                    "link", "add", &inner, "type", "veth", "peer", "name", &outer,
                ],
            )?;
            run("ip", &["link", "set", &inner, "netns", &ns])?;
            run("ip", &["link", "set", &outer, "master", &bridge, "up"])?;
            let addr = format!("10.213.{x}.{i}/24");
            run(
                "ip",
                &[
                    "netns", "exec", &ns, "ip", "addr", "add", &addr, "dev", &inner,
                ],
            )?;
            run(
                "ip",
                &["netns", "exec", &ns, "ip", "link", "set", &inner, "up"],
            )?;
            run(
                "ip",
                &["netns", "exec", &ns, "ip", "link", "set", "lo", "up"],
            )?;
        }
        Ok(net)
    }

    fn namespace(&self, node: usize) -> String {
        format!("palisade-t{}-{node}", self.x)
    }

    /// Node `id`'s address.
    pub fn node_ip(&self, id: u64) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(
            10,
            213,
            self.x,
            u8::try_from(id).unwrap_or(0),
        ))
    }

    /// The test side's address on the bridge: where the proxy listens.
    pub fn host_ip(&self) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(10, 213, self.x, 254))
    }

    /// Where each node listens and how it is run (`ip netns exec NS`).
    pub fn node_hosts(&self) -> Vec<NodeHost> {
        (1..=self.nodes)
            .map(|i| NodeHost {
                ip: self.node_ip(i as u64),
                prefix: ["ip", "netns", "exec", &self.namespace(i)]
                    .iter()
                    .map(ToString::to_string)
                    .collect(),
            })
            .collect()
    }

    /// Cuts node `id` off from `peers` both ways with nft drop rules in its namespace
    /// (the test side, the proxy included, stays reachable).
    pub fn cut(&self, id: u64, peers: &[u64]) -> Result<(), String> {
        let ns = self.namespace(usize::try_from(id).unwrap_or(0));
        let set = peers
            .iter()
            .map(|&p| self.node_ip(p).to_string())
            .collect::<Vec<_>>()
            .join(", ");
        let rules = format!(
            "table inet palisade_partition {{\n\
             chain input {{ type filter hook input priority 0; ip saddr {{ {set} }} drop; }}\n\
             chain output {{ type filter hook output priority 0; ip daddr {{ {set} }} drop; }}\n\
             }}\n"
        );
        let file = std::env::temp_dir().join(format!("{ns}.nft"));
        std::fs::write(&file, rules).map_err(|e| e.to_string())?;
        let outcome = run(
            "ip",
            &[
                "netns",
                "exec",
                &ns,
                "nft",
                "-f",
                &file.display().to_string(),
            ],
        );
        let _ = std::fs::remove_file(&file);
        outcome
    }

    /// Removes node `id`'s drop rules.
    pub fn heal(&self, id: u64) -> Result<(), String> {
        let ns = self.namespace(usize::try_from(id).unwrap_or(0));
        run(
            "ip",
            &[
                "netns",
                "exec",
                &ns,
                "nft",
                "delete",
                "table",
                "inet",
                "palisade_partition",
            ],
        )
    }
}

impl Drop for NetnsNet {
    fn drop(&mut self) {
        for ns in self.namespaces.drain(..) {
            // Deleting a namespace destroys its veth end, and so the pair.
            if let Err(e) = run("ip", &["netns", "del", &ns]) {
                eprintln!("cleanup: {e}");
            }
        }
        if let Some(bridge) = self.bridge.take()
            && let Err(e) = run("ip", &["link", "del", &bridge])
        {
            eprintln!("cleanup: {e}");
        }
    }
}
