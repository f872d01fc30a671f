//! Reading inbound peer connections: framing limits, hostile input, identity.

use std::io;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::SinkExt as _;
use prost::Message as _;
use raft::eraftpb::{Message, MessageType};
use tokio::io::AsyncWriteExt as _;
use tokio::sync::mpsc;
use tokio_util::codec::FramedWrite;
use tokio_util::sync::CancellationToken;

use super::reader::{ReaderCtx, read_frames};
use super::registry::Registry;
use super::wire::{HELLO_BYTES_MAX, peer_codec};
use crate::config::FRAME_BYTES_MAX;
use crate::transport::faults::LinkFaults;
use crate::transport::{
    Hello, Inbound, PROTOCOL_VERSION, PeerFrame, PeerInbox, ScoreFrame, encode_raft,
};

/// `body` behind its u32 big-endian length, as a peer writes it.
fn frame(body: &[u8]) -> Vec<u8> {
    let mut out = u32::try_from(body.len()).unwrap().to_be_bytes().to_vec();
    out.extend_from_slice(body);
    out
}

fn hello() -> Vec<u8> {
    let hello = Hello {
        protocol: PROTOCOL_VERSION,
        from: 2,
        to: 1,
    };
    frame(&hello.encode_to_vec())
}

fn heartbeat() -> Vec<u8> {
    let mut msg = Message::default();
    msg.set_msg_type(MessageType::MsgHeartbeat);
    msg.from = 2;
    msg.to = 1;
    msg.term = 3;
    let frame_body = PeerFrame {
        from: 2,
        to: 1,
        payload: encode_raft(&msg).unwrap(),
        score: None,
    };
    frame(&frame_body.encode_to_vec())
}

/// Reads `bytes` as node 1's inbound connection from node 2, then the peer closes.
/// Returns how the reader ended and the terms of the messages it delivered.
async fn read(bytes: &[u8]) -> (io::Result<()>, Vec<u64>) {
    let (ended, msgs) = read_msgs(bytes).await;
    let terms = msgs
        .into_iter()
        .map_while(|m| match m {
            Inbound::Raft(msg) => Some(msg.term),
            Inbound::Score { .. } => None,
        })
        .collect();
    (ended, terms)
}

/// Node 1's reader of a connection from node 2, delivering into `tx`.
fn reader(tx: mpsc::Sender<Inbound>, tls: bool) -> ReaderCtx {
    ReaderCtx {
        id: 1,
        known: vec![1, 2],
        inbox: PeerInbox::new(tx),
        faults: Arc::new(LinkFaults::new(false, 1, [1, 2])),
        shutdown: CancellationToken::new(),
        current: Registry::default(),
        tls,
    }
}

/// Like [`read`], returning every message delivered to the inbox.
async fn read_msgs(bytes: &[u8]) -> (io::Result<()>, Vec<Inbound>) {
    let (tx, mut rx) = mpsc::channel(16);
    let ctx = reader(tx, false);
    let (mut peer, stream) = tokio::io::duplex(64 * 1024);
    peer.write_all(bytes).await.unwrap();
    drop(peer);
    let ended = read_frames(stream, &ctx, None).await;
    let mut msgs = Vec::new();
    while let Ok(msg) = rx.try_recv() {
        msgs.push(msg);
    }
    (ended, msgs)
}

/// A score frame from node 2 to node 1, with `payload` as its raft payload.
fn score_frame(score: Option<f64>, payload: Vec<u8>) -> Vec<u8> {
    let body = PeerFrame {
        from: 2,
        to: 1,
        payload,
        score: Some(ScoreFrame {
            score,
            last_index: 7,
            last_term: 3,
            sent_us: 1_000,
            echo_us: 0,
            echo_held_us: 0,
        }),
    };
    frame(&body.encode_to_vec())
}

/// Goal: a score frame is delivered as one, between raft frames; a score that is not a
/// finite number, or a frame carrying both a score and a raft payload, ends the
/// connection (`InvalidData`, which the listener logs with the reason) and delivers
/// nothing from that frame on.
/// Method: read a good score frame between two heartbeats; then each malformed one
/// before a heartbeat.
#[tokio::test]
async fn score_frames_are_delivered_and_malformed_ones_refused() {
    let good = [
        hello(),
        heartbeat(),
        score_frame(Some(-9.5), Vec::new()),
        heartbeat(),
    ];
    let (ended, msgs) = read_msgs(&good.concat()).await;
    ended.unwrap();
    assert_eq!(msgs.len(), 3);
    match &msgs[1] {
        Inbound::Score { from, frame } => {
            assert_eq!(*from, 2);
            assert_eq!(
                (frame.score, frame.last_index, frame.last_term),
                (Some(-9.5), 7, 3)
            );
        }
        Inbound::Raft(_) => panic!("the second message is the score frame"),
    }
    for bad in [
        score_frame(Some(f64::NAN), Vec::new()),
        score_frame(Some(f64::INFINITY), Vec::new()),
        score_frame(Some(1e13), Vec::new()),
        score_frame(Some(1.0), vec![0x08, 3]),
    ] {
        let (ended, msgs) = read_msgs(&[hello(), bad, heartbeat()].concat()).await;
        let err = ended.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(err.to_string().contains("score"), "{err}");
        assert!(msgs.is_empty());
    }
}

/// Goal: a handshake and a well-formed frame are read and delivered, and a clean close
/// between frames ends the connection without an error.
/// Method: write both into an in-memory stream and close it.
#[tokio::test]
async fn frames_after_the_handshake_are_delivered() {
    let (ended, terms) = read(&[hello(), heartbeat()].concat()).await;
    ended.unwrap();
    assert_eq!(terms, [3]);
}

/// Goal: a frame over the limit is refused from its length alone, before its body is
/// read or buffered: the handshake over its own small limit, a data frame over
/// `FRAME_BYTES_MAX`.
/// Method: announce one byte more than each limit and send no body.
#[tokio::test]
async fn oversized_frames_are_refused() {
    let too_long = |max: usize| u32::try_from(max + 1).unwrap().to_be_bytes().to_vec();
    let (ended, terms) = read(&too_long(HELLO_BYTES_MAX)).await;
    assert_eq!(ended.unwrap_err().kind(), io::ErrorKind::InvalidData);
    assert!(terms.is_empty());
    let (ended, terms) = read(&[hello(), too_long(FRAME_BYTES_MAX)].concat()).await;
    assert_eq!(ended.unwrap_err().kind(), io::ErrorKind::InvalidData);
    assert!(terms.is_empty());
}

/// Goal: a frame cut short by the connection closing is an error, and its partial
/// message is not delivered.
/// Method: send the handshake and a data frame without its last byte, then close.
#[tokio::test]
async fn truncated_frame_is_an_error() {
    let mut bytes = [hello(), heartbeat()].concat();
    bytes.pop();
    let (ended, terms) = read(&bytes).await;
    assert!(ended.is_err(), "a truncated frame must not end cleanly");
    assert!(terms.is_empty());
}

/// Goal: the writer refuses a frame over its limit instead of sending it.
/// Method: send one byte more than the codec's limit.
#[tokio::test]
async fn writer_refuses_an_oversized_frame() {
    let (stream, _peer) = tokio::io::duplex(1024);
    let mut w = FramedWrite::new(stream, peer_codec(16));
    w.send(Bytes::from(vec![0u8; 16])).await.unwrap();
    let err = w.send(Bytes::from(vec![0u8; 17])).await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
}

/// Goal: with TLS on, a connection that somehow shows no certificate is refused at its
/// hello, fail closed, and delivers nothing.
/// Method: read a valid hello and heartbeat with `tls` set and no certificate.
#[tokio::test]
async fn tls_connection_without_a_certificate_is_refused_at_the_hello() {
    let (tx, mut rx) = mpsc::channel(16);
    let ctx = reader(tx, true);
    let (mut peer, stream) = tokio::io::duplex(64 * 1024);
    peer.write_all(&[hello(), heartbeat()].concat())
        .await
        .unwrap();
    drop(peer);
    let err = read_frames(stream, &ctx, None).await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{err}");
    assert!(rx.try_recv().is_err(), "nothing is delivered");
}
