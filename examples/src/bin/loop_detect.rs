//! Run with `cargo run -p tower-toolcall-examples --bin loop_detect`.
//!
//! A model that keeps calling the same search gets a chance on its 4th identical call and is
//! stopped on the 5th; a user's in-chat command gives another session a stricter limit.

use serde_json::json;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_toolcall::loop_detect::{LoopDetectLayer, LoopDetectSettings};
use tower_toolcall::registry::{LoopMode, ToolRegistry};
use tower_toolcall::{tool_fn, ResultEnvelopeLayer, ToolCall, ToolOutput};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Server defaults from TOOL_LOOP_* variables; a model that loops easily gets a chance
    // to change its approach before the session breaks.
    let mut chance = LoopDetectSettings::default();
    chance.mode = Some(LoopMode::ChanceThenBreak);
    let layer = LoopDetectLayer::builder(ToolRegistry::open())
        .settings(LoopDetectSettings::from_env()?)
        .model("openai", "gpt-4o-mini", chance)
        .build()?;
    let handle = layer.handle();

    let search = tool_fn(|call: ToolCall| async move {
        Ok(ToolOutput::new(
            json!({"hits": [], "query": call.params().as_map().get("query")}),
        ))
    });
    let mut stack = ServiceBuilder::new()
        .layer(ResultEnvelopeLayer::new())
        .layer(layer)
        .service(search);

    let call = |session: &str| {
        ToolCall::builder("agents.tools.web", "search")
            .session(session)
            .actor("user-7")
            .params(json!({"query": "rust tower retry"}))
            .baggage("gen_ai.system", "openai")
            .baggage("gen_ai.request.model", "gpt-4o-mini")
            .build()
    };

    for attempt in 1..=5 {
        let result = stack.ready().await?.call(call("sess-42")?).await?;
        println!(
            "sess-42 call {attempt}: {}",
            serde_json::to_string(&result)?
        );
    }

    // The user of another session asks for a stricter limit.
    let command = handle.apply_command("sess-43", "!/set(tool-loop-max-repeats=2)")?;
    println!("sess-43 applied {command:?}");
    for attempt in 1..=2 {
        let result = stack.ready().await?.call(call("sess-43")?).await?;
        println!("sess-43 call {attempt}: {:?}", result.status);
    }
    Ok(())
}
