//! Metrics (TR-13): a scripted run produces exact counters, labels and breaker transitions,
//! and any number of unregistered tool names leaves the label set bounded.

use std::collections::BTreeMap;
use std::time::Duration;

#[path = "../support/mod.rs"]
mod support;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::MetricKind;
use serde_json::json;
use tokio_test::{assert_pending, task};
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_toolcall::registry::{BulkheadSettings, ToolRegistry};
use tower_toolcall::trace::{ToolMetrics, TraceLayer};
use tower_toolcall::{tool_fn, ToolCall, ToolError, ToolOutput, ToolStack};

/// Counter and gauge values by `name{label=value,…}`.
fn snapshot(recorder: &DebuggingRecorder) -> BTreeMap<String, f64> {
    support::metrics_series::series(recorder)
        .into_iter()
        .filter_map(|(kind, name, value)| match (kind, value) {
            (MetricKind::Counter, DebugValue::Counter(n)) => Some((name, n as f64)),
            (MetricKind::Gauge, DebugValue::Gauge(g)) => Some((name, g.into_inner())),
            (MetricKind::Histogram, DebugValue::Histogram(h)) => {
                Some((format!("{name}#count"), h.len() as f64))
            }
            _ => None,
        })
        .collect()
}

fn registry() -> ToolRegistry {
    ToolRegistry::from_json_str(
        r#"{"tools": [
            {"namespace": "web", "name": "search", "risk": "read-only", "idempotent": true,
             "policy": {"idempotency": {"read_cache_ttl_ms": 60000}}},
            {"namespace": "vault", "name": "write", "risk": "writes",
             "policy": {"retry": "off", "idempotency": "off",
                        "breaker": {"consecutive_failures": 2}}}
        ]}"#,
    )
    .unwrap()
}

fn call(namespace: &str, name: &str, mode: &str, n: u32) -> ToolCall {
    ToolCall::builder(namespace, name)
        .session("sess-1")
        .actor("u")
        .params(json!({"mode": mode, "n": n}))
        .build()
        .unwrap()
}

#[test]
fn a_scripted_run_produces_exact_series() {
    let recorder = DebuggingRecorder::new();
    support::metrics_series::run_recorded(&recorder, async {
        let registry = registry();
        let metrics = ToolMetrics::new(&registry);
        let flaky_seen = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let tool = tool_fn(move |call: ToolCall| {
            let flaky_seen = flaky_seen.clone();
            async move {
                match call.params().as_map()["mode"].as_str().unwrap() {
                    "ok" => Ok(ToolOutput::new(json!("ok"))),
                    "flaky" if !flaky_seen.swap(true, std::sync::atomic::Ordering::SeqCst) => {
                        Err(ToolError::from_http_status(503, "busy"))
                    }
                    "flaky" => Ok(ToolOutput::new(json!("ok at last"))),
                    "bad" => Err(ToolError::from_http_status(400, "bad input")),
                    _ => Err(ToolError::from_http_status(503, "down")),
                }
            }
        });
        let stack = ToolStack::builder(registry.clone())
            .on_event(metrics)
            .retry(|retry| retry.seed(5))
            .build()
            .unwrap();
        let mut svc = support::stacked(&stack, tool);
        // a retried success and a terminal failure
        svc.ready_and_call(call("web", "search", "flaky", 2))
            .await
            .unwrap();
        svc.ready_and_call(call("web", "search", "bad", 3))
            .await
            .unwrap_err();
        // the same search four times in a row: run, two cache hits, then the loop breaks
        svc.ready_and_call(call("web", "search", "ok", 1))
            .await
            .unwrap();
        svc.ready_and_call(call("web", "search", "ok", 1))
            .await
            .unwrap();
        svc.ready_and_call(call("web", "search", "ok", 1))
            .await
            .unwrap();
        let loop_err = svc
            .ready_and_call(call("web", "search", "ok", 1))
            .await
            .unwrap_err();
        assert_eq!(loop_err.code().as_str(), "LOOP_DETECTED");
        // a failing write opens its breaker after two failures; the third call is refused
        for n in 0..3 {
            svc.ready_and_call(call("vault", "write", "down", n))
                .await
                .unwrap_err();
        }
    });

    let series = snapshot(&recorder);
    let expected = [
        ("toolcall_tool_calls_total{status=success,tool=web::search}", 4.0),
        ("toolcall_tool_calls_total{status=error,tool=web::search}", 2.0),
        ("toolcall_tool_calls_total{status=retriable_error,tool=vault::write}", 2.0),
        ("toolcall_tool_calls_total{status=circuit_open,tool=vault::write}", 1.0),
        ("toolcall_tool_call_duration_seconds{status=success,tool=web::search}#count", 4.0),
        ("toolcall_tool_retry_attempts_total{reason=UPSTREAM_UNAVAILABLE,tool=web::search}", 1.0),
        ("toolcall_tool_idempotency_hits_total{state=completed,tool=web::search}", 2.0),
        ("toolcall_tool_loop_detections_total{action=break,tool=web::search}", 1.0),
        (
            "toolcall_tool_circuit_breaker_transitions_total{from_state=closed,to_state=open,tool=vault::write}",
            1.0,
        ),
        ("toolcall_tool_circuit_breaker_state{state=open,tool=vault::write}", 1.0),
        ("toolcall_tool_circuit_breaker_state{state=closed,tool=vault::write}", 0.0),
    ];
    for (name, value) in expected {
        assert_eq!(series.get(name), Some(&value), "{name} in {series:#?}");
    }
    let calls: f64 = series
        .iter()
        .filter(|(k, _)| k.starts_with("toolcall_tool_calls_total{"))
        .map(|(_, v)| v)
        .sum();
    assert_eq!(calls, 9.0, "every call is counted once: {series:#?}");
}

#[test]
fn ten_thousand_unregistered_tool_names_leave_one_label() {
    let recorder = DebuggingRecorder::new();
    metrics::with_local_recorder(&recorder, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        runtime.block_on(async {
            let registry = ToolRegistry::open();
            let mut svc = ServiceBuilder::new()
                .layer(TraceLayer::new().on_event(ToolMetrics::new(&registry)))
                .service(tool_fn(|_call: ToolCall| async {
                    Ok(ToolOutput::new(json!(null)))
                }));
            for n in 0..10_000 {
                svc.ready_and_call(call("random", &format!("tool-{n}"), "ok", n))
                    .await
                    .unwrap();
            }
        });
    });
    let series = snapshot(&recorder);
    let calls: Vec<_> = series
        .iter()
        .filter(|(k, _)| k.starts_with("toolcall_tool_calls_total"))
        .collect();
    assert_eq!(
        calls,
        [(
            &"toolcall_tool_calls_total{status=success,tool=unregistered}".to_owned(),
            &10_000.0
        )]
    );
    assert!(series.keys().all(|k| !k.contains("tool-")));
}

#[test]
fn durations_are_in_seconds() {
    let recorder = DebuggingRecorder::new();
    support::metrics_series::run_recorded(&recorder, async {
        let registry = registry();
        let stack = ToolStack::builder(registry.clone())
            .on_event(ToolMetrics::new(&registry))
            .build()
            .unwrap();
        let slow = tool_fn(|_call: ToolCall| async {
            tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
            Ok(ToolOutput::new(json!("late")))
        });
        let mut svc = support::stacked(&stack, slow);
        svc.ready_and_call(call("web", "search", "ok", 1))
            .await
            .unwrap();
    });
    let durations: Vec<f64> = support::metrics_series::series(&recorder)
        .into_iter()
        .filter_map(|(_, name, value)| match value {
            DebugValue::Histogram(h)
                if name.starts_with("toolcall_tool_call_duration_seconds{") =>
            {
                Some(h.iter().map(|v| v.into_inner()).collect::<Vec<_>>())
            }
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(durations.len(), 1, "{durations:?}");
    assert!(
        (1.5..1.6).contains(&durations[0]),
        "a call of 1.5 s is recorded as 1.5, got {}",
        durations[0]
    );
    let buckets = tower_toolcall::trace::DURATION_BUCKETS;
    assert!(buckets.windows(2).all(|w| w[0] < w[1]));
    assert!(buckets[0] <= 0.005 && buckets[buckets.len() - 1] >= 10.0);
}

#[test]
fn hedges_are_counted_by_the_attempt_that_answered() {
    let recorder = DebuggingRecorder::new();
    support::metrics_series::run_recorded(&recorder, async {
        let registry = ToolRegistry::from_json_str(
            r#"{"tools": [{"namespace": "web", "name": "search", "risk": "read-only",
                "policy": {"retry": {"hedge_delay_ms": 100}}}]}"#,
        )
        .unwrap();
        let stack = ToolStack::builder(registry.clone())
            .on_event(ToolMetrics::new(&registry))
            .build()
            .unwrap();
        // The first attempt of each call takes 1 s, the hedge 20 ms.
        let tool = tool_fn(|call: ToolCall| async move {
            let took = if call.attempt() == 1 { 1_000 } else { 20 };
            tokio::time::sleep(std::time::Duration::from_millis(took)).await;
            Ok(ToolOutput::new(json!(took)))
        });
        let mut svc = support::stacked(&stack, tool);
        for n in 0..2 {
            svc.ready_and_call(call("web", "search", "ok", n))
                .await
                .unwrap();
        }
    });
    let series = snapshot(&recorder);
    assert_eq!(
        series.get("toolcall_tool_hedges_total{tool=web::search,won_by=hedge}"),
        Some(&2.0),
        "{series:#?}"
    );
}

#[test]
fn the_dedupe_store_size_and_ttls_are_gauges_with_the_key_scope() {
    let recorder = DebuggingRecorder::new();
    support::metrics_series::run_recorded(&recorder, async {
        let registry = ToolRegistry::from_json_str(
            r#"{"tools": [
                {"namespace": "web", "name": "search", "risk": "read-only", "idempotent": true,
                 "policy": {"idempotency": {"scope": "global"}}},
                {"namespace": "vault", "name": "write", "risk": "writes"},
                {"namespace": "vault", "name": "read", "risk": "read-only",
                 "policy": {"idempotency": "off"}}
            ]}"#,
        )
        .unwrap();
        let metrics = ToolMetrics::new(&registry);
        metrics.describe();
        let stack = ToolStack::builder(registry.clone())
            .on_event(metrics.clone())
            .idempotency(|i| {
                i.settings(
                    tower_toolcall::registry::IdempotencySettings::default()
                        .with_done_ttl_ms(3_600_000)
                        .with_failed_ttl_ms(60_000),
                )
            })
            .build()
            .unwrap();
        let mut svc = support::stacked(
            &stack,
            tool_fn(|_call: ToolCall| async { Ok(ToolOutput::new(json!("ok"))) }),
        );
        for n in 0..3 {
            svc.ready_and_call(call("web", "search", "ok", n))
                .await
                .unwrap();
        }
        metrics.record_dedupe_size(stack.dedupe_store().unwrap().size().await.unwrap());
    });
    let series = snapshot(&recorder);
    let expected = [
        ("toolcall_tool_dedupe_cache_size{}", 3.0),
        (
            "toolcall_tool_dedupe_ttl_seconds{scope=global,state=completed,tool=web::search}",
            3600.0,
        ),
        (
            "toolcall_tool_dedupe_ttl_seconds{scope=global,state=failed,tool=web::search}",
            60.0,
        ),
        (
            "toolcall_tool_dedupe_ttl_seconds{scope=session,state=completed,tool=vault::write}",
            3600.0,
        ),
    ];
    for (name, value) in expected {
        assert_eq!(series.get(name), Some(&value), "{name} in {series:#?}");
    }
    assert!(
        series
            .keys()
            .any(|k| k.starts_with("toolcall_tool_dedupe_ttl_seconds{")
                && k.contains("state=inflight,tool=web::search")),
        "{series:#?}"
    );
    assert!(
        !series.keys().any(|k| k.contains("tool=vault::read")),
        "a tool without idempotency has no TTL: {series:#?}"
    );
}

/// A tool's bulkhead full (one running, one waiting, one refused) and a namespace's (one
/// running, one refused): the gauges read before the scrape and the refusals, exactly.
#[test]
fn a_full_bulkhead_shows_its_calls_in_use_queued_and_refused() {
    let recorder = DebuggingRecorder::new();
    support::metrics_series::run_recorded(&recorder, async {
        let registry = ToolRegistry::from_json_str(
            r#"{"tools": [
                {"namespace": "web", "name": "fetch", "risk": "read-only",
                 "policy": {"bulkhead": {"max_concurrent": 1, "max_queued": 1}}},
                {"namespace": "vault", "name": "read", "risk": "read-only"},
                {"namespace": "vault", "name": "list", "risk": "read-only"}
            ]}"#,
        )
        .unwrap();
        let metrics = ToolMetrics::new(&registry);
        let stack = ToolStack::builder(registry.clone())
            .on_event(metrics.clone())
            .bulkhead(|b| {
                b.namespace(
                    "vault",
                    BulkheadSettings::default()
                        .with_max_concurrent(1)
                        .with_max_queued(0),
                )
            })
            .build()
            .unwrap();
        let mut svc = support::stacked(
            &stack,
            tool_fn(|_call: ToolCall| async {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Ok(ToolOutput::new(json!("late")))
            }),
        );
        let mut held = Vec::new();
        for (namespace, name, n) in [
            ("web", "fetch", 0),
            ("web", "fetch", 1),
            ("vault", "read", 2),
        ] {
            let future = svc
                .ready()
                .await
                .unwrap()
                .call(call(namespace, name, "ok", n));
            let mut pending = task::spawn(future);
            assert_pending!(pending.poll());
            held.push(pending);
        }
        let err = svc
            .ready_and_call(call("web", "fetch", "ok", 3))
            .await
            .unwrap_err();
        assert_eq!(err.code().as_str(), "RATE_LIMITED");
        let err = svc
            .ready_and_call(call("vault", "list", "ok", 4))
            .await
            .unwrap_err();
        assert_eq!(err.details().unwrap()["limit"], "namespace");
        metrics.record_bulkheads(stack.bulkheads().unwrap());
        drop(held);
    });
    let series = snapshot(&recorder);
    let bulkhead: BTreeMap<&str, f64> = series
        .iter()
        .filter(|(name, _)| name.contains("bulkhead") || name.contains("rate_limited"))
        .map(|(name, value)| (name.as_str(), *value))
        .collect();
    assert_eq!(
        bulkhead,
        BTreeMap::from([
            ("toolcall_tool_bulkhead_in_use{tool=web::fetch}", 1.0),
            ("toolcall_tool_bulkhead_queued{tool=web::fetch}", 1.0),
            ("toolcall_tool_bulkhead_refused_total{tool=web::fetch}", 1.0),
            ("toolcall_namespace_bulkhead_in_use{namespace=vault}", 1.0),
            ("toolcall_namespace_bulkhead_queued{namespace=vault}", 0.0),
            (
                "toolcall_namespace_bulkhead_refused_total{namespace=vault}",
                1.0
            ),
        ]),
        "no gauge for a tool without places of its own, no rate limit counted: {series:#?}"
    );
}

#[test]
fn a_bad_prefix_is_refused_naming_the_field() {
    let err = ToolMetrics::builder(&ToolRegistry::open())
        .prefix("1bad-prefix")
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "metrics.prefix");
}

/// `ready().await` then `call()`, as one future.
trait ReadyAndCall: Service<ToolCall, Response = ToolOutput, Error = ToolError> + Sized {
    fn ready_and_call(
        &mut self,
        call: ToolCall,
    ) -> impl std::future::Future<Output = Result<ToolOutput, ToolError>> {
        async move { self.ready().await?.call(call).await }
    }
}

impl<S: Service<ToolCall, Response = ToolOutput, Error = ToolError>> ReadyAndCall for S {}
