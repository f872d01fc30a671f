//! The reset against writes in flight: an upstream that holds requests shows that a
//! reset waits for them.

use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;

use crate::harness::{ADMIN_TOKEN, Harness, Key, Setup, problem};

/// An upstream that holds each request until the test releases it, and reports each
/// request it receives.
struct HeldUpstream {
    url: String,
    received: tokio::sync::mpsc::UnboundedReceiver<()>,
    release: Arc<tokio::sync::Semaphore>,
}

impl HeldUpstream {
    async fn start() -> Self {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (tx, received) = tokio::sync::mpsc::unbounded_channel();
        let release = Arc::new(tokio::sync::Semaphore::new(0));
        let gate = Arc::clone(&release);
        tokio::spawn(async move {
            loop {
                let (mut socket, _) = listener.accept().await.unwrap();
                let (tx, gate) = (tx.clone(), Arc::clone(&gate));
                tokio::spawn(async move {
                    // The request head and its small body arrive together; one read of
                    // up to 64 KiB takes the whole test request.
                    let mut buffer = vec![0u8; 64 * 1024];
                    let mut read = 0;
                    while !buffer[..read].windows(7).any(|w| w == b"payload") {
                        let n = socket.read(&mut buffer[read..]).await.unwrap();
                        if n == 0 {
                            return;
                        }
                        read += n;
                    }
                    tx.send(()).unwrap();
                    gate.acquire().await.unwrap().forget();
                    let reply =
                        "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok";
                    socket.write_all(reply.as_bytes()).await.unwrap();
                });
            }
        });
        Self {
            url,
            received,
            release,
        }
    }

    async fn wait_received(&mut self) {
        tokio::time::timeout(Duration::from_secs(10), self.received.recv())
            .await
            .expect("the upstream received the write")
            .unwrap();
    }
}

/// Goal: a reset waits for the scope's writes in flight: while one is held at the
/// upstream it does not complete; past the barrier timeout it answers 503 and changes
/// nothing; once the write is answered, it proceeds.
/// Method: an upstream that holds requests; hold a write, reset (503 after the 1 s
/// barrier timeout, fence unchanged), release; hold another, reset in a task, show it
/// has not finished while the write is held (a negative check, so a fixed watch), then
/// release and await the reset.
#[tokio::test]
async fn reset_waits_for_writes_in_flight() {
    let key = Key::generate();
    let mut upstream = HeldUpstream::start().await;
    let h = Arc::new(
        Harness::start(Setup {
            upstream: Some(upstream.url.clone()),
            barrier_timeout_ms: Some(1_000),
            ..Setup::secured(&key)
        })
        .await,
    );
    let proof = key.proof("default", 5);
    let held = tokio::spawn(h.put("/k", 5, Some(&proof)).send());
    upstream.wait_received().await;
    let body = r#"{"token":2,"reason":"test: reset under load"}"#;
    let timed_out = h
        .reset("default", body)
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await;
    let p = problem(
        timed_out.unwrap(),
        StatusCode::SERVICE_UNAVAILABLE,
        "barrier-timeout",
    )
    .await;
    assert!(p.detail.contains("unchanged at 5"), "{p}");
    assert_eq!(h.fence("default").await, 5);
    upstream.release.add_permits(1);
    assert_eq!(held.await.unwrap().unwrap().status(), StatusCode::OK);

    // Again, but released within the timeout.
    let held = tokio::spawn(h.put("/k", 5, Some(&proof)).send());
    upstream.wait_received().await;
    let resetting = tokio::spawn(h.reset("default", body).bearer_auth(ADMIN_TOKEN).send());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !resetting.is_finished(),
        "the reset did not wait for the write"
    );
    assert_eq!(h.fence("default").await, 5);
    upstream.release.add_permits(1);
    assert_eq!(held.await.unwrap().unwrap().status(), StatusCode::OK);
    let reset = resetting.await.unwrap().unwrap();
    assert_eq!(reset.status(), StatusCode::OK);
    assert_eq!(h.fence("default").await, 2);
    Arc::into_inner(h).unwrap().stop().await;
}
