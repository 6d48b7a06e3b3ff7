//! [`FleetControl`]: operator actions that reach every replica through Redis pub/sub.
//!
//! Behind a load balancer, an operator who force-opens a breaker, resets a loop session or
//! flips the kill switch through one replica's handle changes one replica out of N. A
//! [`FleetControl`] joined to each replica's stack makes those actions fleet-wide:
//!
//! | action | every replica then |
//! |---|---|
//! | [`force_open`](FleetControl::force_open) | holds the breaker open ([`BreakerAdmin::force_open`]) |
//! | [`reset_breaker`](FleetControl::reset_breaker) | closes it ([`BreakerAdmin::reset`]) |
//! | [`reset_session`](FleetControl::reset_session) | forgets the session's loop history |
//! | [`set_enabled`](FleetControl::set_enabled) | turns every layer on or off (the kill switch) |
//! | [`set_shadow`](FleetControl::set_shadow) | puts a layer in or out of shadow mode |
//!
//! A session's `!/set(tool-loop-…)` and `!/unset(…)` commands need no message: with a
//! `RedisLoopStore`, the store keeps a session's settings beside its history, and every
//! replica reads them on the session's next call
//! ([`apply_loop_command`](FleetControl::apply_loop_command) writes them there).
//!
//! Each action is one round trip: a Lua script records it in the fleet's state (the hash
//! `<prefix>{fleet}:switches`, the set `<prefix>{fleet}:forced`) and publishes it on
//! `<prefix>{fleet}:actions`, in one step. Every replica, the sender included, applies the
//! message as it arrives — one message, no polling. A replica that starts later, or whose
//! subscription was cut and restored, reads the switches: the kill switch, the shadowed
//! layers and the breakers held open (a breaker it holds open that the switches no longer
//! name is reset). A session reset is not a switch: it concerns the histories of that
//! moment only.
//!
//! Bad input is refused before anything is sent: nothing reaches the other replicas. A
//! malformed message on the channel (written by another tool) is counted in
//! [`FleetStats::refused`], logged, and changes nothing.
//!
//! # Breaker counting stays local
//!
//! Only the operator's actions are shared, not the breakers' counts. A breaker measures how
//! its replica's calls to a tool fare: one replica's network path or connection pool can
//! fail while others' work, and each replica should stop only what fails for it. Sharing the
//! counts would cost a round trip per call on the hottest path, and a Redis outage would
//! then blind every breaker at once, when they are most needed. A fleet-wide decision to
//! stop a tool is the operator's force-open, which this module shares.
//!
//! ```no_run
//! use tower_toolcall::breaker::BreakerKey;
//! use tower_toolcall::fleet::FleetControl;
//! use tower_toolcall::registry::ToolRegistry;
//! use tower_toolcall::ToolStack;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let stack = ToolStack::builder(ToolRegistry::open()).build()?;
//! let fleet = FleetControl::builder("redis://127.0.0.1:6379/").join(&stack)?;
//! fleet.sync().await?; // subscribed, and the fleet's current switches applied
//! fleet.force_open(&BreakerKey::tool("agents.tools.web", "search")).await?;
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::{PushInfo, PushKind, Script, Value};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::breaker::{BreakerAdmin, BreakerKey};
use crate::control::{ReliabilityControl, ShadowLayer};
use crate::error::{ConfigError, ErrorCode, ToolError};
use crate::idempotency::DedupeStore;
use crate::loop_detect::{LoopCommand, LoopDetectHandle};
use crate::redis_support::{self, bounded, hash_tagged, Connection, StoreSettings};
use crate::shared_store::SharedStoreError;
use crate::stack::ToolStack;
use crate::BreakerState;

/// The default prefix of the fleet's keys and channel.
pub const DEFAULT_FLEET_KEY_PREFIX: &str = "toolcall:fleet:";

/// How long the listener waits before it tries again to subscribe.
const RESUBSCRIBE_DELAY: Duration = Duration::from_secs(1);

/// Records an action in the fleet's state and publishes it, in one step. `KEYS[1]`: the
/// key the action changes. `ARGV`: channel, message, change (`hset`, `hdel`, `sadd`, `srem`
/// or `none`), field, value.
const ACT: &str = r"
local change = ARGV[3]
if change == 'hset' then
  redis.call('HSET', KEYS[1], ARGV[4], ARGV[5])
elseif change == 'hdel' then
  redis.call('HDEL', KEYS[1], ARGV[4])
elseif change == 'sadd' then
  redis.call('SADD', KEYS[1], ARGV[4])
elseif change == 'srem' then
  redis.call('SREM', KEYS[1], ARGV[4])
end
return redis.call('PUBLISH', ARGV[1], ARGV[2])
";

/// One operator action, as the channel carries it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case", deny_unknown_fields)]
enum Action {
    ForceOpen { breaker: String },
    ResetBreaker { breaker: String },
    ResetSession { session: String },
    SetEnabled { enabled: bool },
    SetShadow { layer: String, shadow: bool },
}

/// What a [`FleetControl`] has seen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FleetStats {
    /// Messages from the channel applied to this replica.
    pub applied: u64,
    /// Messages on the channel that were not understood, and changed nothing.
    pub refused: u64,
    /// Syncs with the fleet's switches: the first, and one after each resubscription.
    pub syncs: u64,
}

/// Operator actions shared by every replica of a fleet through Redis; made by
/// [`FleetControl::builder`]. See the [module docs](self). Clones share one subscription.
#[derive(Clone)]
pub struct FleetControl {
    inner: Arc<Inner>,
}

struct Inner {
    commands: Connection,
    subscriber: ConnectionManager,
    channel: String,
    switches_key: String,
    forced_key: String,
    act: Script,
    replica: Replica,
    applied: AtomicU64,
    refused: AtomicU64,
    syncs: AtomicU64,
    /// The channel is subscribed to.
    subscribed: AtomicBool,
    /// Taken by an action from its check to its local effect, and by a sync.
    serial: tokio::sync::Mutex<()>,
    /// The task that applies what the subscription hands over.
    listener: OnceLock<tokio::task::AbortHandle>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(listener) = self.listener.get() {
            listener.abort();
        }
    }
}

/// The parts of this replica's stack that actions change.
struct Replica {
    control: ReliabilityControl,
    breakers: Option<BreakerAdmin>,
    loops: Option<LoopDetectHandle>,
}

impl FleetControl {
    /// A builder for the fleet whose Redis is at `url` (e.g. `redis://127.0.0.1:6379/`).
    pub fn builder(url: impl Into<String>) -> FleetControlBuilder {
        FleetControlBuilder {
            settings: StoreSettings::new(url.into(), DEFAULT_FLEET_KEY_PREFIX),
        }
    }

    /// Holds the breaker `key` open on every replica until it is reset.
    pub async fn force_open(&self, key: &BreakerKey) -> Result<(), ToolError> {
        let breaker = key.short();
        self.act(Action::ForceOpen { breaker }).await
    }

    /// Closes the breaker `key` on every replica.
    pub async fn reset_breaker(&self, key: &BreakerKey) -> Result<(), ToolError> {
        let breaker = key.short();
        self.act(Action::ResetBreaker { breaker }).await
    }

    /// Forgets `session`'s loop history on every replica (and in the shared loop store, if
    /// the stack uses one); its settings stay.
    pub async fn reset_session(&self, session: &str) -> Result<(), ToolError> {
        let session = session.to_owned();
        self.act(Action::ResetSession { session }).await
    }

    /// Turns every layer of every replica on, or into a pass-through (the kill switch).
    pub async fn set_enabled(&self, enabled: bool) -> Result<(), ToolError> {
        self.act(Action::SetEnabled { enabled }).await
    }

    /// Puts `layer` in or out of shadow mode on every replica.
    pub async fn set_shadow(&self, layer: ShadowLayer, shadow: bool) -> Result<(), ToolError> {
        let layer = layer.as_str().to_owned();
        self.act(Action::SetShadow { layer, shadow }).await
    }

    /// Parses an in-chat loop-detection command (see [`LoopCommand::parse`]) and applies it
    /// to `session`'s settings in the shared loop store, where every replica reads them on
    /// the session's next call; done when it returns. A wrong command changes nothing
    /// anywhere. The stack's loop layer must keep its sessions in a `RedisLoopStore`.
    pub async fn apply_loop_command(
        &self,
        session: &str,
        text: &str,
    ) -> Result<LoopCommand, ToolError> {
        if session.is_empty() {
            return Err(invalid("session", "must not be empty"));
        }
        let command = LoopCommand::parse(text).map_err(|problem| invalid("command", problem))?;
        let loops = self.inner.replica.loops.as_ref().ok_or_else(|| {
            ToolError::rejected(
                ErrorCode::NotFound,
                "loop detection is off in this stack: there are no session settings to change",
            )
        })?;
        if !loops.shares_sessions() {
            return Err(ToolError::rejected(
                ErrorCode::NotFound,
                "the loop layer keeps its sessions in this process: give it a RedisLoopStore \
                 to share a session's settings with the fleet",
            ));
        }
        loops
            .apply_checked(session, &command)
            .await
            .map_err(unavailable)?;
        tracing::info!(session, command = ?command, "loop command written for the fleet");
        Ok(command)
    }

    /// Subscribes to the fleet's actions, if this replica is not yet, and applies the
    /// fleet's current switches. The replica does it by itself when it joins and after a
    /// reconnection; awaiting it says when it is done.
    pub async fn sync(&self) -> Result<(), ToolError> {
        self.inner.sync().await.map_err(unavailable)
    }

    /// What this replica has seen.
    pub fn stats(&self) -> FleetStats {
        FleetStats {
            applied: self.inner.applied.load(Ordering::Relaxed),
            refused: self.inner.refused.load(Ordering::Relaxed),
            syncs: self.inner.syncs.load(Ordering::Relaxed),
        }
    }

    /// Checks `action`, applies it here, records it and publishes it to the fleet.
    async fn act(&self, action: Action) -> Result<(), ToolError> {
        let inner = &self.inner;
        inner.replica.check(&action)?;
        // A sync reads the switches and compares them with this replica's breakers: never
        // while an action is between the server and this replica.
        let _serial = inner.serial.lock().await;
        if let Action::ResetSession { session } = &action {
            if let Some(loops) = &inner.replica.loops {
                loops.reset_session(session).await.map_err(unavailable)?;
            }
        }
        let (key, change, field, value) = match &action {
            Action::ForceOpen { breaker } => (&inner.forced_key, "sadd", breaker.clone(), None),
            Action::ResetBreaker { breaker } => (&inner.forced_key, "srem", breaker.clone(), None),
            Action::ResetSession { .. } => (&inner.switches_key, "none", String::new(), None),
            Action::SetEnabled { enabled } => (
                &inner.switches_key,
                "hset",
                "enabled".to_owned(),
                Some(flag(*enabled)),
            ),
            Action::SetShadow { layer, shadow } => (
                &inner.switches_key,
                "hset",
                format!("shadow:{layer}"),
                Some(flag(*shadow)),
            ),
        };
        let message = serde_json::to_string(&action).expect("an action serializes");
        let _: i64 = inner
            .commands
            .eval(
                inner
                    .act
                    .key(key)
                    .arg(&inner.channel)
                    .arg(message)
                    .arg(change)
                    .arg(field)
                    .arg(value.unwrap_or_default()),
            )
            .await
            .map_err(unavailable)?;
        // At once here; the message that comes back changes nothing more.
        inner.replica.apply(&action)?;
        tracing::info!(action = ?action, "operator action sent to the fleet");
        Ok(())
    }
}

fn flag(on: bool) -> String {
    if on { "1" } else { "0" }.to_owned()
}

fn unavailable(error: SharedStoreError) -> ToolError {
    ToolError::rejected(
        ErrorCode::StoreUnavailable,
        format!("the fleet's Redis could not take the action ({error}): retry later"),
    )
}

fn invalid(field: &str, problem: impl fmt::Display) -> ToolError {
    ToolError::rejected(ErrorCode::ValidationError, format!("{field}: {problem}"))
}

impl Replica {
    /// Refuses an action this replica cannot apply, naming the field.
    fn check(&self, action: &Action) -> Result<(), ToolError> {
        match action {
            Action::ForceOpen { breaker } | Action::ResetBreaker { breaker } => {
                breaker
                    .parse::<BreakerKey>()
                    .map_err(|problem| invalid("breaker", problem))?;
            }
            Action::ResetSession { session } if session.is_empty() => {
                return Err(invalid("session", "must not be empty"));
            }
            Action::SetShadow { layer, .. } if ShadowLayer::parse(layer).is_none() => {
                return Err(invalid(
                    "layer",
                    format!("{layer:?} is not a layer with a shadow mode"),
                ));
            }
            _ => {}
        }
        Ok(())
    }

    /// Applies a checked action here.
    fn apply(&self, action: &Action) -> Result<(), ToolError> {
        self.check(action)?;
        match action {
            Action::ForceOpen { breaker } => {
                if let (Some(breakers), Ok(key)) = (&self.breakers, breaker.parse()) {
                    breakers.force_open(&key);
                }
            }
            Action::ResetBreaker { breaker } => {
                if let (Some(breakers), Ok(key)) = (&self.breakers, breaker.parse()) {
                    breakers.reset(&key);
                }
            }
            Action::ResetSession { session } => {
                if let Some(loops) = &self.loops {
                    loops.reset_local_session(session);
                }
            }
            Action::SetEnabled { enabled } => self.control.set_enabled(*enabled),
            Action::SetShadow { layer, shadow } => {
                if let Some(layer) = ShadowLayer::parse(layer) {
                    self.control.set_shadow(layer, *shadow);
                }
            }
        }
        Ok(())
    }
}

impl Inner {
    /// Subscribes to the channel and applies the switches.
    async fn sync(&self) -> Result<(), SharedStoreError> {
        let _serial = self.serial.lock().await;
        if !self.subscribed.load(Ordering::Relaxed) {
            // Once subscribed, the connection subscribes again by itself after a reconnection.
            let mut subscriber = self.subscriber.clone();
            let channel = self.channel.clone();
            bounded(self.commands.timeout(), async move {
                subscriber.subscribe(channel).await
            })
            .await?;
            self.subscribed.store(true, Ordering::Relaxed);
        }
        let switches: Vec<(String, String)> = self
            .commands
            .command(redis::cmd("HGETALL").arg(&self.switches_key))
            .await?;
        let forced: Vec<String> = self
            .commands
            .command(redis::cmd("SMEMBERS").arg(&self.forced_key))
            .await?;
        let mut actions = Vec::new();
        for (field, value) in switches {
            let on = value == "1";
            match field.strip_prefix("shadow:") {
                Some(layer) => actions.push(Action::SetShadow {
                    layer: layer.to_owned(),
                    shadow: on,
                }),
                None if field == "enabled" => actions.push(Action::SetEnabled { enabled: on }),
                None => {}
            }
        }
        if let Some(breakers) = &self.replica.breakers {
            // A breaker held open here that the fleet no longer holds was reset meanwhile.
            for status in breakers.snapshot() {
                let name = status.key.short();
                if status.state == BreakerState::ForcedOpen && !forced.contains(&name) {
                    actions.push(Action::ResetBreaker { breaker: name });
                }
            }
        }
        actions.extend(
            forced
                .into_iter()
                .map(|breaker| Action::ForceOpen { breaker }),
        );
        for action in &actions {
            // The switches were checked when they were written.
            let _ = self.replica.apply(action);
        }
        self.syncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn received(&self, action: &Action) {
        match self.replica.apply(action) {
            Ok(()) => {
                self.applied.fetch_add(1, Ordering::Relaxed);
            }
            Err(error) => self.refuse(&format!("{action:?}"), &error.to_string()),
        }
    }

    fn refuse(&self, message: &str, problem: &str) {
        self.refused.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            message,
            problem,
            "a message on the fleet's channel was refused; nothing changed"
        );
    }

    /// Applies one message from the channel.
    fn message(&self, payload: &[u8]) {
        match serde_json::from_slice::<Action>(payload) {
            Ok(action) => self.received(&action),
            Err(error) => self.refuse(&String::from_utf8_lossy(payload), &error.to_string()),
        }
    }
}

/// Applies what the subscription hands over; syncs at the start and after each
/// resubscription.
async fn listen(inner: Weak<Inner>, mut pushes: mpsc::UnboundedReceiver<PushInfo>) {
    loop {
        let Some(fleet) = inner.upgrade() else { return };
        match fleet.sync().await {
            Ok(()) => break,
            Err(error) => tracing::debug!(%error, "cannot subscribe to the fleet's actions yet"),
        }
        drop(fleet);
        tokio::time::sleep(RESUBSCRIBE_DELAY).await;
    }
    let mut reconnecting = false;
    while let Some(push) = pushes.recv().await {
        let Some(fleet) = inner.upgrade() else { return };
        match push.kind {
            PushKind::Disconnection => reconnecting = true,
            PushKind::Message => {
                if let Some(Value::BulkString(payload)) = push.data.get(1) {
                    fleet.message(payload);
                }
            }
            // Resubscribed after a reconnection: messages may have been missed.
            PushKind::Subscribe if reconnecting => {
                reconnecting = false;
                if let Err(error) = fleet.sync().await {
                    tracing::warn!(%error, "cannot read the fleet's switches after a reconnection");
                }
            }
            _ => {}
        }
    }
}

impl fmt::Debug for FleetControl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FleetControl")
            .field("channel", &self.inner.channel)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

/// Builds a [`FleetControl`]; made by [`FleetControl::builder`].
///
/// ```
/// use tower_toolcall::fleet::FleetControl;
/// use tower_toolcall::registry::ToolRegistry;
/// use tower_toolcall::ToolStack;
///
/// let stack = ToolStack::builder(ToolRegistry::open()).build()?;
/// let err = FleetControl::builder("not a url").join(&stack).unwrap_err();
/// assert_eq!(err.field(), "fleet.redis.url");
/// # Ok::<(), tower_toolcall::ConfigError>(())
/// ```
#[derive(Debug)]
#[must_use]
pub struct FleetControlBuilder {
    settings: StoreSettings,
}

impl FleetControlBuilder {
    redis_support::store_settings_setters!("toolcall:fleet:");

    /// Joins `stack` to the fleet: from now on, actions sent by any replica reach it. Must
    /// be called inside the Tokio runtime, where it starts listening in the background (see
    /// [`FleetControl::sync`]).
    pub fn join<St: DedupeStore>(self, stack: &ToolStack<St>) -> Result<FleetControl, ConfigError> {
        let commands = self.settings.connect("fleet.redis")?;
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            ConfigError::new(
                "fleet",
                "must be joined inside the Tokio runtime, which runs its subscription",
            )
        })?;
        let client = redis_support::resp3_client("fleet.redis.url", commands.client())?;
        let (push, pushes) = mpsc::unbounded_channel();
        let config = commands
            .config()
            .clone()
            .set_push_sender(push)
            .set_automatic_resubscription();
        let subscriber = ConnectionManager::new_lazy_with_config(client, config).map_err(|e| {
            ConfigError::new("fleet.redis.url", format!("cannot be subscribed to: {e}"))
        })?;
        let prefix = &self.settings.key_prefix;
        let inner = Arc::new(Inner {
            subscriber,
            channel: hash_tagged(prefix, "fleet", ":actions"),
            switches_key: hash_tagged(prefix, "fleet", ":switches"),
            forced_key: hash_tagged(prefix, "fleet", ":forced"),
            commands,
            act: Script::new(ACT),
            replica: Replica {
                control: stack.control().clone(),
                breakers: stack.breakers(),
                loops: stack.loop_sessions(),
            },
            applied: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
            subscribed: AtomicBool::new(false),
            serial: tokio::sync::Mutex::new(()),
            listener: OnceLock::new(),
        });
        let listener = runtime.spawn(listen(Arc::downgrade(&inner), pushes));
        let _ = inner.listener.set(listener.abort_handle());
        Ok(FleetControl { inner })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn replica() -> Replica {
        let stack = ToolStack::builder(crate::registry::ToolRegistry::open())
            .build()
            .unwrap();
        Replica {
            control: stack.control().clone(),
            breakers: stack.breakers(),
            loops: stack.loop_sessions(),
        }
    }

    fn action() -> impl Strategy<Value = Action> {
        prop_oneof![
            "[a-z.]{1,12}::[a-z]{1,8}".prop_map(|k| Action::ForceOpen {
                breaker: format!("tool:{k}")
            }),
            "[a-z.]{1,12}".prop_map(|ns| Action::ResetBreaker {
                breaker: format!("dependency:{ns}")
            }),
            "[a-z0-9-]{1,16}".prop_map(|session| Action::ResetSession { session }),
            any::<bool>().prop_map(|enabled| Action::SetEnabled { enabled }),
            (
                proptest::sample::select(ShadowLayer::ALL.to_vec()),
                any::<bool>()
            )
                .prop_map(|(layer, shadow)| Action::SetShadow {
                    layer: layer.as_str().to_owned(),
                    shadow
                }),
        ]
    }

    proptest! {
        #[test]
        fn every_action_reads_back_as_sent_and_applies(action in action()) {
            let message = serde_json::to_string(&action).unwrap();
            let read: Action = serde_json::from_str(&message).unwrap();
            prop_assert_eq!(&read, &action);
            prop_assert!(replica().apply(&read).is_ok());
        }

        #[test]
        fn any_other_message_is_refused_and_changes_nothing(message in ".{0,80}") {
            let replica = replica();
            let applied = serde_json::from_str::<Action>(&message)
                .map_err(|e| e.to_string())
                .and_then(|action| replica.apply(&action).map_err(|e| e.to_string()));
            if applied.is_err() {
                prop_assert!(replica.control.is_enabled());
                prop_assert!(ShadowLayer::ALL.iter().all(|layer| !replica.control.is_shadow(*layer)));
                let breakers = replica.breakers.as_ref().unwrap().snapshot();
                prop_assert!(breakers.iter().all(|b| b.state == BreakerState::Closed));
            }
        }
    }

    #[test]
    fn malformed_actions_name_their_field() {
        let replica = replica();
        for (action, field) in [
            (
                Action::ForceOpen {
                    breaker: "no key".into(),
                },
                "breaker",
            ),
            (
                Action::ResetSession {
                    session: String::new(),
                },
                "session",
            ),
            (
                Action::SetShadow {
                    layer: "retry".into(),
                    shadow: true,
                },
                "layer",
            ),
        ] {
            let error = replica.check(&action).unwrap_err();
            assert_eq!(error.code(), ErrorCode::ValidationError);
            assert!(error.message().starts_with(field), "{}", error.message());
        }
    }
}
