//! [`RedisDedupeStore`]: records in Redis, shared by every replica.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{
    Client, FromRedisValue, ProtocolVersion, PushInfo, PushKind, RedisResult, Script,
    ScriptInvocation, Value,
};
use tokio::sync::watch;

use super::{
    at_least_a_millisecond, duration_ms, ClaimOutcome, ClaimRequest, Completion, DedupeStore,
    Finalized, StoreError,
};
use crate::error::ConfigError;
use crate::idempotency::record::{DedupeRecord, RecordState};

/// The default prefix of every key the store writes.
pub const DEFAULT_REDIS_KEY_PREFIX: &str = "toolcall:idem:";
/// The default time one Redis operation may take.
pub const DEFAULT_REDIS_OPERATION_TIMEOUT: Duration = Duration::from_secs(1);
/// The default longest wait between two reads of a record a call waits on, should a
/// completion message be lost.
pub const DEFAULT_FALLBACK_POLL_INTERVAL: Duration = Duration::from_secs(2);

/// The fields of a record's hash, in the order every script reads them.
const FIELDS: [&str; 10] = ["s", "v", "d", "l", "c", "u", "e", "t", "r", "b"];

/// Takes `now_ms` and `now_us` from the server's clock; scripts begin with it.
macro_rules! lua_clock {
    () => {
        "local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local function int(n) return string.format('%.0f', n) end
local function fields(key)
  return redis.call('HMGET', key, 's', 'v', 'd', 'l', 'c', 'u', 'e', 't', 'r', 'b')
end
"
    };
}

/// KEYS: record. ARGV: params digest, lease ms, take over a retriable failure (1/0), body.
/// Returns `{1, now_ms, version}` when claimed, `{0, now_ms, fields}` when held.
const CLAIM: &str = concat!(
    lua_clock!(),
    "local cur = fields(KEYS[1])
local state = cur[1]
local held = false
if state == 'done' then
  held = true
elseif state == 'inflight' then
  held = tonumber(cur[4]) > now_ms
elseif state == 'failed' then
  held = not (ARGV[3] == '1' and cur[9] == '1' and cur[3] == ARGV[1])
end
if held then
  return {0, int(now_ms), cur}
end
local version = now_us
if cur[2] and tonumber(cur[2]) >= version then
  version = tonumber(cur[2]) + 1
end
local lease = tonumber(ARGV[2])
local now = int(now_ms)
local lock_until = int(now_ms + lease)
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 's', 'inflight', 'v', int(version), 'd', ARGV[1], 'l', lock_until,
  'c', now, 'u', now, 'e', lock_until, 't', ARGV[2], 'r', '0', 'b', ARGV[4])
redis.call('PEXPIRE', KEYS[1], lease)
return {1, now, int(version)}
"
);

/// KEYS: record, channel. ARGV: version, state, ttl ms, retriable (1/0), body.
/// Returns `{1}` when written and published, `{0, current version}` otherwise.
const FINALIZE: &str = concat!(
    lua_clock!(),
    "local cur = redis.call('HMGET', KEYS[1], 's', 'v')
if cur[1] ~= 'inflight' or cur[2] ~= ARGV[1] then
  return {0, cur[2]}
end
local ttl = tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 's', ARGV[2], 'u', int(now_ms), 'e', int(now_ms + ttl), 't', ARGV[3],
  'r', ARGV[4], 'b', ARGV[5])
redis.call('HDEL', KEYS[1], 'l')
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PUBLISH', KEYS[2], cjson.encode(fields(KEYS[1])))
return {1}
"
);

/// KEYS: record, channel. ARGV: version, keep ms. Returns 1 when cancelled and published.
const CANCEL: &str = concat!(
    lua_clock!(),
    "local cur = redis.call('HMGET', KEYS[1], 's', 'v')
if cur[1] ~= 'inflight' or cur[2] ~= ARGV[1] then
  return 0
end
local keep = tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 's', 'cancelled', 'u', int(now_ms), 'e', int(now_ms + keep), 't', ARGV[2])
redis.call('HDEL', KEYS[1], 'l')
redis.call('PEXPIRE', KEYS[1], keep)
redis.call('PUBLISH', KEYS[2], cjson.encode(fields(KEYS[1])))
return 1
"
);

/// KEYS: record. ARGV: version, lease ms. Returns 1 when renewed.
const RENEW: &str = concat!(
    lua_clock!(),
    "local cur = redis.call('HMGET', KEYS[1], 's', 'v', 'l')
if cur[1] ~= 'inflight' or cur[2] ~= ARGV[1] or tonumber(cur[3]) <= now_ms then
  return 0
end
local lock_until = int(now_ms + tonumber(ARGV[2]))
redis.call('HSET', KEYS[1], 'l', lock_until, 'e', lock_until, 'u', int(now_ms))
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
return 1
"
);

/// KEYS: record. Returns `{now_ms, fields}`.
const READ: &str = concat!(lua_clock!(), "return {int(now_ms), fields(KEYS[1])}\n");

/// A dedupe store in Redis, shared by every replica that points at the same server.
///
/// - Each step is one Lua script, so it is atomic: a claim (which answers a duplicate with
///   the record that holds the key, so a cache hit is one round trip), a finalize by version
///   (which also publishes the result), a cancel and a lease renewal. A fresh key costs two
///   round trips: the claim and the finalize.
/// - A record is a hash at `<prefix>{<store key>}`; its completion channel is the same name
///   followed by `:done`. The braces are a Redis Cluster hash tag, so a record and its channel
///   live in one slot.
/// - TTLs mirror the memory store: the in-flight lease, then the done or failed TTL, are the
///   key's expiry, kept by Redis on the server's clock; versions (fencing tokens) come from
///   the server's clock as well, so they grow across replicas and across expiries.
/// - A duplicate in another process waits on the per-key channel: it subscribes first, then
///   reads the record again, so no completion is missed; should a message be lost (a
///   reconnect), it reads the record again after at most the fallback poll interval (2 s by
///   default), and when the lease ends. [`stats`](RedisDedupeStore::stats) counts those
///   fallback polls.
/// - Every operation is bounded by the operation timeout (1 s by default); an unreachable
///   server is a [`StoreError`], never a hang. The connection manager reconnects by itself
///   and subscriptions are restored after a reconnect.
///
/// Connections are made on first use, inside the Tokio runtime: one multiplexed connection
/// for commands and, once a call waits, one RESP3 connection for subscriptions. Clones share
/// them.
///
/// ```no_run
/// use std::time::Duration;
/// use tower_toolcall::idempotency::{IdempotencyLayer, RedisDedupeStore};
/// use tower_toolcall::registry::ToolRegistry;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let store = RedisDedupeStore::builder("redis://127.0.0.1:6379/")
///     .key_prefix("agents:idem:")
///     .operation_timeout(Duration::from_millis(500))
///     .build()?;
/// store.ping().await?;
/// let layer = IdempotencyLayer::new(ToolRegistry::open(), store);
/// # let _ = layer;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisDedupeStore {
    shared: Arc<Shared>,
}

struct Shared {
    client: Client,
    subscriber_client: Client,
    connection_config: ConnectionManagerConfig,
    commands: OnceLock<Result<ConnectionManager, String>>,
    subscriber: OnceLock<Result<ConnectionManager, String>>,
    subscriptions: Arc<Subscriptions>,
    key_prefix: String,
    operation_timeout: Duration,
    fallback_poll_interval: Duration,
    scripts: Scripts,
    fallback_polls: AtomicU64,
    pubsub_wakeups: AtomicU64,
}

struct Scripts {
    claim: Script,
    finalize: Script,
    cancel: Script,
    renew: Script,
    read: Script,
}

/// What a [`RedisDedupeStore`] has done.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisStoreStats {
    /// Reads of a waited-on record that no completion message caused: the fallback poll and
    /// the read at the end of a lease.
    pub fallback_polls: u64,
    /// Waits ended by a completion message.
    pub pubsub_wakeups: u64,
    /// Channels this process is subscribed to now.
    pub subscribed_channels: usize,
}

impl RedisDedupeStore {
    /// A store at `url` (e.g. `redis://127.0.0.1:6379/`) with the defaults.
    pub fn open(url: &str) -> Result<RedisDedupeStore, ConfigError> {
        RedisDedupeStore::builder(url).build()
    }

    /// A builder for a store at `url`.
    pub fn builder(url: impl Into<String>) -> RedisDedupeStoreBuilder {
        RedisDedupeStoreBuilder {
            url: url.into(),
            key_prefix: DEFAULT_REDIS_KEY_PREFIX.to_owned(),
            operation_timeout: DEFAULT_REDIS_OPERATION_TIMEOUT,
            fallback_poll_interval: DEFAULT_FALLBACK_POLL_INTERVAL,
        }
    }

    /// Checks that the server answers.
    pub async fn ping(&self) -> Result<(), StoreError> {
        let mut conn = self.shared.commands()?;
        self.shared
            .bounded(async move { redis::cmd("PING").query_async::<()>(&mut conn).await })
            .await
    }

    /// What the store has done.
    pub fn stats(&self) -> RedisStoreStats {
        RedisStoreStats {
            fallback_polls: self.shared.fallback_polls.load(Ordering::Relaxed),
            pubsub_wakeups: self.shared.pubsub_wakeups.load(Ordering::Relaxed),
            subscribed_channels: self.shared.subscriptions.lock().len(),
        }
    }

    /// The Redis key of the record of `store_key`.
    pub fn record_key(&self, store_key: &str) -> String {
        self.shared.record_key(store_key)
    }
}

impl fmt::Debug for RedisDedupeStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisDedupeStore")
            .field("server", &self.shared.client.get_connection_info().addr())
            .field("key_prefix", &self.shared.key_prefix)
            .field("operation_timeout", &self.shared.operation_timeout)
            .field(
                "fallback_poll_interval",
                &self.shared.fallback_poll_interval,
            )
            .finish_non_exhaustive()
    }
}

impl Shared {
    fn record_key(&self, store_key: &str) -> String {
        let mut key = String::with_capacity(self.key_prefix.len() + store_key.len() + 2);
        key.push_str(&self.key_prefix);
        key.push('{');
        key.push_str(store_key);
        key.push('}');
        key
    }

    fn channel(record_key: &str) -> String {
        format!("{record_key}:done")
    }

    fn commands(&self) -> Result<ConnectionManager, StoreError> {
        connection(&self.commands, &self.client, self.connection_config.clone())
    }

    fn subscriber(&self) -> Result<ConnectionManager, StoreError> {
        let subscriptions = self.subscriptions.clone();
        let config = self
            .connection_config
            .clone()
            .set_push_sender(move |info: PushInfo| {
                subscriptions.dispatch(info);
                Ok::<(), std::convert::Infallible>(())
            })
            .set_automatic_resubscription();
        connection(&self.subscriber, &self.subscriber_client, config)
    }

    /// Runs one Redis operation within the operation timeout.
    async fn bounded<T>(&self, op: impl Future<Output = RedisResult<T>>) -> Result<T, StoreError> {
        match tokio::time::timeout(self.operation_timeout, op).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => Err(StoreError::Unavailable(error.to_string())),
            Err(_) => Err(StoreError::Timeout(self.operation_timeout)),
        }
    }

    /// Runs one script within the operation timeout.
    async fn eval<T: FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T, StoreError> {
        let mut conn = self.commands()?;
        self.bounded(invocation.invoke_async(&mut conn)).await
    }

    /// The record at `record_key` and the server's clock.
    async fn read(&self, record_key: &str) -> Result<(u64, Option<DedupeRecord>), StoreError> {
        let reply: Value = self.eval(&self.scripts.read.key(record_key)).await?;
        let mut items = array(reply)?.into_iter();
        let now_ms = int(items.next())?;
        let record = record_from_fields(array(items.next().unwrap_or(Value::Nil))?)?;
        Ok((now_ms, record))
    }

    async fn subscribe(self: &Arc<Self>, channel: &str) -> Result<Subscription, StoreError> {
        let conn = self.subscriber()?;
        loop {
            let slot = self.subscriptions.slot(channel);
            let messages = slot.messages.subscribe();
            let mut state = slot.control.lock().await;
            if state.retired {
                continue;
            }
            if state.subscribers == 0 {
                let mut conn = conn.clone();
                let subscribed = self
                    .bounded(async move { conn.subscribe(channel).await })
                    .await;
                if let Err(error) = subscribed {
                    state.retired = true;
                    self.subscriptions.remove(channel, &slot);
                    return Err(error);
                }
            }
            state.subscribers += 1;
            drop(state);
            return Ok(Subscription {
                shared: self.clone(),
                channel: channel.to_owned(),
                slot,
                messages,
            });
        }
    }
}

/// The connection in `cell`, made on first use.
fn connection(
    cell: &OnceLock<Result<ConnectionManager, String>>,
    client: &Client,
    config: ConnectionManagerConfig,
) -> Result<ConnectionManager, StoreError> {
    cell.get_or_init(|| {
        ConnectionManager::new_lazy_with_config(client.clone(), config).map_err(|e| e.to_string())
    })
    .clone()
    .map_err(StoreError::Unavailable)
}

impl DedupeStore for RedisDedupeStore {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let shared = &self.shared;
        let body = serde_json::to_vec(&request.inflight_record(0, 0))
            .map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let reply: Value = shared
            .eval(
                shared
                    .scripts
                    .claim
                    .key(shared.record_key(&request.key))
                    .arg(request.request.params_digest.as_str())
                    .arg(duration_ms(request.lease))
                    .arg(u8::from(request.take_over_retriable_failure))
                    .arg(body),
            )
            .await?;
        let mut items = array(reply)?.into_iter();
        let claimed = int(items.next())? == 1;
        let now_ms = int(items.next())?;
        if claimed {
            let version = int(items.next())?;
            return Ok(ClaimOutcome::Claimed(
                request.inflight_record(version, now_ms),
            ));
        }
        match record_from_fields(array(items.next().unwrap_or(Value::Nil))?)? {
            Some(record) => Ok(ClaimOutcome::Existing { record, now_ms }),
            None => Err(StoreError::Corrupt(
                "the claim script found a record it did not return".to_owned(),
            )),
        }
    }

    async fn get(&self, key: &str) -> Result<Option<DedupeRecord>, StoreError> {
        let (_, record) = self.shared.read(&self.shared.record_key(key)).await?;
        Ok(record)
    }

    async fn finalize(
        &self,
        claimed: &DedupeRecord,
        completion: Completion,
    ) -> Result<Finalized, StoreError> {
        let shared = &self.shared;
        let ttl = duration_ms(completion.ttl);
        let settled = completion.settle(claimed, 0);
        let retriable = settled.error.as_ref().is_some_and(|e| e.retriable);
        let body = serde_json::to_vec(&settled).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let record_key = shared.record_key(&claimed.key);
        let reply: Value = shared
            .eval(
                shared
                    .scripts
                    .finalize
                    .key(&record_key)
                    .key(Shared::channel(&record_key))
                    .arg(claimed.version)
                    .arg(settled.state.as_str())
                    .arg(ttl)
                    .arg(u8::from(retriable))
                    .arg(body),
            )
            .await?;
        let mut items = array(reply)?.into_iter();
        if int(items.next())? == 1 {
            return Ok(Finalized::Written);
        }
        let current_version = match items.next() {
            None | Some(Value::Nil) => None,
            other => Some(int(other)?),
        };
        Ok(Finalized::Stale { current_version })
    }

    async fn cancel(&self, claimed: &DedupeRecord, keep_for: Duration) -> Result<bool, StoreError> {
        let shared = &self.shared;
        let record_key = shared.record_key(&claimed.key);
        let cancelled: i64 = shared
            .eval(
                shared
                    .scripts
                    .cancel
                    .key(&record_key)
                    .key(Shared::channel(&record_key))
                    .arg(claimed.version)
                    .arg(duration_ms(keep_for).max(1)),
            )
            .await?;
        Ok(cancelled == 1)
    }

    async fn renew(&self, claimed: &DedupeRecord, lease: Duration) -> Result<bool, StoreError> {
        let shared = &self.shared;
        let renewed: i64 = shared
            .eval(
                shared
                    .scripts
                    .renew
                    .key(shared.record_key(&claimed.key))
                    .arg(claimed.version)
                    .arg(duration_ms(lease).max(1)),
            )
            .await?;
        Ok(renewed == 1)
    }

    async fn wait(&self, seen: &DedupeRecord) -> Result<Option<DedupeRecord>, StoreError> {
        let shared = &self.shared;
        let record_key = shared.record_key(&seen.key);
        // Subscribe before reading the record again, so that no completion falls in between.
        let mut subscription = match shared.subscribe(&Shared::channel(&record_key)).await {
            Ok(subscription) => Some(subscription),
            Err(error) => {
                tracing::debug!(%error, "cannot subscribe to completions; waiting by polling");
                None
            }
        };
        loop {
            let (now_ms, current) = shared.read(&record_key).await?;
            let record = match current {
                None => return Ok(None),
                Some(record)
                    if record.state != RecordState::Inflight || record.version != seen.version =>
                {
                    return Ok(Some(record));
                }
                Some(record) => record,
            };
            let lease_left = record.lock_until_ms.unwrap_or(0).saturating_sub(now_ms);
            if lease_left == 0 {
                return Ok(None);
            }
            let next_read = shared
                .fallback_poll_interval
                .min(Duration::from_millis(lease_left.saturating_add(1)));
            let message = match subscription.as_mut() {
                Some(subscription) => {
                    match tokio::time::timeout(next_read, subscription.messages.changed()).await {
                        Ok(Ok(())) => subscription.messages.borrow_and_update().clone(),
                        Ok(Err(_)) | Err(_) => None,
                    }
                }
                None => {
                    tokio::time::sleep(next_read).await;
                    None
                }
            };
            let Some(message) = message else {
                shared.fallback_polls.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            shared.pubsub_wakeups.fetch_add(1, Ordering::Relaxed);
            match record_from_message(&message) {
                Ok(Some(record)) if record.state != RecordState::Inflight => {
                    return Ok(Some(record));
                }
                Ok(_) => {}
                Err(error) => {
                    tracing::warn!(%error, "unreadable completion message; reading the record")
                }
            }
        }
    }

    async fn delete(&self, key: &str) -> Result<bool, StoreError> {
        let mut conn = self.shared.commands()?;
        let record_key = self.shared.record_key(key);
        let deleted: i64 = self
            .shared
            .bounded(async move {
                redis::cmd("DEL")
                    .arg(record_key)
                    .query_async(&mut conn)
                    .await
            })
            .await?;
        Ok(deleted > 0)
    }

    async fn flush_prefix(&self, prefix: &str) -> Result<u64, StoreError> {
        let pattern = format!(
            "{}{{{}*",
            glob_escape(&self.shared.key_prefix),
            glob_escape(prefix)
        );
        let mut deleted = 0;
        let mut cursor = 0;
        loop {
            let (next, keys) = self.shared.scan(cursor, &pattern).await?;
            if !keys.is_empty() {
                let mut conn = self.shared.commands()?;
                let n: u64 = self
                    .shared
                    .bounded(
                        async move { redis::cmd("UNLINK").arg(keys).query_async(&mut conn).await },
                    )
                    .await?;
                deleted += n;
            }
            if next == 0 {
                return Ok(deleted);
            }
            cursor = next;
        }
    }

    async fn sweep_expired(&self) -> Result<u64, StoreError> {
        // Redis expires records itself.
        Ok(0)
    }

    async fn size(&self) -> Result<u64, StoreError> {
        let pattern = format!("{}{{*", glob_escape(&self.shared.key_prefix));
        let mut count = 0;
        let mut cursor = 0;
        loop {
            let (next, keys) = self.shared.scan(cursor, &pattern).await?;
            count += keys.len() as u64;
            if next == 0 {
                return Ok(count);
            }
            cursor = next;
        }
    }
}

impl Shared {
    /// One `SCAN` step over the keys that match `pattern`.
    async fn scan(&self, cursor: u64, pattern: &str) -> Result<(u64, Vec<String>), StoreError> {
        let mut conn = self.commands()?;
        self.bounded(async move {
            redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await
        })
        .await
    }
}

/// `\`-escapes the characters `SCAN MATCH` gives a meaning.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn array(value: Value) -> Result<Vec<Value>, StoreError> {
    match value {
        Value::Array(items) => Ok(items),
        other => Err(StoreError::Corrupt(format!(
            "expected an array from a script, got {other:?}"
        ))),
    }
}

fn int(value: Option<Value>) -> Result<u64, StoreError> {
    match value {
        Some(Value::Int(n)) => u64::try_from(n).ok(),
        Some(Value::BulkString(bytes)) => std::str::from_utf8(&bytes)
            .ok()
            .and_then(|s| s.parse().ok()),
        Some(Value::SimpleString(s)) => s.parse().ok(),
        _ => None,
    }
    .ok_or_else(|| StoreError::Corrupt("expected a whole number from a script".to_owned()))
}

fn text(value: Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes).ok(),
        Value::SimpleString(s) => Some(s),
        _ => None,
    }
}

/// A record from the hash fields in [`FIELDS`] order; `None` when the hash does not exist.
fn record_from_fields(values: Vec<Value>) -> Result<Option<DedupeRecord>, StoreError> {
    record_from_strings(values.into_iter().map(text).collect())
}

/// A record from a completion message: the hash fields as a JSON array.
fn record_from_message(message: &[u8]) -> Result<Option<DedupeRecord>, StoreError> {
    let values: Vec<serde_json::Value> = serde_json::from_slice(message)
        .map_err(|e| StoreError::Corrupt(format!("completion message: {e}")))?;
    record_from_strings(
        values
            .into_iter()
            .map(|v| match v {
                serde_json::Value::String(s) => Some(s),
                _ => None,
            })
            .collect(),
    )
}

fn record_from_strings(values: Vec<Option<String>>) -> Result<Option<DedupeRecord>, StoreError> {
    if values.len() != FIELDS.len() {
        return Err(StoreError::Corrupt(format!(
            "a record has {} fields, expected {}",
            values.len(),
            FIELDS.len()
        )));
    }
    let mut fields = values.into_iter();
    let mut next = || fields.next().flatten();
    let (state, version, digest, lock_until) = (next(), next(), next(), next());
    let (created, updated, expires, ttl, _retriable, body) =
        (next(), next(), next(), next(), next(), next());
    let Some(state) = state else {
        return Ok(None);
    };
    let corrupt = |what: &str| StoreError::Corrupt(format!("a record with {what}"));
    let number = |field: Option<String>, name: &str| {
        field
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or_else(|| corrupt(&format!("no valid `{name}`")))
    };
    let body = body.ok_or_else(|| corrupt("no body"))?;
    let mut record: DedupeRecord = serde_json::from_str(&body)
        .map_err(|e| StoreError::Corrupt(format!("a record body that does not parse: {e}")))?;
    record.state = RecordState::parse(&state).ok_or_else(|| corrupt("an unknown state"))?;
    record.version = number(version, "version")?;
    record.created_at_ms = number(created, "createdAtMs")?;
    record.updated_at_ms = number(updated, "updatedAtMs")?;
    record.expires_at_ms = number(expires, "expiresAtMs")?;
    record.ttl_ms = number(ttl, "ttlMs")?;
    record.lock_until_ms = match lock_until {
        Some(s) => Some(s.parse().map_err(|_| corrupt("no valid `lockUntilMs`"))?),
        None => None,
    };
    if let Some(digest) = digest {
        record.request.params_digest = digest;
    }
    Ok(Some(record))
}

/// The channels this process is subscribed to, and the waiters of each.
#[derive(Default)]
struct Subscriptions {
    channels: Mutex<HashMap<String, Arc<ChannelSlot>>>,
}

struct ChannelSlot {
    /// Serializes `SUBSCRIBE` and `UNSUBSCRIBE` of the channel.
    control: tokio::sync::Mutex<SlotState>,
    /// The latest message.
    messages: watch::Sender<Option<Arc<[u8]>>>,
}

#[derive(Default)]
struct SlotState {
    subscribers: usize,
    /// Removed from the map: a new waiter makes a new slot.
    retired: bool,
}

impl Subscriptions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<ChannelSlot>>> {
        self.channels.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn slot(&self, channel: &str) -> Arc<ChannelSlot> {
        self.lock()
            .entry(channel.to_owned())
            .or_insert_with(|| {
                Arc::new(ChannelSlot {
                    control: tokio::sync::Mutex::new(SlotState::default()),
                    messages: watch::channel(None).0,
                })
            })
            .clone()
    }

    fn remove(&self, channel: &str, slot: &Arc<ChannelSlot>) {
        let mut channels = self.lock();
        if channels.get(channel).is_some_and(|s| Arc::ptr_eq(s, slot)) {
            channels.remove(channel);
        }
    }

    /// Hands a message to the waiters of its channel. Runs on the connection's task: it never
    /// blocks.
    fn dispatch(&self, info: PushInfo) {
        if info.kind != PushKind::Message {
            return;
        }
        let mut data = info.data.into_iter();
        let (Some(channel), Some(Value::BulkString(payload))) =
            (data.next().and_then(text), data.next())
        else {
            return;
        };
        let slot = self.lock().get(&channel).cloned();
        if let Some(slot) = slot {
            slot.messages.send_replace(Some(payload.into()));
        }
    }
}

/// One waiter's subscription to a channel; dropping it unsubscribes the last waiter.
struct Subscription {
    shared: Arc<Shared>,
    channel: String,
    slot: Arc<ChannelSlot>,
    messages: watch::Receiver<Option<Arc<[u8]>>>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let shared = self.shared.clone();
        let channel = std::mem::take(&mut self.channel);
        let slot = self.slot.clone();
        let leave = async move {
            let mut state = slot.control.lock().await;
            state.subscribers -= 1;
            if state.subscribers > 0 {
                return;
            }
            // Unsubscribe before the slot leaves the map, so that a new waiter's SUBSCRIBE
            // comes after this UNSUBSCRIBE.
            if let Ok(mut conn) = shared.subscriber() {
                let ch = channel.clone();
                if let Err(error) = shared
                    .bounded(async move { conn.unsubscribe(ch).await })
                    .await
                {
                    tracing::debug!(%error, "cannot unsubscribe from a completion channel");
                }
            }
            state.retired = true;
            shared.subscriptions.remove(&channel, &slot);
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(leave);
        }
    }
}

/// Builds a [`RedisDedupeStore`]; made by [`RedisDedupeStore::builder`].
#[derive(Debug)]
#[must_use]
pub struct RedisDedupeStoreBuilder {
    url: String,
    key_prefix: String,
    operation_timeout: Duration,
    fallback_poll_interval: Duration,
}

impl RedisDedupeStoreBuilder {
    /// The prefix of every key the store writes (default `toolcall:idem:`); it must not hold
    /// `{` or `}`, which would break the hash tag.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// The time one Redis operation may take (default 1 s).
    pub fn operation_timeout(mut self, timeout: Duration) -> Self {
        self.operation_timeout = timeout;
        self
    }

    /// The longest a waiting call goes without reading the record it waits on, should a
    /// completion message be lost (default 2 s).
    pub fn fallback_poll_interval(mut self, interval: Duration) -> Self {
        self.fallback_poll_interval = interval;
        self
    }

    /// Checks the configuration and builds the store. No connection is made yet.
    pub fn build(self) -> Result<RedisDedupeStore, ConfigError> {
        let client = Client::open(self.url.as_str()).map_err(|e| {
            ConfigError::new(
                "idempotency.redis.url",
                format!("is not a usable Redis URL: {e}; write it as redis://host:port/db"),
            )
        })?;
        if self.key_prefix.is_empty() || self.key_prefix.contains(['{', '}']) {
            return Err(ConfigError::new(
                "idempotency.redis.key_prefix",
                format!(
                    "must be non-empty and free of `{{` and `}}`, got {:?}",
                    self.key_prefix
                ),
            ));
        }
        at_least_a_millisecond(
            "idempotency.redis.operation_timeout",
            self.operation_timeout,
        )?;
        at_least_a_millisecond(
            "idempotency.redis.fallback_poll_interval",
            self.fallback_poll_interval,
        )?;
        let info = client.get_connection_info().clone();
        let resp3 = info
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP3);
        let subscriber_client = Client::open(info.set_redis_settings(resp3)).map_err(|e| {
            ConfigError::new(
                "idempotency.redis.url",
                format!("cannot be used for subscriptions: {e}"),
            )
        })?;
        let connection_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.operation_timeout))
            .set_response_timeout(Some(self.operation_timeout))
            .set_number_of_retries(2)
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_secs(1));
        Ok(RedisDedupeStore {
            shared: Arc::new(Shared {
                client,
                subscriber_client,
                connection_config,
                commands: OnceLock::new(),
                subscriber: OnceLock::new(),
                subscriptions: Arc::default(),
                key_prefix: self.key_prefix,
                operation_timeout: self.operation_timeout,
                fallback_poll_interval: self.fallback_poll_interval,
                scripts: Scripts {
                    claim: Script::new(CLAIM),
                    finalize: Script::new(FINALIZE),
                    cancel: Script::new(CANCEL),
                    renew: Script::new(RENEW),
                    read: Script::new(READ),
                },
                fallback_polls: AtomicU64::new(0),
                pubsub_wakeups: AtomicU64::new(0),
            }),
        })
    }
}
