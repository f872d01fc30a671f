//! Named leaderships in process, through `NodeHandle::scopes` (the service the node API's
//! `/v1/sessions` and `/v1/scopes` routes call): sessions, campaigns in order, the
//! campaign's timeout, keepalives and their limits, owners, expiry on the leader's clock,
//! and a follower's answer. On tokio's paused clock over the in-memory network.

use std::time::Duration;

use std::future::ready;

use palisade_cluster::wait;
use palisade_election::{MemNetwork, NodeConfig, ScopeError};

use crate::support::{
    SCOPE, SETTLE_TIMEOUT, config, leadership, one_node, start_in_memory, token_holder,
};

/// TTL of the sessions here.
const TTL_MS: u64 = 2_000;

/// Goal: the service keeps every rule of named leaderships without HTTP: TTL bounds, the
/// cluster's own scope and bad names refused, one holder at a time with the same grant
/// again for the holder, a waiter's timeout, the keepalive's pace and owners, resigning
/// passing the scope on with a higher token, and a session that is not kept alive
/// expiring and releasing what it held.
/// Method: one node announcing to nobody (every grant fenced at once), paused clock.
#[tokio::test(start_paused = true)]
async fn the_service_grants_in_order_and_expires_on_the_leaders_clock() {
    let node = one_node(Vec::new()).await;
    leadership(&node, "established", |l| l.established.is_some()).await;
    let s = node.scopes();
    assert!(s.available());
    assert_eq!(
        s.open(999, None).await,
        Err(ScopeError::BadTtl { ttl_ms: 999 })
    );
    let a = s.open(TTL_MS, None).await.unwrap().id;
    let b = s.open(TTL_MS, None).await.unwrap().id;
    assert_ne!(a, b);
    let long = Duration::from_secs(5);
    assert!(matches!(
        s.campaign(SCOPE, &a, None, long).await,
        Err(ScopeError::ClusterScope { .. })
    ));
    assert!(matches!(
        s.campaign("no spaces", &a, None, long).await,
        Err(ScopeError::BadScope { .. })
    ));
    let first = s.campaign("billing", &a, None, long).await.unwrap();
    let again = s.campaign("billing", &a, None, long).await.unwrap();
    assert_eq!((again.token, &again.session), (first.token, &a));
    assert_eq!(s.read("billing").unwrap().token, Some(first.token));
    let timeout = s
        .campaign("billing", &b, None, Duration::from_millis(300))
        .await;
    assert!(
        matches!(
            timeout,
            Err(ScopeError::CampaignTimeout { waited_ms: 300, .. })
        ),
        "{timeout:?}"
    );
    assert!(s.keepalive(&a, None).await.is_ok());
    assert!(matches!(
        s.keepalive(&a, None).await,
        Err(ScopeError::KeepaliveTooFast { .. })
    ));
    let owned = s.open(TTL_MS, Some("writer-alice")).await.unwrap().id;
    for stranger in [Some("writer-bob"), None] {
        assert!(matches!(
            s.keepalive(&owned, stranger).await,
            Err(ScopeError::SessionOwner { .. })
        ));
    }
    // b waits again; a resigns: b is granted, above a's token.
    let waiter = {
        let s = s.clone();
        let b = b.clone();
        tokio::spawn(async move { s.campaign("billing", &b, None, long).await })
    };
    wait::poll(SETTLE_TIMEOUT, || {
        let waits = s
            .sessions()
            .unwrap()
            .into_iter()
            .any(|e| e.id == b && !e.waits.is_empty());
        ready(waits.then_some(()))
    })
    .await
    .expect("b waits for billing");
    assert!(s.resign("billing", &a, None).await.unwrap().released);
    let second = waiter.await.unwrap().unwrap();
    assert!(second.token > first.token, "{second:?} after {first:?}");
    // b is never kept alive: it expires within its TTL and a retry, releasing billing.
    tokio::time::sleep(Duration::from_millis(TTL_MS + 1_500)).await;
    assert_eq!(s.read("billing").unwrap().session, None);
    assert!(matches!(
        s.keepalive(&b, None).await,
        Err(ScopeError::UnknownSession { .. })
    ));
    assert!(s.revoke(&a, None).await.is_err(), "a expired too");
    node.stop().await.unwrap();
}

/// Goal: a follower's service answers changes with `NotLeader` naming the leader, and
/// the leader's grant is what the follower reads once applied.
/// Method: three nodes; open and campaign at the leader, then ask a follower.
#[tokio::test(start_paused = true)]
async fn a_follower_names_the_leader() {
    let net = MemNetwork::new();
    let ids = [1, 2, 3];
    let mut nodes = Vec::new();
    for id in ids {
        let c = NodeConfig {
            scope: SCOPE.into(),
            tick_ms: 10,
            ..config(id, &ids)
        };
        nodes.push(start_in_memory(c, &net).await);
    }
    let (leader, _) = token_holder(&nodes, |l| l.established.is_some()).await;
    let at = |id: u64| nodes.iter().find(|n| n.id() == id).unwrap();
    let s = at(leader).scopes();
    let a = s.open(TTL_MS, None).await.unwrap().id;
    let grant = s
        .campaign("ledger", &a, None, Duration::from_secs(5))
        .await
        .unwrap();
    let follower = at(ids.into_iter().find(|&id| id != leader).unwrap());
    leadership(follower, "the leader known", |l| {
        l.leader_id == Some(leader)
    })
    .await;
    assert_eq!(
        follower.scopes().open(TTL_MS, None).await,
        Err(ScopeError::NotLeader {
            leader_id: Some(leader)
        })
    );
    let seen = wait::poll(SETTLE_TIMEOUT, || {
        ready(follower.scopes().read("ledger").unwrap().token)
    })
    .await;
    assert_eq!(seen, Some(grant.token));
    for n in nodes {
        n.stop().await.unwrap();
    }
}
