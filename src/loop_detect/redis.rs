//! [`RedisLoopStore`]: the sessions' recent calls in Redis, shared by every replica.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use redis::{Script, Value};
use tokio::time::Instant;

use super::config::{BelowSession, LoopSettingKey, LoopSettings};
use super::detector::{Limits, Outcome, SessionHistory, Signature, State, StoredCall};
use crate::error::{ConfigError, ErrorCode};
use crate::redis_support::{self, hash_tagged, Connection, StoreSettings};
use crate::shared_store::SharedStoreError;
use crate::time::{millis, unix_now_ms};

/// The default prefix of every key the store writes.
pub const DEFAULT_LOOP_KEY_PREFIX: &str = "toolcall:loop:";

/// A session is one string: its next sequence number, a line; the call last given a chance
/// (`<signature>:<ms>`, or nothing), a line; its own settings (`!/set` overrides, as JSON, or
/// nothing), a line; then its latest calls, one line each, oldest first:
/// `<seq>:<ms>:<signature>:<poller>:<state>`. Two commands a script, whatever the history's
/// length.
///
/// Every script reads the header the same way: `seq`, `chance`, `settings`, `calls`.
const READ_SESSION: &str = r"
local seq, chance, settings, calls = 0, '', '', ''
local blob = redis.call('GET', KEYS[1])
if blob then
  local a = string.find(blob, '\n', 1, true)
  local b = string.find(blob, '\n', a + 1, true)
  local c = string.find(blob, '\n', b + 1, true)
  seq = tonumber(string.sub(blob, 1, a - 1))
  chance = string.sub(blob, a + 1, b - 1)
  settings = string.sub(blob, b + 1, c - 1)
  calls = string.sub(blob, c + 1)
end
";

/// `OBSERVE` reads the session's settings over the tiers below it, and, when they track the
/// call, takes the next sequence number, answers it with the calls, the chance and the
/// settings, and appends this call, pending, keeping as many calls as the rules look at; the
/// session expires with its window. Untracked, it answers `-1` and the settings, and writes
/// nothing. `ARGV`: now (ms), window (ms), the calls kept for the rules other than repeats,
/// max repeats, signature, poller, enabled (`1` or `0`), the last four below the session.
const OBSERVE: &str = r"
local enabled, repeats, window = ARGV[7] == '1', tonumber(ARGV[4]), tonumber(ARGV[2])
if settings ~= '' then
  local own = cjson.decode(settings)
  if own.enabled ~= nil then enabled = own.enabled end
  if own.max_repeats then repeats = own.max_repeats end
  if own.ttl_secs then window = own.ttl_secs * 1000 end
end
if not enabled then return {-1, '', '', settings} end
local keep = math.max(tonumber(ARGV[3]), repeats - 1)
local kept = calls .. seq .. ':' .. ARGV[1] .. ':' .. ARGV[5] .. ':' .. ARGV[6] .. ':p\n'
local n = select(2, string.gsub(kept, '\n', '\n'))
local from = 1
for _ = 1, n - keep do
  from = string.find(kept, '\n', from, true) + 1
end
kept = string.sub(kept, from)
redis.call('SET', KEYS[1], (seq + 1) .. '\n' .. chance .. '\n' .. settings .. '\n' .. kept, 'PX', window)
return {seq, calls, chance, settings}
";

/// Settles the pending call `ARGV[1]` with the state `ARGV[2]`, and sets the session's
/// chance to `ARGV[3]` unless it is empty; the session keeps its expiry.
const SETTLE: &str = r"
if not blob then return 0 end
local at = string.find('\n' .. calls, '\n' .. ARGV[1] .. ':', 1, true)
if at then
  local stop = string.find(calls, '\n', at, true)
  if string.sub(calls, stop - 2, stop - 1) == ':p' then
    calls = string.sub(calls, 1, stop - 2) .. ARGV[2] .. string.sub(calls, stop)
  end
end
if ARGV[3] ~= '' then chance = ARGV[3] end
redis.call('SET', KEYS[1], seq .. '\n' .. chance .. '\n' .. settings .. '\n' .. calls, 'KEEPTTL')
return 1
";

/// Changes the session's settings: sets the members of the JSON object `ARGV[1]`, removes
/// the comma-separated members `ARGV[2]`. Switching detection off drops the calls. The
/// session then lasts at least its window: its own, or `ARGV[3]` (ms).
const SET_SETTINGS: &str = r"
local own = settings == '' and {} or cjson.decode(settings)
for name, value in pairs(cjson.decode(ARGV[1])) do own[name] = value end
for name in string.gmatch(ARGV[2], '[^,]+') do own[name] = nil end
settings = next(own) == nil and '' or cjson.encode(own)
if own.enabled == false then chance, calls = '', '' end
local window = own.ttl_secs and own.ttl_secs * 1000 or tonumber(ARGV[3])
window = math.max(window, redis.call('PTTL', KEYS[1]))
redis.call('SET', KEYS[1], seq .. '\n' .. chance .. '\n' .. settings .. '\n' .. calls, 'PX', window)
return 1
";

/// Drops the session's calls and chance; its settings and sequence stay, with its expiry.
const RESET: &str = r"
if not blob then return 0 end
redis.call('SET', KEYS[1], seq .. '\n\n' .. settings .. '\n', 'KEEPTTL')
return 1
";

/// A script on a session: the common header, then `body`.
fn session_script(body: &str) -> Script {
    Script::new(&format!("{READ_SESSION}{body}"))
}

/// The default seed of call signatures: every replica that shares a store must hash calls
/// alike.
const DEFAULT_SIGNATURE_SEED: u64 = 0x746f_6f6c_6361_6c6c;

/// Loop detection's per-session state in Redis (7.0 or later), shared by every replica that
/// points at the same server: a model whose calls are spread over replicas is stopped at the
/// same call as on one.
///
/// - A session is one key, `<prefix>{<session>}`: its sequence, the call last given a
///   chance, and its latest calls (sequence number, time, signature, and how each ended), as
///   many as the rules look at. The braces are a Redis Cluster hash tag. The key expires with
///   the session's window.
/// - A call is one round trip: a Lua script (two commands, a read and a write) appends it and
///   answers the calls before it, which the layer judges with the same rules as in memory. A refused call, a failure and a
///   poller's result are then written to its entry (a second, short script), before the
///   caller gets the answer, so the next call on any replica sees them.
/// - Times are the replicas' wall clocks, in milliseconds: windows last seconds or minutes,
///   far longer than the skew of synchronized clocks.
/// - Signatures are keyed hashes with a seed every replica shares
///   ([`signature_seed`](RedisLoopStoreBuilder::signature_seed)).
/// - Every operation is bounded by the operation timeout (1 s by default); a failed one
///   follows the layer's [`FailurePolicy`](crate::shared_store::FailurePolicy).
///
/// ```no_run
/// use tower_toolcall::loop_detect::{LoopDetectLayer, RedisLoopStore};
/// use tower_toolcall::registry::ToolRegistry;
///
/// let store = RedisLoopStore::open("redis://127.0.0.1:6379/")?;
/// let layer = LoopDetectLayer::builder(ToolRegistry::open()).store(store).build()?;
/// # let _ = layer;
/// # Ok::<(), tower_toolcall::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct RedisLoopStore {
    shared: Arc<Shared>,
}

struct Shared {
    connection: Connection,
    key_prefix: String,
    signature_seed: u64,
    observe: Script,
    settle: Script,
    set_settings: Script,
    reset: Script,
}

/// What the store answered for one call: the session's settings, and when they track the
/// call, its sequence number and the session's history before it.
pub(crate) struct Observed {
    /// The session's own settings.
    pub(crate) settings: LoopSettings,
    /// `None` when the session's settings do not track the call.
    pub(crate) tracked: Option<Tracked>,
}

/// A tracked call, as the store answered it.
pub(crate) struct Tracked {
    pub(crate) history: SessionHistory,
    /// The call's sequence number in its session.
    pub(crate) seq: u64,
    /// When the store's clock read the call, on the tokio clock.
    pub(crate) now: Instant,
}

impl RedisLoopStore {
    /// A store at `url` (e.g. `redis://127.0.0.1:6379/`) with the defaults.
    pub fn open(url: &str) -> Result<RedisLoopStore, ConfigError> {
        RedisLoopStore::builder(url).build()
    }

    /// A builder for a store at `url`.
    pub fn builder(url: impl Into<String>) -> RedisLoopStoreBuilder {
        RedisLoopStoreBuilder {
            settings: StoreSettings::new(url.into(), DEFAULT_LOOP_KEY_PREFIX),
            signature_seed: DEFAULT_SIGNATURE_SEED,
        }
    }

    /// The Redis key of `session`'s latest calls.
    pub fn session_key(&self, session: &str) -> String {
        hash_tagged(&self.shared.key_prefix, session, "")
    }

    pub(crate) fn signature_seed(&self) -> u64 {
        self.shared.signature_seed
    }

    /// Appends a call of `signature` to `session`, unless the session's own settings
    /// switch detection off, and answers them with the history before it. `below` is what
    /// the tiers below the session decide.
    pub(crate) fn observe(
        &self,
        session: &str,
        signature: Signature,
        below: BelowSession,
    ) -> impl Future<Output = Result<Observed, SharedStoreError>> + Send + 'static {
        let shared = self.shared.clone();
        let key = self.session_key(session);
        let limits = below.limits;
        let window_ms = millis(limits.ttl).max(1);
        // The calls the rules other than repeats look at.
        let keep = Limits {
            max_repeats: 1,
            ..limits
        }
        .history_len();
        let poller = u8::from(limits.poller);
        let enabled = u8::from(below.enabled);
        async move {
            let now_ms = unix_now_ms();
            let reply: Vec<Value> = shared
                .connection
                .eval(
                    shared
                        .observe
                        .key(&key)
                        .arg(now_ms)
                        .arg(window_ms)
                        .arg(keep)
                        .arg(limits.max_repeats)
                        .arg(signature.raw())
                        .arg(poller)
                        .arg(enabled),
                )
                .await?;
            let now = Instant::now();
            let at = |ms: u64| {
                now.checked_sub(Duration::from_millis(now_ms.saturating_sub(ms)))
                    .unwrap_or(now)
            };
            let mut reply = reply.into_iter();
            let seq = match reply.next() {
                Some(Value::Int(seq)) => seq,
                _ => return Err(corrupt("no sequence number")),
            };
            let calls = reply.next().ok_or_else(|| corrupt("no calls"))?;
            let calls = text(&calls)?
                .lines()
                .map(|call| decode_call(call, at))
                .collect::<Result<Vec<_>, _>>()?;
            let chance = reply.next().ok_or_else(|| corrupt("no chance"))?;
            let chance = match text(&chance)? {
                "" => None,
                chance => {
                    let (signature, ms) = chance
                        .split_once(':')
                        .and_then(|(s, ms)| Some((s.parse().ok()?, ms.parse().ok()?)))
                        .ok_or_else(|| corrupt("a malformed chance"))?;
                    Some((Signature::from_raw(signature), at(ms)))
                }
            };
            let settings = reply.next().ok_or_else(|| corrupt("no settings"))?;
            let settings = decode_settings(text(&settings)?)?;
            // A negative sequence number: the session's settings do not track the call.
            let tracked = u64::try_from(seq).ok().map(|seq| Tracked {
                history: SessionHistory::restore(calls, seq, chance),
                seq,
                now,
            });
            Ok(Observed { settings, tracked })
        }
    }

    /// Writes how the call `seq` of `session` ended, and the session's chance when it
    /// changed.
    pub(crate) fn settle(
        &self,
        session: &str,
        seq: u64,
        state: State,
        chance: Option<(Signature, Instant)>,
    ) -> impl Future<Output = Result<(), SharedStoreError>> + Send + 'static {
        let shared = self.shared.clone();
        let key = self.session_key(session);
        let chance = chance.map_or_else(String::new, |(signature, at)| {
            let ago = millis(Instant::now().saturating_duration_since(at));
            format!("{}:{}", signature.raw(), unix_now_ms().saturating_sub(ago))
        });
        async move {
            let _: i64 = shared
                .connection
                .eval(
                    shared
                        .settle
                        .key(&key)
                        .arg(seq)
                        .arg(encode_state(state))
                        .arg(chance),
                )
                .await?;
            Ok(())
        }
    }

    /// Changes `session`'s own settings: sets those `set` has, removes `unset`. `window` is
    /// how long the session lasts when its settings do not say.
    pub(crate) fn change_settings(
        &self,
        session: &str,
        set: LoopSettings,
        unset: &[LoopSettingKey],
        window: Duration,
    ) -> impl Future<Output = Result<(), SharedStoreError>> + Send + 'static {
        let shared = self.shared.clone();
        let key = self.session_key(session);
        let set = serde_json::to_string(&set).expect("settings serialize");
        let unset = unset
            .iter()
            .map(|key| setting_member(*key))
            .collect::<Vec<_>>()
            .join(",");
        let window_ms = millis(window).max(1);
        async move {
            let _: i64 = shared
                .connection
                .eval(
                    shared
                        .set_settings
                        .key(&key)
                        .arg(set)
                        .arg(unset)
                        .arg(window_ms),
                )
                .await?;
            Ok(())
        }
    }

    /// Drops `session`'s calls; its settings stay.
    pub(crate) fn reset(
        &self,
        session: &str,
    ) -> impl Future<Output = Result<(), SharedStoreError>> + Send + 'static {
        let shared = self.shared.clone();
        let key = self.session_key(session);
        async move {
            let _: i64 = shared.connection.eval(&shared.reset.key(&key)).await?;
            Ok(())
        }
    }

    /// Forgets `session`: its calls and its settings.
    pub(crate) fn forget(
        &self,
        session: &str,
    ) -> impl Future<Output = Result<(), SharedStoreError>> + Send + 'static {
        let shared = self.shared.clone();
        let mut command = redis::cmd("DEL");
        command.arg(self.session_key(session));
        async move {
            let _: i64 = shared.connection.command(&command).await?;
            Ok(())
        }
    }
}

fn corrupt(what: &str) -> SharedStoreError {
    SharedStoreError::Corrupt(format!("the loop-detection script answered {what}"))
}

fn text(value: &Value) -> Result<&str, SharedStoreError> {
    match value {
        Value::BulkString(bytes) => std::str::from_utf8(bytes).map_err(|_| corrupt("non-text")),
        _ => Err(corrupt("a non-string")),
    }
}

/// The JSON member of a setting, as [`LoopSettings`] serializes it.
fn setting_member(key: LoopSettingKey) -> &'static str {
    match key {
        LoopSettingKey::Detection => "enabled",
        LoopSettingKey::MaxRepeats => "max_repeats",
        LoopSettingKey::Ttl => "ttl_secs",
        LoopSettingKey::Mode => "mode",
    }
}

/// A session's settings as stored: JSON, or nothing; checked as when they were set.
fn decode_settings(stored: &str) -> Result<LoopSettings, SharedStoreError> {
    if stored.is_empty() {
        return Ok(LoopSettings::default());
    }
    serde_json::from_str::<LoopSettings>(stored)
        .ok()
        .filter(|settings| settings.check().is_ok())
        .ok_or_else(|| corrupt(&format!("malformed session settings {stored:?}")))
}

fn encode_state(state: State) -> String {
    match state {
        State::Pending => "p".to_owned(),
        State::Rejected => "r".to_owned(),
        State::Done(Outcome::Succeeded(fingerprint)) => format!("s{fingerprint}"),
        State::Done(Outcome::Failed(code)) => format!("f{}", code.as_str()),
    }
}

/// `<seq>:<at ms>:<signature>:<poller>:<state>`.
fn decode_call(call: &str, at: impl Fn(u64) -> Instant) -> Result<StoredCall, SharedStoreError> {
    let malformed = || corrupt(&format!("a malformed call {call:?}"));
    let mut parts = call.splitn(5, ':').skip(1);
    let mut next = || parts.next().ok_or_else(malformed);
    let at_ms: u64 = next()?.parse().map_err(|_| malformed())?;
    let signature: u64 = next()?.parse().map_err(|_| malformed())?;
    let poller = next()? == "1";
    let state = next()?;
    let state = match state.split_at_checked(1) {
        Some(("p", "")) => State::Pending,
        Some(("r", "")) => State::Rejected,
        Some(("s", fingerprint)) => State::Done(Outcome::Succeeded(
            fingerprint.parse().map_err(|_| malformed())?,
        )),
        Some(("f", code)) => State::Done(Outcome::Failed(
            ErrorCode::parse(code).ok_or_else(malformed)?,
        )),
        _ => return Err(malformed()),
    };
    Ok(StoredCall {
        at: at(at_ms),
        signature: Signature::from_raw(signature),
        poller,
        state,
    })
}

impl fmt::Debug for RedisLoopStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLoopStore")
            .field(
                "server",
                &self.shared.connection.client().get_connection_info().addr(),
            )
            .field("key_prefix", &self.shared.key_prefix)
            .field("operation_timeout", &self.shared.connection.timeout())
            .finish_non_exhaustive()
    }
}

/// Builds a [`RedisLoopStore`]; made by [`RedisLoopStore::builder`].
///
/// ```
/// use tower_toolcall::loop_detect::RedisLoopStore;
///
/// let err = RedisLoopStore::builder("redis://127.0.0.1/").key_prefix("").build().unwrap_err();
/// assert_eq!(err.field(), "loop_detect.redis.key_prefix");
/// ```
#[derive(Debug)]
#[must_use]
pub struct RedisLoopStoreBuilder {
    settings: StoreSettings,
    signature_seed: u64,
}

impl RedisLoopStoreBuilder {
    redis_support::store_settings_setters!("toolcall:loop:");

    /// The seed of the keyed hash of calls (a default is built in). Every replica that
    /// shares the store must use the same; a secret one keeps calls from being crafted to
    /// collide.
    pub fn signature_seed(mut self, seed: u64) -> Self {
        self.signature_seed = seed;
        self
    }

    /// Checks the configuration and builds the store. No connection is made yet.
    pub fn build(self) -> Result<RedisLoopStore, ConfigError> {
        let connection = self.settings.connect("loop_detect.redis")?;
        Ok(RedisLoopStore {
            shared: Arc::new(Shared {
                connection,
                key_prefix: self.settings.key_prefix,
                signature_seed: self.signature_seed,
                observe: session_script(OBSERVE),
                settle: session_script(SETTLE),
                set_settings: session_script(SET_SETTINGS),
                reset: session_script(RESET),
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn state() -> impl Strategy<Value = State> {
        prop_oneof![
            Just(State::Pending),
            Just(State::Rejected),
            any::<u64>().prop_map(|fingerprint| State::Done(Outcome::Succeeded(fingerprint))),
            proptest::sample::select(ErrorCode::ALL.to_vec())
                .prop_map(|code| State::Done(Outcome::Failed(code))),
        ]
    }

    proptest! {
        #[test]
        fn a_stored_call_reads_back_as_written(
            seq in any::<u64>(),
            at_ms in any::<u64>(),
            signature in any::<u64>(),
            poller in any::<bool>(),
            state in state(),
        ) {
            let now = Instant::now();
            let line = format!(
                "{seq}:{at_ms}:{signature}:{}:{}",
                u8::from(poller),
                encode_state(state)
            );
            let call = decode_call(&line, |_| now).unwrap();
            prop_assert_eq!(
                call,
                StoredCall { at: now, signature: Signature::from_raw(signature), poller, state }
            );
        }

        #[test]
        fn stored_settings_read_back_and_anything_else_is_corrupt(
            max_repeats in proptest::option::of(0u32..200),
            ttl_secs in proptest::option::of(0u64..100_000),
            enabled in proptest::option::of(any::<bool>()),
            noise in ".{0,40}",
        ) {
            let settings = LoopSettings { enabled, max_repeats, ttl_secs, mode: None };
            let stored = if settings.is_empty() {
                String::new()
            } else {
                serde_json::to_string(&settings).unwrap()
            };
            match decode_settings(&stored) {
                Ok(read) => prop_assert_eq!(read, settings),
                Err(error) => {
                    prop_assert!(settings.check().is_err());
                    prop_assert!(matches!(error, SharedStoreError::Corrupt(_)));
                }
            }
            if let Ok(read) = decode_settings(&noise) {
                prop_assert!(read.check().is_ok());
            }
        }

        #[test]
        fn any_other_line_is_refused_as_corrupt_without_a_panic(line in ".{0,64}") {
            let now = Instant::now();
            match decode_call(&line, |_| now) {
                Ok(call) => {
                    // Only lines of the stored shape read back.
                    let fields: Vec<&str> = line.splitn(5, ':').collect();
                    prop_assert_eq!(fields.len(), 5);
                    prop_assert_eq!(fields[2].parse::<u64>().ok(), Some(call.signature.raw()));
                }
                Err(error) => prop_assert!(matches!(error, SharedStoreError::Corrupt(_))),
            }
        }
    }
}
