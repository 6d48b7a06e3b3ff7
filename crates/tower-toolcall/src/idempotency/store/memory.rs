//! [`InMemoryDedupeStore`]: records in the process, bounded, with a background sweep.

use std::borrow::Borrow;
use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use hashlink::{LinkedHashSet, LruCache};
use tokio::sync::watch;
use tokio::time::{Instant, MissedTickBehavior};

use super::{
    at_least_a_millisecond, ClaimOutcome, ClaimRequest, Completion, DedupeStore, Finalized,
    StoreError, StoreFuture,
};
use crate::bounds::{json_bytes, CallerKeyHasher};
use crate::envelope::ToolCall;
use crate::error::ConfigError;
use crate::idempotency::key::fingerprint_matches;
use crate::idempotency::record::{AttemptRecord, DedupeRecord, RecordState};
use crate::time::{millis, unix_now_ms};

/// The default capacity: 25 000 records.
const DEFAULT_MEMORY_CAPACITY: usize = 25_000;
/// The default capacity in bytes: 64 MiB of records, by their approximate size in memory.
const DEFAULT_MEMORY_MAX_BYTES: usize = 64 << 20;
/// The default interval of the background sweep of expired records: one minute.
const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(60);

/// The embedded dedupe store: records in this process, bounded, waiters woken without
/// polling.
///
/// - In-flight records each have a channel that wakes the calls waiting on it when it is
///   finalized, cancelled, taken over or deleted.
/// - Settled records (`done`, `failed`, `cancelled`) are kept in a least-recently-used order. At
///   capacity (in-flight and settled together, 25 000 by default) a new key evicts the least
///   recently used settled record; an in-flight record is never evicted. When every record is
///   in flight the claim fails with [`StoreError::CapacityExhausted`] (the layer answers
///   `STORE_UNAVAILABLE`), which is counted and logged.
/// - The room is shared between tenants, and between sessions for calls without a tenant:
///   each holds a share of the capacity and of the bytes, the whole divided by how many of
///   them have records, and never less than 64 records' worth
///   ([`min_share`](InMemoryDedupeStoreBuilder::min_share)). When room is needed, one over
///   its share gives it: the caller's own least recently used record if the caller is over
///   its share, else that of the one holding the most. So a client that floods the store with
///   keys evicts its own oldest records, never those of another within its share. Only when
///   every one is within its share does the least recently used record of the whole store
///   go.
/// - A record evicted before its TTL ended is counted ([`MemoryStoreStats::evicted_live`])
///   and logged at WARN (the first, then every 1 000th): its key is free again, and a re-send
///   with it runs the tool again. That is the limit of an embedded store: size its capacity
///   for the records every client together must keep for their TTL, or share a
///   `RedisDedupeStore` (feature `redis`).
/// - The records are bounded in bytes too (64 MiB by default), by their approximate size in
///   memory: their strings, and the output or error they keep. A claim or a result that would
///   pass the bound evicts the least recently used settled records, as the capacity does; a
///   claim that cannot make room is refused in the same way, and a result is kept even when it
///   alone passes the bound (the next claim evicts it first).
/// - Expired records are ignored when read and removed by a background sweep (every minute
///   by default) that starts with the first claim and stops when the last handle to the store
///   is dropped.
/// - Time is Tokio's, so tests with paused time govern TTLs and leases.
///
/// Clones share the store.
///
/// ```
/// use std::time::Duration;
/// use tower_toolcall::idempotency::InMemoryDedupeStore;
///
/// let store = InMemoryDedupeStore::builder()
///     .capacity(10_000)
///     .max_bytes(16 << 20)
///     .sweep_interval(Duration::from_secs(30))
///     .build()?;
/// assert_eq!(store.stats().records, 0);
/// # Ok::<(), tower_toolcall::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct InMemoryDedupeStore {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    limits: Limits,
    sweep_interval: Duration,
    clock: Clock,
    sweeper_started: AtomicBool,
    evicted: AtomicU64,
    evicted_live: AtomicU64,
    rejected_at_capacity: AtomicU64,
    expired: AtomicU64,
}

/// The store's bounds.
#[derive(Clone, Copy, Debug)]
struct Limits {
    capacity: usize,
    max_bytes: usize,
    /// The fewest records' worth a partition's share is.
    min_share: usize,
}

impl Limits {
    /// How much of the store `partition` takes: the larger of its part of the capacity and
    /// its part of the bytes, both scaled by `capacity * max_bytes` to stay integers.
    fn load(&self, partition: &Partition) -> u128 {
        let by_records = partition.records as u128 * self.max_bytes as u128;
        let by_bytes = partition.bytes as u128 * self.capacity as u128;
        by_records.max(by_bytes)
    }

    /// The share of each of `partitions` partitions, in the unit of [`Limits::load`].
    fn share(&self, partitions: usize) -> u128 {
        let whole = self.capacity as u128 * self.max_bytes as u128;
        let floor = self.min_share as u128 * self.max_bytes as u128;
        (whole / partitions.max(1) as u128).max(floor)
    }
}

/// The records: in-flight ones apart, never evicted; settled ones in their order of use,
/// in the whole store and in each partition.
struct State {
    inflight: HashMap<Arc<str>, Entry, CallerKeyHasher>,
    /// The least recently used first.
    settled: LruCache<Arc<str>, Entry, CallerKeyHasher>,
    /// The sum of the entries' sizes.
    bytes: usize,
    /// The tenants, or sessions, that have records.
    partitions: HashMap<Arc<str>, Partition, CallerKeyHasher>,
    /// The partitions by their [`Limits::load`], the lightest first.
    by_load: BTreeSet<(u128, Arc<str>)>,
    last_version: u64,
    limits: Limits,
}

/// What one tenant (or session, for calls without a tenant) holds.
#[derive(Default)]
struct Partition {
    /// Its records, in flight and settled.
    records: usize,
    /// Their sizes.
    bytes: usize,
    /// The keys of its settled records, the least recently used first.
    settled: LinkedHashSet<Arc<str>, CallerKeyHasher>,
}

/// The partition of the records `call` claims: its tenant, or its session when it has no
/// tenant. The first character keeps the two kinds apart.
fn partition_of(call: &ToolCall) -> String {
    match call.tenant_id() {
        Some(tenant) => ["t", tenant].concat(),
        None => ["s", call.session_key()].concat(),
    }
}

/// A record and, while it is in flight, the channel of the calls that wait for it.
struct Entry {
    record: Arc<DedupeRecord>,
    /// Made when the first call waits on an in-flight record: it carries the settled record
    /// to the waiters, and dropping it without one wakes them too.
    waiters: Option<watch::Sender<Option<Arc<DedupeRecord>>>>,
    /// The approximate size of the entry in memory.
    bytes: usize,
    /// The partition the record counts in.
    partition: Arc<str>,
}

impl Entry {
    fn new(record: Arc<DedupeRecord>, partition: Arc<str>) -> Entry {
        Entry {
            bytes: record_bytes(&record),
            record,
            waiters: None,
            partition,
        }
    }

    /// `true` for an in-flight record whose lease has not ended at `now`, or a settled record
    /// that has not expired.
    fn is_live(&self, now: u64) -> bool {
        if self.record.state == RecordState::Inflight {
            self.record.lock_until_ms.is_some_and(|until| until > now)
        } else {
            self.record.expires_at_ms > now
        }
    }
}

/// What an [`InMemoryDedupeStore`] holds and has done.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemoryStoreStats {
    /// Records held, in flight and settled.
    pub records: usize,
    /// Their approximate size in memory, in bytes.
    pub bytes: usize,
    /// Records in flight.
    pub inflight: usize,
    /// Settled records evicted to make room.
    pub evicted: u64,
    /// Of those, the records evicted before their TTL ended: each a key that a re-send finds
    /// free, so that the tool runs again. More than a few mean the store is too small for
    /// what its clients keep.
    pub evicted_live: u64,
    /// The tenants (and sessions without a tenant) that share the store.
    pub partitions: usize,
    /// Claims refused because every record was in flight at capacity.
    pub rejected_at_capacity: u64,
    /// Records removed because they expired.
    pub expired: u64,
}

/// Unix milliseconds on Tokio's clock.
struct Clock {
    origin: Instant,
    origin_unix_ms: u64,
}

impl Clock {
    fn new() -> Clock {
        let origin_unix_ms = unix_now_ms();
        Clock {
            origin: Instant::now(),
            origin_unix_ms,
        }
    }

    fn now_ms(&self) -> u64 {
        self.origin_unix_ms.saturating_add(millis(
            Instant::now().saturating_duration_since(self.origin),
        ))
    }

    fn instant_at(&self, unix_ms: u64) -> Instant {
        self.origin + Duration::from_millis(unix_ms.saturating_sub(self.origin_unix_ms))
    }
}

/// The smallest bound in bytes: room for a few records.
const MIN_MAX_BYTES: usize = 64 << 10;

/// The default floor of a partition's share: 64 records' worth.
const DEFAULT_MIN_SHARE: usize = 64;

/// How often a record evicted before its TTL ended is logged: the first, then one in this
/// many.
const EVICTED_LIVE_LOG_EVERY: u64 = 1_000;

/// The approximate size of `record` in memory: its own, its strings, and the output or error
/// it keeps. Strings that records share are counted in each.
fn record_bytes(record: &DedupeRecord) -> usize {
    let request = &record.request;
    let strings = [
        &record.key,
        &record.tool,
        &record.idempotency_key,
        &request.session_key,
        &request.actor_id,
        &request.request_id,
    ]
    .iter()
    .map(|s| s.len())
    .sum::<usize>()
        + request.tool_call_id.as_ref().map_or(0, |id| id.len())
        // The params digest: 64 hex digits.
        + 64;
    let execution = record.execution.as_ref().map_or(0, |execution| {
        execution.attempts.len() * std::mem::size_of::<AttemptRecord>()
    });
    let payload = record.payload.as_ref().map_or(0, |output| {
        json_bytes(&output.content)
            + output.metadata.as_ref().map_or(0, |metadata| {
                metadata
                    .iter()
                    .map(|(name, value)| name.len() + json_bytes(value))
                    .sum()
            })
    });
    let error = record.error.as_ref().map_or(0, |error| {
        error.code.len() + error.message.len() + error.details.as_ref().map_or(0, json_bytes)
    });
    std::mem::size_of::<Entry>()
        + std::mem::size_of::<DedupeRecord>()
        + strings
        + execution
        + payload
        + error
}

impl InMemoryDedupeStore {
    /// A store with the default capacity and sweep interval.
    pub fn new() -> Self {
        InMemoryDedupeStore::builder()
            .build()
            .expect("the default configuration is valid")
    }

    /// A builder for a store with another capacity or sweep interval.
    pub fn builder() -> InMemoryDedupeStoreBuilder {
        InMemoryDedupeStoreBuilder {
            capacity: DEFAULT_MEMORY_CAPACITY,
            max_bytes: DEFAULT_MEMORY_MAX_BYTES,
            min_share: DEFAULT_MIN_SHARE,
            sweep_interval: DEFAULT_SWEEP_INTERVAL,
        }
    }

    /// What the store holds and has done.
    pub fn stats(&self) -> MemoryStoreStats {
        let state = self.shared.lock();
        MemoryStoreStats {
            records: state.len(),
            bytes: state.bytes,
            inflight: state.inflight.len(),
            evicted: self.shared.evicted.load(Ordering::Relaxed),
            evicted_live: self.shared.evicted_live.load(Ordering::Relaxed),
            partitions: state.partitions.len(),
            rejected_at_capacity: self.shared.rejected_at_capacity.load(Ordering::Relaxed),
            expired: self.shared.expired.load(Ordering::Relaxed),
        }
    }

    /// The capacity.
    pub fn capacity(&self) -> usize {
        self.shared.limits.capacity
    }

    /// The capacity in bytes.
    pub fn max_bytes(&self) -> usize {
        self.shared.limits.max_bytes
    }

    /// [`DedupeStore::claim`], answered at once.
    fn claim_at_once(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        self.start_sweeper();
        self.shared.claim(request)
    }

    /// Starts the background sweep, once, when a Tokio runtime is there to run it. It holds
    /// only a weak reference, so it ends when the last handle to the store is dropped.
    fn start_sweeper(&self) {
        if self.shared.sweeper_started.load(Ordering::Relaxed)
            || self.shared.sweeper_started.swap(true, Ordering::AcqRel)
        {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(sweep_periodically(
                    Arc::downgrade(&self.shared),
                    self.shared.sweep_interval,
                ));
            }
            Err(_) => self.shared.sweeper_started.store(false, Ordering::Release),
        }
    }
}

impl Default for InMemoryDedupeStore {
    fn default() -> Self {
        InMemoryDedupeStore::new()
    }
}

impl fmt::Debug for InMemoryDedupeStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InMemoryDedupeStore")
            .field("limits", &self.shared.limits)
            .field("sweep_interval", &self.shared.sweep_interval)
            .field("stats", &self.stats())
            .finish()
    }
}

async fn sweep_periodically(shared: Weak<Shared>, every: Duration) {
    let mut ticks = tokio::time::interval_at(Instant::now() + every, every);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let removed = shared.sweep();
        if removed > 0 {
            tracing::debug!(removed, "swept expired dedupe records");
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // No code panics while holding the lock, so a poisoned state is still consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn sweep(&self) -> u64 {
        let now = self.clock.now_ms();
        let mut state = self.lock();
        // Dropping an in-flight entry drops its channel, which wakes its waiters.
        let removed = state.retain(|_, entry| entry.is_live(now)) as u64;
        self.expired.fetch_add(removed, Ordering::Relaxed);
        removed
    }

    /// The live record of `key` at `now`, without touching the order of use.
    fn current(&self, state: &State, key: &str, now: u64) -> Option<DedupeRecord> {
        let entry = state
            .inflight
            .get(key)
            .or_else(|| state.settled.peek(key))?;
        entry.is_live(now).then(|| (*entry.record).clone())
    }

    fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let now = self.clock.now_ms();
        let partition = partition_of(&request.call);
        // Declared before the lock, so dropped after it: records evicted or replaced here are
        // freed outside the critical section.
        let mut removed = Vec::new();
        let mut state = self.lock();
        let key: &str = &request.key;
        if let Some(entry) = state.inflight.get(key) {
            if request.is_held_by(&entry.record, now) {
                return Ok(ClaimOutcome::Existing {
                    record: entry.record.clone(),
                    now_ms: now,
                });
            }
            // The lease ended: take the key over. Dropping the entry wakes its waiters.
            tracing::debug!(
                version = entry.record.version,
                "taking over a dedupe record whose lease ended"
            );
        } else if let Some(entry) = state.settled.get(key) {
            let record = &entry.record;
            if record.expires_at_ms > now && request.is_held_by(record, now) {
                let record = record.clone();
                state.touch(key);
                return Ok(ClaimOutcome::Existing {
                    record,
                    now_ms: now,
                });
            }
        }
        // The record this one replaces, if any, leaves with its bytes.
        removed.extend(state.remove(key));
        state.last_version += 1;
        let record = Arc::new(request.inflight_record(state.last_version, now));
        let partition = state.partition_id(partition);
        state.insert_inflight(request.key.clone(), Entry::new(record.clone(), partition));
        let evicted_from = removed.len();
        let limits = &self.limits;
        while state.len() > limits.capacity || state.bytes > limits.max_bytes {
            let Some(evicted) = state.evict(key) else {
                let refused = state.remove(key);
                drop(state);
                self.count_evicted(&removed[evicted_from..], now);
                drop((refused, removed));
                self.rejected_at_capacity.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    capacity = limits.capacity,
                    max_bytes = limits.max_bytes,
                    "dedupe store full of in-flight records; claim refused"
                );
                return Err(StoreError::CapacityExhausted {
                    capacity: limits.capacity,
                });
            };
            removed.push(evicted);
        }
        drop(state);
        self.count_evicted(&removed[evicted_from..], now);
        drop(removed);
        Ok(ClaimOutcome::Claimed(record))
    }

    /// Counts the settled records `evicted` at `now` to make room, and those of them that
    /// were still live; logs the live ones, sampled.
    fn count_evicted(&self, evicted: &[Entry], now: u64) {
        if evicted.is_empty() {
            return;
        }
        self.evicted
            .fetch_add(evicted.len() as u64, Ordering::Relaxed);
        let live = evicted.iter().filter(|entry| entry.is_live(now)).count() as u64;
        if live == 0 {
            return;
        }
        let before = self.evicted_live.fetch_add(live, Ordering::Relaxed);
        let total = before + live;
        // Log the first, then once each time the count passes a multiple of the sampling.
        if before == 0 || before / EVICTED_LIVE_LOG_EVERY != total / EVICTED_LIVE_LOG_EVERY {
            tracing::warn!(
                evicted_live = total,
                capacity = self.limits.capacity,
                max_bytes = self.limits.max_bytes,
                "dedupe store full: records evicted before their TTL ended, so a re-send with \
                 their keys runs the tool again; raise the store's capacity or max_bytes"
            );
        }
    }

    /// Settles the in-flight record `claimed` by `apply(record, now)`, if the claim still
    /// holds.
    ///
    /// A caller that gives its reference to the claimed record up (an owned `Arc`) lets the
    /// record be settled where it is, without a copy, unless a waiter holds it too.
    fn settle<C: Borrow<DedupeRecord>>(
        &self,
        claimed: C,
        apply: impl FnOnce(&mut DedupeRecord, u64),
    ) -> Finalized {
        let now = self.clock.now_ms();
        let mut state = self.lock();
        let (key, version) = (&*claimed.borrow().key, claimed.borrow().version);
        match state.inflight.get(key) {
            Some(entry) if entry.record.version == version => {}
            found => {
                let found = found.or_else(|| state.settled.peek(key));
                return Finalized::Stale {
                    current_version: found.map(|entry| entry.record.version),
                };
            }
        }
        let (key, mut entry) = (state.inflight.remove_entry(key)).expect("found in flight");
        drop(claimed);
        apply(Arc::make_mut(&mut entry.record), now);
        let waiters = entry
            .waiters
            .take()
            .map(|waiters| (waiters, entry.record.clone()));
        state.insert_settled(key.clone(), entry);
        // The result may pass the bound in bytes: other settled records make room, and it
        // is kept even when it alone passes the bound.
        let mut evicted = Vec::new();
        while state.bytes > self.limits.max_bytes {
            let Some(entry) = state.evict(&key) else {
                break;
            };
            evicted.push(entry);
        }
        drop(state);
        self.count_evicted(&evicted, now);
        drop(evicted);
        if let Some((waiters, record)) = waiters {
            waiters.send_replace(Some(record));
        }
        Finalized::Written
    }

    fn renew(&self, claimed: &DedupeRecord, lease: Duration) -> bool {
        let now = self.clock.now_ms();
        let mut state = self.lock();
        let Some(entry) = state.inflight.get_mut(&claimed.key) else {
            return false;
        };
        if entry.record.version != claimed.version || !entry.is_live(now) {
            return false;
        }
        let until = now.saturating_add(millis(lease));
        let record = Arc::make_mut(&mut entry.record);
        record.lock_until_ms = Some(until);
        record.expires_at_ms = until;
        record.updated_at_ms = now;
        true
    }

    fn remove(&self, key: &str) -> bool {
        self.lock().remove(key).is_some()
    }

    fn flush_prefix(&self, prefix: &str) -> u64 {
        self.lock().retain(|key, _| !key.starts_with(prefix)) as u64
    }
}

impl State {
    /// How many records the store holds.
    fn len(&self) -> usize {
        self.inflight.len() + self.settled.len()
    }

    /// The partition named `id`, shared with its records when it has some.
    fn partition_id(&self, id: String) -> Arc<str> {
        match self.partitions.get_key_value(id.as_str()) {
            Some((shared, _)) => shared.clone(),
            None => id.into(),
        }
    }

    /// Changes the partition `id` by `change`, keeping its place in the order by load; a
    /// partition left without records goes.
    fn account(&mut self, id: &Arc<str>, change: impl FnOnce(&mut Partition)) {
        let limits = self.limits;
        let partition = self.partitions.entry(id.clone()).or_default();
        let before = (partition.records > 0).then(|| limits.load(partition));
        change(partition);
        let after = (partition.records > 0).then(|| limits.load(partition));
        if before == after {
            return;
        }
        if let Some(load) = before {
            self.by_load.remove(&(load, id.clone()));
        }
        match after {
            Some(load) => {
                self.by_load.insert((load, id.clone()));
            }
            None => {
                self.partitions.remove(id);
            }
        }
    }

    /// Adds the in-flight `entry` of `key`.
    fn insert_inflight(&mut self, key: Arc<str>, entry: Entry) {
        self.bytes += entry.bytes;
        let bytes = entry.bytes;
        self.account(&entry.partition, |partition| {
            partition.records += 1;
            partition.bytes += bytes;
        });
        self.inflight.insert(key, entry);
    }

    /// Keeps the settled `entry`, taken out of the in-flight records, as the most recently
    /// used record of the store and of its partition; its size is measured again.
    fn insert_settled(&mut self, key: Arc<str>, mut entry: Entry) {
        let (before, after) = (entry.bytes, record_bytes(&entry.record));
        entry.bytes = after;
        self.bytes = self.bytes - before + after;
        self.account(&entry.partition, |partition| {
            partition.bytes = partition.bytes - before + after;
            partition.settled.insert(key.clone());
        });
        self.settled.insert(key, entry);
    }

    /// Makes the settled record of `key` the most recently used of its partition (the store's
    /// order of use is kept by reading it).
    fn touch(&mut self, key: &str) {
        let Some(entry) = self.settled.peek(key) else {
            return;
        };
        if let Some(partition) = self.partitions.get_mut(&entry.partition) {
            partition.settled.to_back(key);
        }
    }

    /// Removes the record of `key`; returns its entry.
    fn remove(&mut self, key: &str) -> Option<Entry> {
        let (key, entry) =
            (self.inflight.remove_entry(key)).or_else(|| self.settled.remove_entry(key))?;
        self.forget(&key, &entry);
        Some(entry)
    }

    /// Takes the removed `entry` of `key` out of the sizes and of its partition.
    fn forget(&mut self, key: &str, entry: &Entry) {
        self.bytes -= entry.bytes;
        let bytes = entry.bytes;
        self.account(&entry.partition, |partition| {
            partition.records -= 1;
            partition.bytes -= bytes;
            partition.settled.remove(key);
        });
    }

    /// Evicts a settled record other than `keep` to make room; returns it, or `None` when
    /// there is none.
    ///
    /// The victim is the least recently used record of a partition over its share: the
    /// partition of `keep` first, then the one with the largest load. When every partition
    /// is within its share, the least recently used record of the store goes.
    fn evict(&mut self, keep: &str) -> Option<Entry> {
        let limits = &self.limits;
        let share = limits.share(self.partitions.len());
        let oldest = |partition: &Partition| {
            (partition.settled.front())
                .filter(|key| ***key != *keep)
                .cloned()
        };
        let own = (self.inflight.get(keep).or_else(|| self.settled.peek(keep)))
            .and_then(|entry| self.partitions.get(&entry.partition))
            .filter(|partition| limits.load(partition) > share)
            .and_then(oldest);
        let victim = own
            .or_else(|| {
                (self.by_load.iter().rev())
                    .take_while(|(load, _)| *load > share)
                    .find_map(|(_, id)| oldest(self.partitions.get(id)?))
            })
            .or_else(|| {
                (self.settled.iter().next())
                    .map(|(key, _)| key.clone())
                    .filter(|key| **key != *keep)
            })?;
        self.remove(&victim)
    }

    /// Keeps the records for which `keep` is true; returns how many it removed.
    fn retain(&mut self, mut keep: impl FnMut(&str, &Entry) -> bool) -> usize {
        let doomed: Vec<Arc<str>> = (self.inflight.iter())
            .chain(self.settled.iter())
            .filter(|(key, entry)| !keep(key, entry))
            .map(|(key, _)| key.clone())
            .collect();
        // Dropping an in-flight entry drops its channel, which wakes its waiters.
        doomed
            .iter()
            .filter(|key| self.remove(key).is_some())
            .count()
    }
}

/// Each operation is done when its future is first polled, as the other stores do theirs:
/// a future dropped unpolled has changed nothing.
impl DedupeStore for InMemoryDedupeStore {
    fn claim<'a>(&'a self, request: &'a ClaimRequest) -> StoreFuture<'a, ClaimOutcome> {
        Box::pin(async move { self.claim_at_once(request) })
    }

    fn claim_now(&self, request: &ClaimRequest) -> Option<Result<ClaimOutcome, StoreError>> {
        Some(self.claim_at_once(request))
    }

    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<DedupeRecord>> {
        Box::pin(async move { Ok(self.current(key)) })
    }

    fn finalize<'a>(
        &'a self,
        claimed: &'a DedupeRecord,
        completion: Completion,
    ) -> StoreFuture<'a, Finalized> {
        Box::pin(async move {
            Ok((self.shared).settle(claimed, |record, now| completion.apply(record, now)))
        })
    }

    /// Settles the record where it lies, without a copy unless a waiter holds it too.
    fn finalize_now(
        &self,
        claimed: Arc<DedupeRecord>,
        completion: &dyn Fn() -> Completion,
    ) -> Result<Finalized, Arc<DedupeRecord>> {
        // Made before the lock is taken.
        let completion = completion();
        Ok((self.shared).settle(claimed, |record, now| completion.apply(record, now)))
    }

    fn cancel<'a>(
        &'a self,
        claimed: &'a DedupeRecord,
        keep_for: Duration,
    ) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let written = self.shared.settle(claimed, |record, now| {
                let keep_ms = millis(keep_for);
                record.state = RecordState::Cancelled;
                record.updated_at_ms = now;
                record.expires_at_ms = now.saturating_add(keep_ms);
                record.ttl_ms = keep_ms;
                record.lock_until_ms = None;
            });
            Ok(written == Finalized::Written)
        })
    }

    fn renew<'a>(&'a self, claimed: &'a DedupeRecord, lease: Duration) -> StoreFuture<'a, bool> {
        Box::pin(async move { Ok(self.shared.renew(claimed, lease)) })
    }

    fn wait<'a>(&'a self, seen: &'a DedupeRecord) -> StoreFuture<'a, Option<DedupeRecord>> {
        Box::pin(self.wait_for(seen))
    }

    fn delete<'a>(&'a self, key: &'a str) -> StoreFuture<'a, bool> {
        Box::pin(async move { Ok(self.shared.remove(key)) })
    }

    fn flush_prefix<'a>(&'a self, prefix: &'a str) -> StoreFuture<'a, u64> {
        Box::pin(async move { Ok(self.shared.flush_prefix(prefix)) })
    }

    fn sweep_expired(&self) -> StoreFuture<'_, u64> {
        Box::pin(async move { Ok(self.shared.sweep()) })
    }

    fn size(&self) -> StoreFuture<'_, u64> {
        Box::pin(async move { Ok(self.shared.lock().len() as u64) })
    }

    fn find_by_fingerprint<'a>(
        &'a self,
        fingerprint: &'a str,
    ) -> StoreFuture<'a, Option<DedupeRecord>> {
        Box::pin(async move {
            let found = {
                let state = self.shared.lock();
                let mut keys = state
                    .inflight
                    .keys()
                    .chain(state.settled.iter().map(|(key, _)| key));
                keys.find(|key| fingerprint_matches(key, fingerprint))
                    .cloned()
            };
            Ok(found.and_then(|key| self.current(&key)))
        })
    }
}

impl InMemoryDedupeStore {
    /// The live record of `key`.
    fn current(&self, key: &str) -> Option<DedupeRecord> {
        let now = self.shared.clock.now_ms();
        let state = self.shared.lock();
        self.shared.current(&state, key, now)
    }

    /// Waits until the in-flight record `seen` is settled, replaced or gone, or its lease
    /// ends.
    async fn wait_for(&self, seen: &DedupeRecord) -> Result<Option<DedupeRecord>, StoreError> {
        loop {
            let now = self.shared.clock.now_ms();
            let (mut settled, lock_until) = {
                let mut state = self.shared.lock();
                match state.inflight.get_mut(&seen.key) {
                    Some(entry) if entry.record.version == seen.version => {
                        let until = entry.record.lock_until_ms.unwrap_or(0);
                        if until <= now {
                            return Ok(None);
                        }
                        let waiters = entry.waiters.get_or_insert_with(|| watch::channel(None).0);
                        (waiters.subscribe(), until)
                    }
                    _ => return Ok(self.shared.current(&state, &seen.key, now)),
                }
            };
            let lease_end = self.shared.clock.instant_at(lock_until);
            match tokio::time::timeout_at(lease_end, settled.changed()).await {
                Ok(Ok(())) => {
                    let record = settled.borrow_and_update().clone();
                    return Ok(record.map(|r| (*r).clone()));
                }
                // The entry went away without a result: taken over, deleted or swept.
                Ok(Err(_)) => return Ok(self.current(&seen.key)),
                // The lease ended, unless it was renewed: look again.
                Err(_) => continue,
            }
        }
    }
}

/// Builds an [`InMemoryDedupeStore`]; made by [`InMemoryDedupeStore::builder`].
#[derive(Debug)]
#[must_use]
pub struct InMemoryDedupeStoreBuilder {
    capacity: usize,
    max_bytes: usize,
    min_share: usize,
    sweep_interval: Duration,
}

impl InMemoryDedupeStoreBuilder {
    /// The most records held, in flight and settled (default 25 000).
    pub fn capacity(mut self, capacity: usize) -> Self {
        self.capacity = capacity;
        self
    }

    /// The most bytes the records take, by their approximate size in memory (default
    /// 64 MiB): the least recently used settled records are
    /// evicted to stay within it.
    pub fn max_bytes(mut self, bytes: usize) -> Self {
        self.max_bytes = bytes;
        self
    }

    /// The floor of each tenant's (or session's) share of the store, in records (default
    /// 64): one that holds no more than this many records, and no more than as many records'
    /// worth of bytes, is within its share however many share the store, so another's flood
    /// does not evict its records. The shares are the capacity, and the bytes, divided by how
    /// many tenants and sessions have records, when that is more. A floor as large as the
    /// capacity turns the shares off: the store is one least-recently-used list.
    pub fn min_share(mut self, records: usize) -> Self {
        self.min_share = records;
        self
    }

    /// How often expired records are swept (default one minute).
    pub fn sweep_interval(mut self, every: Duration) -> Self {
        self.sweep_interval = every;
        self
    }

    /// Checks the configuration and builds the store.
    pub fn build(self) -> Result<InMemoryDedupeStore, ConfigError> {
        let capacity = NonZeroUsize::new(self.capacity).ok_or_else(|| {
            ConfigError::new("idempotency.store.capacity", "must be at least 1, got 0")
        })?;
        if self.max_bytes < MIN_MAX_BYTES {
            return Err(ConfigError::new(
                "idempotency.store.max_bytes",
                format!(
                    "must be at least {MIN_MAX_BYTES} (64 KiB), got {}",
                    self.max_bytes
                ),
            ));
        }
        at_least_a_millisecond("idempotency.store.sweep_interval", self.sweep_interval)?;
        let limits = Limits {
            capacity: capacity.get(),
            max_bytes: self.max_bytes,
            min_share: self.min_share,
        };
        Ok(InMemoryDedupeStore {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    inflight: HashMap::with_hasher(CallerKeyHasher::default()),
                    settled: LruCache::with_hasher(usize::MAX, CallerKeyHasher::default()),
                    bytes: 0,
                    partitions: HashMap::with_hasher(CallerKeyHasher::default()),
                    by_load: BTreeSet::new(),
                    last_version: 0,
                    limits,
                }),
                limits,
                sweep_interval: self.sweep_interval,
                clock: Clock::new(),
                sweeper_started: AtomicBool::new(false),
                evicted: AtomicU64::new(0),
                evicted_live: AtomicU64::new(0),
                rejected_at_capacity: AtomicU64::new(0),
                expired: AtomicU64::new(0),
            }),
        })
    }
}
