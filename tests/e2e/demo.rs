//! `palisade demo`, the main job, as a user runs it: a real process that starts its own
//! cluster, pauses the leader, and must end with a verdict that holds.

use std::process::Command;

/// Runs `palisade demo` with a short pause, fast ticks and `extra` flags, asserts it
/// exited 0, and returns its stdout.
fn run_demo(extra: &[&str]) -> String {
    crate::use_tested_binary();
    let output = Command::new(crate::PALISADE)
        .args(["demo", "--pause", "2", "--tick-ms", "50"])
        .args(extra)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "demo failed\n{stdout}\n{stderr}");
    stdout
}

/// Goal: the demo, in its default secure mode (signed tokens, peer mutual TLS, an admin
/// token), shows a paused leader's write rejected and exits 0 with a verdict that holds,
/// and says it ran secure. Method: run it with a short pause and fast ticks and no mode
/// flag; read its `secure:` lines and its timeline.
#[test]
fn demo_rejects_the_paused_leaders_write_and_the_verdict_holds() {
    let stdout = run_demo(&[]);
    for line in [
        "secure: signed fencing tokens",
        "secure: peer mutual TLS",
        "secure: the proxy's admin API requires a bearer token",
    ] {
        assert!(stdout.contains(line), "the demo says {line:?}: {stdout}");
    }
    assert!(
        !stdout.contains("insecure"),
        "the default is not the insecure demo: {stdout}"
    );
    assert!(stdout.contains("PAUSE    SIGSTOP node"), "{stdout}");
    assert!(
        stdout.contains("REJECTED"),
        "the stale write was rejected: {stdout}"
    );
    assert!(stdout.contains("verdict: HOLDS"), "{stdout}");
    let dir = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("(data and logs in "))
        .map(|d| d.trim_end_matches(')').to_owned())
        .unwrap();
    assert!(
        !std::path::Path::new(&dir).exists(),
        "the demo removed its temporary directory {dir}"
    );
}

/// Goal: `palisade demo --proxies 3` runs a fleet in front of one store: the paused
/// leader's write goes through a different proxy from the new leader's and is still
/// rejected, and the verdict holds. Method: run it with a short pause and fast ticks;
/// read its fleet lines, the proxies each worker writes through, the rejection and the
/// verdict.
#[test]
fn demo_with_three_proxies_rejects_the_old_leaders_write_through_another_proxy() {
    let stdout = run_demo(&["--proxies", "3"]);
    assert!(
        stdout.contains("a fleet of 3 proxies in front of one store"),
        "{stdout}"
    );
    for i in 1..=3 {
        assert!(
            stdout.contains(&format!("proxy {i}  listening on")),
            "proxy {i} started: {stdout}"
        );
    }
    assert!(stdout.contains("PAUSE    SIGSTOP node"), "{stdout}");
    let rejected = stdout
        .lines()
        .find(|l| l.contains("REJECTED"))
        .unwrap_or_else(|| panic!("the stale write was rejected: {stdout}"));
    assert!(
        rejected.contains("proxy ") && rejected.contains("fence is"),
        "the rejection names the proxy that refused it: {rejected}"
    );
    assert!(
        stdout.contains("(different proxies)"),
        "the old and the new leader wrote through different proxies: {stdout}"
    );
    assert!(stdout.contains("verdict: HOLDS"), "{stdout}");
}

/// Goal: `palisade demo --sessions` tells the same story with workers that are not raft
/// members: the holder of scope `ledger` is paused past its session's TTL, the next waiter
/// is granted a higher token, which the proxy fences before the grant is answered, the
/// resumed holder's write with its old token is rejected, it finds its session lost and
/// stops, and the verdict holds. Method: run it with a short pause and fast ticks; read
/// the two grants, the proxy's fence after each, the pause, the rejection, the stop and
/// the verdict from its timeline.
#[test]
fn demo_with_sessions_rejects_the_paused_holders_write_and_the_verdict_holds() {
    let stdout = run_demo(&["--sessions"]);
    assert!(
        stdout.contains("workers that are not raft members and hold scope ledger"),
        "{stdout}"
    );
    // `[  1.12s] worker 1 granted scope ledger with token 4`: (worker, token) in order.
    let grants: Vec<(String, u64)> = stdout
        .lines()
        .filter_map(|l| {
            let (who, token) = l.split_once(" granted scope ledger with token ")?;
            let worker = who.rsplit_once("worker ")?.1.trim().to_owned();
            Some((worker, token.trim().parse().ok()?))
        })
        .collect();
    let [(first, old), (next, new)] = grants.as_slice() else {
        panic!("two grants, the holder's and the next waiter's: {grants:?}\n{stdout}");
    };
    assert_ne!(first, next, "the scope passed to another worker: {stdout}");
    assert!(new > old, "the next grant's token is higher: {stdout}");
    for (worker, token) in [(first, old), (next, new)] {
        assert!(
            stdout.contains(&format!(
                "fence for scope ledger is {token}: raised to worker {worker}'s token before its campaign was answered"
            )),
            "the proxy fenced token {token} by the time worker {worker} had it: {stdout}"
        );
    }
    assert!(
        stdout.contains(&format!(
            "PAUSE    SIGSTOP worker {first} while it holds scope ledger with token {old}"
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("REJECTED worker {first}'s write ledger/w{first}-"))
            && stdout.contains(&format!(
                "with token {old} rejected: 409, the proxy's fence is {new}"
            )),
        "the paused holder's stale write was rejected: {stdout}"
    );
    assert!(
        stdout.contains(&format!("worker {first} stops because its session is lost")),
        "the paused holder found its session lost: {stdout}"
    );
    assert!(
        stdout.contains("(the paused holder's stale write was rejected)"),
        "{stdout}"
    );
    assert!(stdout.contains("verdict: HOLDS"), "{stdout}");
}

/// Goal: bad options are usage errors (exit 2) that name the option. Method: run the
/// demo with too few nodes, with a zero pause, with no proxy, and with sessions in front
/// of a fleet (a fleet's cluster grants no named scopes).
#[test]
fn demo_refuses_bad_options_with_exit_2() {
    crate::use_tested_binary();
    for args in [
        &["demo", "--nodes", "2"][..],
        &["demo", "--pause", "0"],
        &["demo", "--proxies", "0"],
        &["demo", "--sessions", "--proxies", "2"],
    ] {
        let output = Command::new(crate::PALISADE).args(args).output().unwrap();
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains(args[1]),
            "the message names {}: {stderr}",
            args[1]
        );
    }
}
