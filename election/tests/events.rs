//! The structured log events that tests and tools key on: each carries an `event` field
//! named in `palisade_protocol::process::events`, and the node's durable `term`.
//!
//! A binary of its own: it installs a tracing subscriber for its thread, and tracing
//! caches, per process, which call sites are enabled; nodes of other tests logging in
//! parallel in the same process made it miss events.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers may panic

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use palisade_election::{MemNetwork, Node, NodeConfig};
use palisade_protocol::process::events;
use redb::backends::InMemoryBackend;

/// Collects what the JSON formatter writes.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// The `fields` object of every JSON line.
    fn lines(&self) -> Vec<serde_json::Value> {
        let text = String::from_utf8(self.0.lock().unwrap().clone()).unwrap();
        text.lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["fields"].clone())
            .collect()
    }
}

/// Goal: a node that starts and becomes the established leader logs `node-started`,
/// `leadership-changed` (became leader) and `leader-established` events, each with the
/// term, and the established event's term is the token.
/// Method: a one-node cluster in memory, logging JSON into a buffer; wait with a deadline
/// for its token, stop it, read the events back.
#[tokio::test(flavor = "current_thread")]
async fn start_and_election_log_events_with_their_term() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .json()
        .with_writer(move || writer.clone())
        .with_max_level(tracing::Level::INFO)
        .finish();
    // The runtime has one thread, so every task of the node logs through this subscriber.
    let _guard = tracing::subscriber::set_default(subscriber);
    let db = Arc::new(
        redb::Database::builder()
            .create_with_backend(InMemoryBackend::new())
            .unwrap(),
    );
    let config = NodeConfig {
        id: 1,
        peers: [(1, "127.0.0.1:7001".to_owned())].into_iter().collect(),
        tick_ms: 10,
        ..NodeConfig::default()
    };
    let node = Node::start_in_memory(config, db, &MemNetwork::new())
        .await
        .unwrap();
    let mut rx = node.leadership();
    let token = tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|l| l.token.is_some()))
        .await
        .expect("the node became the established leader in time")
        .unwrap()
        .token
        .unwrap();
    node.stop().await.unwrap();

    let lines = captured.lines();
    let with_event = |name: &str| -> Vec<&serde_json::Value> {
        lines.iter().filter(|f| f["event"] == name).collect()
    };
    let started = with_event(events::NODE_STARTED);
    assert_eq!(started.len(), 1, "{lines:#?}");
    assert_eq!(started[0]["term"], 0);
    let changed = with_event(events::LEADERSHIP_CHANGED);
    assert!(
        changed
            .iter()
            .any(|f| f["message"] == "became leader" && f["term"] == token),
        "{changed:#?}"
    );
    assert!(changed.iter().all(|f| f["term"].is_u64()), "{changed:#?}");
    let established = with_event(events::LEADER_ESTABLISHED);
    assert_eq!(established.len(), 1, "{lines:#?}");
    assert_eq!(established[0]["term"], token);
    assert_eq!(established[0]["token"], token);
    assert!(
        lines
            .iter()
            .filter(|f| f["message"] == "token withdrawn")
            .all(|f| f.get("event").is_none()),
        "a withdrawal's term may not be durable, so it is never an event"
    );
}
