//! Through the whole stack, the audit log writes one `step.started` and one end per attempt
//! that reached the tool, and one event of its own for a call answered without the tool.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use proptest::prelude::*;
use serde_json::{json, Value};
use tower::{Service, ServiceExt};
use tower_toolcall::registry::{RiskLevel, ToolDescriptor, ToolRegistry};
use tower_toolcall::trace::{AuditLog, AuditStream, Redactor};
use tower_toolcall::{tool_fn, ToolCall, ToolError, ToolOutput, ToolStack};

use super::MemorySink;

/// What the tool answers on one attempt.
#[derive(Clone, Copy, Debug)]
enum Answer {
    Ok,
    /// 503: retried.
    Unavailable,
    /// 400: not retried.
    BadRequest,
}

fn answer() -> impl Strategy<Value = Answer> {
    prop_oneof![
        Just(Answer::Ok),
        Just(Answer::Unavailable),
        Just(Answer::BadRequest)
    ]
}

/// One call of the script: the answers of its attempts, and whether it is sent twice (the
/// second time under the same key: answered from the record, unless no attempt of the first
/// reached the tool).
type Script = Vec<(Vec<Answer>, bool)>;

async fn play(script: &Script) -> (Vec<Value>, BTreeMap<String, u64>) {
    let sink = MemorySink::default();
    let audit = AuditLog::with_sink(sink.clone(), 100_000, Redactor::default());
    let registry = ToolRegistry::builder()
        .tool(ToolDescriptor::new("vault", "put", RiskLevel::Writes).with_idempotent(true))
        .build()
        .unwrap();
    let answers: Arc<Mutex<BTreeMap<String, Vec<Answer>>>> = Arc::new(Mutex::new(
        script
            .iter()
            .enumerate()
            .map(|(n, (answers, _))| (format!("req-{n}"), answers.clone()))
            .collect(),
    ));
    let ran = Arc::new(Mutex::new(BTreeMap::<String, u64>::new()));
    let (answers_in, ran_in) = (answers.clone(), ran.clone());
    let stack = ToolStack::builder(registry)
        .trace(|trace| trace.audit(audit.clone()))
        .build()
        .unwrap();
    let svc = tower::Layer::layer(
        &stack,
        tool_fn(move |call: ToolCall| {
            let id = call.request_id().to_owned();
            *ran_in.lock().unwrap().entry(id.clone()).or_default() += 1;
            let mut answers = answers_in.lock().unwrap();
            let queue = answers.get_mut(&id).unwrap();
            let next = if queue.len() > 1 {
                queue.remove(0)
            } else {
                queue[0]
            };
            async move {
                match next {
                    Answer::Ok => Ok(ToolOutput::new(json!({"ok": true}))),
                    Answer::Unavailable => Err(ToolError::from_http_status(503, "busy")),
                    Answer::BadRequest => Err(ToolError::from_http_status(400, "bad")),
                }
            }
        }),
    );
    for (n, (_, twice)) in script.iter().enumerate() {
        let call = || {
            ToolCall::builder("vault", "put")
                .session("s")
                .actor("u")
                .request_id(format!("req-{n}"))
                .idempotency_key(format!("key-{n}"))
                .params(json!({"n": n}))
                .build()
                .unwrap()
        };
        let _ = svc.clone().oneshot(call()).await;
        if *twice {
            let _ = svc.clone().ready().await.unwrap().call(call()).await;
        }
    }
    drop(svc);
    drop(stack);
    audit.shutdown();
    let ran = ran.lock().unwrap().clone();
    (sink.lines(AuditStream::Events), ran)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn every_attempt_that_ran_has_one_start_and_one_end(
        script in prop::collection::vec(
            (prop::collection::vec(answer(), 1..6), any::<bool>()),
            1..12,
        )
    ) {
        let (events, ran) = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap()
            .block_on(play(&script));

        // The sends are made one after the other: the events between a `run.started` and
        // its run's end belong to one send.
        let mut started = BTreeMap::<String, u64>::new();
        let mut sends = 0;
        let mut send: Option<(String, Option<u64>, u64, u64)> = None; // run, open, attempts, others
        for e in &events {
            let run = e["runId"].as_str().unwrap().to_owned();
            let kind = e["type"].as_str().unwrap();
            if kind == "run.started" {
                prop_assert!(send.is_none(), "sends do not overlap");
                send = Some((run, None, 0, 0));
                sends += 1;
                continue;
            }
            let Some((current, open, attempts, others)) = send.as_mut() else {
                prop_assert!(false, "{kind} outside a send");
                unreachable!();
            };
            prop_assert_eq!(&*current, &run);
            match kind {
                "step.started" => {
                    prop_assert!(open.is_none(), "{run}: a start inside an attempt");
                    *started.entry(run.clone()).or_default() += 1;
                    // Numbered within its send: a send after one that never reached the
                    // tool (every attempt unavailable) runs again, from attempt 1.
                    *attempts += 1;
                    prop_assert_eq!(e["attempt"].as_u64(), Some(*attempts));
                    *open = Some(*attempts);
                }
                "step.finished" | "step.failed" => {
                    prop_assert_eq!(open.take(), e["attempt"].as_u64(), "{} ends what started", run);
                }
                // A record answered the send: nothing reached the tool.
                "step.cached" => {
                    prop_assert_eq!(*attempts, 0);
                    *others += 1;
                }
                // An open breaker refused the send's last attempt.
                "step.refused" => {
                    prop_assert_eq!(&e["payload"]["path"], "breaker_open");
                    prop_assert!(open.is_none());
                    *others += 1;
                }
                "run.finished" | "run.failed" | "run.blocked" => {
                    prop_assert!(open.is_none(), "{run}: every attempt ended");
                    prop_assert!(*others <= 1, "{run}: one event for a send answered without the tool");
                    prop_assert!(*attempts + *others >= 1, "{run}: the send says what happened");
                    send = None;
                }
                _ => {}
            }
        }
        prop_assert!(send.is_none());
        let expected = script.iter().map(|(_, twice)| 1 + usize::from(*twice)).sum::<usize>();
        prop_assert_eq!(sends, expected);
        prop_assert_eq!(&started, &ran, "one start per attempt that reached the tool");
    }
}
