//! Progress notifications as `tool_call_progress` events of the calls they report on, on
//! both sides: what a server's tools send, and what a client receives.

use std::future::Future;
use std::sync::Arc;

use rmcp::model::{
    JsonRpcMessage, NumberOrString, ProgressNotificationParam, ProgressToken, ServerNotification,
};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::RoleServer;

use super::in_flight::InFlight;

/// The request ids of the calls in flight, by the progress token of their request.
pub(crate) type ProgressCalls = InFlight<ProgressToken, Arc<str>>;

/// Logs `params` as a `tool_call_progress` event: `requestId` (the call's, when known; else
/// the progress token), `progress`, `total` and `message`.
pub(crate) fn log_progress(call: Option<&str>, params: &ProgressNotificationParam) {
    let request_id = match (call, &params.progress_token.0) {
        (Some(id), _) => id.to_string(),
        (None, NumberOrString::String(token)) => token.to_string(),
        (None, NumberOrString::Number(token)) => token.to_string(),
    };
    tracing::info!(
        event = "tool_call_progress",
        requestId = %request_id,
        progress = params.progress,
        total = params.total,
        message = params.message.as_deref(),
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
