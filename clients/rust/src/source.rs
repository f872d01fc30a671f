//! Where a client learns whether it may write, and with which token: the
//! [`TokenSource`] trait, the [`Leadership`] it reports, and [`StaticToken`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;

/// A boxed, sendable future: what [`TokenSource`] methods return, so the trait can be
/// used as `Arc<dyn TokenSource>`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// How often the default [`TokenSource::wait_for_leader`] asks again. Sources that can
/// be watched override it and wake at once.
pub const LEADER_POLL_MS: u64 = 100;

/// What a token source knows about the leadership of its scope.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Leadership {
    /// The fencing token. Invariant: `Some` only while this process is the established
    /// leader (a leader that has applied an entry of its own term), and then equal to
    /// that term.
    pub token: Option<u64>,
    /// The raft term last known (for a [`StaticToken`], the token itself).
    pub term: u64,
    /// The leader last known, if any.
    pub leader_id: Option<u64>,
    /// Whether this process is the leader (possibly not yet established).
    pub is_leader: bool,
    /// The token's proof (base64url Ed25519 signature by the cluster key), when the
    /// source has one: sent as `Fencing-Token-Proof` with the token. Invariant: `None`
    /// whenever `token` is.
    #[serde(serialize_with = "serialize_proof")]
    pub proof: Option<Arc<str>>,
}

/// A proof as JSON text (serde's own `Arc` support needs a feature this crate does not
/// turn on for one field). serde hands the field over as `&Option`.
#[allow(clippy::ref_option)]
fn serialize_proof<S: serde::Serializer>(
    proof: &Option<Arc<str>>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    proof.as_deref().serialize(serializer)
}

impl Leadership {
    /// The established leader of `term`, holding `token`.
    pub fn leader(token: u64, term: u64, leader_id: Option<u64>) -> Self {
        Self {
            token: Some(token),
            term,
            leader_id,
            is_leader: true,
            proof: None,
        }
    }

    /// This leadership with `proof` for its token (dropped when it holds no token: a
    /// proof without a token proves nothing).
    #[must_use]
    pub fn with_proof(mut self, proof: Option<impl Into<Arc<str>>>) -> Self {
        self.proof = if self.token.is_some() {
            proof.map(Into::into)
        } else {
            None
        };
        self
    }

    /// Not the leader (or not known to be) in `term`; `leader_id` is who is, if known.
    pub fn not_leader(term: u64, leader_id: Option<u64>) -> Self {
        Self {
            token: None,
            term,
            leader_id,
            is_leader: false,
            proof: None,
        }
    }

    /// The leader of `term`, not yet established (it has not applied an entry of its own
    /// term), so it holds no token and cannot write yet.
    pub fn establishing(term: u64, leader_id: Option<u64>) -> Self {
        Self {
            token: None,
            term,
            leader_id,
            is_leader: true,
            proof: None,
        }
    }

    /// The token to attach to a write: `Some` only for an established leader.
    pub fn write_token(&self) -> Option<u64> {
        if self.is_leader { self.token } else { None }
    }

    /// The proof to attach with [`write_token`](Self::write_token): `Some` only when
    /// that is and the source has a proof.
    pub fn write_proof(&self) -> Option<&str> {
        self.write_token().and(self.proof.as_deref())
    }

    /// This leadership with every token below `floor` taken away: a proxy has said that
    /// its fence is at `floor`, so a lower token can never be admitted again.
    #[must_use]
    pub fn below_floor_removed(self, floor: u64) -> Self {
        match self.token {
            Some(token) if token < floor => Self::not_leader(self.term, self.leader_id),
            _ => self,
        }
    }
}

/// A source of fencing tokens: tells a client whether it is the established leader, with
/// which token, and hears back when a proxy has fenced that token out.
///
/// Implementations must be cheap to call: [`FencedClient`](crate::FencedClient) calls
/// [`current`](Self::current) before every attempt of every fenced request.
pub trait TokenSource: Send + Sync {
    /// The leadership as this source knows it now.
    fn current(&self) -> BoxFuture<'_, Leadership>;

    /// Records locally that a proxy's fence is at `current`: every token below it is
    /// stale, so the source reports "not leader" until it holds a token of at least
    /// `current` (a later term). `u64::MAX` stops the source for good.
    fn mark_not_leader(&self, current: u64);

    /// Resolves when the source reports an established leader with a token; returns
    /// that leadership. The default asks [`current`](Self::current) every
    /// [`LEADER_POLL_MS`].
    fn wait_for_leader(&self) -> BoxFuture<'_, Leadership> {
        Box::pin(async move {
            loop {
                let leadership = self.current().await;
                if leadership.write_token().is_some() {
                    return leadership;
                }
                tokio::time::sleep(Duration::from_millis(LEADER_POLL_MS)).await;
            }
        })
    }
}

/// A fixed token, for scripts, tests and processes whose leadership is decided elsewhere
/// (a lease, a cron lock). It leads until a proxy fences it out; after that it never
/// leads again, since a fixed token cannot go up.
#[derive(Debug)]
pub struct StaticToken {
    token: u64,
    /// The token's proof, if one was given.
    proof: Option<Arc<str>>,
    /// The highest fence a proxy has reported. Invariant: only goes up.
    floor: AtomicU64,
}

impl StaticToken {
    /// A source that always offers `token`, until fenced out.
    pub fn new(token: u64) -> Self {
        Self {
            token,
            proof: None,
            floor: AtomicU64::new(0),
        }
    }

    /// A source that offers `token` with its `proof` (base64url, as a node's leader view
    /// gives it), for a proxy that checks proofs.
    pub fn with_proof(token: u64, proof: impl Into<Arc<str>>) -> Self {
        Self {
            proof: Some(proof.into()),
            ..Self::new(token)
        }
    }

    /// The token.
    pub fn token(&self) -> u64 {
        self.token
    }

    fn leadership(&self) -> Leadership {
        Leadership::leader(self.token, self.token, None)
            .with_proof(self.proof.clone())
            .below_floor_removed(self.floor.load(Ordering::Acquire))
    }
}

impl TokenSource for StaticToken {
    fn current(&self) -> BoxFuture<'_, Leadership> {
        let leadership = self.leadership();
        Box::pin(async move { leadership })
    }

    fn mark_not_leader(&self, current: u64) {
        let previous = self.floor.fetch_max(current, Ordering::AcqRel);
        tracing::debug!(
            token = self.token,
            current,
            previous,
            "static token marked not leader"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a static token leads until a proxy reports a higher fence, and never again
    /// after, even if a lower fence is reported later. Method: mark fences 3, 5, 4.
    #[tokio::test]
    async fn static_token_leads_until_fenced_and_never_again() {
        let source = StaticToken::new(3);
        assert_eq!(source.current().await.write_token(), Some(3));
        source.mark_not_leader(3);
        assert_eq!(
            source.current().await.write_token(),
            Some(3),
            "a fence equal to the token still admits it"
        );
        source.mark_not_leader(5);
        let now = source.current().await;
        assert_eq!(now.write_token(), None);
        assert!(!now.is_leader);
        source.mark_not_leader(4);
        assert_eq!(
            source.current().await.write_token(),
            None,
            "the floor never goes down"
        );
    }

    /// Goal: a floor takes away only tokens below it. Method: apply floors 7 and 8.
    #[test]
    fn floor_removes_only_lower_tokens() {
        let l = Leadership::leader(7, 7, Some(1));
        assert_eq!(l.clone().below_floor_removed(7).write_token(), Some(7));
        assert_eq!(l.below_floor_removed(8).write_token(), None);
        assert_eq!(Leadership::not_leader(3, None).write_token(), None);
    }

    /// Goal: a proof travels with its token only: it is offered while the token is, gone
    /// once a floor takes the token away, and never attached to a leadership without a
    /// token. Method: a static token with a proof, fenced out; an establishing leader
    /// given a proof.
    #[tokio::test]
    async fn a_proof_goes_with_its_token_only() {
        let source = StaticToken::with_proof(4, "c2ln");
        assert_eq!(source.current().await.write_proof(), Some("c2ln"));
        source.mark_not_leader(5);
        let fenced = source.current().await;
        assert_eq!((fenced.write_token(), fenced.write_proof()), (None, None));
        assert_eq!(fenced.proof, None);
        let establishing = Leadership::establishing(3, Some(1)).with_proof(Some("c2ln"));
        assert_eq!(establishing.proof, None);
        assert_eq!(StaticToken::new(4).current().await.write_proof(), None);
    }
}
