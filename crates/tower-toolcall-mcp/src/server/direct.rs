//! `tools/call` requests that a streamable-HTTP front answers itself: parsed once into the
//! call's params, run through the stack, the result encoded once, in plain JSON unless the
//! call's progress comes first, without rmcp's session worker, its replayable event stream
//! and its typed parse of every message.

use std::fmt;
use std::future::Future;

use bytes::Bytes;
use futures_util::stream::BoxStream;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ProgressNotificationParam, ProtocolVersion, RequestId,
};
use serde::{Deserialize, Serialize};

use super::{Asker, McpServer, ToolList};
use crate::convert::result_of;
use crate::meta::RequestMeta;
use crate::progress::Latest;
use crate::wording::in_mcp_words;
use tower_toolcall::{ToolError, ToolOutput};

/// The media type of a JSON request or answer.
const JSON: &str = "application/json";

/// A JSON-RPC `tools/call` request, as much of it as the server reads.
#[derive(Deserialize)]
struct Request<'a> {
    #[serde(borrow)]
    jsonrpc: &'a str,
    id: RequestId,
    #[serde(borrow)]
    method: &'a str,
    params: CallToolRequestParams,
}

/// The JSON-RPC answer to a `tools/call`.
#[derive(Serialize)]
struct Response<'a> {
    jsonrpc: &'static str,
    id: &'a RequestId,
    result: &'a CallToolResult,
}

/// A JSON-RPC progress notification.
#[derive(Serialize)]
struct Progress<'a> {
    jsonrpc: &'static str,
    method: &'static str,
    params: &'a ProgressNotificationParam,
}

/// The answer of [`McpServer::answer_in_session`] to a `tools/call`.
#[non_exhaustive]
pub enum SessionAnswer {
    /// The JSON-RPC response, alone: send it as `application/json`.
    Json(Bytes),
    /// The call's progress, then its JSON-RPC response, as server-sent events (each one
    /// whole): send them as `text/event-stream`. The answer of a call whose progress came
    /// before its result.
    Events(BoxStream<'static, Bytes>),
}

impl fmt::Debug for SessionAnswer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SessionAnswer::Json(json) => f.debug_tuple("Json").field(json).finish(),
            SessionAnswer::Events(_) => f.debug_tuple("Events").finish_non_exhaustive(),
        }
    }
}

impl McpServer<ToolList> {
    /// Answers `body`, the body of the streamable-HTTP request `request` in the session
    /// `session`, when it is a `tools/call` the server can answer alone; `None` for any
    /// other request, which rmcp's `StreamableHttpService` serves as before.
    ///
    /// It answers what rmcp would serve with the same call through the stack, and nothing
    /// else: a `POST` of one JSON-RPC request whose method is `tools/call`, sent as
    /// `application/json` by a client that accepts both JSON and an event stream, in a
    /// version with sessions (no `MCP-Protocol-Version` header, or one naming such a
    /// version), with no per-request protocol version or input responses, of a tool that
    /// needs no confirmation (which is asked of the user over rmcp's session). The call is
    /// the same as rmcp's: the principal is the one the server's authentication put in the
    /// request's extensions, its transport session is `session`, its request id the
    /// session's followed by the JSON-RPC id (a client's `notifications/cancelled` in the
    /// session stops it as it stops any), and `client` (the `clientInfo.name` of the
    /// session's `initialize`) is its agent.
    ///
    /// The answer is the JSON-RPC response alone ([`SessionAnswer::Json`]), unless the
    /// request asked for progress (`_meta.progressToken`), the server
    /// [relays](McpServer::relay_progress) it, and progress comes before the result: then
    /// the progress notifications (the latest not yet sent, each time) and the response, as
    /// server-sent events ([`SessionAnswer::Events`]).
    ///
    /// The front that calls it must have checked what rmcp would have: that `session` is a
    /// session rmcp holds open, which the request's principal may use. What it saves is
    /// rmcp's round trip through the session's worker and its replayable event stream.
    ///
    /// ```no_run
    /// # use tower_toolcall_mcp::{McpServer, SessionAnswer, ToolList};
    /// # async fn front(server: &McpServer<ToolList>, request: http::request::Parts, body: bytes::Bytes) {
    /// // In a middleware in front of rmcp's StreamableHttpService, once the session named by
    /// // the request's Mcp-Session-Id is known to be open and the caller's:
    /// match server.answer_in_session(&request, &body, "the session id", Some("claude-code")).await {
    ///     Some(SessionAnswer::Json(json)) => { /* 200, Content-Type: application/json */ }
    ///     Some(SessionAnswer::Events(events)) => { /* 200, Content-Type: text/event-stream */ }
    ///     Some(_) | None => { /* hand the request on to rmcp */ }
    /// }
    /// # }
    /// ```
    pub async fn answer_in_session(
        &self,
        request: &http::request::Parts,
        body: &[u8],
        session: &str,
        client: Option<&str>,
    ) -> Option<SessionAnswer> {
        if !served_alone(request, body) {
            return None;
        }
        let Request {
            jsonrpc,
            id,
            method,
            mut params,
        } = serde_json::from_slice::<Request<'_>>(body).ok()?;
        if jsonrpc != "2.0" || method != "tools/call" {
            return None;
        }
        let meta = params.meta.take();
        let per_request_version = meta
            .as_ref()
            .is_some_and(|meta| meta.protocol_version().is_some());
        if per_request_version || params.input_responses.is_some() || params.request_state.is_some()
        {
            return None;
        }
        let token = meta.as_ref().and_then(|meta| meta.get_progress_token());
        // Progress the server makes itself (the chunks of a streamed answer) is sent through
        // rmcp's session.
        if token.is_some() && self.relay.is_none() {
            return None;
        }
        let asker = Asker {
            id: &id,
            principal: self.identity.principal(Some(request)),
            transport: Some(session),
            client,
        };
        let (mut call, route) =
            match self.admit(&mut params, RequestMeta::of_params(meta.as_ref()), asker) {
                Ok(admitted) => admitted,
                Err(refused) => return Some(SessionAnswer::Json(response(&id, &refused))),
            };
        // The user's confirmation is asked through rmcp's session.
        if route.as_ref().is_some_and(|route| route.confirm.is_some()) {
            return None;
        }
        let slot = match self.slot() {
            Ok(slot) => slot,
            Err(busy) => return Some(SessionAnswer::Json(response(&id, &busy))),
        };
        let pending = self.pending_entry(&mut call, None);
        let watched = self
            .relay
            .as_ref()
            .zip(token)
            .map(|(relay, token)| relay.watch(call.request_id().into(), token));
        let (watching, progress) = watched.unzip();
        let outcome = self.run(call, route.as_ref(), (pending, slot, watching));
        Some(match progress {
            None => SessionAnswer::Json(response(&id, &finished(outcome.await))),
            Some(progress) => answer_with_progress(id, outcome, progress).await,
        })
    }
}

/// The answer to the call `id` whose outcome is `outcome` and whose progress is `progress`:
/// the response alone when it comes first, else events from the first progress on.
async fn answer_with_progress(
    id: RequestId,
    outcome: impl Future<Output = Result<ToolOutput, ToolError>> + Send + 'static,
    mut progress: Latest,
) -> SessionAnswer {
    let mut outcome = Box::pin(outcome);
    let first = loop {
        tokio::select! {
            biased;
            done = &mut outcome => return SessionAnswer::Json(response(&id, &finished(done))),
            changed = progress.changed() => match changed {
                Ok(()) => match progress.borrow_and_update().as_ref().map(notification) {
                    Some(first) => break first,
                    None => continue,
                },
                // The call ended: its outcome is ready.
                Err(_) => return SessionAnswer::Json(response(&id, &finished(outcome.await))),
            },
        }
    };
    // The first progress, then each latest one until the response, which ends the stream.
    let state = Some((Some(first), outcome, progress));
    let events = futures_util::stream::unfold(state, move |state| {
        let id = id.clone();
        async move {
            let (first, mut outcome, mut progress) = state?;
            if let Some(first) = first {
                return Some((first, Some((None, outcome, progress))));
            }
            loop {
                tokio::select! {
                    biased;
                    done = &mut outcome => return Some((event(&response(&id, &finished(done))), None)),
                    changed = progress.changed(), if progress.has_changed().is_ok() => {
                        if changed.is_err() {
                            continue;
                        }
                        let next = progress.borrow_and_update().as_ref().map(notification);
                        if let Some(next) = next {
                            return Some((next, Some((None, outcome, progress))));
                        }
                    }
                }
            }
        }
    });
    SessionAnswer::Events(Box::pin(events))
}

/// The result of a call that ended with `outcome`.
fn finished(outcome: Result<ToolOutput, ToolError>) -> CallToolResult {
    result_of(outcome.map_err(in_mcp_words))
}

/// The JSON-RPC response to the request `id` with `result`.
fn response(id: &RequestId, result: &CallToolResult) -> Bytes {
    let response = Response {
        jsonrpc: "2.0",
        id,
        result,
    };
    // A result is JSON values and strings: it always encodes.
    Bytes::from(serde_json::to_vec(&response).unwrap_or_default())
}

/// The server-sent event of `params`, a progress notification.
fn notification(params: &ProgressNotificationParam) -> Bytes {
    let progress = Progress {
        jsonrpc: "2.0",
        method: "notifications/progress",
        params,
    };
    event(&serde_json::to_vec(&progress).unwrap_or_default())
}

/// `message` (one JSON-RPC message) as a server-sent event.
fn event(message: &[u8]) -> Bytes {
    let mut event = Vec::with_capacity(message.len() + 24);
    event.extend_from_slice(b"event: message\ndata: ");
    event.extend_from_slice(message);
    event.extend_from_slice(b"\n\n");
    Bytes::from(event)
}

/// Whether the HTTP request is one rmcp would serve in a session, as far as its head and a
/// glance at its body say: a `POST` of JSON naming `tools/call` (a search, no parse), from a
/// client that accepts JSON and an event stream, in a protocol version with sessions.
fn served_alone(request: &http::request::Parts, body: &[u8]) -> bool {
    if request.method != http::Method::POST
        || memchr::memmem::find(body, b"\"tools/call\"").is_none()
    {
        return false;
    }
    let headers = &request.headers;
    let is_json = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| essence(value).eq_ignore_ascii_case(JSON));
    let (mut accepts_json, mut accepts_stream) = (false, false);
    for value in headers.get_all(http::header::ACCEPT) {
        for media in value.to_str().unwrap_or_default().split(',') {
            let media = essence(media);
            accepts_json |= media.eq_ignore_ascii_case(JSON);
            accepts_stream |= media.eq_ignore_ascii_case("text/event-stream");
        }
    }
    let with_sessions = match headers.get("mcp-protocol-version") {
        None => true,
        Some(version) => version.to_str().is_ok_and(|version| {
            version < ProtocolVersion::NO_INITIALIZE.as_str()
                && ProtocolVersion::KNOWN_VERSIONS
                    .iter()
                    .any(|known| known.as_str() == version)
        }),
    };
    is_json && accepts_json && accepts_stream && with_sessions
}

/// A media type without its parameters.
fn essence(media: &str) -> &str {
    media.split(';').next().unwrap_or_default().trim()
}
