//! The fleet protocol as a `stateright` model.
//!
//! # Time
//!
//! Time is discrete: one global tick at a time ([`Action::Tick`]), and any number of
//! other actions, in any order, between two ticks. The reference clock is the clock of
//! leader 2 (the new leader), because the one duration that safety rests on is the
//! release wait, which that leader measures. The drift bound is taken as a bound on the
//! ratio of any two clocks' rates: an interval that a proxy measures as `lease` lasts at
//! most `lease + drift` reference ticks ([`Bounds::lease_max_ticks`]). The model gives
//! every lease exactly that longest life, counted from the tick its request was sent;
//! a proxy whose clock runs faster sees its lease lapse earlier, and what it does then
//! (refuse, renew) the model already allows at any time. So the conservative integer
//! bound covers every clock rate within the drift bound without a clock per process.
//!
//! # Pauses and the one bounded window
//!
//! A process that pauses simply takes no action for some ticks: nothing in the model
//! forces a leader, a proxy or the cluster to act. The one exception is the window from
//! a proxy's final lease check (its admission) to the storage applying the write: a
//! forwarded write carries a deadline of `write_bound` ticks after its admission, and
//! the clock does not tick past that deadline while the write is still in flight
//! (it is applied, or discarded, by then). That is the assumption the real system states
//! as `--lease-write-bound-ms`.
use std::collections::BTreeSet;

use stateright::{Model, Property, Representative};

/// The name of the safety invariant: the storage never applies a write with a lower
/// token after it has applied one with a higher token.
pub const PROP_ORDERED: &str = "no lower token applied after a higher one";
/// The name of the check that the model is not vacuous: some run has leader 2's write
/// applied by the storage.
pub const PROP_NEW_LEADER_WRITES: &str = "leader 2's write is applied";
/// The name of the check that the acknowledgement shortcut is reachable: every proxy
/// has acknowledged term 2 (the last acknowledgements may still be on their way to
/// leader 2) before the wait has passed. From there no violation can follow (every
/// fence is at 2 and no term-1 write is in flight), so the checker stops; this is the
/// last state of such a run that it looks at.
pub const PROP_RELEASED_BY_ACKS: &str = "every proxy acknowledges term 2 before the wait ends";
/// The name of the check that the stale leader is really modelled: some run has a
/// term-1 write applied after leader 2 was elected (safely, before any term-2 write).
pub const PROP_OLD_WRITE_LANDS_AFTER_ELECTION: &str = "a term-1 write lands after the election";

/// The most proxies the model takes: the set of acknowledged proxies is a bit mask in
/// a `u8`, and the state space grows far past a test's budget long before that.
pub const PROXIES_MAX: usize = 8;

/// The release rule for leader 2's token under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReleaseWait {
    /// The protocol as designed: released once every proxy has acknowledged term 2, or
    /// once `lease + drift + write_bound` ticks have passed since the election.
    Full,
    /// A broken variant: the write bound is left out of the wait
    /// (`lease + drift`), so a term-1 write admitted at the very end of a term-1 lease
    /// can still be on its way to the storage when the token is released.
    WithoutWriteBound,
    /// A broken variant: the drift is left out of the wait (`lease + write_bound`), so a
    /// proxy whose clock runs slow still holds its term-1 lease when the token is
    /// released.
    WithoutDrift,
    /// A broken variant: no wait at all; the token is released as soon as leader 2 is
    /// elected, as it is without fleet mode.
    Removed,
}

/// The bounds of one check: sizes and durations in reference ticks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// How many proxies stand in front of the storage (2 or 3 in the tests; at most
    /// [`PROXIES_MAX`]).
    pub proxies: usize,
    /// The lease, in ticks of the proxy's own clock.
    pub lease_ticks: u8,
    /// How many reference ticks a lease can outlast `lease_ticks` because the proxy's
    /// clock runs slow against leader 2's (`lease * drift`, rounded up).
    pub drift_ticks: u8,
    /// The longest time from a proxy's admission of a write to the storage applying it,
    /// in reference ticks.
    pub write_bound_ticks: u8,
    /// How many writes leader 1 (term 1, possibly paused and stale) may send in a run.
    pub old_writes: u8,
    /// How many writes leader 2 (term 2) may send once its token is released.
    pub new_writes: u8,
    /// The release rule under test.
    pub wait: ReleaseWait,
    /// A broken variant when true: a proxy whose exchange with the storage ends
    /// without an answer (a reset connection, a timeout) drops the write from its
    /// in-flight set at once, while the storage may still apply it within the write
    /// bound. The barrier, and so an acknowledgement, then no longer means that the
    /// proxy's lower writes have landed. As designed (false), such a write stays in the
    /// in-flight set until its write bound has passed.
    pub barrier_lets_go_on_error: bool,
}

impl Bounds {
    /// The bounds of the default check: `proxies` proxies, a lease of 2 ticks with 1 tick
    /// of drift and a write bound of 1 tick (a wait of 4 ticks), one write per leader.
    pub fn small(proxies: usize) -> Self {
        Self {
            proxies,
            lease_ticks: 1,
            drift_ticks: 1,
            write_bound_ticks: 1,
            old_writes: 1,
            new_writes: 1,
            wait: ReleaseWait::Full,
            barrier_lets_go_on_error: false,
        }
    }

    /// The longest a lease lasts on the reference clock: `lease + drift`.
    pub fn lease_max_ticks(&self) -> u8 {
        self.lease_ticks + self.drift_ticks
    }

    /// The release wait under the rule in [`Bounds::wait`], in reference ticks since
    /// leader 2's election.
    pub fn wait_ticks(&self) -> u8 {
        match self.wait {
            ReleaseWait::Full => self.lease_max_ticks() + self.write_bound_ticks,
            ReleaseWait::WithoutWriteBound => self.lease_max_ticks(),
            ReleaseWait::WithoutDrift => self.lease_ticks + self.write_bound_ticks,
            ReleaseWait::Removed => 0,
        }
    }

    /// The bit mask with one bit per proxy: every proxy has acknowledged.
    fn all_acked(&self) -> u8 {
        (((1_u16) << self.proxies) - 1) as u8
    }
}

/// A message in the network. The network is a set: a message may wait there for any
/// number of ticks, be taken out in any order, or be lost. Two equal messages are one
/// (a duplicate collapses into its twin), which only loses a copy, and loss is allowed
/// anyway.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Msg {
    /// A proxy's lease request (`POST /v1/lease`). The lease it yields runs from the
    /// tick it was sent, so it carries its age: the ticks since then (capped at the
    /// longest lease, past which it can only yield a lapsed lease).
    LeaseRequest {
        /// The requesting proxy.
        proxy: u8,
        /// Reference ticks since the proxy sent it.
        age: u8,
    },
    /// The cluster's grant: the term its leader confirmed with a quorum after the
    /// request arrived, and the age of the request it answers.
    LeaseGrant {
        /// The proxy the grant is for.
        proxy: u8,
        /// The term confirmed.
        term: u8,
        /// Reference ticks since the proxy sent the request.
        age: u8,
    },
    /// Leader 2's announce of term 2 to a proxy.
    Announce {
        /// The proxy addressed.
        proxy: u8,
    },
    /// A proxy's acknowledgement of term 2: its fence is at 2 and no lower write of its
    /// is in flight.
    Ack {
        /// The acknowledging proxy.
        proxy: u8,
    },
    /// A leader's write carrying its token, sent through a proxy.
    Write {
        /// The proxy it goes through.
        proxy: u8,
        /// The fencing token (the leader's term).
        token: u8,
    },
}

/// A lease as the proxy holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lease {
    /// The term the grant named.
    pub term: u8,
    /// Reference ticks until it lapses at the latest (at least 1: a lapsed lease is
    /// dropped).
    pub left: u8,
}

/// A write a proxy has admitted and forwarded, not yet applied by the storage (it is in
/// the proxy's in-flight set, which the barrier waits on).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Forward {
    /// The write's token.
    pub token: u8,
    /// Reference ticks left before the write bound runs out; the clock does not tick
    /// while it is 0.
    pub left: u8,
}

/// One proxy.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProxyState {
    /// The durable fence: the highest token or term this proxy has seen.
    pub fence: u8,
    /// The lease, if one is valid.
    pub lease: Option<Lease>,
    /// The admitted writes still on their way to the storage, sorted.
    pub in_flight: Vec<Forward>,
}

/// The whole system at one moment.
///
/// Time is kept relative: every clock reading is a count of ticks left or passed,
/// capped where its value stops mattering. So the state space is finite without a
/// horizon, and the check covers runs of any length: an election after any number of
/// ticks, pauses of any length.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FleetState {
    /// Reference ticks since leader 2 was elected (established), capped at the wait;
    /// `None` before the election. Before it the cluster's term is 1, after it 2.
    pub since_election: Option<u8>,
    /// The proxies whose acknowledgement of term 2 leader 2 has received, one bit each.
    pub acked: u8,
    /// How many writes leader 1 may still send.
    pub old_writes_left: u8,
    /// How many writes leader 2 may still send.
    pub new_writes_left: u8,
    /// The proxies.
    pub proxies: Vec<ProxyState>,
    /// The network.
    pub net: BTreeSet<Msg>,
    /// Forwarded writes the proxy has given up on (only with
    /// [`Bounds::barrier_lets_go_on_error`]) that the storage may still apply within
    /// their write bound, sorted.
    pub orphans: Vec<Forward>,
    /// The highest token the storage has applied (0: none yet).
    pub highest_applied: u8,
    /// Whether the storage has applied a token lower than one it applied before: the
    /// violation.
    pub out_of_order: bool,
    /// Whether a term-1 write was applied after leader 2's election.
    pub old_applied_after_election: bool,
}

impl Msg {
    /// The proxy the message is from or to.
    fn proxy(self) -> u8 {
        match self {
            Self::LeaseRequest { proxy, .. }
            | Self::LeaseGrant { proxy, .. }
            | Self::Announce { proxy }
            | Self::Ack { proxy }
            | Self::Write { proxy, .. } => proxy,
        }
    }

    /// The same message, from or to another proxy.
    fn with_proxy(self, to: u8) -> Self {
        match self {
            Self::LeaseRequest { age, .. } => Self::LeaseRequest { proxy: to, age },
            Self::LeaseGrant { term, age, .. } => Self::LeaseGrant {
                proxy: to,
                term,
                age,
            },
            Self::Announce { .. } => Self::Announce { proxy: to },
            Self::Ack { .. } => Self::Ack { proxy: to },
            Self::Write { token, .. } => Self::Write { proxy: to, token },
        }
    }
}

/// The proxies are interchangeable: a state with two proxies' roles swapped (their
/// state, their acknowledgement, their messages) behaves the same. The representative
/// orders the proxies by all they hold, so the checker visits one state per class
/// (symmetry reduction, for the depth-first check).
impl Representative for FleetState {
    fn representative(&self) -> Self {
        let proxies = self.proxies.len();
        let key = |proxy: usize| {
            let id = proxy as u8;
            let messages: Vec<Msg> = self
                .net
                .iter()
                .filter(|msg| msg.proxy() == id)
                .map(|msg| msg.with_proxy(0))
                .collect();
            (
                self.proxies[proxy].clone(),
                self.acked & (1 << proxy) != 0,
                messages,
            )
        };
        let mut order: Vec<usize> = (0..proxies).collect();
        order.sort_by_cached_key(|&proxy| key(proxy));
        // `order[new] = old`; `place[old] = new`.
        let mut place = vec![0_u8; proxies];
        for (new, &old) in order.iter().enumerate() {
            place[old] = new as u8;
        }
        let mut acked = 0;
        for (old, &new) in place.iter().enumerate() {
            if self.acked & (1 << old) != 0 {
                acked |= 1 << new;
            }
        }
        Self {
            acked,
            proxies: order.iter().map(|&old| self.proxies[old].clone()).collect(),
            net: self
                .net
                .iter()
                .map(|msg| msg.with_proxy(place[usize::from(msg.proxy())]))
                .collect(),
            ..self.clone()
        }
    }
}

/// One step of the system.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// The reference clock advances one tick: ages grow, leases and write bounds run
    /// down, a lease at the end of its longest life lapses.
    Tick,
    /// The cluster elects leader 2 (term 2). Leader 1 is not told: it may go on sending.
    Elect,
    /// A proxy sends a lease request (in the background or before an admission).
    Renew {
        /// The proxy.
        proxy: u8,
    },
    /// The cluster's leader of the moment confirms its leadership with a quorum and
    /// answers a lease request that has arrived.
    Grant(Msg),
    /// A proxy takes a grant: its fence rises to the grant's term, and the lease runs
    /// from the request's send tick.
    TakeGrant(Msg),
    /// Leader 2 (re)sends its announce to a proxy that has not acknowledged.
    Announce {
        /// The proxy.
        proxy: u8,
    },
    /// A proxy accepts the announce once its barrier is clear and acknowledges it.
    AckAnnounce(Msg),
    /// Leader 2 receives an acknowledgement.
    TakeAck(Msg),
    /// A leader sends a write with its token through a proxy.
    SendWrite {
        /// The token (1: leader 1, 2: leader 2).
        token: u8,
        /// The proxy.
        proxy: u8,
    },
    /// A proxy admits a write by the fleet rule and forwards it to the storage.
    Admit(Msg),
    /// A message is lost, or a proxy refuses a write (409, 503, a timeout): both take
    /// it out of the network with no other effect.
    Drop(Msg),
    /// The proxy's exchange with the storage ends without an answer and it drops the
    /// write from its in-flight set; the write may still reach the storage (only with
    /// [`Bounds::barrier_lets_go_on_error`]).
    GiveUp {
        /// The proxy.
        proxy: u8,
        /// The write's index in the proxy's in-flight set.
        index: u8,
    },
    /// The storage applies a write whose proxy gave up on it.
    ApplyOrphan {
        /// The write's index in the orphans.
        index: u8,
    },
    /// The storage applies a proxy's forwarded write.
    Apply {
        /// The proxy.
        proxy: u8,
        /// The write's index in the proxy's in-flight set.
        index: u8,
    },
}

/// The model: the bounds of one check.
#[derive(Clone, Debug)]
pub struct FleetModel {
    /// The bounds.
    pub bounds: Bounds,
}

impl FleetModel {
    /// A model with these bounds. More proxies than [`PROXIES_MAX`] are cut to it.
    pub fn new(mut bounds: Bounds) -> Self {
        bounds.proxies = bounds.proxies.min(PROXIES_MAX);
        Self { bounds }
    }

    /// Whether leader 2's token is released: elected, and every proxy has acknowledged
    /// or the wait has passed.
    pub fn released(&self, state: &FleetState) -> bool {
        state.since_election.is_some_and(|since| {
            state.acked == self.bounds.all_acked() || since >= self.bounds.wait_ticks()
        })
    }

    /// Whether every proxy has acknowledged term 2, counting acknowledgements on their
    /// way to leader 2, before the wait has passed.
    fn acked_before_wait(&self, state: &FleetState) -> bool {
        let on_the_way = state.net.iter().fold(0_u8, |mask, msg| match *msg {
            Msg::Ack { proxy } => mask | (1 << proxy),
            _ => mask,
        });
        state
            .since_election
            .is_some_and(|since| since < self.bounds.wait_ticks())
            && (state.acked | on_the_way) == self.bounds.all_acked()
    }

    /// Whether the proxy has no write below `token` in flight: the barrier a higher
    /// token waits at.
    fn barrier_clear(state: &FleetState, proxy: usize, token: u8) -> bool {
        state.proxies[proxy]
            .in_flight
            .iter()
            .all(|forward| forward.token >= token)
    }

    /// Whether the proxy would admit this write now: token at or above the fence, a
    /// valid lease on exactly that term, and the barrier clear.
    fn admissible(state: &FleetState, proxy: usize, token: u8) -> bool {
        let target = &state.proxies[proxy];
        token >= target.fence
            && target.lease.is_some_and(|lease| lease.term == token)
            && Self::barrier_clear(state, proxy, token)
    }

    /// Whether the proxy has a renewal under way (its request or the grant for it is in
    /// the network).
    fn renewing(state: &FleetState, proxy: u8) -> bool {
        state.net.iter().any(|msg| match *msg {
            Msg::LeaseRequest { proxy: from, .. } | Msg::LeaseGrant { proxy: from, .. } => {
                from == proxy
            }
            _ => false,
        })
    }

    /// Whether a violation can still happen from this state: a term-1 write can still
    /// land (in flight, or on its way to or yet to be sent to a proxy whose fence is
    /// below 2) and a term-2 write has landed or still can. Once either is impossible,
    /// no run from here applies a 1 after a 2. (When the violation has happened, the
    /// checker has what it needs, so that ends the run too.)
    fn violation_possible(state: &FleetState) -> bool {
        if state.out_of_order {
            return false;
        }
        let open = |proxy: &ProxyState| proxy.fence <= 1;
        let old_can_land = state
            .proxies
            .iter()
            .any(|proxy| proxy.in_flight.iter().any(|forward| forward.token == 1))
            || state.orphans.iter().any(|forward| forward.token == 1)
            || (state.old_writes_left > 0 && state.proxies.iter().any(open))
            || state.net.iter().any(|msg| {
                matches!(*msg, Msg::Write { proxy, token: 1 } if open(&state.proxies[usize::from(proxy)]))
            });
        let new_can_land = state.highest_applied == 2
            || state.new_writes_left > 0
            || state
                .proxies
                .iter()
                .any(|proxy| proxy.in_flight.iter().any(|forward| forward.token == 2))
            || state.orphans.iter().any(|forward| forward.token == 2)
            || state
                .net
                .iter()
                .any(|msg| matches!(*msg, Msg::Write { token: 2, .. }));
        old_can_land && new_can_land
    }

    /// The storage applies a write with this token.
    fn apply(state: &mut FleetState, token: u8) {
        if token < state.highest_applied {
            state.out_of_order = true;
        }
        if token == 1 && state.since_election.is_some() {
            state.old_applied_after_election = true;
        }
        state.highest_applied = state.highest_applied.max(token);
    }

    /// One tick of the reference clock, or `None` when a forwarded write has reached
    /// its write bound (the storage applies it first).
    fn tick(&self, state: &mut FleetState) -> Option<()> {
        let lease_max = self.bounds.lease_max_ticks();
        for forward in &mut state.orphans {
            forward.left = forward.left.checked_sub(1)?;
        }
        for proxy in &mut state.proxies {
            for forward in &mut proxy.in_flight {
                forward.left = forward.left.checked_sub(1)?;
            }
            // A lease at the end of its longest life lapses; forgetting it keeps equal
            // states equal, and a lapsed lease admits nothing either way.
            proxy.lease = proxy.lease.and_then(|lease| {
                (lease.left > 1).then_some(Lease {
                    term: lease.term,
                    left: lease.left - 1,
                })
            });
        }
        // Ages stop at the longest lease: a request that old yields a lapsed lease
        // whatever its exact age.
        state.net = std::mem::take(&mut state.net)
            .into_iter()
            .map(|msg| match msg {
                Msg::LeaseRequest { proxy, age } => Msg::LeaseRequest {
                    proxy,
                    age: (age + 1).min(lease_max),
                },
                Msg::LeaseGrant { proxy, term, age } => Msg::LeaseGrant {
                    proxy,
                    term,
                    age: (age + 1).min(lease_max),
                },
                other => other,
            })
            .collect();
        let wait = self.bounds.wait_ticks();
        state.since_election = state.since_election.map(|since| (since + 1).min(wait));
        Some(())
    }
}

impl Model for FleetModel {
    type State = FleetState;
    type Action = Action;

    fn init_states(&self) -> Vec<Self::State> {
        // Leader 1 is established and its token released; no proxy has a lease yet.
        vec![FleetState {
            since_election: None,
            acked: 0,
            old_writes_left: self.bounds.old_writes,
            new_writes_left: self.bounds.new_writes,
            proxies: vec![
                ProxyState {
                    fence: 0,
                    lease: None,
                    in_flight: Vec::new(),
                };
                self.bounds.proxies
            ],
            net: BTreeSet::new(),
            orphans: Vec::new(),
            highest_applied: 0,
            out_of_order: false,
            old_applied_after_election: false,
        }]
    }

    fn actions(&self, state: &Self::State, actions: &mut Vec<Self::Action>) {
        // A state from which no violation can follow has nothing left to check: the
        // checker stops there instead of walking every way the run can go on.
        if !Self::violation_possible(state) {
            return;
        }
        // The clock may not pass a forwarded write's bound: `tick` refuses it then.
        actions.push(Action::Tick);
        if state.since_election.is_none() {
            actions.push(Action::Elect);
        }
        for proxy in 0..self.bounds.proxies {
            let id = proxy as u8;
            // One renewal at a time: a proxy that gives up on one (a timeout) is the
            // same as the network losing it, which `Drop` covers.
            if !Self::renewing(state, id) {
                actions.push(Action::Renew { proxy: id });
            }
            if state.since_election.is_some()
                && state.acked & (1 << proxy) == 0
                && !state.net.contains(&Msg::Announce { proxy: id })
            {
                actions.push(Action::Announce { proxy: id });
            }
            if state.old_writes_left > 0 {
                actions.push(Action::SendWrite {
                    token: 1,
                    proxy: id,
                });
            }
            if state.new_writes_left > 0 && self.released(state) {
                actions.push(Action::SendWrite {
                    token: 2,
                    proxy: id,
                });
            }
            for index in 0..state.proxies[proxy].in_flight.len() {
                actions.push(Action::Apply {
                    proxy: id,
                    index: index as u8,
                });
                if self.bounds.barrier_lets_go_on_error {
                    actions.push(Action::GiveUp {
                        proxy: id,
                        index: index as u8,
                    });
                }
            }
        }
        for index in 0..state.orphans.len() {
            actions.push(Action::ApplyOrphan { index: index as u8 });
        }
        for msg in &state.net {
            match *msg {
                Msg::LeaseRequest { .. } => actions.push(Action::Grant(*msg)),
                Msg::LeaseGrant { .. } => actions.push(Action::TakeGrant(*msg)),
                Msg::Announce { proxy } => {
                    if Self::barrier_clear(state, usize::from(proxy), 2) {
                        actions.push(Action::AckAnnounce(*msg));
                    }
                }
                Msg::Ack { .. } => actions.push(Action::TakeAck(*msg)),
                Msg::Write { proxy, token } => {
                    if Self::admissible(state, usize::from(proxy), token) {
                        actions.push(Action::Admit(*msg));
                    }
                }
            }
            actions.push(Action::Drop(*msg));
        }
    }

    fn next_state(&self, last: &Self::State, action: Self::Action) -> Option<Self::State> {
        let mut state = last.clone();
        match action {
            Action::Tick => self.tick(&mut state)?,
            Action::Elect => state.since_election = Some(0),
            Action::Renew { proxy } => {
                state.net.insert(Msg::LeaseRequest { proxy, age: 0 });
            }
            Action::Grant(msg) => {
                let Msg::LeaseRequest { proxy, age } = msg else {
                    return None;
                };
                state.net.remove(&msg);
                // Only the leader of the moment can confirm with a quorum: leader 1
                // before the election, leader 2 after it. A deposed leader 1 cannot.
                let term = if state.since_election.is_some() { 2 } else { 1 };
                state.net.insert(Msg::LeaseGrant { proxy, term, age });
            }
            Action::TakeGrant(msg) => {
                let Msg::LeaseGrant { proxy, term, age } = msg else {
                    return None;
                };
                state.net.remove(&msg);
                let left = self.bounds.lease_max_ticks().saturating_sub(age);
                let target = &mut state.proxies[usize::from(proxy)];
                // The cluster says `term` is current: the fence rises to it durably.
                target.fence = target.fence.max(term);
                // The lease runs from the request's send tick; a grant delayed past the
                // lease's longest life grants nothing.
                target.lease = (left > 0).then_some(Lease { term, left });
            }
            Action::Announce { proxy } => {
                state.net.insert(Msg::Announce { proxy });
            }
            Action::AckAnnounce(msg) => {
                let Msg::Announce { proxy } = msg else {
                    return None;
                };
                state.net.remove(&msg);
                let target = &mut state.proxies[usize::from(proxy)];
                target.fence = target.fence.max(2);
                state.net.insert(Msg::Ack { proxy });
            }
            Action::TakeAck(msg) => {
                let Msg::Ack { proxy } = msg else {
                    return None;
                };
                state.net.remove(&msg);
                state.acked |= 1 << proxy;
            }
            Action::SendWrite { token, proxy } => {
                if token == 1 {
                    state.old_writes_left -= 1;
                } else {
                    state.new_writes_left -= 1;
                }
                state.net.insert(Msg::Write { proxy, token });
            }
            Action::Admit(msg) => {
                let Msg::Write { proxy, token } = msg else {
                    return None;
                };
                state.net.remove(&msg);
                let left = self.bounds.write_bound_ticks;
                let target = &mut state.proxies[usize::from(proxy)];
                target.fence = target.fence.max(token);
                target.in_flight.push(Forward { token, left });
                target.in_flight.sort_unstable();
            }
            Action::Drop(msg) => {
                state.net.remove(&msg);
            }
            Action::GiveUp { proxy, index } => {
                let forward = state.proxies[usize::from(proxy)]
                    .in_flight
                    .remove(usize::from(index));
                state.orphans.push(forward);
                state.orphans.sort_unstable();
            }
            Action::ApplyOrphan { index } => {
                let forward = state.orphans.remove(usize::from(index));
                Self::apply(&mut state, forward.token);
            }
            Action::Apply { proxy, index } => {
                let forward = state.proxies[usize::from(proxy)]
                    .in_flight
                    .remove(usize::from(index));
                Self::apply(&mut state, forward.token);
            }
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(PROP_ORDERED, |_, state: &FleetState| !state.out_of_order),
            Property::sometimes(PROP_NEW_LEADER_WRITES, |_, state: &FleetState| {
                state.highest_applied == 2
            }),
            Property::sometimes(PROP_RELEASED_BY_ACKS, |model, state: &FleetState| {
                model.acked_before_wait(state)
            }),
            Property::sometimes(
                PROP_OLD_WRITE_LANDS_AFTER_ELECTION,
                |_, state: &FleetState| state.old_applied_after_election,
            ),
        ]
    }
}
