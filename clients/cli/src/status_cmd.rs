//! `palisade status`: one screen for a cluster and its proxies: the leader and term, each
//! node's view, the members, and per proxy its fences, lease, barrier, upstream and last
//! rejections. `--json` prints the same as one JSON document ([`StatusReport`]), whose
//! fields are only ever added to.
//!
//! Every endpoint is asked once, with [`STATUS_TIMEOUT_MS`]; one that does not answer is
//! shown with its error, and the command then exits 1 (after printing everything), so a
//! script can tell a complete report from a partial one.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use clap::Args;
use palisade_client::{NodeApi, ProxyAdmin};
use palisade_protocol::audit::rfc3339;
use palisade_protocol::{LeaderView, MemberList, ProxyStatus, Role};
use serde::{Deserialize, Serialize};

use crate::Failure;
use crate::client_cmds::{print_json, print_line, usage_or_runtime};
use crate::client_trust::{TlsFlags, read_admin_token};

/// Time each node or proxy has to answer: they answer from memory, so a slower one is
/// shown as not answering rather than holding up the whole screen.
pub(crate) const STATUS_TIMEOUT_MS: u64 = 3_000;
/// Rejections shown per proxy in the text form (the JSON has all the proxy keeps).
pub(crate) const STATUS_REJECTIONS_SHOWN: usize = 5;

/// One screen for a cluster and its proxies.
#[derive(Args)]
pub(crate) struct StatusArgs {
    /// Node API URLs (any members; comma-separated or repeated).
    #[arg(
        long,
        value_name = "URL",
        value_delimiter = ',',
        required_unless_present = "proxy"
    )]
    node: Vec<String>,
    /// Proxy admin API URLs (comma-separated or repeated).
    #[arg(long, value_name = "URL", value_delimiter = ',')]
    proxy: Vec<String>,
    /// File holding the proxies' admin bearer token, when they require one.
    #[arg(long, env = "PALISADE_ADMIN_TOKEN_FILE", value_name = "FILE")]
    admin_token_file: Option<PathBuf>,
    #[command(flatten)]
    tls: TlsFlags,
    /// Print one JSON document instead of the screen.
    #[arg(long)]
    json: bool,
}

/// `palisade status --json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct StatusReport {
    /// When the report was taken, RFC 3339 in UTC.
    pub time: String,
    /// The cluster as its nodes see it.
    pub cluster: ClusterSummary,
    /// Each node asked, in the order given.
    pub nodes: Vec<NodeReport>,
    /// The members, from the first node that listed them.
    pub members: Option<MemberList>,
    /// Each proxy asked, in the order given.
    pub proxies: Vec<ProxyReport>,
}

/// The cluster's leader and term, from the highest term any node reported.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct ClusterSummary {
    /// The highest term a node reported.
    pub term: u64,
    /// The leader a node of that term names, if any.
    pub leader_id: Option<u64>,
    /// The scope of the cluster's tokens.
    pub scope: Option<String>,
    /// The leader's token, when the leader answered and holds one.
    pub token: Option<u64>,
}

/// One node's answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct NodeReport {
    /// The URL asked.
    pub url: String,
    /// Its leader view, when it answered.
    pub view: Option<LeaderView>,
    /// Why it did not.
    pub error: Option<String>,
}

/// One proxy's answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ProxyReport {
    /// The URL asked.
    pub url: String,
    /// Its status, when it answered.
    pub status: Option<ProxyStatus>,
    /// Why it did not.
    pub error: Option<String>,
}

/// `palisade status`.
pub(crate) async fn run(args: StatusArgs) -> Result<(), Failure> {
    let tls = args.tls.client_tls(None)?;
    let timeout = Duration::from_millis(STATUS_TIMEOUT_MS);
    let bearer = args
        .admin_token_file
        .as_deref()
        .map(read_admin_token)
        .transpose()?;
    let mut nodes = Vec::new();
    let mut members = None;
    for url in &args.node {
        let api = NodeApi::with_tls(url, &tls)
            .map_err(|e| usage_or_runtime(&e))?
            .timeout(timeout);
        let (view, error) = match api.leader().await {
            Ok(view) => (Some(view), None),
            Err(e) => (None, Some(e.to_string())),
        };
        if members.is_none() && view.is_some() {
            members = api.members().await.ok();
        }
        nodes.push(NodeReport {
            url: url.clone(),
            view,
            error,
        });
    }
    let mut proxies = Vec::new();
    for url in &args.proxy {
        let mut admin = ProxyAdmin::with_tls(url, &tls)
            .map_err(|e| usage_or_runtime(&e))?
            .timeout(timeout);
        if let Some(bearer) = &bearer {
            admin = admin.with_bearer(bearer);
        }
        let (status, error) = match admin.status().await {
            Ok(status) => (Some(status), None),
            Err(e) => (None, Some(e.to_string())),
        };
        proxies.push(ProxyReport {
            url: url.clone(),
            status,
            error,
        });
    }
    let report = StatusReport {
        time: rfc3339(SystemTime::now()),
        cluster: summarize(&nodes),
        nodes,
        members,
        proxies,
    };
    if args.json {
        print_json(&report)?;
    } else {
        for line in render(&report) {
            print_line(&line)?;
        }
    }
    let silent = report.nodes.iter().filter(|n| n.error.is_some()).count()
        + report.proxies.iter().filter(|p| p.error.is_some()).count();
    if silent > 0 {
        return Err(Failure::Runtime(format!(
            "{silent} of {} endpoints did not answer",
            report.nodes.len() + report.proxies.len()
        )));
    }
    Ok(())
}

/// The leader and term: the highest term reported, and the leader a node of that term
/// names (the leader's own view first).
fn summarize(nodes: &[NodeReport]) -> ClusterSummary {
    let views: Vec<&LeaderView> = nodes.iter().filter_map(|n| n.view.as_ref()).collect();
    let term = views.iter().map(|v| v.term).max().unwrap_or(0);
    let current: Vec<&&LeaderView> = views.iter().filter(|v| v.term == term).collect();
    let leader = current.iter().find(|v| v.role == Role::Leader);
    ClusterSummary {
        term,
        leader_id: leader
            .map(|v| v.node_id)
            .or_else(|| current.iter().find_map(|v| v.leader_id)),
        scope: views.first().map(|v| v.scope.to_string()),
        token: leader.and_then(|v| v.token),
    }
}

/// The screen, line by line.
fn render(r: &StatusReport) -> Vec<String> {
    let mut out = Vec::new();
    let c = &r.cluster;
    if !r.nodes.is_empty() {
        out.push(format!(
            "Cluster{}: {}, term {}{}",
            c.scope
                .as_ref()
                .map_or_else(String::new, |s| format!(" (scope {s})")),
            c.leader_id.map_or_else(
                || "no leader known".to_owned(),
                |id| format!("leader node {id}")
            ),
            c.term,
            c.token.map_or_else(String::new, |t| format!(", token {t}")),
        ));
        out.push(format!(
            "  {:<32} {:>4}  {:<9} {:>6}  {:<7} {:<6} {}",
            "NODE", "ID", "ROLE", "TERM", "LEADER", "TOKEN", "ANNOUNCED"
        ));
        for n in &r.nodes {
            match (&n.view, &n.error) {
                (Some(v), _) => out.push(format!(
                    "  {:<32} {:>4}  {:<9} {:>6}  {:<7} {:<6} {}",
                    n.url,
                    v.node_id,
                    v.role.to_string(),
                    v.term,
                    v.leader_id
                        .map_or_else(|| "-".to_owned(), |id| id.to_string()),
                    v.token.map_or_else(|| "-".to_owned(), |t| t.to_string()),
                    if v.announced { "yes" } else { "no" },
                )),
                (None, error) => out.push(format!(
                    "  {:<32} not answering: {}",
                    n.url,
                    error.as_deref().unwrap_or("")
                )),
            }
        }
        match &r.members {
            Some(list) => out.push(format!(
                "  members: {}",
                list.members
                    .iter()
                    .map(|m| format!("{} ({})", m.id, m.peer))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            None => out.push("  members: not listed by any node".to_owned()),
        }
    }
    for p in &r.proxies {
        out.push(String::new());
        let Some(s) = &p.status else {
            out.push(format!(
                "Proxy {}: not answering: {}",
                p.url,
                p.error.as_deref().unwrap_or("")
            ));
            continue;
        };
        out.push(format!("Proxy {} (upstream {})", p.url, s.upstream.target));
        let fences = s
            .fences
            .iter()
            .map(|f| format!("{}={}", f.scope, f.token))
            .collect::<Vec<_>>();
        out.push(format!(
            "  fences: {}",
            if fences.is_empty() {
                "none".to_owned()
            } else {
                fences.join(", ")
            }
        ));
        out.push(match &s.lease {
            None => "  lease: standalone (no lease)".to_owned(),
            Some(l) if l.valid => format!(
                "  lease: valid, term {} from node {}, expires in {} ms ({} renewals, {} failed)",
                l.term,
                l.leader_id
                    .map_or_else(|| "?".to_owned(), |id| id.to_string()),
                l.expires_in_ms,
                l.renewals,
                l.failures
            ),
            Some(l) => format!(
                "  lease: NOT VALID (last term {}; {} failed renewals): fenced writes refused",
                l.term, l.failures
            ),
        });
        out.push(format!(
            "  barrier: {} waiting, {} in flight, {} waits since start; upstream: {} answered, {} failed",
            s.barrier.waiting, s.barrier.in_flight, s.barrier.waits_total, s.upstream.answered, s.upstream.failed
        ));
        if let Some(audit) = &s.audit {
            out.push(format!(
                "  audit log: {} ({} queued, {} dropped)",
                audit.path, audit.queued, audit.dropped
            ));
        }
        out.push(format!(
            "  rejections: {} since start{}",
            s.rejections_total,
            if s.rejections.is_empty() {
                ""
            } else {
                "; the last:"
            }
        ));
        for rej in s.rejections.iter().take(STATUS_REJECTIONS_SHOWN) {
            let opt = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
            let clean = |v: &Option<String>| {
                v.as_deref()
                    .unwrap_or("-")
                    .chars()
                    .map(|c| if c.is_control() { '?' } else { c })
                    .collect::<String>()
            };
            out.push(format!(
                "    {}  scope {} presented {} current {}  {} {} from {}",
                rej.time.replace('T', " ").trim_end_matches('Z'),
                clean(&rej.scope),
                opt(rej.presented),
                opt(rej.current),
                clean(&rej.method),
                clean(&rej.path),
                clean(&rej.peer),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use palisade_protocol::Scope;

    use super::*;

    fn view(node_id: u64, term: u64, role: Role, leader_id: Option<u64>) -> LeaderView {
        // Built from the wire form, so the test holds whatever optional fields the view
        // gains.
        serde_json::from_value(serde_json::json!({
            "node_id": node_id,
            "scope": Scope::default_scope(),
            "term": term,
            "leader_id": leader_id,
            "role": role,
            "token": (role == Role::Leader).then_some(term),
            "announced": false,
            "proof": null,
        }))
        .unwrap()
    }

    fn node(v: Option<LeaderView>) -> NodeReport {
        NodeReport {
            url: "http://n".into(),
            error: v.is_none().then(|| "refused".to_owned()),
            view: v,
        }
    }

    /// Goal: the summary takes the highest term and its leader, not a deposed leader of an
    /// older term. Method: a stale leader at term 3, a follower at term 4 naming node 2.
    #[test]
    fn summary_takes_the_highest_terms_leader() {
        let s = summarize(&[
            node(Some(view(1, 3, Role::Leader, Some(1)))),
            node(Some(view(3, 4, Role::Follower, Some(2)))),
            node(None),
        ]);
        assert_eq!((s.term, s.leader_id, s.token), (4, Some(2), None));
        let s = summarize(&[node(Some(view(2, 4, Role::Leader, Some(2))))]);
        assert_eq!((s.term, s.leader_id, s.token), (4, Some(2), Some(4)));
    }
}
