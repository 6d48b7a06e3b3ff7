use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use super::command::{CommandError, LoopCommand};
use super::config::LoopSettingKey;
use super::service::Monitor;
use crate::error::ConfigError;
use crate::registry::LoopDetectSettings;
use crate::shared_store::StoreError;

/// Run-time control of a [`LoopDetectLayer`](super::LoopDetectLayer): the session tier of
/// settings, and what the layer tracks.
///
/// Made by [`LoopDetectLayer::handle`](super::LoopDetectLayer::handle); clones share the
/// layer's state.
///
/// ```
/// use tower_toolcall::loop_detect::{LoopDetectLayer, LoopDetectSettings};
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
/// assert_eq!(handle.session_settings("sess-42"), LoopDetectSettings::default());
///
/// // A session sets the six settings the commands name, and no other.
/// let mut settings = LoopDetectSettings::default();
/// settings.max_failures = Some(3);
/// handle.set("sess-42", settings.clone()).unwrap();
/// settings.max_sessions = Some(10);
/// assert_eq!(handle.set("sess-42", settings).unwrap_err().field(), "max_sessions");
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
    /// detection off drops what the session's history held. A session sets only the six
    /// settings [`LoopSettingKey`] names; another one is refused, and the error names it.
    ///
    /// With a shared store, the settings are kept there with the session's history, and
    /// every replica reads them on the session's next call: await the answer to know when
    /// they are written (they are written even if it is dropped).
    pub fn set(
        &self,
        session: &str,
        settings: LoopDetectSettings,
    ) -> Result<StoreWrite, ConfigError> {
        settings.check_session()?;
        Ok(self.change(session, settings, &[]))
    }

    /// Removes `keys` from `session`'s settings, so that the next tier decides them; in the
    /// shared store too, as [`set`](Self::set) does.
    pub fn unset(&self, session: &str, keys: &[LoopSettingKey]) -> StoreWrite {
        self.change(session, LoopDetectSettings::default(), keys)
    }

    /// Applies a parsed command to `session`'s settings, as [`set`](Self::set) and
    /// [`unset`](Self::unset) do.
    pub fn apply(&self, session: &str, command: &LoopCommand) -> Result<StoreWrite, ConfigError> {
        if let LoopCommand::Set(settings) = command {
            settings.check_session()?;
        }
        Ok(self.apply_checked(session, command))
    }

    /// Parses an in-chat command (see [`LoopCommand::parse`]) and applies it to `session`.
    /// Returns the command, or what is wrong with it; a wrong command changes nothing. With
    /// a shared store, the settings are written there in the background; use
    /// [`apply`](Self::apply) to await the write.
    pub fn apply_command(&self, session: &str, text: &str) -> Result<LoopCommand, CommandError> {
        let command = LoopCommand::parse(text)?;
        // The parser checks every value, as `set` would.
        self.apply_checked(session, &command);
        Ok(command)
    }

    /// Applies a checked command here and, with a shared store, there.
    fn apply_checked(&self, session: &str, command: &LoopCommand) -> StoreWrite {
        match command {
            LoopCommand::Set(settings) => self.change(session, settings.clone(), &[]),
            LoopCommand::Unset(keys) => self.change(session, LoopDetectSettings::default(), keys),
        }
    }

    /// Sets `set` and removes `unset` in `session`'s settings.
    fn change(
        &self,
        session: &str,
        set: LoopDetectSettings,
        unset: &[LoopSettingKey],
    ) -> StoreWrite {
        let off = set.enabled == Some(false);
        if let Some(store) = &self.monitor.store {
            self.monitor
                .tiers
                .sessions
                .change(session, set.clone(), unset);
            // The store drops the history itself when detection is switched off.
            self.monitor.tracker.remove(session);
            let window = self.monitor.tiers.server_ttl();
            return StoreWrite::spawn(store.change_settings(session, set, unset, window));
        }
        self.monitor.tiers.sessions.change(session, set, unset);
        if off {
            self.monitor.tracker.remove(session);
        }
        StoreWrite::done()
    }

    /// `session`'s own settings (empty when it has none). With a shared store, they are
    /// those this replica last read or wrote.
    pub fn session_settings(&self, session: &str) -> LoopDetectSettings {
        self.monitor.tiers.sessions.get(session).unwrap_or_default()
    }

    /// Clears `session`'s history, so that its next call starts counting afresh; its
    /// settings stay. With a shared store, the history there is cleared too: await the
    /// answer to know when it is done (it is done even if the answer is dropped).
    ///
    /// ```
    /// use tower_toolcall::loop_detect::LoopDetectLayer;
    /// use tower_toolcall::registry::ToolRegistry;
    ///
    /// # tokio_test::block_on(async {
    /// let handle = LoopDetectLayer::new(ToolRegistry::open()).handle();
    /// handle.reset_session("sess-42").await?;
    /// # Ok::<(), tower_toolcall::shared_store::StoreError>(())
    /// # }).unwrap();
    /// ```
    pub fn reset_session(&self, session: &str) -> StoreWrite {
        self.monitor.forget_history(session)
    }

    /// Forgets `session` entirely: its history and its settings, here and in the shared
    /// store, as [`reset_session`](Self::reset_session) does.
    pub fn forget_session(&self, session: &str) -> StoreWrite {
        self.monitor.tiers.sessions.clear(session);
        self.monitor.tracker.remove(session);
        if let Some(store) = &self.monitor.store {
            return StoreWrite::spawn(store.forget(session));
        }
        StoreWrite::done()
    }

    /// How many sessions have a history.
    pub fn tracked_sessions(&self) -> usize {
        self.monitor.tracker.len()
    }

    /// How many sessions were evicted, least recently used first, to stay within
    /// [`max_sessions`](LoopDetectSettings::max_sessions).
    pub fn evicted_sessions(&self) -> u64 {
        self.monitor.tracker.evicted()
    }

    /// Whether the sessions' histories and settings are in a shared
    /// [`LoopStore`](super::LoopStore), where every replica reads them.
    pub fn shares_sessions(&self) -> bool {
        self.monitor.store.is_some()
    }

    /// Clears `session`'s history in this process only, leaving the shared store alone: for
    /// a replica told that the session was reset through another one, which cleared the
    /// shared history already.
    pub fn reset_local_session(&self, session: &str) {
        self.monitor.tracker.remove(session);
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

/// A change to a session that the loop layer's shared store is making, if the layer has
/// one: a future that answers when the store has made it. The change goes on whether or not
/// it is awaited; without a shared store it is done already.
pub struct StoreWrite {
    write: Option<Write>,
}

/// A write on its way.
type Write = Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send>>;

impl StoreWrite {
    pub(super) fn done() -> Self {
        StoreWrite { write: None }
    }

    /// Starts `write` at once, in the background when a Tokio runtime runs.
    pub(super) fn spawn(
        write: impl Future<Output = Result<(), StoreError>> + Send + 'static,
    ) -> Self {
        let write: Write = match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let task = runtime.spawn(async move {
                        let written = write.await;
                        if let Err(error) = &written {
                            tracing::warn!(%error, "a session could not be changed in the shared loop store");
                        }
                        written
                    });
                Box::pin(async move {
                    task.await
                        .unwrap_or_else(|error| Err(StoreError::Unavailable(error.to_string())))
                })
            }
            Err(_) => {
                tracing::warn!(
                    "a session could not be changed in the shared loop store: no Tokio runtime"
                );
                Box::pin(std::future::ready(Err(StoreError::Unavailable(
                    "no Tokio runtime runs".to_owned(),
                ))))
            }
        };
        StoreWrite { write: Some(write) }
    }
}

impl Future for StoreWrite {
    type Output = Result<(), StoreError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.write {
            Some(write) => write.as_mut().poll(cx),
            None => Poll::Ready(Ok(())),
        }
    }
}

impl fmt::Debug for StoreWrite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreWrite")
            .field("done", &self.write.is_none())
            .finish()
    }
}
