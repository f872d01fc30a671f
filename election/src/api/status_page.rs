//! The node's status page, `GET /` on the node API: role, term, leader, token, members,
//! scores, and the announce state per proxy, rendered on the server as HTML that refreshes
//! itself. It shows what `GET /v1/leader` and `GET /v1/members` show, to people; tools
//! read those.

use std::collections::BTreeMap;
use std::time::SystemTime;

use axum::extract::State;
use palisade_protocol::audit::rfc3339;
use palisade_protocol::{LeaderView, Role};
use palisade_server::html::{Page, ago, cell, when};

use super::state::Shared;
use crate::audit::Observer;

/// `GET /`: the status page.
pub(super) async fn status_page(State(state): State<Shared>) -> axum::response::Response {
    let view = state.view(&state.leadership.borrow());
    let scores = match (&view.score_oracle, &view.scores) {
        (Some(oracle), Some(scores)) => Some((oracle.clone(), scores.clone())),
        _ => None,
    };
    let members = state
        .members
        .borrow()
        .members
        .iter()
        .map(|m| (m.id, m.peer.clone(), m.voter))
        .collect();
    let page = NodePage {
        view,
        members,
        members_applied: true,
        scores,
        observer: &state.observer,
    };
    palisade_server::html::page_response(render(&page))
}

/// What the page shows, gathered by the API handler.
struct NodePage<'a> {
    /// This node's leader view.
    pub view: LeaderView,
    /// The members (id, peer address, voter) as this node knows them.
    pub members: Vec<(u64, String, bool)>,
    /// Whether the members come from applied membership (`false`: the configured peers).
    pub members_applied: bool,
    /// The score oracle's name and the fresh scores by node id, with an oracle.
    pub scores: Option<(String, BTreeMap<String, f64>)>,
    /// The announce board and audit log.
    pub observer: &'a Observer,
}

/// Renders the page.
fn render(p: &NodePage<'_>) -> String {
    let now = SystemTime::now();
    let v = &p.view;
    let mut page = Page::new(
        &format!("Palisade node {}", v.node_id),
        &format!(
            "scope {} · started {}",
            v.scope,
            when(&rfc3339(p.observer.started()), now)
        ),
    );

    page.heading("Leadership");
    let role_class = match v.role {
        Role::Leader => "ok",
        Role::Candidate => "warn",
        Role::Follower => "",
    };
    let leader = match v.leader_id {
        Some(id) if id == v.node_id => format!("node {id} (this node)"),
        Some(id) => format!("node {id}"),
        None => "unknown (an election may be under way)".to_owned(),
    };
    let token = match v.token {
        Some(t) => (t.to_string(), "ok"),
        None if v.role == Role::Leader => (
            "none yet: not established, or not yet released".to_owned(),
            "warn",
        ),
        None => (
            "none (only the established leader holds one)".to_owned(),
            "muted",
        ),
    };
    let mut facts = vec![
        ("Role", v.role.to_string(), role_class),
        ("Term", v.term.to_string(), ""),
        (
            "Leader",
            leader,
            if v.leader_id.is_some() { "" } else { "warn" },
        ),
        ("Fencing token", token.0, token.1),
        (
            "Announced",
            if v.announced {
                "yes: every proxy accepted the term"
            } else {
                "no"
            }
            .to_owned(),
            if v.announced { "ok" } else { "" },
        ),
    ];
    if let Some(lease_ms) = v.lease_ms {
        facts.push(("Fleet lease", format!("{lease_ms} ms"), ""));
    }
    page.facts(&facts);

    page.heading(if p.members_applied {
        "Members"
    } else {
        "Members (as configured)"
    });
    let rows: Vec<_> = p
        .members
        .iter()
        .map(|(id, peer, voter)| {
            let mut notes = Vec::new();
            if *id == v.node_id {
                notes.push("this node");
            }
            if Some(*id) == v.leader_id {
                notes.push("leader");
            }
            vec![
                cell(id.to_string(), "num"),
                cell(peer, "mono"),
                cell(if *voter { "voter" } else { "learner" }, ""),
                cell(
                    notes.join(", "),
                    if Some(*id) == v.leader_id { "ok" } else { "" },
                ),
            ]
        })
        .collect();
    page.table(&["Id", "Peer", "Kind", "Notes"], &rows, "No members known.");

    page.heading("Scores");
    match &p.scores {
        None => page.text(
            "muted",
            "Scores are off on this node (--score-oracle off): raft's randomized election.",
        ),
        Some((oracle, scores)) => {
            page.text(
                "",
                &format!("Oracle: {oracle}. Higher is better; only fresh scores are listed."),
            );
            let rows: Vec<_> = scores
                .iter()
                .map(|(id, score)| {
                    vec![
                        cell(format!("node {id}"), ""),
                        cell(format!("{score:.2}"), "num"),
                    ]
                })
                .collect();
            page.table(&["Node", "Score"], &rows, "No fresh scores yet.");
        }
    }

    page.heading("Announce (fencing the proxies on election)");
    let rows: Vec<_> = p
        .observer
        .announce_states()
        .into_iter()
        .map(|(url, s)| {
            let class = match s.outcome {
                "accepted" => "ok",
                "refused" => "bad",
                "retrying" => "warn",
                _ => "muted",
            };
            vec![
                cell(url, "mono"),
                cell(
                    s.token.map_or_else(|| "–".to_owned(), |t| t.to_string()),
                    "num",
                ),
                cell(s.outcome, class),
                cell(s.attempts.to_string(), "num"),
                cell(
                    s.at.map_or_else(String::new, |at| {
                        format!(
                            "{} UTC ({})",
                            &rfc3339(at)[..19].replace('T', " "),
                            ago(at, now)
                        )
                    }),
                    "",
                ),
                cell(s.detail.unwrap_or_default(), ""),
            ]
        })
        .collect();
    page.table(
        &["Proxy", "Token", "Outcome", "Attempts", "When", "Detail"],
        &rows,
        "No --announce proxies configured: this node fences no proxy on election.",
    );

    page.heading("Audit log");
    match p.observer.audit_log() {
        None => page.text("muted", "Off (start the node with --audit-log FILE)."),
        Some(log) => page.facts(&[
            ("File", log.path().display().to_string(), "mono"),
            ("Records queued", log.queued().to_string(), ""),
            (
                "Dropped (queue full)",
                log.dropped().to_string(),
                if log.dropped() > 0 { "bad" } else { "" },
            ),
            (
                "Not written (I/O errors)",
                log.failed().to_string(),
                if log.failed() > 0 { "bad" } else { "" },
            ),
        ]),
    }
    page.finish(&format!(
        "Rendered {} UTC; refreshes itself. As JSON: GET /v1/leader, GET /v1/members.",
        rfc3339(now).get(..19).unwrap_or_default().replace('T', " ")
    ))
}
