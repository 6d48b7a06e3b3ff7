//! [`RedisRateLimitStore`]: quotas in Redis, shared by every replica.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::Script;

use super::store::{Admission, AdmissionFuture, Quota, RateLimitStore};
use crate::error::ConfigError;
use crate::redis_support::{self, hash_tagged, Connection, StoreSettings};
use crate::shared_store::SharedStoreError;

/// The default prefix of every key the store writes.
pub const DEFAULT_RATE_LIMIT_KEY_PREFIX: &str = "toolcall:rl:";

/// GCRA on the server's clock. `KEYS[1]`: the quota's theoretical arrival time, in µs;
/// `ARGV[1]`: the emission interval in µs; `ARGV[2]`: the burst. Answers 0 when the call is
/// allowed, otherwise the µs until the quota allows one.
const GCRA: &str = r"
local now = redis.call('TIME')
now = tonumber(now[1]) * 1000000 + tonumber(now[2])
local interval = tonumber(ARGV[1])
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then tat = now end
local next_tat = tat + interval
local over = next_tat - now - interval * tonumber(ARGV[2])
if over > 0 then return math.ceil(over) end
redis.call('SET', KEYS[1], string.format('%d', next_tat), 'PX', math.ceil((next_tat - now) / 1000) + 1)
return 0
";

/// Rate-limit quotas in Redis (7.0 or later), shared by every replica that points at the
/// same server: a quota of 10 calls a second is 10 for the fleet, not 10 per replica.
///
/// - Each quota is one key, `<prefix>{<tool>\x1f<tenant or session>}`, holding the
///   quota's theoretical arrival time (GCRA). The braces are a Redis Cluster hash tag.
/// - A check is one round trip: a Lua script (sent by its hash) reads the server's clock,
///   takes one unit of the quota or answers how long until it allows one, and sets the key
///   to expire once the quota is full again. The server's clock, not the replicas', so
///   replicas whose clocks disagree still share one schedule. The schedule counts whole
///   microseconds: a rate above a million calls a second is not limited.
/// - Every check is bounded by the operation timeout (1 s by default); a failed check follows
///   the layer's [`FailurePolicy`](crate::shared_store::FailurePolicy). The connection
///   reconnects by itself.
///
/// Connections are made on first use, inside the Tokio runtime: one multiplexed connection,
/// which clones share.
///
/// ```no_run
/// use std::time::Duration;
/// use tower_toolcall::rate_limit::RedisRateLimitStore;
/// use tower_toolcall::registry::ToolRegistry;
/// use tower_toolcall::RateLimitLayer;
///
/// let store = RedisRateLimitStore::builder("redis://127.0.0.1:6379/")
///     .operation_timeout(Duration::from_millis(200))
///     .build()?;
/// let layer = RateLimitLayer::builder(ToolRegistry::open())
///     .per_second(10)
///     .store(store)
///     .build()?;
/// # let _ = layer;
/// # Ok::<(), tower_toolcall::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct RedisRateLimitStore {
    shared: Arc<Shared>,
}

struct Shared {
    connection: Connection,
    key_prefix: String,
    gcra: Script,
}

impl RedisRateLimitStore {
    /// A store at `url` (e.g. `redis://127.0.0.1:6379/`) with the defaults.
    pub fn open(url: &str) -> Result<RedisRateLimitStore, ConfigError> {
        RedisRateLimitStore::builder(url).build()
    }

    /// A builder for a store at `url`.
    pub fn builder(url: impl Into<String>) -> RedisRateLimitStoreBuilder {
        RedisRateLimitStoreBuilder {
            settings: StoreSettings::new(url.into(), DEFAULT_RATE_LIMIT_KEY_PREFIX),
        }
    }

    /// The Redis key of the quota `key`.
    pub fn quota_key(&self, key: &str) -> String {
        hash_tagged(&self.shared.key_prefix, key, "")
    }
}

impl RateLimitStore for RedisRateLimitStore {
    fn acquire(&self, key: &str, quota: Quota) -> AdmissionFuture {
        let shared = self.shared.clone();
        let redis_key = self.quota_key(key);
        let interval_us = u64::try_from(quota.emission_interval().as_micros()).unwrap_or(u64::MAX);
        Box::pin(async move {
            let wait_us: i64 = shared
                .connection
                .eval(
                    shared
                        .gcra
                        .key(redis_key)
                        .arg(interval_us)
                        .arg(quota.burst.max(1)),
                )
                .await?;
            match u64::try_from(wait_us) {
                Ok(0) => Ok(Admission::Allowed),
                Ok(wait_us) => Ok(Admission::RetryAfter(Duration::from_micros(wait_us))),
                Err(_) => Err(SharedStoreError::Corrupt(format!(
                    "the rate-limit script answered {wait_us}"
                ))),
            }
        })
    }
}

impl fmt::Debug for RedisRateLimitStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.shared
            .connection
            .debug_store(f, "RedisRateLimitStore", &self.shared.key_prefix)
            .finish_non_exhaustive()
    }
}

/// Builds a [`RedisRateLimitStore`]; made by [`RedisRateLimitStore::builder`].
///
/// ```
/// use tower_toolcall::rate_limit::RedisRateLimitStore;
///
/// let err = RedisRateLimitStore::builder("redis://127.0.0.1/").key_prefix("a{b").build().unwrap_err();
/// assert_eq!(err.field(), "rate_limit.redis.key_prefix");
/// ```
#[derive(Debug)]
#[must_use]
pub struct RedisRateLimitStoreBuilder {
    settings: StoreSettings,
}

impl RedisRateLimitStoreBuilder {
    redis_support::store_settings_setters!("toolcall:rl:");

    /// Checks the configuration and builds the store. No connection is made yet.
    pub fn build(self) -> Result<RedisRateLimitStore, ConfigError> {
        let connection = self.settings.connect("rate_limit.redis")?;
        Ok(RedisRateLimitStore {
            shared: Arc::new(Shared {
                connection,
                key_prefix: self.settings.key_prefix,
                gcra: Script::new(GCRA),
            }),
        })
    }
}
