//! The demo's worker (`palisade demo-worker`, hidden): it runs a job only while its node
//! is the established leader. Each job charges one subscription: it reads the token,
//! works for a while, then writes a ledger entry with that token through the proxy.
//!
//! It reports on stdout, one JSON event per line, so the demo can follow it.

use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use palisade_client::{ClientError, FencedClient, FencedRequest, NodeApiSource, TokenSource};
pub(crate) use palisade_cluster::worker::{Event, LEDGER_PREFIX, SEQ_HEADER, WRITER_HEADER};
use palisade_protocol::process::WORKER_READY_LINE;

use crate::Failure;
use crate::client_trust::TlsFlags;

/// How long one job works between reading its token and writing, by default: the window
/// in which a GC pause makes a leader stale.
pub(super) const JOB_MS: u64 = 300;

/// Run one demo worker (used by `palisade demo` and the fault tests).
#[derive(Args)]
pub(crate) struct WorkerArgs {
    /// The node's API base URL.
    #[arg(long)]
    node: String,
    /// The proxy's base URL.
    #[arg(long)]
    proxy: String,
    /// This worker's name, used in ledger keys and sent as `X-Writer`.
    #[arg(long)]
    name: String,
    /// Milliseconds a job works between reading its token and writing.
    #[arg(long, default_value_t = JOB_MS)]
    job_ms: u64,
    /// Retries of a failed write (the client's default when absent).
    #[arg(long)]
    retries: Option<u32>,
    /// TLS for an https node API (a secure cluster): its CA and a client certificate.
    #[command(flatten)]
    tls: TlsFlags,
}

fn emit(event: &Event) {
    if let Ok(line) = serde_json::to_string(event) {
        println!("{line}");
    }
}

pub(crate) async fn run(args: WorkerArgs) -> Result<(), Failure> {
    let tls = args.tls.client_tls(None)?;
    let source = Arc::new(
        NodeApiSource::start_with_tls(&args.node, &tls)
            .map_err(|e| Failure::Usage(e.to_string()))?,
    );
    println!("{WORKER_READY_LINE}");
    emit(&Event::Ready);
    let mut seq = 0_u64;
    loop {
        // Wait until the node is the established leader; take its token, and its proof
        // when the node signs tokens.
        let leadership = source.wait_for_leader().await;
        let Some(token) = leadership.write_token() else {
            continue;
        };
        let proof = leadership.write_proof().map(str::to_owned);
        seq += 1;
        let key = format!("{LEDGER_PREFIX}{}-{seq:06}", args.name);
        emit(&Event::Holding {
            key: key.clone(),
            seq,
            token,
        });
        // The job: charging the subscription takes a while. A pause here, after the token
        // was read and before the write, is exactly the case fencing exists for.
        tokio::time::sleep(Duration::from_millis(args.job_ms)).await;
        let body = serde_json::json!({"worker": args.name, "seq": seq, "token": token}).to_string();
        // The write carries the token the job started with (and its proof), as a real
        // job's would.
        let fixed = match proof {
            Some(proof) => palisade_client::StaticToken::with_proof(token, proof),
            None => palisade_client::StaticToken::new(token),
        };
        let mut builder = FencedClient::builder(&args.proxy, Arc::new(fixed));
        if let Some(retries) = args.retries {
            builder = builder.retries(retries);
        }
        let client = builder.build().map_err(|e| Failure::Usage(e.to_string()))?;
        let request = FencedRequest::put(&key, body)
            .header(WRITER_HEADER, &args.name)
            .header(SEQ_HEADER, &seq.to_string());
        let event = match client.send(request).await {
            Ok(response) => {
                let revision = serde_json::from_slice::<serde_json::Value>(&response.body)
                    .ok()
                    .and_then(|v| v["revision"].as_u64())
                    .unwrap_or(0);
                Event::Wrote {
                    key,
                    seq,
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
                    seq,
                    token,
                    current,
                }
            }
            Err(ClientError::NotLeader { .. }) => Event::NotLeader { key, seq, token },
            Err(e) => Event::Failed {
                key,
                seq,
                token,
                // A 5xx may come after the upstream applied the write (a broken upstream
                // answer, a proxy failing after forwarding): count it as unknown.
                indeterminate: e.is_indeterminate()
                    || e.status().is_some_and(|s| s.is_server_error()),
                cause: e.to_string(),
            },
        };
        emit(&event);
    }
}
