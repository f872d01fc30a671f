//! The fault schedule: every decision drawn from the seed. Each fault is undone after a
//! drawn time (a partition heals, a crashed node or proxy restarts, the weather calms);
//! when the schedule ends, everything is healed and restarted at once.

use std::sync::Arc;
use std::time::Duration;

use crate::knobs::{CHAOS_GAP_MS, CHAOS_MS, FAULT_MS, MEMBERS_MAX, REMOVE_P};
use crate::sim::Sim;
use crate::world::{Weather, lock};

/// The faults, in the order the schedule draws them from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// Cut a group of nodes off from the rest, both ways.
    Partition,
    /// Cut one direction of one link.
    OneWayCut,
    /// Lose or delay raft messages for a while.
    Weather,
    /// Crash a node (any), restart it later on its durable state.
    CrashNode,
    /// Crash a node that holds a token.
    CrashLeader,
    /// Isolate a token holder: a paused leader, as its peers see it.
    PauseLeader,
    /// Ask a token holder to hand leadership to another member.
    Transfer,
    /// Crash a proxy, restart it later on its durable fences.
    CrashProxy,
    /// Add a member, or remove one.
    Membership,
}

const FAULTS: [Fault; 9] = [
    Fault::Partition,
    Fault::OneWayCut,
    Fault::Weather,
    Fault::CrashNode,
    Fault::CrashLeader,
    Fault::PauseLeader,
    Fault::Transfer,
    Fault::CrashProxy,
    Fault::Membership,
];

/// Voters a removal must leave (the election crate refuses fewer unless forced).
const VOTERS_MIN: usize = 3;

impl Sim {
    /// Runs the fault schedule for [`CHAOS_MS`], then heals everything.
    pub async fn chaos(self: &Arc<Self>) {
        while self.world.now_ms() < CHAOS_MS {
            self.world.sleep_drawn(CHAOS_GAP_MS).await;
            let fault = self.world.dice.pick(&FAULTS);
            self.inject(fault).await;
        }
        self.heal_all().await;
    }

    /// Heals every link, calms the weather, restarts every crashed node and proxy.
    pub async fn heal_all(self: &Arc<Self>) {
        self.world.log("heal everything");
        self.world.dice.set_weather(Weather::Calm);
        self.cluster.net.heal();
        for p in self.proxies.ids() {
            self.start_proxy(p);
        }
        for id in self.cluster.crashed() {
            self.boot(id).await;
        }
    }

    /// After a drawn fault time, runs `undo`.
    fn later<F, Fut>(self: &Arc<Self>, undo: F)
    where
        F: FnOnce(Arc<Sim>) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let ms = self.world.dice.draw(FAULT_MS);
        let sim = Arc::clone(self);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            undo(sim).await;
        });
    }

    async fn inject(self: &Arc<Self>, fault: Fault) {
        let members = self.cluster.members();
        let all = self.cluster.all_ids();
        let holders = self.cluster.token_holders();
        let dice = &self.world.dice;
        self.world.stats().faults += 1;
        match fault {
            Fault::Partition => {
                let size = dice.draw((1, (all.len() as u64).div_ceil(2) + 1)) as usize;
                let mut group = Vec::new();
                while group.len() < size {
                    let id = dice.pick(&all);
                    if !group.contains(&id) {
                        group.push(id);
                    }
                }
                group.sort_unstable();
                self.world
                    .log(&format!("partition {group:?} from the rest"));
                self.cluster.net.partition(&group, &all);
                self.later(|sim| async move {
                    sim.world.log("partition healed");
                    sim.cluster.net.heal();
                });
            }
            Fault::OneWayCut => {
                let (from, to) = (dice.pick(&all), dice.pick(&all));
                if from == to {
                    return;
                }
                self.world.log(&format!("link {from} -> {to} cut"));
                self.cluster.net.set_link(from, to, false);
                self.later(move |sim| async move {
                    sim.world.log(&format!("link {from} -> {to} restored"));
                    sim.cluster.net.set_link(from, to, true);
                });
            }
            Fault::Weather => {
                let weather = dice.pick(&[Weather::Lossy, Weather::Slow, Weather::Stormy]);
                self.world.log(&format!("weather {weather:?}"));
                dice.set_weather(weather);
                self.later(|sim| async move {
                    sim.world.log("weather calm");
                    sim.world.dice.set_weather(Weather::Calm);
                });
            }
            Fault::CrashNode | Fault::CrashLeader => {
                let targets = if fault == Fault::CrashLeader {
                    &holders
                } else {
                    &members
                };
                if targets.is_empty() {
                    return;
                }
                let id = dice.pick(targets);
                self.world.log(&format!("crash node {id}"));
                self.crash(id).await;
                self.later(move |sim| async move { sim.boot(id).await });
            }
            Fault::PauseLeader => {
                if holders.is_empty() {
                    return;
                }
                let id = dice.pick(&holders);
                self.world.log(&format!("pause (isolate) leader {id}"));
                self.cluster.net.partition(&[id], &all);
                self.later(move |sim| async move {
                    sim.world.log(&format!("leader {id} resumed"));
                    sim.cluster.net.heal();
                });
            }
            Fault::Transfer => {
                if holders.is_empty() || members.len() < 2 {
                    return;
                }
                let from = dice.pick(&holders);
                let to = dice.pick(&members);
                if from == to {
                    return;
                }
                let sim = Arc::clone(self);
                tokio::spawn(async move { sim.transfer(from, to).await });
            }
            Fault::CrashProxy => {
                let p = dice.pick(&self.proxies.ids());
                self.crash_proxy(p);
                self.later(move |sim| async move { sim.start_proxy(p) });
            }
            Fault::Membership => self.change_members(&members, &holders),
        }
    }

    /// Starts one membership change through a token holder, unless one is under way:
    /// a removal (never below [`VOTERS_MIN`]) or an addition (never above
    /// [`MEMBERS_MAX`]).
    fn change_members(self: &Arc<Self>, members: &[u64], holders: &[u64]) {
        let Some(&via) = holders.first() else {
            return;
        };
        {
            let mut changing = lock(&self.cluster.changing);
            if *changing {
                return;
            }
            *changing = true;
        }
        let dice = &self.world.dice;
        let remove =
            members.len() > VOTERS_MIN && (members.len() >= MEMBERS_MAX || dice.chance(REMOVE_P));
        let victim = dice.pick(members);
        let sim = Arc::clone(self);
        tokio::spawn(async move {
            if remove {
                sim.remove_member(via, victim).await;
            } else {
                sim.add_member(via).await;
            }
            *lock(&sim.cluster.changing) = false;
        });
    }
}
