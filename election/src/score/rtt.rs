//! Round-trip samples, their median, and θc.

use std::collections::VecDeque;

/// Round-trip samples kept per peer or proxy; the median of these is the round trip.
/// Seven rides out a couple of outliers (a retransmit, a GC pause at the peer) and
/// follows a real change within seven share periods.
pub const RTT_SAMPLES_MAX: usize = 7;

/// The recent round trips to one destination, in milliseconds.
#[derive(Debug, Clone, Default)]
pub(crate) struct RttWindow {
    samples: VecDeque<f64>,
}

impl RttWindow {
    /// Adds one sample, dropping the oldest beyond [`RTT_SAMPLES_MAX`].
    pub(crate) fn push(&mut self, ms: f64) {
        if self.samples.len() == RTT_SAMPLES_MAX {
            self.samples.pop_front();
        }
        self.samples.push_back(ms);
    }

    /// How many samples the window holds.
    pub(crate) fn len(&self) -> usize {
        self.samples.len()
    }

    /// The median of the samples (the lower middle one of an even count), `None` without
    /// any.
    pub(crate) fn median(&self) -> Option<f64> {
        let mut sorted: Vec<f64> = self.samples.iter().copied().collect();
        sorted.sort_by(f64::total_cmp);
        let mid = sorted.len().checked_sub(1)? / 2;
        sorted.get(mid).copied()
    }
}

/// θc of a node among `voters` voters: the ⌊voters/2⌋+1-th smallest of its round trips,
/// the node itself counted as 0 and every peer without a round trip as infinitely far.
/// `None` when that quorum is not reachable (fewer known round trips than it needs).
pub(crate) fn theta_c(voters: usize, peer_rtts: impl IntoIterator<Item = f64>) -> Option<f64> {
    let mut all: Vec<f64> = std::iter::once(0.0).chain(peer_rtts).collect();
    all.sort_by(f64::total_cmp);
    all.get(voters / 2).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the median ignores outliers and follows only the last samples. Method: a
    /// window with one outlier, then more samples than it keeps.
    #[test]
    fn median_of_recent_samples() {
        let mut w = RttWindow::default();
        assert_eq!(w.median(), None);
        for ms in [10.0, 11.0, 500.0, 9.0] {
            w.push(ms);
        }
        assert_eq!(w.median(), Some(10.0));
        for _ in 0..RTT_SAMPLES_MAX {
            w.push(50.0);
        }
        assert_eq!(w.median(), Some(50.0));
    }

    /// Goal: θc is the quorum's round trip with self as 0. Method: the paper's three
    /// sites (slac to caltech 9.88 ms, to fnal 53.26 ms) and five nodes with one unknown.
    #[test]
    fn theta_c_is_the_quorum_round_trip() {
        assert_eq!(theta_c(3, [9.88, 53.26]), Some(9.88));
        assert_eq!(theta_c(5, [40.0, 10.0, 30.0]), Some(30.0));
        assert_eq!(theta_c(1, []), Some(0.0));
        // Three voters with no peer known: no quorum.
        assert_eq!(theta_c(3, []), None);
    }
}
