//! What only a Redis Cluster shows: keys on every master, waiting through sharded pub/sub,
//! the commands a call costs on the master that owns its key, and a master killed under load.

use std::collections::{BTreeSet, HashMap};

use super::cluster_backend::Cluster;
use super::*;
use support::cluster::key_slot;
use tower_toolcall_redis::RedisDedupeStore;

/// A tool that counts its runs per `path`.
fn counting_tool(delay: Duration) -> (MockTool, Arc<Mutex<HashMap<String, usize>>>) {
    let per_path: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let counts = per_path.clone();
    let tool = MockTool::responding(delay, move |call, n| {
        let path = call.params().as_value()["path"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        *counts.lock().unwrap().entry(path).or_default() += 1;
        Ok(ToolOutput::new(json!({"run": n})))
    });
    (tool, per_path)
}

fn make(path: &str) -> ToolCall {
    call("sess-42", json!({"path": path})).build().unwrap()
}

/// `count` paths whose records are spread over the cluster's slot ranges: as many on each
/// third of the 16 384 slots (the three masters' ranges as `--cluster create` assigns them).
fn paths_in_every_slot_range(
    idem: &IdempotencyLayer,
    store: &RedisDedupeStore,
    prefix: &str,
    count: usize,
) -> Vec<String> {
    let per_range = count / 3;
    let mut ranges = [Vec::new(), Vec::new(), Vec::new()];
    for n in 0.. {
        let path = format!("{prefix}-{n}.md");
        let key = idem.store_key(&make(&path)).unwrap().unwrap();
        let range = usize::from(key_slot(&store.record_key(&key))) * 3 / 16384;
        if ranges[range].len() < per_range {
            ranges[range].push(path);
        }
        if ranges.iter().all(|r| r.len() == per_range) {
            break;
        }
    }
    ranges.concat()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_duplicates_from_three_replicas_run_each_key_once_on_every_master() {
    let cluster = Cluster::start();
    let (tool, per_path) = counting_tool(Duration::from_millis(300));
    let replicas = [cluster.store(), cluster.store(), cluster.store()];
    let layers = replicas
        .clone()
        .map(|store| layer(store, ToolPolicy::default()));
    let services = layers.clone().map(|l| over(&l, &tool));
    let paths = paths_in_every_slot_range(&layers[0], &replicas[0], "file", 12);
    let masters: BTreeSet<u16> = {
        let nodes = cluster.cluster.lock().unwrap();
        paths
            .iter()
            .map(|path| {
                let key = layers[0].store_key(&make(path)).unwrap().unwrap();
                nodes.master_of(&replicas[0].record_key(&key))
            })
            .collect()
    };
    assert_eq!(masters.len(), 3, "the keys live on every master");

    let mut calls = Vec::new();
    for path in &paths {
        for duplicate in 0..100 {
            let svc = services[duplicate % 3].clone();
            calls.push(tokio::spawn(run_owned(svc, make(path))));
        }
    }
    let mut from_cache = 0;
    for handle in calls {
        let out = handle.await.unwrap().expect("every duplicate is answered");
        from_cache += usize::from(out.record().from_cache);
    }
    let per_path = per_path.lock().unwrap().clone();
    assert_eq!(per_path.len(), paths.len());
    assert!(
        per_path.values().all(|&runs| runs == 1),
        "one execution per key: {per_path:?}"
    );
    assert_eq!(tool.runs(), paths.len());
    assert_eq!(from_cache, paths.len() * 99);
    let joins: u64 = layers.iter().map(|l| l.stats().inflight_joins).sum();
    assert!(joins > 0, "duplicates joined running calls");
    let wakeups: u64 = replicas.iter().map(|r| r.stats().pubsub_wakeups).sum();
    let polls: u64 = replicas.iter().map(|r| r.stats().fallback_polls).sum();
    assert!(wakeups >= 1, "waiters were woken by sharded pub/sub");
    assert_eq!(polls, 0, "no message was lost, so nobody polled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_moved_while_duplicates_run_cost_no_call_and_no_second_execution() {
    let cluster = Cluster::start();
    let (tool, per_path) = counting_tool(Duration::from_millis(50));
    let replicas = [cluster.store(), cluster.store(), cluster.store()];
    let layers = replicas
        .clone()
        .map(|store| layer(store, ToolPolicy::default()));
    let services = layers.clone().map(|l| over(&l, &tool));
    let masters = cluster.cluster.lock().unwrap().masters();
    let (from, to) = (masters[0], masters[1]);
    let before = cluster.cluster.lock().unwrap().slot_count(from);

    // 2 000 slots move from one master to another while 3 replicas send each of 600 keys
    // three times over 6 s.
    let moving = tokio::task::spawn_blocking({
        let cluster = cluster.cluster.clone();
        move || cluster.lock().unwrap().reshard(from, to, 2000)
    });
    let start = tokio::time::Instant::now();
    let mut calls = Vec::new();
    let mut ticks = tokio::time::interval(Duration::from_millis(10));
    for n in 0..600usize {
        ticks.tick().await;
        for copy in 0..3 {
            let svc = services[(n + copy) % 3].clone();
            let path = format!("moving-{n}.md");
            calls.push(tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(20 * copy as u64)).await;
                run_owned(svc, make(&path)).await
            }));
        }
    }
    for call in calls {
        call.await
            .unwrap()
            .expect("MOVED and ASK are absorbed: no call fails");
    }
    moving.await.unwrap();
    let after = cluster.cluster.lock().unwrap().slot_count(from);
    println!(
        "{} slots moved in {:?} while 1 800 calls ran",
        before - after,
        start.elapsed()
    );
    assert_eq!(before - after, 2000, "the slots moved");
    let per_path = per_path.lock().unwrap().clone();
    assert_eq!(per_path.len(), 600);
    assert!(
        per_path.values().all(|&runs| runs == 1),
        "one execution per key"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_key_costs_two_commands_and_a_hit_one_on_the_owning_master() {
    let cluster = Cluster::start();
    let store = cluster.store();
    let tool = MockTool::echo(Duration::ZERO);
    let idem = layer(store.clone(), ToolPolicy::default());
    let svc = over(&idem, &tool);
    // Connects, and loads the scripts on every master: a fresh key and a hit on each.
    for path in paths_in_every_slot_range(&idem, &store, "warm-up", 3) {
        for _ in 0..2 {
            run(&svc, make(&path)).await.unwrap();
        }
    }
    let paths = paths_in_every_slot_range(&idem, &store, "fresh", 15);
    let mut monitors: Vec<_> = {
        let nodes = cluster.cluster.lock().unwrap();
        nodes
            .masters()
            .into_iter()
            .map(|port| (port, nodes.monitor(port)))
            .collect()
    };
    for (_, monitor) in &mut monitors {
        monitor.take_commands();
    }
    let owner = |path: &str| {
        let key = idem.store_key(&make(path)).unwrap().unwrap();
        cluster
            .cluster
            .lock()
            .unwrap()
            .master_of(&store.record_key(&key))
    };
    for path in &paths {
        assert!(!run(&svc, make(path)).await.unwrap().record().from_cache);
        let port = owner(path);
        for (master, monitor) in &mut monitors {
            let expected: &[&str] = if *master == port {
                &["SET", "EVALSHA"]
            } else {
                &[]
            };
            assert_eq!(
                monitor.take_commands(),
                expected,
                "a fresh key: the claim, then the finalize, on its master alone"
            );
        }
        assert!(run(&svc, make(path)).await.unwrap().record().from_cache);
        for (master, monitor) in &mut monitors {
            let expected: &[&str] = if *master == port { &["SET"] } else { &[] };
            assert_eq!(monitor.take_commands(), expected, "a hit: the claim alone");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_learns_of_a_result_finished_while_its_pubsub_master_failed_over() {
    let cluster = Cluster::start();
    let holder = cluster.store();
    let waiter = RedisDedupeStore::builder(cluster.cluster.lock().unwrap().seeds())
        .fallback_poll_interval(Duration::from_millis(500))
        .operation_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let tool = MockTool::echo(Duration::from_secs(4));
    let holding = layer(holder.clone(), ToolPolicy::default());
    let waiting = layer(waiter.clone(), ToolPolicy::default());
    let key = holding.store_key(&make("slow.md")).unwrap().unwrap();
    let master = cluster
        .cluster
        .lock()
        .unwrap()
        .master_of(&holder.record_key(&key));

    let first = tokio::spawn(run_owned(over(&holding, &tool), make("slow.md")));
    tool.started.notified().await;
    // The claim reached the master's replica before the master dies.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let second = tokio::spawn(run_owned(over(&waiting, &tool), make("slow.md")));
    let mut subscribed = false;
    for _ in 0..100 {
        if waiter.stats().subscribed_channels == 1 {
            subscribed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(subscribed, "the duplicate waits on the record's channel");

    cluster.cluster.lock().unwrap().kill(master);
    let dead = master;
    let failover = tokio::task::spawn_blocking({
        let cluster = cluster.cluster.clone();
        move || {
            cluster
                .lock()
                .unwrap()
                .wait_for_failover(dead, Duration::from_secs(15))
        }
    });
    let first = tokio::time::timeout(Duration::from_secs(20), first)
        .await
        .expect("the holder finishes")
        .unwrap()
        .unwrap();
    let second = tokio::time::timeout(Duration::from_secs(20), second)
        .await
        .expect("the waiter is answered by its deadline")
        .unwrap()
        .unwrap();
    let failover = failover.await.unwrap();
    assert_eq!(tool.runs(), 1, "one execution, through the failover");
    assert_eq!(first.content, second.content);
    assert!(second.record().from_cache);
    let stats = waiter.stats();
    println!("failover {failover:?}; waiter {stats:?}");
    assert!(
        stats.pubsub_wakeups + stats.fallback_polls >= 1,
        "woken by the new master's message, or by its own read: {stats:?}"
    );
}

/// What one call of the load did.
enum Outcome {
    Ran,
    Cached,
    FailedByPolicy,
    /// The duplicate of a call whose record could not be finalized waited past its own
    /// deadline (the record stays held until its lease ends).
    StillHeld,
}

/// Calls of the load: 100 a second, each with a duplicate, for 10 s.
const CALLS: usize = 1000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn master_killed_under_load_runs_no_key_twice_and_loses_no_acknowledged_record() {
    let cluster = Cluster::start();
    let replicas = [(); 3].map(|_| cluster.replica(Duration::from_millis(500)));
    let (tool, per_path) = counting_tool(Duration::from_millis(10));
    let layers = replicas
        .clone()
        .map(|store| layer(store, ToolPolicy::default()));
    let services = layers.clone().map(|l| over(&l, &tool));
    let victim = cluster.cluster.lock().unwrap().masters()[0];

    // 200 calls a second for 6 s, each with a duplicate 50 ms later from another replica;
    // beside them, 200 records a second written straight through the store. A master is
    // killed after 2 s.
    let start = tokio::time::Instant::now();
    let mut ticks = tokio::time::interval(Duration::from_millis(10));
    let (mut calls, mut writes) = (Vec::new(), Vec::new());
    let (mut killed_at, mut failover) = (None, None);
    for i in 0..CALLS {
        ticks.tick().await;
        if i == 200 {
            cluster.cluster.lock().unwrap().kill(victim);
            killed_at = Some(start.elapsed());
            let dead = victim;
            failover = Some(tokio::task::spawn_blocking({
                let cluster = cluster.cluster.clone();
                move || {
                    cluster
                        .lock()
                        .unwrap()
                        .wait_for_failover(dead, Duration::from_secs(15))
                }
            }));
        }
        let path = format!("load-{i}.md");
        let (first, duplicate) = (services[i % 3].clone(), services[(i + 1) % 3].clone());
        calls.push(tokio::spawn(async move {
            let first = tokio::spawn(run_owned(first, make(&path)));
            tokio::time::sleep(Duration::from_millis(50)).await;
            let duplicate =
                tokio::time::timeout(Duration::from_secs(3), run_owned(duplicate, make(&path)))
                    .await;
            let outcome = |result: Result<ToolOutput, ToolError>| match result {
                Ok(out) if out.record().from_cache => Outcome::Cached,
                Ok(_) => Outcome::Ran,
                Err(error) => {
                    assert_eq!(error.code(), ErrorCode::StoreUnavailable, "{error}");
                    Outcome::FailedByPolicy
                }
            };
            let first = outcome(first.await.unwrap());
            let duplicate = duplicate.map_or(Outcome::StillHeld, outcome);
            (tokio::time::Instant::now() - start, first, duplicate)
        }));
        if i % 2 == 1 {
            continue;
        }
        let store = replicas[i % 3].clone();
        writes.push(tokio::spawn(async move {
            let key = format!("direct/vault::createFile/s/a/{i}");
            let request = claim_request(&key, "d", Duration::from_secs(30));
            let Ok(ClaimOutcome::Claimed(claimed)) = store.claim(&request).await else {
                return None;
            };
            let written = store
                .finalize(&claimed, done(json!({"n": i}), Duration::from_secs(600)))
                .await;
            matches!(written, Ok(Finalized::Written)).then_some(key)
        }));
    }
    let killed_at = killed_at.unwrap();
    let (mut failed, mut held, mut last_failure) = (0, 0, Duration::ZERO);
    let mut histogram = [0usize; 24];
    for call in calls {
        let (at, first, duplicate) = call.await.unwrap();
        for outcome in [first, duplicate] {
            match outcome {
                Outcome::FailedByPolicy => {
                    failed += 1;
                    histogram[(at.as_millis() / 500).min(23) as usize] += 1;
                    last_failure = last_failure.max(at);
                }
                Outcome::StillHeld => held += 1,
                Outcome::Ran | Outcome::Cached => {}
            }
        }
    }
    let acknowledged: Vec<String> = futures::future::join_all(writes)
        .await
        .into_iter()
        .filter_map(|write| write.unwrap())
        .collect();
    let failover = failover.unwrap().await.unwrap();

    let per_path = per_path.lock().unwrap().clone();
    let twice: Vec<_> = per_path.iter().filter(|(_, &runs)| runs > 1).collect();
    assert!(twice.is_empty(), "no key ran twice: {twice:?}");
    let reader = cluster.store();
    let mut lost = Vec::new();
    for key in &acknowledged {
        let record = reader.get(key).await.expect("the cluster answers again");
        if record.is_none_or(|r| r.state != RecordState::Done) {
            lost.push(key.clone());
        }
    }
    let recovered = last_failure.saturating_sub(killed_at);
    println!(
        "master {victim} SIGKILLed at {killed_at:?} of a 10 s load of 200 calls/s (100 calls \
         a second and a duplicate of each from another replica) and 50 direct writes/s; \
         failures by half second: {histogram:?}; calls failed by policy: {failed} of {}; \
         duplicates still held at their 3 s deadline: {held}; last failure {recovered:?} \
         after the kill; the cluster promoted a replica {failover:?} after the kill; \
         acknowledged records {} of {}, lost {}; executions {}",
        2 * CALLS,
        acknowledged.len(),
        CALLS / 2,
        lost.len(),
        tool.runs(),
    );
    assert!(lost.is_empty(), "no acknowledged record was lost: {lost:?}");
    assert!(failed > 0, "the dead master's keys failed closed meanwhile");
    assert!(
        recovered < failover + Duration::from_secs(3),
        "every call works again soon after the failover: {recovered:?}"
    );
}
