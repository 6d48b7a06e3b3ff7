//! One tool's keyed limiter on governor, on the tokio clock, with a hard cap on its keys, and
//! the sweep of idle keys that governor leaves to its users.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use governor::clock::Clock;
use governor::middleware::NoOpMiddleware;
use governor::nanos::Nanos;
use governor::state::keyed::ShrinkableKeyedStateStore;
use governor::state::StateStore;
use governor::RateLimiter;
use tokio::time::Instant;

use crate::envelope::ToolCall;
use hashlink::LruCache;

use super::store::Quota;
use crate::bounds::CallerKeyHasher;
use crate::registry::{OnLimit, RateLimitKey};

/// governor's clock on tokio time, so that paused time drives the limits in tests.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TokioClock {
    origin: Instant,
}

impl TokioClock {
    pub(crate) fn new() -> Self {
        TokioClock {
            origin: Instant::now(),
        }
    }
}

impl Clock for TokioClock {
    type Instant = Duration;

    fn now(&self) -> Duration {
        Instant::now().saturating_duration_since(self.origin)
    }
}

type KeyedLimiter = RateLimiter<String, BoundedKeys, TokioClock, NoOpMiddleware<Duration>>;

/// governor's state of each key (the theoretical arrival time of its next call), for at most
/// `max_keys` keys: a new key beyond them takes the place of the least recently used one.
///
/// The cap holds at every moment, whatever the rate of new keys: one lock guards the check and
/// the insertion. The key that makes room has gone unused longer than any other; unless more
/// callers than `max_keys` are active at once, its quota is full again and it loses nothing.
/// If it was not, it starts again with a full burst when it comes back.
#[derive(Debug)]
struct BoundedKeys {
    keys: Mutex<LruCache<String, u64, CallerKeyHasher>>,
}

impl BoundedKeys {
    fn new(max_keys: usize) -> Self {
        BoundedKeys {
            keys: Mutex::new(LruCache::with_hasher(max_keys, CallerKeyHasher::default())),
        }
    }

    fn lock(&self) -> MutexGuard<'_, LruCache<String, u64, CallerKeyHasher>> {
        // No code panics while holding the lock, so a poisoned map is still consistent.
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl StateStore for BoundedKeys {
    type Key = String;

    fn measure_and_replace<T, F, E>(&self, key: &String, f: F) -> Result<T, E>
    where
        F: Fn(Option<Nanos>) -> Result<(T, Nanos), E>,
    {
        let mut keys = self.lock();
        if let Some(state) = keys.get_mut(key.as_str()) {
            let (outcome, next) = f(Some(Nanos::from(*state)))?;
            *state = next.into();
            return Ok(outcome);
        }
        // A new key is kept only once it has taken a call; at the cap, it takes the place of
        // the least recently used one.
        let (outcome, next) = f(None)?;
        keys.insert(key.clone(), next.into());
        Ok(outcome)
    }
}

impl ShrinkableKeyedStateStore<String> for BoundedKeys {
    fn retain_recent(&self, drop_below: Nanos) {
        let drop_below = u64::from(drop_below);
        self.lock().retain(|_, state| *state > drop_below);
    }

    fn len(&self) -> usize {
        self.lock().len()
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A tool's quota, resolved once, and the limiter that enforces it.
pub(crate) struct ToolLimit {
    limiter: KeyedLimiter,
    pub(super) per_second: u32,
    pub(super) burst: u32,
    pub(super) key: RateLimitKey,
    pub(super) on_limit: OnLimit,
    pub(super) max_wait: Duration,
    /// Its keys name the tool: the limit serves every unregistered tool, or its quotas are
    /// kept in a store that every tool shares.
    names_tool: bool,
}

/// What the layer's settings are for one tool.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LimitSettings {
    pub(crate) per_second: u32,
    pub(crate) burst: u32,
    pub(crate) key: RateLimitKey,
    pub(crate) on_limit: OnLimit,
    pub(crate) max_wait: Duration,
}

impl ToolLimit {
    /// A limit with `settings` (checked by the builder: rates of at least 1) that tracks at
    /// most `max_keys` keys.
    pub(crate) fn new(
        settings: LimitSettings,
        clock: TokioClock,
        max_keys: usize,
        names_tool: bool,
    ) -> Self {
        let per_second = nonzero(settings.per_second);
        let quota = governor::Quota::per_second(per_second).allow_burst(nonzero(settings.burst));
        ToolLimit {
            limiter: RateLimiter::new(quota, BoundedKeys::new(max_keys), clock),
            per_second: settings.per_second,
            burst: settings.burst,
            key: settings.key,
            on_limit: settings.on_limit,
            max_wait: settings.max_wait,
            names_tool,
        }
    }

    /// The key of `call`'s quota.
    pub(crate) fn key_for(&self, call: &ToolCall) -> String {
        let mut key = String::new();
        if self.names_tool {
            key.push_str(call.tool_namespace());
            key.push_str("::");
            key.push_str(call.tool_name());
            key.push('\u{1f}');
        }
        match self.key {
            RateLimitKey::Tool => {}
            RateLimitKey::ToolTenant => key.push_str(call.tenant_id().unwrap_or_default()),
            RateLimitKey::ToolSession => key.push_str(call.session_key()),
            RateLimitKey::ToolActor => {
                key.push_str(call.tenant_id().unwrap_or_default());
                key.push('\u{1f}');
                key.push_str(call.actor_id());
            }
        }
        key
    }

    /// The quota, for a shared store.
    pub(crate) fn quota(&self) -> Quota {
        Quota {
            per_second: self.per_second,
            burst: self.burst,
        }
    }

    /// Takes one call from `key`'s quota, or says how long until it allows one.
    pub(crate) fn check(&self, key: &String) -> Result<(), Duration> {
        self.limiter
            .check_key(key)
            .map_err(|not_until| not_until.wait_time_from(self.limiter.clock().now()))
    }

    /// `true` when a call over the quota, allowed one after `wait`, waits for it rather
    /// than being refused.
    pub(crate) fn waits_for(&self, wait: Duration) -> bool {
        self.on_limit == OnLimit::Wait && wait <= self.max_wait
    }

    /// Drops the keys whose quota is full again (they are as good as new).
    pub(crate) fn sweep(&self) {
        self.limiter.retain_recent();
    }

    /// Keys tracked now.
    pub(crate) fn len(&self) -> usize {
        self.limiter.len()
    }
}

impl fmt::Debug for ToolLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolLimit")
            .field("per_second", &self.per_second)
            .field("burst", &self.burst)
            .field("key", &self.key)
            .field("on_limit", &self.on_limit)
            .field("max_wait", &self.max_wait)
            .finish_non_exhaustive()
    }
}

/// Evicts idle keys, which governor keeps forever otherwise: every limiter on a schedule.
#[derive(Debug)]
pub(crate) struct Sweeper {
    clock: TokioClock,
    interval: Duration,
    /// Milliseconds since the clock's origin of the latest scheduled sweep.
    last_sweep: AtomicU64,
}

impl Sweeper {
    pub(crate) fn new(clock: TokioClock, interval: Duration) -> Self {
        Sweeper {
            clock,
            interval,
            last_sweep: AtomicU64::new(0),
        }
    }

    /// After a call: sweeps every limit of `all` when the interval has passed. One caller
    /// does each sweep.
    pub(crate) fn tend<'a>(&self, all: impl Iterator<Item = &'a ToolLimit>) {
        let now = crate::time::millis(self.clock.now());
        let last = self.last_sweep.load(Ordering::Relaxed);
        let due = now.saturating_sub(last) >= crate::time::millis(self.interval);
        if due
            && self
                .last_sweep
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            for limit in all {
                limit.sweep();
            }
        }
    }
}

fn nonzero(n: u32) -> std::num::NonZeroU32 {
    std::num::NonZeroU32::new(n.max(1)).expect("at least 1")
}
