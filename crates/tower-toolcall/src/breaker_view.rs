//! The breakers as the retry layer outside them asks them: whether a call that is not
//! needed (a hedge) may go now, which it may not while the breaker over it is not closed.
//! Both layers meet here.

use std::fmt;
use std::sync::Arc;

use crate::envelope::ToolCall;

/// The breaker layer, as the retry layer asks it.
pub(crate) trait BreakerView: Send + Sync + 'static {
    /// Whether the breaker that would guard `call` is closed (or not made yet, or off for
    /// its tool), and no operator holds its scope open.
    fn closed_for(&self, call: &ToolCall) -> bool;
}

/// A [`BreakerView`] the retry layer keeps.
#[derive(Clone)]
pub(crate) struct Breakers(pub(crate) Arc<dyn BreakerView>);

impl fmt::Debug for Breakers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Breakers")
    }
}
