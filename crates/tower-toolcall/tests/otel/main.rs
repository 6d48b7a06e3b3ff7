//! The caller's W3C `traceparent` as the OpenTelemetry parent of the call's span (feature
//! `opentelemetry`), seen through `tracing-opentelemetry` and the SDK's in-memory exporter.

use std::sync::{Arc, Mutex};

use opentelemetry::trace::{SpanId, TraceId, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use serde_json::json;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_toolcall::registry::ToolRegistry;
use tower_toolcall::trace::TraceLayer;
use tower_toolcall::{tool_fn, RetryLayer, ToolCall, ToolError, ToolOutput};
use tracing::subscriber::DefaultGuard;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_ID: &str = "00f067aa0ba902b7";

/// The messages of the DEBUG events a test logs.
#[derive(Clone, Default)]
struct DebugMessages(Arc<Mutex<Vec<String>>>);

impl DebugMessages {
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut self.0.lock().unwrap())
    }
}

impl<S: tracing::Subscriber> Layer<S> for DebugMessages {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        struct Message<'a>(&'a mut String);
        impl tracing::field::Visit for Message<'_> {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    *self.0 = format!("{value:?}");
                }
            }
        }
        if *event.metadata().level() == tracing::Level::DEBUG {
            let mut message = String::new();
            event.record(&mut Message(&mut message));
            self.0.lock().unwrap().push(message);
        }
    }
}

/// Spans go to an in-memory exporter through `tracing-opentelemetry`, on this thread.
struct Otel {
    exporter: InMemorySpanExporter,
    debug: DebugMessages,
    _provider: SdkTracerProvider,
    _guard: DefaultGuard,
}

impl Otel {
    fn install() -> Otel {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let debug = DebugMessages::default();
        let subscriber = tracing_subscriber::registry()
            .with(
                tracing_opentelemetry::layer().with_tracer(provider.tracer("tower-toolcall-tests")),
            )
            .with(debug.clone());
        Otel {
            exporter,
            debug,
            _provider: provider,
            _guard: tracing::subscriber::set_default(subscriber),
        }
    }

    /// The exported spans, oldest first, and forgets them.
    fn take(&self) -> Vec<SpanData> {
        let spans = self.exporter.get_finished_spans().unwrap();
        self.exporter.reset();
        spans
    }
}

fn call(traceparent: Option<&str>) -> ToolCall {
    let builder = ToolCall::builder("agents.tools.web", "search")
        .session("sess-42")
        .actor("user-7")
        .params(json!({"query": "tower"}));
    match traceparent {
        Some(header) => builder.traceparent(header),
        None => builder,
    }
    .build()
    .unwrap()
}

async fn run<S>(svc: &mut S, call: ToolCall) -> Result<ToolOutput, ToolError>
where
    S: Service<ToolCall, Response = ToolOutput, Error = ToolError>,
{
    svc.ready().await?.call(call).await
}

/// TraceLayer over a retried tool that fails its first attempt with 503.
fn traced_retried_tool() -> impl Service<ToolCall, Response = ToolOutput, Error = ToolError> {
    let runs = Arc::new(Mutex::new(0));
    ServiceBuilder::new()
        .layer(TraceLayer::new())
        .layer(
            RetryLayer::builder(ToolRegistry::open())
                .seed(1)
                .build()
                .unwrap(),
        )
        .service(tool_fn(move |_call: ToolCall| {
            let run = {
                let mut runs = runs.lock().unwrap();
                *runs += 1;
                *runs
            };
            async move {
                if run == 1 {
                    Err(ToolError::from_http_status(503, "busy"))
                } else {
                    Ok(ToolOutput::new(json!({"hits": 1})))
                }
            }
        }))
}

fn named<'a>(spans: &'a [SpanData], prefix: &str) -> Vec<&'a SpanData> {
    spans
        .iter()
        .filter(|s| s.name.starts_with(prefix))
        .collect()
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_well_formed_traceparent_becomes_the_remote_parent_of_the_call() {
    let otel = Otel::install();
    let mut svc = traced_retried_tool();
    let header = format!("00-{TRACE_ID}-{PARENT_ID}-01");
    run(&mut svc, call(Some(&header))).await.unwrap();

    let spans = otel.take();
    let calls = named(&spans, "execute_tool");
    assert_eq!(calls.len(), 1, "{spans:#?}");
    let span = calls[0];
    assert_eq!(span.name, "execute_tool search");
    assert_eq!(
        span.span_context.trace_id(),
        TraceId::from_hex(TRACE_ID).unwrap()
    );
    assert_eq!(span.parent_span_id, SpanId::from_hex(PARENT_ID).unwrap());
    assert!(span.parent_span_is_remote);
    assert!(span.span_context.is_sampled());

    // The attempts are children of the call, in the caller's trace.
    let attempts = named(&spans, "tool_attempt");
    assert_eq!(attempts.len(), 2);
    for attempt in attempts {
        assert_eq!(
            attempt.span_context.trace_id(),
            span.span_context.trace_id()
        );
        assert_eq!(attempt.parent_span_id, span.span_context.span_id());
    }
    assert!(otel.debug.take().iter().all(|m| !m.contains("traceparent")));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_later_version_is_read_by_its_first_four_fields() {
    let otel = Otel::install();
    let mut svc = traced_retried_tool();
    let header = format!("cc-{TRACE_ID}-{PARENT_ID}-01-what-comes-later");
    run(&mut svc, call(Some(&header))).await.unwrap();
    let spans = otel.take();
    let span = named(&spans, "execute_tool")[0];
    assert_eq!(
        span.span_context.trace_id(),
        TraceId::from_hex(TRACE_ID).unwrap()
    );
    assert_eq!(span.parent_span_id, SpanId::from_hex(PARENT_ID).unwrap());
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_call_without_or_with_a_malformed_traceparent_starts_a_new_trace() {
    let otel = Otel::install();
    let mut svc = traced_retried_tool();
    let malformed = [
        format!("00-{TRACE_ID}-{PARENT_ID}"),
        format!("00-{}-{PARENT_ID}-01", TRACE_ID.to_uppercase()),
        format!("00-{}-{PARENT_ID}-01", "0".repeat(32)),
        format!("00-{TRACE_ID}-{}-01", "0".repeat(16)),
        format!("ff-{TRACE_ID}-{PARENT_ID}-01"),
        format!("00-{TRACE_ID}-{PARENT_ID}-01-extra"),
        "not a traceparent".to_owned(),
    ];
    let headers: Vec<Option<&str>> = std::iter::once(None)
        .chain(malformed.iter().map(|h| Some(h.as_str())))
        .collect();
    let mut trace_ids = Vec::new();
    for header in &headers {
        run(&mut svc, call(*header)).await.unwrap();
        let spans = otel.take();
        let span = named(&spans, "execute_tool")[0];
        assert_eq!(span.parent_span_id, SpanId::INVALID, "{header:?}");
        assert!(!span.parent_span_is_remote, "{header:?}");
        let trace_id = span.span_context.trace_id();
        assert_ne!(trace_id, TraceId::INVALID, "{header:?}");
        assert_ne!(trace_id, TraceId::from_hex(TRACE_ID).unwrap(), "{header:?}");
        trace_ids.push(u128::from_be_bytes(trace_id.to_bytes()));

        // The call went through; a malformed header is noted at DEBUG.
        let noted = otel
            .debug
            .take()
            .into_iter()
            .filter(|m| m.starts_with("trace.traceparent ignored"))
            .count();
        assert_eq!(noted, usize::from(header.is_some()), "{header:?}");
    }
    trace_ids.sort();
    trace_ids.dedup();
    assert_eq!(
        trace_ids.len(),
        headers.len(),
        "each call has a trace of its own"
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_callers_sampling_decision_is_kept() {
    let otel = Otel::install();
    let mut svc = traced_retried_tool();
    let unsampled = format!("00-{TRACE_ID}-{PARENT_ID}-00");
    run(&mut svc, call(Some(&unsampled))).await.unwrap();
    assert!(
        otel.take().is_empty(),
        "the SDK's parent-based sampler drops the spans of an unsampled trace"
    );
    let sampled = format!("00-{TRACE_ID}-{PARENT_ID}-01");
    run(&mut svc, call(Some(&sampled))).await.unwrap();
    assert_eq!(named(&otel.take(), "execute_tool").len(), 1);
}
