//! Streamed answers through the stack: the rules of each layer for a tool that sends its
//! answer in chunks, under paused time.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};
use tokio::time::Instant;
use tower::util::BoxCloneSyncService;
use tower::{Layer, Service, ServiceExt};
use tower_toolcall::envelope::{ChunkEnvelope, FinalChunk, StreamTally};
use tower_toolcall::idempotency::InMemoryDedupeStore;
use tower_toolcall::registry::{
    BreakerSettings, RetrySettings, RiskLevel, TimeoutSettings, ToolDescriptor, ToolPolicy,
    ToolRegistry,
};
use tower_toolcall::stream::{Chunk, StreamPart, Streamed, REPLAY_BYTES};
use tower_toolcall::trace::{AuditLog, AuditSink, AuditStream};
use tower_toolcall::{
    tool_fn, BoxToolFuture, ErrorCode, ShortCircuit, ToolCall, ToolError, ToolOutput, ToolResult,
    ToolStack,
};

const NS: &str = "agents.tools.docs";

/// What one attempt of the scripted tool does, step by step.
#[derive(Clone, Debug)]
enum Step {
    /// Sends a chunk of text.
    Chunk(&'static str),
    /// Waits.
    Sleep(u64),
    /// Fails as an upstream answering 503 would.
    Fail,
}

/// A tool whose attempts follow `scripts`, one per attempt (the last repeats), and that
/// answers with the text of its chunks; counts its executions and the ones that ended.
#[derive(Clone)]
struct Scripted {
    scripts: Arc<Vec<Vec<Step>>>,
    runs: Arc<AtomicUsize>,
    finished: Arc<AtomicUsize>,
}

impl Scripted {
    fn new(scripts: Vec<Vec<Step>>) -> Self {
        Scripted {
            scripts: Arc::new(scripts),
            runs: Arc::default(),
            finished: Arc::default(),
        }
    }

    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    fn finished(&self) -> usize {
        self.finished.load(Ordering::SeqCst)
    }

    fn service(
        &self,
    ) -> impl Service<ToolCall, Response = ToolOutput, Error = ToolError, Future = BoxToolFuture>
           + Clone
           + Send
           + Sync
           + 'static {
        let this = self.clone();
        tool_fn(move |call: ToolCall| {
            let n = this.runs.fetch_add(1, Ordering::SeqCst);
            let script = this.scripts[n.min(this.scripts.len() - 1)].clone();
            let finished = this.finished.clone();
            Box::pin(async move {
                let mut text = String::new();
                for step in script {
                    match step {
                        Step::Chunk(part) => {
                            call.chunks().send(json!(part));
                            text.push_str(part);
                        }
                        Step::Sleep(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
                        Step::Fail => {
                            return Err(ToolError::from_http_status(503, "the backend is down"))
                        }
                    }
                }
                finished.fetch_add(1, Ordering::SeqCst);
                Ok(ToolOutput::new(json!(text)))
            }) as BoxToolFuture
        })
    }
}

fn summarize(risk: RiskLevel, policy: ToolPolicy) -> ToolRegistry {
    ToolRegistry::builder()
        .tool(
            ToolDescriptor::new(NS, "summarize", risk)
                .with_streaming(true)
                .with_policy(policy),
        )
        .build()
        .unwrap()
}

/// `tool` behind the whole stack, `summarize` registered with `risk` and `policy`.
fn served(
    tool: &Scripted,
    risk: RiskLevel,
    policy: ToolPolicy,
) -> (
    ToolStack,
    BoxCloneSyncService<ToolCall, ToolOutput, ToolError>,
) {
    let stack = ToolStack::builder(summarize(risk, policy)).build().unwrap();
    let svc = BoxCloneSyncService::new(stack.layer(tool.service()));
    (stack, svc)
}

/// Sends `call` through `svc`, asking for chunks; the chunks and the answer.
async fn stream<S>(svc: S, mut call: ToolCall) -> (Vec<Chunk>, Result<S::Response, S::Error>)
where
    S: Service<ToolCall>,
{
    let chunks = call.stream_chunks();
    read(svc.oneshot(call), chunks).await
}

fn call(key: Option<&str>) -> ToolCall {
    let builder = ToolCall::builder(NS, "summarize")
        .session("sess-1")
        .actor("user-1")
        .params(json!({"doc": "tower"}));
    match key {
        Some(key) => builder.idempotency_key(key).build().unwrap(),
        None => builder.build().unwrap(),
    }
}

/// The texts of `chunks` and the call's answer, read to the end.
async fn read<F>(future: F, chunks: tower_toolcall::stream::ChunkStream) -> (Vec<Chunk>, F::Output)
where
    F: std::future::Future,
{
    let mut parts = std::pin::pin!(Streamed::new(future, chunks));
    let mut got = Vec::new();
    while let Some(part) = parts.next().await {
        match part {
            StreamPart::Chunk(chunk) => got.push(chunk),
            StreamPart::Done(answer) => return (got, answer),
            _ => unreachable!(),
        }
    }
    unreachable!("a streamed call ends with its answer")
}

fn texts(chunks: &[Chunk]) -> Vec<&str> {
    chunks.iter().map(|c| c.content.as_str().unwrap()).collect()
}

#[tokio::test(start_paused = true)]
async fn chunks_reach_the_caller_as_sent_and_the_answer_comes_whole() {
    let tool = Scripted::new(vec![vec![
        Step::Chunk("Tower "),
        Step::Sleep(10),
        Step::Chunk("layers "),
        Step::Sleep(10),
        Step::Chunk("compose."),
    ]]);
    let (_, svc) = served(&tool, RiskLevel::ReadOnly, ToolPolicy::default());
    let (got, answer) = stream(svc, call(None)).await;
    assert_eq!(texts(&got), ["Tower ", "layers ", "compose."]);
    assert_eq!(got.iter().map(|c| c.index).collect::<Vec<_>>(), [0, 1, 2]);
    assert_eq!(answer.unwrap().content, json!("Tower layers compose."));
    assert_eq!(tool.runs(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_failure_before_the_first_chunk_is_retried_and_one_after_it_is_not() {
    // Attempt 1 fails before any chunk: retried. Attempt 2 sends a chunk, then fails: final.
    let tool = Scripted::new(vec![
        vec![Step::Sleep(5), Step::Fail],
        vec![Step::Chunk("partial "), Step::Sleep(5), Step::Fail],
        vec![Step::Chunk("whole")],
    ]);
    let (_, svc) = served(&tool, RiskLevel::ReadOnly, ToolPolicy::default());
    let (got, answer) = stream(svc, call(None)).await;
    let error = answer.unwrap_err();
    assert_eq!(error.code(), ErrorCode::UpstreamUnavailable);
    assert_eq!(tool.runs(), 2, "retried once, before the first chunk only");
    assert_eq!(
        texts(&got),
        ["partial "],
        "the caller never gets a chunk twice"
    );
}

#[tokio::test(start_paused = true)]
async fn a_slow_stream_is_never_hedged() {
    // A read whose hedge would go after 100 ms: streamed, one attempt sends every chunk.
    let policy =
        ToolPolicy::default().with_retry(RetrySettings::default().with_hedge_delay_ms(100));
    let tool = Scripted::new(vec![vec![
        Step::Sleep(300),
        Step::Chunk("slow "),
        Step::Chunk("read"),
    ]]);
    let (_, svc) = served(&tool, RiskLevel::ReadOnly, policy.clone());
    let (got, answer) = stream(svc, call(None)).await;
    assert_eq!(texts(&got), ["slow ", "read"]);
    assert!(answer.unwrap().record().hedge.is_none());
    assert_eq!(tool.runs(), 1);

    // The same call read whole is hedged.
    let (_, svc) = served(&tool, RiskLevel::ReadOnly, policy);
    let output = svc.oneshot(call(None)).await.unwrap();
    assert!(output.record().hedge.is_some());
    assert_eq!(tool.runs(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_stream_that_keeps_sending_outlives_the_attempt_timeout() {
    // Attempt timeout 2 s, idle timeout 1.5 s: five chunks a second apart take 5 s.
    let policy = ToolPolicy::default().with_timeout(
        TimeoutSettings::default()
            .with_attempt_timeout_ms(2_000)
            .with_idle_timeout_ms(1_500),
    );
    let mut script = Vec::new();
    for part in ["a", "b", "c", "d", "e"] {
        script.push(Step::Sleep(1_000));
        script.push(Step::Chunk(part));
    }
    let tool = Scripted::new(vec![script]);
    let (_, svc) = served(&tool, RiskLevel::ReadOnly, policy);
    let start = Instant::now();
    let (got, answer) = stream(svc, call(None)).await;
    assert_eq!(answer.unwrap().content, json!("abcde"));
    assert_eq!(got.len(), 5);
    assert_eq!(start.elapsed(), Duration::from_secs(5));
}

#[tokio::test(start_paused = true)]
async fn a_stalled_stream_ends_one_idle_timeout_after_its_last_chunk() {
    let policy = ToolPolicy::default()
        .with_timeout(
            TimeoutSettings::default()
                .with_attempt_timeout_ms(2_000)
                .with_idle_timeout_ms(700),
        )
        .with_retry(tower_toolcall::registry::LayerSetting::Off);
    let tool = Scripted::new(vec![vec![
        Step::Sleep(300),
        Step::Chunk("a"),
        Step::Sleep(600),
        Step::Chunk("b"),
        Step::Sleep(60_000),
    ]]);
    let (_, svc) = served(&tool, RiskLevel::ReadOnly, policy);
    let start = Instant::now();
    let (got, answer) = stream(svc, call(None)).await;
    let error = answer.unwrap_err();
    assert_eq!(error.code(), ErrorCode::Timeout);
    assert!(error.message().contains("no chunk"), "{}", error.message());
    assert_eq!(got.len(), 2);
    // The last chunk at 900 ms, then 700 ms of silence.
    assert_eq!(start.elapsed(), Duration::from_millis(1_600));
}

#[tokio::test(start_paused = true)]
async fn the_attempt_timeout_bounds_the_wait_for_the_first_chunk() {
    let policy = ToolPolicy::default()
        .with_timeout(
            TimeoutSettings::default()
                .with_attempt_timeout_ms(2_000)
                .with_idle_timeout_ms(500),
        )
        .with_retry(tower_toolcall::registry::LayerSetting::Off);
    let tool = Scripted::new(vec![vec![Step::Sleep(3_000), Step::Chunk("late")]]);
    let (_, svc) = served(&tool, RiskLevel::ReadOnly, policy);
    let start = Instant::now();
    let (got, answer) = stream(svc, call(None)).await;
    assert_eq!(answer.unwrap_err().code(), ErrorCode::Timeout);
    assert!(got.is_empty());
    assert_eq!(start.elapsed(), Duration::from_millis(2_000));
}

#[tokio::test(start_paused = true)]
async fn a_duplicate_joins_the_live_stream_and_gets_every_chunk_once() {
    let tool = Scripted::new(vec![vec![
        Step::Chunk("one "),
        Step::Sleep(100),
        Step::Chunk("two "),
        Step::Sleep(100),
        Step::Chunk("three"),
    ]]);
    let (_, svc) = served(&tool, RiskLevel::Writes, ToolPolicy::default());

    let mut first = call(Some("summary-1"));
    let first_chunks = first.stream_chunks();
    let first = tokio::spawn(read(svc.clone().oneshot(first), first_chunks));
    // The duplicate arrives after the second chunk was sent.
    tokio::time::sleep(Duration::from_millis(150)).await;
    let mut second = call(Some("summary-1"));
    let second_chunks = second.stream_chunks();
    let (got, answer) = read(svc.clone().oneshot(second), second_chunks).await;
    let output = answer.unwrap();
    assert_eq!(texts(&got), ["one ", "two ", "three"]);
    assert_eq!(got.iter().map(|c| c.index).collect::<Vec<_>>(), [0, 1, 2]);
    assert_eq!(output.content, json!("one two three"));
    assert!(output.record().from_cache);
    assert_eq!(
        output.record().short_circuit,
        Some(ShortCircuit::InflightJoin)
    );

    let (first_got, first_answer) = first.await.unwrap();
    assert_eq!(texts(&first_got), ["one ", "two ", "three"]);
    assert_eq!(first_answer.unwrap().content, json!("one two three"));
    assert_eq!(tool.runs(), 1, "the write ran once");

    // After it ended, a duplicate gets the stored result whole, and no chunk.
    let mut third = call(Some("summary-1"));
    let third_chunks = third.stream_chunks();
    let (got, answer) = read(svc.oneshot(third), third_chunks).await;
    assert!(got.is_empty());
    assert_eq!(answer.unwrap().content, json!("one two three"));
    assert_eq!(tool.runs(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_joined_stream_that_ends_without_a_result_is_not_started_again() {
    let tool = Scripted::new(vec![vec![
        Step::Chunk("first "),
        Step::Sleep(1_000),
        Step::Chunk("second"),
    ]]);
    let (_, svc) = served(&tool, RiskLevel::Writes, ToolPolicy::default());
    let mut first = call(Some("k-2"));
    let first_chunks = first.stream_chunks();
    // The first caller is not detached: dropping its call stops it and frees the key.
    let first = tokio::spawn(read(svc.clone().oneshot(first), first_chunks));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let joined = tokio::spawn(stream(svc.clone(), call(Some("k-2"))));
    tokio::time::sleep(Duration::from_millis(100)).await;
    first.abort();
    let (got, answer) = joined.await.unwrap();
    assert_eq!(texts(&got), ["first "], "the chunk it was sent, once");
    let error = answer.unwrap_err();
    assert_eq!(error.code(), ErrorCode::IdempotencyInFlight);
    assert!(
        error.message().contains("send the call again"),
        "{}",
        error.message()
    );
    assert_eq!(
        tool.runs(),
        1,
        "not run again under the stream it was reading"
    );
}

#[tokio::test(start_paused = true)]
async fn a_duplicate_of_another_principal_never_reads_the_stream() {
    let tool = Scripted::new(vec![vec![
        Step::Chunk("secret "),
        Step::Sleep(100),
        Step::Chunk("plan"),
    ]]);
    let (_, svc) = served(&tool, RiskLevel::Writes, ToolPolicy::default());
    let mut alice = call(Some("k-1"));
    alice.bind_principal(tower_toolcall::Principal::new("alice"));
    let alice_chunks = alice.stream_chunks();
    let alice = tokio::spawn(read(svc.clone().oneshot(alice), alice_chunks));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut mallory = call(Some("k-1"));
    mallory.bind_principal(tower_toolcall::Principal::new("mallory"));
    let mallory_chunks = mallory.stream_chunks();
    let (got, answer) = read(svc.clone().oneshot(mallory), mallory_chunks).await;
    assert_eq!(texts(&got), ["secret ", "plan"], "its own run's chunks");
    assert!(!answer.unwrap().record().from_cache);
    assert_eq!(
        tool.runs(),
        2,
        "the same key under another principal is another call"
    );
    alice.await.unwrap().1.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_caller_that_goes_away_mid_stream_does_not_stop_a_write() {
    let tool = Scripted::new(vec![vec![
        Step::Chunk("charged "),
        Step::Sleep(1_000),
        Step::Chunk("and receipted"),
    ]]);
    let (_, svc) = served(&tool, RiskLevel::Writes, ToolPolicy::default());
    let mut first = call(Some("pay-1"));
    let chunks = first.stream_chunks();
    {
        let answer = tower_toolcall::detach::detached(svc.clone(), first);
        let mut parts = std::pin::pin!(Streamed::new(answer, chunks));
        match parts.next().await {
            Some(StreamPart::Chunk(chunk)) => assert_eq!(*chunk.content, json!("charged ")),
            other => panic!("expected the first chunk, got {other:?}"),
        }
        // The caller goes away here.
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(tool.finished(), 1, "the write ran to its end");
    let again = svc.oneshot(call(Some("pay-1"))).await.unwrap();
    assert!(again.record().from_cache);
    assert_eq!(again.content, json!("charged and receipted"));
    assert_eq!(tool.runs(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_stored_result_of_a_stream_is_bounded_as_a_whole_result_is() {
    const MAX_BYTES: usize = 64 << 10;
    let store = InMemoryDedupeStore::builder()
        .max_bytes(MAX_BYTES)
        .build()
        .unwrap();
    let stats = store.clone();
    let part: &'static str = Box::leak("x".repeat(1 << 10).into_boxed_str());
    // The first call's result fits; the second's, 70 chunks of 1 KiB, passes the bound alone:
    // it is kept alone, as a whole result of that size would be.
    let tool = Scripted::new(vec![
        vec![Step::Chunk("small")],
        vec![Step::Chunk(part); 70],
    ]);
    let stack = ToolStack::builder(summarize(RiskLevel::Writes, ToolPolicy::default()))
        .store(Arc::new(store))
        .build()
        .unwrap();
    let svc = stack.layer(tool.service());
    svc.clone().oneshot(call(Some("small-1"))).await.unwrap();
    assert_eq!(stats.stats().records, 1);

    let mut big = call(Some("big-1"));
    let chunks = big.stream_chunks();
    let (got, answer) = read(svc.clone().oneshot(big), chunks).await;
    assert_eq!(got.len(), 70);
    assert_eq!(answer.unwrap().content.as_str().unwrap().len(), 70 << 10);
    // The assembled result is one record, and the store made room for it as for any.
    assert_eq!(stats.stats().records, 1, "the older record was evicted");
    let again = svc.clone().oneshot(call(Some("big-1"))).await.unwrap();
    assert!(again.record().from_cache);
    assert_eq!(again.content.as_str().unwrap().len(), 70 << 10);
    assert_eq!(tool.runs(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_reader_that_falls_behind_the_window_skips_and_still_gets_the_whole_answer() {
    let tool = tool_fn(|call: ToolCall| async move {
        let part = "y".repeat(64 << 10);
        for _ in 0..40 {
            call.chunks().send(json!(part));
        }
        Ok(ToolOutput::new(json!("done")))
    });
    let mut call = call(None);
    let mut chunks = call.stream_chunks();
    let answer = tool.oneshot(call).await.unwrap();
    assert_eq!(answer.content, json!("done"));
    let mut read = 0;
    let mut first_index = None;
    while let Some(chunk) = chunks.try_next() {
        first_index.get_or_insert(chunk.index);
        read += 1;
    }
    assert_eq!(chunks.sent().0, 40);
    assert_eq!(read + chunks.skipped(), 40);
    assert!(chunks.skipped() > 0);
    let kept = read as usize * ((64 << 10) + 80);
    assert!(kept <= REPLAY_BYTES + (64 << 10) + 80 * 40, "{kept}");
    assert_eq!(first_index, Some(chunks.skipped()));
}

#[tokio::test(start_paused = true)]
async fn the_breaker_counts_a_stream_once_by_its_outcome() {
    let policy = ToolPolicy::default().with_breaker(
        BreakerSettings::default()
            .with_consecutive_failures(2)
            .with_min_calls(20),
    );
    let tool = Scripted::new(vec![vec![Step::Chunk("a"), Step::Chunk("b"), Step::Fail]]);
    let (stack, svc) = served(&tool, RiskLevel::ReadOnly, policy);
    let breakers = stack.breakers().unwrap();
    let (got, answer) = stream(svc.clone(), call(None)).await;
    assert_eq!(got.len(), 2);
    assert!(answer.is_err());
    let key = tower_toolcall::event::BreakerKey::Tool {
        namespace: NS.into(),
        name: "summarize".into(),
    };
    assert_eq!(breakers.status(&key).unwrap().consecutive_failures, 1);
    assert_eq!(tool.runs(), 1);
}

/// One line of the audit log, and its stream.
type Line = (AuditStream, Vec<u8>);

/// Lines kept in memory.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<Line>>>);

impl AuditSink for Lines {
    fn write_line(&mut self, stream: AuditStream, line: &[u8]) -> std::io::Result<()> {
        self.0.lock().unwrap().push((stream, line.to_vec()));
        Ok(())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn the_audit_writes_one_result_per_stream_with_its_chunks_and_bytes() {
    let lines = Lines::default();
    let audit = AuditLog::with_sink(lines.clone(), 64, Default::default());
    let tool = Scripted::new(vec![vec![
        Step::Chunk("ab"),
        Step::Chunk("cd"),
        Step::Chunk("e"),
    ]]);
    let stack = ToolStack::builder(summarize(RiskLevel::ReadOnly, ToolPolicy::default()))
        .trace(|trace| trace.audit(audit.clone()))
        .build()
        .unwrap();
    let svc = tower_toolcall::ResultEnvelopeLayer::new().layer(stack.layer(tool.service()));
    let mut call = call(None);
    let chunks = call.stream_chunks();
    let (got, result): (_, Result<ToolResult, _>) = read(svc.oneshot(call), chunks).await;
    let result = result.unwrap();
    audit.shutdown();
    assert_eq!(got.len(), 3);
    let streamed = result.streamed.expect("the result says it streamed");
    assert_eq!(streamed.chunks, 3);
    let results: Vec<Value> = lines
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|(s, _)| *s == AuditStream::Results)
        .map(|(_, line)| serde_json::from_slice(line).unwrap())
        .collect();
    assert_eq!(results.len(), 1, "one record for the whole stream");
    assert_eq!(results[0]["result"]["streamed"]["chunks"], 3);
    assert_eq!(results[0]["result"]["streamed"]["bytes"], streamed.bytes);
    assert!(streamed.bytes > 0);
}

#[test]
fn chunk_envelopes_are_written_as_the_contract_says() {
    let mut call = call(None);
    let mut chunks = call.stream_chunks();
    call.chunks().send(json!("Tower "));
    let chunk = chunks.try_next().unwrap();
    let envelope = serde_json::to_value(ChunkEnvelope::new(&call, &chunk)).unwrap();
    assert_eq!(
        envelope,
        json!({
            "requestId": call.request_id(),
            "toolName": "summarize",
            "status": "partial",
            "isStreaming": true,
            "chunkIndex": 0,
            "finalChunk": false,
            "output": {"content": "Tower "}
        })
    );
    let result = ToolResult::from_outcome(&call, Ok(ToolOutput::new(json!("Tower layers"))));
    let last = serde_json::to_value(FinalChunk::new(result, 1)).unwrap();
    assert_eq!(last["status"], "success");
    assert_eq!(last["output"]["content"], "Tower layers");
    assert_eq!(last["isStreaming"], false);
    assert_eq!(last["chunkIndex"], 1);
    assert_eq!(last["finalChunk"], true);
    assert_eq!(
        serde_json::from_value::<StreamTally>(last["streamed"].clone()).unwrap(),
        serde_json::from_value::<StreamTally>(
            json!({"chunks": 1, "bytes": last["streamed"]["bytes"]})
        )
        .unwrap()
    );
}

#[test]
fn a_caller_that_asks_for_no_chunks_costs_the_tool_nothing() {
    let call = call(None);
    assert!(!call.chunks().is_streaming());
    call.chunks().send(json!("dropped"));
    let result = ToolResult::from_outcome(&call, Ok(ToolOutput::new(json!("x"))));
    assert!(result.streamed.is_none());
}

#[test]
fn an_idle_timeout_of_zero_is_refused_naming_the_field() {
    let policy =
        ToolPolicy::default().with_timeout(TimeoutSettings::default().with_idle_timeout_ms(0));
    let err = ToolRegistry::builder()
        .tool(ToolDescriptor::new(NS, "summarize", RiskLevel::ReadOnly).with_policy(policy))
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "tools[0].policy.timeout.idle_timeout_ms");
    assert_eq!(err.problem(), "must be at least 1, got 0");
}
