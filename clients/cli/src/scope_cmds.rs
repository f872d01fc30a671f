//! `palisade campaign|observe|sessions`: named leaderships from the command line, and
//! what `palisade lock` (in `lock_cmd.rs`) shares with them: the `--node` list, opening
//! a session, and waiting for a scope.
//!
//! Exit codes: 0 on success (`campaign`: released after SIGINT or SIGTERM); 1 on a
//! runtime failure; 2 on bad flags; [`EXIT_LOST`] when the session is lost while holding
//! the scope.

use std::time::Duration;

use clap::Args;
use clap::builder::RangedU64ValueParser;
use palisade_client::{
    ClientError, Grant, NodeApi, Scope, ScopeView, Session, SessionList, backoff,
};
use palisade_protocol::problem::kind::CAMPAIGN_TIMEOUT;
use palisade_protocol::scopes::{
    CAMPAIGN_TIMEOUT_MS_DEFAULT, SESSION_TTL_MS_DEFAULT, SESSION_TTL_MS_MAX, SESSION_TTL_MS_MIN,
};

use crate::Failure;
use crate::client_cmds::{print_json, print_line, usage_or_runtime};
use crate::client_trust::TrustFlags;
use crate::lock_cmd::{EXIT_LOST, Signals, exit_for_signal};

/// Longest `--timeout-ms` or `--campaign-timeout-ms` taken: an hour. A longer wait for a
/// scope is better written as a loop that says what it is waiting for.
pub(crate) const CAMPAIGN_TIMEOUT_MS_MAX: u64 = 3_600_000;
/// How long each `observe` long poll asks the node to wait.
const OBSERVE_WAIT_MS: u64 = 10_000;
/// First pause before asking the next node after one failed in `observe`.
const OBSERVE_RETRY_MIN_MS: u64 = 100;
/// Longest pause (before jitter) between two failed asks in `observe`: a node that comes
/// back is shown within about a second.
const OBSERVE_RETRY_MAX_MS: u64 = 1_000;
/// How long the cleanup of a session whose holder is stopping may take (resign and
/// revoke): past it the process exits anyway, and the leader expires the session after
/// its TTL.
pub(crate) const CLEANUP_TIMEOUT_MS: u64 = 5_000;

/// The cluster's nodes, and how to reach them.
#[derive(Args)]
pub(crate) struct NodesFlags {
    /// Base URLs of the cluster's node APIs, comma-separated or repeated; any of them,
    /// the leader is found among them.
    #[arg(
        long = "node",
        env = "PALISADE_NODE",
        value_name = "URL[,URL...]",
        value_delimiter = ',',
        required = true
    )]
    pub(crate) nodes: Vec<String>,
    #[command(flatten)]
    pub(crate) trust: TrustFlags,
}

impl NodesFlags {
    /// The URLs given, without blanks; none is a usage error.
    pub(crate) fn urls(&self) -> Result<Vec<String>, Failure> {
        let urls: Vec<String> = self
            .nodes
            .iter()
            .map(|u| u.trim().to_owned())
            .filter(|u| !u.is_empty())
            .collect();
        if urls.is_empty() {
            return Err(Failure::Usage(
                "--node: give at least one node URL".to_owned(),
            ));
        }
        Ok(urls)
    }

    /// A client of each node.
    fn apis(&self) -> Result<Vec<NodeApi>, Failure> {
        self.urls()?
            .iter()
            .map(|url| {
                self.trust
                    .node_api(url)
                    .map_err(|e| Failure::Usage(format!("--node: {e}")))
            })
            .collect()
    }

    /// Opens a session with `ttl_ms` on the cluster's leader.
    pub(crate) async fn open_session(&self, ttl_ms: u64) -> Result<Session, Failure> {
        Session::builder(self.urls()?)
            .tls(self.trust.client_tls()?)
            .ttl(Duration::from_millis(ttl_ms))
            .open()
            .await
            .map_err(|e| match e {
                ClientError::InvalidUrl { .. } => Failure::Usage(format!("--node: {e}")),
                ClientError::InvalidRequest(_) => usage_or_runtime(&e),
                other => Failure::Runtime(format!("cannot open a session: {other}")),
            })
    }
}

/// The `--ttl-ms` parser: the contract's bounds.
fn ttl_parser() -> RangedU64ValueParser<u64> {
    RangedU64ValueParser::<u64>::new().range(SESSION_TTL_MS_MIN..=SESSION_TTL_MS_MAX)
}

/// The parser of campaign timeouts: 1 ms to [`CAMPAIGN_TIMEOUT_MS_MAX`].
pub(crate) fn campaign_timeout_parser() -> RangedU64ValueParser<u64> {
    RangedU64ValueParser::<u64>::new().range(1..=CAMPAIGN_TIMEOUT_MS_MAX)
}

/// A scope name that can be campaigned for: the scope rule, and not `.` or `..`, which
/// cannot be named in a URL path.
pub(crate) fn parse_scope(name: &str) -> Result<String, String> {
    Scope::check(name).map_err(|e| e.to_string())?;
    if name == "." || name == ".." {
        return Err(format!("scope {name:?} cannot be named in a URL path"));
    }
    Ok(name.to_owned())
}

/// What a session's holder needs: the nodes and the TTL.
#[derive(Args)]
pub(crate) struct SessionFlags {
    #[command(flatten)]
    pub(crate) nodes: NodesFlags,
    /// The session's TTL in milliseconds: the leader expires it this long after the last
    /// keepalive it received; keepalives go every third of it.
    #[arg(long, value_name = "MS", default_value_t = SESSION_TTL_MS_DEFAULT, value_parser = ttl_parser())]
    pub(crate) ttl_ms: u64,
}

/// `palisade campaign --help`, above the flags.
pub(crate) const CAMPAIGN_ABOUT: &str = "\
Hold SCOPE until interrupted: open a session, campaign for SCOPE (waiting at most \
--timeout-ms while another session holds it), print the grant as one JSON line \
({\"scope\":..,\"token\":N,\"proof\":..,\"session\":..}), keep the session alive until SIGINT \
or SIGTERM, then resign and revoke it.

Exit status: 0 after releasing on SIGINT/SIGTERM; 1 when the scope was not acquired \
within --timeout-ms or the cluster refused; 75 when the session was lost while holding \
the scope (no keepalive answered within the TTL less the drift bound, or the cluster \
forgot it): from then on the grant's token must not be used.";

/// The flags of `palisade campaign` (its help is [`CAMPAIGN_ABOUT`]).
#[derive(Args)]
pub(crate) struct CampaignArgs {
    /// The scope: 1 to 128 of A-Z a-z 0-9 . _ -
    #[arg(value_parser = parse_scope)]
    scope: String,
    #[command(flatten)]
    session: SessionFlags,
    /// How long to wait for the scope while another session holds it, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = CAMPAIGN_TIMEOUT_MS_DEFAULT, value_parser = campaign_timeout_parser())]
    timeout_ms: u64,
}

/// `palisade observe --help`, above the flags.
pub(crate) const OBSERVE_ABOUT: &str = "\
Print who holds SCOPE: one JSON line ({\"scope\":..,\"session\":..,\"token\":N,\"proof\":..}, \
nulls when nobody does) now, then one per change (a grant, a release) until interrupted; \
with --once, only the first. Asks any of the nodes (long polls), the next one when one \
fails.";

/// The flags of `palisade observe` (its help is [`OBSERVE_ABOUT`]).
#[derive(Args)]
pub(crate) struct ObserveArgs {
    /// The scope.
    #[arg(value_parser = parse_scope)]
    scope: String,
    #[command(flatten)]
    nodes: NodesFlags,
    /// Print the scope's view once and exit.
    #[arg(long)]
    once: bool,
}

/// `palisade sessions --help`, above the flags.
pub(crate) const SESSIONS_ABOUT: &str = "\
List the cluster's sessions: id, TTL, milliseconds until the leader may expire it (known \
on the leader only, so the leader's list is shown when it answers), the client identity \
that opened it, the scopes it holds and those it waits for. --json prints the node's \
answer ({\"sessions\":[...]}) as one line.";

/// The flags of `palisade sessions` (its help is [`SESSIONS_ABOUT`]).
#[derive(Args)]
pub(crate) struct SessionsArgs {
    #[command(flatten)]
    nodes: NodesFlags,
    /// Print the list as one JSON object (`{"sessions":[...]}`) instead of a table.
    #[arg(long)]
    json: bool,
}

/// `palisade campaign`.
pub(crate) async fn campaign(args: CampaignArgs) -> Result<(), Failure> {
    let mut signals = Signals::new()?;
    let session = args.session.nodes.open_session(args.session.ttl_ms).await?;
    let timeout = Duration::from_millis(args.timeout_ms);
    let result = tokio::select! {
        result = session.campaign(&args.scope, timeout) => result,
        signal = signals.recv() => {
            eprintln!("palisade campaign: {signal} received while waiting for scope {}; giving up", args.scope);
            cleanup(session, None).await;
            return Err(Failure::Exit(exit_for_signal(signal)));
        }
    };
    let grant = match result {
        Ok(grant) => grant,
        Err(e) => {
            let message = if e.problem_kind() == Some(CAMPAIGN_TIMEOUT) {
                format!(
                    "scope {} not acquired within {} ms: another session holds it",
                    args.scope, args.timeout_ms
                )
            } else {
                format!("campaign for scope {}: {e}", args.scope)
            };
            cleanup(session, None).await;
            return Err(Failure::Runtime(message));
        }
    };
    eprintln!(
        "palisade campaign: scope {} acquired with token {} (session {}); holding it until SIGINT or SIGTERM",
        grant.scope,
        grant.token,
        session.id()
    );
    print_json(&grant)?;
    tokio::select! {
        loss = session.lost() => {
            eprintln!("palisade campaign: scope {} lost because {loss}", grant.scope);
            cleanup_lost(session).await;
            Err(Failure::Exit(EXIT_LOST))
        }
        signal = signals.recv() => {
            eprintln!("palisade campaign: {signal} received; releasing scope {}", grant.scope);
            cleanup(session, Some(&grant)).await;
            Ok(())
        }
    }
}

/// Campaigns until the session holds `scope`, campaigning again after each
/// `campaign-timeout` (another session holds it): as long as needed. Says once that it
/// waits. Errors other than a timeout end the wait.
pub(crate) async fn campaign_until_held(
    session: &Session,
    scope: &str,
    each: Duration,
    who: &str,
) -> Result<Grant, ClientError> {
    let mut said = false;
    loop {
        match session.campaign(scope, each).await {
            Err(e) if e.problem_kind() == Some(CAMPAIGN_TIMEOUT) => {
                if !said {
                    eprintln!("palisade {who}: scope {scope} is held by another session; waiting");
                    said = true;
                }
            }
            other => return other,
        }
    }
}

/// Resigns `grant`'s scope (when one was held) and revokes the session, each failure
/// reported but not fatal: the leader expires the session after its TTL anyway.
pub(crate) async fn cleanup(session: Session, grant: Option<&Grant>) {
    let work = async {
        if let Some(grant) = grant
            && let Err(e) = session.resign(&grant.scope).await
        {
            eprintln!("palisade: resigning scope {}: {e}", grant.scope);
        }
        match session.revoke().await {
            Ok(_) | Err(ClientError::UnknownSession { .. }) => {}
            Err(e) => eprintln!("palisade: revoking the session: {e}; it expires after its TTL"),
        }
    };
    if tokio::time::timeout(Duration::from_millis(CLEANUP_TIMEOUT_MS), work)
        .await
        .is_err()
    {
        eprintln!(
            "palisade: the session's cleanup took over {CLEANUP_TIMEOUT_MS} ms; it expires after its TTL"
        );
    }
}

/// After a loss: revokes the session in case the cluster still knows it (a loss by the
/// clock alone), so that its scopes pass on at once; quietly, as it usually is gone.
pub(crate) async fn cleanup_lost(session: Session) {
    let _ = tokio::time::timeout(Duration::from_millis(CLEANUP_TIMEOUT_MS), session.revoke()).await;
}

/// `palisade observe`.
pub(crate) async fn observe(args: ObserveArgs) -> Result<(), Failure> {
    let apis = args.nodes.apis()?;
    let mut at = 0_usize;
    let mut last: Option<ScopeView> = None;
    let mut failing = false;
    let retry = || {
        backoff::delays(
            Duration::from_millis(OBSERVE_RETRY_MIN_MS),
            Duration::from_millis(OBSERVE_RETRY_MAX_MS),
        )
    };
    let mut delays = retry();
    let watch = async {
        loop {
            let api = &apis[at % apis.len()];
            let answer = match &last {
                None => api.scope(&args.scope).await,
                Some(view) => {
                    api.observe(
                        &args.scope,
                        view.token,
                        Duration::from_millis(OBSERVE_WAIT_MS),
                    )
                    .await
                }
            };
            match answer {
                Ok(view) => {
                    if failing {
                        eprintln!("palisade observe: node {} answers", api.url());
                        failing = false;
                        delays = retry();
                    }
                    if last.as_ref() != Some(&view) {
                        print_json(&view)?;
                        if args.once {
                            return Ok(());
                        }
                        last = Some(view);
                    }
                }
                Err(e @ (ClientError::InvalidRequest(_) | ClientError::Tls { .. })) => {
                    return Err(usage_or_runtime(&e));
                }
                Err(e) => {
                    if args.once && at + 1 >= apis.len() {
                        return Err(Failure::Runtime(format!("no node answered: {e}")));
                    }
                    if !failing {
                        eprintln!("palisade observe: {e}; asking the next node");
                        failing = true;
                    }
                    at += 1;
                    let pause = delays
                        .next()
                        .unwrap_or(Duration::from_millis(OBSERVE_RETRY_MAX_MS));
                    tokio::time::sleep(pause).await;
                }
            }
        }
    };
    tokio::select! {
        result = watch => result,
        () = crate::shutdown_signal() => Ok(()),
    }
}

/// `palisade sessions`.
pub(crate) async fn sessions(args: SessionsArgs) -> Result<(), Failure> {
    let mut first: Option<SessionList> = None;
    let mut last_error = None;
    for api in args.nodes.apis()? {
        match api.sessions().await {
            // Only the leader knows when sessions expire: its list is the one to show.
            Ok(list) if list.sessions.iter().any(|s| s.expires_in_ms.is_some()) => {
                first = Some(list);
                break;
            }
            Ok(list) => {
                first.get_or_insert(list);
            }
            Err(e) => last_error = Some(e),
        }
    }
    let list = match (first, last_error) {
        (Some(list), _) => list,
        (None, Some(e)) => return Err(Failure::Runtime(format!("listing sessions: {e}"))),
        (None, None) => return Err(Failure::Usage("--node: no node given".to_owned())),
    };
    if args.json {
        print_json(&list)
    } else {
        print_line(&render_sessions(&list))
    }
}

/// The table of `palisade sessions`: a header, then one row per session.
fn render_sessions(list: &SessionList) -> String {
    let dash = |v: &[String]| {
        if v.is_empty() {
            "-".to_owned()
        } else {
            v.join(",")
        }
    };
    let mut rows = vec![[
        "ID".to_owned(),
        "TTL_MS".to_owned(),
        "EXPIRES_IN_MS".to_owned(),
        "OWNER".to_owned(),
        "HOLDS".to_owned(),
        "WAITS".to_owned(),
    ]];
    for s in &list.sessions {
        rows.push([
            s.id.clone(),
            s.ttl_ms.to_string(),
            s.expires_in_ms
                .map_or_else(|| "-".to_owned(), |ms| ms.to_string()),
            s.owner.clone().unwrap_or_else(|| "-".to_owned()),
            dash(&s.holds),
            dash(&s.waits),
        ]);
    }
    let widths: Vec<usize> = (0..6)
        .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
        .collect();
    rows.iter()
        .map(|r| {
            r.iter()
                .zip(&widths)
                .map(|(cell, w)| format!("{cell:<w$}"))
                .collect::<Vec<_>>()
                .join("  ")
                .trim_end()
                .to_owned()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use palisade_client::SessionEntry;

    use super::*;

    /// Goal: the sessions table lines up, shows `-` for what is unknown or empty, and
    /// lists scopes comma-separated. Method: render two sessions.
    #[test]
    fn sessions_render_as_an_aligned_table() {
        let list = SessionList {
            sessions: vec![
                SessionEntry {
                    id: "s-1".into(),
                    ttl_ms: 10_000,
                    owner: Some("writer-app".into()),
                    holds: vec!["jobs".into(), "mail".into()],
                    waits: vec![],
                    expires_in_ms: Some(9_120),
                },
                SessionEntry {
                    id: "s-22".into(),
                    ttl_ms: 1_000,
                    owner: None,
                    holds: vec![],
                    waits: vec!["jobs".into()],
                    expires_in_ms: None,
                },
            ],
        };
        assert_eq!(
            render_sessions(&list),
            "ID    TTL_MS  EXPIRES_IN_MS  OWNER       HOLDS      WAITS\n\
             s-1   10000   9120           writer-app  jobs,mail  -\n\
             s-22  1000    -              -           -          jobs"
        );
    }

    /// Goal: scope names are checked before anything is sent, with the rule in the
    /// message. Method: good and bad names.
    #[test]
    fn scopes_are_checked_up_front() {
        assert_eq!(parse_scope("nightly.report").unwrap(), "nightly.report");
        for bad in ["", "..", ".", "a b", "a/b", &"x".repeat(129)] {
            assert!(parse_scope(bad).is_err(), "{bad:?}");
        }
    }
}
