//! The writer beside each node: a `palisade demo-worker` child, the events it prints, and
//! how they become [`history`](crate::history) operations.
//!
//! A worker waits until its node is the established leader, takes the token, works for a
//! while (`--job-ms`), then writes `ledger/<name>-<seq>` through the proxy with that token,
//! with its name and sequence number in the headers `X-Writer` and `X-Seq` so a recording
//! upstream can name each applied write. It prints one JSON [`Event`] per line on stdout.
//! Started with `PALISADE_FAILPOINT_STOP=client-before-send` (a build with failpoints), it
//! stops itself before every send, after printing a [`FailpointStop`] line; a test
//! continues it with `SIGCONT` when it chooses.

use std::path::Path;

use palisade_protocol::process::{FailpointStop, WORKER_READY_LINE};
use serde::{Deserialize, Serialize};

use crate::Result;
use crate::history::{Outcome, Recorder};
use crate::process::{ChildGuard, Launch, Lines, spawn_launch};

/// Ledger keys start with this.
pub const LEDGER_PREFIX: &str = "ledger/";
/// The request header naming the writer.
pub const WRITER_HEADER: &str = "x-writer";
/// The request header with the writer's sequence number.
pub const SEQ_HEADER: &str = "x-seq";
/// Longest wait for a killed worker's last stdout lines.
const DRAIN_TIMEOUT_MS: u64 = 5_000;
/// The scope workers write in (they send no `Fencing-Scope`).
pub const WORKER_SCOPE: &str = "default";

/// What a worker reports, one JSON object per line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "kebab-case")]
pub enum Event {
    /// Running.
    Ready,
    /// Started job `seq` holding `token`; its write will go to `key`.
    Holding {
        /// The ledger key.
        key: String,
        /// The job's number.
        seq: u64,
        /// The token read for it.
        token: u64,
    },
    /// The job's write was accepted.
    Wrote {
        /// The ledger key.
        key: String,
        /// The job's number.
        seq: u64,
        /// The token it carried.
        token: u64,
        /// The embedded store's revision, 0 for another upstream.
        revision: u64,
    },
    /// The proxy rejected the job's write as stale (409).
    Rejected {
        /// The ledger key.
        key: String,
        /// The job's number.
        seq: u64,
        /// The token it carried.
        token: u64,
        /// The proxy's fence.
        current: u64,
    },
    /// The client refused to send: the token is known to be fenced out.
    NotLeader {
        /// The ledger key.
        key: String,
        /// The job's number.
        seq: u64,
        /// The token it would have carried.
        token: u64,
    },
    /// Anything else.
    Failed {
        /// The ledger key.
        key: String,
        /// The job's number.
        seq: u64,
        /// The token it carried.
        token: u64,
        /// The error.
        cause: String,
        /// Whether the write may have been applied anyway.
        indeterminate: bool,
    },
}

impl Event {
    /// The job's number and the outcome the worker learned, for events that end a job.
    pub fn outcome(&self) -> Option<(u64, Outcome)> {
        match self {
            Event::Ready | Event::Holding { .. } => None,
            Event::Wrote { seq, .. } => Some((*seq, Outcome::Ok)),
            Event::Rejected { seq, .. } => Some((*seq, Outcome::Rejected)),
            Event::NotLeader { seq, .. } => Some((*seq, Outcome::Failed)),
            Event::Failed {
                seq, indeterminate, ..
            } => Some((
                *seq,
                if *indeterminate {
                    Outcome::Indeterminate
                } else {
                    Outcome::Failed
                },
            )),
        }
    }

    /// Records this event of `writer` in `recorder`: a `Holding` invokes a write, an
    /// outcome completes it.
    pub fn record(&self, writer: &str, recorder: &mut Recorder) {
        if let Event::Holding { seq, token, .. } = self {
            recorder.invoke(WORKER_SCOPE, *token, writer, *seq);
        } else if let Some((seq, outcome)) = self.outcome() {
            recorder.complete(writer, seq, outcome);
        }
    }
}

/// One stdout line of a worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkerLine {
    /// An event.
    Event(Event),
    /// It stopped itself at this failpoint.
    Stopped(String),
    /// Anything else.
    Other(String),
}

impl WorkerLine {
    /// Parses a line.
    pub fn parse(line: &str) -> Self {
        if let Some(stop) = FailpointStop::parse(line) {
            return WorkerLine::Stopped(stop.name);
        }
        match serde_json::from_str(line) {
            Ok(event) => WorkerLine::Event(event),
            Err(_) => WorkerLine::Other(line.to_owned()),
        }
    }
}

/// How to start a worker.
#[derive(Debug, Clone, Default)]
pub struct WorkerSpec {
    /// Its name: the writer in ledger keys and in `X-Writer`.
    pub name: String,
    /// Its node's API base URL.
    pub node_url: String,
    /// The proxy's base URL.
    pub proxy_url: String,
    /// Milliseconds between reading the token and writing (default: the worker's).
    pub job_ms: Option<u64>,
    /// Retries of a failed write (default: the client's); the history's "exactly once"
    /// check wants 0.
    pub retries: Option<u32>,
    /// Extra environment (`PALISADE_FAILPOINT_STOP=client-before-send`).
    pub env: Vec<(String, String)>,
}

/// A running `palisade demo-worker`.
pub struct WorkerProcess {
    /// The process.
    pub guard: ChildGuard,
    /// Its name.
    pub name: String,
    lines: Lines,
}

impl WorkerProcess {
    /// Starts a worker with its log in `dir` and waits for its ready line.
    pub fn start(dir: &Path, spec: &WorkerSpec) -> Result<Self> {
        let mut args = vec![
            "demo-worker".to_owned(),
            "--node".to_owned(),
            spec.node_url.clone(),
            "--proxy".to_owned(),
            spec.proxy_url.clone(),
            "--name".to_owned(),
            spec.name.clone(),
        ];
        if let Some(ms) = spec.job_ms {
            args.extend(["--job-ms".to_owned(), ms.to_string()]);
        }
        if let Some(n) = spec.retries {
            args.extend(["--retries".to_owned(), n.to_string()]);
        }
        let launch = Launch {
            args,
            env: spec.env.clone(),
            prefix: Vec::new(),
        };
        let log = dir.join(format!("worker-{}.log", spec.name));
        let (guard, _, lines) = spawn_launch(
            &launch,
            &log,
            WORKER_READY_LINE,
            &format!("worker {}", spec.name),
        )?;
        Ok(Self {
            guard,
            name: spec.name.clone(),
            lines: Lines::new(lines),
        })
    }

    /// `kill -9`s the worker and returns every line it printed that was not polled yet
    /// (up to the end of its stdout), so that no write it started goes unrecorded.
    pub fn kill9_and_drain(&mut self) -> Vec<WorkerLine> {
        self.guard.kill9();
        self.lines
            .drain_to_end(std::time::Duration::from_millis(DRAIN_TIMEOUT_MS))
            .iter()
            .map(|l| WorkerLine::parse(l))
            .collect()
    }

    /// Every line printed since the last call, parsed, without waiting.
    pub fn poll(&self) -> Vec<WorkerLine> {
        self.lines
            .drain()
            .iter()
            .map(|l| WorkerLine::parse(l))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a worker's stdout lines are read as events, failpoint stops, or other.
    /// Method: parse one line of each kind.
    #[test]
    fn lines_parse_into_events_and_stops() {
        assert_eq!(
            WorkerLine::parse(r#"{"event":"holding","key":"ledger/w1-000001","seq":1,"token":4}"#),
            WorkerLine::Event(Event::Holding {
                key: "ledger/w1-000001".to_owned(),
                seq: 1,
                token: 4
            })
        );
        assert_eq!(
            WorkerLine::parse("palisade failpoint client-before-send reached (pid 7)"),
            WorkerLine::Stopped("client-before-send".to_owned())
        );
        assert!(matches!(WorkerLine::parse("hello"), WorkerLine::Other(_)));
    }

    /// Goal: a `holding` event invokes a write and an outcome completes it.
    /// Method: record two events and read the operation back.
    #[test]
    fn events_record_invocations_and_outcomes() {
        let mut r = Recorder::default();
        Event::Holding {
            key: "k".to_owned(),
            seq: 1,
            token: 3,
        }
        .record("w1", &mut r);
        assert_eq!(
            r.get("w1", 1).map(|o| o.outcome),
            Some(Outcome::Indeterminate)
        );
        Event::Rejected {
            key: "k".to_owned(),
            seq: 1,
            token: 3,
            current: 4,
        }
        .record("w1", &mut r);
        assert_eq!(r.get("w1", 1).map(|o| o.outcome), Some(Outcome::Rejected));
    }
}
