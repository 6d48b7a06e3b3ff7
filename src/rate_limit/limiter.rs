//! One tool's keyed limiter on governor, on the tokio clock, and the sweep of idle keys that
//! governor leaves to its users.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use governor::clock::Clock;
use governor::middleware::NoOpMiddleware;
use governor::state::keyed::DashMapStateStore;
use governor::{Quota, RateLimiter};
use tokio::time::Instant;

use crate::envelope::ToolCall;
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

type KeyedLimiter =
    RateLimiter<String, DashMapStateStore<String>, TokioClock, NoOpMiddleware<Duration>>;

/// How often a limiter checks whether it holds too many keys, in calls.
const SIZE_CHECK_EVERY: u64 = 256;

/// A tool's quota, resolved once, and the limiter that enforces it.
pub(crate) struct ToolLimit {
    limiter: KeyedLimiter,
    pub(super) per_second: u32,
    pub(super) burst: u32,
    pub(super) key: RateLimitKey,
    pub(super) on_limit: OnLimit,
    pub(super) max_wait: Duration,
    /// The limit serves every unregistered tool: its keys name the tool.
    shared_by_tools: bool,
    calls: AtomicU64,
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
    /// A limit with `settings` (checked by the builder: rates of at least 1).
    pub(crate) fn new(settings: LimitSettings, clock: TokioClock, shared_by_tools: bool) -> Self {
        let per_second = nonzero(settings.per_second);
        let quota = Quota::per_second(per_second).allow_burst(nonzero(settings.burst));
        ToolLimit {
            limiter: RateLimiter::dashmap_with_clock(quota, clock),
            per_second: settings.per_second,
            burst: settings.burst,
            key: settings.key,
            on_limit: settings.on_limit,
            max_wait: settings.max_wait,
            shared_by_tools,
            calls: AtomicU64::new(0),
        }
    }

    /// The key of `call`'s quota.
    pub(crate) fn key_for(&self, call: &ToolCall) -> String {
        let mut key = String::new();
        if self.shared_by_tools {
            key.push_str(call.tool_namespace());
            key.push_str("::");
            key.push_str(call.tool_name());
            key.push('\u{1f}');
        }
        match self.key {
            RateLimitKey::Tool => {}
            RateLimitKey::ToolTenant => key.push_str(call.tenant_id().unwrap_or_default()),
            RateLimitKey::ToolSession => key.push_str(call.session_key()),
        }
        key
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

    /// `true` once every [`SIZE_CHECK_EVERY`] calls: time to look at the number of keys.
    fn size_check_due(&self) -> bool {
        self.calls.fetch_add(1, Ordering::Relaxed) % SIZE_CHECK_EVERY == SIZE_CHECK_EVERY - 1
    }

    /// Drops the keys whose quota is full again (they are as good as new), and gives the
    /// memory back.
    pub(crate) fn sweep(&self) {
        self.limiter.retain_recent();
        self.limiter.shrink_to_fit();
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

/// Evicts idle keys, which governor keeps forever otherwise: every limiter on a schedule, and
/// a limiter that holds more keys than allowed as soon as it notices.
#[derive(Debug)]
pub(crate) struct Sweeper {
    clock: TokioClock,
    interval: Duration,
    max_keys: usize,
    /// Milliseconds since the clock's origin of the latest scheduled sweep.
    last_sweep: AtomicU64,
}

impl Sweeper {
    pub(crate) fn new(clock: TokioClock, interval: Duration, max_keys: usize) -> Self {
        Sweeper {
            clock,
            interval,
            max_keys,
            last_sweep: AtomicU64::new(0),
        }
    }

    /// After a call through `limit`: sweeps it when it holds too many keys, and sweeps
    /// every limit of `all` when the interval has passed. One caller does each sweep.
    pub(crate) fn tend<'a>(&self, limit: &ToolLimit, all: impl Iterator<Item = &'a ToolLimit>) {
        if limit.size_check_due() && limit.len() > self.max_keys {
            limit.sweep();
        }
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
