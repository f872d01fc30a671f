//! The node's HTTP API (JSON; errors as `application/problem+json`, RFC 9457):
//!
//! - `GET /v1/leader`: this node's view of leadership; with `?after_term=N&timeout_ms=T`
//!   a long poll that answers once the term exceeds N or the view changes in any other way
//!   (role, leader, token, announced), or after T ms (at most [`LONG_POLL_TIMEOUT_MS_MAX`]).
//!   `after_term` defaults to the current term, `timeout_ms` to
//!   [`LONG_POLL_TIMEOUT_MS_DEFAULT`].
//! - `POST /v1/transfer` with `{"to":ID}`: leadership transfer; waits for the outcome.
//! - `POST /v1/resign`: transfer to the best other voter.
//! - `GET /metrics` (Prometheus text), `GET /healthz`.
//! - Only on a node started with test faults (`PALISADE_TEST_FAULTS=1`), else 404:
//!   `GET /v1/test/faults` and `POST /v1/test/faults` with
//!   `{"drop":[2,3],"delay_ms":{"2":200}}`, which replaces every fault of this node's
//!   links (`{}` heals them); see [`crate::transport::faults`].

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, debug, warn};

use crate::leadership::{Leadership, Role};
use crate::metrics::NodeMetrics;
use crate::node::{Commands, TransferError};
use crate::transport::faults::{FaultError, FaultSpec, LinkFaults};

/// Longest long poll: a client asking for more waits this long. Keeps a forgotten client
/// from pinning a connection for ever.
pub const LONG_POLL_TIMEOUT_MS_MAX: u64 = 60_000;
/// Long-poll timeout when `after_term` is given without `timeout_ms`.
pub const LONG_POLL_TIMEOUT_MS_DEFAULT: u64 = 30_000;
/// Largest request body accepted (`{"to":N}` needs a few bytes).
pub const API_BODY_BYTES_MAX: usize = 4 * 1024;
/// API connections open at once; more are closed at accept.
pub const API_CONNECTIONS_MAX: usize = 256;
/// Time a client has to send its request headers.
pub const API_HEADER_TIMEOUT_MS: u64 = 10_000;
/// Time in-flight requests get to finish at shutdown.
pub const API_DRAIN_TIMEOUT_MS: u64 = 2_000;

/// What the API handlers share.
pub(crate) struct ApiState {
    pub node_id: u64,
    pub scope: String,
    pub leadership: watch::Receiver<Leadership>,
    pub commands: Commands,
    pub metrics: NodeMetrics,
    /// The transport's test faults, only when they are enabled.
    pub faults: Option<Arc<LinkFaults>>,
}

/// The `GET /v1/leader` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderView {
    /// This node's raft id.
    pub node_id: u64,
    /// The fencing scope.
    pub scope: String,
    /// This node's current raft term.
    pub term: u64,
    /// The leader this node knows, `null` when none.
    pub leader_id: Option<u64>,
    /// `leader`, `follower` or `candidate`.
    pub role: Role,
    /// The fencing token, non-null only on the established leader.
    pub token: Option<u64>,
    /// Whether every `--announce` proxy accepted the token.
    pub announced: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TransferBody {
    to: u64,
}

type Body = Full<Bytes>;

/// Serves the API on `listener` until `shutdown`, then drains in-flight requests.
pub(crate) async fn serve(listener: TcpListener, state: ApiState, shutdown: CancellationToken) {
    let state = Arc::new((state, shutdown.clone()));
    let graceful = GracefulShutdown::new();
    let permits = Arc::new(Semaphore::new(API_CONNECTIONS_MAX));
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => break,
            a = listener.accept() => a,
        };
        let (stream, remote) = match accepted {
            Ok(a) => a,
            Err(err) => {
                warn!(cause = %err, "api accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            warn!(%remote, limit = API_CONNECTIONS_MAX, "too many api connections; closed");
            continue;
        };
        let state = state.clone();
        let service = service_fn(move |req| {
            let state = state.clone();
            async move { Ok::<_, Infallible>(route(&state.0, &state.1, req).await) }
        });
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(Duration::from_millis(API_HEADER_TIMEOUT_MS))
            .serve_connection(TokioIo::new(stream), service);
        let conn = graceful.watch(conn);
        tokio::spawn(
            async move {
                if let Err(err) = conn.await {
                    debug!(%remote, cause = %err, "api connection ended with an error");
                }
                drop(permit);
            }
            .in_current_span(),
        );
    }
    drop(listener);
    if tokio::time::timeout(
        Duration::from_millis(API_DRAIN_TIMEOUT_MS),
        graceful.shutdown(),
    )
    .await
    .is_err()
    {
        warn!(
            timeout_ms = API_DRAIN_TIMEOUT_MS,
            "api requests still running at shutdown"
        );
    }
}

async fn route(
    state: &ApiState,
    shutdown: &CancellationToken,
    req: Request<Incoming>,
) -> Response<Body> {
    let path = req.uri().path().to_owned();
    match (req.method(), path.as_str()) {
        (&Method::GET, "/v1/leader") => leader(state, shutdown, req.uri().query()).await,
        (&Method::POST, "/v1/transfer") => transfer(state, req).await,
        (&Method::POST, "/v1/resign") => {
            transfer_outcome(state, state.commands.transfer(None).await)
        }
        (&Method::GET, "/metrics") => {
            let mut r = Response::new(Full::new(Bytes::from(state.metrics.render())));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            r
        }
        (&Method::GET, "/healthz") => {
            if state.commands.is_running() {
                json(
                    StatusCode::OK,
                    &serde_json::json!({"status": "ok", "node_id": state.node_id}),
                )
            } else {
                problem(
                    state,
                    StatusCode::SERVICE_UNAVAILABLE,
                    "node-stopped",
                    "The election loop is not running",
                    "the node stopped; see its log",
                    None,
                )
            }
        }
        (&Method::GET, "/v1/test/faults") if state.faults.is_some() => {
            let spec = state.faults.as_ref().map(|f| f.get()).unwrap_or_default();
            json(StatusCode::OK, &spec)
        }
        (&Method::POST, "/v1/test/faults") if state.faults.is_some() => {
            set_faults(state, req).await
        }
        (_, "/v1/leader" | "/metrics" | "/healthz") => method_not_allowed(state, "GET"),
        (_, "/v1/transfer" | "/v1/resign") => method_not_allowed(state, "POST"),
        _ => problem(
            state,
            StatusCode::NOT_FOUND,
            "not-found",
            "No such resource",
            &format!("{path} is not part of the node API"),
            None,
        ),
    }
}

fn view(state: &ApiState, l: &Leadership) -> LeaderView {
    LeaderView {
        node_id: state.node_id,
        scope: state.scope.clone(),
        term: l.term,
        leader_id: l.leader_id,
        role: l.role,
        token: l.token,
        announced: l.announced,
    }
}

/// Parses `after_term` and `timeout_ms`; unknown parameters are an error (a typo would
/// otherwise turn a long poll into a busy loop).
fn long_poll_params(query: Option<&str>) -> Result<(Option<u64>, Option<u64>), String> {
    let (mut after_term, mut timeout_ms) = (None, None);
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let parsed: u64 = value
            .parse()
            .map_err(|_| format!("{name}={value:?} is not a non-negative integer"))?;
        match name {
            "after_term" => after_term = Some(parsed),
            "timeout_ms" => timeout_ms = Some(parsed),
            _ => {
                return Err(format!(
                    "unknown query parameter {name:?} (expected after_term, timeout_ms)"
                ));
            }
        }
    }
    Ok((after_term, timeout_ms))
}

async fn leader(
    state: &ApiState,
    shutdown: &CancellationToken,
    query: Option<&str>,
) -> Response<Body> {
    let (after_term, timeout_ms) = match long_poll_params(query) {
        Ok(p) => p,
        Err(detail) => {
            return problem(
                state,
                StatusCode::BAD_REQUEST,
                "bad-query",
                "Bad query parameter",
                &detail,
                None,
            );
        }
    };
    let mut rx = state.leadership.clone();
    let now = *rx.borrow_and_update();
    if after_term.is_none() && timeout_ms.is_none() {
        return json(StatusCode::OK, &view(state, &now));
    }
    let after_term = after_term.unwrap_or(now.term);
    let timeout_ms = timeout_ms
        .unwrap_or(LONG_POLL_TIMEOUT_MS_DEFAULT)
        .min(LONG_POLL_TIMEOUT_MS_MAX);
    // Besides the contract's "term above N or role changed", any other change of the view
    // (leader learned, token established or withdrawn, announcement done) also answers:
    // a client waiting for the token to appear would otherwise wait out the timeout.
    let changed = |l: &Leadership| {
        l.term > after_term
            || (l.role, l.leader_id, l.token, l.announced)
                != (now.role, now.leader_id, now.token, now.announced)
    };
    if !changed(&now) {
        tokio::select! {
            () = shutdown.cancelled() => {}
            _ = tokio::time::timeout(Duration::from_millis(timeout_ms), rx.wait_for(changed)) => {}
        }
    }
    let latest = *state.leadership.borrow();
    json(StatusCode::OK, &view(state, &latest))
}

/// Reads a JSON body of at most [`API_BODY_BYTES_MAX`] bytes, or answers the problem;
/// `expected` shows the right shape in the answer.
async fn json_body<T: serde::de::DeserializeOwned>(
    state: &ApiState,
    req: Request<Incoming>,
    expected: &str,
) -> Result<T, Response<Body>> {
    let body = match Limited::new(req.into_body(), API_BODY_BYTES_MAX)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(err) => {
            return Err(problem(
                state,
                StatusCode::PAYLOAD_TOO_LARGE,
                "body-too-large",
                "Request body too large or unreadable",
                &format!("the body must be at most {API_BODY_BYTES_MAX} bytes: {err}"),
                None,
            ));
        }
    };
    serde_json::from_slice::<T>(&body).map_err(|err| {
        problem(
            state,
            StatusCode::BAD_REQUEST,
            "bad-body",
            "Bad request body",
            &format!("expected {expected}: {err}"),
            None,
        )
    })
}

async fn transfer(state: &ApiState, req: Request<Incoming>) -> Response<Body> {
    let to = match json_body::<TransferBody>(state, req, r#"{"to":NODE_ID}"#).await {
        Ok(b) => b.to,
        Err(answer) => return answer,
    };
    transfer_outcome(state, state.commands.transfer(Some(to)).await)
}

/// `POST /v1/test/faults`: replaces the faults of this node's links.
async fn set_faults(state: &ApiState, req: Request<Incoming>) -> Response<Body> {
    let Some(faults) = state.faults.as_ref() else {
        return problem(
            state,
            StatusCode::NOT_FOUND,
            "not-found",
            "No such resource",
            &FaultError::Disabled.to_string(),
            None,
        );
    };
    let spec = match json_body::<FaultSpec>(state, req, r#"{"drop":[ID,...],"delay_ms":{"ID":MS}}"#)
        .await
    {
        Ok(spec) => spec,
        Err(answer) => return answer,
    };
    match faults.set(spec) {
        Ok(spec) => {
            warn!(drop = ?spec.drop, delay_ms = ?spec.delay_ms, "test faults set");
            json(StatusCode::OK, &spec)
        }
        Err(err) => problem(
            state,
            StatusCode::BAD_REQUEST,
            "bad-faults",
            "Fault spec refused",
            &err.to_string(),
            None,
        ),
    }
}

fn transfer_outcome(
    state: &ApiState,
    outcome: Result<crate::node::Transferred, TransferError>,
) -> Response<Body> {
    let err = match outcome {
        Ok(done) => return json(StatusCode::OK, &done),
        Err(err) => err,
    };
    let (status, reason, title, leader_id) = match &err {
        TransferError::NotLeader { leader_id } => (
            StatusCode::CONFLICT,
            "not-leader",
            "This node is not the leader",
            *leader_id,
        ),
        TransferError::UnknownNode { .. } => (
            StatusCode::BAD_REQUEST,
            "unknown-node",
            "No such voter",
            None,
        ),
        TransferError::NoCandidate => (
            StatusCode::CONFLICT,
            "no-candidate",
            "No other voter to transfer to",
            None,
        ),
        TransferError::Refused { .. } => (
            StatusCode::CONFLICT,
            "transfer-refused",
            "Transfer refused or abandoned by raft",
            None,
        ),
        TransferError::Superseded { leader_id, .. } => (
            StatusCode::CONFLICT,
            "transfer-superseded",
            "Another node became leader",
            Some(*leader_id),
        ),
        TransferError::TimedOut { .. } => (
            StatusCode::GATEWAY_TIMEOUT,
            "transfer-timeout",
            "Transfer did not complete in time",
            None,
        ),
        TransferError::Stopped => (
            StatusCode::SERVICE_UNAVAILABLE,
            "node-stopped",
            "The node stopped",
            None,
        ),
    };
    problem(state, status, reason, title, &err.to_string(), leader_id)
}

fn json(status: StatusCode, value: &impl Serialize) -> Response<Body> {
    let bytes = serde_json::to_vec(value).unwrap_or_default();
    let mut r = Response::new(Full::new(Bytes::from(bytes)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    r
}

fn problem(
    state: &ApiState,
    status: StatusCode,
    reason: &str,
    title: &str,
    detail: &str,
    leader_id: Option<u64>,
) -> Response<Body> {
    let mut body = serde_json::json!({
        "type": format!("https://palisade.invalid/problems/{reason}"),
        "title": title,
        "status": status.as_u16(),
        "detail": detail,
        "node_id": state.node_id,
    });
    if let Some(leader_id) = leader_id {
        body["leader_id"] = serde_json::json!(leader_id);
    }
    let mut r = json(status, &body);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/problem+json"),
    );
    r
}

fn method_not_allowed(state: &ApiState, allow: &'static str) -> Response<Body> {
    let mut r = problem(
        state,
        StatusCode::METHOD_NOT_ALLOWED,
        "method-not-allowed",
        "Method not allowed",
        &format!("this resource accepts {allow}"),
        None,
    );
    r.headers_mut()
        .insert(header::ALLOW, header::HeaderValue::from_static(allow));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the long-poll query parser accepts the two parameters and names bad ones.
    /// Method: parse good, malformed and unknown queries.
    #[test]
    fn long_poll_query_is_parsed_strictly() {
        assert_eq!(long_poll_params(None), Ok((None, None)));
        assert_eq!(
            long_poll_params(Some("after_term=7&timeout_ms=500")),
            Ok((Some(7), Some(500)))
        );
        assert!(
            long_poll_params(Some("after_term=-1"))
                .unwrap_err()
                .contains("after_term")
        );
        assert!(
            long_poll_params(Some("after-term=1"))
                .unwrap_err()
                .contains("after-term")
        );
    }
}
