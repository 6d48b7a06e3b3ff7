//! Confirmation ids the router issues itself: a call that needs the user's confirmation is
//! refused with an id bound to that very call, and only that id lets the call through.

use std::time::Duration;

use serde_json::{json, Value};
use tokio::time::Instant;
use tower_toolcall::envelope::{ResultError, ToolCall};
use tower_toolcall::validate::CONFIRMATION_REQUIRED;
use tower_toolcall::{ErrorCode, ToolError};

/// How long an issued confirmation id is good for by default: 5 minutes.
pub const DEFAULT_CONFIRMATION_TTL: Duration = Duration::from_secs(300);

/// The most confirmation ids waiting to be used at once; the oldest go first.
const MAX_ISSUED: usize = 10_000;

/// The confirmation ids a router issued and not yet used, each bound to its call.
#[derive(Clone)]
pub(crate) struct IssuedConfirmations {
    issued: std::sync::Arc<quick_cache::sync::Cache<String, Issued>>,
    ttl: Duration,
}

/// What an id was issued for, until when, and, once used, the caller's idempotency key of
/// the call that used it.
#[derive(Clone)]
struct Issued {
    binding: String,
    until: Instant,
    used_with: Option<Option<String>>,
}

impl IssuedConfirmations {
    pub(crate) fn new(ttl: Duration) -> Self {
        IssuedConfirmations {
            issued: std::sync::Arc::new(quick_cache::sync::Cache::new(MAX_ISSUED)),
            ttl,
        }
    }

    /// Lets `call` through when its `control.confirmationId` is one this router issued for
    /// it (the same caller, tool and canonical arguments), within its time. The id works
    /// once: after that, only a re-send of the call that used it, with the same
    /// idempotency key (which the stack answers from that call's record), gets through. A
    /// call without an id passes here (the stack refuses it if its tool needs one).
    pub(crate) fn redeem(&self, call: &ToolCall) -> Result<(), ToolError> {
        let Some(id) = call.control().confirmation_id.as_deref() else {
            return Ok(());
        };
        let key = call.idempotency_key().map(str::to_owned);
        let issued = self.issued.get(id);
        // The call's digest is made only for an id this router issued.
        let fits = issued.as_ref().is_some_and(|issued| {
            issued.until > Instant::now()
                && match &issued.used_with {
                    None => true,
                    Some(used_with) => key.is_some() && *used_with == key,
                }
                && call
                    .call_digest()
                    .is_ok_and(|binding| binding == issued.binding)
        });
        if fits {
            if let Some(mut issued) = issued.filter(|issued| issued.used_with.is_none()) {
                issued.used_with = Some(key);
                self.issued.insert(id.to_owned(), issued);
            }
            return Ok(());
        }
        Err(ToolError::rejected(
            ErrorCode::PolicyDenied,
            "control.confirmationId is not one this gateway issued for this call, or it expired \
             or was used; send the call without it, ask the user about the id its refusal \
             carries, and send the same call again with that id",
        ))
    }

    /// When `error` refuses `call` for want of the user's confirmation: a new id bound to the
    /// call, in its details (`confirmationId`, `expiresInMs`) and its message.
    pub(crate) fn issue_for(&self, call: &ToolCall, error: &mut ResultError) {
        let wanted = error.code == ErrorCode::PolicyDenied
            && error
                .details
                .as_ref()
                .and_then(|details| details.get("reason"))
                .and_then(Value::as_str)
                == Some(CONFIRMATION_REQUIRED);
        if !wanted {
            return;
        }
        let Ok(binding) = call.call_digest() else {
            return;
        };
        let id = format!("cf_{}", ulid::Ulid::generate());
        let until = Instant::now() + self.ttl;
        self.issued.insert(
            id.clone(),
            Issued {
                binding,
                until,
                used_with: None,
            },
        );
        let ms = crate::millis(self.ttl);
        error.message = format!(
            "{} needs the user's confirmation; ask the user, and if they agree send the same \
             call again within {} s with control.confirmationId = \"{id}\"",
            call.tool_name(),
            self.ttl.as_secs()
        );
        error.details = Some(json!({
            "reason": CONFIRMATION_REQUIRED,
            "confirmationId": id,
            "expiresInMs": ms,
        }));
    }
}
