//! The history checker: what clients were told about their fenced writes, against what
//! the storage really applied, in apply order.
//!
//! A history has two halves. The operations: every write a client attempted, with its
//! scope, token, writer and sequence number (the pair `(writer, seq)` names it), and the
//! outcome the client saw. The apply log: every write the storage applied, in the order it
//! applied them, as the storage itself recorded them (the recording upstream of the tests,
//! or the embedded store's revisions in the demo). The checks, after Jepsen's:
//!
//! 1. **Applied tokens never decrease** per scope, from one applied write to the next.
//! 2. **No write lands under a higher token**: no write with token `t` is applied after
//!    any write of its scope with a token above `t` (the same fact as 1, reported against
//!    the highest earlier write rather than the neighbour, so each late write is named).
//! 3. **Every acknowledged write is applied exactly once**, with the token and scope it
//!    was sent with; and no write is applied more than once, whatever its outcome.
//! 4. **Rejected writes are never applied**, nor writes that failed before reaching the
//!    storage. Indeterminate writes (timed out, connection broken, killed) may or may not
//!    be.
//! 5. **Nothing is applied that no client attempted** (a write in the apply log with no
//!    operation: a test's bookkeeping is incomplete, or something wrote behind its back).
//!
//! "Exactly once" assumes one attempt per operation: a client that retries a write after
//! a timeout may have it applied twice. The tests' writers do not retry.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// What a client learned about one write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Outcome {
    /// Acknowledged: applied, the client was told.
    Ok,
    /// Rejected by the fence (409): never applied.
    Rejected,
    /// Failed before it could reach the storage (refused locally, no connection, a 4xx):
    /// never applied.
    Failed,
    /// Unknown: it may or may not have been applied (a timeout, a broken connection, a
    /// 5xx after forwarding, or the client died first).
    Indeterminate,
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Outcome::Ok => "ok",
            Outcome::Rejected => "rejected",
            Outcome::Failed => "failed",
            Outcome::Indeterminate => "indeterminate",
        })
    }
}

/// One write a client attempted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    /// Its fencing scope.
    pub scope: String,
    /// The token it carried.
    pub token: u64,
    /// Who wrote it.
    pub writer: String,
    /// The writer's sequence number; `(writer, seq)` names the write.
    pub seq: u64,
    /// What the client learned.
    pub outcome: Outcome,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}#{} (token {}, scope {}, {})",
            self.writer, self.seq, self.token, self.scope, self.outcome
        )
    }
}

/// One write as the storage applied it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// Its fencing scope.
    pub scope: String,
    /// The token it arrived with.
    pub token: u64,
    /// Its writer, as the request said.
    pub writer: String,
    /// Its sequence number, as the request said.
    pub seq: u64,
}

/// An applied write and its position in the apply log (0-based).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// Position in apply order.
    pub at: usize,
    /// The write.
    pub write: Applied,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}#{} (token {}) applied at position {}",
            self.write.writer, self.write.seq, self.write.token, self.at
        )
    }
}

/// Client operations and the storage's apply log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct History {
    /// Every write attempted, in any order.
    pub ops: Vec<Op>,
    /// Every write applied, in apply order.
    pub applied: Vec<Applied>,
}

/// One broken rule, with the operations involved.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Violation {
    /// Check 1: an applied write's token is below its predecessor's in the same scope.
    TokenDecreased {
        /// The scope.
        scope: String,
        /// The predecessor.
        earlier: Step,
        /// The write applied next, with a lower token.
        later: Step,
    },
    /// Check 2: a write landed after a higher-token write of its scope.
    AppliedAfterHigher {
        /// The scope.
        scope: String,
        /// The late write.
        late: Step,
        /// The highest-token write applied before it.
        higher: Step,
    },
    /// Check 3: an acknowledged write is not in the apply log.
    AckedNotApplied {
        /// The write.
        op: Op,
    },
    /// Check 3: a write was applied more than once.
    AppliedTwice {
        /// The write's operation, when one was recorded.
        op: Option<Op>,
        /// Each application.
        steps: Vec<Step>,
    },
    /// Check 3: a write was applied with another token or scope than it was sent with.
    AppliedDiffers {
        /// What the client sent.
        op: Op,
        /// What the storage applied.
        step: Step,
    },
    /// Check 4: a rejected or failed write was applied.
    RefusedButApplied {
        /// The write.
        op: Op,
        /// Where it was applied.
        step: Step,
    },
    /// Check 5: an applied write that no operation accounts for.
    Unrecorded {
        /// The write.
        step: Step,
    },
    /// The history itself is ambiguous: two operations share a name.
    DuplicateOp {
        /// The first.
        first: Op,
        /// The second.
        second: Op,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::TokenDecreased {
                scope,
                earlier,
                later,
            } => write!(
                f,
                "applied token went down in scope {scope}: {later}, right after {earlier}"
            ),
            Violation::AppliedAfterHigher {
                scope,
                late,
                higher,
            } => write!(
                f,
                "lower token landed after a higher one in scope {scope}: {late}, after {higher}"
            ),
            Violation::AckedNotApplied { op } => {
                write!(f, "acknowledged write {op} was never applied")
            }
            Violation::AppliedTwice { op, steps } => {
                let at: Vec<String> = steps.iter().map(|s| s.at.to_string()).collect();
                match op {
                    Some(op) => write!(f, "write {op} applied {} times", steps.len())?,
                    None => write!(f, "an unrecorded write applied {} times", steps.len())?,
                }
                write!(f, ", at positions {}", at.join(", "))
            }
            Violation::AppliedDiffers { op, step } => write!(
                f,
                "write {op} was applied with token {} in scope {}: {step}",
                step.write.token, step.write.scope
            ),
            Violation::RefusedButApplied { op, step } => {
                write!(f, "{} write {op} was applied: {step}", op.outcome)
            }
            Violation::Unrecorded { step } => write!(
                f,
                "applied write no client attempted: {step} in scope {}",
                step.write.scope
            ),
            Violation::DuplicateOp { first, second } => write!(
                f,
                "two operations are named {}#{}: {first} and {second}",
                first.writer, first.seq
            ),
        }
    }
}

/// What [`check`] found: counts, and every violation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Operations by outcome.
    pub outcomes: BTreeMap<Outcome, usize>,
    /// Writes in the apply log.
    pub applied: usize,
    /// Applied writes per scope and token.
    pub per_token: BTreeMap<(String, u64), usize>,
    /// Every broken rule.
    pub violations: Vec<Violation>,
}

impl Report {
    /// Whether every check passed.
    pub fn holds(&self) -> bool {
        self.violations.is_empty()
    }

    /// Operations checked.
    pub fn ops(&self) -> usize {
        self.outcomes.values().sum()
    }

    /// Operations with `outcome`.
    pub fn count(&self, outcome: Outcome) -> usize {
        self.outcomes.get(&outcome).copied().unwrap_or(0)
    }

    /// One line of counts: `120 writes checked (ok 100, rejected 3, failed 0,
    /// indeterminate 17) against 110 applied: 0 violations`.
    pub fn summary(&self) -> String {
        format!(
            "{} writes checked (ok {}, rejected {}, failed {}, indeterminate {}) against {} applied: {} violations",
            self.ops(),
            self.count(Outcome::Ok),
            self.count(Outcome::Rejected),
            self.count(Outcome::Failed),
            self.count(Outcome::Indeterminate),
            self.applied,
            self.violations.len()
        )
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.summary())?;
        for v in &self.violations {
            write!(f, "\n  - {v}")?;
        }
        Ok(())
    }
}

/// Runs every check on `history`.
pub fn check(history: &History) -> Report {
    let mut report = Report {
        applied: history.applied.len(),
        ..Report::default()
    };
    let steps: Vec<Step> = history
        .applied
        .iter()
        .enumerate()
        .map(|(at, write)| Step {
            at,
            write: write.clone(),
        })
        .collect();
    for step in &steps {
        *report
            .per_token
            .entry((step.write.scope.clone(), step.write.token))
            .or_insert(0) += 1;
    }
    check_order(&steps, &mut report.violations);

    // Operations by name.
    let mut ops: BTreeMap<(&str, u64), &Op> = BTreeMap::new();
    for op in &history.ops {
        *report.outcomes.entry(op.outcome).or_insert(0) += 1;
        if let Some(first) = ops.insert((op.writer.as_str(), op.seq), op) {
            report.violations.push(Violation::DuplicateOp {
                first: first.clone(),
                second: op.clone(),
            });
        }
    }
    // Applications by name.
    let mut applied: BTreeMap<(&str, u64), Vec<&Step>> = BTreeMap::new();
    for step in &steps {
        applied
            .entry((step.write.writer.as_str(), step.write.seq))
            .or_default()
            .push(step);
    }

    for (name, op) in &ops {
        let found = applied.get(name).map_or(&[][..], Vec::as_slice);
        match op.outcome {
            Outcome::Ok if found.is_empty() => {
                report
                    .violations
                    .push(Violation::AckedNotApplied { op: (*op).clone() });
            }
            Outcome::Rejected | Outcome::Failed => {
                for step in found {
                    report.violations.push(Violation::RefusedButApplied {
                        op: (*op).clone(),
                        step: (*step).clone(),
                    });
                }
            }
            Outcome::Ok | Outcome::Indeterminate => {}
        }
        if found.len() > 1 {
            report.violations.push(Violation::AppliedTwice {
                op: Some((*op).clone()),
                steps: found.iter().map(|s| (*s).clone()).collect(),
            });
        }
        for step in found {
            if step.write.token != op.token || step.write.scope != op.scope {
                report.violations.push(Violation::AppliedDiffers {
                    op: (*op).clone(),
                    step: (*step).clone(),
                });
            }
        }
    }
    let named: BTreeSet<(&str, u64)> = ops.keys().copied().collect();
    for (name, found) in &applied {
        if named.contains(name) {
            continue;
        }
        for step in found {
            report.violations.push(Violation::Unrecorded {
                step: (*step).clone(),
            });
        }
        if found.len() > 1 {
            report.violations.push(Violation::AppliedTwice {
                op: None,
                steps: found.iter().map(|s| (*s).clone()).collect(),
            });
        }
    }
    report
}

/// Checks 1 and 2, per scope, on the apply log.
fn check_order(steps: &[Step], violations: &mut Vec<Violation>) {
    // Per scope: the previous write, and the highest-token write so far.
    let mut last: BTreeMap<&str, (&Step, &Step)> = BTreeMap::new();
    for step in steps {
        let scope = step.write.scope.as_str();
        let Some((previous, highest)) = last.get(scope).copied() else {
            last.insert(scope, (step, step));
            continue;
        };
        if step.write.token < previous.write.token {
            violations.push(Violation::TokenDecreased {
                scope: scope.to_owned(),
                earlier: previous.clone(),
                later: step.clone(),
            });
        }
        if step.write.token < highest.write.token {
            violations.push(Violation::AppliedAfterHigher {
                scope: scope.to_owned(),
                late: step.clone(),
                higher: highest.clone(),
            });
        }
        let highest = if step.write.token > highest.write.token {
            step
        } else {
            highest
        };
        last.insert(scope, (step, highest));
    }
}

/// Builds the operations half of a history as writes are attempted and answered.
#[derive(Debug, Clone, Default)]
pub struct Recorder {
    ops: BTreeMap<(String, u64), Op>,
}

impl Recorder {
    /// A write is about to be sent: recorded as indeterminate until [`complete`](Self::complete).
    pub fn invoke(&mut self, scope: &str, token: u64, writer: &str, seq: u64) {
        self.ops.insert(
            (writer.to_owned(), seq),
            Op {
                scope: scope.to_owned(),
                token,
                writer: writer.to_owned(),
                seq,
                outcome: Outcome::Indeterminate,
            },
        );
    }

    /// The client learned the outcome of `writer`'s write `seq`. Returns false when no such
    /// write was invoked.
    pub fn complete(&mut self, writer: &str, seq: u64, outcome: Outcome) -> bool {
        match self.ops.get_mut(&(writer.to_owned(), seq)) {
            Some(op) => {
                op.outcome = outcome;
                true
            }
            None => false,
        }
    }

    /// One write, invoked and completed at once.
    pub fn record(&mut self, op: Op) {
        self.ops.insert((op.writer.clone(), op.seq), op);
    }

    /// The operations so far; those not completed are indeterminate.
    pub fn ops(&self) -> Vec<Op> {
        self.ops.values().cloned().collect()
    }

    /// Operations with `outcome`.
    pub fn count(&self, outcome: Outcome) -> usize {
        self.ops.values().filter(|o| o.outcome == outcome).count()
    }

    /// The operation named `(writer, seq)`.
    pub fn get(&self, writer: &str, seq: u64) -> Option<&Op> {
        self.ops.get(&(writer.to_owned(), seq))
    }
}

#[cfg(test)]
mod tests;
