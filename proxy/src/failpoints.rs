//! Failpoints for tests, compiled in only with this crate's `failpoints` feature, which
//! `cargo test --workspace` turns on (the tests' dev-dependencies enable it, and feature
//! unification carries it into the `palisade` binary built for them); release builds
//! leave it off, and then [`setup`] does nothing and no failpoint exists.
//!
//! Two environment variables, read once at start:
//!
//! - `FAILPOINTS`: the `fail` crate's own syntax, `NAME=ACTIONS;...` (`return`, `panic`,
//!   `sleep(MS)`, `pause`, `print(MSG)`, with `P%` and `N*` prefixes), set up by
//!   `fail::FailScenario::setup()`.
//! - `PALISADE_FAILPOINT_STOP=NAME[,NAME...]`
//!   ([`FAILPOINT_STOP_ENV`](palisade_protocol::process::FAILPOINT_STOP_ENV)): at each of
//!   these failpoints the process prints a
//!   [`FailpointStop`](palisade_protocol::process::FailpointStop) line,
//!   `palisade failpoint NAME reached (pid PID)`, on stdout and stops itself with
//!   `SIGSTOP`, every time it gets there. A test in another process waits for that line,
//!   then does what the scenario needs while the process is frozen at exactly that point
//!   (elects a new leader, `kill -9`s it), and continues it with `SIGCONT`, or never. This
//!   is `pause` across processes: the `fail` crate's `pause` blocks one thread silently
//!   until changed from inside the process, which a test outside can neither see nor
//!   release. A name in both variables stops.
//!
//! The failpoints: `client-before-send` (palisade-client, between reading the token and
//! sending a write), `proxy-before-fence-commit` and `proxy-after-fence-commit` (around the
//! fsync of a raised fence), `proxy-before-forward` and `proxy-after-forward` (around the
//! upstream exchange), `proxy-before-reply`.

/// Whether failpoints are compiled into this build.
pub const ENABLED: bool = cfg!(feature = "failpoints");

/// Names of every failpoint in the binary.
pub const FAILPOINTS: [&str; 6] = [
    "client-before-send",
    "proxy-before-fence-commit",
    "proxy-after-fence-commit",
    "proxy-before-forward",
    "proxy-after-forward",
    "proxy-before-reply",
];

/// The configured failpoints; they stay configured while this lives.
pub struct Failpoints {
    #[cfg(feature = "failpoints")]
    _scenario: fail::FailScenario<'static>,
}

/// Without the `failpoints` feature: nothing to configure.
#[cfg(not(feature = "failpoints"))]
pub fn setup() -> Result<Failpoints, String> {
    Ok(Failpoints {})
}

/// Configures the failpoints from `FAILPOINTS` (panics on a malformed value, as the `fail`
/// crate does) and `PALISADE_FAILPOINT_STOP` (an unknown name is an error).
#[cfg(feature = "failpoints")]
pub fn setup() -> Result<Failpoints, String> {
    use palisade_protocol::process::FAILPOINT_STOP_ENV as STOP_ENV;
    let scenario = fail::FailScenario::setup();
    if let Some(names) = std::env::var_os(STOP_ENV) {
        let names = names.to_string_lossy().into_owned();
        for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            if !FAILPOINTS.contains(&name) {
                return Err(format!(
                    "{STOP_ENV}: unknown failpoint {name:?} (known: {})",
                    FAILPOINTS.join(", ")
                ));
            }
            let owned = name.to_owned();
            fail::cfg_callback(name, move || stop_here(&owned))
                .map_err(|e| format!("{STOP_ENV}: cannot configure {name}: {e}"))?;
        }
    }
    let configured = fail::list();
    if !configured.is_empty() {
        tracing::warn!(failpoints = ?configured, "failpoints configured");
    }
    Ok(Failpoints {
        _scenario: scenario,
    })
}

/// Tells the world, then stops this whole process (every thread) where it stands.
#[cfg(feature = "failpoints")]
fn stop_here(name: &str) {
    use std::io::Write as _;
    let pid = std::process::id();
    let line = palisade_protocol::process::FailpointStop {
        name: name.to_owned(),
        pid,
    };
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{line}");
    let _ = stdout.flush();
    drop(stdout);
    tracing::warn!(
        failpoint = name,
        pid,
        "failpoint reached: stopping with SIGSTOP"
    );
    if let Err(e) = nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP) {
        tracing::error!(failpoint = name, cause = %e, "cannot stop at the failpoint");
    }
}
