//! The MCP edge's promises in process: keys that outlive a connection, the caller's
//! identity in its documented order, and messages in MCP's own words on every error path.

use std::sync::{Arc, Mutex};

use serde_json::json;
use tower::{Layer, ServiceBuilder};
use tower_toolcall::{Principal, ToolCall, ToolStack};
use tower_toolcall_mcp::{registry_for, McpClient, McpServer, Trust, ERROR_META, FROM_CACHE_META};

use super::example::{self, Notes};
use super::{connect, error_of, params, text_of, with_meta};

#[tokio::test(start_paused = true)]
async fn a_key_sent_again_over_a_new_connection_gets_the_first_result() {
    let notes = Notes::default();
    let server = example::stacked(notes.clone(), None).unwrap();
    let put = || {
        with_meta(
            params("put", json!({"id": "n1", "text": "buy milk"})),
            json!({"idempotencyKey": "put-n1"}),
        )
    };
    let first = connect(server.connection(), "agent").await;
    let done = first.call_tool(put()).await.unwrap();
    assert_eq!(done.meta, None, "the tool ran: {done:?}");
    first.cancel().await.unwrap();

    let again = connect(server.connection(), "agent").await;
    let cached = again.call_tool(put()).await.unwrap();
    assert_eq!(cached.meta.as_ref().unwrap()[FROM_CACHE_META], true);
    assert_eq!(cached.structured_content, done.structured_content);
    assert_eq!(notes.calls("put"), 1, "ran once over two connections");

    // Another client program of the single user is that user: its name is no scope.
    let renamed = connect(server.connection(), "another-agent").await;
    let cached = renamed.call_tool(put()).await.unwrap();
    assert_eq!(cached.meta.as_ref().unwrap()[FROM_CACHE_META], true);
    assert_eq!(notes.calls("put"), 1);

    // Another principal's key is its own.
    let bob = server.connection().principal(Principal::new("bob"));
    let other = connect(bob, "agent").await;
    let ran = other.call_tool(put()).await.unwrap();
    assert_eq!(ran.meta, None);
    assert_eq!(notes.calls("put"), 2);
}

/// A server over `Notes` whose stack records every call it sees.
pub(super) fn recorded(
    configure: impl FnOnce(McpServer<Notes>) -> McpServer<Notes>,
) -> (McpServer<Notes>, Arc<Mutex<Vec<ToolCall>>>) {
    let seen: Arc<Mutex<Vec<ToolCall>>> = Arc::default();
    let record = seen.clone();
    let registry = registry_for("notes", &Notes::tools(), Trust::Trusted, None).unwrap();
    let layer = ServiceBuilder::new()
        .layer(ToolStack::builder(registry).build().unwrap())
        .map_request(move |call: ToolCall| {
            record.lock().unwrap().push(call.clone());
            call
        });
    (
        configure(McpServer::new(Notes::default(), "notes", layer)),
        seen,
    )
}

#[tokio::test(start_paused = true)]
async fn the_operators_meta_members_come_first_for_session_and_actor() {
    let (server, seen) = recorded(|server| {
        server
            .session_from_meta("agentSession")
            .actor_from_meta("userId")
    });
    let connection = server.session_key().to_owned();
    let client = connect(server, "claude-code").await;
    let search = || params("search", json!({"query": "x"}));
    client
        .call_tool(with_meta(
            search(),
            json!({"agentSession": "s-9", "userId": "u-1"}),
        ))
        .await
        .unwrap();
    client.call_tool(search()).await.unwrap();
    let refused = client
        .call_tool(with_meta(search(), json!({"agentSession": 7})))
        .await
        .unwrap();
    let (code, message) = error_of(&refused);
    assert_eq!(code, "VALIDATION_ERROR");
    assert!(
        message.contains("`_meta.agentSession` must be a string"),
        "{message}"
    );

    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2, "the refused call never reached the stack");
    assert_eq!((seen[0].session_key(), seen[0].actor_id()), ("s-9", "u-1"));
    // Without them: the connection, and the single user; the client's name is only the
    // call's agent.
    assert_eq!(
        (seen[1].session_key(), seen[1].actor_id()),
        (&*connection, "local")
    );
    assert_eq!(
        seen[1].envelope().target.agent_id.as_deref(),
        Some("claude-code")
    );
}

#[tokio::test(start_paused = true)]
async fn with_a_principal_the_meta_members_scope_nothing_beyond_it() {
    let alice = Principal::new("alice").with_tenant("acme");
    let (server, seen) = recorded(|server| {
        server
            .session_from_meta("agentSession")
            .actor_from_meta("userId")
            .principal(alice.clone())
    });
    let connection = server.session_key().to_owned();
    let client = connect(server, "claude-code").await;
    let search = || params("search", json!({"query": "x"}));
    client
        .call_tool(with_meta(
            search(),
            json!({"agentSession": "s-9", "userId": "bob"}),
        ))
        .await
        .unwrap();
    client.call_tool(search()).await.unwrap();
    let seen = seen.lock().unwrap();
    let who: Vec<_> = seen
        .iter()
        .map(|c| (c.session_key().to_owned(), c.actor_id(), c.tenant_id()))
        .collect();
    assert_eq!(
        who,
        [
            (alice.session_key("s-9"), "alice", Some("acme")),
            (alice.session_key(&connection), "alice", Some("acme")),
        ],
        "the actor is the principal's, whatever _meta says; sessions are under it"
    );
}

#[tokio::test(start_paused = true)]
async fn a_key_is_read_from_the_members_clients_already_send() {
    let (server, seen) = recorded(|server| server);
    let client = connect(server, "agent").await;
    for meta in [
        json!({"io.opengsd/idempotency-key": "k-1"}),
        json!({"claudecode/toolUseId": "toolu_01"}),
        json!({"idempotencyKey": "k-3", "claudecode/toolUseId": "toolu_02"}),
    ] {
        client
            .call_tool(with_meta(
                params("put", json!({"id": "n", "text": "t"})),
                meta,
            ))
            .await
            .unwrap();
    }
    let keys: Vec<_> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|c| c.idempotency_key().map(str::to_owned))
        .collect();
    assert_eq!(
        keys,
        [
            Some("k-1".into()),
            Some("toolu_01".into()),
            Some("k-3".into())
        ]
    );

    let (server, seen) = recorded(|server| server.idempotency_key_members(["x-key"]));
    let client = connect(server, "agent").await;
    client
        .call_tool(with_meta(
            params("put", json!({"id": "n", "text": "t"})),
            json!({"idempotencyKey": "ignored", "x-key": "mine"}),
        ))
        .await
        .unwrap();
    assert_eq!(seen.lock().unwrap()[0].idempotency_key(), Some("mine"));
}

/// What a model must never read: Rust paths, types and debug output.
fn reads_plainly(text: &str) {
    let without_tools = text.replace("notes::", "");
    for rust in [
        "::",
        "rmcp",
        "tokio",
        "Error {",
        "Error(",
        "Some(",
        "None",
        "Transport [",
        "payload.",
        "control.",
    ] {
        assert!(
            !without_tools.contains(rust),
            "the model reads `{rust}`: {text}"
        );
    }
}

#[tokio::test]
async fn no_error_a_model_reads_names_a_rust_type_or_an_envelope_field() {
    // A proxy: the stack around an McpClient of the bare notes server.
    let upstream = connect(Notes::default(), "proxy").await;
    let client = McpClient::new(upstream.peer().clone());
    let registry = client
        .registry("notes", Trust::Trusted, None)
        .await
        .unwrap();
    let stack = ToolStack::builder(registry).build().unwrap();
    let proxy = McpServer::over("notes", stack.layer(client), Notes::tools());
    let agent = connect(proxy, "agent").await;

    let put = |text: &str, key: serde_json::Value| {
        with_meta(
            params("put", json!({"id": "n1", "text": text})),
            json!({"idempotencyKey": key}),
        )
    };
    let mut errors = Vec::new();
    for request in [
        params("search", json!({})),
        params("search", json!({"query": 3})),
        params("delete", json!({"id": "n1"})),
        params("nope", json!({})),
        put("a", json!(42)),
        put("a", json!("k".repeat(300))),
        with_meta(
            params("delete", json!({"id": "n1"})),
            json!({"confirmationId": false}),
        ),
    ] {
        errors.push(agent.call_tool(request).await.unwrap());
    }
    agent.call_tool(put("a", json!("k-1"))).await.unwrap();
    errors.push(agent.call_tool(put("b", json!("k-1"))).await.unwrap());
    for _ in 0..4 {
        let last = agent
            .call_tool(params("search", json!({"query": "q"})))
            .await
            .unwrap();
        if last.is_error == Some(true) {
            errors.push(last);
        }
    }
    // The upstream goes away.
    upstream.cancel().await.unwrap();
    errors.push(
        agent
            .call_tool(params("put", json!({"id": "n2", "text": "c"})))
            .await
            .unwrap(),
    );

    let codes: Vec<_> = errors.iter().map(|e| error_of(e).0.to_owned()).collect();
    assert_eq!(
        codes,
        [
            "VALIDATION_ERROR",
            "VALIDATION_ERROR",
            "POLICY_DENIED",
            "NOT_FOUND",
            "VALIDATION_ERROR",
            "VALIDATION_ERROR",
            "VALIDATION_ERROR",
            "IDEMPOTENCY_KEY_REUSED",
            "LOOP_DETECTED",
            // An idempotent tool is retried after a transport failure, to no avail.
            "RETRY_EXHAUSTED",
        ]
    );
    for error in &errors {
        reads_plainly(&text_of(error));
        reads_plainly(
            error.meta.as_ref().unwrap()[ERROR_META]["message"]
                .as_str()
                .unwrap(),
        );
    }
    assert!(
        text_of(&errors[1]).contains("`arguments.query`"),
        "{}",
        text_of(&errors[1])
    );
}
