//! [`RedisLoopStore`]: the sessions' recent calls in Redis, shared by every replica.

use std::collections::VecDeque;
use std::fmt::{self, Write as _};
use std::sync::Arc;
use std::time::Duration;

use redis::Script;
use tokio::time::Instant;
use tower_toolcall::loop_detect::store::{
    check_session_settings, Decision, Limits, LoopCall, LoopStore, Observed, Outcome,
    SessionHistory, Settled, Signature, State, StoredCall, Tracked,
};
use tower_toolcall::loop_detect::{LoopDetectSettings, LoopSettingKey};
use tower_toolcall::shared_store::{StoreError, StoreFuture};
use tower_toolcall::{ConfigError, ErrorCode};

use crate::support::{
    self, hash_tagged, millis, unix_now_ms, Batch, Coalescer, Connection, StoreSettings,
};

/// The default prefix of every key the store writes.
pub const DEFAULT_LOOP_KEY_PREFIX: &str = "toolcall:loop:";

/// A session is one string of fixed-width fields, hexadecimal, so that a script finds each
/// by its offset and never parses the calls:
///
/// - its next sequence number (12 digits);
/// - the call last given a chance: signature (16) and time in ms (12), or 28 spaces;
/// - the length of its own settings (4), then the settings (`!/set` overrides, as JSON);
/// - its latest calls, oldest first, [`CALL_LEN`] characters each: time in ms (12),
///   signature (16), result-aware (`0` or `1`), and how it ended: `p` (pending), `r`
///   (refused), `x` (re-sent: answered from the idempotency layer's record), `s`
///   (succeeded) or `f` (failed), then a 16-digit digest of the answer or of the error
///   code (zeros otherwise); then when it ended (12, its time until then), since when its
///   answer had been the same (12), and the idempotency record that answers a re-send of
///   it (16, zeros for none).
///
/// The calls' sequence numbers follow from the next one: the last call has the one before.
/// A key that does not hold a session (another program wrote it, it was damaged, or an
/// older version wrote its calls 46 characters wide) is deleted by the first script that
/// reads it: that session starts afresh, and no other is touched.
const PRELUDE: &str = r"
local CALL = 86
local EMPTY = '000000000000' .. string.rep(' ', 28) .. '0000'
local function calls_from(blob) return 45 + tonumber(string.sub(blob, 41, 44), 16) end
local function is_session(blob)
  if type(blob) ~= 'string' or #blob < 44 then return false end
  if not string.match(string.sub(blob, 1, 12), '^%x+$') then return false end
  if not string.match(string.sub(blob, 41, 44), '^%x+$') then return false end
  local body = calls_from(blob)
  if body - 1 > #blob or (#blob - body + 1) % CALL ~= 0 then return false end
  if body == 45 then return true end
  local ok, own = pcall(cjson.decode, string.sub(blob, 45, body - 1))
  return ok and type(own) == 'table'
end
local function session(key)
  local blob = redis.pcall('GET', key)
  if is_session(blob) then return blob end
  if blob then redis.call('DEL', key) end
  return nil
end
";

/// Characters a call takes in a session's string.
const CALL_LEN: usize = 86;
/// Characters of how a call ended, from its state letter on: the letter, the digest, when
/// it ended and since when its answer had been the same.
const SETTLED_LEN: usize = 41;

/// `OBSERVE` takes calls of one session in arrival order, in runs of calls alike, `ARGV`
/// five by five: window (ms), the calls kept for the rules other than repeats, max repeats,
/// enabled (`1` or `0`), the last four below the session, then the run's calls (written by
/// the replica, [`CALL_LEN`] characters each). For each call, it reads the session's
/// settings that decide what is kept (`enabled`, `max_repeats`, `ttl_secs`, and
/// `max_failures`, which may need more calls than the tiers below it) over the tiers below it, and, when they track the call, appends it keeping as
/// many calls as the rules look at and takes the next sequence number; the session then
/// expires with the last tracked call's window. The session is written once, with the calls
/// that the last call keeps. It answers the session as it was before the first call.
const OBSERVE: &str = r"
local blob = session(KEYS[1]) or EMPTY
local body, window, added = calls_from(blob), nil, {}
local own = body > 45 and cjson.decode(string.sub(blob, 45, body - 1)) or {}
local seq, kept = tonumber(string.sub(blob, 1, 12), 16), (#blob - body + 1) / CALL
for at = 0, #ARGV - 5, 5 do
  local enabled, repeats = ARGV[at + 4] == '1', tonumber(ARGV[at + 3])
  if own.enabled ~= nil then enabled = own.enabled end
  if enabled then
    if own.max_repeats then repeats = own.max_repeats end
    window = own.ttl_secs and own.ttl_secs * 1000 or tonumber(ARGV[at + 1])
    local others = tonumber(ARGV[at + 2])
    if own.max_failures then others = math.max(others, own.max_failures - 1) end
    local keep, calls = math.max(others - 1, repeats - 2, 0), ARGV[at + 5]
    for _ = 1, #calls / CALL do kept = math.min(kept, keep) + 1 end
    seq = seq + #calls / CALL
    added[#added + 1] = calls
  end
end
if window then
  local calls = string.sub(blob, body) .. table.concat(added)
  local header = string.format('%012x', seq) .. string.sub(blob, 13, body - 1)
  redis.call('SET', KEYS[1], header .. string.sub(calls, #calls - CALL * kept + 1), 'PX', window)
end
return blob
";

/// Settles the pending call of sequence number `ARGV[1]` with how it ended, `ARGV[2]`
/// ([`SETTLED_LEN`] characters from its state letter on), and sets the session's chance to
/// `ARGV[3]` unless it is empty; the session keeps its expiry.
const SETTLE: &str = r"
local blob = session(KEYS[1])
if not blob then return 0 end
local body = calls_from(blob)
local n = (#blob - body + 1) / CALL
local index = tonumber(ARGV[1]) - (tonumber(string.sub(blob, 1, 12), 16) - n)
if index >= 0 and index < n then
  local at = body + index * CALL + 29
  if string.sub(blob, at, at) == 'p' then
    blob = string.sub(blob, 1, at - 1) .. ARGV[2] .. string.sub(blob, at + 41)
  end
end
if ARGV[3] ~= '' then blob = string.sub(blob, 1, 12) .. ARGV[3] .. string.sub(blob, 41) end
redis.call('SET', KEYS[1], blob, 'KEEPTTL')
return 1
";

/// Changes the session's settings: sets the members of the JSON object `ARGV[1]`, removes
/// the comma-separated members `ARGV[2]`. Switching detection off drops the calls and the
/// chance. The session then lasts at least its window: its own, or `ARGV[3]` (ms).
const SET_SETTINGS: &str = r"
local blob = session(KEYS[1]) or EMPTY
local body = calls_from(blob)
local own = body == 45 and {} or cjson.decode(string.sub(blob, 45, body - 1))
for name, value in pairs(cjson.decode(ARGV[1])) do own[name] = value end
for name in string.gmatch(ARGV[2], '[^,]+') do own[name] = nil end
local settings = next(own) == nil and '' or cjson.encode(own)
local chance, calls = string.sub(blob, 13, 40), string.sub(blob, body)
if own.enabled == false then chance, calls = string.rep(' ', 28), '' end
local window = own.ttl_secs and own.ttl_secs * 1000 or tonumber(ARGV[3])
window = math.max(window, redis.call('PTTL', KEYS[1]))
local header = string.sub(blob, 1, 12) .. chance .. string.format('%04x', #settings)
redis.call('SET', KEYS[1], header .. settings .. calls, 'PX', window)
return 1
";

/// Drops the session's calls and chance; its settings and sequence stay, with its expiry.
const RESET: &str = r"
local blob = session(KEYS[1])
if not blob then return 0 end
local kept = string.sub(blob, 1, 12) .. string.rep(' ', 28) .. string.sub(blob, 41, calls_from(blob) - 1)
redis.call('SET', KEYS[1], kept, 'KEEPTTL')
return 1
";

/// A script on a session: the common prelude, then `body`.
fn session_script(body: &str) -> Script {
    Script::new(&format!("{PRELUDE}{body}"))
}

/// The default seed of call signatures: every replica that shares a store must hash calls
/// alike.
const DEFAULT_SIGNATURE_SEED: u64 = 0x746f_6f6c_6361_6c6c;

/// Loop detection's per-session state in Redis (7.0 or later), shared by every replica that
/// points at the same server or Redis Cluster (feature `cluster`): a model whose calls are
/// spread over replicas is stopped at the same call as on one. A batch is the calls of one
/// session, one key: on a cluster it never spans slots.
///
/// - A session is one key, `<prefix>{<session>}`: one string of fixed-width fields, its
///   sequence, the call last given a chance, its own settings (`!/set` overrides) and its
///   latest calls (time, signature, and how each ended), as many as the rules look at. The
///   braces are a Redis Cluster hash tag. The key expires with the session's window.
/// - A call is one round trip: a Lua script (two commands, a read and a write) reads the
///   session's settings, appends the call unless they switch detection off, and answers the
///   session as it was, which the layer judges with the same rules as in memory.
/// - Calls of one session that arrive while a script for it is in flight wait, and go
///   together in the next script (at most 256 in one), which appends them in arrival order;
///   each is judged on the history up to itself, earlier calls of the batch included (and
///   marked refused when the rules refuse them), exactly as if they had come one by one. A
///   lone call goes at once, in one round trip. Each call waits at most the operation
///   timeout and follows the failure policy on its own; a caller that gives up before its
///   turn is not sent. A refused call, a re-send, a failure, a read's answer and (when a
///   re-send of it could be answered from a record) the end of a call are then written to
///   its entry (a second, short script), before the caller gets the answer, so the next call
///   on any replica sees them.
/// - A session's settings set through any replica's
///   [`LoopDetectHandle`](tower_toolcall::loop_detect::LoopDetectHandle) are kept there and read with the
///   session's next call on every replica.
/// - Times are the replicas' wall clocks, in milliseconds: windows last seconds or minutes,
///   far longer than the skew of synchronized clocks.
/// - Signatures are keyed hashes with a seed every replica shares
///   ([`signature_seed`](RedisLoopStoreBuilder::signature_seed)).
/// - Every operation is bounded by the operation timeout (1 s by default); a failed one
///   follows the layer's [`FailurePolicy`](tower_toolcall::shared_store::FailurePolicy).
///
/// ```no_run
/// use std::sync::Arc;
/// use tower_toolcall::loop_detect::LoopDetectLayer;
/// use tower_toolcall_redis::RedisLoopStore;
/// use tower_toolcall::registry::ToolRegistry;
///
/// let store = RedisLoopStore::open("redis://127.0.0.1:6379/")?;
/// let layer = LoopDetectLayer::builder(ToolRegistry::open()).store(Arc::new(store)).build()?;
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
    /// Calls waiting for a script of their session, by the session's key.
    waiting: Coalescer<String, Observing, Observed>,
}

/// A call of a session on its way to the store.
struct Observing {
    /// When the call came, in Unix ms.
    now_ms: u64,
    call: LoopCall,
}

impl Observing {
    /// The call as `OBSERVE` appends it.
    fn raw(&self) -> RawCall {
        RawCall {
            at_ms: self.now_ms,
            signature: self.call.signature(),
            result_aware: self.call.limits().result_aware(),
            state: State::Pending,
            ended_ms: self.now_ms,
            since_ms: self.now_ms,
            resend: self.call.resend_id(),
        }
    }

    /// Writes the call as `OBSERVE` appends it.
    fn store(&self, stored: &mut String) {
        write_call(stored, &self.raw());
    }

    /// Whether `OBSERVE` takes `other` with the same settings as this call.
    fn alike(&self, other: &Observing) -> bool {
        let (mine, theirs) = (self.call.limits(), other.call.limits());
        (
            mine.ttl(),
            mine.max_repeats(),
            self.call.enabled(),
            self.keep(),
        ) == (
            theirs.ttl(),
            theirs.max_repeats(),
            other.call.enabled(),
            other.keep(),
        )
    }

    /// The calls the rules other than repeats look at.
    fn keep(&self) -> usize {
        self.call.limits().with_max_repeats(1).history_len()
    }
}

impl Batch for Shared {
    type Key = String;
    type Member = Observing;
    type Answer = Observed;

    fn coalescer(&self) -> &Coalescer<String, Observing, Observed> {
        &self.waiting
    }

    fn timeout(&self) -> Duration {
        self.connection.timeout()
    }

    /// Appends the calls in one script, then judges each on the history before it, as the
    /// session would have been had they come one by one: earlier calls appended, and marked
    /// refused when the rules refuse them. A refused call's own caller writes its refusal.
    async fn run(&self, key: &String, calls: Vec<Observing>) -> Result<Vec<Observed>, StoreError> {
        let mut script = self.observe.key(key);
        for run in calls.chunk_by(|a, b| a.alike(b)) {
            let limits = run[0].call.limits();
            let mut stored = String::with_capacity(run.len() * CALL_LEN);
            for call in run {
                call.store(&mut stored);
            }
            script
                .arg(millis(limits.ttl()).max(1))
                .arg(run[0].keep())
                .arg(limits.max_repeats())
                .arg(u8::from(run[0].call.enabled()))
                .arg(stored);
        }
        let mut blob: Vec<u8> = self.connection.eval(&script).await?;
        let mut read = read_session(&blob);
        if let Err(error) = &read {
            // A damaged session is reset: only its calls are lost, no other session and no
            // check fails.
            tracing::warn!(session = %key, %error, "a damaged loop session was reset");
            let _: i64 = self.connection.command(redis::cmd("DEL").arg(key)).await?;
            blob = self.connection.eval(&script).await?;
            read = read_session(&blob);
        }
        let (settings, mut replay) = read?;
        let now = Instant::now();
        let mut answers = Vec::with_capacity(calls.len());
        let last = calls.len().saturating_sub(1);
        for (index, call) in calls.iter().enumerate() {
            let (tracked, limits) = call.call.under(&settings);
            if !tracked {
                // The script wrote nothing: the session's settings do not track the call.
                answers.push(Observed::new(settings.clone(), None));
                continue;
            }
            let seq = replay.seq;
            let previous = replay.previous_answer(call.call.signature());
            let mut history = replay.history(now, call.now_ms);
            let chance_before = history.chance();
            let decision = call.call.judge(&mut history, now, &limits);
            let chance = history
                .chance()
                .filter(|_| history.chance() != chance_before);
            if index < last {
                replay.append(call, &decision, chance, &limits);
            }
            let tracked = Tracked::new(decision, seq, call.now_ms)
                .with_chance(chance)
                .with_previous(previous);
            answers.push(Observed::new(settings.clone(), Some(tracked)));
        }
        Ok(answers)
    }
}

impl RedisLoopStore {
    /// A store at `target` (a node's URL, e.g. `redis://127.0.0.1:6379/`, or a
    /// [`RedisTarget`](crate::RedisTarget)) with the defaults.
    pub fn open(target: impl Into<crate::RedisTarget>) -> Result<RedisLoopStore, ConfigError> {
        RedisLoopStore::builder(target).build()
    }

    /// A builder for a store at `target`: a node's URL, or a cluster's seeds (see
    /// [`RedisTarget`](crate::RedisTarget)).
    pub fn builder(target: impl Into<crate::RedisTarget>) -> RedisLoopStoreBuilder {
        RedisLoopStoreBuilder {
            settings: StoreSettings::new(target.into(), DEFAULT_LOOP_KEY_PREFIX),
            signature_seed: DEFAULT_SIGNATURE_SEED,
        }
    }

    /// The Redis key of `session`'s latest calls.
    pub fn session_key(&self, session: &str) -> String {
        hash_tagged(&self.shared.key_prefix, session, "")
    }
}

impl LoopStore for RedisLoopStore {
    fn signature_seed(&self) -> u64 {
        self.shared.signature_seed
    }

    /// Appends the call to `session`, unless the session's own settings switch detection
    /// off, and answers them with the history before it. Calls of one session that arrive
    /// while a script for it is in flight go together in the next one (at most 256 in one).
    fn check(&self, session: &str, call: LoopCall) -> StoreFuture<'static, Observed> {
        let observing = Observing {
            now_ms: unix_now_ms(),
            call,
        };
        Box::pin(support::coalesced(
            self.shared.clone(),
            self.session_key(session),
            observing,
        ))
    }

    fn finish(
        &self,
        session: &str,
        seq: u64,
        settled: Settled,
        chance: Option<(Signature, Instant)>,
    ) -> StoreFuture<'static, ()> {
        let now_ms = unix_now_ms();
        let (state, since_ms) = match settled {
            Settled::Rejected => (State::Rejected, now_ms),
            Settled::Resent => (State::Resent, now_ms),
            Settled::Done { outcome, since_ms } => (State::Done(outcome), since_ms),
        };
        let shared = self.shared.clone();
        let key = self.session_key(session);
        let chance = chance.map_or_else(String::new, |(signature, at)| {
            let ago = millis(Instant::now().saturating_duration_since(at));
            format!(
                "{:016x}{:012x}",
                signature.raw(),
                unix_now_ms().saturating_sub(ago)
            )
        });
        Box::pin(async move {
            let _: i64 = shared
                .connection
                .eval(
                    shared
                        .settle
                        .key(&key)
                        .arg(seq)
                        .arg(encode_settled(state, now_ms, since_ms))
                        .arg(chance),
                )
                .await?;
            Ok(())
        })
    }

    fn change_settings(
        &self,
        session: &str,
        set: LoopDetectSettings,
        unset: &[LoopSettingKey],
        window: Duration,
    ) -> StoreFuture<'static, ()> {
        let shared = self.shared.clone();
        let key = self.session_key(session);
        let set = serde_json::to_string(&set).expect("settings serialize");
        let unset = unset
            .iter()
            .map(|key| key.member())
            .collect::<Vec<_>>()
            .join(",");
        let window_ms = millis(window).max(1);
        Box::pin(async move {
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
        })
    }

    fn reset(&self, session: &str) -> StoreFuture<'static, ()> {
        let shared = self.shared.clone();
        let key = self.session_key(session);
        Box::pin(async move {
            let _: i64 = shared.connection.eval(&shared.reset.key(&key)).await?;
            Ok(())
        })
    }

    fn forget(&self, session: &str) -> StoreFuture<'static, ()> {
        let shared = self.shared.clone();
        let mut command = redis::cmd("DEL");
        command.arg(self.session_key(session));
        Box::pin(async move {
            let _: i64 = shared.connection.command(&command).await?;
            Ok(())
        })
    }
}

/// The settings and calls of the session in `blob`.
fn read_session(blob: &[u8]) -> Result<(LoopDetectSettings, Replay), StoreError> {
    let session = StoredSession::decode(blob)?;
    let settings = decode_settings(session.settings)?;
    Ok((settings, Replay::read(&session)?))
}

fn corrupt(what: &str) -> StoreError {
    StoreError::Corrupt(format!("the loop-detection store holds {what}"))
}

/// A session's string, read by its offsets.
#[derive(Debug)]
struct StoredSession<'a> {
    seq: u64,
    chance: Option<(u64, u64)>,
    settings: &'a str,
    calls: &'a [u8],
}

impl<'a> StoredSession<'a> {
    fn decode(blob: &'a [u8]) -> Result<Self, StoreError> {
        let malformed = || corrupt("a malformed session");
        let field = |from: usize, to: usize| blob.get(from..to).ok_or_else(malformed);
        let seq = hex(field(0, 12)?).ok_or_else(malformed)?;
        let chance = field(12, 40)?;
        let chance = if chance.iter().all(|b| *b == b' ') {
            None
        } else {
            let signature = hex(&chance[..16]).ok_or_else(malformed)?;
            Some((signature, hex(&chance[16..]).ok_or_else(malformed)?))
        };
        let settings_len =
            usize::try_from(hex(field(40, 44)?).ok_or_else(malformed)?).map_err(|_| malformed())?;
        let settings =
            std::str::from_utf8(field(44, 44 + settings_len)?).map_err(|_| malformed())?;
        let calls = &blob[44 + settings_len..];
        if !calls.len().is_multiple_of(CALL_LEN) {
            return Err(malformed());
        }
        Ok(StoredSession {
            seq,
            chance,
            settings,
            calls,
        })
    }
}

/// A call as a session's string holds it: its times in Unix ms, and the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RawCall {
    at_ms: u64,
    signature: Signature,
    result_aware: bool,
    state: State,
    ended_ms: u64,
    since_ms: u64,
    resend: u64,
}

impl RawCall {
    /// The call as the rules read it, its times placed by `at` on the tokio clock.
    fn read_at(&self, at: impl Fn(u64) -> Instant) -> StoredCall {
        StoredCall::new(
            at(self.at_ms),
            self.signature,
            self.result_aware,
            self.state,
            at(self.ended_ms),
            at(self.since_ms),
            self.resend,
        )
    }
}

/// A session as `OBSERVE` leaves it after each call of a batch: read once from the string
/// the store answered, then changed call by call as the script changed it.
struct Replay {
    seq: u64,
    chance: Option<(u64, u64)>,
    calls: VecDeque<RawCall>,
}

impl Replay {
    fn read(session: &StoredSession<'_>) -> Result<Self, StoreError> {
        Ok(Replay {
            seq: session.seq,
            chance: session.chance,
            calls: session
                .calls
                .chunks(CALL_LEN)
                .map(decode_raw)
                .collect::<Result<_, _>>()?,
        })
    }

    /// How the latest call of `signature` that ended did, and since when (Unix ms) its answer
    /// had been the same.
    fn previous_answer(&self, signature: Signature) -> Option<(Outcome, u64)> {
        self.calls
            .iter()
            .rev()
            .filter(|call| call.signature == signature)
            .find_map(|call| match call.state {
                State::Done(outcome) => Some((outcome, call.since_ms)),
                _ => None,
            })
    }

    /// The session's history, read at `now`, which is `now_ms` on the replica's wall clock.
    fn history(&self, now: Instant, now_ms: u64) -> SessionHistory {
        let at = |ms: u64| {
            now.checked_sub(Duration::from_millis(now_ms.saturating_sub(ms)))
                .unwrap_or(now)
        };
        let calls = self.calls.iter().map(|call| call.read_at(at));
        let chance = self
            .chance
            .map(|(signature, ms)| (Signature::from_raw(signature), at(ms)));
        SessionHistory::restore(calls, self.seq, chance)
    }

    /// Appends `call`, judged `decision` under `limits`, as `OBSERVE` appends it; when the
    /// rules refuse it, settles it as refused with the session's `chance` when the call
    /// changed it, as the replica that judges it does.
    fn append(
        &mut self,
        call: &Observing,
        decision: &Decision,
        chance: Option<(Signature, Instant)>,
        limits: &Limits,
    ) {
        let refused = matches!(decision, Decision::Reject(_));
        if let Some((signature, _)) = chance.filter(|_| refused) {
            self.chance = Some((signature.raw(), call.now_ms));
        }
        // The script keeps one call at least.
        while self.calls.len() >= limits.history_len().max(1) {
            self.calls.pop_front();
        }
        self.calls.push_back(RawCall {
            state: match decision {
                Decision::Reject(_) => State::Rejected,
                Decision::Resend => State::Resent,
                Decision::Admit(_) => State::Pending,
            },
            ..call.raw()
        });
        self.seq += 1;
    }
}

/// A fixed-width hexadecimal number (at most 16 digits).
fn hex(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 16 || !digits.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    u64::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok()
}

/// A session's settings as stored: JSON, or nothing; checked as when they were set.
fn decode_settings(stored: &str) -> Result<LoopDetectSettings, StoreError> {
    if stored.is_empty() {
        return Ok(LoopDetectSettings::default());
    }
    serde_json::from_str::<LoopDetectSettings>(stored)
        .ok()
        .filter(|settings| check_session_settings(settings).is_ok())
        .ok_or_else(|| corrupt(&format!("malformed session settings {stored:?}")))
}

/// A call as stored, [`CALL_LEN`] characters.
#[cfg(test)]
fn encode_call(call: &RawCall) -> String {
    let mut stored = String::with_capacity(CALL_LEN);
    write_call(&mut stored, call);
    stored
}

/// Writes a call as stored: `<ms><signature><result-aware><settled><resend>`.
fn write_call(stored: &mut String, call: &RawCall) {
    let _ = write!(
        stored,
        "{:012x}{:016x}{}{}{:016x}",
        call.at_ms,
        call.signature.raw(),
        u8::from(call.result_aware),
        encode_settled(call.state, call.ended_ms, call.since_ms),
        call.resend,
    );
}

/// How a call ended, as stored: its state letter and payload, when it ended and since when
/// its answer had been the same ([`SETTLED_LEN`] characters).
fn encode_settled(state: State, ended_ms: u64, since_ms: u64) -> String {
    let (letter, payload) = state_parts(state);
    let settled = format!("{letter}{payload:016x}{ended_ms:012x}{since_ms:012x}");
    debug_assert_eq!(settled.len(), SETTLED_LEN);
    settled
}

/// How a call ended, as stored: its letter and its payload.
fn state_parts(state: State) -> (char, u64) {
    match state {
        State::Pending => ('p', 0),
        State::Rejected => ('r', 0),
        State::Resent => ('x', 0),
        State::Done(Outcome::Succeeded(digest)) => ('s', digest),
        State::Done(Outcome::Failed(code)) => ('f', code_fingerprint(code)),
    }
}

/// A fixed-width stand-in for an error code that does not depend on the codes' order: the
/// FNV-1a hash of its name.
fn code_fingerprint(code: ErrorCode) -> u64 {
    code.as_str()
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
        })
}

#[cfg(test)]
fn decode_call(call: &[u8], at: impl Fn(u64) -> Instant) -> Result<StoredCall, StoreError> {
    Ok(decode_raw(call)?.read_at(at))
}

fn decode_raw(call: &[u8]) -> Result<RawCall, StoreError> {
    let malformed = || {
        corrupt(&format!(
            "a malformed call {:?}",
            String::from_utf8_lossy(call)
        ))
    };
    if call.len() != CALL_LEN {
        return Err(malformed());
    }
    let number = |from: usize, to: usize| hex(&call[from..to]).ok_or_else(malformed);
    let result_aware = match call[28] {
        b'0' => false,
        b'1' => true,
        _ => return Err(malformed()),
    };
    let payload = number(30, 46)?;
    let state = match (call[29], payload) {
        (b'p', 0) => State::Pending,
        (b'r', 0) => State::Rejected,
        (b'x', 0) => State::Resent,
        (b's', digest) => State::Done(Outcome::Succeeded(digest)),
        (b'f', fingerprint) => State::Done(Outcome::Failed(
            ErrorCode::ALL
                .into_iter()
                .find(|code| code_fingerprint(*code) == fingerprint)
                .ok_or_else(malformed)?,
        )),
        _ => return Err(malformed()),
    };
    Ok(RawCall {
        at_ms: number(0, 12)?,
        signature: Signature::from_raw(number(12, 28)?),
        result_aware,
        state,
        ended_ms: number(46, 58)?,
        since_ms: number(58, 70)?,
        resend: number(70, 86)?,
    })
}

impl fmt::Debug for RedisLoopStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.shared
            .connection
            .debug_store(f, "RedisLoopStore", &self.shared.key_prefix)
            .finish_non_exhaustive()
    }
}

/// Builds a [`RedisLoopStore`]; made by [`RedisLoopStore::builder`].
///
/// ```
/// use tower_toolcall_redis::RedisLoopStore;
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
    support::store_settings_setters!("toolcall:loop:");

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
                waiting: Coalescer::default(),
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
            Just(State::Resent),
            any::<u64>().prop_map(|fingerprint| State::Done(Outcome::Succeeded(fingerprint))),
            proptest::sample::select(ErrorCode::ALL.to_vec())
                .prop_map(|code| State::Done(Outcome::Failed(code))),
        ]
    }

    /// A session's settings are stored as JSON with the members that are set, so that what
    /// was stored before reads back the same.
    #[test]
    fn a_session_s_settings_are_stored_as_the_same_json() {
        let mut settings = LoopDetectSettings::default();
        assert_eq!(serde_json::to_string(&settings).unwrap(), "{}");
        settings.max_repeats = Some(3);
        assert_eq!(
            serde_json::to_string(&settings).unwrap(),
            r#"{"max_repeats":3}"#
        );
        settings.enabled = Some(false);
        settings.ttl_secs = Some(30);
        settings.mode = Some(tower_toolcall::registry::LoopMode::ChanceThenBreak);
        settings.max_failures = Some(2);
        settings.poll_budget_secs = Some(0);
        let stored = r#"{"enabled":false,"max_repeats":3,"ttl_secs":30,"mode":"chance_then_break","max_failures":2,"poll_budget_secs":0}"#;
        assert_eq!(serde_json::to_string(&settings).unwrap(), stored);
        assert_eq!(decode_settings(stored).unwrap(), settings);
        // What the script writes back, in another order, reads the same.
        let rewritten = r#"{"mode":"chance_then_break","poll_budget_secs":0,"max_failures":2,"ttl_secs":30,"max_repeats":3,"enabled":false}"#;
        assert_eq!(decode_settings(rewritten).unwrap(), settings);
        // A setting a session does not set is not a session's.
        assert!(matches!(
            decode_settings(r#"{"max_repeats":3,"max_sessions":10}"#),
            Err(StoreError::Corrupt(_))
        ));
    }

    proptest! {
        #[test]
        fn a_stored_call_reads_back_as_written(
            at_ms in 0u64..(1 << 48),
            ended_ms in 0u64..(1 << 48),
            since_ms in 0u64..(1 << 48),
            signature in any::<u64>(),
            result_aware in any::<bool>(),
            state in state(),
            resend in any::<u64>(),
        ) {
            let now = Instant::now();
            let raw = RawCall {
                at_ms,
                signature: Signature::from_raw(signature),
                result_aware,
                state,
                ended_ms,
                since_ms,
                resend,
            };
            let stored = encode_call(&raw);
            prop_assert_eq!(stored.len(), CALL_LEN);
            prop_assert_eq!(decode_raw(stored.as_bytes()).unwrap(), raw);
            let call = decode_call(stored.as_bytes(), |_| now).unwrap();
            prop_assert_eq!(
                call,
                StoredCall::new(
                    now,
                    Signature::from_raw(signature),
                    result_aware,
                    state,
                    now,
                    now,
                    resend,
                )
            );
        }

        #[test]
        fn a_stored_session_reads_back_by_its_offsets(
            seq in 0u64..(1 << 48),
            chance in proptest::option::of((any::<u64>(), 0u64..(1 << 48))),
            max_repeats in proptest::option::of(2u32..50),
            calls in 0usize..10,
        ) {
            let settings = max_repeats
                .map(|max| {
                    let mut settings = LoopDetectSettings::default();
                    settings.max_repeats = Some(max);
                    serde_json::to_string(&settings).unwrap()
                })
                .unwrap_or_default();
            let chance_text = chance.map_or_else(
                || " ".repeat(28),
                |(signature, ms)| format!("{signature:016x}{ms:012x}"),
            );
            let call = encode_call(&RawCall {
                at_ms: 7,
                signature: Signature::from_raw(9),
                result_aware: false,
                state: State::Pending,
                ended_ms: 7,
                since_ms: 7,
                resend: 0,
            });
            let blob = format!(
                "{seq:012x}{chance_text}{:04x}{settings}{}",
                settings.len(),
                call.repeat(calls)
            );
            let session = StoredSession::decode(blob.as_bytes()).unwrap();
            prop_assert_eq!(session.seq, seq);
            prop_assert_eq!(session.chance, chance);
            prop_assert_eq!(session.settings, settings.as_str());
            prop_assert_eq!(session.calls.len(), calls * CALL_LEN);
            // Cut anywhere inside a call, it is refused, not misread.
            if calls > 0 {
                let cut = &blob.as_bytes()[..blob.len() - 1];
                prop_assert!(matches!(
                    StoredSession::decode(cut),
                    Err(StoreError::Corrupt(_))
                ));
            }
        }

        #[test]
        fn stored_settings_read_back_and_anything_else_is_corrupt(
            max_repeats in proptest::option::of(0u32..200),
            ttl_secs in proptest::option::of(0u64..100_000),
            enabled in proptest::option::of(any::<bool>()),
            max_failures in proptest::option::of(0u32..1200),
            poll_budget_secs in proptest::option::of(0u64..40_000_000),
            noise in ".{0,40}",
        ) {
            let mut settings = LoopDetectSettings::default();
            settings.enabled = enabled;
            settings.max_repeats = max_repeats;
            settings.ttl_secs = ttl_secs;
            settings.mode = None;
            settings.max_failures = max_failures;
            settings.poll_budget_secs = poll_budget_secs;
            let stored = if settings == LoopDetectSettings::default() {
                String::new()
            } else {
                serde_json::to_string(&settings).unwrap()
            };
            match decode_settings(&stored) {
                Ok(read) => prop_assert_eq!(read, settings),
                Err(error) => {
                    prop_assert!(check_session_settings(&settings).is_err());
                    prop_assert!(matches!(error, StoreError::Corrupt(_)));
                }
            }
            if let Ok(read) = decode_settings(&noise) {
                prop_assert!(check_session_settings(&read).is_ok());
            }
        }

        #[test]
        fn anything_else_is_refused_as_corrupt_without_a_panic(bytes in proptest::collection::vec(any::<u8>(), 0..120)) {
            let now = Instant::now();
            match decode_call(&bytes, |_| now) {
                Ok(call) => {
                    // Only calls of the stored shape read back, and write back the same.
                    prop_assert_eq!(bytes.len(), CALL_LEN);
                    let raw = decode_raw(&bytes).unwrap();
                    prop_assert_eq!(call.signature, raw.signature);
                    let again = encode_call(&raw);
                    prop_assert_eq!(again.to_ascii_lowercase(), String::from_utf8(bytes.clone()).unwrap().to_ascii_lowercase());
                }
                Err(error) => prop_assert!(matches!(error, StoreError::Corrupt(_))),
            }
            if let Err(error) = StoredSession::decode(&bytes) {
                prop_assert!(matches!(error, StoreError::Corrupt(_)));
            }
        }
    }
}
