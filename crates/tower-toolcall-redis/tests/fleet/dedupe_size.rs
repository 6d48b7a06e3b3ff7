//! The Redis dedupe store's size, as `/metrics` reads it on every scrape: a few round trips
//! however many keys the database holds.

use super::*;
use tower_toolcall::idempotency::DedupeStore;
use tower_toolcall_redis::RedisDedupeStore;

/// Writes `count` keys named `<prefix><n>`, 10 000 a script.
async fn fill(server: &RedisServer, prefix: &str, count: u64) {
    let script = "for i = tonumber(ARGV[2]), tonumber(ARGV[3]) do \
                  redis.call('SET', ARGV[1] .. i, 'x') end";
    for from in (1..=count).step_by(10_000) {
        let to = (from + 9_999).min(count);
        let _: () = query(
            server,
            redis::cmd("EVAL")
                .arg(script)
                .arg(0)
                .arg(prefix)
                .arg(from)
                .arg(to),
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_size_of_a_large_database_is_sampled_in_a_few_round_trips() {
    let server = RedisServer::start();
    let store = RedisDedupeStore::open(server.url()).unwrap();
    fill(&server, "toolcall:idem:{", 3).await;
    fill(&server, "unrelated:", 10).await;
    assert_eq!(store.size().await.unwrap(), 3, "exact in a small database");

    fill(&server, "toolcall:idem:{k", 20_000).await;
    fill(&server, "unrelated:", 100_000).await;
    let mut monitor = server.monitor();
    let size = store.size().await.unwrap();
    let commands = monitor.take_commands();
    let scans = commands.iter().filter(|name| *name == "SCAN").count();
    assert!(scans <= 4, "{scans} SCANs: {commands:?}");
    assert!(commands.len() <= 5, "{commands:?}");
    let records = 20_003.0;
    let error = (size as f64 - records).abs() / records;
    assert!(error < 0.25, "estimated {size} records of {records}");
}
