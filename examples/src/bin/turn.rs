//! Run with: `cargo run -p tower-toolcall-examples --bin turn`
//!
//! One agent turn planning a trip, run by the executor over the whole stack: flights first,
//! hotels near the arrival airport once the flights are known (one call per hotel
//! district, expanded lazily), a weather tool that is too slow for the turn's deadline, and a
//! car rental whose primary tool is down, so that its alternative answers. The events are
//! printed as they stream, then the partial result the agent would answer with.

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::json;
use tower::ServiceBuilder;
use tower_toolcall::registry::{RetrySettings, RiskLevel, ToolDescriptor, ToolRegistry};
use tower_toolcall::{tool_fn, ToolCall, ToolError, ToolOutput, ToolStack};
use tower_toolcall_executor::{Executor, Plan, Turn};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let read = |name: &str| ToolDescriptor::new("travel", name, RiskLevel::ReadOnly);
    let registry = ToolRegistry::builder()
        .tool(read("flights"))
        .tool(read("hotels"))
        .tool(read("weather"))
        .tool(read("cars"))
        .tool(read("cars_backup"))
        .build()?;

    let tools = tool_fn(|call: ToolCall| async move {
        let params = call.params().as_value().clone();
        match call.tool_name() {
            "flights" => {
                tokio::time::sleep(Duration::from_millis(300)).await;
                Ok(ToolOutput::new(
                    json!({"flight": "AF7642", "arrival": "LYS"}),
                ))
            }
            "hotels" => {
                tokio::time::sleep(Duration::from_millis(200)).await;
                Ok(ToolOutput::new(
                    json!({"near": params["near"], "district": params["district"], "hotel": "Bellecour"}),
                ))
            }
            "weather" => {
                tokio::time::sleep(Duration::from_secs(30)).await;
                Ok(ToolOutput::new(json!({"forecast": "sun"})))
            }
            "cars" => Err(ToolError::from_http_status(
                404,
                "car rental service is gone",
            )),
            _ => Ok(ToolOutput::new(json!({"car": "Clio", "at": params["at"]}))),
        }
    });
    let stack = ToolStack::builder(registry.clone())
        .retry(|retry| retry.settings(RetrySettings::default().with_max_attempts(2)))
        .build()?;
    let service = ServiceBuilder::new().layer(stack).service(tools);

    let plan = Plan::from_value(json!({"steps": [
        {"id": "flights", "tool": "travel::flights", "args": {"from": "CDG", "to": "Lyon"}},
        {"id": "hotels", "tool": "travel::hotels",
         "args": {"near": "$steps.flights.arrival", "district": "{item}"},
         "foreach": {"items": ["Presqu'île", "Vieux Lyon", "Croix-Rousse"], "maxConcurrency": 2}},
        {"id": "weather", "tool": "travel::weather", "args": {"city": "Lyon"}, "optional": true},
        {"id": "car", "tool": "travel::cars", "args": {"at": "$steps.flights.arrival"},
         "alternatives": ["travel::cars_backup"]}
    ]}))?;

    let executor = Executor::builder(registry)
        .turn_timeout(Duration::from_secs(2))
        .build()?;
    let mut run = executor.start(service, &plan, Turn::new("sess-1", "user-1"))?;
    let mut events = run.events().expect("the events are taken once");
    let printer = async {
        while let Some(event) = events.next().await {
            let at = event.elapsed_ms.unwrap_or(0);
            let call = event.call_id.as_deref().unwrap_or("");
            println!(
                "{at:>5} ms  {:<26} {call:<18} {}",
                event.kind, event.message
            );
        }
    };
    let (result, ()) = tokio::join!(run.finish(), printer);

    println!("\n{:?}: {}", result.status, result.message);
    for step in &result.steps {
        println!(
            "  {:<8} {:?}{}",
            step.id,
            step.status,
            step.answered_by
                .as_deref()
                .map(|tool| format!(" (answered by {tool})"))
                .unwrap_or_default()
        );
    }
    for decision in &result.trace {
        println!(
            "  decision: {} {:?} after {} ({})",
            decision.step_id, decision.decision, decision.classification, decision.reason
        );
    }
    println!(
        "\n{}",
        serde_json::to_string_pretty(&result.output("hotels"))?
    );
    Ok(())
}
