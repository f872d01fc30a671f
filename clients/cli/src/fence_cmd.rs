//! `palisade fence`: read a proxy's fences, advance one without a write, or reset one
//! (the audited recovery, lower values included), through the admin API.

use std::path::PathBuf;

use clap::Args;
use palisade_protocol::DEFAULT_SCOPE;

use crate::Failure;
use crate::client_cmds::{failure_plain, print_json, print_line};
use crate::client_trust::{TrustFlags, read_admin_token};

/// Read a proxy's fences, advance one without a write, or reset one (admin API).
#[derive(Args)]
pub(crate) struct FenceArgs {
    /// The scope; without it, every scope's fence is listed (or, with --advance or
    /// --reset, scope `default` is changed).
    scope: Option<String>,
    /// Raise the scope's fence to this token.
    #[arg(long, value_name = "TOKEN", conflicts_with = "reset")]
    advance: Option<u64>,
    /// With --advance: the token's proof (base64url, from a node's leader view), which a
    /// proxy run with --token-pub accepts in place of the admin token.
    // A base64url proof may start with `-`: it is a value, never a flag.
    #[arg(
        long,
        value_name = "BASE64URL",
        requires = "advance",
        allow_hyphen_values = true
    )]
    proof: Option<String>,
    /// Set the scope's fence to this token, lower included: the audited recovery from a
    /// forged or mistaken raise. Needs --reason and the admin token.
    #[arg(long, value_name = "TOKEN", requires = "reason")]
    reset: Option<u64>,
    /// Why the fence is reset, for the proxy's log.
    #[arg(long, value_name = "TEXT", requires = "reset")]
    reason: Option<String>,
    /// File holding the admin API's bearer token (a proxy run with --admin-token-file).
    #[arg(long, env = "PALISADE_ADMIN_TOKEN_FILE", value_name = "FILE")]
    admin_token_file: Option<PathBuf>,
    /// Base URL of the proxy's admin API.
    #[arg(long, env = "PALISADE_ADMIN", default_value = "http://127.0.0.1:8081")]
    admin: String,
    #[command(flatten)]
    trust: TrustFlags,
    /// Print JSON instead of human-readable lines.
    #[arg(long)]
    json: bool,
}

/// `palisade fence`.
pub(crate) async fn fence(args: FenceArgs) -> Result<(), Failure> {
    if args.reset.is_some() && args.admin_token_file.is_none() {
        return Err(Failure::Usage(
            "--reset needs the admin token: give --admin-token-file FILE (or set \
             PALISADE_ADMIN_TOKEN_FILE)"
                .to_owned(),
        ));
    }
    let mut admin = args.trust.proxy_admin(&args.admin)?;
    if let Some(path) = &args.admin_token_file {
        admin = admin.with_bearer(&read_admin_token(path)?);
    }
    let json = args.json;
    let fail = |e: palisade_client::ClientError| failure_plain(&e, json);
    if let Some(token) = args.reset {
        let scope = args.scope.unwrap_or_else(|| DEFAULT_SCOPE.to_owned());
        let reason = args.reason.unwrap_or_default();
        let r = admin.reset(&scope, token, &reason).await.map_err(fail)?;
        return if json {
            print_json(&r)
        } else {
            print_line(&format!(
                "scope {}: fence reset from {} to {}",
                r.scope, r.previous, r.token
            ))
        };
    }
    match (args.scope, args.advance) {
        (None, None) => {
            let list = admin.fences().await.map_err(fail)?;
            if json {
                return print_json(&list);
            }
            if list.fences.is_empty() {
                return print_line("no fences yet");
            }
            for f in list.fences {
                print_line(&format!("scope {}: fence at token {}", f.scope, f.token))?;
            }
            Ok(())
        }
        (Some(scope), None) => {
            let f = admin.fence(&scope).await.map_err(fail)?;
            if json {
                print_json(&f)
            } else {
                print_line(&format!("scope {}: fence at token {}", f.scope, f.token))
            }
        }
        (scope, Some(token)) => {
            let scope = scope.unwrap_or_else(|| DEFAULT_SCOPE.to_owned());
            let a = admin
                .advance_with_proof(&scope, token, args.proof.as_deref())
                .await
                .map_err(fail)?;
            if json {
                print_json(&a)
            } else if a.advanced {
                print_line(&format!("scope {}: fence advanced to {}", a.scope, a.token))
            } else {
                print_line(&format!("scope {}: fence already at {}", a.scope, a.token))
            }
        }
    }
}
