//! [`NodeHandleSource`]: a [`TokenSource`] for an application that runs its election
//! node in-process ([`Node::start`](crate::Node::start)), reading the node's leadership
//! watch directly: no HTTP, no polling, and it learns of a lost leadership the moment
//! the election loop publishes it.

use std::sync::atomic::{AtomicU64, Ordering};

use palisade_client::{BoxFuture, Leadership, TokenSource};
use tokio::sync::watch;

use crate::leadership::{Leadership as NodeLeadership, Role};
use crate::node::NodeHandle;

/// Follows an in-process election node. Cheap: [`current`](TokenSource::current) reads
/// the latest published value.
#[derive(Debug)]
pub struct NodeHandleSource {
    leadership: watch::Receiver<NodeLeadership>,
    /// The highest fence a proxy has reported. Invariant: only goes up. Tokens below it
    /// are never offered again.
    floor: AtomicU64,
}

impl NodeHandleSource {
    /// Follows `node`'s leadership.
    pub fn new(node: &NodeHandle) -> Self {
        Self::from_watch(node.leadership())
    }

    /// Follows a leadership watch (what [`NodeHandle::leadership`] returns).
    pub fn from_watch(leadership: watch::Receiver<NodeLeadership>) -> Self {
        Self {
            leadership,
            floor: AtomicU64::new(0),
        }
    }

    fn view(&self, node: &NodeLeadership) -> Leadership {
        let leadership = match node.token {
            // The proof travels with its token, for a proxy that checks proofs.
            Some(token) => Leadership::leader(token, node.term, node.leader_id)
                .with_proof(node.proof.map(|proof| proof.encode())),
            // A leader that is not established yet leads but cannot write.
            None if node.role == Role::Leader => {
                Leadership::establishing(node.term, node.leader_id)
            }
            None => Leadership::not_leader(node.term, node.leader_id),
        };
        leadership.below_floor_removed(self.floor.load(Ordering::Acquire))
    }
}

impl TokenSource for NodeHandleSource {
    fn current(&self) -> BoxFuture<'_, Leadership> {
        let leadership = self.view(&self.leadership.borrow());
        Box::pin(async move { leadership })
    }

    fn mark_not_leader(&self, current: u64) {
        let previous = self.floor.fetch_max(current, Ordering::AcqRel);
        if current > previous {
            tracing::info!(
                current,
                "marked not leader: a proxy fenced out tokens below {current}"
            );
        }
    }

    fn wait_for_leader(&self) -> BoxFuture<'_, Leadership> {
        Box::pin(async move {
            let mut rx = self.leadership.clone();
            loop {
                let leadership = self.view(&rx.borrow_and_update());
                if leadership.write_token().is_some() {
                    return leadership;
                }
                if rx.changed().await.is_err() {
                    // The node stopped: it will never lead again. Wait forever, as a
                    // source that never offers a token does.
                    std::future::pending::<()>().await;
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(term: u64, role: Role, token: Option<u64>) -> NodeLeadership {
        NodeLeadership {
            term,
            leader_id: Some(1),
            role,
            token,
            announced: token.is_some(),
            proof: None,
            established: token,
            released_by: token.map(|_| crate::leadership::ReleasedBy::Establishment),
        }
    }

    /// Goal: the source offers a token exactly while the node is the established leader,
    /// and never again below a fence a proxy reported. Method: drive the watch by hand.
    #[tokio::test]
    async fn source_follows_the_watch_and_respects_the_floor() {
        let (tx, rx) = watch::channel(node(3, Role::Leader, None));
        let source = NodeHandleSource::from_watch(rx);
        let establishing = source.current().await;
        assert_eq!(
            establishing.write_token(),
            None,
            "a leader without a token cannot write"
        );
        assert!(establishing.is_leader);

        tx.send(node(3, Role::Leader, Some(3))).unwrap();
        assert_eq!(source.current().await.write_token(), Some(3));

        source.mark_not_leader(4);
        assert_eq!(
            source.current().await.write_token(),
            None,
            "token 3 is below the fence 4"
        );

        let waiter = tokio::spawn({
            let rx = tx.subscribe();
            async move { NodeHandleSource::from_watch(rx).wait_for_leader().await }
        });
        tx.send(node(5, Role::Follower, None)).unwrap();
        tx.send(node(6, Role::Leader, Some(6))).unwrap();
        let leadership = tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(leadership.write_token(), Some(6));
        assert_eq!(
            source.current().await.write_token(),
            Some(6),
            "6 is above the fence"
        );
    }
}
