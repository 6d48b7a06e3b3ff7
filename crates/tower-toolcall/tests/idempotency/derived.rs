//! Derived keys absorb re-sends, not repeats: a read runs again once it has finished, a
//! write re-sent within the window is answered from its record, a caller's key holds for
//! its whole TTL.

use super::*;

store_suite!(
    derived_key_runs_a_finished_read_again_and_joins_a_running_one,
    derived_key_reuses_a_write_only_within_the_resend_window,
    resend_window_zero_only_joins_running_calls,
    read_cache_ttl_serves_reads_from_the_record_within_it,
    caller_key_holds_for_hours,
);

const READ: &str = "readFile";

fn tools(read: IdempotencySettings, write: IdempotencySettings) -> ToolRegistry {
    ToolRegistry::builder()
        .tool(ToolDescriptor::new(NS, READ, RiskLevel::ReadOnly).with_policy(policy(read)))
        .tool(ToolDescriptor::new(NS, TOOL, RiskLevel::Writes).with_policy(policy(write)))
        .build()
        .unwrap()
}

fn read_call() -> ToolCall {
    ToolCall::builder(NS, READ)
        .session("sess-42")
        .actor("user-7")
        .params(json!({"path": "XYZ/Foo.md"}))
        .build()
        .unwrap()
}

fn write_call() -> ToolCall {
    call("sess-42", json!({"path": "XYZ/Foo.md", "content": "hello"}))
        .build()
        .unwrap()
}

async fn derived_key_runs_a_finished_read_again_and_joins_a_running_one<B: Backend>(b: B) {
    let tool = MockTool::echo(b.time(Duration::from_millis(200)));
    let layer = IdempotencyLayer::new(
        tools(Default::default(), Default::default()),
        Arc::new(b.store()),
    );
    let svc = over(&layer, &tool);

    // Two identical reads at once: one run, the second joins it.
    let (first, joined) = tokio::join!(run(&svc, read_call()), run(&svc, read_call()));
    let (first, joined) = (first.unwrap(), joined.unwrap());
    assert_eq!(tool.runs(), 1);
    assert_eq!(joined.content, first.content);
    assert!(first.record().from_cache ^ joined.record().from_cache);

    // Asked again once it has finished, the read runs again and is not marked cached.
    let again = run(&svc, read_call()).await.unwrap();
    assert_eq!(tool.runs(), 2);
    assert!(!again.record().from_cache);
    assert_eq!(again.content["run"], 2);
}

async fn derived_key_reuses_a_write_only_within_the_resend_window<B: Backend>(b: B) {
    let window = b.time(Duration::from_secs(30));
    let write = IdempotencySettings::default().with_resend_window_ms(window.as_millis() as u64);
    let tool = MockTool::echo(Duration::ZERO);
    let layer = IdempotencyLayer::new(tools(Default::default(), write), Arc::new(b.store()));
    let svc = over(&layer, &tool);

    let first = run(&svc, write_call()).await.unwrap();
    // Re-sent a sixth of the window later (5 s of 30 s): answered from the record.
    b.elapse(window / 6).await;
    let resent = run(&svc, write_call()).await.unwrap();
    assert_eq!(tool.runs(), 1);
    assert_eq!(resent.content, first.content);
    assert!(resent.record().from_cache);
    let cache = resent.record().cache.clone().unwrap();
    assert_eq!(cache.matched_on, MatchedOn::Completed);
    if b.exact_time() {
        assert_eq!(cache.age_ms, 5_000);
    }

    // Past the window (an hour later, with paused time), the same write runs again.
    b.elapse(b.time(Duration::from_secs(60 * 60))).await;
    let later = run(&svc, write_call()).await.unwrap();
    assert_eq!(tool.runs(), 2);
    assert!(!later.record().from_cache);
}

async fn resend_window_zero_only_joins_running_calls<B: Backend>(b: B) {
    let write = IdempotencySettings::default().with_resend_window_ms(0);
    let tool = MockTool::echo(b.time(Duration::from_millis(200)));
    let layer = IdempotencyLayer::new(tools(Default::default(), write), Arc::new(b.store()));
    let svc = over(&layer, &tool);

    let (first, joined) = tokio::join!(run(&svc, write_call()), run(&svc, write_call()));
    assert_eq!(first.unwrap().content, joined.unwrap().content);
    assert_eq!(tool.runs(), 1);
    let again = run(&svc, write_call()).await.unwrap();
    assert_eq!(tool.runs(), 2);
    assert!(!again.record().from_cache);
}

async fn read_cache_ttl_serves_reads_from_the_record_within_it<B: Backend>(b: B) {
    let ttl = b.time(Duration::from_secs(60));
    let read = IdempotencySettings::default().with_read_cache_ttl_ms(ttl.as_millis() as u64);
    let tool = MockTool::echo(Duration::ZERO);
    let layer = IdempotencyLayer::new(tools(read, Default::default()), Arc::new(b.store()));
    let svc = over(&layer, &tool);

    run(&svc, read_call()).await.unwrap();
    b.elapse(ttl / 4).await;
    let cached = run(&svc, read_call()).await.unwrap();
    assert_eq!(tool.runs(), 1);
    assert!(cached.record().from_cache);
    b.elapse(ttl).await;
    let fresh = run(&svc, read_call()).await.unwrap();
    assert_eq!(tool.runs(), 2);
    assert!(!fresh.record().from_cache);
}

async fn caller_key_holds_for_hours<B: Backend>(b: B) {
    let tool = MockTool::echo(Duration::ZERO);
    let layer = IdempotencyLayer::new(
        tools(Default::default(), Default::default()),
        Arc::new(b.store()),
    );
    let svc = over(&layer, &tool);
    let keyed = || {
        call("sess-42", json!({"path": "XYZ/Foo.md"}))
            .idempotency_key("create-foo-1")
            .build()
            .unwrap()
    };
    let read_keyed = || {
        let mut call = read_call();
        call.set_hook_idempotency_key("read-foo-1");
        call
    };

    run(&svc, keyed()).await.unwrap();
    run(&svc, read_keyed()).await.unwrap();
    // Hours later (the Redis backend waits less: it keeps no paused clock).
    let hours = if b.exact_time() {
        Duration::from_secs(5 * 60 * 60)
    } else {
        Duration::from_millis(400)
    };
    b.elapse(hours).await;
    let again = run(&svc, keyed()).await.unwrap();
    let read_again = run(&svc, read_keyed()).await.unwrap();
    assert_eq!(tool.runs(), 2);
    assert!(again.record().from_cache && read_again.record().from_cache);
}
