//! The demo's worker (`palisade demo-worker`, hidden): it runs a job only while its node
//! is the established leader. Each job charges one subscription: it reads the token,
//! works for a while, then writes a ledger entry with that token through the proxy.
//!
//! It reports on stdout, one JSON event per line, so the demo can follow it.

use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use palisade_client::{ClientError, FencedClient, NodeApiSource, TokenSource};
use serde::{Deserialize, Serialize};

use crate::Failure;

/// The line a worker prints once it is running.
pub(crate) const READY_LINE: &str = "palisade demo-worker ready";
/// Ledger keys start with this.
pub(crate) const LEDGER_PREFIX: &str = "ledger/";
/// How long one job works between reading its token and writing: the window in which a
/// GC pause makes a leader stale.
const JOB_MS: u64 = 300;

/// Run one demo worker (used by `palisade demo`).
#[derive(Args)]
pub(crate) struct WorkerArgs {
    /// The node's API base URL.
    #[arg(long)]
    node: String,
    /// The proxy's base URL.
    #[arg(long)]
    proxy: String,
    /// This worker's name, used in ledger keys.
    #[arg(long)]
    name: String,
}

/// What a worker reports.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "kebab-case")]
pub(crate) enum Event {
    /// Running.
    Ready,
    /// Started a job holding `token`.
    Holding { token: u64 },
    /// The job's write was accepted.
    Wrote {
        key: String,
        token: u64,
        revision: u64,
    },
    /// The proxy rejected the job's write as stale.
    Rejected {
        key: String,
        token: u64,
        current: u64,
    },
    /// The client refused to send: the token is known to be fenced out.
    NotLeader { key: String, token: u64 },
    /// Anything else.
    Failed {
        key: String,
        token: u64,
        cause: String,
    },
}

fn emit(event: &Event) {
    if let Ok(line) = serde_json::to_string(event) {
        println!("{line}");
    }
}

pub(crate) async fn run(args: WorkerArgs) -> Result<(), Failure> {
    let source =
        Arc::new(NodeApiSource::start(&args.node).map_err(|e| Failure::Usage(e.to_string()))?);
    println!("{READY_LINE}");
    emit(&Event::Ready);
    let mut seq = 0_u64;
    loop {
        // Wait until the node is the established leader; take its token.
        let Some(token) = source.wait_for_leader().await.write_token() else {
            continue;
        };
        seq += 1;
        let key = format!("{LEDGER_PREFIX}{}-{seq:06}", args.name);
        emit(&Event::Holding { token });
        // The job: charging the subscription takes a while. A pause here, after the token
        // was read and before the write, is exactly the case fencing exists for.
        tokio::time::sleep(Duration::from_millis(JOB_MS)).await;
        let body = serde_json::json!({"worker": args.name, "seq": seq, "token": token}).to_string();
        // The write carries the token the job started with, as a real job's would.
        let client = FencedClient::with_token(&args.proxy, token)
            .map_err(|e| Failure::Usage(e.to_string()))?;
        let event = match client.put(&key, body).await {
            Ok(response) => {
                let revision = serde_json::from_slice::<serde_json::Value>(&response.body)
                    .ok()
                    .and_then(|v| v["revision"].as_u64())
                    .unwrap_or(0);
                Event::Wrote {
                    key,
                    token,
                    revision,
                }
            }
            Err(ClientError::Fenced { current, .. }) => {
                // Stop leading on this token: the node's source will offer a token again
                // only once it holds one of at least `current`.
                source.mark_not_leader(current);
                Event::Rejected {
                    key,
                    token,
                    current,
                }
            }
            Err(ClientError::NotLeader { .. }) => Event::NotLeader { key, token },
            Err(e) => Event::Failed {
                key,
                token,
                cause: e.to_string(),
            },
        };
        emit(&event);
    }
}
