//! The request deadline of the control plane: [`read_body`] reads a request's whole body
//! before the request counts as in flight, within a deadline and a size ceiling.
//!
//! Why before: the connection table never evicts a connection with a request in flight.
//! Were a request in flight from its head, a client that sends a head and then a byte
//! now and then would hold its slot, unevictable, for as long as it liked; enough of them
//! fill the listener. Read first, such a connection is idle to the table, so a new client
//! evicts it like one that has sent nothing, and the deadline ends it in any case.

use std::time::Duration;

use http::StatusCode;
use http_body_util::{BodyExt as _, Limited};
use hyper::body::Bytes;
use palisade_protocol::Problem;
use palisade_protocol::problem::kind;

/// Time a control-plane client has, once its request head is read, to send the whole
/// body. Control-plane bodies are a few KiB at most and their clients send them at once,
/// so a body still arriving after this is a slow or stalled client holding the door.
/// The head has its own limit (the listener's header timeout), so a whole request takes
/// at most the two together.
pub const CONTROL_REQUEST_TIMEOUT_MS: u64 = 2_000;

/// Most bytes of a control-plane body read at all, whatever the API's own (smaller) body
/// limit: the body is held in memory before the API sees it, so this bounds that memory.
pub const CONTROL_BODY_BYTES_MAX: usize = 64 * 1024;

/// Why a body was not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BodyRefused {
    /// The body did not arrive within the request timeout.
    #[error("the request body did not arrive within {timeout_ms} ms of its head")]
    Timeout {
        /// The request timeout.
        timeout_ms: u64,
    },
    /// The body is larger than [`CONTROL_BODY_BYTES_MAX`].
    #[error("the request body is over {limit} bytes")]
    TooLarge {
        /// [`CONTROL_BODY_BYTES_MAX`].
        limit: usize,
    },
    /// The client's stream failed (reset, or bad chunked framing).
    #[error("the request body could not be read")]
    Read,
}

impl BodyRefused {
    /// The problem that answers it (the connection is closed after it).
    #[must_use]
    pub fn problem(self) -> Problem {
        let (status, kind) = match self {
            Self::Timeout { .. } => (StatusCode::REQUEST_TIMEOUT, kind::BODY_TIMEOUT),
            Self::TooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, kind::BODY_TOO_LARGE),
            Self::Read => (StatusCode::BAD_REQUEST, kind::BODY_READ),
        };
        Problem::new(status, kind, self.to_string())
    }
}

/// Reads all of `body` within `timeout`, at most [`CONTROL_BODY_BYTES_MAX`] bytes.
pub async fn read_body<B>(body: B, timeout: Duration) -> Result<Bytes, BodyRefused>
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let collect = Limited::new(body, CONTROL_BODY_BYTES_MAX).collect();
    match tokio::time::timeout(timeout, collect).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(err)) if err.is::<http_body_util::LengthLimitError>() => {
            Err(BodyRefused::TooLarge {
                limit: CONTROL_BODY_BYTES_MAX,
            })
        }
        Ok(Err(_)) => Err(BodyRefused::Read),
        Err(_) => Err(BodyRefused::Timeout {
            timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        }),
    }
}
