//! What the topics share: node configurations and databases, waits on a node's
//! leadership, a fake proxy admin API, token keys, and hand-made peer frames.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use palisade_cluster::wait;
use palisade_election::{Leadership, MemNetwork, Node, NodeConfig, NodeHandle, Problem, Scope};
use palisade_protocol::headers::{JSON, PROBLEM_JSON};
use palisade_protocol::proof::proof_message;
use palisade_protocol::{AdvanceRequest, AdvanceResponse};
use prost::Message as _;
use protobuf::Message as _;
use raft::eraftpb::{Message, MessageType};
use redb::backends::InMemoryBackend;
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair as _, UnparsedPublicKey};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;

/// The scope of every node that names one.
pub const SCOPE: &str = "orders";
/// Longest wait for a leader, a token or an announcement (virtual time where the clock
/// is paused): many election timeouts of the slowest ticks used here.
pub const SETTLE_TIMEOUT: Duration = Duration::from_secs(20);

/// A redb database in memory, for one node.
pub fn memory_db() -> Arc<redb::Database> {
    Arc::new(
        redb::Database::builder()
            .create_with_backend(InMemoryBackend::new())
            .unwrap(),
    )
}

/// Node `id` of the voters `ids`, with well-formed peer addresses (the in-memory network
/// does not use them) and the defaults otherwise.
pub fn config(id: u64, ids: &[u64]) -> NodeConfig {
    NodeConfig {
        id,
        peers: ids
            .iter()
            .map(|&p| (p, format!("127.0.0.1:{}", 7000 + p)))
            .collect(),
        ..NodeConfig::default()
    }
}

/// Starts node `config.id` on `net` with a fresh in-memory database.
pub async fn start_in_memory(config: NodeConfig, net: &MemNetwork) -> NodeHandle {
    Node::start_in_memory(config, memory_db(), net)
        .await
        .unwrap()
}

/// A single node (id 1) of scope [`SCOPE`] that announces to `announce`, ticking every
/// 10 ms on its own in-memory network.
pub async fn one_node(announce: Vec<String>) -> NodeHandle {
    let config = NodeConfig {
        scope: SCOPE.into(),
        announce,
        tick_ms: 10,
        ..config(1, &[1])
    };
    start_in_memory(config, &MemNetwork::new()).await
}

/// `n` voters on free loopback ports: bound, read, released. Another process could take
/// a port before its node binds it; on a test machine that is rare enough.
pub fn loopback_peers(n: u64) -> BTreeMap<u64, String> {
    (1..=n)
        .map(|id| {
            (
                id,
                format!("127.0.0.1:{}", palisade_cluster::free_port().unwrap()),
            )
        })
        .collect()
}

/// Waits until `node`'s leadership satisfies `cond`, within [`SETTLE_TIMEOUT`]; that
/// leadership. It waits on the node's watch channel rather than polling, so the moment it
/// returns is the moment of the change: the lease tests time the release from it, to the
/// millisecond of virtual time.
pub async fn leadership(
    node: &NodeHandle,
    what: &str,
    cond: impl FnMut(&Leadership) -> bool,
) -> Leadership {
    let mut rx = node.leadership();
    let l = tokio::time::timeout(SETTLE_TIMEOUT, rx.wait_for(cond))
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
        .unwrap();
    *l
}

/// Waits until one of `nodes` holds a token that `accept` takes, within
/// [`SETTLE_TIMEOUT`]; that node's id and leadership.
pub async fn token_holder<'a>(
    nodes: impl IntoIterator<Item = &'a NodeHandle> + Clone,
    accept: impl Fn(&Leadership) -> bool,
) -> (u64, Leadership) {
    wait::poll(SETTLE_TIMEOUT, || {
        let found = nodes.clone().into_iter().find_map(|n| {
            let l = *n.leadership().borrow();
            (l.token.is_some() && accept(&l)).then_some((n.id(), l))
        });
        std::future::ready(found)
    })
    .await
    .expect("timed out waiting for a node to hold a token")
}

/// A fake proxy admin API: each request it receives, whole, as text.
pub type Seen = Arc<Mutex<Vec<String>>>;

/// Starts a fake proxy admin API on a free port that answers every advance with `status`
/// and records each request; its URL and the record.
pub async fn fake_proxy(status: u16) -> (String, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    (url, serve_fake_proxy(listener, status))
}

/// Serves a fake proxy admin API on `listener`, as [`fake_proxy`] does.
pub fn serve_fake_proxy(listener: TcpListener, status: u16) -> Seen {
    let seen = Seen::default();
    let record = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let record = record.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let mut got = 0;
                // Read until the JSON body's closing brace; requests here are small.
                while !buf[..got].contains(&b'}') {
                    match s.read(&mut buf[got..]).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got += n,
                    }
                }
                let text = String::from_utf8_lossy(&buf[..got]).into_owned();
                let Some(request) = advance_of(&text) else {
                    return;
                };
                record.lock().unwrap().push(text);
                let reply = answer(status, request.token);
                let _ = s.write_all(reply.as_bytes()).await;
            });
        }
    });
    seen
}

/// The advance a recorded request carries in its body, if it is one.
pub fn advance_of(request: &str) -> Option<AdvanceRequest> {
    let body = request.rsplit("\r\n\r\n").next().unwrap_or_default();
    serde_json::from_str(body).ok()
}

/// The proxy's answer to an advance to `token`: the advance response on 200, a
/// stale-token problem (the fence one above `token`) otherwise.
fn answer(status: u16, token: u64) -> String {
    let (content_type, body) = if status == 200 {
        let advanced = AdvanceResponse {
            scope: Scope::new(SCOPE).unwrap(),
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
        .with_fence(SCOPE, token, token + 1);
        (PROBLEM_JSON, serde_json::to_string(&problem).unwrap())
    };
    format!(
        "HTTP/1.1 {status} X\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// Writes a fresh Ed25519 signing key to `dir/token.key` (PEM `PRIVATE KEY`, as
/// `palisade keys generate` does); its path and the raw public key.
pub fn token_key(dir: &Path) -> (PathBuf, Vec<u8>) {
    let rng = ring::rand::SystemRandom::new();
    let doc = Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
    let public = Ed25519KeyPair::from_pkcs8(doc.as_ref())
        .unwrap()
        .public_key()
        .as_ref()
        .to_vec();
    let body = base64::engine::general_purpose::STANDARD.encode(doc.as_ref());
    let path = dir.join("token.key");
    std::fs::write(
        &path,
        format!("-----BEGIN PRIVATE KEY-----\n{body}\n-----END PRIVATE KEY-----\n"),
    )
    .unwrap();
    (path, public)
}

/// Whether `proof` (raw signature bytes) proves `token` in [`SCOPE`] under `public`.
pub fn verifies(public: &[u8], token: u64, proof: &[u8]) -> bool {
    UnparsedPublicKey::new(&ED25519, public)
        .verify(&proof_message(SCOPE, token), proof)
        .is_ok()
}

/// Whether an encoded proof (base64url, as the wire carries it) proves `token`.
pub fn verifies_encoded(public: &[u8], token: u64, proof: &str) -> bool {
    palisade_protocol::proof::decode_proof(proof.as_bytes())
        .is_ok_and(|signature| verifies(public, token, &signature))
}

/// The first frame of a peer connection, as the transport defines it (fields 1-3).
#[derive(Clone, PartialEq, prost::Message)]
struct Hello {
    #[prost(uint32, tag = "1")]
    protocol: u32,
    #[prost(uint64, tag = "2")]
    from: u64,
    #[prost(uint64, tag = "3")]
    to: u64,
}

/// Every later frame: routing and a protobuf raft message.
#[derive(Clone, PartialEq, prost::Message)]
struct PeerFrame {
    #[prost(uint64, tag = "1")]
    from: u64,
    #[prost(uint64, tag = "2")]
    to: u64,
    #[prost(bytes = "vec", tag = "3")]
    payload: Vec<u8>,
}

/// `body` behind its u32 big-endian length, as a peer writes it.
fn frame(body: &[u8]) -> Vec<u8> {
    let mut out = u32::try_from(body.len()).unwrap().to_be_bytes().to_vec();
    out.extend_from_slice(body);
    out
}

/// The hello frame (protocol 1) of a connection from `from` to `to`.
pub fn hello_frame(from: u64, to: u64) -> Vec<u8> {
    frame(
        &Hello {
            protocol: 1,
            from,
            to,
        }
        .encode_to_vec(),
    )
}

/// A frame carrying a raft message of `kind` from `from` to `to`, with `term` and
/// `commit`.
pub fn raft_frame(kind: MessageType, from: u64, to: u64, term: u64, commit: u64) -> Vec<u8> {
    let mut m = Message::default();
    m.set_msg_type(kind);
    (m.from, m.to, m.term, m.commit) = (from, to, term, commit);
    let payload = m.write_to_bytes().unwrap();
    frame(&PeerFrame { from, to, payload }.encode_to_vec())
}

/// A node's TLS settings presenting `name`'s certificate of `pki`.
pub fn node_tls(pki: &palisade_cluster::Pki, name: &str) -> palisade_election::NodeTls {
    palisade_election::NodeTls {
        cert: pki.cert(name),
        key: pki.key(name),
        ca: pki.ca(),
    }
}
