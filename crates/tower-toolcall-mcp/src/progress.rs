//! Progress notifications as `tool_call_progress` events of the calls they report on, on
//! both sides: what a server's tools send, and what a client receives; and, in a proxy, the
//! progress of a call relayed from the server behind it to the client in front.

use std::future::Future;
use std::sync::Arc;

use rmcp::model::{
    JsonRpcMessage, NumberOrString, ProgressNotificationParam, ProgressToken, ServerNotification,
};
use rmcp::service::{Peer, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::RoleServer;

use super::in_flight::{Entry, InFlight};

/// The request ids of the calls in flight, by the progress token of their request.
pub(crate) type ProgressCalls = InFlight<ProgressToken, Arc<str>>;

/// Where the progress of a proxy's calls goes on: from the MCP server behind it
/// ([`McpClient::relay_progress`](crate::McpClient::relay_progress)) to the client in front
/// ([`McpServer::relay_progress`](crate::McpServer::relay_progress)), under the progress
/// token of the client's request. Clones share it; give the same relay to both ends.
///
/// A call is relayed while it runs, by its request id, which the stack keeps from the
/// server's `tools/call` to the client's: a client whose request carries
/// `_meta.progressToken` gets the `notifications/progress` the upstream server sends for
/// that call, retries included. A duplicate that joins another call's run gets none.
///
/// Progress is lossy by nature, and relayed so: each call holds only the latest
/// notification not yet sent, and one task per call sends it, so that a client that does not
/// read gets the latest, not all, and costs no more than one notification per call. The
/// task ends with the call: no progress arrives after the call's answer.
///
/// ```no_run
/// use tower::Layer;
/// use tower_toolcall::ToolStack;
/// use tower_toolcall_mcp::{McpClient, McpServer, ProgressRelay, Trust};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let relay = ProgressRelay::default();
/// let upstream = McpClient::spawn("files", || tokio::process::Command::new("files-mcp"))
///     .await?
///     .relay_progress(&relay);
/// let stack = ToolStack::builder(upstream.registry("files", Trust::Trusted, None).await?).build()?;
/// let tools = upstream.tools().await?;
/// let server = McpServer::over("files", stack.layer(upstream), tools).relay_progress(&relay);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, Default)]
pub struct ProgressRelay(InFlight<Arc<str>, Relayed>);

/// Where a call's progress goes: the latest notification not yet sent, under the token the
/// client asked for, and the task that sends it, which ends with the last clone.
#[derive(Clone, Debug)]
pub(crate) struct Relayed {
    latest: Arc<tokio::sync::watch::Sender<Option<ProgressNotificationParam>>>,
    token: ProgressToken,
    /// The task that sends it to an rmcp peer; none when the call's answer carries it.
    _sending: Option<Arc<Sending>>,
}

/// The latest progress of a call not yet sent, as a receiver of its own reads it.
pub(crate) type Latest = tokio::sync::watch::Receiver<Option<ProgressNotificationParam>>;

/// The task that sends a call's progress; ended when dropped.
#[derive(Debug)]
struct Sending(tokio::task::AbortHandle);

impl Drop for Sending {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl ProgressRelay {
    /// Relays the progress of the call `request_id` to `peer` under `token`, until the entry
    /// is dropped.
    pub(crate) fn insert(
        &self,
        request_id: Arc<str>,
        peer: Peer<RoleServer>,
        token: ProgressToken,
    ) -> Entry<Arc<str>, Relayed> {
        let (latest, mut next) = tokio::sync::watch::channel(None::<ProgressNotificationParam>);
        let sending = tokio::spawn(async move {
            while next.changed().await.is_ok() {
                let Some(progress) = next.borrow_and_update().clone() else {
                    continue;
                };
                if let Err(error) = peer.notify_progress(progress).await {
                    tracing::debug!(%error, "a progress notification could not be relayed");
                    return;
                }
            }
        });
        let relayed = Relayed {
            latest: Arc::new(latest),
            token,
            _sending: Some(Arc::new(Sending(sending.abort_handle()))),
        };
        self.0.insert(request_id, relayed)
    }

    /// Keeps the latest progress of the call `request_id`, under `token`, for the receiver
    /// it returns, until the entry is dropped (the receiver then sees the sender closed).
    pub(crate) fn watch(
        &self,
        request_id: Arc<str>,
        token: ProgressToken,
    ) -> (Entry<Arc<str>, Relayed>, Latest) {
        let (latest, next) = tokio::sync::watch::channel(None::<ProgressNotificationParam>);
        let relayed = Relayed {
            latest: Arc::new(latest),
            token,
            _sending: None,
        };
        (self.0.insert(request_id, relayed), next)
    }

    /// Where the progress of the call `request_id` goes, while it runs.
    pub(crate) fn get(&self, request_id: &str) -> Option<Relayed> {
        self.0.get(request_id)
    }
}

impl Relayed {
    /// Hands `params` to the call's sending task, under the client's own token, in place of
    /// any not yet sent: never waits on the client.
    pub(crate) fn send(&self, params: &ProgressNotificationParam) {
        let mut relayed = params.clone();
        relayed.progress_token = self.token.clone();
        self.latest.send_replace(Some(relayed));
    }
}

/// Logs `params` as a DEBUG `tool_call_progress` event: `requestId` (the call's, when known;
/// else the progress token), `progress` and `total`. Not its message, which a chatty tool
/// can make long and many.
pub(crate) fn log_progress(call: Option<&str>, params: &ProgressNotificationParam) {
    if !tracing::enabled!(tracing::Level::DEBUG) {
        return;
    }
    let request_id = match (call, &params.progress_token.0) {
        (Some(id), _) => id.to_string(),
        (None, NumberOrString::String(token)) => token.to_string(),
        (None, NumberOrString::Number(token)) => token.to_string(),
    };
    tracing::debug!(
        event = "tool_call_progress",
        requestId = %request_id,
        progress = params.progress,
        total = params.total,
        "tool call progress"
    );
}

/// A server's transport that logs the progress notifications it sends for the calls of
/// `calls`, then sends them on.
pub(crate) struct ProgressTransport<T> {
    pub(crate) inner: T,
    pub(crate) calls: ProgressCalls,
}

impl<T: Transport<RoleServer>> Transport<RoleServer> for ProgressTransport<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        if let JsonRpcMessage::Notification(sent) = &item {
            if let ServerNotification::ProgressNotification(progress) = &sent.notification {
                if let Some(call) = self.calls.get(&progress.params.progress_token) {
                    log_progress(Some(&call), &progress.params);
                }
            }
        }
        self.inner.send(item)
    }

    fn receive(&mut self) -> impl Future<Output = Option<RxJsonRpcMessage<RoleServer>>> + Send {
        self.inner.receive()
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}
