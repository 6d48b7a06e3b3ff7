//! Confirmation at the MCP edge: a call of a tool that needs the user's confirmation is
//! confirmed by the user, asked through MCP elicitation, or by the host.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, ElicitRequest, ElicitRequestParams, ElicitResult, ElicitationAction,
    ElicitationSchema, InputRequest, InputRequiredResult, ProtocolVersion,
};
use rmcp::service::RequestContext;
use rmcp::RoleServer;
use tokio::time::Instant;
use tower_toolcall::trace::Redactor;
use tower_toolcall::{ErrorCode, ToolCall, ToolError};

/// How long the user has to answer a confirmation unless the server says otherwise.
pub const DEFAULT_CONFIRMATION_TIMEOUT: Duration = Duration::from_secs(120);

/// The most confirmations a server waits for at once under 2026-07-28 (each a client's
/// `requestState` to come back).
const MAX_ASKED: usize = 10_000;

/// The longest text of the arguments shown to the user.
const MAX_SHOWN_ARGUMENTS: usize = 1_000;

/// The member of `inputRequests` (and `inputResponses`) that carries the confirmation.
const INPUT_KEY: &str = "confirm";

/// How a call of a tool that needs the user's confirmation gets it at the MCP edge (see
/// [`ToolList::confirm_by`](crate::ToolList::confirm_by)).
///
/// Whatever the mode, a confirmation id a client puts in `_meta.confirmationId` is not
/// believed for such a tool: the confirmation comes from the user or the host, as set here.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Confirm {
    /// The server asks the user through MCP elicitation: an `elicitation/create` request
    /// (2025-06-18 and 2025-11-25), or an `input_required` result whose `inputRequests`
    /// carry it (2026-07-28). Accept runs the call once, its id recorded in the call's
    /// `control.confirmationId` (`elicitation:<id>`); decline, cancel or no answer in time
    /// refuses it (`POLICY_DENIED`). A client that did not declare the `elicitation`
    /// capability cannot ask its user: its call is refused, saying so.
    #[default]
    Elicit,
    /// The host asks its user before each call (as desktop hosts do): the call passes, its
    /// `control.confirmationId` is `host`.
    Host,
}

/// The outcome of a confirmation.
pub(crate) enum Confirmed {
    /// Confirmed: the id to put in the call's `control.confirmationId`.
    Yes(String),
    /// The client is to ask its user and send the call again with the answer (2026-07-28).
    Ask(InputRequiredResult),
    /// Refused: the user declined, did not answer, or cannot be asked.
    No(ToolError),
}

/// The confirmations a server asks for, shared by its connections: under 2026-07-28 each
/// is kept, by the request state handed to the client, until the client sends the call
/// again with the user's answer or its time runs out.
#[derive(Clone, Debug)]
pub(crate) struct Confirmations {
    asked: Arc<Mutex<HashMap<String, Asked>>>,
    pub(crate) timeout: Duration,
}

impl Default for Confirmations {
    fn default() -> Self {
        Confirmations {
            asked: Arc::default(),
            timeout: DEFAULT_CONFIRMATION_TIMEOUT,
        }
    }
}

/// A confirmation asked under 2026-07-28: which call it is for, and until when.
#[derive(Debug)]
struct Asked {
    binding: String,
    until: Instant,
}

impl Confirmations {
    /// Confirms `call` (the listed tool `request.name`) as `mode` says.
    pub(crate) async fn confirm(
        &self,
        mode: Confirm,
        call: &ToolCall,
        request: &CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Confirmed {
        let name = request.name.as_ref();
        match mode {
            Confirm::Host => Confirmed::Yes("host".to_owned()),
            Confirm::Elicit => {
                let capable = context.client_capabilities().is_some_and(|capabilities| {
                    match &capabilities.elicitation {
                        Some(elicitation) => {
                            elicitation.form.is_some() || elicitation.url.is_none()
                        }
                        None => false,
                    }
                });
                if !capable {
                    return Confirmed::No(cannot_ask(name));
                }
                let stateless = context
                    .protocol_version()
                    .is_some_and(|version| version >= ProtocolVersion::V_2026_07_28);
                if stateless {
                    self.ask_in_rounds(call, request)
                } else {
                    self.ask_now(call, request, context).await
                }
            }
        }
    }

    /// Asks the user with an `elicitation/create` request, and waits for the answer.
    async fn ask_now(
        &self,
        call: &ToolCall,
        request: &CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Confirmed {
        let name = request.name.as_ref();
        let asked = context
            .peer
            .create_elicitation_with_timeout(question(call, name), Some(self.timeout))
            .await;
        match asked {
            Ok(answer) => self.answered(call, name, &answer),
            Err(rmcp::ServiceError::Timeout { .. }) => {
                Confirmed::No(unanswered(name, self.timeout))
            }
            Err(error) => {
                tracing::info!(
                    event = "tool_call_unconfirmed",
                    requestId = call.request_id(),
                    %error,
                    "the confirmation could not be asked"
                );
                Confirmed::No(unanswered(name, self.timeout))
            }
        }
    }

    /// Under 2026-07-28: the user's answer when the call carries it (its `requestState` one
    /// this server handed out for this very call), else an `input_required` result asking
    /// for it.
    fn ask_in_rounds(&self, call: &ToolCall, request: &CallToolRequestParams) -> Confirmed {
        let name = request.name.as_ref();
        let binding = match call.call_digest() {
            Ok(binding) => binding,
            Err(error) => return Confirmed::No(error),
        };
        let now = Instant::now();
        let mut asked = self.asked.lock().unwrap_or_else(PoisonError::into_inner);
        asked.retain(|_, a| a.until > now);
        if let Some(state) = &request.request_state {
            let answer = request
                .input_responses
                .as_ref()
                .and_then(|responses| responses.get(INPUT_KEY))
                .and_then(|answer| serde_json::from_value::<ElicitResult>(answer.clone()).ok());
            return match (asked.remove(state), answer) {
                (Some(a), Some(answer)) if a.binding == binding => {
                    drop(asked);
                    self.answered(call, name, &answer)
                }
                _ => Confirmed::No(ToolError::rejected(
                    ErrorCode::PolicyDenied,
                    format!(
                        "the confirmation of the call of {name} expired, was answered already, \
                         or was asked for another call; send the call again without \
                         `requestState`, and the user is asked again"
                    ),
                )),
            };
        }
        if asked.len() >= MAX_ASKED {
            return Confirmed::No(
                ToolError::new(
                    ErrorCode::RateLimited,
                    format!(
                        "too many confirmations are waiting for their users; send the call of \
                         {name} again later"
                    ),
                )
                .with_retry_after(Duration::from_secs(1)),
            );
        }
        let state = ulid::Ulid::generate().to_string();
        asked.insert(
            state.clone(),
            Asked {
                binding,
                until: now + self.timeout,
            },
        );
        let input = InputRequest::Elicitation(ElicitRequest::new(question(call, name)));
        Confirmed::Ask(InputRequiredResult::new(
            Some([(INPUT_KEY.to_owned(), input)].into_iter().collect()),
            Some(state),
        ))
    }

    fn answered(&self, call: &ToolCall, name: &str, answer: &ElicitResult) -> Confirmed {
        let confirmed = matches!(answer.action, ElicitationAction::Accept);
        tracing::info!(
            event = if confirmed {
                "tool_call_confirmed"
            } else {
                "tool_call_declined"
            },
            requestId = call.request_id(),
            toolName = name,
            by = "elicitation",
        );
        if confirmed {
            Confirmed::Yes(format!("elicitation:{}", ulid::Ulid::generate()))
        } else {
            Confirmed::No(ToolError::rejected(
                ErrorCode::PolicyDenied,
                format!(
                    "the user declined the call of {name}; do not send it again unless the user \
                     asks for it"
                ),
            ))
        }
    }
}

/// The question put to the user: the server, the tool and its arguments (secrets redacted),
/// to accept or decline.
fn question(call: &ToolCall, name: &str) -> ElicitRequestParams {
    let arguments = Redactor::default().redact_value(call.params().as_value());
    let mut shown = serde_json::to_string_pretty(&arguments).unwrap_or_default();
    if shown.len() > MAX_SHOWN_ARGUMENTS {
        let mut end = MAX_SHOWN_ARGUMENTS;
        while !shown.is_char_boundary(end) {
            end -= 1;
        }
        shown.truncate(end);
        shown.push_str("\n…");
    }
    ElicitRequestParams::FormElicitationParams {
        meta: None,
        message: format!(
            "Allow the tool {name} (server {}) to run with these arguments?\n{shown}",
            call.tool_namespace()
        ),
        requested_schema: ElicitationSchema::new(Default::default()),
    }
}

/// The refusal of a client that cannot ask its user.
fn cannot_ask(name: &str) -> ToolError {
    ToolError::rejected(
        ErrorCode::PolicyDenied,
        format!(
            "the tool {name} needs the user's confirmation, and this client cannot ask its user \
             (it did not declare MCP's elicitation capability); tell the user, whose operator \
             can let the host confirm such calls itself with confirm = \"host\" for this server"
        ),
    )
}

/// The refusal of a call whose confirmation was not answered in time.
fn unanswered(name: &str, timeout: Duration) -> ToolError {
    ToolError::rejected(
        ErrorCode::PolicyDenied,
        format!(
            "the user did not confirm the call of {name} within {} s; it did not run. Send it \
             again when the user is there to confirm it",
            timeout.as_secs()
        ),
    )
}
