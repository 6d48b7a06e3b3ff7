//! [`RedisRateLimitStore`]: quotas in Redis, shared by every replica.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::Script;

use tower_toolcall::rate_limit::{Admission, Quota, RateLimitStore};
use tower_toolcall::shared_store::StoreError;
use tower_toolcall::shared_store::StoreFuture;
use tower_toolcall::ConfigError;

use crate::support::{self, hash_tagged, Batch, Coalescer, Connection, StoreSettings};

/// The default prefix of every key the store writes.
pub const DEFAULT_RATE_LIMIT_KEY_PREFIX: &str = "toolcall:rl:";

/// GCRA on the server's clock, for `ARGV[3]` calls in arrival order. `KEYS[1]`: the quota's
/// theoretical arrival time, in µs; `ARGV[1]`: the emission interval in µs; `ARGV[2]`: the
/// burst. The calls are taken one by one, as if each came alone at the same instant: the
/// first `allowed` take a unit each, and once one is refused so is every later one, with the
/// same wait. Answers `{allowed, µs until the quota allows the first refused call}`.
const GCRA: &str = r"
local now = redis.call('TIME')
now = tonumber(now[1]) * 1000000 + tonumber(now[2])
local interval, calls = tonumber(ARGV[1]), tonumber(ARGV[3])
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then tat = now end
local limit = now + interval * tonumber(ARGV[2])
local allowed = calls
if interval > 0 then allowed = math.max(0, math.min(calls, math.floor((limit - tat) / interval))) end
if allowed > 0 then
  tat = tat + allowed * interval
  redis.call('SET', KEYS[1], string.format('%d', tat), 'PX', math.ceil((tat - now) / 1000) + 1)
end
if allowed == calls then return {allowed, 0} end
return {allowed, math.ceil(tat + interval - limit)}
";

/// Rate-limit quotas in Redis (7.0 or later), shared by every replica that points at the
/// same server or Redis Cluster (feature `cluster`): a quota of 10 calls a second is 10 for
/// the fleet, not 10 per replica.
///
/// - Each quota is one key, `<prefix>{<tool>\x1f<tenant or session>}`, holding the
///   quota's theoretical arrival time (GCRA). The braces are a Redis Cluster hash tag.
/// - A check is one round trip: a Lua script (sent by its hash) reads the server's clock,
///   takes one unit of the quota or answers how long until it allows one, and sets the key
///   to expire once the quota is full again. The server's clock, not the replicas', so
///   replicas whose clocks disagree still share one schedule. The schedule counts whole
///   microseconds: a rate above a million calls a second is not limited.
/// - Checks of one quota that arrive while a script for it is in flight wait, and go
///   together in the next script (at most 256 in one), which takes their units one by one in
///   arrival order: each is allowed or refused exactly as if it had come alone (a burst of
///   100 lets exactly 100 of any number of concurrent calls through, and the rest hear the
///   same retry-after). A lone check goes at once, in one round trip; under load, one round
///   trip serves many. Each check waits at most the operation timeout and follows the
///   failure policy on its own; a caller that gives up before its turn takes no unit. A
///   batch is the checks of one quota, one key: on a cluster it never spans slots, and it
///   runs on the clock of its key's master.
/// - Every check is bounded by the operation timeout (1 s by default); a failed check follows
///   the layer's [`FailurePolicy`](tower_toolcall::shared_store::FailurePolicy). The connection
///   reconnects by itself.
///
/// Connections are made on first use, inside the Tokio runtime: one multiplexed connection,
/// which clones share.
///
/// ```no_run
/// use std::sync::Arc;
/// use std::time::Duration;
/// use tower_toolcall_redis::RedisRateLimitStore;
/// use tower_toolcall::registry::{RateLimitSettings, ToolRegistry};
/// use tower_toolcall::RateLimitLayer;
///
/// let store = RedisRateLimitStore::builder("redis://127.0.0.1:6379/")
///     .operation_timeout(Duration::from_millis(200))
///     .build()?;
/// let layer = RateLimitLayer::builder(ToolRegistry::open())
///     .settings(RateLimitSettings::default().with_per_second(10))
///     .store(Arc::new(store))
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
    /// Checks waiting for a script of their quota: the key and the quota name it.
    waiting: Coalescer<(String, Quota), (), Admission>,
}

impl Batch for Shared {
    type Key = (String, Quota);
    type Member = ();
    type Answer = Admission;

    fn coalescer(&self) -> &Coalescer<(String, Quota), (), Admission> {
        &self.waiting
    }

    fn timeout(&self) -> Duration {
        self.connection.timeout()
    }

    async fn run(
        &self,
        (key, quota): &(String, Quota),
        calls: Vec<()>,
    ) -> Result<Vec<Admission>, StoreError> {
        let interval_us = u64::try_from(quota.emission_interval().as_micros()).unwrap_or(u64::MAX);
        let (allowed, wait_us): (u64, i64) = self
            .connection
            .eval(
                self.gcra
                    .key(key)
                    .arg(interval_us)
                    .arg(quota.burst.max(1))
                    .arg(calls.len()),
            )
            .await?;
        let refused = match u64::try_from(wait_us) {
            Ok(wait_us) => Admission::RetryAfter(Duration::from_micros(wait_us)),
            Err(_) => {
                return Err(StoreError::Corrupt(format!(
                    "the rate-limit script answered {wait_us}"
                )))
            }
        };
        let allowed = usize::try_from(allowed)
            .unwrap_or(usize::MAX)
            .min(calls.len());
        let mut answers = vec![Admission::Allowed; allowed];
        answers.resize(calls.len(), refused);
        Ok(answers)
    }
}

impl RedisRateLimitStore {
    /// A store at `target` (a node's URL, e.g. `redis://127.0.0.1:6379/`, or a
    /// [`RedisTarget`](crate::RedisTarget)) with the defaults.
    pub fn open(target: impl Into<crate::RedisTarget>) -> Result<RedisRateLimitStore, ConfigError> {
        RedisRateLimitStore::builder(target).build()
    }

    /// A builder for a store at `target`: a node's URL, or a cluster's seeds (see
    /// [`RedisTarget`](crate::RedisTarget)).
    pub fn builder(target: impl Into<crate::RedisTarget>) -> RedisRateLimitStoreBuilder {
        RedisRateLimitStoreBuilder {
            settings: StoreSettings::new(target.into(), DEFAULT_RATE_LIMIT_KEY_PREFIX),
        }
    }

    /// The Redis key of the quota `key`.
    pub fn quota_key(&self, key: &str) -> String {
        hash_tagged(&self.shared.key_prefix, key, "")
    }
}

impl RateLimitStore for RedisRateLimitStore {
    fn acquire(&self, key: &str, quota: Quota) -> StoreFuture<'static, Admission> {
        let key = (self.quota_key(key), quota);
        Box::pin(support::coalesced(self.shared.clone(), key, ()))
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
/// use tower_toolcall_redis::RedisRateLimitStore;
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
    support::store_settings_setters!("toolcall:rl:");

    /// Checks the configuration and builds the store. No connection is made yet.
    pub fn build(self) -> Result<RedisRateLimitStore, ConfigError> {
        let connection = self.settings.connect("rate_limit.redis")?;
        Ok(RedisRateLimitStore {
            shared: Arc::new(Shared {
                connection,
                key_prefix: self.settings.key_prefix,
                gcra: Script::new(GCRA),
                waiting: Coalescer::default(),
            }),
        })
    }
}
