//! Fifty scopes, three contending client processes each, through `palisade lock`: every
//! write the storage applied is checked with the history checker, scope by scope, and no
//! scope ever has two holders at once.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;

use palisade_cluster::history::{self, History, Outcome};
use palisade_cluster::{ClusterOptions, ClusterSpec};
use palisade_tests::fixtures::first_announced_leader;
use palisade_tests::process::start_cluster;
use palisade_tests::upstream::RecordingUpstream;

/// Generous bound for an election at 20 ms ticks on a loaded 2-core machine.
const ELECTION_TIMEOUT: Duration = Duration::from_secs(20);
/// Scopes contended for.
const SCOPES: usize = 50;
/// Client processes, each going through every scope.
const CLIENTS: usize = 3;
/// Bound for every client process to finish.
const CLIENTS_TIMEOUT: Duration = Duration::from_secs(300);

/// One client process: for each scope of `$SCOPES` (its own order), `palisade lock` it
/// and, while held, write once through the proxy with curl, printing one line
/// `op WRITER SEQ SCOPE TOKEN STATUS START_NS END_NS` (the hold's write and its times).
const CLIENT: &str = r#"seq=0
for scope in $SCOPES; do
  seq=$((seq + 1))
  SEQ=$seq "$PALISADE_BIN" lock "$scope" --node "$NODES" --ttl-ms 5000 -- sh -c '
    t0=$(date +%s%N)
    code=$(curl -s -o /dev/null -w "%{http_code}" -X PUT --data x \
      -H "Fencing-Token: $PALISADE_TOKEN" -H "Fencing-Scope: $PALISADE_SCOPE" \
      -H "X-Writer: $WRITER" -H "X-Seq: $SEQ" "$PROXY/$PALISADE_SCOPE/$WRITER-$SEQ")
    t1=$(date +%s%N)
    echo "op $WRITER $SEQ $PALISADE_SCOPE $PALISADE_TOKEN $code $t0 $t1"' || echo "lock-failed $scope $?"
done"#;

/// One write as a client reported it.
#[derive(Debug, Clone)]
struct Reported {
    writer: String,
    seq: u64,
    scope: String,
    token: u64,
    status: u16,
    start_ns: u128,
    end_ns: u128,
}

fn parse(line: &str) -> Option<Reported> {
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.first() != Some(&"op") || f.len() != 8 {
        return None;
    }
    Some(Reported {
        writer: f[1].to_owned(),
        seq: f[2].parse().ok()?,
        scope: f[3].to_owned(),
        token: f[4].parse().ok()?,
        status: f[5].parse().ok()?,
        start_ns: f[6].parse().ok()?,
        end_ns: f[7].parse().ok()?,
    })
}

/// Goal: with fifty scopes and three client processes contending for each, no scope has
/// two holders at once, each scope's grants carry rising tokens, and the storage's apply
/// log passes every history check per scope (tokens never decrease, every acknowledged
/// write applied once, nothing else applied).
/// Method: three nodes announcing to a proxy in front of a recording upstream; three
/// shell processes each run `palisade lock SCOPE -- (curl PUT)` for the 50 scopes, in
/// three different orders, at once; then the writes they report (with the wall-clock
/// interval of each hold's write) against the upstream's apply log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_scopes_with_three_contending_clients_keep_one_holder_and_rising_tokens() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let upstream = RecordingUpstream::start().await;
    let spec = ClusterSpec {
        nodes: 3,
        node_flags: vec!["--tick-ms".into(), "20".into()],
        proxy_flags: vec![
            "--client-scopes".into(),
            "--upstream".into(),
            upstream.url(),
        ],
    };
    let cluster = start_cluster(dir.path(), &spec, &ClusterOptions::default());
    first_announced_leader(&cluster, ELECTION_TIMEOUT).await;
    let nodes: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| n.api_url("").trim_end_matches('/').to_owned())
        .collect();
    let scopes: Vec<String> = (0..SCOPES).map(|n| format!("scope-{n:02}")).collect();
    let bin = palisade_cluster::palisade_bin().unwrap();
    let mut clients = Vec::new();
    for c in 0..CLIENTS {
        // Each client its own order: rotated, and every other one reversed.
        let mut order = scopes.clone();
        order.rotate_left(c * SCOPES / CLIENTS);
        if c % 2 == 1 {
            order.reverse();
        }
        let child = tokio::process::Command::new("sh")
            .args(["-c", CLIENT])
            .env("PALISADE_BIN", &bin)
            .env("NODES", nodes.join(","))
            .env("PROXY", cluster.proxy.url("").trim_end_matches('/'))
            .env("SCOPES", order.join(" "))
            .env("WRITER", format!("client-{c}"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        clients.push(child);
    }
    let mut reported = Vec::new();
    for client in clients {
        let out = tokio::time::timeout(CLIENTS_TIMEOUT, client.wait_with_output())
            .await
            .expect("every client process finishes")
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(!text.contains("lock-failed"), "a lock failed:\n{text}");
        reported.extend(text.lines().filter_map(parse));
    }
    assert_eq!(
        reported.len(),
        SCOPES * CLIENTS,
        "one write per client and scope"
    );

    // One holder at a time: per scope, the holds' write intervals do not overlap, and the
    // later hold has the higher token.
    let mut by_scope: BTreeMap<&str, Vec<&Reported>> = BTreeMap::new();
    for r in &reported {
        by_scope.entry(&r.scope).or_default().push(r);
    }
    for (scope, holds) in &mut by_scope {
        holds.sort_by_key(|r| r.start_ns);
        for pair in holds.windows(2) {
            assert!(
                pair[0].end_ns <= pair[1].start_ns,
                "scope {scope}: two holders at once: {:?} and {:?}",
                pair[0],
                pair[1]
            );
            assert!(
                pair[1].token > pair[0].token,
                "scope {scope}: tokens rise: {pair:?}"
            );
        }
    }

    let ops = reported
        .iter()
        .map(|r| history::Op {
            scope: r.scope.clone(),
            token: r.token,
            writer: r.writer.clone(),
            seq: r.seq,
            outcome: match r.status {
                200..=299 => Outcome::Ok,
                409 => Outcome::Rejected,
                _ => Outcome::Indeterminate,
            },
        })
        .collect::<Vec<_>>();
    assert!(
        ops.iter().all(|op| op.outcome == Outcome::Ok),
        "every holder's write was admitted: {ops:#?}"
    );
    let applied = upstream.apply_log();
    let report = history::check(&History { ops, applied });
    eprintln!("{}", report.summary());
    assert!(report.holds(), "{report:#?}");
}
