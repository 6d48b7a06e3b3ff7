//! How long to wait before a retry: exponential backoff with a cap, randomized by one of four
//! kinds of jitter drawn from an injectable random number generator.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, RngExt, SeedableRng};

use crate::bounds::entropy_seed;
use crate::registry::JitterKind;
use crate::time::millis;

/// Exponential backoff with jitter, in whole milliseconds.
///
/// Before retry `k` (`k = 1` after the first attempt failed), the backoff is
/// `b = min(max_delay, base · 2^(k−1))` (a caller's `backoffMultiplier` above 2 takes the
/// place of the 2 for its call), and the delay, with `random(lo, hi)` a uniform draw
/// of whole milliseconds from `lo` to `hi` inclusive ([`RngExt::random_range`]):
///
/// | jitter | delay |
/// |---|---|
/// | [`Full`](JitterKind::Full) (default) | `random(0, b)` |
/// | [`Equal`](JitterKind::Equal) | `b/2 + random(0, b − b/2)` |
/// | [`Decorrelated`](JitterKind::Decorrelated) | `min(max_delay, random(base, max(base, 3 · previous delay)))`, the first previous delay being `base` |
/// | [`Percent`](JitterKind::Percent) | `random(b − b·p/100, b + b·p/100)` with `p` the jitter percent |
///
/// ```
/// use std::time::Duration;
/// use rand::{rngs::SmallRng, SeedableRng};
/// use tower_toolcall::registry::JitterKind;
/// use tower_toolcall::retry::Backoff;
///
/// let backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(4), JitterKind::Full, 0);
/// assert_eq!(backoff.ceiling(1), Duration::from_millis(200));
/// assert_eq!(backoff.ceiling(3), Duration::from_millis(800));
/// assert_eq!(backoff.ceiling(10), Duration::from_secs(4));
/// let mut rng = SmallRng::seed_from_u64(7);
/// assert!(backoff.delay(2, None, &mut rng) <= Duration::from_millis(400));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    base: Duration,
    max: Duration,
    jitter: JitterKind,
    percent: u32,
    /// How much each backoff grows over the one before, in thousandths (2 000: doubling).
    multiplier_permille: u32,
}

/// Doubling, in thousandths.
const DOUBLING: u32 = 2_000;

impl Backoff {
    /// A backoff from `base` doubling up to `max`, with `jitter`; `percent` is the spread of
    /// [`JitterKind::Percent`]. The retry layer's builder checks that `max >= base` and
    /// `percent <= 100`.
    pub const fn new(base: Duration, max: Duration, jitter: JitterKind, percent: u32) -> Self {
        Backoff {
            base,
            max,
            jitter,
            percent,
            multiplier_permille: DOUBLING,
        }
    }

    /// This backoff with the base, cap, spread and growth of one call, narrowed by the retry
    /// layer from the caller's retry policy.
    pub(crate) fn narrowed(
        self,
        base: Duration,
        max: Duration,
        percent: u32,
        multiplier_permille: u32,
    ) -> Self {
        Backoff {
            base,
            max,
            percent,
            multiplier_permille,
            ..self
        }
    }

    /// The base.
    pub fn base(&self) -> Duration {
        self.base
    }

    /// The cap of one backoff.
    pub fn max(&self) -> Duration {
        self.max
    }

    /// The jitter kind.
    pub fn jitter(&self) -> JitterKind {
        self.jitter
    }

    /// The spread of percent jitter.
    pub fn percent(&self) -> u32 {
        self.percent
    }

    /// The backoff before retry `retry` (1-based), before jitter.
    pub fn ceiling(&self, retry: u32) -> Duration {
        let steps = retry.saturating_sub(1).min(63);
        let base = millis(self.base);
        let ms = if self.multiplier_permille == DOUBLING {
            base.saturating_mul(1u64 << steps)
        } else {
            let growth = (f64::from(self.multiplier_permille) / 1000.0).powi(steps as i32);
            // A float past `u64::MAX` converts to `u64::MAX`.
            (base as f64 * growth) as u64
        };
        Duration::from_millis(ms.min(millis(self.max)))
    }

    /// The delay before retry `retry` (1-based); `previous` is the delay before the previous
    /// retry, if there was one.
    pub fn delay<R: Rng + ?Sized>(
        &self,
        retry: u32,
        previous: Option<Duration>,
        rng: &mut R,
    ) -> Duration {
        let b = millis(self.ceiling(retry));
        let ms = match self.jitter {
            JitterKind::Full => rng.random_range(0..=b),
            JitterKind::Equal => b / 2 + rng.random_range(0..=b - b / 2),
            JitterKind::Decorrelated => {
                let base = millis(self.base);
                let previous = previous.map_or(base, millis);
                let high = previous.saturating_mul(3).max(base);
                rng.random_range(base..=high).min(millis(self.max))
            }
            JitterKind::Percent => {
                let spread = b.saturating_mul(u64::from(self.percent)) / 100;
                rng.random_range(b.saturating_sub(spread)..=b.saturating_add(spread))
            }
        };
        Duration::from_millis(ms)
    }
}

/// The random number generator of a layer's jitter, shared by its clones.
impl Backoff {
    /// [`delay`](Backoff::delay) with randomness of the thread's own (seeded from the
    /// system's entropy), for a caller without a generator of its own: an adapter that waits
    /// before reconnecting to a server.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_toolcall::registry::JitterKind;
    /// use tower_toolcall::retry::Backoff;
    ///
    /// let backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5), JitterKind::Equal, 0);
    /// let third = backoff.random_delay(3, None);
    /// assert!(third >= Duration::from_millis(200) && third <= Duration::from_millis(400));
    /// ```
    pub fn random_delay(&self, retry: u32, previous: Option<Duration>) -> Duration {
        thread_local! {
            static RNG: std::cell::RefCell<SmallRng> =
                std::cell::RefCell::new(SmallRng::seed_from_u64(entropy_seed()));
        }
        RNG.with_borrow_mut(|rng| self.delay(retry, previous, rng))
    }
}

#[derive(Clone)]
pub(crate) struct SharedRng(Arc<Mutex<Box<dyn Rng + Send>>>);

impl SharedRng {
    pub(crate) fn new(rng: impl Rng + Send + 'static) -> Self {
        SharedRng(Arc::new(Mutex::new(Box::new(rng))))
    }

    /// A fast generator seeded from the process's random hash keys.
    pub(crate) fn from_entropy() -> Self {
        SharedRng::new(SmallRng::seed_from_u64(entropy_seed()))
    }

    pub(crate) fn delay(
        &self,
        backoff: &Backoff,
        retry: u32,
        previous: Option<Duration>,
    ) -> Duration {
        let mut rng = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        backoff.delay(retry, previous, &mut **rng)
    }
}

impl fmt::Debug for SharedRng {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedRng").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A generator that always returns the same word, so that draws are predictable.
    struct Fixed(u64);

    impl rand::TryRng for Fixed {
        type Error = std::convert::Infallible;

        fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
            Ok(self.0 as u32)
        }

        fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
            Ok(self.0)
        }

        fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Self::Error> {
            dst.fill(0);
            Ok(())
        }
    }

    fn backoff(jitter: JitterKind, percent: u32) -> Backoff {
        Backoff::new(
            Duration::from_millis(200),
            Duration::from_millis(4000),
            jitter,
            percent,
        )
    }

    #[test]
    fn ceiling_doubles_up_to_the_cap() {
        let b = backoff(JitterKind::Full, 0);
        let ceilings: Vec<u64> = (1..=7).map(|k| millis(b.ceiling(k))).collect();
        assert_eq!(ceilings, [200, 400, 800, 1600, 3200, 4000, 4000]);
        assert_eq!(b.ceiling(u32::MAX), Duration::from_millis(4000));
    }

    #[test]
    fn every_kind_stays_in_its_bounds() {
        let mut rng = SmallRng::seed_from_u64(42);
        for retry in 1..=8 {
            let c = millis(backoff(JitterKind::Full, 0).ceiling(retry));
            for _ in 0..200 {
                let full = millis(backoff(JitterKind::Full, 0).delay(retry, None, &mut rng));
                assert!(full <= c);
                let equal = millis(backoff(JitterKind::Equal, 0).delay(retry, None, &mut rng));
                assert!((c / 2..=c).contains(&equal));
                let pct = millis(backoff(JitterKind::Percent, 10).delay(retry, None, &mut rng));
                assert!((c - c / 10..=c + c / 10).contains(&pct), "{pct} around {c}");
                let prev = Duration::from_millis(900);
                let dec =
                    millis(backoff(JitterKind::Decorrelated, 0).delay(retry, Some(prev), &mut rng));
                assert!((200..=2700).contains(&dec));
            }
        }
    }

    #[test]
    fn draws_follow_the_documented_formulas() {
        // `random_range(0..=b)` of a generator stuck at u64::MAX is b.
        let mut high = Fixed(u64::MAX);
        let mut low = Fixed(0);
        assert_eq!(
            backoff(JitterKind::Full, 0).delay(2, None, &mut high),
            Duration::from_millis(400)
        );
        assert_eq!(
            backoff(JitterKind::Full, 0).delay(2, None, &mut low),
            Duration::ZERO
        );
        assert_eq!(
            backoff(JitterKind::Equal, 0).delay(3, None, &mut low),
            Duration::from_millis(400)
        );
        assert_eq!(
            backoff(JitterKind::Percent, 20).delay(1, None, &mut low),
            Duration::from_millis(160)
        );
        assert_eq!(
            backoff(JitterKind::Percent, 20).delay(1, None, &mut high),
            Duration::from_millis(240)
        );
        assert_eq!(
            backoff(JitterKind::Decorrelated, 0).delay(4, Some(Duration::from_secs(3)), &mut high),
            Duration::from_millis(4000)
        );
        assert_eq!(
            backoff(JitterKind::Decorrelated, 0).delay(1, None, &mut low),
            Duration::from_millis(200)
        );
    }
}
