//! Sequences of fence operations (admit, admit and hold, release, reset, read, reopen)
//! through the proxy's fencer and the storage's fence register, against a model.
//!
//! Property: the fence of a scope never goes down except by an explicit reset; a stale
//! token is refused, a higher one raises the fence, and a higher one waiting at the
//! barrier behind a lower one in flight times out; a reset waits for (and, here, times
//! out on) requests in flight and otherwise sets the fence; new scopes beyond the limit
//! are refused while reserved ones never are; and what is read back, from memory and
//! from a register reopened on the same database, is what was committed.
#![no_main]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use palisade_proxy::ProxyError;
use palisade_proxy::fuzzing::{Admitted, Fences};
use palisade_storage::FenceRegister;

/// Scopes the operations pick from; the first is reserved, as `default` is in a proxy.
const SCOPES: [&str; 6] = ["default", "a", "b", "c", "d", "e"];
/// New (unreserved) scopes the register takes: fewer than `SCOPES` has, so the limit is met.
const SCOPES_MAX: usize = 3;
/// The barrier's wait, in the runtime's paused time.
const BARRIER_TIMEOUT_MS: u64 = 50;
/// Operations per input, at most.
const OPS_MAX: usize = 256;

static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a runtime")
});

fn database() -> Arc<redb::Database> {
    Arc::new(
        redb::Database::builder()
            .create_with_backend(redb::backends::InMemoryBackend::new())
            .expect("an in-memory database"),
    )
}

fn open(db: &Arc<redb::Database>) -> Fences {
    let register = FenceRegister::open_reserved(
        Arc::clone(db),
        SCOPES_MAX,
        std::iter::once(SCOPES[0].to_owned()),
    )
    .expect("the register opens");
    Fences::new(register, Duration::from_millis(BARRIER_TIMEOUT_MS))
}

fn token(byte: u8) -> u64 {
    // Mostly small tokens, so that sequences collide; a few at the top of the range.
    if byte < 240 {
        u64::from(byte / 8)
    } else {
        u64::MAX - u64::from(byte - 240)
    }
}

/// What the fences must be.
#[derive(Default)]
struct Model {
    fences: BTreeMap<&'static str, u64>,
    /// Unreserved scopes that hold a slot of `SCOPES_MAX`.
    slots: BTreeSet<&'static str>,
}

impl Model {
    fn fence(&self, scope: &str) -> u64 {
        self.fences.get(scope).copied().unwrap_or(0)
    }

    /// Whether `scope` may get a fence entry now.
    fn has_room(&self, scope: &'static str) -> bool {
        scope == SCOPES[0] || self.slots.contains(scope) || self.slots.len() < SCOPES_MAX
    }

    fn take_slot(&mut self, scope: &'static str) {
        if scope != SCOPES[0] {
            self.slots.insert(scope);
        }
    }

    fn listed(&self) -> Vec<(String, u64)> {
        self.fences
            .iter()
            .filter(|&(_, &t)| t > 0)
            .map(|(s, t)| ((*s).to_owned(), *t))
            .collect()
    }
}

async fn run(data: &[u8]) {
    let db = database();
    let mut fences = open(&db);
    let mut model = Model::default();
    let mut held: Vec<(&'static str, u64, Admitted)> = Vec::new();
    for op in data.chunks_exact(3).take(OPS_MAX) {
        let scope = SCOPES[usize::from(op[1]) % SCOPES.len()];
        let token = token(op[2]);
        let fence = model.fence(scope);
        let lower_held = held.iter().any(|(s, t, _)| *s == scope && *t < token);
        let any_held = held.iter().any(|(s, _, _)| *s == scope);
        match op[0] % 6 {
            kind @ (0 | 1) => {
                let got = fences.admit(scope, token).await;
                let raises = token > fence;
                match got {
                    Err(ProxyError::Stale { current, .. }) => {
                        assert!(
                            token < fence,
                            "{scope}: {token} refused as stale at {fence}"
                        );
                        assert_eq!(current, fence);
                    }
                    Err(ProxyError::ScopesFull { .. }) => {
                        assert!(raises && !model.has_room(scope), "{scope}: refused as full");
                    }
                    Err(ProxyError::BarrierTimeout { .. }) => {
                        assert!(
                            lower_held,
                            "{scope}: {token} timed out with nothing lower held"
                        );
                        // The fence was raised before the barrier.
                        if raises {
                            model.take_slot(scope);
                            model.fences.insert(scope, token);
                        }
                    }
                    Err(other) => panic!("{scope}: admitting {token} failed: {other}"),
                    Ok(admitted) => {
                        assert!(
                            token >= fence,
                            "{scope}: {token} admitted below fence {fence}"
                        );
                        assert!(
                            !lower_held,
                            "{scope}: {token} passed a lower token in flight"
                        );
                        assert_eq!(admitted.raised, raises, "{scope}: {token} over {fence}");
                        if raises {
                            assert!(model.has_room(scope), "{scope}: admitted past the limit");
                            model.take_slot(scope);
                            model.fences.insert(scope, token);
                        }
                        if kind == 1 {
                            held.push((scope, token, admitted));
                        }
                    }
                }
            }
            2 => held.retain(|(s, _, _)| *s != scope),
            3 => {
                let got = fences.reset(scope, token).await;
                match got {
                    Err(ProxyError::ResetTimeout { .. }) => {
                        assert!(any_held, "{scope}: reset timed out with nothing in flight");
                    }
                    Err(ProxyError::ScopesFull { .. }) => {
                        assert!(
                            token > 0 && !model.has_room(scope),
                            "{scope}: reset refused"
                        );
                    }
                    Err(other) => panic!("{scope}: reset to {token} failed: {other}"),
                    Ok(previous) => {
                        assert!(!any_held, "{scope}: reset while a request is in flight");
                        assert_eq!(previous, fence, "{scope}: reset found another fence");
                        if token > 0 || model.fences.contains_key(scope) {
                            model.take_slot(scope);
                            model.fences.insert(scope, token);
                        }
                    }
                }
            }
            4 => {
                assert_eq!(
                    fences.register().current(scope),
                    fence,
                    "{scope} reads back"
                );
                assert_eq!(fences.register().list(), model.listed());
            }
            _ => {
                if held.is_empty() {
                    drop(fences);
                    fences = open(&db);
                    assert_eq!(fences.register().list(), model.listed(), "after reopening");
                }
            }
        }
        // Whatever happened, memory agrees with the model.
        assert_eq!(
            fences.register().current(scope),
            model.fence(scope),
            "{scope}"
        );
    }
}

fuzz_target!(|data: &[u8]| {
    RUNTIME.block_on(run(data));
});
