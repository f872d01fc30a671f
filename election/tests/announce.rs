//! Fencing on election against fake proxies (plain sockets answering fixed statuses), on
//! a one-node cluster over the in-memory network. Real time: the announcer does real HTTP.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers may panic

use std::sync::{Arc, Mutex};
use std::time::Duration;

use palisade_election::{Leadership, MemNetwork, Node, NodeConfig, Problem, Scope};
use palisade_protocol::headers::{JSON, PROBLEM_JSON};
use palisade_protocol::{AdvanceRequest, AdvanceResponse};
use redb::backends::InMemoryBackend;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;

/// The proxy's answer to an advance to `token`: the advance response on 200, a
/// stale-token problem (the fence one above `token`) otherwise.
fn answer(status: u16, token: u64) -> String {
    let (content_type, body) = if status == 200 {
        let advanced = AdvanceResponse {
            scope: Scope::new("orders").unwrap(),
            token,
            advanced: true,
        };
        (JSON, serde_json::to_string(&advanced).unwrap())
    } else {
        let problem = Problem::new(
            http::StatusCode::from_u16(status).unwrap(),
            "stale-token",
            "the fence is higher",
        )
        .with_fence("orders", token, token + 1);
        (PROBLEM_JSON, serde_json::to_string(&problem).unwrap())
    };
    format!(
        "HTTP/1.1 {status} X\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// A fake proxy admin API that answers every request with `status` and records the
/// request line and body.
async fn fake_proxy(status: u16) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let record = record.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut got = 0;
                // Read until the JSON body's closing brace; requests here are tiny.
                while !buf[..got].contains(&b'}') {
                    match s.read(&mut buf[got..]).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got += n,
                    }
                }
                let text = String::from_utf8_lossy(&buf[..got]).into_owned();
                let line = text.lines().next().unwrap_or_default().to_owned();
                let body = text
                    .rsplit("\r\n\r\n")
                    .next()
                    .unwrap_or_default()
                    .to_owned();
                record.lock().unwrap().push(format!("{line} {body}"));
                let request: AdvanceRequest = serde_json::from_str(&body).unwrap();
                let reply = answer(status, request.token);
                let _ = s.write_all(reply.as_bytes()).await;
            });
        }
    });
    (url, seen)
}

async fn one_node(announce: Vec<String>) -> palisade_election::NodeHandle {
    let db = Arc::new(
        redb::Database::builder()
            .create_with_backend(InMemoryBackend::new())
            .unwrap(),
    );
    let config = NodeConfig {
        id: 1,
        peers: [(1, "127.0.0.1:7001".to_owned())].into_iter().collect(),
        scope: "orders".into(),
        announce,
        tick_ms: 10,
        ..NodeConfig::default()
    };
    Node::start_in_memory(config, db, &MemNetwork::new())
        .await
        .unwrap()
}

async fn wait_for(
    node: &palisade_election::NodeHandle,
    what: &str,
    cond: impl FnMut(&Leadership) -> bool,
) -> Leadership {
    let mut rx = node.leadership();
    let l = tokio::time::timeout(Duration::from_secs(10), rx.wait_for(cond))
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
        .unwrap();
    *l
}

/// Goal: the established leader posts its token to every proxy's fence of its scope and
/// reports `announced` once all accepted. Method: two fake proxies answering 200.
#[tokio::test]
async fn token_is_announced_to_every_proxy() {
    let (a, seen_a) = fake_proxy(200).await;
    let (b, seen_b) = fake_proxy(200).await;
    let node = one_node(vec![a, format!("{b}/")]).await;
    let l = wait_for(&node, "announced", |l| l.announced).await;
    let token = l.token.expect("announced implies a token");
    for seen in [seen_a, seen_b] {
        let seen = seen.lock().unwrap().clone();
        let advanced_to_token = |r: &String| {
            r.split_once(" HTTP/1.1 ").is_some_and(|(line, body)| {
                line == "POST /v1/fences/orders"
                    && serde_json::from_str::<AdvanceRequest>(body).ok()
                        == Some(AdvanceRequest { token, proof: None })
            })
        };
        assert!(seen.iter().any(advanced_to_token), "{seen:?}");
    }
    node.stop().await.unwrap();
}

/// Goal: a proxy holding a higher fence (409) leaves the token not announced, while the
/// token itself stays usable by the application's choice. Method: one proxy answers 200,
/// the other 409; wait for both to be asked, then check `announced` stays false.
#[tokio::test]
async fn conflict_at_one_proxy_leaves_token_not_announced() {
    let (ok, _) = fake_proxy(200).await;
    let (conflict, seen) = fake_proxy(409).await;
    let node = one_node(vec![ok, conflict]).await;
    let l = wait_for(&node, "a token", |l| l.token.is_some()).await;
    assert!(!l.announced);
    for _ in 0..200 {
        if !seen.lock().unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(seen.lock().unwrap().len(), 1, "409 must not be retried");
    // Nothing will change: sleeping here shows that it does not.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!node.leadership().borrow().announced);
    assert_eq!(seen.lock().unwrap().len(), 1, "409 must not be retried");
    node.stop().await.unwrap();
}

/// Goal: an unreachable proxy is retried until it comes up. Method: announce to a port
/// with nothing listening, then start a fake proxy on it.
#[tokio::test]
async fn unreachable_proxy_is_retried_until_it_accepts() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let node = one_node(vec![format!("http://127.0.0.1:{port}")]).await;
    let l = wait_for(&node, "a token", |l| l.token.is_some()).await;
    assert!(!l.announced);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!node.leadership().borrow().announced);
    let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let mut buf = vec![0u8; 4096];
            let mut got = 0;
            // Read until the JSON body's closing brace; requests here are tiny.
            while !buf[..got].contains(&b'}') {
                match s.read(&mut buf[got..]).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got += n,
                }
            }
            let text = String::from_utf8_lossy(&buf[..got]).into_owned();
            let body = text.rsplit("\r\n\r\n").next().unwrap_or_default();
            let Ok(request) = serde_json::from_str::<AdvanceRequest>(body) else {
                continue;
            };
            let _ = s.write_all(answer(200, request.token).as_bytes()).await;
        }
    });
    wait_for(&node, "announced after the proxy came up", |l| l.announced).await;
    node.stop().await.unwrap();
}
