//! Captures the `tracing` events and spans of one test, on its thread.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use tracing::span::{Attributes, Id, Record};

/// One event: its level and fields (the message under `message`).
#[derive(Clone, Debug)]
pub struct CapturedEvent {
    /// The event's level.
    pub level: tracing::Level,
    /// Its fields by name, each as its value's `Debug` (a `&str` as it is).
    pub fields: BTreeMap<String, String>,
}

/// One span: its name and fields, with those recorded after it was opened.
#[derive(Clone, Debug)]
pub struct CapturedSpan {
    /// The span's name.
    pub name: &'static str,
    /// Its fields by name, as [`CapturedEvent::fields`].
    pub fields: BTreeMap<String, String>,
}

/// The events and spans of one test.
#[derive(Clone, Debug, Default)]
pub struct Capture {
    events: Arc<Mutex<Vec<CapturedEvent>>>,
    spans: Arc<Mutex<Vec<(u64, CapturedSpan)>>>,
}

impl Capture {
    /// The events so far, in the order they came.
    pub fn events(&self) -> Vec<CapturedEvent> {
        self.events.lock().unwrap().clone()
    }

    /// The spans so far, in the order they were opened.
    pub fn spans(&self) -> Vec<CapturedSpan> {
        self.spans
            .lock()
            .unwrap()
            .iter()
            .map(|(_, span)| span.clone())
            .collect()
    }

    /// Every field value of every event and span, for leak checks.
    pub fn all_values(&self) -> Vec<String> {
        let mut values: Vec<String> = self
            .events()
            .into_iter()
            .flat_map(|e| e.fields.into_values())
            .collect();
        values.extend(
            self.spans()
                .into_iter()
                .flat_map(|s| s.fields.into_values()),
        );
        values
    }
}

thread_local! {
    static THREAD_CAPTURE: std::cell::RefCell<Option<Capture>> =
        const { std::cell::RefCell::new(None) };
}

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

/// Hands each event and span to the capture of the thread that makes it.
///
/// It is installed once as the global subscriber, so that no test depends on callsite
/// interest cached while another test's scoped subscriber came and went.
struct ThreadCaptureLayer;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for ThreadCaptureLayer {
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        THREAD_CAPTURE.with(|capture| {
            if let Some(capture) = &*capture.borrow() {
                let mut fields = BTreeMap::new();
                event.record(&mut Fields(&mut fields));
                capture.events.lock().unwrap().push(CapturedEvent {
                    level: *event.metadata().level(),
                    fields,
                });
            }
        });
    }

    fn on_new_span(
        &self,
        attrs: &Attributes<'_>,
        id: &Id,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        THREAD_CAPTURE.with(|capture| {
            if let Some(capture) = &*capture.borrow() {
                let mut fields = BTreeMap::new();
                attrs.record(&mut Fields(&mut fields));
                capture.spans.lock().unwrap().push((
                    id.into_u64(),
                    CapturedSpan {
                        name: attrs.metadata().name(),
                        fields,
                    },
                ));
            }
        });
    }

    fn on_record(
        &self,
        id: &Id,
        values: &Record<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        THREAD_CAPTURE.with(|capture| {
            if let Some(capture) = &*capture.borrow() {
                let mut spans = capture.spans.lock().unwrap();
                if let Some((_, span)) = spans
                    .iter_mut()
                    .rev()
                    .find(|(sid, _)| *sid == id.into_u64())
                {
                    values.record(&mut Fields(&mut span.fields));
                }
            }
        });
    }
}

/// Stops capturing on this thread when dropped.
#[derive(Debug)]
pub struct CaptureGuard;

impl Drop for CaptureGuard {
    fn drop(&mut self) {
        THREAD_CAPTURE.with(|capture| capture.borrow_mut().take());
    }
}

/// Captures the events and spans of this thread (the test's, under a current-thread runtime).
pub fn capture() -> (Capture, CaptureGuard) {
    use tracing_subscriber::layer::SubscriberExt;
    static GLOBAL: std::sync::Once = std::sync::Once::new();
    GLOBAL.call_once(|| {
        tracing::subscriber::set_global_default(
            tracing_subscriber::registry().with(ThreadCaptureLayer),
        )
        .expect("no other global subscriber in this test binary");
    });
    let capture = Capture::default();
    THREAD_CAPTURE.with(|slot| *slot.borrow_mut() = Some(capture.clone()));
    (capture, CaptureGuard)
}
