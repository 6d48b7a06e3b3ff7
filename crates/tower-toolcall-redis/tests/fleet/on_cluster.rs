//! Operator actions through a Redis Cluster: every replica hears them, whatever node it
//! subscribes through, and after that node dies.

use super::*;
use support::cluster::{redis_cli, RedisCluster};

/// The fleet's channel with the default prefix.
const CHANNEL: &str = "toolcall:fleet:{fleet}:actions";

/// A replica joined to the fleet through the cluster's `seeds`, the first of which it
/// subscribes through.
async fn member_through(seeds: Vec<String>) -> Member {
    let stack = ToolStack::builder(ToolRegistry::open())
        .without(StackLayer::Idempotency)
        .build()
        .expect("a valid stack");
    let fleet = FleetControl::builder(seeds)
        .operation_timeout(Duration::from_millis(500))
        .join(&stack)
        .expect("a valid fleet configuration");
    fleet.sync().await.expect("the fleet's cluster answers");
    Member {
        replica: Replica::over(stack),
        fleet,
    }
}

/// The replicas subscribed to the fleet's channel through the node on `port`.
fn subscribers_on(port: u16) -> usize {
    redis_cli(port, &["PUBSUB", "NUMSUB", CHANNEL])
        .lines()
        .nth(1)
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// Sends `action` until the cluster takes it (its master may be failing over).
async fn until_taken<F, Fut>(what: &str, action: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<(), ToolError>>,
{
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match action().await {
            Ok(()) => return,
            Err(error) => {
                assert_eq!(error.code(), ErrorCode::StoreUnavailable, "{error}");
                assert!(Instant::now() < deadline, "{what}: {error}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actions_reach_replicas_subscribed_through_any_node_and_after_that_node_dies() {
    let mut cluster = RedisCluster::start();
    let seeds = cluster.seeds();
    let ports = cluster.ports().to_vec();
    // Three replicas, each subscribed through another node (masters and replicas alike).
    let mut members = Vec::new();
    for first in [0, 2, 4] {
        let mut rotated = seeds.clone();
        rotated.rotate_left(first);
        members.push(member_through(rotated).await);
    }
    for first in [0, 2, 4] {
        assert_eq!(
            subscribers_on(ports[first]),
            1,
            "one replica on node {first}"
        );
    }
    let key = BreakerKey::tool(WEB, "search");
    members[0].fleet.force_open(&key).await.unwrap();
    for member in &members {
        eventually("the force-open on every replica", || {
            breaker_state(member) == BreakerState::ForcedOpen
        })
        .await;
    }

    // The node the second replica listens through dies; it moves to another, reads the
    // switches again, and hears the next action.
    cluster.kill(ports[2]);
    let dead = ports[2];
    until_taken("the reset", || members[2].fleet.reset_breaker(&key)).await;
    let deadline = Instant::now() + Duration::from_secs(15);
    while members
        .iter()
        .any(|m| breaker_state(m) != BreakerState::Closed)
    {
        assert!(
            Instant::now() < deadline,
            "the reset reached every replica, the one whose node died included"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    until_taken("the kill switch", || members[0].fleet.set_enabled(false)).await;
    for member in &members {
        eventually("the kill switch on every replica", || {
            !member.replica.stack.control().is_enabled()
        })
        .await;
    }
    let moved: usize = ports
        .iter()
        .filter(|&&port| port != dead)
        .map(|&port| subscribers_on(port))
        .sum();
    assert_eq!(
        moved, 3,
        "every replica is subscribed again, through a live node"
    );
    assert!(
        members[1].fleet.stats().syncs >= 2,
        "it read the switches again"
    );
}
