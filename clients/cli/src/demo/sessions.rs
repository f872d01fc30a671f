//! `palisade demo --sessions`: the same story with workers that are not raft members.
//!
//! The nodes run as in the default demo and announce to the proxy; beside them run
//! session workers ([`session_worker`](super::session_worker)), one per node but tied to
//! none: each opens a session on the cluster and campaigns for [`SESSION_SCOPE`]. The
//! holder writes with its grant's token; it is paused with `SIGSTOP` in the middle of a
//! job, past its session's TTL; the leader expires the session and grants the scope to the
//! next waiter with a higher token, which every announce proxy fences before the
//! campaign answers; the holder is resumed with `SIGCONT`, finishes its job, writes with
//! its old token, is rejected, finds its session lost, and stops. Then the same summary
//! and verdict as the default demo.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::state::Demo;
use super::timeline::{self, Story};
use super::verdict::Observed;
use super::{COOLDOWN, DemoArgs, SESSION_SCOPE, SESSION_TTL, STEP_TIMEOUT, WARMUP};
use crate::Failure;

/// How often the demo looks for a worker's report while it waits for one.
const REPORT_POLL: Duration = Duration::from_millis(10);

/// Runs the `--sessions` demo in `dir` and prints its timeline and summary; the verdict
/// decides the result.
pub(super) async fn run(args: &DemoArgs, dir: PathBuf) -> Result<(), Failure> {
    let pause = Duration::from_secs_f64(args.pause);
    println!(
        "palisade demo --sessions: {} nodes, 1 proxy on its embedded store, {} workers that are not raft members and hold scope {SESSION_SCOPE} through sessions; pause at least {:.1}s",
        args.nodes, args.nodes, args.pause
    );
    println!("  (data and logs in {})", dir.display());
    let started = Instant::now();
    let cluster = timeline::start_cluster(args, &dir, vec!["--client-scopes".to_owned()])?;
    println!(
        "  sessions: each worker opens a session (TTL {:.1}s, a keepalive every third of it) and campaigns for scope {SESSION_SCOPE}; the leader grants it to one session at a time, and raises the proxy's fence for {SESSION_SCOPE} to each grant's token before the campaign answers",
        SESSION_TTL.as_secs_f64()
    );
    println!(
        "  sessions: the workers write with Fencing-Scope: {SESSION_SCOPE}, which the proxy takes (--client-scopes)"
    );
    timeline::say_trust(&cluster, "the proxy proxy-1", "sessions and campaigns");
    let mut demo = Demo::new(
        started,
        cluster,
        None,
        Observed::new(SESSION_SCOPE, "holder"),
    );
    timeline::say_started(&demo);

    // The cluster's leader: it keeps the sessions' deadlines and grants the scope.
    let leader = demo.wait_for_announced_leader(0, None).await?;
    demo.say(
        "leader",
        &format!(
            "node {} established in term {}: it keeps the sessions and grants the scopes",
            leader.node_id, leader.term
        ),
    );
    demo.start_session_workers(&dir)?;

    // The first holder.
    let (holder, old_token) = demo.wait_for_grant(None, 0).await?;
    demo.observed.old_token = old_token;
    demo.say_fence(holder, old_token).await;
    demo.pump_for(WARMUP).await;

    // The pause: the holder, in the middle of a job with its token.
    demo.wait_for_holding(holder, old_token).await?;
    let paused_at = Instant::now();
    demo.signal_worker(holder, true)?;
    demo.say(
        "PAUSE",
        &format!(
            "SIGSTOP worker {holder} while it holds scope {SESSION_SCOPE} with token {old_token} (a GC pause): its session gets no keepalives"
        ),
    );

    // Its session expires; the next waiter is granted, fenced first at the proxy.
    let (next, new_token) = demo.wait_for_grant(Some(holder), old_token).await?;
    let handover = paused_at.elapsed();
    demo.observed.new_token = Some(new_token);
    demo.say(
        "leader",
        &format!(
            "expired worker {holder}'s session and granted scope {SESSION_SCOPE} to worker {next} ({:.2}s after SIGSTOP)",
            handover.as_secs_f64()
        ),
    );
    demo.say_fence(next, new_token).await;

    // Resume the old holder after the rest of its pause.
    demo.pump_for(pause.saturating_sub(paused_at.elapsed()))
        .await;
    demo.signal_worker(holder, false)?;
    demo.say(
        "RESUME",
        &format!(
            "SIGCONT worker {holder}; it still believes it holds scope {SESSION_SCOPE} with token {old_token}"
        ),
    );
    demo.wait_for_job_end(holder).await?;
    demo.wait_for_stop(holder).await?;
    demo.pump_for(COOLDOWN).await;
    demo.stop_workers();

    timeline::conclude(
        &demo,
        &Story {
            paused: "the paused holder",
            lines: vec![format!(
                "handover: {:.2}s from SIGSTOP of worker {holder} until worker {next} was granted token {new_token} (session TTL {:.2}s)",
                handover.as_secs_f64(),
                SESSION_TTL.as_secs_f64()
            )],
        },
    )
    .await
}

impl Demo {
    /// Starts one session worker per node, each given every node's API.
    fn start_session_workers(&mut self, dir: &Path) -> Result<(), Failure> {
        let nodes: Vec<String> = self
            .cluster
            .nodes
            .iter()
            .map(|n| n.api_url("").trim_end_matches('/').to_owned())
            .collect();
        let proxy = self.cluster.proxy.url("");
        for id in 1..=self.cluster.nodes.len() as u64 {
            let mut args: Vec<String> = vec![
                "demo-session-worker".to_owned(),
                "--node".to_owned(),
                nodes.join(","),
                "--proxy".to_owned(),
                proxy.clone(),
                "--name".to_owned(),
                format!("w{id}"),
                "--scope".to_owned(),
                SESSION_SCOPE.to_owned(),
                "--ttl-ms".to_owned(),
                SESSION_TTL.as_millis().to_string(),
            ];
            args.extend(self.worker_tls_args());
            self.spawn_worker(id, &args, dir)?;
        }
        self.say(
            "workers",
            &format!(
                "{} started, none a raft member: each asks the cluster for scope {SESSION_SCOPE} through a session of its own",
                self.workers.len()
            ),
        );
        Ok(())
    }

    /// Waits for a grant of a token above `above` to a worker other than `except`.
    async fn wait_for_grant(
        &mut self,
        except: Option<u64>,
        above: u64,
    ) -> Result<(u64, u64), Failure> {
        let deadline = Instant::now() + STEP_TIMEOUT;
        loop {
            self.pump();
            if let Some(&(id, token)) = self
                .grants
                .iter()
                .find(|(id, token)| *token > above && Some(*id) != except)
            {
                return Ok((id, token));
            }
            if Instant::now() > deadline {
                return Err(Failure::Runtime(format!(
                    "no worker was granted scope {SESSION_SCOPE} with a token above {above} within {STEP_TIMEOUT:?}"
                )));
            }
            tokio::time::sleep(REPORT_POLL).await;
        }
    }

    /// Waits until worker `id` says it stops (its session lost, its token fenced out).
    async fn wait_for_stop(&mut self, id: u64) -> Result<(), Failure> {
        let deadline = Instant::now() + STEP_TIMEOUT;
        loop {
            self.pump();
            if self.workers.get(&id).is_none_or(|w| w.lost.is_some()) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Failure::Runtime(format!(
                    "worker {id} did not notice within {STEP_TIMEOUT:?} that its session is lost"
                )));
            }
            tokio::time::sleep(REPORT_POLL).await;
        }
    }

    /// Says what the proxy's fence for the scope is once worker `id` was granted `token`.
    async fn say_fence(&self, id: u64, token: u64) {
        let what = match self.cluster.proxy_fence(SESSION_SCOPE).await {
            Some(fence) if fence == token => format!(
                "fence for scope {SESSION_SCOPE} is {fence}: raised to worker {id}'s token before its campaign was answered"
            ),
            Some(fence) => format!("fence for scope {SESSION_SCOPE} is {fence}"),
            None => {
                format!("fence for scope {SESSION_SCOPE} unknown: the admin API did not answer")
            }
        };
        self.say("proxy", &what);
    }
}
