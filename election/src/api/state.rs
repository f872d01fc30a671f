//! What the API handlers share: [`ApiState`], and the lease grants' part of it
//! ([`LeaseApi`]).

use std::sync::Arc;

use palisade_protocol::announce::{AnnounceEntry, parse_announce_entry};
use palisade_protocol::{LeaderView, MemberList, Problem, Scope};
use palisade_server::ApiProblem;
use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;

use crate::audit::Observer;
use crate::config::NodeConfig;
use crate::leadership::Leadership;
use crate::metrics::NodeMetrics;
use crate::node::Commands;
use crate::score::board::{SharedScoreView, read_view};
use crate::transport::faults::LinkFaults;

/// Lease requests waiting for their answer at once, on one node; one more is answered 503
/// `lease-busy`. A proxy sends one node one request of a renewal at a time (a write's
/// renewal may replace a timer renewal still waiting here), so a fleet of the most
/// `--announce` proxies (64) needs 64; twice that leaves room for those replaced requests
/// and retries overlapping a slow round, and the bound keeps a flood from filling the
/// election loop's inbox, which raft traffic shares.
pub const LEASE_PENDING_MAX: usize = 128;

/// What the API handlers share.
pub(crate) struct ApiState {
    pub node_id: u64,
    pub scope: Scope,
    pub leadership: watch::Receiver<Leadership>,
    pub commands: Commands,
    pub metrics: NodeMetrics,
    /// Fleet leases; `None` when the node runs without `--lease-ms`.
    pub leases: Option<LeaseApi>,
    /// The transport's test faults, only when they are enabled.
    pub faults: Option<Arc<LinkFaults>>,
    /// The scores the election loop publishes; `None` with `--score-oracle off`.
    pub scores: Option<SharedScoreView>,
    /// The members the election loop applied.
    pub members: watch::Receiver<MemberList>,
    /// The announce list the announcers follow.
    pub announce: watch::Receiver<Vec<String>>,
    /// The announce board and the audit log (the status page shows both).
    pub observer: Arc<Observer>,
    /// Retires the proxies a `POST /v1/announce` removes, one change at a time.
    pub fences: Arc<crate::announce::ProxyFences>,
    /// Cancelled at shutdown: ends long polls, then the listener.
    pub shutdown: CancellationToken,
    /// Whether each route admits only its roles (`super::roles`): on when the API is
    /// served over mutual TLS, where every request carries the credential its client
    /// certificate proved; off in plaintext, where no caller can be told from another.
    pub roles_enforced: bool,
    /// Named leaderships (sessions and scopes); `None` in tests that do not need them.
    pub scopes: Option<super::sessions::ScopesApi>,
}

impl ApiState {
    /// A problem from this node, naming the leader it knows.
    pub(crate) fn problem(&self, problem: impl Into<Problem>) -> ApiProblem {
        let leader_id = self.leadership.borrow().leader_id;
        ApiProblem(problem.into().with_node(self.node_id, leader_id))
    }

    /// The leader view of `l` from this node (`GET /v1/leader`, the status page).
    pub(super) fn view(&self, l: &Leadership) -> LeaderView {
        let scores = self.scores.as_ref().map(read_view);
        LeaderView {
            node_id: self.node_id,
            scope: self.scope.clone(),
            term: l.term,
            leader_id: l.leader_id,
            role: l.role,
            token: l.token,
            announced: l.announced,
            proof: l.proof.map(|p| p.encode()),
            lease_ms: self.leases.as_ref().map(|leases| leases.lease_ms),
            released: self.leases.as_ref().map(|_| l.token.is_some()),
            score_oracle: scores.as_ref().map(|v| v.oracle.as_str().to_owned()),
            scores: scores.map(|v| {
                v.scores
                    .into_iter()
                    .map(|(id, score)| (id.to_string(), score))
                    .collect()
            }),
        }
    }
}

/// The handlers' state, shared by every request.
pub(super) type Shared = Arc<ApiState>;

/// The lease side of the API's state; `None` in [`ApiState`] when leases are off.
pub(crate) struct LeaseApi {
    /// The lease duration granted.
    pub lease_ms: u64,
    /// The `--announce` entries in their normal form: the name each binds its URL to
    /// (`proxy-a=URL`; `None` for a bare URL) and the URL.
    proxies: Vec<AnnounceEntry>,
    /// One permit per waiting request ([`LEASE_PENDING_MAX`]).
    pub(crate) permits: Arc<Semaphore>,
}

impl LeaseApi {
    /// The lease API of a node with `config`, `None` when leases are off.
    pub(crate) fn from_config(config: &NodeConfig) -> Option<Self> {
        config
            .leases_on()
            .then(|| Self::new(config.lease_ms, &config.announce))
    }

    /// A lease API granting `lease_ms` to the proxies the `announce` entries list (an
    /// entry that is not one, which the node's configuration refuses, lists nothing).
    pub(crate) fn new(lease_ms: u64, announce: &[String]) -> Self {
        Self {
            lease_ms,
            proxies: announce
                .iter()
                .filter_map(|entry| parse_announce_entry(entry).ok())
                .collect(),
            permits: Arc::new(Semaphore::new(LEASE_PENDING_MAX)),
        }
    }

    /// What the `--announce` entries say of `proxy` (a lease request's URL, compared in
    /// the entries' normal form: `http://P:9001/` is `http://p:9001`): not listed,
    /// listed as a bare URL, or bound to a name. A `proxy` that is no URL, or that names
    /// itself (`NAME=URL`), is not listed.
    pub(super) fn binding(&self, proxy: &str) -> Binding<'_> {
        let Ok(asked) = parse_announce_entry(proxy) else {
            return Binding::Unlisted;
        };
        if asked.name.is_some() {
            return Binding::Unlisted;
        }
        match self.proxies.iter().find(|entry| entry.url == asked.url) {
            None => Binding::Unlisted,
            Some(AnnounceEntry { name: None, .. }) => Binding::Unbound,
            Some(AnnounceEntry {
                name: Some(name), ..
            }) => Binding::Bound(name),
        }
    }
}

/// What the announce list says of a proxy URL ([`LeaseApi::binding`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Binding<'a> {
    /// No `--announce` entry lists it.
    Unlisted,
    /// Its entry is a bare URL: bound to no name.
    Unbound,
    /// Its entry binds it to this name (`proxy-a=URL`).
    Bound(&'a str),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a proxy is known by its announce URL with or without a trailing slash, and
    /// nothing else matches. Method: compare variants of a URL against one list.
    #[test]
    fn proxies_are_compared_without_trailing_slashes() {
        let api = LeaseApi::new(1_000, &["http://127.0.0.1:9001/".to_owned()]);
        assert_eq!(api.binding("http://127.0.0.1:9001"), Binding::Unbound);
        assert_eq!(api.binding("http://127.0.0.1:9001/"), Binding::Unbound);
        assert_eq!(api.binding("http://127.0.0.1:9002"), Binding::Unlisted);
        assert_eq!(
            api.binding("http://127.0.0.1:9001/admin"),
            Binding::Unlisted
        );
        assert_eq!(api.binding(""), Binding::Unlisted);
    }

    /// Goal: an entry `NAME=URL` binds the URL to NAME, a bare URL binds none, both are
    /// compared in their normal form, and a request naming itself is not listed.
    /// Method: a lease API over both forms.
    #[test]
    fn announce_entries_bind_urls_to_names() {
        let api = LeaseApi::new(
            1_000,
            &[
                "proxy-a=http://127.0.0.1:9001/".to_owned(),
                "HTTP://127.0.0.1:9002".to_owned(),
            ],
        );
        assert_eq!(api.binding("http://127.0.0.1:9002/"), Binding::Unbound);
        assert_eq!(
            api.binding("http://127.0.0.1:9001"),
            Binding::Bound("proxy-a")
        );
        assert_eq!(
            api.binding("proxy-a=http://127.0.0.1:9001"),
            Binding::Unlisted
        );
    }
}
