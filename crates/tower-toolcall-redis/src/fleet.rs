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
//! Each is an [`OperatorAction`], and goes one way: [`act`](FleetControl::act) sends any of
//! them, and every replica reads, checks and applies each message alike.
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
//! # When Redis goes away
//!
//! Each replica keeps its subscription alive by itself: when the connection drops (Redis
//! restarted, the network cut), or stops answering its periodic `PING`, the replica connects
//! and subscribes again, retrying every few hundred milliseconds for as long as it takes,
//! and then reads the switches, so that what it missed while cut off is applied. An action
//! sent while Redis is unreachable fails with `STORE_UNAVAILABLE` and changes nothing
//! anywhere, not even on the sender.
//!
//! The switches outlive Redis the same way, all of them: **the fleet's state is what Redis
//! holds, and when Redis holds none, the first replica to sync writes back what it holds.**
//! After a restart that lost the data (a server without persistence), the kill switch, the
//! shadowed layers and the breakers held open are all as they were on the replica that
//! resynced first, which every other replica, and every replica that starts later, then
//! reads. A fleet's first replica starts the state the same way, from its own switches.
//!
//! Bad input is refused before anything is sent: nothing reaches the other replicas. A
//! malformed message on the channel (written by another tool) is counted in
//! [`FleetStats::refused`], logged (its first 256 bytes), and changes nothing. A switch
//! whose stored value is neither `0` nor `1` is skipped with a warning: the replica keeps
//! that switch as it is. A well-formed action that another program published on the channel
//! without recording it is applied, and recorded in the switches by the replicas that
//! receive it, so that replicas starting later agree; actions sent through
//! [`FleetControl`] are recorded and published in one step, and are the ones whose order is
//! exact.
//!
//! # On a Redis Cluster
//!
//! With the feature `cluster` and a [`RedisTarget`](crate::RedisTarget) of seeds, the
//! switches and the script that records an action live in the slot of the tag `{fleet}`.
//! The channel is a classic one: a cluster sends a `PUBLISH` to every node over its bus, so
//! a replica hears the actions whatever node it subscribes through. It subscribes through
//! its first seed; when that node dies, it subscribes through the next seed or a node the
//! cluster names (masters and replicas), and reads the switches again. An action sent while
//! the master of `{fleet}` fails over fails with `STORE_UNAVAILABLE`, as while a node is
//! down, and changes nothing.
//!
//! # Breaker counting stays local
//!
//! Only the operator's actions are shared, not the breakers' counts. A breaker measures how
//! its replica's calls to a tool fare: one replica's network path or connection pool can
//! fail while others' work, and each replica should stop only what fails for it. Sharing the
//! counts would cost a round trip per call on the hottest path, and a Redis outage would
//! then blind every breaker at once, when they are most needed. A fleet-wide decision to
//! stop a tool is the operator's force-open, which this module shares. This holds on a
//! cluster too: a shared count would also cost a cross-node round trip per call, and a
//! failover would blind every breaker of every replica at once.
//!
//! ```no_run
//! use tower_toolcall::breaker::BreakerKey;
//! use tower_toolcall::registry::ToolRegistry;
//! use tower_toolcall::ToolStack;
//! use tower_toolcall_redis::FleetControl;
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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, PushInfo, PushKind, Script, Value};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};

use tower_toolcall::breaker::{BreakerAdmin, BreakerKey};
use tower_toolcall::control::{ReliabilityControl, ShadowLayer};
use tower_toolcall::loop_detect::{LoopCommand, LoopDetectHandle};
use tower_toolcall::shared_store::StoreError;
use tower_toolcall::stack::{FleetActions, FleetFuture, OperatorAction, ToolStack};
use tower_toolcall::{BreakerState, ConfigError, ErrorCode, ToolError};

use crate::support::node::resp3_client;
use crate::support::{self, bounded, cluster, hash_tagged, Connection, Endpoint, StoreSettings};

/// The default prefix of the fleet's keys and channel.
pub const DEFAULT_FLEET_KEY_PREFIX: &str = "toolcall:fleet:";

/// The first wait of the listener before it tries again to subscribe; it doubles up to
/// [`RESUBSCRIBE_MAX_DELAY`].
const RESUBSCRIBE_DELAY: Duration = Duration::from_millis(50);

/// The longest wait of the listener between two tries to subscribe.
const RESUBSCRIBE_MAX_DELAY: Duration = Duration::from_millis(400);

/// How long the subscription may stay silent before the listener checks, with `PING`, that
/// the server still answers on it.
const KEEPALIVE: Duration = Duration::from_secs(1);

/// The most bytes of a refused message that a log line shows.
const LOGGED_MESSAGE_BYTES: usize = 256;

/// The member of a message that says the fleet's state already records it.
const RECORDED: &str = "recorded";

/// Records an action in the fleet's state and publishes it (unless the channel is empty),
/// in one step. `KEYS[1]`: the key the action changes. `ARGV`: channel, message, change
/// (`hset`, `sadd`, `srem` or `none`), field, value.
const ACT: &str = r"
local change = ARGV[3]
if change == 'hset' then
  redis.call('HSET', KEYS[1], ARGV[4], ARGV[5])
elseif change == 'sadd' then
  redis.call('SADD', KEYS[1], ARGV[4])
elseif change == 'srem' then
  redis.call('SREM', KEYS[1], ARGV[4])
end
if ARGV[1] == '' then
  return 0
end
return redis.call('PUBLISH', ARGV[1], ARGV[2])
";

/// Reads the fleet's state; when there is none (a new server, or one that lost its data),
/// first writes this replica's. `KEYS`: the switches, the forced breakers. `ARGV`: the kill
/// switch (`0` or `1`), the number of shadow fields, then the shadow fields and their
/// values, then the breakers held open.
const SYNC: &str = r"
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 'enabled', ARGV[1])
  local shadows = tonumber(ARGV[2])
  for i = 1, shadows do
    redis.call('HSET', KEYS[1], ARGV[1 + 2 * i], ARGV[2 + 2 * i])
  end
  for i = 3 + 2 * shadows, #ARGV do
    redis.call('SADD', KEYS[2], ARGV[i])
  end
end
return {redis.call('HGETALL', KEYS[1]), redis.call('SMEMBERS', KEYS[2])}
";

/// An [`OperatorAction`] as the channel carries it, and as every replica reads it before
/// [checking](Replica::check) it.
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
    channel: String,
    switches_key: String,
    forced_key: String,
    act: Script,
    sync: Script,
    replica: Replica,
    applied: AtomicU64,
    refused: AtomicU64,
    syncs: AtomicU64,
    /// `true` while the listener holds a live subscription to the channel.
    subscribed: watch::Sender<bool>,
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
    /// A builder for the fleet whose Redis is at `target`: a node's URL (e.g.
    /// `redis://127.0.0.1:6379/`), or a cluster's seeds (see [`RedisTarget`](crate::RedisTarget)).
    pub fn builder(target: impl Into<crate::RedisTarget>) -> FleetControlBuilder {
        FleetControlBuilder {
            settings: StoreSettings::new(target.into(), DEFAULT_FLEET_KEY_PREFIX),
        }
    }

    /// Holds the breaker `key` open on every replica until it is reset.
    pub async fn force_open(&self, key: &BreakerKey) -> Result<(), ToolError> {
        self.act(OperatorAction::ForceOpen(key.clone())).await
    }

    /// Closes the breaker `key` on every replica.
    pub async fn reset_breaker(&self, key: &BreakerKey) -> Result<(), ToolError> {
        self.act(OperatorAction::ResetBreaker(key.clone())).await
    }

    /// Forgets `session`'s loop history on every replica (and in the shared loop store, if
    /// the stack uses one); its settings stay.
    pub async fn reset_session(&self, session: &str) -> Result<(), ToolError> {
        self.act(OperatorAction::ResetSession(session.to_owned()))
            .await
    }

    /// Turns every layer of every replica on, or into a pass-through (the kill switch).
    pub async fn set_enabled(&self, enabled: bool) -> Result<(), ToolError> {
        self.act(OperatorAction::SetEnabled(enabled)).await
    }

    /// Puts `layer` in or out of shadow mode on every replica.
    pub async fn set_shadow(&self, layer: ShadowLayer, shadow: bool) -> Result<(), ToolError> {
        self.act(OperatorAction::SetShadow(layer, shadow)).await
    }

    /// Does `action` on every replica: checks it, applies it here, records it in the fleet's
    /// state and publishes it, in one step (see the [module docs](self)). Every action of a
    /// [`FleetControl`] goes this way.
    pub async fn act(&self, action: OperatorAction) -> Result<(), ToolError> {
        let inner = &self.inner;
        let action = Action::of(&action)?;
        inner.replica.check(&action)?;
        // A sync reads the switches and compares them with this replica's breakers: never
        // while an action is between the server and this replica.
        let _serial = inner.serial.lock().await;
        if let Action::ResetSession { session } = &action {
            if let Some(loops) = &inner.replica.loops {
                loops.reset_session(session).await.map_err(unavailable)?;
            }
        }
        let (key, change, field, value) = action.change(inner);
        let mut message = serde_json::to_value(&action).expect("an action serializes");
        message[RECORDED] = serde_json::Value::Bool(true);
        inner
            .record(key, Some(&message.to_string()), change, field, value)
            .await
            .map_err(unavailable)?;
        // At once here; the message that comes back changes nothing more.
        inner.replica.apply(&action)?;
        tracing::info!(action = ?action, "operator action sent to the fleet");
        Ok(())
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
            .apply(session, &command)
            .map_err(|problem| invalid("command", problem))?
            .await
            .map_err(unavailable)?;
        tracing::info!(session, command = ?command, "loop command written for the fleet");
        Ok(command)
    }

    /// Waits (at most the operation timeout) until this replica is subscribed to the fleet's
    /// actions, then applies the fleet's current switches. The replica subscribes and syncs
    /// by itself when it joins and after each reconnection; awaiting this says when it is
    /// done.
    pub async fn sync(&self) -> Result<(), ToolError> {
        let inner = &self.inner;
        let mut subscribed = inner.subscribed.subscribe();
        let timeout = inner.commands.timeout();
        match tokio::time::timeout(timeout, subscribed.wait_for(|live| *live)).await {
            Ok(Ok(_)) => {}
            Ok(Err(_)) | Err(_) => {
                return Err(unavailable(StoreError::Unavailable(format!(
                    "this replica could not subscribe to the fleet's channel within {} ms",
                    timeout.as_millis()
                ))))
            }
        }
        inner.sync().await.map_err(unavailable)
    }

    /// What this replica has seen.
    pub fn stats(&self) -> FleetStats {
        FleetStats {
            applied: self.inner.applied.load(Ordering::Relaxed),
            refused: self.inner.refused.load(Ordering::Relaxed),
            syncs: self.inner.syncs.load(Ordering::Relaxed),
        }
    }
}

/// The actions of the admin router (feature `axum` of the core), sent to every replica.
impl FleetActions for FleetControl {
    fn act(&self, action: OperatorAction) -> FleetFuture<'_> {
        Box::pin(FleetControl::act(self, action))
    }
}

impl Action {
    /// `action` as the channel carries it; an action this version does not know is refused,
    /// naming the field.
    fn of(action: &OperatorAction) -> Result<Action, ToolError> {
        Ok(match action {
            OperatorAction::ForceOpen(key) => Action::ForceOpen {
                breaker: key.short(),
            },
            OperatorAction::ResetBreaker(key) => Action::ResetBreaker {
                breaker: key.short(),
            },
            OperatorAction::ResetSession(session) => Action::ResetSession {
                session: session.clone(),
            },
            OperatorAction::SetEnabled(enabled) => Action::SetEnabled { enabled: *enabled },
            OperatorAction::SetShadow(layer, shadow) => Action::SetShadow {
                layer: layer.as_str().to_owned(),
                shadow: *shadow,
            },
            other => {
                return Err(invalid(
                    "action",
                    format!("{other:?} is not an action the fleet carries"),
                ))
            }
        })
    }

    /// How the fleet's state records the action: the key, the change, the field and value.
    fn change<'a>(&self, inner: &'a Inner) -> (&'a str, &'static str, String, Option<String>) {
        match self {
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
        }
    }
}

fn flag(on: bool) -> String {
    if on { "1" } else { "0" }.to_owned()
}

fn unavailable(error: StoreError) -> ToolError {
    ToolError::rejected(
        ErrorCode::StoreUnavailable,
        format!("the fleet's Redis could not take the action ({error}): retry later"),
    )
}

fn invalid(field: &str, problem: impl fmt::Display) -> ToolError {
    ToolError::rejected(ErrorCode::ValidationError, format!("{field}: {problem}"))
}

impl Replica {
    /// The breakers this replica holds open by force, by name.
    fn forced(&self) -> Vec<String> {
        self.breakers
            .iter()
            .flat_map(|breakers| breakers.snapshot())
            .filter(|status| status.state == BreakerState::ForcedOpen)
            .map(|status| status.key.short())
            .collect()
    }

    /// The operator action `action` carries, or what this replica cannot apply in it,
    /// naming the field.
    fn check(&self, action: &Action) -> Result<OperatorAction, ToolError> {
        let breaker = |name: &str| {
            name.parse::<BreakerKey>()
                .map_err(|problem| invalid("breaker", problem))
        };
        Ok(match action {
            Action::ForceOpen { breaker: name } => OperatorAction::ForceOpen(breaker(name)?),
            Action::ResetBreaker { breaker: name } => OperatorAction::ResetBreaker(breaker(name)?),
            Action::ResetSession { session } if session.is_empty() => {
                return Err(invalid("session", "must not be empty"));
            }
            Action::ResetSession { session } => OperatorAction::ResetSession(session.clone()),
            Action::SetEnabled { enabled } => OperatorAction::SetEnabled(*enabled),
            Action::SetShadow { layer, shadow } => match ShadowLayer::parse(layer) {
                Some(layer) => OperatorAction::SetShadow(layer, *shadow),
                None => {
                    return Err(invalid(
                        "layer",
                        format!("{layer:?} is not a layer with a shadow mode"),
                    ))
                }
            },
        })
    }

    /// Checks `action` and applies it here.
    fn apply(&self, action: &Action) -> Result<(), ToolError> {
        match self.check(action)? {
            OperatorAction::ForceOpen(key) => {
                if let Some(breakers) = &self.breakers {
                    breakers.force_open(&key);
                }
            }
            OperatorAction::ResetBreaker(key) => {
                if let Some(breakers) = &self.breakers {
                    breakers.reset(&key);
                }
            }
            OperatorAction::ResetSession(session) => {
                if let Some(loops) = &self.loops {
                    loops.reset_local_session(&session);
                }
            }
            OperatorAction::SetEnabled(enabled) => self.control.set_enabled(enabled),
            OperatorAction::SetShadow(layer, shadow) => self.control.set_shadow(layer, shadow),
            // Made by `check`, which makes none other.
            _ => {}
        }
        Ok(())
    }
}

impl Inner {
    /// Records a change in the fleet's state and, with a `message`, publishes it, in one
    /// step.
    async fn record(
        &self,
        key: &str,
        message: Option<&str>,
        change: &str,
        field: String,
        value: Option<String>,
    ) -> Result<(), StoreError> {
        let channel = if message.is_some() {
            &*self.channel
        } else {
            ""
        };
        let _: i64 = self
            .commands
            .eval(
                self.act
                    .key(key)
                    .arg(channel)
                    .arg(message.unwrap_or_default())
                    .arg(change)
                    .arg(field)
                    .arg(value.unwrap_or_default()),
            )
            .await?;
        Ok(())
    }

    /// Reads the fleet's switches (writing this replica's first, when Redis holds none) and
    /// applies them.
    async fn sync(&self) -> Result<(), StoreError> {
        let _serial = self.serial.lock().await;
        let mut invocation = self.sync.key(&self.switches_key);
        invocation
            .key(&self.forced_key)
            .arg(flag(self.replica.control.is_enabled()));
        let shadows: Vec<&ShadowLayer> = ShadowLayer::ALL.iter().collect();
        invocation.arg(shadows.len());
        for layer in shadows {
            invocation
                .arg(format!("shadow:{}", layer.as_str()))
                .arg(flag(self.replica.control.is_shadow(*layer)));
        }
        for breaker in self.replica.forced() {
            invocation.arg(breaker);
        }
        let (switches, forced): (Vec<(String, String)>, Vec<String>) =
            self.commands.eval(&invocation).await?;
        let mut actions = Vec::new();
        for (field, value) in switches {
            let Some(on) = switch_value(&field, &value) else {
                continue;
            };
            match field.strip_prefix("shadow:") {
                Some(layer) => actions.push(Action::SetShadow {
                    layer: layer.to_owned(),
                    shadow: on,
                }),
                None if field == "enabled" => actions.push(Action::SetEnabled { enabled: on }),
                None => {}
            }
        }
        // A breaker held open here that the fleet no longer holds was reset meanwhile.
        for name in self.replica.forced() {
            if !forced.contains(&name) {
                actions.push(Action::ResetBreaker { breaker: name });
            }
        }
        actions.extend(
            forced
                .into_iter()
                .map(|breaker| Action::ForceOpen { breaker }),
        );
        for action in &actions {
            if let Err(error) = self.replica.apply(action) {
                tracing::warn!(
                    action = ?action,
                    %error,
                    "the fleet's switches hold an entry this replica cannot apply: skipped"
                );
            }
        }
        self.syncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn refuse(&self, message: &[u8], problem: &str) {
        self.refused.fetch_add(1, Ordering::Relaxed);
        let shown = &message[..message.len().min(LOGGED_MESSAGE_BYTES)];
        tracing::warn!(
            payload = %String::from_utf8_lossy(shown),
            bytes = message.len(),
            problem,
            "a message on the fleet's channel was refused; nothing changed"
        );
    }

    /// Applies one message from the channel; one that the fleet's state does not record
    /// yet (another program published it) is recorded too.
    async fn message(&self, payload: &[u8]) {
        let (action, recorded) = match parse_message(payload) {
            Ok(parsed) => parsed,
            Err(problem) => return self.refuse(payload, &problem),
        };
        if let Err(error) = self.replica.apply(&action) {
            return self.refuse(payload, &error.to_string());
        }
        self.applied.fetch_add(1, Ordering::Relaxed);
        if recorded {
            return;
        }
        let (key, change, field, value) = action.change(self);
        if let Err(error) = self.record(key, None, change, field, value).await {
            tracing::warn!(
                action = ?action,
                %error,
                "an action published on the fleet's channel could not be recorded in its \
                 switches: replicas that start later will not see it"
            );
        }
    }
}

/// The action in a message from the channel, and whether the fleet's state records it; or
/// what is wrong with it.
fn parse_message(payload: &[u8]) -> Result<(Action, bool), String> {
    let mut message: serde_json::Value =
        serde_json::from_slice(payload).map_err(|e| e.to_string())?;
    let recorded = match message.as_object_mut() {
        Some(members) => match members.remove(RECORDED) {
            None => false,
            Some(serde_json::Value::Bool(recorded)) => recorded,
            Some(_) => return Err(format!("`{RECORDED}` must be true or false")),
        },
        None => return Err("an action is a JSON object".to_owned()),
    };
    let action = Action::deserialize(message).map_err(|e| e.to_string())?;
    Ok((action, recorded))
}

/// The value of the switch `field` as stored: `0` or `1`; anything else is skipped, with a
/// warning, and the switch stays as it is.
fn switch_value(field: &str, value: &str) -> Option<bool> {
    match value {
        "1" => Some(true),
        "0" => Some(false),
        _ => {
            let shown: String = value.chars().take(LOGGED_MESSAGE_BYTES).collect();
            tracing::warn!(
                field,
                value = %shown,
                "a fleet switch holds neither 0 nor 1: skipped, this replica keeps it as it is"
            );
            None
        }
    }
}

/// Keeps this replica subscribed to the channel for as long as the fleet lives: connects,
/// subscribes, syncs, applies the messages, and starts again whenever the connection is
/// lost or stops answering.
async fn listen(inner: Weak<Inner>, mut nodes: Listening) {
    let mut delay = RESUBSCRIBE_DELAY;
    let mut failures = 0u32;
    loop {
        let Some(fleet) = inner.upgrade() else { return };
        let (push, pushes) = mpsc::unbounded_channel();
        let subscribed = async {
            let client = nodes.next().await?;
            let connection = subscribe(&fleet, &client, push).await?;
            fleet.subscribed.send_replace(true);
            fleet.sync().await?;
            Ok::<_, StoreError>(connection)
        }
        .await;
        match subscribed {
            Ok(connection) => {
                if failures > 0 {
                    tracing::info!("subscribed to the fleet's actions again");
                }
                (delay, failures) = (RESUBSCRIBE_DELAY, 0);
                drop(fleet);
                follow(&inner, connection, pushes).await;
                nodes.lost();
                let Some(fleet) = inner.upgrade() else { return };
                fleet.subscribed.send_replace(false);
                tracing::warn!("the fleet's subscription was lost: subscribing again");
            }
            Err(error) => {
                fleet.subscribed.send_replace(false);
                failures += 1;
                if failures == 1 {
                    tracing::warn!(%error, "cannot subscribe to the fleet's actions yet: retrying");
                } else {
                    tracing::debug!(%error, "cannot subscribe to the fleet's actions yet");
                }
                drop(fleet);
                nodes.lost();
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(RESUBSCRIBE_MAX_DELAY);
            }
        }
    }
}

/// Where the listener subscribes: on a node, the node; on a cluster, any node, one after
/// another as they are lost (see [`cluster::Listening`]).
enum Listening {
    Node(Client),
    Cluster(cluster::Listening),
}

impl Listening {
    fn new(endpoint: &Endpoint) -> Result<Listening, ConfigError> {
        Ok(match endpoint {
            Endpoint::Node(node) => {
                Listening::Node(resp3_client("fleet.redis.url", node.client())?)
            }
            Endpoint::Cluster(cluster) => Listening::Cluster(cluster.listening()),
        })
    }

    /// The client of the node to subscribe through now.
    async fn next(&mut self) -> Result<Client, StoreError> {
        match self {
            Listening::Node(client) => Ok(client.clone()),
            Listening::Cluster(nodes) => nodes
                .next()
                .await
                .map_err(|e| StoreError::Unavailable(e.to_string())),
        }
    }

    /// The node subscribed through was lost, or refused: the next try goes to another.
    fn lost(&mut self) {
        if let Listening::Cluster(nodes) = self {
            nodes.lost();
        }
    }
}

/// A new connection to the fleet's server, subscribed to its channel; its messages go to
/// `push`.
async fn subscribe(
    fleet: &Inner,
    client: &Client,
    push: mpsc::UnboundedSender<PushInfo>,
) -> Result<MultiplexedConnection, StoreError> {
    let timeout = fleet.commands.timeout();
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(None)
        .set_push_sender(push);
    let channel = fleet.channel.clone();
    bounded(timeout, async move {
        let mut connection = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        connection.subscribe(channel).await?;
        Ok(connection)
    })
    .await
}

/// Applies the messages of a subscription until its connection is lost, or does not answer
/// a `PING` after a silence of [`KEEPALIVE`].
async fn follow(
    inner: &Weak<Inner>,
    mut connection: MultiplexedConnection,
    mut pushes: mpsc::UnboundedReceiver<PushInfo>,
) {
    loop {
        let push = tokio::time::timeout(KEEPALIVE, pushes.recv()).await;
        let Some(fleet) = inner.upgrade() else { return };
        match push {
            Ok(None) => return,
            Ok(Some(push)) => match push.kind {
                PushKind::Disconnection => return,
                PushKind::Message => {
                    if let Some(Value::BulkString(payload)) = push.data.get(1) {
                        fleet.message(payload).await;
                    }
                }
                _ => {}
            },
            Err(_) => {
                let ping = bounded(fleet.commands.timeout(), async {
                    redis::cmd("PING")
                        .query_async::<Value>(&mut connection)
                        .await
                })
                .await;
                if let Err(error) = ping {
                    tracing::debug!(%error, "the fleet's subscription does not answer");
                    return;
                }
            }
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
/// use tower_toolcall::registry::ToolRegistry;
/// use tower_toolcall::ToolStack;
/// use tower_toolcall_redis::FleetControl;
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
    support::store_settings_setters!("toolcall:fleet:");

    /// Joins `stack` to the fleet: from now on, actions sent by any replica reach it. Must
    /// be called inside the Tokio runtime, where it starts listening in the background (see
    /// [`FleetControl::sync`]).
    pub fn join(self, stack: &ToolStack) -> Result<FleetControl, ConfigError> {
        let commands = self.settings.connect("fleet.redis")?;
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            ConfigError::new(
                "fleet",
                "must be joined inside the Tokio runtime, which runs its subscription",
            )
        })?;
        let nodes = Listening::new(commands.endpoint())?;
        let prefix = &self.settings.key_prefix;
        let inner = Arc::new(Inner {
            channel: hash_tagged(prefix, "fleet", ":actions"),
            switches_key: hash_tagged(prefix, "fleet", ":switches"),
            forced_key: hash_tagged(prefix, "fleet", ":forced"),
            commands,
            act: Script::new(ACT),
            sync: Script::new(SYNC),
            replica: Replica {
                control: stack.control().clone(),
                breakers: stack.breakers(),
                loops: stack.loop_sessions(),
            },
            applied: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
            subscribed: watch::channel(false).0,
            serial: tokio::sync::Mutex::new(()),
            listener: OnceLock::new(),
        });
        let listener = runtime.spawn(listen(Arc::downgrade(&inner), nodes));
        let _ = inner.listener.set(listener.abort_handle());
        Ok(FleetControl { inner })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn replica() -> Replica {
        let stack = ToolStack::builder(tower_toolcall::registry::ToolRegistry::open())
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
