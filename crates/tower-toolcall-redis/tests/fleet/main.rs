//! Several stacks on one real `redis-server`, as replicas behind a load balancer: shared rate
//! limits and loop detection, their failure policy while Redis is down, recovery without a
//! rebuild, and operator actions that reach every replica.

#[path = "../support/mod.rs"]
mod support;

mod dedupe_size;
#[cfg(feature = "cluster")]
mod on_cluster;
mod outages;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use support::eventually;
use support::redis_server::RedisServer;
use support::{call_once, stacked, Counter};
use tokio::time::Instant;
use tower::util::BoxCloneService;
use tower_toolcall::breaker::BreakerKey;
use tower_toolcall::control::ShadowLayer;
use tower_toolcall::loop_detect::LoopDetectSettings;
use tower_toolcall::registry::{RateLimitKey, RateLimitSettings, ToolRegistry};
use tower_toolcall::shared_store::{FailurePolicy, StoreError};
use tower_toolcall::{
    BreakerState, ErrorCode, StackLayer, ToolCall, ToolError, ToolOutput, ToolStack,
};
use tower_toolcall_redis::FleetControl;
use tower_toolcall_redis::RedisLoopStore;
use tower_toolcall_redis::RedisRateLimitStore;

const WEB: &str = "agents.tools.web";

type Service = BoxCloneService<ToolCall, ToolOutput, ToolError>;

/// One replica: its stack over a counting tool.
struct Replica {
    stack: ToolStack,
    service: Service,
    tool: Counter,
}

impl Replica {
    /// `stack` over a counting tool.
    fn over(stack: ToolStack) -> Replica {
        let tool = Counter::default();
        let service = BoxCloneService::new(stacked(&stack, tool.tool()));
        Replica {
            stack,
            service,
            tool,
        }
    }

    async fn call(&self, call: ToolCall) -> Result<ToolOutput, ToolError> {
        call_once(&mut self.service.clone(), call).await
    }
}

/// A rate-limit store on `server` whose checks give up after 500 ms.
fn rate_store(server: &RedisServer) -> RedisRateLimitStore {
    RedisRateLimitStore::builder(server.url())
        .operation_timeout(Duration::from_millis(500))
        .build()
        .expect("a valid store configuration")
}

/// A replica whose every tool is limited to `per_second` in bursts of `burst`, per tool,
/// with its quotas on `server`.
fn rate_limited_replica(
    server: &RedisServer,
    per_second: u32,
    burst: u32,
    policy: FailurePolicy,
) -> Replica {
    let stack = ToolStack::builder(ToolRegistry::open())
        .rate_limit(|limits| {
            limits
                .settings(
                    RateLimitSettings::default()
                        .with_per_second(per_second)
                        .with_burst(burst)
                        .with_key(RateLimitKey::Tool),
                )
                .on_store_failure(policy)
        })
        .rate_limit_store(Arc::new(rate_store(server)))
        .build()
        .expect("a valid stack");
    Replica::over(stack)
}

/// A call of `agents.tools.web::<name>` with params no other call of the test has, so that
/// only the rate limit has a say.
fn fresh(name: &str) -> ToolCall {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    ToolCall::builder(WEB, name)
        .session("sess-42")
        .actor("user-7")
        .params(json!({"n": CALLS.fetch_add(1, Ordering::Relaxed)}))
        .build()
        .expect("a valid call")
}

/// A replica whose loop detector keeps its sessions on `server`, with the default rules.
fn loop_checked_replica(server: &RedisServer, policy: FailurePolicy) -> Replica {
    let store = RedisLoopStore::builder(server.url())
        .operation_timeout(Duration::from_millis(200))
        .build()
        .expect("a valid store configuration");
    let stack = ToolStack::builder(ToolRegistry::open())
        .loop_detect(|loops| loops.on_store_failure(policy))
        .loop_store(Arc::new(store))
        // Identical calls reach the tool each time: only loop detection stops them.
        .without(StackLayer::Idempotency)
        .build()
        .expect("a valid stack");
    Replica::over(stack)
}

/// A call of `search` in `session` with `params`.
fn search_in(session: &str, params: serde_json::Value) -> ToolCall {
    ToolCall::builder(WEB, "search")
        .session(session)
        .actor("user-7")
        .params(params)
        .build()
        .expect("a valid call")
}

/// Sends `calls` round-robin over `replicas` until one is refused as a loop; answers the
/// 1-based number of the refused call.
async fn refused_at(replicas: &[Replica], calls: &[ToolCall]) -> usize {
    for (n, call) in calls.iter().enumerate() {
        let replica = &replicas[n % replicas.len()];
        match replica.call(call.clone()).await {
            Ok(_) => {}
            Err(error) if error.code() == ErrorCode::LoopDetected => return n + 1,
            Err(error) => panic!("call {} failed: {error}", n + 1),
        }
    }
    panic!("no call of {} was refused as a loop", calls.len());
}

/// Runs `command` on `server`, over a connection of its own.
async fn query<T: redis::FromRedisValue>(server: &RedisServer, command: &mut redis::Cmd) -> T {
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    command.query_async(&mut conn).await.unwrap()
}

/// Calls `replica` (whose store fails closed) until a call is checked again: the store's
/// probe found its server back. At most 3 s.
async fn until_checked(replica: &Replica) {
    let deadline = Instant::now() + Duration::from_secs(3);
    while let Err(error) = replica.call(fresh("probe")).await {
        assert_eq!(error.code(), ErrorCode::StoreUnavailable, "{error}");
        assert!(Instant::now() < deadline, "the store did not come back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn total_calls(replicas: &[Replica]) -> usize {
    replicas.iter().map(|replica| replica.tool.get()).sum()
}

/// Calls `replica` until a call comes back refused by its rate limit, or `within` passes.
async fn until_rate_limited(replica: &Replica, within: Duration) -> ToolError {
    let deadline = Instant::now() + within;
    loop {
        if let Err(error) = replica.call(fresh("search")).await {
            if error.code() == ErrorCode::RateLimited {
                return error;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no call was rate limited within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_of_ten_a_second_holds_across_three_replicas() {
    // The only test on real time: the quota is kept on the server's clock.
    let server = RedisServer::start();
    let replicas: Vec<Replica> = (0..3)
        .map(|_| rate_limited_replica(&server, 10, 1, FailurePolicy::Closed))
        .collect();
    let measured = Duration::from_secs(5);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for replica in &replicas {
        let service = replica.service.clone();
        tasks.push(tokio::spawn(async move {
            let mut refused = 0;
            while started.elapsed() < measured {
                match call_once(&mut service.clone(), fresh("search")).await {
                    Ok(_) => {}
                    Err(error) => {
                        assert_eq!(error.code(), ErrorCode::RateLimited, "{error}");
                        refused += 1;
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            refused
        }));
    }
    let mut refused = 0;
    for task in tasks {
        refused += task.await.unwrap();
    }
    let elapsed = started.elapsed().as_secs_f64();
    let allowed = total_calls(&replicas);
    let rate = allowed as f64 / elapsed;
    assert!(
        (9.0..=11.0).contains(&rate),
        "{allowed} calls ran in {elapsed:.2} s across three replicas: {rate:.2} a second, \
         not 10 ± 1"
    );
    assert!(
        refused > allowed,
        "the replicas asked for more than the quota: {refused} refused"
    );
    for replica in &replicas {
        assert!(replica.tool.get() > 0, "every replica got a share");
        assert_eq!(
            replica.stack.rate_limits().unwrap().store_health().outages,
            0
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_spent_on_one_replica_is_spent_on_the_other() {
    let server = RedisServer::start();
    // Two calls a minute: the burst of 3 is not refilled during the test.
    let a = rate_limited_replica(&server, 1, 3, FailurePolicy::Open);
    let b = rate_limited_replica(&server, 1, 3, FailurePolicy::Open);
    for _ in 0..3 {
        a.call(fresh("search")).await.unwrap();
    }
    let error = b.call(fresh("search")).await.unwrap_err();
    assert_eq!(error.code(), ErrorCode::RateLimited);
    let retry_after = error.retry_after().expect("a retry-after");
    assert!(
        retry_after > Duration::from_millis(500) && retry_after <= Duration::from_secs(1),
        "the retry-after is the store's answer, under the emission interval: {retry_after:?}"
    );
    assert_eq!((a.tool.get(), b.tool.get()), (3, 0));
    // Another tool has its own quota.
    b.call(fresh("fetch")).await.unwrap();
    assert_eq!(b.tool.get(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_keys_are_hash_tagged_and_expire() {
    let server = RedisServer::start();
    let a = rate_limited_replica(&server, 2, 2, FailurePolicy::Closed);
    a.call(fresh("search")).await.unwrap();
    let keys: Vec<String> = query(&server, redis::cmd("KEYS").arg("*")).await;
    assert_eq!(
        keys,
        vec![format!("toolcall:rl:{{{WEB}::search\u{1f}}}")],
        "one key, its name in a hash tag"
    );
    let ttl_ms: i64 = query(&server, redis::cmd("PTTL").arg(&keys[0])).await;
    assert!(
        (1..=502).contains(&ttl_ms),
        "the key lives until its quota is full again: {ttl_ms} ms"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_rate_limited_calls_proceed_counted_then_sharing_resumes() {
    let mut server = RedisServer::start();
    let a = rate_limited_replica(&server, 1, 2, FailurePolicy::Open);
    let b = rate_limited_replica(&server, 1, 2, FailurePolicy::Open);
    a.call(fresh("search")).await.unwrap();
    server.kill();

    let started = Instant::now();
    for _ in 0..5 {
        a.call(fresh("search")).await.unwrap();
        b.call(fresh("search")).await.unwrap();
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "ten checks against a dead server are bounded by the timeout"
    );
    let (a_health, b_health) = (
        a.stack.rate_limits().unwrap().store_health(),
        b.stack.rate_limits().unwrap().store_health(),
    );
    assert_eq!((a.tool.get(), b.tool.get()), (6, 5), "every call proceeded");
    assert!(!a_health.available);
    assert_eq!(a_health.outages, 1, "one outage, however many calls");
    assert_eq!(a_health.failed_checks, 5);
    assert_eq!((b_health.outages, b_health.failed_checks), (1, 5));

    server.restart();
    // The same stacks: their connections come back by themselves, and the quota is shared
    // again (the restarted server starts with full quotas).
    until_rate_limited(&a, Duration::from_secs(10)).await;
    let error = b.call(fresh("search")).await.unwrap_err();
    assert_eq!(error.code(), ErrorCode::RateLimited);
    let a_health = a.stack.rate_limits().unwrap().store_health();
    assert!(a_health.available, "the outage ended");
    assert_eq!(a_health.outages, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_closed_refuses_calls_while_redis_is_down() {
    let mut server = RedisServer::start();
    let a = rate_limited_replica(&server, 10, 10, FailurePolicy::Closed);
    a.call(fresh("search")).await.unwrap();
    server.kill();
    for _ in 0..3 {
        let error = a.call(fresh("search")).await.unwrap_err();
        assert_eq!(error.code(), ErrorCode::StoreUnavailable, "{error}");
        assert!(error.is_retriable());
    }
    assert_eq!(a.tool.get(), 1, "no call ran unchecked");
    let health = a.stack.rate_limits().unwrap().store_health();
    assert_eq!((health.outages, health.failed_checks), (1, 3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loop_spread_over_three_replicas_is_stopped_at_the_same_call_as_on_one() {
    let server = RedisServer::start();
    let one = [loop_checked_replica(&server, FailurePolicy::Closed)];
    let three: Vec<Replica> = (0..3)
        .map(|_| loop_checked_replica(&server, FailurePolicy::Closed))
        .collect();
    let patterns: [(&str, Vec<serde_json::Value>); 2] = [
        // The same call again and again: the 4th is refused.
        ("repeat", vec![json!({"q": "same"}); 10]),
        // A cycle of two: A,B,A,B,A,B — the 6th completes its 3rd repetition.
        ("cycle", (0..10).map(|i| json!({"step": i % 2})).collect()),
    ];
    for (name, params) in patterns {
        let calls = |session: &str| -> Vec<ToolCall> {
            params
                .iter()
                .map(|p| search_in(session, p.clone()))
                .collect()
        };
        let alone = refused_at(&one, &calls(&format!("{name}-one"))).await;
        let spread = refused_at(&three, &calls(&format!("{name}-three"))).await;
        assert_eq!(alone, spread, "{name}: stopped at the same call");
    }
    assert_eq!(one[0].tool.get(), 3 + 5);
    assert_eq!(
        total_calls(&three),
        3 + 5,
        "no replica ran a call the loop forbade"
    );
    for replica in &three {
        assert!(replica.tool.get() > 0, "every replica took part");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_loop_checked_calls_proceed_counted_then_sharing_resumes() {
    let mut server = RedisServer::start();
    let replicas = [
        loop_checked_replica(&server, FailurePolicy::Open),
        loop_checked_replica(&server, FailurePolicy::Open),
    ];
    server.kill();
    // Unchecked while Redis is down: six identical calls all run.
    for n in 0..6 {
        replicas[n % 2]
            .call(search_in("down", json!({"q": 1})))
            .await
            .unwrap();
    }
    assert_eq!(total_calls(&replicas), 6);
    for replica in &replicas {
        let health = replica.stack.loop_sessions().unwrap().store_health();
        assert!(!health.available);
        assert_eq!((health.outages, health.failed_checks), (1, 3));
    }

    server.restart();
    // The same stacks: once their connections are back, a loop spread over both is
    // stopped at the 4th call again.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !replicas.iter().all(|replica| {
        replica
            .stack
            .loop_sessions()
            .unwrap()
            .store_health()
            .available
    }) {
        assert!(Instant::now() < deadline, "the store did not come back");
        for replica in &replicas {
            let _ = replica.call(fresh("search")).await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let calls: Vec<ToolCall> = (0..6).map(|_| search_in("up", json!({"q": 1}))).collect();
    assert_eq!(refused_at(&replicas, &calls).await, 4);
    for replica in &replicas {
        assert_eq!(
            replica
                .stack
                .loop_sessions()
                .unwrap()
                .store_health()
                .outages,
            1
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Operator actions

/// A replica joined to the fleet on `server`.
struct Member {
    replica: Replica,
    fleet: FleetControl,
}

/// A replica with the default stack, joined to the fleet on `server` and synced.
async fn member(server: &RedisServer) -> Member {
    let stack = ToolStack::builder(ToolRegistry::open())
        .without(StackLayer::Idempotency)
        .build()
        .expect("a valid stack");
    member_with(server, stack).await
}

/// A loop-checked replica (see [`loop_checked_replica`]) joined to the fleet on `server`.
async fn loop_checked_member(server: &RedisServer) -> Member {
    let stack = loop_checked_replica(server, FailurePolicy::Closed).stack;
    member_with(server, stack).await
}

/// `stack` joined to the fleet on `server` and synced.
async fn member_with(server: &RedisServer, stack: ToolStack) -> Member {
    let fleet = FleetControl::builder(server.url())
        .operation_timeout(Duration::from_millis(200))
        .join(&stack)
        .expect("a valid fleet configuration");
    fleet.sync().await.expect("the fleet's Redis answers");
    Member {
        replica: Replica::over(stack),
        fleet,
    }
}

fn breaker_state(member: &Member) -> BreakerState {
    member
        .replica
        .stack
        .breakers()
        .unwrap()
        .state(WEB, "search")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_open_on_one_replica_fails_calls_fast_on_the_other() {
    let server = RedisServer::start();
    let a = member(&server).await;
    let b = member(&server).await;
    let key = BreakerKey::tool(WEB, "search");

    a.fleet.force_open(&key).await.unwrap();
    assert_eq!(
        breaker_state(&a),
        BreakerState::ForcedOpen,
        "at once on the sender"
    );
    eventually("the force-open on B", || {
        breaker_state(&b) == BreakerState::ForcedOpen
    })
    .await;
    let error = b.replica.call(fresh("search")).await.unwrap_err();
    assert_eq!(error.code(), ErrorCode::CircuitOpen);
    assert_eq!(b.replica.tool.get(), 0, "the tool was not called");
    b.replica
        .call(fresh("fetch"))
        .await
        .expect("other tools run");
    assert_eq!(b.fleet.stats().applied, 1, "one message");

    b.fleet.reset_breaker(&key).await.unwrap();
    eventually("the reset on A", || {
        breaker_state(&a) == BreakerState::Closed
    })
    .await;
    a.replica.call(fresh("search")).await.expect("closed again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kill_switch_and_shadow_mode_reach_every_replica_and_late_starters_read_them() {
    let server = RedisServer::start();
    let a = member(&server).await;
    let b = member(&server).await;
    a.fleet.set_enabled(false).await.unwrap();
    a.fleet
        .set_shadow(ShadowLayer::RateLimit, true)
        .await
        .unwrap();
    a.fleet
        .force_open(&BreakerKey::tool(WEB, "search"))
        .await
        .unwrap();
    let control = b.replica.stack.control().clone();
    eventually("the switches on B", || {
        !control.is_enabled() && control.is_shadow(ShadowLayer::RateLimit)
    })
    .await;

    // A replica that starts now reads the switches as it joins.
    let c = member(&server).await;
    let control = c.replica.stack.control();
    assert!(!control.is_enabled(), "the kill switch");
    assert!(control.is_shadow(ShadowLayer::RateLimit));
    assert!(!control.is_shadow(ShadowLayer::LoopDetect));
    assert_eq!(breaker_state(&c), BreakerState::ForcedOpen);

    c.fleet.set_enabled(true).await.unwrap();
    for member in [&a, &b] {
        let control = member.replica.stack.control().clone();
        eventually("the switch back on", || control.is_enabled()).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_reset_on_one_replica_clears_the_loop_on_every_replica() {
    let server = RedisServer::start();
    let a = member(&server).await;
    let b = member(&server).await;
    let looping = search_in("sess-9", json!({"q": "same"}));
    for _ in 0..3 {
        b.replica.call(looping.clone()).await.unwrap();
    }
    let error = b.replica.call(looping.clone()).await.unwrap_err();
    assert_eq!(error.code(), ErrorCode::LoopDetected);

    a.fleet.reset_session("sess-9").await.unwrap();
    eventually("the reset on B", || b.fleet.stats().applied == 1).await;
    b.replica
        .call(looping)
        .await
        .expect("the session counts afresh");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_to_the_fleet_leaves_the_other_replicas_untouched() {
    let server = RedisServer::start();
    let a = member(&server).await;
    let b = member(&server).await;

    let error = a.fleet.reset_session("").await.unwrap_err();
    assert_eq!(error.code(), ErrorCode::ValidationError);
    assert!(
        error.message().starts_with("session:"),
        "{}",
        error.message()
    );

    // Messages that another program wrote on the channel are refused, one by one.
    let channel = "toolcall:fleet:{fleet}:actions";
    for garbage in [
        "not json",
        r#"{"action":"set_enabled"}"#,
        r#"{"action":"force_open","breaker":"nonsense key with spaces"}"#,
        r#"{"action":"set_shadow","layer":"no_such_layer","shadow":true}"#,
        r#"{"action":"set_enabled","enabled":false,"extra":1}"#,
    ] {
        let _: i64 = query(&server, redis::cmd("PUBLISH").arg(channel).arg(garbage)).await;
    }
    eventually("the refusals on B", || b.fleet.stats().refused == 5).await;
    let control = b.replica.stack.control();
    assert!(control.is_enabled());
    assert!(ShadowLayer::ALL
        .iter()
        .all(|layer| !control.is_shadow(*layer)));
    let snapshot = b.replica.stack.breakers().unwrap().snapshot();
    assert!(
        snapshot
            .iter()
            .all(|status| status.state == BreakerState::Closed),
        "{snapshot:?}"
    );
    assert_eq!(b.fleet.stats().applied, 0);

    // The channel still works.
    a.fleet.set_enabled(false).await.unwrap();
    let control = b.replica.stack.control().clone();
    eventually("a valid action on B", || !control.is_enabled()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actions_need_redis_and_sharing_resumes_after_a_restart() {
    let mut server = RedisServer::start();
    let a = member(&server).await;
    let b = member(&server).await;
    server.kill();
    let started = Instant::now();
    let error = a.fleet.set_enabled(false).await.unwrap_err();
    assert_eq!(error.code(), ErrorCode::StoreUnavailable);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "bounded by the timeout"
    );

    server.restart();
    // B resubscribes by itself; A's action then reaches it.
    eventually("B's resync", || b.fleet.stats().syncs >= 2).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while a
        .fleet
        .set_shadow(ShadowLayer::LoopDetect, true)
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "A could not reach Redis again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let control = b.replica.stack.control().clone();
    eventually("the action on B", || {
        control.is_shadow(ShadowLayer::LoopDetect)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loop_session_is_one_bounded_key_that_expires_with_its_window() {
    let server = RedisServer::start();
    let replica = loop_checked_replica(&server, FailurePolicy::Closed);
    for n in 0..20 {
        replica
            .call(search_in("sess-7", json!({"n": n})))
            .await
            .unwrap();
    }
    let keys: Vec<String> = query(&server, redis::cmd("KEYS").arg("*")).await;
    assert_eq!(keys, vec!["toolcall:loop:{sess-7}".to_owned()]);
    let ttl_ms: i64 = query(&server, redis::cmd("PTTL").arg(&keys[0])).await;
    assert!(
        (110_000..=120_000).contains(&ttl_ms),
        "the window of 120 s: {ttl_ms} ms"
    );
    let session: String = query(&server, redis::cmd("GET").arg(&keys[0])).await;
    // Fixed-width fields: the next sequence number, the chance, the settings' length.
    assert_eq!(
        &session[..12],
        "000000000014",
        "the next sequence number, 20"
    );
    assert_eq!(&session[12..40], " ".repeat(28), "no chance given");
    assert_eq!(&session[40..44], "0000", "no settings of its own");
    let calls = &session[44..];
    assert_eq!(
        calls.len(),
        14 * 86,
        "as many calls as the default rules look at (a cycle of 5, three times, less one)"
    );
    assert!(
        calls
            .as_bytes()
            .chunks(86)
            .all(|call| call[28] == b'0' && call[29] == b'p'),
        "not pollers, none settled: {calls}"
    );
}

/// A session's string with no chance and no calls.
fn stored_session(seq: u64, settings: &str) -> String {
    format!(
        "{seq:012x}{}{:04x}{settings}",
        " ".repeat(28),
        settings.len()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_loop_settings_are_kept_with_its_history_and_read_by_every_replica() {
    let server = RedisServer::start();
    let a = loop_checked_member(&server).await;
    let b = loop_checked_member(&server).await;

    let error = a
        .fleet
        .apply_loop_command("strict", "!/set(tool-loop-max-repeats=1)")
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::ValidationError, "{error}");
    a.fleet
        .apply_loop_command("strict", "!/set(tool-loop-max-repeats=2)")
        .await
        .unwrap();
    let key = "toolcall:loop:{strict}";
    let session: String = query(&server, redis::cmd("GET").arg(key)).await;
    assert_eq!(
        session,
        stored_session(0, "{\"max_repeats\":2}"),
        "the settings, no calls yet"
    );
    let ttl_ms: i64 = query(&server, redis::cmd("PTTL").arg(key)).await;
    assert!(
        (110_000..=120_000).contains(&ttl_ms),
        "the window: {ttl_ms} ms"
    );

    // B never saw the command: it reads the settings with the session's first call there.
    let loops = b.replica.stack.loop_sessions().unwrap();
    assert!(loops.session_settings("strict").is_empty());
    assert_eq!(
        b.fleet.stats().applied,
        0,
        "no message: the store holds the settings"
    );
    let call = search_in("strict", json!({"q": 1}));
    b.replica.call(call.clone()).await.unwrap();
    assert_eq!(loops.session_settings("strict").max_repeats, Some(2));
    let error = b.replica.call(call).await.unwrap_err();
    assert_eq!(
        error.code(),
        ErrorCode::LoopDetected,
        "the 2nd identical call on B"
    );
    assert_eq!(error.details().unwrap()["maxRepeats"], 2);

    // A replica that starts now reads them the same way; an unset reaches it too.
    let c = loop_checked_member(&server).await;
    let twice = search_in("strict", json!({"q": 2}));
    c.replica.call(twice.clone()).await.unwrap();
    let error = c.replica.call(twice).await.unwrap_err();
    assert_eq!(
        error.code(),
        ErrorCode::LoopDetected,
        "the 2nd identical call on C"
    );
    b.fleet
        .apply_loop_command("strict", "!/unset(tool-loop-max-repeats)")
        .await
        .unwrap();
    let thrice = search_in("strict", json!({"q": 3}));
    for n in 1..=3 {
        c.replica
            .call(thrice.clone())
            .await
            .unwrap_or_else(|e| panic!("identical call {n} of 4 allowed on C again: {e}"));
    }
    assert!(c
        .replica
        .stack
        .loop_sessions()
        .unwrap()
        .session_settings("strict")
        .is_empty());
    let error = c.replica.call(thrice).await.unwrap_err();
    assert_eq!(
        error.details().unwrap()["maxRepeats"],
        4,
        "the default again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_switched_off_on_one_replica_runs_untracked_on_the_others() {
    let server = RedisServer::start();
    let a = loop_checked_member(&server).await;
    let b = loop_checked_member(&server).await;
    let looping = search_in("quiet", json!({"q": "same"}));
    for _ in 0..3 {
        b.replica.call(looping.clone()).await.unwrap();
    }
    a.fleet
        .apply_loop_command("quiet", "!/set(tool-loop-detection=off)")
        .await
        .unwrap();
    let session: String = query(&server, redis::cmd("GET").arg("toolcall:loop:{quiet}")).await;
    assert_eq!(
        session,
        stored_session(3, "{\"enabled\":false}"),
        "the history dropped"
    );
    for _ in 0..6 {
        b.replica.call(looping.clone()).await.expect("untracked");
    }
    assert_eq!(b.replica.tool.get(), 9, "every call ran");
    let session: String = query(&server, redis::cmd("GET").arg("toolcall:loop:{quiet}")).await;
    assert_eq!(
        session,
        stored_session(3, "{\"enabled\":false}"),
        "nothing appended"
    );

    // Without a shared loop store, the fleet has nowhere to keep a session's settings.
    let plain = member(&server).await;
    let error = plain
        .fleet
        .apply_loop_command("quiet", "!/set(tool-loop-max-repeats=2)")
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::NotFound);
    assert!(error.message().contains("RedisLoopStore"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handles_session_reset_is_done_in_the_store_when_awaited() {
    let mut server = RedisServer::start();
    let a = loop_checked_replica(&server, FailurePolicy::Closed);
    let b = loop_checked_replica(&server, FailurePolicy::Closed);
    let loops = a.stack.loop_sessions().unwrap();
    let mut three = LoopDetectSettings::default();
    three.max_repeats = Some(3);
    loops.set("sess-r", three).unwrap();
    let looping = search_in("sess-r", json!({"q": "same"}));
    // The settings are written in the background: the first call may not see them yet.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let session: Option<String> =
            query(&server, redis::cmd("GET").arg("toolcall:loop:{sess-r}")).await;
        if session.is_some_and(|s| s.contains("max_repeats")) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the settings never reached the store"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for _ in 0..2 {
        b.call(looping.clone()).await.unwrap();
    }
    let error = b.call(looping.clone()).await.unwrap_err();
    assert_eq!(error.details().unwrap()["maxRepeats"], 3);

    loops
        .reset_session("sess-r")
        .await
        .expect("the store answers");
    let session: String = query(&server, redis::cmd("GET").arg("toolcall:loop:{sess-r}")).await;
    assert_eq!(
        session,
        stored_session(3, "{\"max_repeats\":3}"),
        "no calls, the settings kept"
    );
    b.call(looping.clone()).await.expect("B counts afresh");

    loops
        .forget_session("sess-r")
        .await
        .expect("the store answers");
    let exists: i64 = query(&server, redis::cmd("EXISTS").arg("toolcall:loop:{sess-r}")).await;
    assert_eq!(exists, 0, "history and settings forgotten");

    server.kill();
    let error = loops.reset_session("sess-r").await.unwrap_err();
    assert!(
        matches!(error, StoreError::Unavailable(_) | StoreError::Timeout(_)),
        "{error:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_redis_holds_no_call_longer_than_the_operation_timeout() {
    let server = RedisServer::start();
    let limited = rate_limited_replica(&server, 1_000, 1_000, FailurePolicy::Open);
    let looped = loop_checked_replica(&server, FailurePolicy::Open);
    limited.call(fresh("search")).await.unwrap();
    looped.call(fresh("search")).await.unwrap();
    server.freeze();
    // The first check gives up after its timeout; the outage is then known to every store
    // on that server, and the other store's check fails at once.
    for (replica, least, most) in [
        (
            &limited,
            Duration::from_millis(500),
            Duration::from_millis(1_500),
        ),
        (&looped, Duration::ZERO, Duration::from_millis(50)),
    ] {
        let started = Instant::now();
        replica
            .call(fresh("search"))
            .await
            .expect("fail open: the call proceeds");
        let took = started.elapsed();
        assert!(
            took >= least && took < most,
            "the check took {took:?}, not within {least:?}..{most:?}"
        );
        assert_eq!(replica.tool.get(), 2);
    }
    server.resume();
    let health = limited.stack.rate_limits().unwrap().store_health();
    assert_eq!((health.outages, health.failed_checks), (1, 1));
    let health = looped.stack.loop_sessions().unwrap().store_health();
    assert_eq!((health.outages, health.failed_checks), (1, 1));
}

/// The shared stores' outages and failed checks, counted in metrics by the stacks'
/// [`ToolMetrics`](tower_toolcall::trace::ToolMetrics), per store and failure policy.
#[test]
fn outages_and_failed_checks_are_counted_in_metrics_per_store_and_policy() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    use tower_toolcall::trace::ToolMetrics;

    let recorder = DebuggingRecorder::new();
    let health = metrics::with_local_recorder(&recorder, || {
        // Real time: Redis is real, and its operation timeouts must not fire by themselves.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let mut server = RedisServer::start();
            let registry = ToolRegistry::open();
            let metrics = ToolMetrics::new(&registry);
            metrics.describe();
            let limited = Replica::over(
                ToolStack::builder(registry.clone())
                    .on_event(metrics.clone())
                    .rate_limit(|l| {
                        l.settings(RateLimitSettings::default().with_per_second(1_000))
                            .on_store_failure(FailurePolicy::Open)
                    })
                    .rate_limit_store(Arc::new(rate_store(&server)))
                    .without(StackLayer::Idempotency)
                    .build()
                    .unwrap(),
            );
            let looped = Replica::over(
                ToolStack::builder(registry)
                    .on_event(metrics)
                    .loop_detect(|l| l.on_store_failure(FailurePolicy::Closed))
                    .loop_store(Arc::new(RedisLoopStore::open(server.url()).unwrap()))
                    .without(StackLayer::Idempotency)
                    .build()
                    .unwrap(),
            );
            limited.call(fresh("search")).await.unwrap();
            looped.call(fresh("search")).await.unwrap();

            server.kill();
            for _ in 0..3 {
                limited.call(fresh("search")).await.expect("fail open");
            }
            for _ in 0..2 {
                let error = looped.call(fresh("search")).await.unwrap_err();
                assert_eq!(error.code(), ErrorCode::StoreUnavailable, "fail closed");
            }
            let first = [
                ("outages_total{store=loop_detect}", 1.0),
                ("outages_total{store=rate_limit}", 1.0),
                ("failed_checks_total{policy=closed,store=loop_detect}", 2.0),
                ("failed_checks_total{policy=open,store=rate_limit}", 3.0),
            ];
            assert_eq!(store_series(&recorder), series_of(&first));

            // Sharing resumes, then a second outage is a second one.
            server.restart();
            let rate_limits = limited.stack.rate_limits().unwrap();
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                limited.call(fresh("search")).await.unwrap();
                if rate_limits.store_health().available {
                    break;
                }
                assert!(Instant::now() < deadline, "Redis never answered again");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            server.kill();
            limited.call(fresh("search")).await.expect("fail open");
            rate_limits.store_health()
        })
    });
    // The recorder's snapshots hand over what was counted since the last one.
    let since = store_series(&recorder);
    assert_eq!(
        since["toolcall_shared_store_outages_total{store=rate_limit}"], 1.0,
        "a second outage: {health:?}"
    );
    assert_eq!(
        since["toolcall_shared_store_failed_checks_total{policy=open,store=rate_limit}"] + 3.0,
        health.failed_checks as f64,
        "the counter agrees with store_health()"
    );
    assert_eq!(health.outages, 2);

    let described: Vec<String> = recorder
        .snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, unit, description, _)| {
            key.key().name().starts_with("toolcall_shared_store_")
                && *unit == Some(metrics::Unit::Count)
                && description.as_ref().is_some_and(|d| !d.is_empty())
        })
        .map(|(key, ..)| key.key().name().to_owned())
        .collect();
    assert_eq!(
        described.len(),
        4,
        "every store series has a unit and help: {described:?}"
    );

    /// The shared-store counters, by `name{label=value,…}`.
    fn store_series(recorder: &DebuggingRecorder) -> std::collections::BTreeMap<String, f64> {
        support::metrics_series::series(recorder)
            .into_iter()
            .filter(|(_, name, _)| name.starts_with("toolcall_shared_store_"))
            .map(|(_, name, value)| match value {
                DebugValue::Counter(n) => (name, n as f64),
                other => panic!("{name} is a counter, not {other:?}"),
            })
            .collect()
    }

    fn series_of(expected: &[(&str, f64)]) -> std::collections::BTreeMap<String, f64> {
        expected
            .iter()
            .map(|(name, n)| (format!("toolcall_shared_store_{name}"), *n))
            .collect()
    }
}

// Concurrent checks of one key go together in one script, each judged as if alone.

/// Sends `calls` at once through `replica`, each on a task of its own; their answers, in
/// the order the calls were given.
async fn all_at_once(
    replica: &Replica,
    calls: impl IntoIterator<Item = ToolCall>,
) -> Vec<Result<ToolOutput, ToolError>> {
    let tasks: Vec<_> = calls
        .into_iter()
        .map(|call| {
            let mut service = replica.service.clone();
            tokio::spawn(async move { call_once(&mut service, call).await })
        })
        .collect();
    let mut answers = Vec::with_capacity(tasks.len());
    for task in tasks {
        answers.push(task.await.expect("the call's task ends"));
    }
    answers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_checks_of_one_quota_allow_exactly_its_burst() {
    let server = RedisServer::start();
    let replica = rate_limited_replica(&server, 1, 100, FailurePolicy::Closed);
    let answers = all_at_once(&replica, (0..2_000).map(|_| fresh("search"))).await;

    let allowed = answers.iter().filter(|answer| answer.is_ok()).count();
    assert_eq!(allowed, 100, "a burst of 100 at 1/s allows exactly 100");
    assert_eq!(replica.tool.get(), 100);
    for error in answers.iter().filter_map(|answer| answer.as_ref().err()) {
        assert_eq!(error.code(), ErrorCode::RateLimited, "{error}");
        let wait = error.retry_after().expect("a refusal says when to retry");
        assert!(
            wait > Duration::ZERO && wait <= Duration::from_secs(1),
            "{wait:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_check_is_one_evalsha_and_concurrent_ones_share_round_trips() {
    let server = RedisServer::start();
    let replica = rate_limited_replica(&server, 1_000_000, 1_000_000, FailurePolicy::Closed);
    // The first check loads the script.
    replica.call(fresh("search")).await.unwrap();
    let mut monitor = server.monitor();
    monitor.take_commands();

    replica.call(fresh("search")).await.unwrap();
    assert_eq!(monitor.take_commands(), ["EVALSHA"], "a lone check");

    let answers = all_at_once(&replica, (0..500).map(|_| fresh("search"))).await;
    assert!(answers.iter().all(Result::is_ok));
    assert_eq!(replica.tool.get(), 502);
    let commands = monitor.take_commands();
    assert!(commands.iter().all(|command| command == "EVALSHA"));
    assert!(
        !commands.is_empty() && commands.len() < 500,
        "500 concurrent checks of one quota took {} round trips",
        commands.len()
    );

    let looped = loop_checked_replica(&server, FailurePolicy::Closed);
    looped
        .call(search_in("mon", json!({"n": -1})))
        .await
        .unwrap();
    monitor.take_commands();
    looped
        .call(search_in("mon", json!({"n": 0})))
        .await
        .unwrap();
    assert_eq!(monitor.take_commands(), ["EVALSHA"], "a lone loop check");
    let calls = (1..=300).map(|n| search_in("mon", json!({ "n": n })));
    let answers = all_at_once(&looped, calls).await;
    assert!(answers.iter().all(Result::is_ok));
    let commands = monitor.take_commands();
    assert!(
        !commands.is_empty() && commands.len() < 300,
        "300 concurrent loop checks of one session took {} round trips",
        commands.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_loop_checks_of_one_session_refuse_as_many_as_one_by_one() {
    let server = RedisServer::start();
    let replica = loop_checked_replica(&server, FailurePolicy::Closed);
    // The same call: concurrent calls arrive in any order, and the verdicts do not depend
    // on it.
    let calls = |session: &str| -> Vec<ToolCall> {
        (0..24)
            .map(|_| search_in(session, json!({"q": "same"})))
            .collect()
    };
    let mut one_by_one = Vec::new();
    for call in calls("sequential") {
        one_by_one.push(replica.call(call).await);
    }
    let ran_alone = replica.tool.get();
    let at_once = all_at_once(&replica, calls("concurrent")).await;

    let refused = |answers: &[Result<ToolOutput, ToolError>]| {
        answers
            .iter()
            .filter(|answer| {
                answer
                    .as_ref()
                    .is_err_and(|error| error.code() == ErrorCode::LoopDetected)
            })
            .count()
    };
    assert!(refused(&one_by_one) > 0, "the calls loop");
    assert_eq!(refused(&at_once), refused(&one_by_one));
    assert_eq!(replica.tool.get() - ran_alone, ran_alone);
    let answered = |answers: &[Result<ToolOutput, ToolError>]| {
        answers.iter().filter(|answer| answer.is_ok()).count() + refused(answers)
    };
    assert_eq!(
        answered(&at_once),
        24,
        "every call ran or was refused as a loop"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_hangs_under_a_batch_gives_every_waiting_call_its_policy_outcome() {
    let server = RedisServer::start();
    let closed = rate_limited_replica(&server, 1_000, 1_000, FailurePolicy::Closed);
    let open = rate_limited_replica(&server, 1_000, 1_000, FailurePolicy::Open);
    closed.call(fresh("search")).await.unwrap();
    open.call(fresh("search")).await.unwrap();
    server.freeze();

    let started = Instant::now();
    let (refused, let_through) = tokio::join!(
        all_at_once(&closed, (0..50).map(|_| fresh("search"))),
        all_at_once(&open, (0..50).map(|_| fresh("search"))),
    );
    let waited = started.elapsed();
    server.resume();

    for error in refused.iter().map(|answer| answer.as_ref().unwrap_err()) {
        assert_eq!(error.code(), ErrorCode::StoreUnavailable, "{error}");
    }
    assert!(let_through.iter().all(Result::is_ok));
    assert_eq!((closed.tool.get(), open.tool.get()), (1, 51));
    // Each call waited for its own timeout (500 ms), not for the checks queued before it.
    assert!(waited < Duration::from_millis(1_500), "{waited:?}");
    for replica in [&closed, &open] {
        let health = replica.stack.rate_limits().unwrap().store_health();
        assert_eq!(health.failed_checks, 50);
    }
    // Sharing resumes for every caller, once the store's probe found the server back.
    until_checked(&closed).await;
    let answers = all_at_once(&closed, (0..50).map(|_| fresh("search"))).await;
    assert!(answers.iter().all(Result::is_ok));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_fails_fails_every_call_it_carried_by_its_policy() {
    let mut server = RedisServer::start();
    let closed = rate_limited_replica(&server, 1_000, 1_000, FailurePolicy::Closed);
    let looped = loop_checked_replica(&server, FailurePolicy::Open);
    closed.call(fresh("search")).await.unwrap();
    looped
        .call(search_in("down", json!({"n": 0})))
        .await
        .unwrap();
    server.kill();

    let refused = all_at_once(&closed, (0..100).map(|_| fresh("search"))).await;
    for error in refused.iter().map(|answer| answer.as_ref().unwrap_err()) {
        assert_eq!(error.code(), ErrorCode::StoreUnavailable, "{error}");
    }
    let calls = (1..=100).map(|n| search_in("down", json!({ "n": n })));
    let let_through = all_at_once(&looped, calls).await;
    assert!(let_through.iter().all(Result::is_ok));
    assert_eq!((closed.tool.get(), looped.tool.get()), (1, 101));
    let health = closed.stack.rate_limits().unwrap().store_health();
    assert_eq!((health.outages, health.failed_checks), (1, 100));

    server.restart();
    until_checked(&closed).await;
    let answers = all_at_once(&closed, (0..100).map(|_| fresh("search"))).await;
    assert!(answers.iter().all(Result::is_ok), "sharing resumes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_that_give_up_take_no_answer_from_the_others() {
    let server = RedisServer::start();
    let replica = rate_limited_replica(&server, 1, 100, FailurePolicy::Closed);
    let tasks: Vec<_> = (0..200)
        .map(|_| {
            let mut service = replica.service.clone();
            let call = fresh("search");
            tokio::spawn(async move { call_once(&mut service, call).await })
        })
        .collect();
    let mut kept = Vec::new();
    for (n, task) in tasks.into_iter().enumerate() {
        if n % 2 == 0 {
            task.abort();
        } else {
            kept.push(task);
        }
    }
    let mut answered = 0;
    for task in kept {
        let answer = tokio::time::timeout(Duration::from_secs(2), task)
            .await
            .expect("every kept caller hears back in time")
            .expect("a kept call is not aborted");
        match answer {
            Ok(_) => answered += 1,
            Err(error) => assert_eq!(error.code(), ErrorCode::RateLimited, "{error}"),
        }
    }
    // No more than the burst ran, and every call that ran was answered to its caller.
    assert!(answered > 0, "{answered}");
    assert!(answered <= replica.tool.get() && replica.tool.get() <= 100);
}
