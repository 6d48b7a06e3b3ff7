//! Memory of the in-memory dedupe store under a million distinct calls with derived keys,
//! then a minute of idle time: with the re-send window (30 s) their records expire, where a
//! derived key used to keep its result for the done TTL (24 h).
//!
//! `cargo bench -p tower-toolcall --bench dedupe_memory` prints the process's resident memory and the store's
//! records before, at the peak and after, for the window and, for comparison, for derived
//! keys kept 24 h. The store is given room for every record, so that its capacity does not
//! hide the difference. Time is tokio's paused clock: the minute passes at once.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tower::{Layer, ServiceExt};
use tower_toolcall::idempotency::{DedupeStore, IdempotencyLayer, InMemoryDedupeStore};
use tower_toolcall::registry::{
    IdempotencySettings, RiskLevel, ToolDescriptor, ToolPolicy, ToolRegistry,
};
use tower_toolcall::{tool_fn, ToolCall, ToolOutput};

const CALLS: usize = 1_000_000;

/// Resident memory of this process, in MiB (Linux).
fn rss_mib() -> f64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: f64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0.0);
    pages * 4096.0 / (1024.0 * 1024.0)
}

async fn run(label: &str, resend_window: Duration) {
    let registry = ToolRegistry::builder()
        .tool(
            ToolDescriptor::new("mail", "send", RiskLevel::Writes).with_policy(
                ToolPolicy::default().with_idempotency(
                    IdempotencySettings::default()
                        .with_resend_window_ms(resend_window.as_millis() as u64),
                ),
            ),
        )
        .build()
        .unwrap();
    let store = InMemoryDedupeStore::builder()
        .capacity(CALLS + 1)
        .max_bytes(usize::MAX / 2)
        .sweep_interval(Duration::from_secs(10))
        .build()
        .unwrap();
    let layer = IdempotencyLayer::new(registry, Arc::new(store.clone()));
    let svc = layer.layer(tool_fn(|_call: ToolCall| async {
        Ok(ToolOutput::new(json!({"sent": true})))
    }));
    let before = rss_mib();
    for n in 0..CALLS {
        let call = ToolCall::builder("mail", "send")
            .session("s")
            .actor("u")
            .params(json!({"to": "a@example.com", "n": n}))
            .build()
            .unwrap();
        svc.clone().oneshot(call).await.unwrap();
    }
    let peak = rss_mib();
    let held = store.stats();
    tokio::time::sleep(Duration::from_secs(60)).await;
    store.sweep_expired().await.unwrap();
    let after = rss_mib();
    let left = store.stats();
    println!(
        "{label}: RSS before {before:.0} MiB, peak {peak:.0} MiB ({} records, {:.0} MiB by \
         the store's count), after 60 s idle {after:.0} MiB ({} records, {:.0} MiB)",
        held.records,
        held.bytes as f64 / 1_048_576.0,
        left.records,
        left.bytes as f64 / 1_048_576.0,
    );
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let which = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    match which.as_deref() {
        Some("24h") => runtime.block_on(run("derived keys kept 24 h", Duration::from_secs(86_400))),
        _ => runtime.block_on(run("derived keys, 30 s window", Duration::from_secs(30))),
    }
}
