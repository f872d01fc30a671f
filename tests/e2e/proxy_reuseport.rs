//! `--reuseport-threads`: client connections served by several OS threads, each with its
//! own runtime, fed by the one exclusively bound listener: connections spread across the
//! threads, fences hold across them, a graceful shutdown drains every thread, a second
//! proxy cannot share the port, and a bad value is refused.

use std::time::Duration;

use palisade_tests::process::start_proxy;
use palisade_tests::upstream::RecordingUpstream;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// Fresh connections sent per phase: handed to the two threads in turn, each gets half.
const CONNECTIONS: usize = 40;

/// Sends one PUT with `token` on a new connection that closes after it (so every request
/// is a new connection, placed by the kernel), and returns the status code.
async fn put_on_new_connection(addr: std::net::SocketAddr, path: &str, token: u64) -> u16 {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "PUT {path} HTTP/1.1\r\nHost: {addr}\r\nFencing-Token: {token}\r\n\
         Content-Length: 2\r\nConnection: close\r\n\r\nhi"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("an answer within 10 s")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    answer
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {answer:?}"))
}

/// `CONNECTIONS` PUTs with `token`, each on a new connection, sent at once; their codes.
async fn puts_on_new_connections(addr: std::net::SocketAddr, path: &str, token: u64) -> Vec<u16> {
    let mut puts = tokio::task::JoinSet::new();
    for _ in 0..CONNECTIONS {
        let path = path.to_owned();
        puts.spawn(async move { put_on_new_connection(addr, &path, token).await });
    }
    puts.join_all().await
}

/// The `requests` count of each "data-path thread stopped" line of a text log (whose
/// fields may be coloured with ANSI escapes, which are removed first).
fn requests_per_thread(log: &str) -> Vec<u64> {
    let plain = palisade_cluster::without_ansi(log);
    plain
        .lines()
        .filter(|line| line.contains("data-path thread stopped"))
        .map(|line| {
            line.split_whitespace()
                .find_map(|field| field.strip_prefix("requests="))
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("no requests= in {line:?}"))
        })
        .collect()
}

/// Goal: with `--reuseport-threads 2` both threads serve connections, and the fence is
/// one for all of them: after token 10 is admitted, a lower token is refused with 409 on
/// every connection, whichever thread accepted it, and the equal token admitted.
/// Method: one write with token 10, then `CONNECTIONS` new connections with token 9 and
/// as many with token 10; SIGTERM, and the threads' closing log lines must each count
/// some requests, together all of them.
#[tokio::test]
async fn reuseport_threads_share_connections_and_fences() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let upstream = RecordingUpstream::start().await;
    let mut proxy = start_proxy(
        dir.path(),
        &["--upstream", &upstream.url(), "--reuseport-threads", "2"],
    );
    let addr = proxy.addr;
    assert_eq!(put_on_new_connection(addr, "/k", 10).await, 200);
    let lower: Vec<u16> = puts_on_new_connections(addr, "/k", 9).await;
    assert!(
        lower.iter().all(|&s| s == 409),
        "a lower token is refused on every connection: {lower:?}"
    );
    let equal: Vec<u16> = puts_on_new_connections(addr, "/k", 10).await;
    assert!(
        equal.iter().all(|&s| s == 200),
        "the equal token is admitted on every connection: {equal:?}"
    );
    assert_eq!(upstream.applied().len(), 1 + CONNECTIONS);

    proxy
        .guard
        .signal(nix::sys::signal::Signal::SIGTERM)
        .unwrap();
    let code = tokio::task::spawn_blocking(move || {
        let code = proxy.guard.wait_exit(Duration::from_secs(20)).unwrap();
        (code, proxy.guard.log_text())
    })
    .await
    .unwrap();
    let (code, log) = code;
    assert_eq!(code, Some(0));
    let counts = requests_per_thread(&log);
    assert_eq!(counts.len(), 2, "one closing line per thread: {counts:?}");
    assert!(
        counts.iter().all(|&n| n > 0),
        "both threads served requests: {counts:?}"
    );
    assert_eq!(counts.iter().sum::<u64>(), (1 + 2 * CONNECTIONS) as u64);
}

/// Goal: on SIGTERM a proxy with `--reuseport-threads 2` stops accepting on every socket,
/// finishes the request in flight on its thread, then exits 0. Method: hold a write at
/// the upstream, SIGTERM, wait until connections are refused, release; read the answer
/// and the exit code.
#[tokio::test]
async fn reuseport_threads_drain_in_flight_requests_on_shutdown() {
    crate::proxy_transport::sigterm_finishes_the_request_in_flight(&["--reuseport-threads", "2"])
        .await;
}

/// Goal: a second proxy cannot serve the port of one with `--reuseport-threads`: it would
/// serve some of the clients with its own fence and admit tokens the first refuses (as
/// it did when each thread bound its own `SO_REUSEPORT` socket: measured, token 3
/// admitted by the second after the first's fence was 5). Method: start one proxy with
/// 2 threads, then a second on its address with 2 threads and its own data directory;
/// the second must exit with an error naming the address within 20 s, and every write
/// with a lower token through the port must still be refused.
#[tokio::test]
async fn a_second_proxy_cannot_share_the_port() {
    let bin = crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let upstream = RecordingUpstream::start().await;
    let proxy = start_proxy(
        dir.path(),
        &["--upstream", &upstream.url(), "--reuseport-threads", "2"],
    );
    let addr = proxy.addr;
    assert_eq!(put_on_new_connection(addr, "/k", 5).await, 200);
    let mut second = std::process::Command::new(bin)
        .args([
            "proxy",
            "--listen",
            &addr.to_string(),
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .arg("--data-dir")
        .arg(dir.path().join("second"))
        .args(["--upstream", &upstream.url(), "--reuseport-threads", "2"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = second.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = second.kill();
            let _ = second.wait();
            panic!("a second proxy started on {addr}, which the first one serves");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut second.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success(), "the second proxy failed: {stderr}");
    assert!(
        stderr.contains(&addr.to_string()),
        "the error names the address: {stderr}"
    );
    let lower = puts_on_new_connections(addr, "/k", 3).await;
    assert!(
        lower.iter().all(|&s| s == 409),
        "the port is the first proxy's alone: {lower:?}"
    );
    drop(proxy);
}

/// Goal: a thread count above the maximum is refused at start with a message naming the
/// field and the maximum. Method: run `palisade proxy --reuseport-threads 257`; read its
/// exit status and stderr.
#[test]
fn reuseport_threads_above_the_maximum_are_refused() {
    let bin = crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let output = std::process::Command::new(bin)
        .args([
            "proxy",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args(["--reuseport-threads", "257"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "refused: {stderr}");
    assert!(
        stderr.contains("reuseport_threads") && stderr.contains("256"),
        "the message names the field and the maximum: {stderr}"
    );
}
