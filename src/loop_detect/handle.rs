use std::sync::Arc;

use super::command::{CommandError, LoopCommand};
use super::config::{LoopSettingKey, LoopSettings};
use super::service::Monitor;
use crate::error::ConfigError;

/// Run-time control of a [`LoopDetectLayer`](super::LoopDetectLayer): the session tier of
/// settings, and what the layer tracks.
///
/// Made by [`LoopDetectLayer::handle`](super::LoopDetectLayer::handle); clones share the
/// layer's state.
///
/// ```
/// use tower_toolcall::loop_detect::{LoopDetectLayer, LoopSettings};
/// use tower_toolcall::registry::ToolRegistry;
///
/// let layer = LoopDetectLayer::new(ToolRegistry::open());
/// let handle = layer.handle();
///
/// // A user typed a command in the chat of session `sess-42`.
/// handle.apply_command("sess-42", "!/set(tool-loop-max-repeats=6)")?;
/// assert_eq!(handle.session_settings("sess-42").max_repeats, Some(6));
///
/// handle.apply_command("sess-42", "!/unset(tool-loop-max-repeats)")?;
/// assert!(handle.session_settings("sess-42").is_empty());
/// # Ok::<(), tower_toolcall::loop_detect::CommandError>(())
/// ```
#[derive(Clone, Debug)]
pub struct LoopDetectHandle {
    monitor: Arc<Monitor>,
}

impl LoopDetectHandle {
    pub(super) fn new(monitor: Arc<Monitor>) -> Self {
        LoopDetectHandle { monitor }
    }

    /// Sets the given settings for `session`; the session's other settings stay. Switching
    /// detection off drops what the session's history held.
    pub fn set(&self, session: &str, settings: LoopSettings) -> Result<(), ConfigError> {
        settings.check()?;
        self.set_checked(session, settings);
        Ok(())
    }

    fn set_checked(&self, session: &str, settings: LoopSettings) {
        self.monitor
            .tiers
            .sessions
            .update(session, |current| current.merged(settings));
        if settings.enabled == Some(false) {
            self.monitor.forget_history(session);
        }
    }

    /// Removes `keys` from `session`'s settings, so that the next tier decides them.
    pub fn unset(&self, session: &str, keys: &[LoopSettingKey]) {
        self.monitor.tiers.sessions.update(session, |current| {
            keys.iter().fold(current, |s, k| s.without(*k))
        });
    }

    /// Applies a parsed command to `session`'s settings.
    pub fn apply(&self, session: &str, command: &LoopCommand) -> Result<(), ConfigError> {
        match command {
            LoopCommand::Set(settings) => self.set(session, *settings),
            LoopCommand::Unset(keys) => {
                self.unset(session, keys);
                Ok(())
            }
        }
    }

    /// Parses an in-chat command (see [`LoopCommand::parse`]) and applies it to `session`.
    /// Returns the command, or what is wrong with it; a wrong command changes nothing.
    pub fn apply_command(&self, session: &str, text: &str) -> Result<LoopCommand, CommandError> {
        let command = LoopCommand::parse(text)?;
        // The parser checks every value, as `set` would.
        match &command {
            LoopCommand::Set(settings) => self.set_checked(session, *settings),
            LoopCommand::Unset(keys) => self.unset(session, keys),
        }
        Ok(command)
    }

    /// `session`'s own settings (empty when it has none).
    pub fn session_settings(&self, session: &str) -> LoopSettings {
        self.monitor.tiers.sessions.get(session).unwrap_or_default()
    }

    /// Clears `session`'s history, so that its next call starts counting afresh; its
    /// settings stay.
    pub fn reset_session(&self, session: &str) {
        self.monitor.forget_history(session);
    }

    /// Forgets `session` entirely: its history and its settings.
    pub fn forget_session(&self, session: &str) {
        self.monitor
            .tiers
            .sessions
            .update(session, |_| LoopSettings::default());
        self.monitor.forget_history(session);
    }

    /// How many sessions have a history.
    pub fn tracked_sessions(&self) -> usize {
        self.monitor.tracker.len()
    }

    /// How many sessions were evicted, least recently used first, to stay within
    /// [`max_sessions`](super::LoopDetectLayerBuilder::max_sessions).
    pub fn evicted_sessions(&self) -> u64 {
        self.monitor.tracker.evicted()
    }

    /// Replaces `session`'s settings, whole (checked by the caller).
    #[cfg(feature = "redis")]
    pub(crate) fn replace_session_settings(&self, session: &str, settings: LoopSettings) {
        self.monitor.tiers.sessions.update(session, |_| settings);
        if settings.enabled == Some(false) {
            self.monitor.tracker.remove(session);
        }
    }

    /// Clears `session`'s history in this process only.
    #[cfg(feature = "redis")]
    pub(crate) fn reset_local_session(&self, session: &str) {
        self.monitor.tracker.remove(session);
    }

    /// Clears `session`'s history in the shared store, if the layer uses one.
    #[cfg(feature = "redis")]
    pub(crate) async fn forget_shared_session(
        &self,
        session: &str,
    ) -> Result<(), crate::shared_store::SharedStoreError> {
        match &self.monitor.store {
            Some(store) => store.forget(session).await,
            None => Ok(()),
        }
    }

    /// How the layer's shared store has fared: always available without one.
    pub fn store_health(&self) -> crate::shared_store::StoreHealth {
        self.monitor.outages.health()
    }

    /// How many sessions have settings of their own.
    pub fn sessions_with_settings(&self) -> usize {
        self.monitor.tiers.sessions.len()
    }
}
