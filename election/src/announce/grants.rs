//! Fence on grant: before a campaign answers with a named scope's token, every announce
//! proxy fences that scope at the token, so the previous holder is fenced out before the
//! new holder's first write.
//!
//! The leader (established) follows the applied machine: for each held scope whose token
//! is not fenced yet, it announces `(scope, token, proof)` to every proxy of the announce
//! list, as the cluster's own announcer does for terms (same client, same retries). When
//! all accepted, the scope's token is published in [`Fenced`]; the campaign waits for it.
//! - A proxy holding a higher fence for the scope (an earlier cluster or an operator
//!   raised it) makes the leader propose a raise: the holder is granted again with a token
//!   above that fence (see `scopes::machine`), and the new token is announced in turn.
//! - A proxy that cannot be reached is retried until the grant changes. Meanwhile the
//!   campaign answers 503 `fence-pending` at its timeout, without a token: no token is
//!   out that the proxy has not fenced, and the previous holder's writes through that
//!   proxy are still refused once the new holder's first write (with a higher token)
//!   reaches it. A retired proxy, or one that refuses for good, leaves the scope pending.
//! - An empty announce list fences every grant at once.
//! - Every change of leadership or of the list starts over.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::{mpsc, watch};
use tokio::task::AbortHandle;
use tracing::{Instrument as _, info, warn};

use super::{Announcer, Answer, announce_one, target};
use crate::node::Commands;
use crate::scopes::{Machine, Op};

/// Per held scope, the token every announce proxy fences it at (defined with the scopes,
/// which the named-leaderships service reads).
pub(crate) use crate::scopes::Fenced;

/// What the fencer needs.
pub(crate) struct GrantFencer {
    /// The announcer settings (TLS, bearer, signer, leadership, metrics, shutdown).
    pub template: Announcer,
    /// The applied machine.
    pub machine: watch::Receiver<Arc<Machine>>,
    /// The announce list.
    pub lists: watch::Receiver<Vec<String>>,
    /// Where fenced grants are published.
    pub fenced: watch::Sender<Fenced>,
    /// For raises.
    pub commands: Commands,
}

/// One announcement round's end: the scope, its token, and the proxies' answers.
struct Done {
    scope: String,
    token: u64,
    session: String,
    answers: Vec<Answer>,
}

/// Runs the fencer until shutdown.
pub(crate) async fn fence_grants(mut f: GrantFencer) {
    let (done_tx, mut done_rx) = mpsc::channel::<Done>(64);
    let mut inflight: HashMap<String, (u64, AbortHandle)> = HashMap::new();
    let mut leadership = f.template.leadership.clone();
    loop {
        let leading = leadership.borrow_and_update().established.is_some();
        let urls = f.lists.borrow_and_update().clone();
        let machine = Arc::clone(&f.machine.borrow_and_update());
        if leading {
            start_rounds(&f, &machine, &urls, &mut inflight, &done_tx);
        } else {
            stop_all(&f, &mut inflight);
        }
        let shutdown = f.template.shutdown.clone();
        // Biased (in the order written) rather than tokio's random pick, so that the
        // simulation replays a seed. The watches are read at the top of each turn, so a
        // watch branch fires only for a change made since; the rounds' ends come before
        // the machine's changes, which a busy cluster makes all the time.
        tokio::select! {
            biased;
            () = shutdown.cancelled() => {
                stop_all(&f, &mut inflight);
                return;
            }
            Some(done) = done_rx.recv() => on_done(&f, &mut inflight, done),
            changed = leadership.changed() => {
                if changed.is_err() { return; }
                // A new term or a lost one: everything is announced again.
                stop_all(&f, &mut inflight);
            }
            changed = f.lists.changed() => {
                if changed.is_err() { return; }
                stop_all(&f, &mut inflight);
            }
            changed = f.machine.changed() => {
                if changed.is_err() { return; }
            }
        }
    }
}

/// Forgets every round and every fenced grant.
fn stop_all(f: &GrantFencer, inflight: &mut HashMap<String, (u64, AbortHandle)>) {
    for (_, (_, handle)) in inflight.drain() {
        handle.abort();
    }
    f.fenced.send_if_modified(|fenced| {
        let had = !fenced.is_empty();
        fenced.clear();
        had
    });
}

/// Starts a round for each held scope whose token is neither fenced nor in a round;
/// forgets fenced grants that are no longer held.
fn start_rounds(
    f: &GrantFencer,
    machine: &Machine,
    urls: &[String],
    inflight: &mut HashMap<String, (u64, AbortHandle)>,
    done_tx: &mpsc::Sender<Done>,
) {
    f.fenced.send_if_modified(|fenced| {
        let before = fenced.len();
        fenced.retain(|scope, token| machine.holder(scope).is_some_and(|h| h.token == *token));
        before != fenced.len()
    });
    let fenced = f.fenced.borrow().clone();
    for (scope, record) in &machine.scopes {
        let Some(holder) = &record.holder else {
            continue;
        };
        if fenced.get(scope) == Some(&holder.token)
            || inflight.get(scope).is_some_and(|(t, _)| *t == holder.token)
        {
            continue;
        }
        if let Some((_, old)) = inflight.remove(scope) {
            old.abort();
        }
        if urls.is_empty() {
            f.fenced.send_modify(|fenced| {
                fenced.insert(scope.clone(), holder.token);
            });
            continue;
        }
        let handle = tokio::spawn(
            round(
                f.template.clone(),
                urls.to_vec(),
                scope.clone(),
                holder.token,
                holder.session.clone(),
                done_tx.clone(),
            )
            .in_current_span(),
        )
        .abort_handle();
        inflight.insert(scope.clone(), (holder.token, handle));
    }
}

/// Announces one grant to every proxy at once.
async fn round(
    a: Announcer,
    urls: Vec<String>,
    scope: String,
    token: u64,
    session: String,
    done: mpsc::Sender<Done>,
) {
    let proof = a
        .signer
        .as_ref()
        .map(|s| s.sign_scope(&scope, token).encode());
    let mut set = tokio::task::JoinSet::new();
    let mut answers = Vec::new();
    for entry in &urls {
        let t = target(&a, entry);
        match t.admin {
            Ok(admin) => {
                set.spawn(announce_one(
                    admin,
                    t.entry,
                    scope.clone(),
                    token,
                    proof.clone(),
                    a.metrics.clone(),
                    Arc::clone(&a.observer),
                ));
            }
            Err(_) => answers.push(Answer::Refused),
        }
    }
    while let Some(joined) = set.join_next().await {
        answers.push(joined.unwrap_or(Answer::Refused));
    }
    let _ = done
        .send(Done {
            scope,
            token,
            session,
            answers,
        })
        .await;
}

/// A round ended: publish the fenced grant, or propose a raise above a higher fence.
fn on_done(f: &GrantFencer, inflight: &mut HashMap<String, (u64, AbortHandle)>, done: Done) {
    if inflight
        .get(&done.scope)
        .is_some_and(|(t, _)| *t == done.token)
    {
        inflight.remove(&done.scope);
    }
    if done.answers.iter().all(|a| *a == Answer::Accepted) {
        info!(scope = %done.scope, token = done.token, "every announce proxy fences the grant");
        f.fenced.send_modify(|fenced| {
            fenced.insert(done.scope, done.token);
        });
        return;
    }
    let higher = done
        .answers
        .iter()
        .filter_map(|a| match a {
            Answer::Higher { current } => Some(*current),
            _ => None,
        })
        .max();
    if let Some(above) = higher {
        info!(scope = %done.scope, token = done.token, above,
            "a proxy fences this scope above the grant; granting the holder again above it");
        let commands = f.commands.clone();
        let op = Op::Raise {
            session: done.session,
            scope: done.scope,
            above,
        };
        tokio::spawn(async move {
            if let Err(err) = commands.scope(op).await {
                warn!(cause = %err, "raise not applied; the grant stays pending");
            }
        });
    } else {
        warn!(scope = %done.scope, token = done.token,
            "a proxy refused the grant; it stays pending (see the status page's announce board)");
    }
}
