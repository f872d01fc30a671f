//! `palisade lock SCOPE --node URL[,URL...] -- COMMAND [ARGS...]`: runs COMMAND while a
//! session holds SCOPE, and stops it the moment the session can no longer be trusted.
//!
//! The session is trusted until `trusted_until` (the send of the last keepalive the
//! leader answered, plus the TTL less the drift bound); past it, or when the cluster no
//! longer knows the session, COMMAND's process group gets SIGTERM, then SIGKILL after
//! the grace period, and `palisade lock` exits [`EXIT_LOST`]. COMMAND runs in its own
//! process group so that its children are stopped with it.

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use clap::Args;
use clap::builder::RangedU64ValueParser;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use palisade_client::{ClientError, Grant, Session};
use palisade_protocol::scopes::CAMPAIGN_TIMEOUT_MS_DEFAULT;
use tokio::process::{Child, Command};
use tokio::signal::unix::{SignalKind, signal};

use crate::Failure;
use crate::scope_cmds::{
    SessionFlags, campaign_timeout_parser, campaign_until_held, cleanup, cleanup_lost, parse_scope,
};

/// Exit status of `palisade lock` (and `palisade campaign`) when the session was lost
/// while holding the scope: 75, `EX_TEMPFAIL` of `sysexits.h` ("try again later"), so
/// that a supervisor can tell "the lock was lost" from COMMAND's own failures.
pub(crate) const EXIT_LOST: u8 = 75;
/// Exit status when COMMAND is not found (as a shell says it).
pub(crate) const EXIT_NOT_FOUND: u8 = 127;
/// Exit status when COMMAND is found but cannot be run (as a shell says it).
pub(crate) const EXIT_CANNOT_RUN: u8 = 126;
/// How long COMMAND has, after SIGTERM, before SIGKILL, unless --grace-ms says otherwise:
/// time to stop cleanly, short against any TTL worth having. Writes it makes meanwhile
/// may already be fenced out by a newer holder's token.
pub(crate) const GRACE_MS_DEFAULT: u64 = 5_000;
/// Longest --grace-ms: a command that keeps running long after its lock was lost is what
/// the lock is there to prevent.
pub(crate) const GRACE_MS_MAX: u64 = 60_000;
/// The scope held, in COMMAND's environment.
pub(crate) const SCOPE_ENV: &str = "PALISADE_SCOPE";
/// The grant's fencing token (decimal), in COMMAND's environment.
pub(crate) const TOKEN_ENV: &str = "PALISADE_TOKEN";
/// The token's proof (base64url), empty when the cluster does not sign tokens.
pub(crate) const PROOF_ENV: &str = "PALISADE_PROOF";
/// The proof again, under the name `palisade put/delete --proof` reads, so that those
/// commands run by COMMAND send it; absent (not inherited) without a proof.
pub(crate) const PUT_PROOF_ENV: &str = "PALISADE_TOKEN_PROOF";

/// `palisade lock --help`, above the flags.
pub(crate) const LOCK_ABOUT: &str = "\
Run COMMAND while holding SCOPE, and stop it the moment the lock can no longer be trusted.

Opens a session (TTL --ttl-ms, kept alive every third of it), campaigns until the session \
holds SCOPE (campaigning again while another session holds it, as long as needed), then \
runs COMMAND in its own process group with PALISADE_SCOPE, PALISADE_TOKEN and \
PALISADE_PROOF (empty without token signing) in its environment. Give PALISADE_TOKEN (and \
the proof) with every write through a fencing proxy: a writer that lost the lock is then \
refused even if it is still running.

The session is trusted until the send of the last keepalive the leader answered plus the \
TTL less 1% (the clock drift bound). The moment that passes, or the cluster no longer \
knows the session, COMMAND's process group gets SIGTERM, then SIGKILL after --grace-ms, \
and palisade lock exits 75. When COMMAND ends on its own, the scope is resigned, the \
session revoked, and COMMAND's exit status returned. SIGINT and SIGTERM are passed to \
COMMAND, and the same cleanup follows when it ends.

COMMAND runs in its own process group, so that it and its children are stopped \
together; it is not in the terminal's foreground group, so it cannot read from the \
terminal. If palisade lock itself is killed with SIGKILL, nothing stops COMMAND: the \
session then expires after its TTL, and fencing proxies refuse COMMAND's writes once a \
newer holder has written.";

/// `palisade lock --help`, below the flags: the exit statuses and an example.
pub(crate) const LOCK_AFTER_HELP: &str = "\
Exit status: COMMAND's own (128+N if signal N ended it); 75 if the session was lost \
while COMMAND ran; 1 if the cluster could not be reached or refused the campaign; 2 on \
bad flags; 126/127 if COMMAND cannot be run / is not found; 128+N if signal N arrived \
before the scope was held.

Example:
  palisade lock nightly-report --node http://10.0.0.1:7001,http://10.0.0.2:7001 -- \\
      sh -c 'palisade put reports/today --data done --proxy http://10.0.0.9:8080'
  (`palisade put` reads PALISADE_SCOPE, PALISADE_TOKEN and PALISADE_TOKEN_PROOF, which \
  lock sets too when the grant has a proof.)";

/// The flags of `palisade lock` (its help is [`LOCK_ABOUT`]).
#[derive(Args)]
pub(crate) struct LockArgs {
    /// The scope to hold: 1 to 128 of A-Z a-z 0-9 . _ -
    #[arg(value_parser = parse_scope)]
    scope: String,
    #[command(flatten)]
    session: SessionFlags,
    /// Time COMMAND has after SIGTERM before SIGKILL, once the session is lost, in
    /// milliseconds.
    #[arg(long, value_name = "MS", default_value_t = GRACE_MS_DEFAULT,
          value_parser = RangedU64ValueParser::<u64>::new().range(0..=GRACE_MS_MAX))]
    grace_ms: u64,
    /// How long each campaign waits while another session holds the scope, in
    /// milliseconds; `lock` campaigns again after each, as long as needed.
    #[arg(long, value_name = "MS", default_value_t = CAMPAIGN_TIMEOUT_MS_DEFAULT,
          value_parser = campaign_timeout_parser())]
    campaign_timeout_ms: u64,
    /// The command to run and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

/// SIGINT and SIGTERM, as they arrive.
pub(crate) struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

impl Signals {
    /// Starts catching SIGINT and SIGTERM (they no longer end the process by default).
    pub(crate) fn new() -> Result<Self, Failure> {
        let catch = |kind: SignalKind| {
            signal(kind).map_err(|e| Failure::Runtime(format!("cannot catch signals: {e}")))
        };
        Ok(Self {
            int: catch(SignalKind::interrupt())?,
            term: catch(SignalKind::terminate())?,
        })
    }

    /// The next SIGINT or SIGTERM.
    pub(crate) async fn recv(&mut self) -> Signal {
        tokio::select! {
            Some(()) = self.int.recv() => Signal::SIGINT,
            Some(()) = self.term.recv() => Signal::SIGTERM,
            // Neither stream ends while the process runs; if both did, no signal comes.
            else => std::future::pending().await,
        }
    }
}

/// The exit status that reports signal `signal`: 128 + its number, as shells do.
pub(crate) fn exit_for_signal(signal: Signal) -> u8 {
    u8::try_from(128 + signal as i32).unwrap_or(u8::MAX)
}

/// The exit status that reports COMMAND's: its own code, or 128+N when signal N killed
/// it.
pub(crate) fn exit_status_of(status: ExitStatus) -> u8 {
    if let Some(code) = status.code() {
        return u8::try_from(code & 0xff).unwrap_or(1);
    }
    match status.signal() {
        Some(number) => u8::try_from(128 + number).unwrap_or(u8::MAX),
        None => 1,
    }
}

/// What COMMAND's environment gets (`Some`) and loses (`None`) from a grant.
pub(crate) fn command_env(grant: &Grant) -> Vec<(&'static str, Option<String>)> {
    vec![
        (SCOPE_ENV, Some(grant.scope.clone())),
        (TOKEN_ENV, Some(grant.token.to_string())),
        (PROOF_ENV, Some(grant.proof.clone().unwrap_or_default())),
        (PUT_PROOF_ENV, grant.proof.clone()),
    ]
}

/// `palisade lock`.
pub(crate) async fn run(args: LockArgs) -> Result<(), Failure> {
    let mut signals = Signals::new()?;
    let each = Duration::from_millis(args.campaign_timeout_ms);
    let mut session = open(&args, &mut signals).await?;
    // Acquire: campaign as long as needed; a session lost while waiting holds nothing,
    // so another is opened.
    let grant = loop {
        let result = tokio::select! {
            result = campaign_until_held(&session, &args.scope, each, "lock") => result,
            signal = signals.recv() => {
                eprintln!("palisade lock: {signal} received while waiting for scope {}; giving up", args.scope);
                cleanup(session, None).await;
                return Err(Failure::Exit(exit_for_signal(signal)));
            }
        };
        match result {
            Ok(grant) => break grant,
            Err(ClientError::SessionLost { cause, .. }) => {
                eprintln!("palisade lock: session lost while waiting ({cause}); opening another");
                cleanup_lost(session).await;
                session = open(&args, &mut signals).await?;
            }
            Err(e) => {
                cleanup(session, None).await;
                return Err(Failure::Runtime(format!(
                    "campaign for scope {}: {e}",
                    args.scope
                )));
            }
        }
    };
    eprintln!(
        "palisade lock: scope {} acquired with token {} (session {}, TTL {} ms); running the command",
        grant.scope,
        grant.token,
        session.id(),
        session.ttl().as_millis()
    );
    let child = match spawn(&args.command, &grant) {
        Ok(child) => child,
        Err((status, message)) => {
            eprintln!("palisade lock: {message}");
            cleanup(session, Some(&grant)).await;
            return Err(Failure::Exit(status));
        }
    };
    let status = supervise(child, &session, &mut signals, &args).await;
    match status {
        Outcome::Ended(status) => {
            let code = exit_status_of(status);
            eprintln!(
                "palisade lock: the command ended ({status}); releasing scope {}",
                grant.scope
            );
            cleanup(session, Some(&grant)).await;
            if code == 0 {
                Ok(())
            } else {
                Err(Failure::Exit(code))
            }
        }
        Outcome::Lost => {
            cleanup_lost(session).await;
            Err(Failure::Exit(EXIT_LOST))
        }
    }
}

/// Opens a session, giving up on SIGINT or SIGTERM.
async fn open(args: &LockArgs, signals: &mut Signals) -> Result<Session, Failure> {
    tokio::select! {
        session = args.session.nodes.open_session(args.session.ttl_ms) => session,
        signal = signals.recv() => {
            eprintln!("palisade lock: {signal} received while opening a session; giving up");
            Err(Failure::Exit(exit_for_signal(signal)))
        }
    }
}

/// Starts COMMAND in its own process group with the grant in its environment; or the
/// exit status and message for why it cannot run.
fn spawn(command: &[OsString], grant: &Grant) -> Result<Child, (u8, String)> {
    let Some((program, rest)) = command.split_first() else {
        return Err((EXIT_CANNOT_RUN, "no command given".to_owned()));
    };
    let mut cmd = Command::new(program);
    cmd.args(rest).process_group(0).kill_on_drop(false);
    for (name, value) in command_env(grant) {
        match value {
            Some(value) => cmd.env(name, value),
            None => cmd.env_remove(name),
        };
    }
    cmd.spawn().map_err(|e| {
        let status = if e.kind() == std::io::ErrorKind::NotFound {
            EXIT_NOT_FOUND
        } else {
            EXIT_CANNOT_RUN
        };
        (
            status,
            format!("cannot run {}: {e}", program.to_string_lossy()),
        )
    })
}

/// How the command's run ended.
enum Outcome {
    /// It ended on its own (or after a signal passed on to it).
    Ended(ExitStatus),
    /// The session was lost; the command was stopped.
    Lost,
}

/// Waits for COMMAND, passing SIGINT and SIGTERM on to its process group, and stops it
/// the moment the session is lost.
async fn supervise(
    mut child: Child,
    session: &Session,
    signals: &mut Signals,
    args: &LockArgs,
) -> Outcome {
    // The group's id is the child's pid (process_group(0)); kept, as `Child::id` is gone
    // once the child is reaped.
    let group = child
        .id()
        .and_then(|pid| i32::try_from(pid).ok())
        .map(Pid::from_raw);
    loop {
        tokio::select! {
            // A loss and an exit seen together count as a loss: the command may have run
            // past the session's trust.
            biased;
            loss = session.lost() => {
                eprintln!("palisade lock: scope {} lost because {loss}", args.scope);
                stop(&mut child, group, Duration::from_millis(args.grace_ms)).await;
                return Outcome::Lost;
            }
            status = child.wait() => match status {
                Ok(status) => return Outcome::Ended(status),
                Err(e) => {
                    eprintln!("palisade lock: cannot wait for the command: {e}; stopping it");
                    stop(&mut child, group, Duration::from_millis(args.grace_ms)).await;
                    return Outcome::Ended(ExitStatus::from_raw(1 << 8));
                }
            },
            signal = signals.recv() => {
                eprintln!("palisade lock: {signal} received; passing it to the command");
                send(group, signal);
            }
        }
    }
}

/// SIGTERM to the command's group, then SIGKILL once it ended or `grace` passed (its
/// children may outlive it), and waits for it.
async fn stop(child: &mut Child, group: Option<Pid>, grace: Duration) {
    eprintln!(
        "palisade lock: stopping the command (SIGTERM, SIGKILL after {} ms)",
        grace.as_millis()
    );
    send(group, Signal::SIGTERM);
    if let Ok(Ok(status)) = tokio::time::timeout(grace, child.wait()).await {
        eprintln!("palisade lock: the command ended ({status})");
    } else {
        eprintln!("palisade lock: the command did not end within the grace period; SIGKILL");
    }
    send(group, Signal::SIGKILL);
    let _ = child.wait().await;
}

/// `signal` to the process group; one that is gone already is not an error.
fn send(group: Option<Pid>, signal: Signal) {
    let Some(group) = group else { return };
    match killpg(group, signal) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
        Err(e) => eprintln!("palisade lock: cannot send {signal} to the command: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    /// The `lock` subcommand alone, to test its flags.
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        lock: LockArgs,
    }

    fn parse(args: &[&str]) -> Result<LockArgs, String> {
        Cli::try_parse_from(std::iter::once("lock").chain(args.iter().copied()))
            .map(|cli| cli.lock)
            .map_err(|e| e.to_string())
    }

    /// Goal: COMMAND's exit status passes through; a signal is reported as 128+N; the
    /// statuses of `lock` itself are distinct. Method: raw wait statuses.
    #[test]
    fn exit_statuses_pass_through_and_signals_are_128_plus() {
        assert_eq!(exit_status_of(ExitStatus::from_raw(0)), 0);
        assert_eq!(exit_status_of(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(exit_status_of(ExitStatus::from_raw(255 << 8)), 255);
        assert_eq!(exit_status_of(ExitStatus::from_raw(9)), 137, "SIGKILL");
        assert_eq!(exit_status_of(ExitStatus::from_raw(15)), 143, "SIGTERM");
        assert_eq!(exit_for_signal(Signal::SIGINT), 130);
        assert_eq!(exit_for_signal(Signal::SIGTERM), 143);
        let own = [EXIT_LOST, EXIT_NOT_FOUND, EXIT_CANNOT_RUN, 1, 2];
        for (i, a) in own.iter().enumerate() {
            assert!(own[i + 1..].iter().all(|b| a != b), "{own:?}");
        }
    }

    /// Goal: COMMAND gets the scope, the token and the proof (empty without one), and an
    /// inherited `PALISADE_TOKEN_PROOF` never pairs an old proof with the new token.
    /// Method: the environment of a signed and an unsigned grant.
    #[test]
    fn the_command_environment_carries_the_grant() {
        let mut grant = Grant {
            scope: "jobs".into(),
            token: 41,
            proof: Some("c2ln".into()),
            session: "s-1".into(),
        };
        assert_eq!(
            command_env(&grant),
            vec![
                ("PALISADE_SCOPE", Some("jobs".to_owned())),
                ("PALISADE_TOKEN", Some("41".to_owned())),
                ("PALISADE_PROOF", Some("c2ln".to_owned())),
                ("PALISADE_TOKEN_PROOF", Some("c2ln".to_owned())),
            ]
        );
        grant.proof = None;
        let env = command_env(&grant);
        assert_eq!(env[2], ("PALISADE_PROOF", Some(String::new())));
        assert_eq!(env[3], ("PALISADE_TOKEN_PROOF", None));
    }

    /// Goal: the flags parse as documented, COMMAND comes after `--` with its own
    /// flags untouched, and bad values are refused with the flag named.
    /// Method: parse good and bad command lines.
    #[test]
    fn flags_parse_and_bad_ones_are_named() {
        let args = parse(&[
            "jobs",
            "--node",
            "http://a:1,http://b:2",
            "--ttl-ms",
            "3000",
            "--",
            "sh",
            "-c",
            "echo --node",
        ])
        .unwrap();
        assert_eq!(args.scope, "jobs");
        assert_eq!(args.session.nodes.nodes, ["http://a:1", "http://b:2"]);
        assert_eq!(args.session.ttl_ms, 3_000);
        assert_eq!(args.grace_ms, GRACE_MS_DEFAULT);
        assert_eq!(args.command, ["sh", "-c", "echo --node"]);
        for (bad, named) in [
            (&["jobs", "--node", "http://a:1"][..], "COMMAND"),
            (&["jobs", "--node", "http://a:1", "true"][..], "true"),
            (
                &["bad scope", "--node", "http://a:1", "--", "true"][..],
                "scope",
            ),
            (&["jobs", "--", "true"][..], "--node"),
            (
                &["jobs", "--node", "u", "--ttl-ms", "999", "--", "true"][..],
                "--ttl-ms",
            ),
            (
                &["jobs", "--node", "u", "--ttl-ms", "300001", "--", "true"][..],
                "--ttl-ms",
            ),
            (
                &["jobs", "--node", "u", "--grace-ms", "60001", "--", "true"][..],
                "--grace-ms",
            ),
            (
                &[
                    "jobs",
                    "--node",
                    "u",
                    "--campaign-timeout-ms",
                    "0",
                    "--",
                    "true",
                ][..],
                "--campaign-timeout-ms",
            ),
        ] {
            let err = parse(bad)
                .err()
                .unwrap_or_else(|| panic!("{bad:?} accepted"));
            assert!(err.contains(named), "{bad:?}: {err}");
        }
    }
}
