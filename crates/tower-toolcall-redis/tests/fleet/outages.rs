//! The fleet and the shared stores across a Redis restart, a frozen Redis, a Redis that lost
//! its data, and what other programs leave in the fleet's keys.

use super::*;
use std::sync::Arc;
use support::capture::capture;
use tower_toolcall_redis::RedisDedupeStore;

const CHANNEL: &str = "toolcall:fleet:{fleet}:actions";
const SWITCHES: &str = "toolcall:fleet:{fleet}:switches";
const FORCED: &str = "toolcall:fleet:{fleet}:forced";

/// How many replicas are subscribed to the fleet's channel.
async fn subscribers(server: &RedisServer) -> i64 {
    let reply: (String, i64) = query(server, redis::cmd("PUBSUB").arg("NUMSUB").arg(CHANNEL)).await;
    reply.1
}

/// Waits until `done` holds, at most until `deadline`.
async fn by(deadline: Instant, what: &str, done: impl Fn() -> bool) {
    while !done() {
        assert!(Instant::now() < deadline, "{what} did not happen in time");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restart_under_a_live_fleet_loses_no_control() {
    let mut server = RedisServer::start();
    let members = [
        member(&server).await,
        member(&server).await,
        member(&server).await,
    ];
    assert_eq!(subscribers(&server).await, 3);
    let key = BreakerKey::tool(WEB, "search");

    for outage in 0..2 {
        // An outage of 300 ms, with nothing sent meanwhile.
        server.kill();
        tokio::time::sleep(Duration::from_millis(300)).await;
        server.restart();
        let restarted = Instant::now();
        let within_a_second = restarted + Duration::from_secs(1);

        // The first action after the restart is taken, and reaches every replica.
        let enabled = outage == 1;
        members[0]
            .fleet
            .set_enabled(enabled)
            .await
            .expect("the first action after a restart");
        members[1]
            .fleet
            .force_open(&key)
            .await
            .expect("a second action");
        for member in &members {
            let control = member.replica.stack.control().clone();
            by(within_a_second, "the actions on every replica", || {
                control.is_enabled() == enabled && breaker_state(member) == BreakerState::ForcedOpen
            })
            .await;
        }
        while subscribers(&server).await < 3 {
            assert!(
                Instant::now() < within_a_second,
                "not every replica resubscribed"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        members[2].fleet.reset_breaker(&key).await.unwrap();
        for member in &members {
            by(within_a_second, "the reset on every replica", || {
                breaker_state(member) == BreakerState::Closed
            })
            .await;
        }
    }
    for member in &members {
        assert!(
            member.fleet.stats().syncs >= 3,
            "{:?}",
            member.fleet.stats()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_action_missed_while_cut_off_is_caught_up_on_resubscription() {
    let server = RedisServer::start();
    let a = member(&server).await;
    let b = member(&server).await;
    // B's subscription is cut: the server closes its connection (as a restart would), and
    // A's action is published while B is not subscribed.
    let _: () = query(
        &server,
        redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("pubsub")
            .arg("SKIPME")
            .arg("yes"),
    )
    .await;
    a.fleet
        .set_shadow(ShadowLayer::LoopDetect, true)
        .await
        .unwrap();
    let control = b.replica.stack.control().clone();
    eventually("the missed action on B", || {
        control.is_shadow(ShadowLayer::LoopDetect)
    })
    .await;
    eventually("both subscribed again", || b.fleet.stats().syncs >= 2).await;
}

/// A stack whose loop and rate-limit stores (failing open) and, with `dedupe`, whose
/// idempotency store (failing closed) are all on `server`, each operation bounded by
/// `timeout`.
fn all_stores_on(
    server: &RedisServer,
    timeout: Duration,
    dedupe: bool,
) -> (BoxCloneService<ToolCall, ToolOutput, ToolError>, Counter) {
    let loops = RedisLoopStore::builder(server.url())
        .operation_timeout(timeout)
        .build()
        .unwrap();
    let quotas = RedisRateLimitStore::builder(server.url())
        .operation_timeout(timeout)
        .build()
        .unwrap();
    let builder = ToolStack::builder(ToolRegistry::open())
        .rate_limit(|limits| {
            limits.settings(
                RateLimitSettings::default()
                    .with_per_second(1_000)
                    .with_burst(1_000),
            )
        })
        .rate_limit_store(Arc::new(quotas))
        .loop_store(Arc::new(loops));
    let tool = Counter::default();
    let service = if dedupe {
        let store = RedisDedupeStore::builder(server.url())
            .operation_timeout(timeout)
            .build()
            .unwrap();
        let stack = builder.store(Arc::new(store)).build().unwrap();
        BoxCloneService::new(stacked(&stack, tool.tool()))
    } else {
        let stack = builder.build().unwrap();
        BoxCloneService::new(stacked(&stack, tool.tool()))
    };
    (service, tool)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_redis_costs_a_call_one_timeout_and_later_calls_fail_fast_by_policy() {
    let server = RedisServer::start();
    let timeout = Duration::from_millis(300);
    let (mut open, open_tool) = all_stores_on(&server, timeout, false);
    let (mut closed, closed_tool) = all_stores_on(&server, timeout, true);
    call_once(&mut open, fresh("search")).await.unwrap();
    call_once(&mut closed, fresh("search")).await.unwrap();
    server.freeze();

    // The first call waits for one store's timeout, not one per store.
    let started = Instant::now();
    call_once(&mut open, fresh("search"))
        .await
        .expect("quotas and loops fail open");
    let took = started.elapsed();
    assert!(took < timeout + Duration::from_millis(150), "{took:?}");
    // Later calls skip the known outage: the loop and quota stores let the call through,
    // the idempotency store refuses it; each at once.
    for _ in 0..5 {
        let started = Instant::now();
        call_once(&mut open, fresh("search")).await.unwrap();
        let error = call_once(&mut closed, fresh("search")).await.unwrap_err();
        assert_eq!(error.code(), ErrorCode::StoreUnavailable, "{error}");
        let took = started.elapsed();
        assert!(took < Duration::from_millis(50), "{took:?}");
    }
    assert_eq!((open_tool.get(), closed_tool.get()), (7, 1));

    server.resume();
    // The stores come back once a probe is answered: the idempotency store runs calls again.
    let deadline = Instant::now() + Duration::from_secs(2);
    while call_once(&mut closed, fresh("search")).await.is_err() {
        assert!(Instant::now() < deadline, "the stores did not come back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(closed_tool.get(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_check_after_a_restart_is_shared_not_failed() {
    let mut server = RedisServer::start();
    let replica = rate_limited_replica(&server, 1_000, 1_000, FailurePolicy::Closed);
    replica.call(fresh("search")).await.unwrap();
    server.restart();
    replica
        .call(fresh("search"))
        .await
        .expect("sent again on a new connection");
    let health = replica.stack.rate_limits().unwrap().store_health();
    assert_eq!((health.outages, health.failed_checks), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switches_that_are_neither_0_nor_1_are_skipped_and_the_layer_keeps_its_state() {
    let server = RedisServer::start();
    let _: () = query(
        &server,
        redis::cmd("HSET")
            .arg(SWITCHES)
            .arg("enabled")
            .arg("true")
            .arg("shadow:rate_limit")
            .arg("junk")
            .arg("shadow:loop_detect")
            .arg("1"),
    )
    .await;
    let joining = member(&server).await;
    let control = joining.replica.stack.control();
    assert!(control.is_enabled(), "`true` is not a switch value");
    assert!(!control.is_shadow(ShadowLayer::RateLimit), "nor is `junk`");
    assert!(control.is_shadow(ShadowLayer::LoopDetect), "`1` is");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_action_another_program_published_is_recorded_for_late_joiners() {
    let server = RedisServer::start();
    let a = member(&server).await;
    let _: i64 = query(
        &server,
        redis::cmd("PUBLISH")
            .arg(CHANNEL)
            .arg(r#"{"action":"set_enabled","enabled":false}"#),
    )
    .await;
    let control = a.replica.stack.control().clone();
    eventually("the action on A", || !control.is_enabled()).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let stored: Option<String> =
            query(&server, redis::cmd("HGET").arg(SWITCHES).arg("enabled")).await;
        if stored.as_deref() == Some("0") {
            break;
        }
        assert!(Instant::now() < deadline, "not recorded: {stored:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let late = member(&server).await;
    assert!(
        !late.replica.stack.control().is_enabled(),
        "the late joiner agrees"
    );
}

#[tokio::test]
async fn a_huge_junk_message_is_logged_by_a_bounded_prefix() {
    let (logs, _guard) = capture();
    let server = RedisServer::start();
    let a = member(&server).await;
    let junk = "x".repeat(1 << 20);
    let _: i64 = query(&server, redis::cmd("PUBLISH").arg(CHANNEL).arg(&junk)).await;
    eventually("the refusal", || a.fleet.stats().refused == 1).await;
    let refusal = logs
        .events()
        .into_iter()
        .find(|event| {
            event
                .fields
                .get("message")
                .is_some_and(|message| message.contains("was refused"))
        })
        .expect("the refusal is logged");
    let logged: usize = refusal.fields.values().map(String::len).sum();
    assert!(logged < 2_000, "{logged} bytes logged");
    assert_eq!(
        refusal.fields.get("bytes").map(String::as_str),
        Some("1048576")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_redis_lost_its_data_every_switch_survives_alike() {
    let mut server = RedisServer::start();
    let a = member(&server).await;
    let b = member(&server).await;
    let key = BreakerKey::tool(WEB, "search");
    a.fleet.set_enabled(false).await.unwrap();
    a.fleet
        .set_shadow(ShadowLayer::RateLimit, true)
        .await
        .unwrap();
    a.fleet.force_open(&key).await.unwrap();
    let control = b.replica.stack.control().clone();
    eventually("the switches on B", || {
        !control.is_enabled() && breaker_state(&b) == BreakerState::ForcedOpen
    })
    .await;

    // The server restarts without its data: the first replica to resync writes back what
    // it holds, kill switch and forced breakers alike.
    let syncs = (a.fleet.stats().syncs, b.fleet.stats().syncs);
    server.restart();
    eventually("both resynced", || {
        a.fleet.stats().syncs > syncs.0 && b.fleet.stats().syncs > syncs.1
    })
    .await;
    for member in [&a, &b] {
        let control = member.replica.stack.control();
        assert!(!control.is_enabled(), "the kill switch survived");
        assert!(
            control.is_shadow(ShadowLayer::RateLimit),
            "the shadow survived"
        );
        assert_eq!(
            breaker_state(member),
            BreakerState::ForcedOpen,
            "the force-open survived"
        );
    }
    let enabled: Option<String> =
        query(&server, redis::cmd("HGET").arg(SWITCHES).arg("enabled")).await;
    assert_eq!(enabled.as_deref(), Some("0"));
    let forced: bool = query(
        &server,
        redis::cmd("SISMEMBER").arg(FORCED).arg(key.short()),
    )
    .await;
    assert!(forced);
    let late = member(&server).await;
    assert!(!late.replica.stack.control().is_enabled());
    assert_eq!(breaker_state(&late), BreakerState::ForcedOpen);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_loop_session_is_reset_and_no_other_is_affected() {
    let server = RedisServer::start();
    let replica = loop_checked_replica(&server, FailurePolicy::Closed);
    let healthy = search_in("healthy", json!({"q": 1}));
    replica.call(healthy.clone()).await.unwrap();
    // Damaged sessions: a string that is no session, a header whose calls are cut short,
    // settings that are no JSON object, and a key of another type.
    let header = format!("{:012x}{}", 3, " ".repeat(28));
    for (session, damage) in [
        ("junk", "junk".to_owned()),
        ("cut", format!("{header}0000{}", "0".repeat(30))),
        ("settings", format!("{header}0003[1]")),
    ] {
        let key = format!("toolcall:loop:{{{session}}}");
        let _: () = query(&server, redis::cmd("SET").arg(&key).arg(damage)).await;
    }
    let _: () = query(
        &server,
        redis::cmd("HSET")
            .arg("toolcall:loop:{hash}")
            .arg("a")
            .arg("b"),
    )
    .await;
    for session in ["junk", "cut", "settings", "hash"] {
        // The session starts afresh: its 4th identical call is a loop, as in a new session.
        let calls: Vec<ToolCall> = (0..6)
            .map(|_| search_in(session, json!({"q": 1})))
            .collect();
        assert_eq!(
            refused_at(std::slice::from_ref(&replica), &calls).await,
            4,
            "{session}"
        );
    }
    let health = replica.stack.loop_sessions().unwrap().store_health();
    assert!(health.available);
    assert_eq!((health.outages, health.failed_checks), (0, 0));
    // The healthy session kept its history: three more identical calls make the loop.
    for _ in 0..2 {
        replica.call(healthy.clone()).await.unwrap();
    }
    let error = replica.call(healthy).await.unwrap_err();
    assert_eq!(error.code(), ErrorCode::LoopDetected);
}
