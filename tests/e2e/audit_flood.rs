//! A flood of requests without a proof against a `palisade proxy` with `--token-pub` and
//! `--audit-log`: the stale write made before it is still in the audit log and on the
//! status page afterwards, and every refusal of the flood is accounted for.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use http::{Method, StatusCode};
use palisade_cluster::{ProxyProcess, wait};
use palisade_protocol::headers::{FENCING_TOKEN, FENCING_TOKEN_PROOF};
use palisade_protocol::status::ProxyStatus;
use palisade_protocol::{AuditRecord, DEFAULT_SCOPE};
use palisade_tests::client::{Answer, send};
use palisade_tests::trust::TokenKeys;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// Requests without a proof in the flood.
const FLOOD: u64 = 1_000_000;
/// Keep-alive connections the flood is spread over.
const FLOOD_CONNECTIONS: u64 = 8;
/// Requests written at once on one connection before reading their answers.
const PIPELINE_DEPTH: u64 = 512;
/// The audit files' size limit in the test: small, so that a flood written in full
/// would rotate every file many times over.
const AUDIT_BYTES_MAX: u64 = 1024 * 1024;
/// Time the audit writer gets to put its summaries on disk after the flood.
const AUDIT_TIMEOUT: Duration = Duration::from_secs(20);

/// Every record of the audit log at `file` (its noise file included), oldest first, as
/// `palisade audit FILE --json` prints them.
fn audit_records(file: &Path) -> Vec<AuditRecord> {
    let out = Command::new(crate::PALISADE)
        .arg("audit")
        .arg(file)
        .arg("--json")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "palisade audit: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Whether `r` is the stale write of the test: token 4 refused by the fence at 5.
fn is_the_stale_write(r: &AuditRecord) -> bool {
    r.event == "rejection"
        && r.reason.as_deref() == Some("stale-token")
        && (r.presented, r.current) == (Some(4), Some(5))
}

/// A PUT of `token` with `proof`.
async fn put_proven(proxy: &ProxyProcess, token: u64, proof: &str) -> Answer {
    let (token_name, proof_name) = (FENCING_TOKEN, FENCING_TOKEN_PROOF);
    let token = token.to_string();
    let headers = [
        (token_name.as_str(), token.as_str()),
        (proof_name.as_str(), proof),
    ];
    send(Method::PUT, &proxy.url("/ledger"), &headers, "w").await
}

/// Sends `count` PUTs with a token and no proof on one keep-alive connection to `addr`,
/// [`PIPELINE_DEPTH`] at a time, and returns how many answers had each status.
async fn flood_connection(addr: std::net::SocketAddr, count: u64) -> Vec<(u16, u64)> {
    let request =
        b"PUT /flood HTTP/1.1\r\nHost: proxy\r\nFencing-Token: 9\r\nContent-Length: 0\r\n\r\n";
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let mut statuses: Vec<(u16, u64)> = Vec::new();
    let mut buf: Vec<u8> = Vec::with_capacity(1 << 20);
    let mut sent = 0;
    while sent < count {
        let batch = PIPELINE_DEPTH.min(count - sent);
        let bytes = request.repeat(usize::try_from(batch).unwrap());
        stream.write_all(&bytes).await.unwrap();
        sent += batch;
        // Answers are parsed from `at` on, and the buffer cut once per batch.
        let (mut answered, mut at) = (0, 0);
        while answered < batch {
            if let Some((status, len)) = next_response(&buf[at..]) {
                at += len;
                answered += 1;
                match statuses.iter_mut().find(|(s, _)| *s == status) {
                    Some((_, n)) => *n += 1,
                    None => statuses.push((status, 1)),
                }
            } else {
                let n = stream.read_buf(&mut buf).await.unwrap();
                assert!(
                    n > 0,
                    "the proxy closed the connection after {sent} requests"
                );
            }
        }
        buf.drain(..at);
    }
    statuses
}

/// The status and length of the first whole HTTP/1.1 response in `buf`, if there is one
/// (the proxy's refusals carry a `content-length`).
fn next_response(buf: &[u8]) -> Option<(u16, usize)> {
    let head_end = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = std::str::from_utf8(&buf[..head_end]).unwrap();
    let status: u16 = head.get(9..12).unwrap().parse().unwrap();
    let body: usize = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().unwrap())
        })
        .unwrap_or(0);
    (buf.len() >= head_end + body).then_some((status, head_end + body))
}

/// Goal: a flood of requests any client can send without holding a token cannot erase
/// a stale write: after 1,000,000 requests without a proof (each a `missing-proof`
/// refusal) the earlier stale-token rejection is still in the audit log, read by
/// `palisade audit`, and in `GET /v1/status`'s rejections; and nothing of the flood goes
/// unnoticed: the `missing-proof` records written in full plus the counts of the
/// `suppressed` records are exactly the flood.
/// Method: a proxy with `--token-pub`, `--audit-log` and a 1 MiB size limit (the flood
/// written in full would fill hundreds of such files); a proven write at 5, a proven
/// write at 4 (409 stale); then 1,000,000 pipelined PUTs with a token and no proof over
/// 8 keep-alive connections; read the log and the status. The proxy's per-request
/// `proof-rejected` log line is turned off for the run (`RUST_LOG`), so that its stderr
/// does not take a gigabyte of the test's disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proofless_flood_leaves_the_stale_write_in_the_audit_log_and_status() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let keys = TokenKeys::generate(&dir.path().join("keys"));
    let signer = keys.signer();
    let log = dir.path().join("audit.log");
    let log_arg = log.display().to_string();
    let bytes_max = AUDIT_BYTES_MAX.to_string();
    let proxy = ProxyProcess::start_with(
        &dir.path().join("proxy"),
        "127.0.0.1:0",
        "127.0.0.1:0",
        &[
            "--token-pub",
            keys.public_arg(),
            "--audit-log",
            &log_arg,
            "--audit-log-bytes-max",
            &bytes_max,
        ],
        &[("RUST_LOG", "info,palisade_proxy::service=error")],
    )
    .unwrap();

    let ok = put_proven(&proxy, 5, &signer.prove(DEFAULT_SCOPE, 5)).await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.text());
    let stale = put_proven(&proxy, 4, &signer.prove(DEFAULT_SCOPE, 4)).await;
    assert_eq!(stale.status, StatusCode::CONFLICT, "{}", stale.text());
    wait::poll(AUDIT_TIMEOUT, || async {
        audit_records(&log)
            .iter()
            .any(is_the_stale_write)
            .then_some(())
    })
    .await
    .expect("timed out waiting for the stale write's record");

    let started = Instant::now();
    let per_connection = FLOOD / FLOOD_CONNECTIONS;
    let floods: Vec<_> = (0..FLOOD_CONNECTIONS)
        .map(|_| tokio::spawn(flood_connection(proxy.addr, per_connection)))
        .collect();
    let mut unauthorized = 0;
    for flood in floods {
        for (status, n) in flood.await.unwrap() {
            assert_eq!(status, 401, "{n} answers of {status} in the flood");
            unauthorized += n;
        }
    }
    let took = started.elapsed();
    eprintln!(
        "flood: {unauthorized} requests without a proof in {took:.1?} ({:.0} a second)",
        f64::from(u32::try_from(unauthorized).unwrap()) / took.as_secs_f64()
    );
    assert_eq!(unauthorized, FLOOD);

    // Nothing of the flood went unnoticed: written in full, or counted in a summary.
    let records = wait::poll(AUDIT_TIMEOUT, || async {
        let records = audit_records(&log);
        let full = records
            .iter()
            .filter(|r| r.event == "rejection" && r.reason.as_deref() == Some("missing-proof"))
            .count() as u64;
        let suppressed: u64 = records
            .iter()
            .filter(|r| r.event == "suppressed" && r.reason.as_deref() == Some("missing-proof"))
            .filter_map(|r| r.dropped)
            .sum();
        (full + suppressed == FLOOD).then_some(records)
    })
    .await
    .expect("timed out waiting for the flood's records and summaries to add up");
    let stale_records: Vec<&AuditRecord> =
        records.iter().filter(|r| is_the_stale_write(r)).collect();
    assert_eq!(
        stale_records.len(),
        1,
        "the stale write is still in the log"
    );
    assert!(
        !records.iter().any(|r| r.event == "dropped"),
        "no record was dropped"
    );
    let written = records.len();
    assert!(
        written < 10_000,
        "the flood was written in full ({written} records), not summarised"
    );

    let answer = send(Method::GET, &proxy.admin_url("/v1/status"), &[], "").await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    let status: ProxyStatus = serde_json::from_slice(&answer.body).unwrap();
    assert!(
        status.rejections.iter().any(is_the_stale_write),
        "the stale write is still on the status page: {:?}",
        status.rejections
    );
    assert_eq!(status.rejections_total, FLOOD + 1);
    let audit = status.audit.expect("the audit log's counters");
    assert_eq!(audit.dropped, 0);
    assert!(audit.suppressed > FLOOD / 2, "{audit:?}");
}
