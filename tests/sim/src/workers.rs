//! The clients: workers that learn the token from a node (its leadership watch, as an
//! in-process token source reads it; from a follower, the leader it names), often keep it
//! cached, sometimes pause between
//! reading it and sending (a GC pause in the dangerous window), and write through a
//! proxy with it. Their view is never checked: what reached the storage is.

use std::sync::Arc;
use std::time::Duration;

use crate::knobs::{HOP_DELAY_MS, STALE_PAUSE_MS, STALE_PAUSE_P, THINK_MS, TOKEN_CACHE_P};
use crate::proxies::Answer;
use crate::sim::{SCOPE, Sim};

/// HTTP 409: the proxy's answer to a token below its fence.
const CONFLICT: u16 = 409;

impl Sim {
    /// The token as a client learns it from node `home`: its own, or, from a follower
    /// that names its leader, the leader's (one redirect, as the clients follow
    /// `not-leader` answers).
    fn ask_for_token(&self, home: u64) -> Option<u64> {
        let l = self.cluster.leadership(home)?;
        if l.token.is_some() {
            return l.token;
        }
        let leader = l.leader_id.filter(|&leader| leader != home)?;
        self.cluster.leadership(leader)?.token
    }

    /// Worker `w`: forever, think, get a token, maybe pause, write through a proxy.
    pub async fn worker(self: Arc<Self>, w: u64) {
        let mut cached: Option<u64> = None;
        let mut seq = 0u64;
        loop {
            self.world.sleep_drawn(THINK_MS).await;
            // Its node: one of the members, by position (membership changes move it).
            let members = self.cluster.members();
            if members.is_empty() {
                continue;
            }
            let home = members[(w as usize) % members.len()];
            let token = match cached {
                Some(t) if self.world.dice.chance(TOKEN_CACHE_P) => Some(t),
                _ => self.ask_for_token(home).or(cached),
            };
            let Some(token) = token else {
                continue;
            };
            cached = Some(token);
            if self.world.dice.chance(STALE_PAUSE_P) {
                let ms = self.world.dice.draw(STALE_PAUSE_MS);
                self.world
                    .log(&format!("w{w} pauses {ms} ms holding token {token}"));
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            let p = self.world.dice.pick(&self.proxies.ids());
            seq += 1;
            self.world
                .log(&format!("w{w}#{seq} sends token {token} to p{p}"));
            self.world.sleep_drawn(HOP_DELAY_MS).await;
            let answer = self.write(p, SCOPE, token, format!("w{w}#{seq}")).await;
            self.world.log(&format!("w{w}#{seq} answered {answer:?}"));
            match answer {
                Answer::Applied => {}
                Answer::Refused(CONFLICT) => {
                    self.world.stats().stale += 1;
                    // Fenced out: ask the node again next time.
                    cached = None;
                }
                Answer::Refused(_) | Answer::Lost => self.world.stats().unavailable += 1,
            }
        }
    }
}
