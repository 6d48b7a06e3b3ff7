//! Which calls the idempotency layer answers from its record: those re-send an earlier call,
//! and loop detection (in front of it) never counts them as repeats. Both layers meet here.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::envelope::ToolCall;

/// How the idempotency layer answers a re-send of a call from its record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ResendKey {
    /// The call carries a key from its caller or a hook: the record is kept under it.
    Given {
        key: Arc<str>,
        /// How long a finished call's record answers.
        settled_for: Option<Duration>,
    },
    /// The key is derived from the tool, the canonical params, the session and (in session
    /// scope) the actor.
    Derived {
        with_actor: bool,
        /// How long a finished call's record answers; `None`: only while the call runs.
        settled_for: Option<Duration>,
    },
}

/// The idempotency layer, as the loop layer in front of it asks it: which record would
/// answer a re-send of a call. Answers without touching the store.
pub(crate) trait ResendSource: Send + Sync + 'static {
    /// `None` when no record answers a re-send of `call` (the layer is off for it, or the
    /// call has no key).
    fn resend_key(&self, call: &ToolCall) -> Option<ResendKey>;
}

/// A [`ResendSource`] the loop layer keeps.
#[derive(Clone)]
pub(crate) struct Resends(pub(crate) Arc<dyn ResendSource>);

impl fmt::Debug for Resends {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Resends(idempotency layer)")
    }
}
