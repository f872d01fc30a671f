//! The `--sessions` demo's worker (`palisade demo-session-worker`, hidden): a client that
//! is not a raft member. It opens a session on the cluster, campaigns for one named scope,
//! and, while it holds the scope, runs the same jobs as the default demo's worker: each
//! takes the grant's token, works for a while, then writes a ledger entry through the
//! proxy with that token, its proof, and the scope in `Fencing-Scope`.
//!
//! It checks its session before each job, not between the job's start and its write: a
//! pause there is the case fencing exists for. Once a write is rejected as stale, or its
//! session is lost, it says so and stops.
//!
//! It reports on stdout, one JSON line per event: the default worker's [`Event`]s for its
//! jobs, and [`SessionEvent`]s for its session.

use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use clap::builder::RangedU64ValueParser;
use palisade_client::{ClientError, FencedClient, FencedRequest, Session, StaticToken};
use palisade_protocol::process::WORKER_READY_LINE;
use palisade_protocol::scopes::{SESSION_TTL_MS_MAX, SESSION_TTL_MS_MIN};
use serde::{Deserialize, Serialize};

use super::worker::{Event, JOB_MS, LEDGER_PREFIX, SEQ_HEADER, WRITER_HEADER};
use crate::Failure;
use crate::client_trust::TlsFlags;
use crate::scope_cmds::{campaign_until_held, cleanup_lost, parse_scope};

/// How long each campaign waits while another session holds the scope before the worker
/// campaigns again: long enough that a waiter asks rarely, short against the demo's
/// step timeout so that a lost answer costs little.
const CAMPAIGN_EACH: Duration = Duration::from_secs(10);

/// Run one worker of `palisade demo --sessions`.
#[derive(Args)]
pub(crate) struct SessionWorkerArgs {
    /// The cluster's node API base URLs, comma-separated or repeated.
    #[arg(long = "node", value_delimiter = ',', required = true)]
    nodes: Vec<String>,
    /// The proxy's base URL.
    #[arg(long)]
    proxy: String,
    /// This worker's name, used in ledger keys and sent as `X-Writer`.
    #[arg(long)]
    name: String,
    /// The named scope to hold (sent as `Fencing-Scope` with every write).
    #[arg(long, value_parser = parse_scope)]
    scope: String,
    /// The session's TTL in milliseconds.
    #[arg(long, value_parser = RangedU64ValueParser::<u64>::new().range(SESSION_TTL_MS_MIN..=SESSION_TTL_MS_MAX))]
    ttl_ms: u64,
    /// Milliseconds a job works between taking its token and writing.
    #[arg(long, default_value_t = JOB_MS)]
    job_ms: u64,
    /// TLS for an https node API (a secure cluster): its CA and a client certificate.
    #[command(flatten)]
    tls: TlsFlags,
}

/// What a session worker reports about its session, one JSON object per line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "kebab-case")]
pub(crate) enum SessionEvent {
    /// The leader opened the session.
    Opened {
        /// Its id.
        session: String,
        /// Its TTL.
        ttl_ms: u64,
    },
    /// The session holds the scope, and every announce proxy fences its token.
    Granted {
        /// The scope.
        scope: String,
        /// The grant's token.
        token: u64,
    },
    /// The worker stops: its session is lost, or its token was fenced out.
    Lost {
        /// Why, as a clause (`its session is lost: ...`).
        cause: String,
    },
}

/// One stdout line of a session worker: a job's event or a session's.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub(crate) enum Line {
    /// A job's event, as the default worker prints them.
    Job(Event),
    /// A session's event.
    Session(SessionEvent),
}

fn emit<T: Serialize>(event: &T) {
    if let Ok(line) = serde_json::to_string(event) {
        println!("{line}");
    }
}

pub(crate) async fn run(args: SessionWorkerArgs) -> Result<(), Failure> {
    let tls = args.tls.client_tls(None)?;
    println!("{WORKER_READY_LINE}");
    emit(&Event::Ready);
    let session = Session::builder(args.nodes.clone())
        .tls(tls)
        .ttl(Duration::from_millis(args.ttl_ms))
        .open()
        .await
        .map_err(|e| Failure::Runtime(format!("cannot open a session: {e}")))?;
    emit(&SessionEvent::Opened {
        session: session.id().to_owned(),
        ttl_ms: u64::try_from(session.ttl().as_millis()).unwrap_or(u64::MAX),
    });
    let grant = match campaign_until_held(
        &session,
        &args.scope,
        CAMPAIGN_EACH,
        "demo-session-worker",
    )
    .await
    {
        Ok(grant) => grant,
        Err(ClientError::SessionLost { cause, .. }) => {
            emit(&SessionEvent::Lost {
                cause: format!("its session is lost: {cause}"),
            });
            cleanup_lost(session).await;
            return Ok(());
        }
        Err(e) => {
            return Err(Failure::Runtime(format!(
                "campaign for scope {}: {e}",
                args.scope
            )));
        }
    };
    let token = grant.token;
    emit(&SessionEvent::Granted {
        scope: grant.scope.clone(),
        token,
    });
    let fixed = match grant.proof {
        Some(proof) => StaticToken::with_proof(token, proof),
        None => StaticToken::new(token),
    };
    let client = FencedClient::builder(&args.proxy, Arc::new(fixed))
        .scope(&args.scope)
        .build()
        .map_err(|e| Failure::Usage(e.to_string()))?;
    let cause = jobs(&args, &session, &client, token).await;
    emit(&SessionEvent::Lost { cause });
    cleanup_lost(session).await;
    Ok(())
}

/// Runs jobs with `token` until the session is lost or a write is fenced out; why it
/// stopped.
async fn jobs(
    args: &SessionWorkerArgs,
    session: &Session,
    client: &FencedClient,
    token: u64,
) -> String {
    let mut seq = 0_u64;
    loop {
        // The session is trusted now; what follows (the job, then its write) is not
        // checked again, as a real job would not between each of its steps.
        if let Some(loss) = session.loss() {
            return format!("its session is lost: {loss}");
        }
        seq += 1;
        let key = format!("{LEDGER_PREFIX}{}-{seq:06}", args.name);
        emit(&Event::Holding {
            key: key.clone(),
            seq,
            token,
        });
        tokio::time::sleep(Duration::from_millis(args.job_ms)).await;
        let body = serde_json::json!({"worker": args.name, "seq": seq, "token": token}).to_string();
        let request = FencedRequest::put(&key, body)
            .header(WRITER_HEADER, &args.name)
            .header(SEQ_HEADER, &seq.to_string());
        match client.send(request).await {
            Ok(response) => {
                let revision = serde_json::from_slice::<serde_json::Value>(&response.body)
                    .ok()
                    .and_then(|v| v["revision"].as_u64())
                    .unwrap_or(0);
                emit(&Event::Wrote {
                    key,
                    seq,
                    token,
                    revision,
                });
            }
            Err(ClientError::Fenced { current, .. }) => {
                emit(&Event::Rejected {
                    key,
                    seq,
                    token,
                    current,
                });
                // A newer holder's token is fenced: this grant is over whatever the
                // session says; the session's own verdict names the cause when it knows.
                return session.loss().map_or_else(
                    || format!("its token {token} is fenced out (the proxy's fence is {current}), though its session is still trusted"),
                    |loss| format!("its session is lost: {loss}"),
                );
            }
            Err(e) => emit(&Event::Failed {
                key,
                seq,
                token,
                // As the default worker: a 5xx may come after the upstream applied it.
                indeterminate: e.is_indeterminate()
                    || e.status().is_some_and(|s| s.is_server_error()),
                cause: e.to_string(),
            }),
        }
    }
}
