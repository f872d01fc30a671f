//! The renewal task: renews the lease ahead of its end and on demand, asking the nodes
//! as [`first_grant`] says.

use std::sync::Arc;
use std::time::Duration;

use palisade_client::{ClientError, NodeApi, backoff};
use palisade_protocol::lease::{LEASES_OFF, LeaseGrant, LeaseRequest, NOT_LEADER, UNKNOWN_PROXY};
use palisade_protocol::problem::kind::FORBIDDEN_ROLE;
use tokio::sync::watch;
use tokio::time::Instant;

use super::Lease;
use crate::fencing::Fencer;
use crate::metrics as m;

/// Shortest wait before retrying after a renewal round in which no node granted a lease.
pub const RENEW_RETRY_MS_MIN: u64 = 50;
/// Longest wait between failed renewal rounds: short, so that writes resume soon after
/// the cluster is reachable again (a write waits only `limits.lease_renew_timeout_ms`).
pub const RENEW_RETRY_MS_MAX: u64 = 1_000;
/// How long a timer renewal waits for the node that granted last before asking every
/// other node too. Above a leader's longest usual answer time (a leader holds a
/// background renewal for up to its gather interval, at most 300 ms, then needs one
/// quorum round), so a healthy leader is the only node asked; at most half of
/// `limits.lease_renew_timeout_ms` (1 s by default), so a paused or dead node delays a
/// renewal by this much, not by the whole timeout. A renewal a write waits for does not
/// hedge: it asks every node at once.
pub const RENEW_HEDGE_MS: u64 = 500;
/// Fewest milliseconds between two renewals of a valid lease, however short the granted
/// `lease_ms`: a node answering `lease_ms` of 0 or 1 must not make the proxy spin.
pub const RENEW_INTERVAL_MS_MIN: u64 = 10;

/// The renewal task's fixed parts.
pub(crate) struct Renewer {
    pub(crate) lease: Arc<Lease>,
    pub(crate) fencer: Arc<Fencer>,
    /// The nodes, in the configured order.
    pub(crate) nodes: Vec<NodeApi>,
    /// This proxy as the nodes' `--announce` lists it.
    pub(crate) name: String,
}

/// Why a round was started, which decides whom it asks first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cause {
    /// The timer: the lease is renewed ahead of its end, and nobody waits. The node that
    /// last granted is asked first, the others after [`RENEW_HEDGE_MS`].
    Timer,
    /// A request waits for it: every node is asked at once, since a write is held until
    /// the grant and a follower's refusal costs it nothing; the request is marked
    /// `urgent`, so the leader does not hold it to gather others.
    Demand,
}

impl Renewer {
    /// Renews until `shutdown`: every third of the lease after a grant, at once on demand
    /// while the lease holds, with backoff after a failed round. A request that needs a
    /// renewal while a timer round is under way does not wait for it (that round was sent
    /// before the request arrived, so it would not do): the timer round is dropped and a
    /// demand round starts at once. A demand round is never dropped, so requests arriving
    /// in a stream cannot keep every round from finishing.
    pub(crate) async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let request = LeaseRequest {
            proxy: self.name.clone(),
            urgent: false,
        };
        let retry = || {
            backoff::delays(
                Duration::from_millis(RENEW_RETRY_MS_MIN),
                Duration::from_millis(RENEW_RETRY_MS_MAX),
            )
        };
        let mut delays = retry();
        let mut preferred = None;
        let mut cause = Cause::Timer;
        loop {
            // A demand stored while nobody listened (during the last round or its
            // backoff) makes this a demand round: a request is waiting.
            if cause == Cause::Timer && self.demand_stored().await {
                cause = Cause::Demand;
            }
            let sent = Instant::now();
            let round = self.lease.begin_round();
            let asked = self.round(&request, &mut preferred, cause);
            tokio::pin!(asked);
            let result = tokio::select! {
                result = &mut asked => result,
                () = self.lease.demand.notified(), if cause == Cause::Timer => {
                    cause = Cause::Demand;
                    continue;
                }
                _ = shutdown.wait_for(|stop| *stop) => return,
            };
            cause = Cause::Timer;
            let next = match &result {
                Ok(grant) => {
                    delays = retry();
                    sent + Duration::from_millis((grant.lease_ms / 3).max(RENEW_INTERVAL_MS_MIN))
                }
                Err(_) => {
                    Instant::now()
                        + delays
                            .next()
                            .unwrap_or(Duration::from_millis(RENEW_RETRY_MS_MAX))
                }
            };
            let granted = result.is_ok();
            self.lease.finish_round(&self.fencer, round, result).await;
            let lapse = self.lease.current().map(|s| self.lease.expiry(s));
            tokio::select! {
                () = tokio::time::sleep_until(next) => {}
                // A request needs a newer grant: renew now, unless the last round failed
                // (then the backoff holds, and the request waits for the next round).
                () = self.lease.demand.notified(), if granted => cause = Cause::Demand,
                () = async {
                    match lapse {
                        Some(at) if at < next => {
                            tokio::time::sleep_until(at).await;
                            self.lease.update_gauge();
                            std::future::pending::<()>().await;
                        }
                        _ => std::future::pending().await,
                    }
                } => {}
                _ = shutdown.wait_for(|stop| *stop) => return,
            }
        }
    }

    /// Whether a demand is stored (taking it).
    async fn demand_stored(&self) -> bool {
        tokio::select! {
            biased;
            () = self.lease.demand.notified() => true,
            () = std::future::ready(()) => false,
        }
    }

    /// One round: the first grant of any node, asked as [`first_grant`] says, within the
    /// renewal timeout. `preferred` becomes the node that granted, or `None` after a
    /// failed round (the next asks every node at once). The failure names every node's
    /// last answer.
    async fn round(
        &self,
        request: &LeaseRequest,
        preferred: &mut Option<usize>,
        cause: Cause,
    ) -> Result<LeaseGrant, String> {
        let first = match cause {
            Cause::Timer => *preferred,
            Cause::Demand => None,
        };
        // A write waits for a demand round: the leader must not hold it to gather others.
        let request = &LeaseRequest {
            urgent: cause == Cause::Demand,
            ..request.clone()
        };
        let hedge = Duration::from_millis(RENEW_HEDGE_MS).min(self.lease.renew_timeout / 2);
        let ask = |index: usize, timeout: Duration| {
            let node: NodeApi = self.nodes[index].clone();
            let request = request.clone();
            async move {
                node.lease(&request, timeout).await.map_err(|err| {
                    let reason = refusal_reason(&err);
                    (reason, err.to_string())
                })
            }
        };
        let outcome = first_grant(
            self.nodes.len(),
            first,
            hedge,
            self.lease.renew_timeout,
            ask,
        )
        .await;
        match outcome {
            Ok((index, grant)) => {
                *preferred = Some(index);
                self.lease.set_refusal(None);
                Ok(grant)
            }
            Err(answers) => {
                *preferred = None;
                let refused = |kind: &str| -> Vec<String> {
                    answers
                        .iter()
                        .filter(|(_, reason, _)| *reason == kind)
                        .map(|(index, _, _)| self.nodes[*index].url())
                        .collect()
                };
                self.lease.set_refusal(refusal(
                    &refused(LEASES_OFF),
                    &refused(UNKNOWN_PROXY),
                    &refused(FORBIDDEN_ROLE),
                    &request.proxy,
                ));
                let answers: Vec<String> = answers
                    .iter()
                    .map(|(index, reason, err)| {
                        format!("{} ({reason}): {err}", self.nodes[*index].url())
                    })
                    .collect();
                Err(format!(
                    "no node granted a lease to {}: {}",
                    request.proxy,
                    answers.join("; ")
                ))
            }
        }
    }
}

/// A node's refusal as a round sees it: the metrics label and the message.
pub(super) type Refusal = (&'static str, String);

/// The first grant of `count` nodes within `timeout`, and which node gave it; or every
/// node's last refusal (a node that never answered is named as not answering in time).
///
/// With `preferred`, that node is asked first and the others all at once when it refuses
/// or after `hedge`, whichever comes first; without, every node is asked at once. So a
/// paused or dead node costs at most `hedge`, never the whole timeout. A node that
/// refuses in a way asking again may change (not the leader yet, busy, unreachable) is
/// asked again after a backoff from [`RENEW_RETRY_MS_MIN`] to [`RENEW_RETRY_MS_MAX`]
/// while the time lasts, so a round under way during an election is granted soon after
/// the new leader is there. The first grant wins; the requests still out are dropped, and
/// a later answer to them is never seen. Each request is bounded by what is left of
/// `timeout`, so the round is too.
pub(super) async fn first_grant<A, F>(
    count: usize,
    preferred: Option<usize>,
    hedge: Duration,
    timeout: Duration,
    ask: A,
) -> Result<(usize, LeaseGrant), Vec<(usize, &'static str, String)>>
where
    A: Fn(usize, Duration) -> F,
    F: Future<Output = Result<LeaseGrant, Refusal>> + Send + 'static,
{
    let deadline = Instant::now() + timeout;
    let mut asks = tokio::task::JoinSet::new();
    let mut last: Vec<Option<Refusal>> = vec![None; count];
    let mut backoffs: Vec<_> = (0..count)
        .map(|_| {
            backoff::delays(
                Duration::from_millis(RENEW_RETRY_MS_MIN),
                Duration::from_millis(RENEW_RETRY_MS_MAX),
            )
        })
        .collect();
    // Spawns a request to node `index` after `delay`, bounded by the round's deadline.
    let spawn = |asks: &mut tokio::task::JoinSet<_>, index: usize, delay: Duration| {
        let start = Instant::now() + delay;
        let request = ask(index, deadline.saturating_duration_since(start));
        asks.spawn(async move {
            tokio::time::sleep_until(start).await;
            (index, request.await)
        });
    };
    let mut hedge_at = match preferred {
        Some(index) if index < count => {
            spawn(&mut asks, index, Duration::ZERO);
            Some((index, Instant::now() + hedge))
        }
        _ => {
            for index in 0..count {
                spawn(&mut asks, index, Duration::ZERO);
            }
            None
        }
    };
    while !(asks.is_empty() && hedge_at.is_none()) {
        let hedged = async {
            match hedge_at {
                Some((_, at)) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            Some(joined) = asks.join_next() => {
                let Ok((index, answer)) = joined else {
                    continue;
                };
                match answer {
                    Ok(grant) => return Ok((index, grant)),
                    Err((reason, err)) => {
                        metrics::counter!(m::LEASE_REFUSALS, "reason" => reason).increment(1);
                        // A setup error (not listed, no leases, a credential without the proxy role
                        // or bound to another entry) does not change by asking again.
                        let again = ![UNKNOWN_PROXY, LEASES_OFF, FORBIDDEN_ROLE].contains(&reason);
                        last[index] = Some((reason, err));
                        if let Some((first, _)) = hedge_at.take() {
                            (0..count)
                                .filter(|&i| i != first)
                                .for_each(|i| spawn(&mut asks, i, Duration::ZERO));
                        }
                        let delay = backoffs[index]
                            .next()
                            .unwrap_or(Duration::from_millis(RENEW_RETRY_MS_MAX));
                        if again && Instant::now() + delay < deadline {
                            spawn(&mut asks, index, delay);
                        }
                    }
                }
            }
            () = hedged => {
                if let Some((first, _)) = hedge_at.take() {
                    (0..count)
                        .filter(|&i| i != first)
                        .for_each(|i| spawn(&mut asks, i, Duration::ZERO));
                }
            }
            () = tokio::time::sleep_until(deadline) => break,
        }
    }
    let waited_ms = timeout.as_millis();
    Err(last
        .into_iter()
        .enumerate()
        .map(|(index, refusal)| {
            let (reason, err) = refusal.unwrap_or_else(|| {
                (
                    "unreachable",
                    format!("no answer within {waited_ms} ms (limits.lease_renew_timeout_ms)"),
                )
            });
            (index, reason, err)
        })
        .collect())
}

/// What a failed round's answers say an operator must fix, in words: nodes that grant
/// no leases (`leases_off`, started without `--lease-ms`), nodes that do not list this
/// proxy (`unknown`, named `proxy` in its requests), nodes that refuse this proxy's
/// credential (`forbidden`: not a `proxy-` certificate, or not the one its entry is bound
/// to); `None` when none.
pub(super) fn refusal(
    leases_off: &[String],
    unknown: &[String],
    forbidden: &[String],
    proxy: &str,
) -> Option<String> {
    let mut parts = Vec::new();
    if !leases_off.is_empty() {
        parts.push(format!(
            "the cluster grants no leases: node {} answered 409 {LEASES_OFF}, as a node \
             started without --lease-ms does; start every node with --lease-ms to use a \
             proxy fleet",
            leases_off.join(", ")
        ));
    }
    if !unknown.is_empty() {
        parts.push(format!(
            "node {} answered 403 {UNKNOWN_PROXY}: this proxy ({proxy}) is not in its \
             --announce list; add it there, or set --fleet-name to the URL listed",
            unknown.join(", ")
        ));
    }
    if !forbidden.is_empty() {
        parts.push(format!(
            "node {} answered 403 {FORBIDDEN_ROLE}: this proxy's certificate may not take \
             the lease of {proxy}; present the proxy-NAME certificate that the nodes' \
             --announce entry NAME={proxy} names",
            forbidden.join(", ")
        ));
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

/// The metrics label of a node's refusal.
fn refusal_reason(err: &ClientError) -> &'static str {
    match err {
        ClientError::Status {
            problem: Some(problem),
            ..
        } => match problem.kind() {
            NOT_LEADER => NOT_LEADER,
            UNKNOWN_PROXY => UNKNOWN_PROXY,
            LEASES_OFF => LEASES_OFF,
            FORBIDDEN_ROLE => FORBIDDEN_ROLE,
            _ => "error",
        },
        ClientError::Unreachable { .. } | ClientError::Indeterminate { .. } => "unreachable",
        _ => "error",
    }
}
