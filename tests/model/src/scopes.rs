//! Named leaderships (`docs/scopes.md`) as a `stateright` model: sessions kept alive on
//! the leader's clock, expiry, a failover with the new leader's TTL grace, a grant to
//! the next waiter with a token that only grows, fence on grant, and clients writing
//! through proxies in front of one storage.
//!
//! # What is modelled
//!
//! Two clients, each with one session, and one scope. Client 0 holds the scope at the
//! start (token 1, fenced at every proxy); client 1 may campaign for it at any time and
//! waits. Two leaders serve in sequence: leader 1 is established at the start and may
//! stop at any moment ([`Action::Stop`]); some ticks later (the election, any length)
//! leader 2 takes office ([`Action::TakeOffice`]). Only the leader in office tracks
//! deadlines, commits expiries and campaigns, fences and answers campaigns; a grant
//! lives in the replicated state, so it survives the failover, and leader 2 fences it
//! again from the start ("every change of leadership starts over"). An expiry is
//! proposed once the deadline has passed and committed later; from the proposal on the
//! leader refuses the session's keepalives (`Lessor::keepalive`'s "no resurrection"). A
//! revoke leader 1 proposed may reach leader 2's log or be lost; if it did, leader 2
//! applies it before it answers anything (it is established only once it has applied
//! an entry of its own term). One or two proxies
//! stand in front of one storage; each has a fence per scope and the in-flight barrier
//! of `proxy/src/fencing.rs` (a write is forwarded only once no lower token of the
//! scope is in flight there; an advance answers only then too).
//!
//! # Time and drift
//!
//! Time is discrete: one global tick at a time ([`Action::Tick`]) and any number of
//! other actions between two ticks. The reference clock is the leaders' (they measure
//! the TTL: a keepalive taken at `r` sets the deadline `r + ttl`). A client measures
//! its trust, `ttl - drift` after it *sent* its last answered keepalive, on its own
//! clock, which may run slow against the leader's by the drift bound: in reference
//! ticks that interval lasts at most `ttl` (and one of `ttl`, the rule without the
//! drift term, up to `ttl + drift`). As in the fleet model, the model gives every
//! trust interval exactly its longest life ([`Bounds::trust_ticks`]), counted from the
//! send: a client whose clock runs faster stops trusting earlier, which only removes
//! behaviours. So one conservative bound covers every clock rate within the drift
//! bound, without a clock per process.
//!
//! # Pauses, loss and delay
//!
//! Nothing forces a client, a leader or a proxy to act: a client paused for any number
//! of ticks is a run in which it takes no step while the clock ticks. The network is a
//! set: a keepalive, its answer or a write may wait there any number of ticks, be taken
//! out in any order, or be lost; so may the answer to a campaign (the grant), which can
//! reach its client after a failover or after the client's session expired. A client
//! has at most one keepalive (or its answer) out at a time; one that is lost is the
//! same as one that timed out. A campaign and the fencing of one proxy (the announce,
//! the proxy's barrier and its answer) are single steps of the leader in office:
//! delaying one is not taking it yet, and a fence raised sooner only refuses more.
//!
//! # The properties
//!
//! - [`PROP_ORDERED`] (always): the storage never applies a lower token after a higher
//!   one. The data claim.
//! - [`PROP_TRUST_SOUND`] (always): no client trusts a session that the cluster has
//!   expired. The client's loss rule is sound, given the grace rule.
//! - [`PROP_ONE_BELIEVER`] (always): at most one client holds a grant and trusts its
//!   session at a time.
//! - [`PROP_PREDECESSOR_FENCED_OUT`] (always): once a grant is delivered, no proxy admits
//!   a write with a lower token. This is what fence on grant buys with one proxy: there
//!   the proxy's own check and barrier already keep [`PROP_ORDERED`] (the previous
//!   holder's delayed write is admitted only until the new holder's first write raises
//!   the fence, and applied before it), so without fence on grant the one-proxy model
//!   breaks this property, not the order. With two proxies the order breaks too: the
//!   new holder's write raises the fence at one proxy only, and the old holder's
//!   delayed write through the other is admitted and applied after it.
//! - `sometimes`: the second holder's write is applied ([`PROP_SECOND_HOLDER_WRITES`]),
//!   an old-holder write lands after its session expired ([`PROP_STALE_WRITE_LANDS`]),
//!   and leader 2 delivers a grant ([`PROP_GRANT_AFTER_FAILOVER`]).
//!
//! # The switches
//!
//! [`Bounds`] removes one rule at a time: the new leader's grace ([`Bounds::grace`]),
//! fence on grant ([`Bounds::fence_on_grant`]), the drift term of the client's loss
//! rule ([`Bounds::loss_rule_drift`]). A fourth, [`Bounds::deposed_leader_answers`],
//! states an assumption rather than a rule: as designed, leader 1 answers nothing once
//! out of office. A leader paused over the election that answers a keepalive on waking,
//! before it learns of the new term, breaks [`PROP_TRUST_SOUND`]: its answer gives the
//! client a trust that leader 2's deadline does not cover. (The data stay safe: the
//! fence does not depend on the client's trust.)
use std::collections::BTreeSet;

use stateright::{Model, Property};

/// The storage never applies a write with a lower token after one with a higher token.
pub const PROP_ORDERED: &str = "no lower token applied after a higher one";
/// A client that still trusts its session is never one whose session the cluster has
/// expired.
pub const PROP_TRUST_SOUND: &str = "no client trusts an expired session";
/// At most one client believes it holds the scope (holds a grant, trusts its session).
pub const PROP_ONE_BELIEVER: &str = "at most one client believes it holds the scope";
/// Once a grant of token `t` is delivered, no proxy admits a write below `t`.
pub const PROP_PREDECESSOR_FENCED_OUT: &str =
    "no proxy admits a lower token once a grant is delivered";
/// Not vacuous: some run has a write of client 1, the second holder, applied.
pub const PROP_SECOND_HOLDER_WRITES: &str = "the second holder's write is applied";
/// Not vacuous: some run has client 0's write (token 1) applied after its session was
/// expired (safely, before anything higher).
pub const PROP_STALE_WRITE_LANDS: &str = "the expired holder's write lands after its expiry";
/// Not vacuous: some run has leader 2 deliver a grant (the failover on its path).
pub const PROP_GRANT_AFTER_FAILOVER: &str = "leader 2 delivers a grant";

/// The number of clients (and sessions).
pub const CLIENTS: usize = 2;

/// The most proxies the model takes (the acknowledgements are bits of a `u8`).
pub const PROXIES_MAX: usize = 8;

/// The bounds of one check, and the rules under test.
// Each switch removes one rule on its own; an enum of combinations would hide that.
#[allow(clippy::struct_excessive_bools)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// How many proxies stand in front of the storage (1 or 2 in the tests).
    pub proxies: usize,
    /// The session TTL in the leader's ticks.
    pub ttl_ticks: u8,
    /// The drift bound in ticks over one TTL: a client's clock may make an interval last
    /// this much longer in the leader's ticks.
    pub drift_ticks: u8,
    /// How many writes each client may send in a run.
    pub writes: u8,
    /// The new leader's grace (as designed, true): on taking office it gives every
    /// session a full TTL from then. Without it, the deadlines that lived in the old
    /// leader's memory are gone and the new leader treats every session as due at once:
    /// one that has not kept alive with it may be expired right away.
    pub grace: bool,
    /// Fence on grant (as designed, true): a grant is delivered only once every proxy
    /// fences its token (and has no lower write in flight).
    pub fence_on_grant: bool,
    /// The drift term of the client's loss rule (as designed, true): the client trusts
    /// `ttl - drift` of its own clock, at most `ttl` of the leader's. Without it, the
    /// client trusts `ttl` of its own clock, up to `ttl + drift` of the leader's.
    pub loss_rule_drift: bool,
    /// A broken variant when true: a leader deposed without knowing it (paused over the
    /// election) still answers keepalives, as an established leader does, after leader 2
    /// took office, and a client may still send them to it. As designed (false), leader
    /// 1 answers nothing once it is out of office.
    pub deposed_leader_answers: bool,
}

impl Bounds {
    /// The default check: `proxies` proxies, a TTL of 2 ticks, a drift of 1 tick, one
    /// write per client, every rule as designed.
    pub fn small(proxies: usize) -> Self {
        Self {
            proxies,
            ttl_ticks: 2,
            drift_ticks: 1,
            writes: 1,
            grace: true,
            fence_on_grant: true,
            loss_rule_drift: true,
            deposed_leader_answers: false,
        }
    }

    /// The longest a client's trust lasts in the leader's ticks, from the send of the
    /// keepalive whose answer gave it.
    pub fn trust_ticks(&self) -> u8 {
        if self.loss_rule_drift {
            self.ttl_ticks
        } else {
            self.ttl_ticks + self.drift_ticks
        }
    }

    /// Every proxy's bit.
    fn all_proxies(&self) -> u8 {
        ((1_u16 << self.proxies) - 1) as u8
    }
}

/// Who leads the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Office {
    /// Leader 1 is established.
    One,
    /// Leader 1 has stopped (crashed, paused or cut off); the election is under way and
    /// nobody commits anything.
    Election,
    /// Leader 2 is established.
    Two,
}

/// A message in the network (a set: delayed, reordered, lost at will).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Msg {
    /// A client's keepalive, addressed to a leader, with the ticks since it was sent
    /// (capped at the longest trust: older, its answer gives nothing).
    Keepalive {
        /// The client (and its session).
        client: u8,
        /// The leader it was sent to: 1 or 2.
        to: u8,
        /// Ticks since the client sent it.
        age: u8,
    },
    /// The answer to a keepalive, with the ticks since the keepalive was sent.
    Answer {
        /// The client.
        client: u8,
        /// Ticks since the client sent the keepalive.
        age: u8,
    },
    /// The answer to a campaign: the grant, with its token.
    Grant {
        /// The client.
        client: u8,
        /// The token granted.
        token: u8,
    },
    /// A client's write with its token, through a proxy.
    Write {
        /// The proxy it goes through.
        proxy: u8,
        /// The fencing token.
        token: u8,
    },
}

/// A client, as it sees itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Client {
    /// Ticks of trust left in its session (0: it treats the session as lost).
    pub trust_left: u8,
    /// The token of the grant delivered to it, if any.
    pub holds: Option<u8>,
    /// Whether it has campaigned (client 0 holds from the start and never does).
    pub campaigned: bool,
    /// Writes it may still send.
    pub writes_left: u8,
}

/// A session, as the cluster sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Session {
    /// Expired (a committed revoke); it never comes back.
    pub expired: bool,
    /// The leader in office has proposed its expiry (a revoke entry not yet committed):
    /// it refuses the session's keepalives from then on ("no resurrection").
    pub revoke_proposed: bool,
    /// Ticks until its deadline on the leader in office (0: due; kept at 0 while
    /// nobody is in office, as no lessor exists then).
    pub deadline_left: u8,
}

/// One proxy.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Proxy {
    /// The scope's durable fence.
    pub fence: u8,
    /// Admitted writes (their tokens) not yet applied by the storage, sorted.
    pub in_flight: Vec<u8>,
}

/// The whole system at one moment. Clocks are kept relative (ticks left, capped ages),
/// so the state space is finite and runs of any length are covered.
// The flags record independent facts about the run so far, each read by one property.
#[allow(clippy::struct_excessive_bools)]
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    /// Who leads.
    pub office: Office,
    /// The clients.
    pub clients: [Client; CLIENTS],
    /// Their sessions on the cluster.
    pub sessions: [Session; CLIENTS],
    /// The scope's holder in the replicated state.
    pub holder: Option<u8>,
    /// The session waiting for the scope.
    pub waiter: Option<u8>,
    /// The scope's last token (the holder's, when there is one).
    pub token: u8,
    /// The sessions leader 1 knew expired, or had proposed for expiry, when it left
    /// office, one bit each (kept only where a deposed leader 1 still answers: it
    /// refuses those).
    pub deposed_refuses: u8,
    /// The proxies that fence `token`, as acknowledged to the leader in office.
    pub fenced: u8,
    /// The highest token delivered to a client.
    pub delivered: u8,
    /// The proxies.
    pub proxies: Vec<Proxy>,
    /// The network.
    pub net: BTreeSet<Msg>,
    /// The highest token the storage has applied.
    pub highest_applied: u8,
    /// The storage applied a lower token after a higher one: the violation of
    /// [`PROP_ORDERED`].
    pub stale_applied: bool,
    /// A proxy admitted a token below one already delivered: the violation of
    /// [`PROP_PREDECESSOR_FENCED_OUT`].
    pub stale_admitted: bool,
    /// Client 0's token-1 write was applied after its session expired.
    pub stale_landed: bool,
    /// Leader 2 delivered a grant.
    pub granted_by_two: bool,
}

/// One step of the system.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// The clock advances one tick: deadlines and trust run down, ages grow.
    Tick,
    /// Leader 1 stops leading.
    Stop,
    /// Leader 2 takes office. The revokes leader 1 proposed and that reached leader 2's
    /// log (the bits of `revokes`) are committed and applied first (a leader is
    /// established only once it has applied an entry of its own term); the others are
    /// lost. Then, with the grace, every session's deadline is a full TTL from now.
    TakeOffice {
        /// The sessions whose proposed revoke survives, one bit each.
        revokes: u8,
    },
    /// A client sends a keepalive to leader `to`.
    SendKeepalive {
        /// The client.
        client: u8,
        /// The leader addressed.
        to: u8,
    },
    /// A leader takes a keepalive: the deadline becomes now + TTL, and it answers.
    TakeKeepalive(Msg),
    /// A client takes a keepalive's answer: it trusts its session until the longest
    /// trust counted from the send.
    TakeAnswer(Msg),
    /// The leader in office proposes the expiry of a session past its deadline.
    ProposeExpiry {
        /// The client.
        client: u8,
    },
    /// The leader in office commits a proposed expiry; a holder's scope passes to the
    /// waiter with the next token.
    Expire {
        /// The client.
        client: u8,
    },
    /// The leader commits a client's campaign: it holds (next token) if nobody does,
    /// else it waits.
    Campaign {
        /// The client.
        client: u8,
    },
    /// Fence on grant, at one proxy: the proxy raises its fence to the holder's token
    /// and acknowledges once no lower write of its is in flight.
    Fence {
        /// The proxy.
        proxy: u8,
    },
    /// The leader answers the holder's campaign with its grant (once fenced).
    Deliver,
    /// The client takes the answer to its campaign: it holds the scope with that token.
    TakeGrant(Msg),
    /// A client holding a grant and trusting its session sends a write through a proxy.
    SendWrite {
        /// The client.
        client: u8,
        /// The proxy.
        proxy: u8,
    },
    /// A proxy admits a write (token at or above the fence, no lower one in flight),
    /// raises its fence and forwards it.
    Admit(Msg),
    /// The storage applies a forwarded write.
    Apply {
        /// The proxy.
        proxy: u8,
        /// The write's index in its in-flight set.
        index: u8,
    },
    /// The network loses a message.
    Drop(Msg),
}

/// The model: the bounds of one check.
#[derive(Clone, Debug)]
pub struct ScopesModel {
    /// The bounds.
    pub bounds: Bounds,
}

impl ScopesModel {
    /// A model with these bounds (proxies cut to `1..=PROXIES_MAX`).
    pub fn new(mut bounds: Bounds) -> Self {
        bounds.proxies = bounds.proxies.clamp(1, PROXIES_MAX);
        Self { bounds }
    }

    /// Whether the leader in office can commit and answer (nobody during an election).
    fn in_office(state: &State) -> bool {
        state.office != Office::Election
    }

    /// Whether leader `to` answers keepalives now: the one in office, or leader 1 deposed
    /// without knowing it where the bounds allow that.
    fn answers(&self, state: &State, to: u8) -> bool {
        match (to, state.office) {
            (1, Office::One) | (2, Office::Two) => true,
            (1, _) => self.bounds.deposed_leader_answers,
            _ => false,
        }
    }

    /// Whether a client has a keepalive or its answer in the network.
    fn keeping_alive(state: &State, client: u8) -> bool {
        state.net.iter().any(|msg| match *msg {
            Msg::Keepalive { client: c, .. } | Msg::Answer { client: c, .. } => c == client,
            Msg::Grant { .. } | Msg::Write { .. } => false,
        })
    }

    /// The sessions whose expiry is proposed, one bit each.
    fn revokes_proposed(state: &State) -> u8 {
        (0..CLIENTS).fold(0, |mask, client| {
            if state.sessions[client].revoke_proposed {
                mask | (1 << client)
            } else {
                mask
            }
        })
    }

    /// Whether the proxy has no write below `token` in flight.
    fn barrier_clear(state: &State, proxy: usize, token: u8) -> bool {
        state.proxies[proxy].in_flight.iter().all(|&t| t >= token)
    }

    /// Whether the client believes it holds the scope.
    fn believes(client: Client) -> bool {
        client.holds.is_some() && client.trust_left > 0
    }

    /// One tick of the reference clock.
    fn tick(&self, state: &mut State) {
        let cap = self.bounds.trust_ticks();
        for session in &mut state.sessions {
            session.deadline_left = session.deadline_left.saturating_sub(1);
        }
        for client in &mut state.clients {
            client.trust_left = client.trust_left.saturating_sub(1);
        }
        state.net = std::mem::take(&mut state.net)
            .into_iter()
            .map(|msg| match msg {
                Msg::Keepalive { client, to, age } => Msg::Keepalive {
                    client,
                    to,
                    age: (age + 1).min(cap),
                },
                Msg::Answer { client, age } => Msg::Answer {
                    client,
                    age: (age + 1).min(cap),
                },
                other => other,
            })
            .collect();
    }

    /// The leader commits a session's expiry; the scope passes on if it held it.
    fn expire(state: &mut State, client: u8) {
        let session = &mut state.sessions[usize::from(client)];
        session.expired = true;
        session.revoke_proposed = false;
        if state.waiter == Some(client) {
            state.waiter = None;
        }
        if state.holder == Some(client) {
            state.holder = state.waiter.take();
            if state.holder.is_some() {
                state.token += 1;
                state.fenced = 0;
            }
        }
    }

    /// The storage applies a write.
    fn apply(state: &mut State, token: u8) {
        if token < state.highest_applied {
            state.stale_applied = true;
        }
        if token == 1 && state.sessions[0].expired {
            state.stale_landed = true;
        }
        state.highest_applied = state.highest_applied.max(token);
    }
}

impl Model for ScopesModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let bounds = &self.bounds;
        // Both sessions were just kept alive with leader 1 (sent and answered at 0);
        // client 0 holds the scope with token 1, fenced at every proxy.
        let client = Client {
            trust_left: bounds.trust_ticks(),
            holds: None,
            campaigned: false,
            writes_left: bounds.writes,
        };
        let session = Session {
            expired: false,
            revoke_proposed: false,
            deadline_left: bounds.ttl_ticks,
        };
        vec![State {
            office: Office::One,
            clients: [
                Client {
                    holds: Some(1),
                    campaigned: true,
                    ..client
                },
                client,
            ],
            sessions: [session; CLIENTS],
            holder: Some(0),
            waiter: None,
            deposed_refuses: 0,
            token: 1,
            fenced: bounds.all_proxies(),
            delivered: 1,
            proxies: vec![
                Proxy {
                    fence: 1,
                    in_flight: Vec::new(),
                };
                bounds.proxies
            ],
            net: BTreeSet::new(),
            highest_applied: 0,
            stale_applied: false,
            stale_admitted: false,
            stale_landed: false,
            granted_by_two: false,
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        actions.push(Action::Tick);
        match state.office {
            Office::One => actions.push(Action::Stop),
            Office::Election => {
                let proposed = Self::revokes_proposed(state);
                // Every subset of the proposed revokes may have reached leader 2's log.
                for revokes in 0..=proposed {
                    if revokes & !proposed == 0 {
                        actions.push(Action::TakeOffice { revokes });
                    }
                }
            }
            Office::Two => {}
        }
        let in_office = Self::in_office(state);
        for id in 0..CLIENTS as u8 {
            let c = usize::from(id);
            let (client, session) = (&state.clients[c], &state.sessions[c]);
            // A keepalive of an expired session is refused (404) and changes nothing.
            if !session.expired && !Self::keeping_alive(state, id) {
                for to in [1, 2] {
                    // A client addresses the leader in office; leader 1 also when it may
                    // still answer (the client cannot tell it was deposed).
                    let current = matches!((to, state.office), (1, Office::One) | (2, Office::Two));
                    if current || (to == 1 && self.bounds.deposed_leader_answers) {
                        actions.push(Action::SendKeepalive { client: id, to });
                    }
                }
            }
            if in_office && !session.expired {
                if session.revoke_proposed {
                    actions.push(Action::Expire { client: id });
                } else if session.deadline_left == 0 {
                    actions.push(Action::ProposeExpiry { client: id });
                }
                if !client.campaigned {
                    actions.push(Action::Campaign { client: id });
                }
            }
            if client.trust_left > 0 && client.writes_left > 0 && client.holds.is_some() {
                for proxy in 0..self.bounds.proxies as u8 {
                    actions.push(Action::SendWrite { client: id, proxy });
                }
            }
        }
        if let (true, Some(holder)) = (in_office, state.holder) {
            for proxy in 0..self.bounds.proxies {
                if self.bounds.fence_on_grant
                    && state.fenced & (1 << proxy) == 0
                    && Self::barrier_clear(state, proxy, state.token)
                {
                    actions.push(Action::Fence { proxy: proxy as u8 });
                }
            }
            let fenced = !self.bounds.fence_on_grant || state.fenced == self.bounds.all_proxies();
            let answer = Msg::Grant {
                client: holder,
                token: state.token,
            };
            if fenced
                && state.clients[usize::from(holder)].holds != Some(state.token)
                && !state.net.contains(&answer)
            {
                actions.push(Action::Deliver);
            }
        }
        for proxy in 0..self.bounds.proxies {
            for index in 0..state.proxies[proxy].in_flight.len() {
                actions.push(Action::Apply {
                    proxy: proxy as u8,
                    index: index as u8,
                });
            }
        }
        for msg in &state.net {
            match *msg {
                Msg::Keepalive { to, .. } => {
                    if self.answers(state, to) {
                        actions.push(Action::TakeKeepalive(*msg));
                    }
                }
                Msg::Answer { .. } => actions.push(Action::TakeAnswer(*msg)),
                Msg::Grant { .. } => actions.push(Action::TakeGrant(*msg)),
                Msg::Write { proxy, token } => {
                    let p = usize::from(proxy);
                    if token >= state.proxies[p].fence && Self::barrier_clear(state, p, token) {
                        actions.push(Action::Admit(*msg));
                    }
                }
            }
            actions.push(Action::Drop(*msg));
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut state = last.clone();
        match action {
            Action::Tick => self.tick(&mut state),
            Action::Stop => {
                state.office = Office::Election;
                if self.bounds.deposed_leader_answers {
                    state.deposed_refuses = (0..CLIENTS).fold(0, |mask, client| {
                        let session = &state.sessions[client];
                        if session.expired || session.revoke_proposed {
                            mask | (1 << client)
                        } else {
                            mask
                        }
                    });
                }
                // Leader 1's deadlines were in its memory only.
                for session in &mut state.sessions {
                    session.deadline_left = 0;
                }
                if !self.bounds.deposed_leader_answers {
                    state
                        .net
                        .retain(|msg| !matches!(*msg, Msg::Keepalive { to: 1, .. }));
                }
            }
            Action::TakeOffice { revokes } => {
                state.office = Office::Two;
                for client in 0..CLIENTS as u8 {
                    if revokes & (1 << client) != 0 {
                        Self::expire(&mut state, client);
                    }
                    state.sessions[usize::from(client)].revoke_proposed = false;
                }
                let deadline = if self.bounds.grace {
                    self.bounds.ttl_ticks
                } else {
                    0
                };
                for session in &mut state.sessions {
                    session.deadline_left = deadline;
                }
                // Fencing starts over with the new leader.
                state.fenced = 0;
            }
            Action::SendKeepalive { client, to } => {
                state.net.insert(Msg::Keepalive { client, to, age: 0 });
            }
            Action::TakeKeepalive(msg) => {
                let Msg::Keepalive { client, to, age } = msg else {
                    return None;
                };
                state.net.remove(&msg);
                let session = &mut state.sessions[usize::from(client)];
                let in_office = matches!((to, state.office), (1, Office::One) | (2, Office::Two));
                // The leader in office refuses an expired session (404) and one whose
                // expiry it proposed; a deposed leader 1 refuses what it knew when it
                // left office, and knows nothing of expiries after that.
                let refused = if in_office {
                    session.expired || session.revoke_proposed
                } else {
                    state.deposed_refuses & (1 << client) != 0
                };
                if !refused {
                    if in_office {
                        session.deadline_left = self.bounds.ttl_ticks;
                    }
                    state.net.insert(Msg::Answer { client, age });
                }
            }
            Action::TakeAnswer(msg) => {
                let Msg::Answer { client, age } = msg else {
                    return None;
                };
                state.net.remove(&msg);
                let client = &mut state.clients[usize::from(client)];
                let trust = self.bounds.trust_ticks().saturating_sub(age);
                client.trust_left = client.trust_left.max(trust);
            }
            Action::ProposeExpiry { client } => {
                state.sessions[usize::from(client)].revoke_proposed = true;
            }
            Action::Expire { client } => Self::expire(&mut state, client),
            Action::Campaign { client } => {
                state.clients[usize::from(client)].campaigned = true;
                if state.holder.is_none() {
                    state.holder = Some(client);
                    state.token += 1;
                    state.fenced = 0;
                } else {
                    state.waiter = Some(client);
                }
            }
            Action::Fence { proxy } => {
                let target = &mut state.proxies[usize::from(proxy)];
                target.fence = target.fence.max(state.token);
                state.fenced |= 1 << proxy;
            }
            Action::Deliver => {
                let client = state.holder?;
                state.net.insert(Msg::Grant {
                    client,
                    token: state.token,
                });
                if state.office == Office::Two {
                    state.granted_by_two = true;
                }
            }
            Action::TakeGrant(msg) => {
                let Msg::Grant { client, token } = msg else {
                    return None;
                };
                state.net.remove(&msg);
                let client = &mut state.clients[usize::from(client)];
                client.holds = client.holds.max(Some(token));
                state.delivered = state.delivered.max(token);
            }
            Action::SendWrite { client, proxy } => {
                let client = &mut state.clients[usize::from(client)];
                client.writes_left -= 1;
                let token = client.holds?;
                state.net.insert(Msg::Write { proxy, token });
            }
            Action::Admit(msg) => {
                let Msg::Write { proxy, token } = msg else {
                    return None;
                };
                state.net.remove(&msg);
                if token < state.delivered {
                    state.stale_admitted = true;
                }
                let target = &mut state.proxies[usize::from(proxy)];
                target.fence = target.fence.max(token);
                target.in_flight.push(token);
                target.in_flight.sort_unstable();
            }
            Action::Apply { proxy, index } => {
                let token = state.proxies[usize::from(proxy)]
                    .in_flight
                    .remove(usize::from(index));
                Self::apply(&mut state, token);
            }
            Action::Drop(msg) => {
                state.net.remove(&msg);
            }
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(PROP_ORDERED, |_, state: &State| !state.stale_applied),
            Property::always(PROP_TRUST_SOUND, |_, state: &State| {
                state
                    .clients
                    .iter()
                    .zip(&state.sessions)
                    .all(|(client, session)| client.trust_left == 0 || !session.expired)
            }),
            Property::always(PROP_ONE_BELIEVER, |_, state: &State| {
                state.clients.iter().filter(|c| Self::believes(**c)).count() <= 1
            }),
            Property::always(PROP_PREDECESSOR_FENCED_OUT, |_, state: &State| {
                !state.stale_admitted
            }),
            Property::sometimes(PROP_SECOND_HOLDER_WRITES, |_, state: &State| {
                state.highest_applied >= 2
            }),
            Property::sometimes(PROP_STALE_WRITE_LANDS, |_, state: &State| {
                state.stale_landed
            }),
            Property::sometimes(PROP_GRANT_AFTER_FAILOVER, |_, state: &State| {
                state.granted_by_two
            }),
        ]
    }
}
