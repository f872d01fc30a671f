//! The trace: every step of a run as one line, hashed into the run's digest as it is
//! written, the last few kept to print with a failing seed, and the violations found.

use std::collections::VecDeque;
use std::fmt::Write as _;

use ring::digest::{Context, SHA256};

use crate::knobs::TRACE_TAIL_EVENTS;

/// The steps of one run.
pub struct Trace {
    /// SHA-256 over every line, each followed by a newline.
    digest: Context,
    /// Lines written so far.
    events: u64,
    /// The newest lines, at most [`TRACE_TAIL_EVENTS`].
    tail: VecDeque<String>,
    /// Every invariant broken, with the virtual time and the step that broke it.
    violations: Vec<String>,
    /// Print every step to stderr as it is recorded (replaying one seed).
    pub echo: bool,
}

impl Default for Trace {
    fn default() -> Self {
        Self {
            digest: Context::new(&SHA256),
            events: 0,
            tail: VecDeque::with_capacity(TRACE_TAIL_EVENTS),
            violations: Vec::new(),
            echo: false,
        }
    }
}

impl Trace {
    /// Records one step, at virtual time `at_ms`.
    pub fn event(&mut self, at_ms: u64, what: &str) {
        let line = format!("{at_ms:>6} {what}");
        self.digest.update(line.as_bytes());
        self.digest.update(b"\n");
        self.events += 1;
        if self.echo {
            eprintln!("{line}");
        }
        if self.tail.len() == TRACE_TAIL_EVENTS {
            self.tail.pop_front();
        }
        self.tail.push_back(line);
    }

    /// Records a broken invariant (also as a step, so it is in the digest).
    pub fn violation(&mut self, at_ms: u64, what: &str) {
        self.event(at_ms, &format!("VIOLATION {what}"));
        self.violations.push(format!("at {at_ms} ms: {what}"));
    }

    /// Steps recorded so far.
    pub fn events(&self) -> u64 {
        self.events
    }

    /// The invariants broken so far.
    pub fn violations(&self) -> &[String] {
        &self.violations
    }

    /// The digest of every step so far, in hex.
    pub fn digest_hex(&self) -> String {
        let digest = self.digest.clone().finish();
        digest.as_ref().iter().fold(String::new(), |mut hex, b| {
            let _ = write!(hex, "{b:02x}");
            hex
        })
    }

    /// The newest steps, oldest first.
    pub fn tail(&self) -> impl Iterator<Item = &str> {
        self.tail.iter().map(String::as_str)
    }
}
