//! The proxy's status: `GET /v1/status` ([`ProxyStatus`] as JSON) and `GET /` (the same
//! snapshot as an HTML page for people, rendered here, refreshing itself). Both are
//! admin reads: with an admin token configured they need it, as `GET /v1/fences` does,
//! since they show fences, tokens, client addresses and paths.

use std::time::SystemTime;

use palisade_protocol::audit::rfc3339;
use palisade_protocol::status::{BarrierStatus, FenceStatus, ProxyStatus};
use palisade_server::html::{Page, cell, when};

use crate::audit::REJECTIONS_KEPT;
use crate::fencing::Fencer;
use crate::fleet::Lease;

/// Takes the snapshot both forms show; `lease` in fleet mode.
pub(crate) fn snapshot(fencer: &Fencer, lease: Option<&Lease>, upstream: &str) -> ProxyStatus {
    let activity = fencer.activity();
    let in_flight = fencer.in_flight();
    let mut barrier = BarrierStatus {
        waits_total: activity.barrier_waits(),
        ..BarrierStatus::default()
    };
    for (_, all, waiting) in &in_flight {
        barrier.in_flight += all;
        barrier.waiting += waiting;
    }
    let fences = fencer
        .fence_register()
        .list()
        .into_iter()
        .map(|(scope, token)| {
            let raise = activity.last_raise(&scope);
            FenceStatus {
                in_flight: in_flight
                    .iter()
                    .find(|(s, _, _)| *s == scope)
                    .map_or(0, |(_, all, _)| *all),
                raised_at: raise.map(|(at, _)| rfc3339(at)),
                raised_from: raise.map(|(_, from)| from),
                scope,
                token,
            }
        })
        .collect();
    ProxyStatus {
        time: rfc3339(SystemTime::now()),
        started: rfc3339(activity.started()),
        fences,
        rejections: activity.rejections(),
        // Two rings: stale tokens, and missing or invalid proofs (see `REJECTIONS_KEPT`).
        rejections_max: 2 * REJECTIONS_KEPT as u64,
        rejections_total: activity.rejections_total(),
        barrier,
        upstream: activity.upstream(upstream.to_owned()),
        lease: lease.map(Lease::view),
        audit: activity
            .audit_log()
            .map(palisade_server::audit::AuditLog::status),
    }
}

/// Renders `status` as the HTML page.
pub(crate) fn render(status: &ProxyStatus, admin: &str) -> String {
    let now = SystemTime::now();
    let mut page = Page::new(
        "Palisade proxy",
        &format!(
            "admin {admin} · upstream {} · started {}",
            status.upstream.target,
            when(&status.started, now)
        ),
    );

    page.heading("Fences");
    let rows: Vec<_> = status
        .fences
        .iter()
        .map(|f| {
            vec![
                cell(&f.scope, "mono"),
                cell(f.token.to_string(), "num"),
                cell(
                    f.raised_at.as_deref().map_or_else(
                        || "not since this proxy started".to_owned(),
                        |at| when(at, now),
                    ),
                    "",
                ),
                cell(
                    f.raised_from.map_or_else(String::new, |t| t.to_string()),
                    "num",
                ),
                cell(f.in_flight.to_string(), "num"),
            ]
        })
        .collect();
    page.table(
        &["Scope", "Fence", "Last raised", "Raised from", "In flight"],
        &rows,
        "No fences yet: no fenced write or announce has reached this proxy.",
    );

    page.heading(&format!(
        "Recent rejections ({} since start; kept: the last {} stale tokens, and apart from them the last {} missing or invalid proofs)",
        status.rejections_total,
        status.rejections_max / 2,
        status.rejections_max / 2
    ));
    let rows: Vec<_> = status
        .rejections
        .iter()
        .map(|r| {
            let opt = |v: Option<u64>| v.map_or_else(|| "–".to_owned(), |v| v.to_string());
            vec![
                cell(when(&r.time, now), ""),
                cell(r.scope.clone().unwrap_or_default(), "mono"),
                cell(opt(r.presented), "num bad"),
                cell(opt(r.current), "num"),
                cell(r.peer.clone().unwrap_or_default(), "mono"),
                cell(r.method.clone().unwrap_or_default(), "mono"),
                cell(r.path.clone().unwrap_or_default(), "mono"),
                cell(r.reason.clone().unwrap_or_default(), ""),
            ]
        })
        .collect();
    page.table(
        &[
            "Time",
            "Scope",
            "Presented",
            "Current",
            "Peer",
            "Method",
            "Path",
            "Reason",
        ],
        &rows,
        "No rejections since this proxy started.",
    );

    page.heading("Barrier");
    let b = &status.barrier;
    page.facts(&[
        (
            "Waiting now",
            b.waiting.to_string(),
            if b.waiting > 0 { "warn" } else { "" },
        ),
        ("Fenced requests in flight", b.in_flight.to_string(), ""),
        ("Waits since start", b.waits_total.to_string(), ""),
    ]);

    page.heading("Upstream");
    let u = &status.upstream;
    let health = match (&u.last_failure_at, &u.last_answer_at) {
        (Some(failed), Some(answered)) if answered > failed => ("answering", "ok"),
        (Some(_), _) => ("failing (last forward failed)", "bad"),
        (None, Some(_)) => ("answering", "ok"),
        (None, None) => ("no request forwarded yet", "muted"),
    };
    let mut facts = vec![
        ("Target", u.target.clone(), "mono"),
        ("Health", health.0.to_owned(), health.1),
        ("Answered", u.answered.to_string(), ""),
        (
            "Failed",
            u.failed.to_string(),
            if u.failed > 0 { "warn" } else { "" },
        ),
    ];
    if let Some(at) = &u.last_answer_at {
        facts.push(("Last answer", when(at, now), ""));
    }
    if let (Some(at), Some(cause)) = (&u.last_failure_at, &u.last_failure) {
        facts.push(("Last failure", format!("{}: {cause}", when(at, now)), "bad"));
    }
    page.facts(&facts);

    page.heading("Fleet lease");
    match &status.lease {
        None => page.text("muted", "Standalone mode: this proxy holds no lease."),
        Some(lease) => {
            let refused;
            let (state, class) = if lease.valid {
                ("valid", "ok")
            } else if let Some(refusal) = &lease.refusal {
                refused = format!("refused: {refusal}");
                (refused.as_str(), "bad")
            } else if lease.term == 0 {
                ("none yet", "warn")
            } else {
                (
                    "lapsed: fenced writes of the cluster's scope are refused",
                    "bad",
                )
            };
            page.facts(&[
                ("State", state.to_owned(), class),
                (
                    "Scope",
                    lease
                        .scope
                        .as_ref()
                        .map_or_else(String::new, ToString::to_string),
                    "mono",
                ),
                ("Term", lease.term.to_string(), ""),
                (
                    "Granted by",
                    lease
                        .leader_id
                        .map_or_else(|| "–".to_owned(), |id| format!("node {id}")),
                    "",
                ),
                ("Expires in", format!("{} ms", lease.expires_in_ms), ""),
                ("Renewals", lease.renewals.to_string(), ""),
                (
                    "Failed renewals",
                    lease.failures.to_string(),
                    if lease.failures > 0 { "warn" } else { "" },
                ),
            ]);
        }
    }

    page.heading("Audit log");
    match &status.audit {
        None => page.text("muted", "Off (start the proxy with --audit-log FILE)."),
        Some(audit) => page.facts(&[
            ("File", audit.path.clone(), "mono"),
            ("Records queued", audit.queued.to_string(), ""),
            (
                "Dropped (queue full)",
                audit.dropped.to_string(),
                if audit.dropped > 0 { "bad" } else { "" },
            ),
            (
                "Not written (I/O errors)",
                audit.failed.to_string(),
                if audit.failed > 0 { "bad" } else { "" },
            ),
            (
                "Noise counted, not written (past the rate; see FILE.noise)",
                audit.suppressed.to_string(),
                "",
            ),
        ]),
    }
    page.finish(&format!(
        "Rendered {} UTC; refreshes itself. The same as JSON: GET /v1/status.",
        status.time.get(..19).unwrap_or_default().replace('T', " ")
    ))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::audit::Activity;
    use crate::error::ProxyError;

    fn fencer(dir: &tempfile::TempDir) -> Fencer {
        let db = palisade_storage::open_database(&dir.path().join("a.redb")).unwrap();
        let register = palisade_storage::FenceRegister::open(db, 100).unwrap();
        Fencer::new(register, Duration::from_millis(200))
            .with_activity(Arc::new(Activity::default()))
    }

    /// Goal: in fleet mode the page shows the lease (none yet, before a grant), and a
    /// failed forward turns the upstream's health to failing with its cause; in
    /// standalone mode the page says there is no lease. Method: render snapshots of a
    /// fleet fencer after an upstream failure, and of a standalone one.
    #[test]
    fn page_shows_the_lease_in_fleet_mode_and_a_failing_upstream() {
        let dir = tempfile::tempdir().unwrap();
        let f = fencer(&dir);
        let lease = Lease::new(Duration::from_millis(500), Duration::from_millis(500));
        f.activity()
            .upstream_failed(&ProxyError::UpstreamTimeout { timeout_ms: 30_000 });
        let status = snapshot(&f, Some(&lease), "http://db:9000");
        assert!(
            status
                .lease
                .as_ref()
                .is_some_and(|l| !l.valid && l.term == 0)
        );
        let page = render(&status, "127.0.0.1:8081");
        assert!(page.contains("<h2>Fleet lease</h2>"), "{page}");
        assert!(page.contains("<dd class=\"warn\">none yet</dd>"), "{page}");
        assert!(
            page.contains("<dd class=\"bad\">failing (last forward failed)</dd>"),
            "{page}"
        );
        assert!(page.contains("http://db:9000"), "{page}");

        let dir = tempfile::tempdir().unwrap();
        let page = render(&snapshot(&fencer(&dir), None, "embedded"), "a");
        assert!(
            page.contains("Standalone mode: this proxy holds no lease."),
            "{page}"
        );
        assert!(page.contains("no request forwarded yet"), "{page}");
    }
}
