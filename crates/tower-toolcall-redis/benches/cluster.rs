//! Run with: `cargo bench -p tower-toolcall-redis --features cluster --bench cluster`
//! (`REPLICAS=6 cargo bench …` for six replicas instead of two).
//!
//! The throughput of `IdempotencyLayer` on `RedisDedupeStore` over a 3-master, 3-replica
//! Redis Cluster against one `redis-server`, in the same run: 10 000 calls with distinct
//! keys, all in flight at once, from 2 replicas (two stores, each with its own connections)
//! on a Tokio runtime of 2 workers. Each call is a fresh key: its claim and its finalize.
//! Both the node and the cluster are started by the bench on free loopback ports. It prints
//! the calls per second of each round, the medians, and their ratio.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tower::{Layer, ServiceExt};
use tower_toolcall::idempotency::IdempotencyLayer;
use tower_toolcall::registry::{RiskLevel, ToolDescriptor, ToolRegistry};
use tower_toolcall::{tool_fn, ToolCall, ToolError, ToolOutput};
use tower_toolcall_redis::{RedisDedupeStore, RedisTarget};
use tower_toolcall_test::{cluster, redis_server};

/// Calls in flight at once in a round.
const CALLS: usize = 10_000;
/// Rounds per target.
const ROUNDS: usize = 5;

fn registry() -> ToolRegistry {
    ToolRegistry::builder()
        .tool(ToolDescriptor::new(
            "vault",
            "createFile",
            RiskLevel::Writes,
        ))
        .build()
        .unwrap()
}

fn call(round: &str, n: usize) -> ToolCall {
    ToolCall::builder("vault", "createFile")
        .session("bench")
        .actor("user-7")
        .params(json!({"path": format!("{round}/file-{n}.md"), "content": "x".repeat(120)}))
        .build()
        .unwrap()
}

/// Calls per second of `CALLS` fresh keys through the replicas of `target` (`REPLICAS`, 2
/// by default).
async fn round(target: &RedisTarget, name: &str) -> f64 {
    let count: usize = std::env::var("REPLICAS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(2);
    let replicas: Vec<_> = (0..count)
        .map(|_| {
            let store = RedisDedupeStore::builder(target.clone())
                .operation_timeout(Duration::from_secs(10))
                .build()
                .unwrap();
            IdempotencyLayer::new(registry(), Arc::new(store)).layer(tool_fn(
                |_call: ToolCall| async {
                    Ok::<_, ToolError>(ToolOutput::new(json!({"ok": true})))
                },
            ))
        })
        .collect();
    // Connections made and scripts loaded on every master.
    for n in 0..64 {
        replicas[n % count]
            .clone()
            .oneshot(call(&format!("warm-{name}"), n))
            .await
            .unwrap();
    }
    let start = Instant::now();
    let calls: Vec<_> = (0..CALLS)
        .map(|n| tokio::spawn(replicas[n % count].clone().oneshot(call(name, n))))
        .collect();
    for call in calls {
        let out = call.await.unwrap().expect("every call is answered");
        assert!(!out.record().from_cache);
    }
    CALLS as f64 / start.elapsed().as_secs_f64()
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    if std::env::args().any(|arg| arg == "--list") {
        return;
    }
    let node = redis_server::RedisServer::start();
    let cluster = cluster::RedisCluster::start();
    let targets = [
        ("node", RedisTarget::node(node.url())),
        ("cluster", RedisTarget::cluster(cluster.seeds())),
    ];
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut rates = [Vec::new(), Vec::new()];
    for round_number in 0..ROUNDS {
        // Alternated, so that both see the machine alike.
        for (index, (name, target)) in targets.iter().enumerate() {
            let rate = runtime.block_on(round(target, &format!("{name}-{round_number}")));
            println!("round {round_number} {name}: {rate:.0} calls/s");
            rates[index].push(rate);
        }
    }
    let (on_node, on_cluster) = (median(rates[0].clone()), median(rates[1].clone()));
    println!(
        "median of {ROUNDS} rounds of {CALLS} concurrent fresh keys: node \
         {on_node:.0} calls/s, cluster {on_cluster:.0} calls/s, cluster/node {:.2}",
        on_cluster / on_node
    );
}
