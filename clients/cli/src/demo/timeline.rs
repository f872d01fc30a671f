//! The demo's timeline: start the cluster (a fleet with `--proxies N`) and the workers,
//! let the leader's worker write, pause the leader with its worker, wait for the new
//! leader's token at every proxy, resume, and print the summary with the verdict on the
//! ledger the store applied. The parts the `--sessions` variant shares (starting the
//! cluster, saying how it is secured, the summary and verdict) are functions of their own.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use palisade_cluster::{
    Cluster, ClusterOptions, ClusterSpec, Fleet, OPERATOR_CERT_NAME, WRITER_CERT_NAME,
};

use super::state::Demo;
use super::verdict::{Entry, Observed};
use super::{COOLDOWN, DEMO_SCORE_MARGIN_MS, DemoArgs, LEASE_TICKS, WARMUP, store, verdict};
use crate::Failure;

/// What the summary says beyond the ledger and the verdict.
pub(super) struct Story {
    /// Who was paused, in the rejections line: "the paused leader".
    pub(super) paused: &'static str,
    /// Lines printed between the rejections and the verdict (the fleet's proxies, the
    /// failover's length), each without its indent.
    pub(super) lines: Vec<String>,
}

/// Runs the demo in `dir` and prints its timeline and summary; the verdict decides the
/// result.
pub(super) async fn run(args: &DemoArgs, dir: PathBuf) -> Result<(), Failure> {
    let pause = Duration::from_secs_f64(args.pause);
    let fleet = args.proxies > 1;
    if fleet {
        println!(
            "palisade demo: {} nodes, a fleet of {} proxies in front of one store, a worker beside each node; pause {:.1}s",
            args.nodes, args.proxies, args.pause
        );
    } else {
        println!(
            "palisade demo: {} nodes, 1 proxy on its embedded store, a worker beside each node; pause {:.1}s",
            args.nodes, args.pause
        );
    }
    println!("  (data and logs in {})", dir.display());
    let started = Instant::now();
    let store = if fleet {
        Some(
            store::DemoStore::start()
                .await
                .map_err(|e| Failure::Runtime(format!("cannot start the demo's store: {e}")))?,
        )
    } else {
        None
    };
    let lease_ms = LEASE_TICKS * args.tick_ms;
    let proxy_flags = store
        .as_ref()
        .map(|s| vec!["--upstream".to_owned(), s.url()])
        .unwrap_or_default();
    let cluster = start_cluster(args, &dir, proxy_flags)?;
    if fleet {
        println!(
            "  fleet: every proxy holds a lease of {lease_ms} ms on the current term (renewed from the cluster); a new leader's token is released once every proxy accepted its term, or once every lease certainly expired"
        );
        println!(
            "  fleet: the store behind the proxies fences nothing itself: what it applied is what the fleet admitted"
        );
    }
    say_trust(
        &cluster,
        if fleet {
            "proxies proxy-N (leases under their own name only)"
        } else {
            "the proxy proxy-1"
        },
        "leader views only",
    );
    let mut demo = Demo::new(
        started,
        cluster,
        store,
        Observed::new(palisade_cluster::worker::WORKER_SCOPE, "leader"),
    );
    say_started(&demo);
    demo.start_workers(&dir)?;

    // The first leader.
    let first = demo.wait_for_announced_leader(0, None).await?;
    let old_token = first.token.unwrap_or(first.term);
    let leader = first.node_id;
    demo.observed.old_token = old_token;
    demo.say(
        "leader",
        &format!(
            "node {leader} established with token {old_token}; {} {old_token}",
            if fleet {
                "every proxy's fence is"
            } else {
                "the proxy's fence is"
            }
        ),
    );
    demo.show_scores(leader).await;
    demo.pump_for(WARMUP).await;

    // The pause: wait until the leader's worker holds its token in the middle of a job,
    // then stop the node and its worker together.
    demo.wait_for_holding(leader, old_token).await?;
    let old_proxy = demo.worker_proxy(leader);
    let paused_at = Instant::now();
    demo.pause(leader)?;
    demo.say(
        "PAUSE",
        &format!(
            "SIGSTOP node {leader} and its worker while it holds token {old_token} (a GC pause)"
        ),
    );

    // A new leader, and its token at the proxy.
    let next = demo
        .wait_for_announced_leader(old_token, Some(leader))
        .await?;
    let failover = paused_at.elapsed();
    let new_token = next.token.unwrap_or(next.term);
    demo.observed.new_token = Some(new_token);
    let new_proxy = demo.worker_proxy(next.node_id);
    demo.say(
        "leader",
        &format!(
            "node {} established with token {new_token}; {} {new_token} (failover {:.2}s after SIGSTOP)",
            next.node_id,
            if fleet {
                "every proxy's fence is"
            } else {
                "the proxy's fence is"
            },
            failover.as_secs_f64()
        ),
    );
    if fleet {
        demo.say(
            "fleet",
            &format!(
                "node {leader}'s worker writes through {}, node {}'s through {}",
                demo.proxy_name(old_proxy),
                next.node_id,
                demo.proxy_name(new_proxy)
            ),
        );
    }

    // Resume the old leader after the rest of its pause.
    demo.pump_for(pause.saturating_sub(paused_at.elapsed()))
        .await;
    demo.resume(leader)?;
    demo.say(
        "RESUME",
        &format!(
            "SIGCONT node {leader} and its worker; it still believes it holds token {old_token}"
        ),
    );
    demo.wait_for_job_end(leader).await?;
    if let Some(l) = demo.wait_for_follower(leader, new_token).await {
        demo.say(
            &format!("node {leader}"),
            &format!(
                "now {} in term {}, leader {}",
                l.role,
                l.term,
                l.leader_id
                    .map_or_else(|| "unknown".to_owned(), |id| id.to_string())
            ),
        );
    }
    demo.pump_for(COOLDOWN).await;
    demo.stop_workers();

    let mut lines = Vec::new();
    if fleet {
        lines.push(format!(
            "fleet: the paused leader's write went through {}, the new leader's through {}{}",
            demo.proxy_name(old_proxy),
            demo.proxy_name(new_proxy),
            if old_proxy == new_proxy {
                " (the same proxy: more nodes than proxies)"
            } else {
                " (different proxies)"
            }
        ));
    }
    lines.push(format!(
        "failover: {:.2}s from SIGSTOP of node {leader} until token {new_token} was announced at the {}",
        failover.as_secs_f64(),
        if fleet { "proxies" } else { "proxy" }
    ));
    conclude(
        &demo,
        &Story {
            paused: "the paused leader",
            lines,
        },
    )
    .await
}

/// Starts the demo's cluster in `dir`: `args.nodes` nodes placed by score, and the proxy
/// (a fleet with `--proxies N`) with `proxy_flags`.
pub(super) fn start_cluster(
    args: &DemoArgs,
    dir: &std::path::Path,
    proxy_flags: Vec<String>,
) -> Result<Cluster, Failure> {
    let spec = ClusterSpec {
        nodes: args.nodes,
        node_flags: vec![
            "--tick-ms".to_owned(),
            args.tick_ms.to_string(),
            // Leaders placed by score: each node measures its round trip to the proxies.
            "--score-oracle".to_owned(),
            "storage-rtt".to_owned(),
            "--score-margin".to_owned(),
            DEMO_SCORE_MARGIN_MS.to_string(),
        ],
        proxy_flags,
    };
    let options = ClusterOptions {
        secure: !args.insecure_demo,
        fleet: (args.proxies > 1).then(|| Fleet::new(args.proxies, LEASE_TICKS * args.tick_ms)),
        ..ClusterOptions::default()
    };
    Cluster::start_with(dir, &spec, &options).map_err(|e| Failure::Runtime(e.to_string()))
}

/// Says how the cluster is secured (or that it is not): `proxies` names the proxies'
/// role, `workers_may` what the workers' certificate is used for. Ends with a blank line.
pub(super) fn say_trust(cluster: &Cluster, proxies: &str, workers_may: &str) {
    if cluster.trust.is_some() {
        println!(
            "  secure: signed fencing tokens (nodes sign with token.key, the proxy checks proofs with token.pub)"
        );
        println!(
            "  secure: peer mutual TLS between nodes, and an https node API that requires client certificates"
        );
        println!("  secure: the proxy's admin API requires a bearer token (admin.token)");
        println!(
            "  secure: roles from the certificates' names: nodes node-N, {proxies}, the workers {WRITER_CERT_NAME} ({workers_may}), the demo's own node API calls {OPERATOR_CERT_NAME}; any other use of a node API route is refused with 403",
        );
    } else {
        println!(
            "  insecure (--insecure-demo): unsigned tokens, plaintext peers and node APIs, no admin token"
        );
    }
    println!();
}

/// Says where every proxy listens and every node serves its API.
pub(super) fn say_started(demo: &Demo) {
    for (i, proxy) in demo.cluster.proxies().into_iter().enumerate() {
        demo.say(
            &demo.proxy_name(i),
            &format!("listening on {} (admin {})", proxy.addr, proxy.admin),
        );
    }
    for node in &demo.cluster.nodes {
        demo.say(
            &format!("node {}", node.id()),
            &format!("started, API {}", node.spec.api),
        );
    }
}

/// Prints the summary (the ledger per token, the rejections, `story`'s lines) and the
/// verdict on the ledger as the store applied it, which decides the result.
pub(super) async fn conclude(demo: &Demo, story: &Story) -> Result<(), Failure> {
    let ledger: Vec<Entry> = demo.ledger().await?;
    let verdict = verdict::check(&ledger, &demo.observed);
    let old_token = demo.observed.old_token;
    let new_token = demo
        .observed
        .new_token
        .map_or_else(|| "?".to_owned(), |t| t.to_string());
    println!("\nSummary");
    println!("  writes in the ledger, per token (store's view):");
    print!(
        "{}",
        verdict::per_token_lines(&verdict.per_token, &demo.writers)
    );
    println!(
        "  rejections: {} ({}'s stale write {})",
        demo.rejections.len(),
        story.paused,
        if verdict.stale_write_rejected {
            "was rejected"
        } else {
            "was NOT seen rejected"
        }
    );
    for r in &demo.rejections {
        println!("    {r}");
    }
    for line in &story.lines {
        println!("  {line}");
    }
    if verdict.holds() {
        println!(
            "  verdict: HOLDS. {} ledger entries in apply order: tokens never decrease, no write with token {old_token} landed after token {new_token}, every acknowledged write is stored, no rejected write is.",
            ledger.len()
        );
        Ok(())
    } else {
        println!("  verdict: VIOLATED. {}", verdict.report.summary());
        for v in &verdict.violations {
            println!("    - {v}");
        }
        Err(Failure::Runtime("the verdict does not hold".to_owned()))
    }
}
