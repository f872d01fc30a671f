//! `palisade put|get|delete|leader`: the command-line clients (`fence` is in
//! `fence_cmd.rs`, the trust flags in `client_trust.rs`). Each parses its flags,
//! calls `palisade-client`, and prints one human line (or JSON with `--json`).
//!
//! Exit codes: 0 on success; 1 on a runtime failure, a fencing rejection included
//! ("rejected: stale fencing token 3 for scope default, current is 5"); 2 on bad flags.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use palisade_client::{
    ClientError, FencedClient, FencedResponse, LeaderView, NodeApi, Role, StaticToken, backoff,
};
use serde_json::{Value, json};

use crate::Failure;
use crate::client_trust::{TrustFlags, token_from_node};

/// Largest body `palisade put` reads from a file or stdin: the proxy's default object
/// limit (16 MiB) with room to spare, so a mistaken `--file` of a huge file fails fast.
const INPUT_BYTES_MAX: u64 = 64 * 1024 * 1024;
/// How long each `leader --watch` long poll asks the node to wait.
const WATCH_WAIT_MS: u64 = 10_000;
/// First pause before trying an unreachable node again in `leader --watch`.
const WATCH_RETRY_MIN_MS: u64 = 100;
/// Longest pause (before jitter) between two attempts to reach an unreachable node in
/// `leader --watch`: a node that comes back is shown within about a second.
const WATCH_RETRY_MAX_MS: u64 = 500;

/// Where the proxy is, and how to talk to it.
#[derive(Args)]
pub(crate) struct ProxyFlags {
    /// Base URL of the proxy's client listener.
    #[arg(long, env = "PALISADE_PROXY", default_value = "http://127.0.0.1:8080")]
    proxy: String,
    /// Fencing scope, sent as `Fencing-Scope` (default: what the proxy's routes say, else
    /// `default`).
    #[arg(long, env = "PALISADE_SCOPE")]
    scope: Option<String>,
    /// Limit on each attempt, in milliseconds.
    #[arg(long, default_value_t = palisade_client::REQUEST_TIMEOUT_MS)]
    timeout_ms: u64,
    #[command(flatten)]
    trust: TrustFlags,
    /// Print JSON instead of a human-readable line.
    #[arg(long)]
    json: bool,
}

/// Where a write's token comes from: given (with an optional proof), or a node's.
#[derive(Args)]
pub(crate) struct TokenFlags {
    /// The fencing token (a decimal u64); or give --node.
    #[arg(long, env = "PALISADE_TOKEN", required_unless_present = "node")]
    token: Option<u64>,
    /// The token's proof (base64url, from a node's leader view), sent as
    /// Fencing-Token-Proof, for a proxy run with --token-pub.
    // A base64url proof may start with `-`: it is a value, never a flag.
    #[arg(
        long,
        env = "PALISADE_TOKEN_PROOF",
        value_name = "BASE64URL",
        requires = "token",
        allow_hyphen_values = true
    )]
    proof: Option<String>,
    /// Take the token, its proof and its scope from this node's API (it must be the
    /// established leader); --cert/--key/--ca apply to it.
    #[arg(long, value_name = "URL", conflicts_with_all = ["token", "proof"])]
    node: Option<String>,
}

/// Store an object through the proxy with a fencing token.
#[derive(Args)]
pub(crate) struct PutArgs {
    /// Object key or path under the proxy (`charges/sub-1` or `/charges/sub-1`).
    #[arg(value_name = "KEY|PATH")]
    target: String,
    /// Read the body from this file (`-` for stdin). Without --file or --data, the body
    /// is read from stdin.
    #[arg(long, conflicts_with = "data")]
    file: Option<PathBuf>,
    /// The body, as given.
    #[arg(long)]
    data: Option<String>,
    #[command(flatten)]
    token: TokenFlags,
    #[command(flatten)]
    flags: ProxyFlags,
}

/// Read an object through the proxy; prints its body.
#[derive(Args)]
pub(crate) struct GetArgs {
    /// Object key or path under the proxy.
    #[arg(value_name = "KEY|PATH")]
    target: String,
    /// Attach this fencing token to the read (for a proxy that fences reads).
    #[arg(long, env = "PALISADE_TOKEN")]
    token: Option<u64>,
    #[command(flatten)]
    flags: ProxyFlags,
}

/// Delete an object through the proxy with a fencing token.
#[derive(Args)]
pub(crate) struct DeleteArgs {
    /// Object key or path under the proxy.
    #[arg(value_name = "KEY|PATH")]
    target: String,
    #[command(flatten)]
    token: TokenFlags,
    #[command(flatten)]
    flags: ProxyFlags,
}

/// Read or watch a node's leadership (`GET /v1/leader`).
#[derive(Args)]
pub(crate) struct LeaderArgs {
    /// Base URL of the node's HTTP API.
    #[arg(long, env = "PALISADE_NODE")]
    node: String,
    #[command(flatten)]
    trust: TrustFlags,
    /// Keep watching (long poll) and print each change, until interrupted.
    #[arg(long)]
    watch: bool,
    /// Print JSON (one object per line with --watch) instead of human-readable lines.
    #[arg(long)]
    json: bool,
}

/// `palisade put`.
pub(crate) async fn put(args: PutArgs) -> Result<(), Failure> {
    check_target(&args.target)?;
    let body = read_body(args.file.as_ref(), args.data).await?;
    let client = write_client(&args.flags, &args.token).await?;
    let result = client.put(&args.target, body).await;
    report_write("PUT", &args.target, &args.flags, result)
}

/// `palisade get`.
pub(crate) async fn get(args: GetArgs) -> Result<(), Failure> {
    check_target(&args.target)?;
    let client = fenced_client(&args.flags, args.token.map(StaticToken::new), None)?;
    let response = client
        .get(&args.target)
        .await
        .map_err(|e| failure("GET", &args.target, args.flags.json, &e))?;
    if args.flags.json {
        let mut out = json!({
            "ok": true,
            "path": path_of(&args.target),
            "status": response.status.as_u16(),
            "token": response.stored_token(),
            "size": response.body.len(),
        });
        match std::str::from_utf8(&response.body) {
            Ok(text) => out["body"] = json!(text),
            Err(_) => out["body_hex"] = json!(hex(&response.body)),
        }
        print_line(&out.to_string())
    } else {
        let mut stdout = std::io::stdout().lock();
        stdout
            .write_all(&response.body)
            .and_then(|()| stdout.flush())
            .map_err(|e| Failure::Runtime(format!("cannot write to stdout: {e}")))
    }
}

/// `palisade delete`.
pub(crate) async fn delete(args: DeleteArgs) -> Result<(), Failure> {
    check_target(&args.target)?;
    let client = write_client(&args.flags, &args.token).await?;
    let result = client.delete(&args.target).await;
    report_write("DELETE", &args.target, &args.flags, result)
}

/// `palisade leader`.
pub(crate) async fn leader(args: LeaderArgs) -> Result<(), Failure> {
    let api = args.trust.node_api(&args.node)?;
    let first = api
        .leader()
        .await
        .map_err(|e| Failure::Runtime(e.to_string()))?;
    print_leader(&first, args.json)?;
    if !args.watch {
        return Ok(());
    }
    tokio::select! {
        result = watch(&api, first, args.json) => result,
        () = crate::shutdown_signal() => Ok(()),
    }
}

/// Long-polls the node and prints each change; survives the node going away.
async fn watch(api: &NodeApi, first: LeaderView, json: bool) -> Result<(), Failure> {
    let mut last = first;
    let mut unreachable = false;
    let reconnect = || {
        backoff::delays(
            Duration::from_millis(WATCH_RETRY_MIN_MS),
            Duration::from_millis(WATCH_RETRY_MAX_MS),
        )
    };
    let mut delays = reconnect();
    loop {
        let answer = match api
            .leader_after(last.term, Duration::from_millis(WATCH_WAIT_MS))
            .await
        {
            Ok(view) => Some(view),
            Err(e) => {
                if !unreachable {
                    eprintln!("palisade: {e}; retrying");
                    unreachable = true;
                }
                let delay = delays
                    .next()
                    .unwrap_or(Duration::from_millis(WATCH_RETRY_MAX_MS));
                tokio::time::sleep(delay).await;
                // Start over with a plain read so a node that restarted is shown at once.
                api.leader().await.ok()
            }
        };
        let Some(view) = answer else { continue };
        if unreachable {
            eprintln!("palisade: node {} answers again", api.url());
            unreachable = false;
            delays = reconnect();
        }
        if view != last {
            print_leader(&view, json)?;
            last = view;
        }
    }
}

fn print_leader(view: &LeaderView, json: bool) -> Result<(), Failure> {
    if json {
        return print_json(view);
    }
    let leader = view
        .leader_id
        .filter(|id| *id != 0)
        .map_or_else(|| "no leader known".to_owned(), |id| format!("leader {id}"));
    let line = match (view.role, view.token) {
        (Role::Leader, Some(token)) => format!(
            "node {} (scope {}): leader of term {}, token {token}, {}",
            view.node_id,
            view.scope,
            view.term,
            if view.announced {
                "announced"
            } else {
                "not yet announced"
            }
        ),
        (Role::Leader, None) => format!(
            "node {} (scope {}): leader of term {}, not yet established (no token)",
            view.node_id, view.scope, view.term
        ),
        (role, _) => format!(
            "node {} (scope {}): {role} in term {}, {leader}",
            view.node_id, view.scope, view.term
        ),
    };
    print_line(&line)
}

/// The client of a put or delete: the token (and proof) as given, or the node's; with
/// --node and no --scope, the node's scope, for which its proof is made.
async fn write_client(flags: &ProxyFlags, token: &TokenFlags) -> Result<FencedClient, Failure> {
    let (source, scope) = match (&token.node, token.token) {
        (Some(url), _) => {
            let from_node = token_from_node(url, &flags.trust.client_tls()?).await?;
            if let Some(scope) = &flags.scope
                && *scope != from_node.scope
            {
                return Err(Failure::Usage(format!(
                    "--scope {scope}: the node's token is for scope {}; its proof holds for that scope only",
                    from_node.scope
                )));
            }
            let source = match from_node.proof {
                Some(proof) => StaticToken::with_proof(from_node.token, proof),
                None => StaticToken::new(from_node.token),
            };
            (source, Some(from_node.scope))
        }
        (None, Some(value)) => {
            let source = match &token.proof {
                Some(proof) => StaticToken::with_proof(value, proof.as_str()),
                None => StaticToken::new(value),
            };
            (source, None)
        }
        (None, None) => {
            return Err(Failure::Usage(
                "give --token N (or PALISADE_TOKEN) or --node URL".to_owned(),
            ));
        }
    };
    fenced_client(flags, Some(source), scope)
}

/// A client of the proxy; reads carry no token unless one is given (then the proxy may
/// fence them). `scope` is used when --scope is not given.
fn fenced_client(
    flags: &ProxyFlags,
    source: Option<StaticToken>,
    scope: Option<String>,
) -> Result<FencedClient, Failure> {
    let fence_reads = source.is_some();
    let source = Arc::new(source.unwrap_or_else(|| StaticToken::new(0)));
    let mut builder = FencedClient::builder(&flags.proxy, source)
        .request_timeout(Duration::from_millis(flags.timeout_ms))
        .fence_reads(fence_reads)
        .tls(flags.trust.client_tls()?);
    if let Some(scope) = flags.scope.clone().or(scope) {
        builder = builder.scope(scope);
    }
    builder.build().map_err(|e| usage_or_runtime(&e))
}

fn report_write(
    method: &str,
    target: &str,
    flags: &ProxyFlags,
    result: Result<FencedResponse, ClientError>,
) -> Result<(), Failure> {
    let response = result.map_err(|e| failure(method, target, flags.json, &e))?;
    let token = response.sent_token.unwrap_or_default();
    if flags.json {
        let answer = serde_json::from_slice::<Value>(&response.body)
            .unwrap_or_else(|_| json!(response.text()));
        print_line(
            &json!({
                "ok": true,
                "method": method,
                "path": path_of(target),
                "status": response.status.as_u16(),
                "token": token,
                "scope": flags.scope,
                "attempts": response.attempts,
                "response": answer,
            })
            .to_string(),
        )
    } else {
        print_line(&format!(
            "ok: {method} {} with token {token} ({})",
            path_of(target),
            response.status
        ))
    }
}

/// The failure for a client error: usage for bad input, runtime otherwise. With `json`,
/// the error is also printed as JSON on stdout for scripts.
fn failure(method: &str, target: &str, json: bool, error: &ClientError) -> Failure {
    let message = match error {
        ClientError::Status { .. } => format!("{method} {}: {error}", path_of(target)),
        _ => message(error),
    };
    if json {
        let _ = print_line(&error_json(error, &message).to_string());
    }
    match error {
        ClientError::InvalidUrl { .. } | ClientError::InvalidRequest(_) => Failure::Usage(message),
        _ => Failure::Runtime(message),
    }
}

pub(crate) fn failure_plain(error: &ClientError, json: bool) -> Failure {
    let message = message(error);
    if json {
        let _ = print_line(&error_json(error, &message).to_string());
    }
    usage_or_runtime_with(error, message)
}

pub(crate) fn usage_or_runtime(error: &ClientError) -> Failure {
    usage_or_runtime_with(error, message(error))
}

fn usage_or_runtime_with(error: &ClientError, message: String) -> Failure {
    match error {
        ClientError::InvalidUrl { .. } | ClientError::InvalidRequest(_) => Failure::Usage(message),
        _ => Failure::Runtime(message),
    }
}

/// The user-facing message; a fencing rejection says so first.
fn message(error: &ClientError) -> String {
    match error {
        ClientError::Fenced {
            scope,
            presented,
            current,
        } => format!(
            "rejected: stale fencing token {presented} for scope {scope}, current is {current}"
        ),
        other => other.to_string(),
    }
}

fn error_json(error: &ClientError, message: &str) -> Value {
    let mut out = json!({ "ok": false, "error": message });
    match error {
        ClientError::Fenced {
            scope,
            presented,
            current,
        } => {
            out["rejected"] = json!(true);
            out["scope"] = json!(scope);
            out["presented"] = json!(presented);
            out["current"] = json!(current);
        }
        ClientError::Status { status, .. } => out["status"] = json!(status.as_u16()),
        ClientError::Indeterminate { .. } => out["indeterminate"] = json!(true),
        _ => {}
    }
    out
}

/// The body of a put: `--data`, `--file` (`-` for stdin), else stdin.
async fn read_body(file: Option<&PathBuf>, data: Option<String>) -> Result<Vec<u8>, Failure> {
    if let Some(data) = data {
        return Ok(data.into_bytes());
    }
    let too_large = || {
        Failure::Runtime(format!(
            "the body is over {INPUT_BYTES_MAX} bytes; the proxy would refuse it"
        ))
    };
    match file {
        Some(path) if path.as_os_str() != "-" => {
            let meta = tokio::fs::metadata(path)
                .await
                .map_err(|e| Failure::Usage(format!("--file {}: {e}", path.display())))?;
            if meta.len() > INPUT_BYTES_MAX {
                return Err(too_large());
            }
            tokio::fs::read(path)
                .await
                .map_err(|e| Failure::Usage(format!("--file {}: {e}", path.display())))
        }
        _ => {
            let body = tokio::task::spawn_blocking(|| {
                let mut body = Vec::new();
                std::io::stdin()
                    .lock()
                    .take(INPUT_BYTES_MAX + 1)
                    .read_to_end(&mut body)
                    .map(|_| body)
            })
            .await
            .map_err(|e| Failure::Runtime(format!("reading stdin: {e}")))?
            .map_err(|e| Failure::Runtime(format!("reading stdin: {e}")))?;
            if body.len() as u64 > INPUT_BYTES_MAX {
                return Err(too_large());
            }
            Ok(body)
        }
    }
}

/// A key or path names something: not empty, not only slashes.
fn check_target(target: &str) -> Result<(), Failure> {
    if target.trim_start_matches('/').is_empty() {
        return Err(Failure::Usage(format!(
            "KEY|PATH {target:?} names no object: give a key such as charges/sub-1"
        )));
    }
    Ok(())
}

/// `KEY` or `/PATH` as the path shown to the user.
fn path_of(target: &str) -> String {
    format!("/{}", target.trim_start_matches('/'))
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Prints one line on stdout. A closed stdout (`| head`) is not worth a panic.
/// Prints an API answer as one line of JSON, in its protocol type's own form.
pub(crate) fn print_json<T: serde::Serialize>(value: &T) -> Result<(), Failure> {
    let text = serde_json::to_string(value)
        .map_err(|e| Failure::Runtime(format!("cannot write JSON: {e}")))?;
    print_line(&text)
}

pub(crate) fn print_line(line: &str) -> Result<(), Failure> {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{line}")
        .and_then(|()| stdout.flush())
        .map_err(|e| Failure::Runtime(format!("cannot write to stdout: {e}")))
}
