//! The global retry budget: a token bucket shared by every call through a stack, so that an
//! outage cannot turn into a retry storm.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::time::Instant;

use crate::error::ConfigError;

/// Caps retries at a share of the calls plus a small floor, as Finagle's and gRPC's retry
/// budgets do.
///
/// A token bucket: every call (first attempts only) deposits `retry_ratio` tokens (default
/// 0.2), time adds `min_per_second` tokens a second (default 10) so that a trickle of retries
/// is always possible, and each retry takes one token. The bucket holds at most `capacity`
/// tokens (default 100, ten seconds of the floor) and starts full; what quiet periods can
/// save up is thereby bounded. Over any stretch of time, retries are at most
/// `capacity + retry_ratio · calls + min_per_second · seconds`.
///
/// Clones share one bucket: give the same budget to every layer that should share it. Time
/// is tokio's.
///
/// ```
/// use tower_toolcall::retry::GlobalRetryBudget;
///
/// let budget = GlobalRetryBudget::builder()
///     .retry_ratio(0.1)
///     .min_per_second(5.0)
///     .capacity(50.0)
///     .build()?;
/// assert_eq!(budget.capacity(), 50.0);
/// let err = GlobalRetryBudget::builder().retry_ratio(-1.0).build().unwrap_err();
/// assert_eq!(err.field(), "retry.budget.retry_ratio");
/// # Ok::<(), tower_toolcall::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct GlobalRetryBudget {
    inner: Arc<Inner>,
}

struct Inner {
    retry_ratio: f64,
    min_per_second: f64,
    capacity: f64,
    /// Calls not yet folded into the bucket: a call only touches this counter.
    pending_calls: AtomicU64,
    bucket: Mutex<Bucket>,
}

struct Bucket {
    tokens: f64,
    refilled_at: Option<Instant>,
    granted: u64,
    refused: u64,
}

/// What a budget granted and refused so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct BudgetStats {
    /// Retries the budget allowed.
    pub granted: u64,
    /// Retries the budget refused.
    pub refused: u64,
}

impl Default for GlobalRetryBudget {
    fn default() -> Self {
        GlobalRetryBudget::new()
    }
}

impl GlobalRetryBudget {
    /// The default share of calls that may be retried: 20 %.
    pub const DEFAULT_RETRY_RATIO: f64 = 0.2;
    /// The default floor: 10 retries a second.
    pub const DEFAULT_MIN_PER_SECOND: f64 = 10.0;
    /// The default capacity: 100 tokens.
    pub const DEFAULT_CAPACITY: f64 = 100.0;

    /// A budget with the defaults.
    pub fn new() -> Self {
        GlobalRetryBudget::builder()
            .build()
            .expect("the default budget is valid")
    }

    /// A builder for a budget with other numbers.
    pub fn builder() -> GlobalRetryBudgetBuilder {
        GlobalRetryBudgetBuilder {
            retry_ratio: Self::DEFAULT_RETRY_RATIO,
            min_per_second: Self::DEFAULT_MIN_PER_SECOND,
            capacity: Self::DEFAULT_CAPACITY,
        }
    }

    /// The share of calls that may be retried.
    pub fn retry_ratio(&self) -> f64 {
        self.inner.retry_ratio
    }

    /// Retries a second that are always possible.
    pub fn min_per_second(&self) -> f64 {
        self.inner.min_per_second
    }

    /// The most tokens the bucket holds.
    pub fn capacity(&self) -> f64 {
        self.inner.capacity
    }

    /// Counts one call.
    pub(crate) fn deposit(&self) {
        self.inner.pending_calls.fetch_add(1, Ordering::Relaxed);
    }

    /// Takes a token for one retry at `now`; `false` when the budget is spent.
    pub(crate) fn try_withdraw(&self, now: Instant) -> bool {
        let mut bucket = self.lock();
        self.refill(&mut bucket, now);
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            bucket.granted += 1;
            true
        } else {
            bucket.refused += 1;
            false
        }
    }

    /// The tokens in the bucket now: how many retries it would allow at once.
    pub fn available(&self) -> f64 {
        let mut bucket = self.lock();
        self.refill(&mut bucket, Instant::now());
        bucket.tokens
    }

    /// What the budget granted and refused so far.
    pub fn stats(&self) -> BudgetStats {
        let bucket = self.lock();
        BudgetStats {
            granted: bucket.granted,
            refused: bucket.refused,
        }
    }

    fn refill(&self, bucket: &mut Bucket, now: Instant) {
        let inner = &self.inner;
        let calls = inner.pending_calls.swap(0, Ordering::Relaxed);
        let elapsed = bucket
            .refilled_at
            .map_or(0.0, |at| now.saturating_duration_since(at).as_secs_f64());
        bucket.refilled_at = Some(now);
        let earned = calls as f64 * inner.retry_ratio + elapsed * inner.min_per_second;
        bucket.tokens = (bucket.tokens + earned).min(inner.capacity);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Bucket> {
        self.inner
            .bucket
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl fmt::Debug for GlobalRetryBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GlobalRetryBudget")
            .field("retry_ratio", &self.inner.retry_ratio)
            .field("min_per_second", &self.inner.min_per_second)
            .field("capacity", &self.inner.capacity)
            .finish_non_exhaustive()
    }
}

/// Builds a [`GlobalRetryBudget`].
#[derive(Clone, Debug)]
#[must_use]
pub struct GlobalRetryBudgetBuilder {
    retry_ratio: f64,
    min_per_second: f64,
    capacity: f64,
}

impl GlobalRetryBudgetBuilder {
    /// Tokens each call deposits: the share of calls that may be retried (default 0.2).
    pub fn retry_ratio(mut self, ratio: f64) -> Self {
        self.retry_ratio = ratio;
        self
    }

    /// Tokens a second that time adds (default 10).
    pub fn min_per_second(mut self, per_second: f64) -> Self {
        self.min_per_second = per_second;
        self
    }

    /// The most tokens the bucket holds; it starts full (default 100).
    pub fn capacity(mut self, capacity: f64) -> Self {
        self.capacity = capacity;
        self
    }

    /// Checks the numbers and builds the budget.
    pub fn build(self) -> Result<GlobalRetryBudget, ConfigError> {
        for (field, value, min) in [
            ("retry_ratio", self.retry_ratio, 0.0),
            ("min_per_second", self.min_per_second, 0.0),
            ("capacity", self.capacity, 1.0),
        ] {
            if !value.is_finite() || value < min {
                return Err(ConfigError::new(
                    format!("retry.budget.{field}"),
                    format!("must be a finite number of at least {min}, got {value}"),
                ));
            }
        }
        Ok(GlobalRetryBudget {
            inner: Arc::new(Inner {
                retry_ratio: self.retry_ratio,
                min_per_second: self.min_per_second,
                capacity: self.capacity,
                pending_calls: AtomicU64::new(0),
                bucket: Mutex::new(Bucket {
                    tokens: self.capacity,
                    refilled_at: None,
                    granted: 0,
                    refused: 0,
                }),
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn retries_are_a_share_of_calls_plus_a_floor() {
        let budget = GlobalRetryBudget::builder().capacity(10.0).build().unwrap();
        let now = Instant::now();
        let drain = |at: Instant| (0..1000).take_while(|_| budget.try_withdraw(at)).count();
        assert_eq!(drain(now), 10, "starts full");
        for _ in 0..50 {
            budget.deposit();
        }
        assert_eq!(drain(now), 10, "50 calls earn 10 retries");
        assert_eq!(
            drain(now + Duration::from_millis(500)),
            5,
            "half a second earns 5"
        );
        for _ in 0..1000 {
            budget.deposit();
        }
        assert_eq!(
            drain(now + Duration::from_millis(500)),
            10,
            "capped at the capacity"
        );
        assert_eq!(
            budget.stats(),
            BudgetStats {
                granted: 35,
                refused: 4
            }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_numbers_are_kept_and_the_bucket_starts_full() {
        let budget = GlobalRetryBudget::builder()
            .retry_ratio(0.5)
            .min_per_second(2.0)
            .capacity(4.0)
            .build()
            .unwrap();
        assert_eq!(
            (
                budget.retry_ratio(),
                budget.min_per_second(),
                budget.capacity()
            ),
            (0.5, 2.0, 4.0)
        );
        assert_eq!(budget.available(), 4.0);
        assert!(budget.try_withdraw(Instant::now()));
        assert!(budget.try_withdraw(Instant::now()));
        assert_eq!(budget.available(), 2.0);
        tokio::time::advance(Duration::from_millis(250)).await;
        budget.deposit();
        assert_eq!(
            budget.available(),
            3.0,
            "half a token of time, half of a call"
        );
        let shown = format!("{budget:?}");
        assert!(
            shown.contains("retry_ratio: 0.5")
                && shown.contains("min_per_second: 2.0")
                && shown.contains("capacity: 4.0"),
            "{shown}"
        );
        let defaults = GlobalRetryBudget::default();
        assert_eq!(
            (
                defaults.retry_ratio(),
                defaults.min_per_second(),
                defaults.capacity()
            ),
            (0.2, 10.0, 100.0)
        );
    }

    #[test]
    fn the_numbers_are_checked_at_their_bounds() {
        let b = GlobalRetryBudget::builder;
        let field =
            |built: Result<GlobalRetryBudget, ConfigError>| built.unwrap_err().field().to_owned();
        assert!(b()
            .retry_ratio(0.0)
            .min_per_second(0.0)
            .capacity(1.0)
            .build()
            .is_ok());
        assert_eq!(
            field(b().retry_ratio(-0.1).build()),
            "retry.budget.retry_ratio"
        );
        assert_eq!(
            field(b().min_per_second(f64::NAN).build()),
            "retry.budget.min_per_second"
        );
        assert_eq!(
            field(b().min_per_second(f64::INFINITY).build()),
            "retry.budget.min_per_second"
        );
        assert_eq!(field(b().capacity(0.5).build()), "retry.budget.capacity");
    }
}
