//! [`RedisDedupeStore`]: records in Redis, shared by every replica.

mod subscriptions;
mod value;

use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use redis::{Cmd, FromRedisValue, Script, Value};

use self::subscriptions::Subscriber;
use self::value::{decode, encode};
use tower_toolcall::idempotency::{
    fingerprint_matches, ClaimOutcome, ClaimRequest, Completion, DedupeRecord, DedupeStore,
    Finalized, RecordState, StoreError,
};
use tower_toolcall::shared_store::StoreFuture;
use tower_toolcall::ConfigError;

use crate::support::{
    self, at_least_a_millisecond, finish_detached, hash_tagged, millis, unix_now_ms, Connection,
    Shard, StoreSettings,
};

/// The default prefix of every key the store writes.
pub const DEFAULT_REDIS_KEY_PREFIX: &str = "toolcall:idem:";
/// The default time one Redis operation may take.
pub const DEFAULT_REDIS_OPERATION_TIMEOUT: Duration = support::DEFAULT_OPERATION_TIMEOUT;
/// The default longest wait between two reads of a record a call waits on, should a
/// completion message be lost.
pub const DEFAULT_FALLBACK_POLL_INTERVAL: Duration = Duration::from_secs(2);

/// The most keys [`size`](DedupeStore::size) reads: past them, it estimates.
const SIZE_SAMPLE: u64 = 4_000;

/// The keys one `SCAN` step asks for.
const SCAN_COUNT: u64 = 1_000;

/// How long, on a cluster, a result that cannot be written is written again (at least; four
/// operation timeouts when longer): a master's failover takes about its
/// `cluster-node-timeout` and an election.
const FINALIZE_PATIENCE: Duration = Duration::from_secs(3);

/// The wait between two tries to write a result on a cluster.
const FINALIZE_RETRY_DELAY: Duration = Duration::from_millis(50);

/// How many times a claim tries to take over a record that keeps changing hands before it
/// answers with the record that holds the key.
const TAKE_OVER_ATTEMPTS: usize = 4;

/// A dedupe store in Redis (7.0 or later), shared by every replica that points at the same
/// server, or at the same Redis Cluster (feature `cluster`; see the
/// [crate docs](crate#on-a-redis-cluster)).
///
/// - A record is one string at `<prefix>{<store key>}`: a header line with its state and
///   version, then its JSON. Its completion channel is the same name followed by `:done`. The
///   braces are a Redis Cluster hash tag, so a record and its channel live in one slot.
/// - A claim is one atomic `SET … NX PX <lease> GET`: it writes the in-flight record when the
///   key is free, and otherwise answers with the record that holds the key, so a cache hit is
///   one round trip and costs the server no more than a `GET`. Every step that must compare
///   versions is a Lua script, so it is atomic too: finalize (which also publishes the result
///   on the channel), cancel, lease renewal, and taking over a cancelled record or a retriable
///   failure. A fresh key costs two round trips: the claim and the finalize.
/// - A claim whose answer never came (its caller went away while it was on its way, or the
///   server did not answer within the operation timeout) may still be applied by the server,
///   and would then hold the key for the whole lease with nobody to finalize it. Its version
///   is known before it is sent, so it is released by that version right behind it, on the
///   same connection, in the background: the server deletes the record if the claim was
///   applied (waiters are told, and a retry claims the key at once), and does nothing if it
///   was not.
/// - TTLs mirror the memory store: the in-flight lease, then the done or failed TTL, are the
///   key's expiry, kept by the server; an in-flight record whose holder died disappears with
///   its lease, and the next claim takes the key. A version is a fencing token that is unique
///   to its claim (the claimer's clock in milliseconds, times 1024, plus a per-process
///   counter), and a takeover's is larger than the one it replaces; a write by a holder whose
///   version is no longer the record's is refused.
/// - A duplicate in another process waits on the per-key channel: it subscribes first, then
///   reads the record again, so no completion is missed; should a message be lost (a
///   reconnect, a failover), it reads the record again after at most the fallback poll
///   interval (2 s by default), and when the lease ends; a read that fails meanwhile (the
///   record's master fails over) is tried again until the lease it last saw ends.
///   [`stats`](RedisDedupeStore::stats) counts those fallback polls. On a cluster, the
///   channel is a sharded one (`SSUBSCRIBE` / `SPUBLISH`) in the record's slot.
/// - [`size`](DedupeStore::size) costs at most five round trips on a node, however large
///   the database: it counts the records among the first 4 000 keys a `SCAN` meets, exactly
///   when the database holds no more, and otherwise scales the share of records among them
///   by `DBSIZE` (an estimate, for metrics: a scrape never walks a large key space). On a
///   cluster, each master is scanned alike for its share of the sample, and `DBSIZE` is
///   their sum. [`flush_prefix`](DedupeStore::flush_prefix) and
///   [`find_by_fingerprint`](DedupeStore::find_by_fingerprint) walk every master.
/// - Every operation is bounded by the operation timeout (1 s by default); an unreachable
///   server is a [`StoreError`], never a hang. The connection manager reconnects by itself
///   and subscriptions are restored after a reconnect.
///
/// Connections are made on first use, inside the Tokio runtime: one multiplexed connection
/// for commands and, once a call waits, one RESP3 connection for subscriptions (on a
/// cluster, one of each per node). Clones share them.
///
/// ```no_run
/// use std::sync::Arc;
/// use std::time::Duration;
/// use tower_toolcall::idempotency::IdempotencyLayer;
/// use tower_toolcall_redis::RedisDedupeStore;
/// use tower_toolcall::registry::ToolRegistry;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let store = RedisDedupeStore::builder("redis://127.0.0.1:6379/")
///     .key_prefix("agents:idem:")
///     .operation_timeout(Duration::from_millis(500))
///     .build()?;
/// store.ping().await?;
/// let layer = IdempotencyLayer::new(ToolRegistry::open(), Arc::new(store));
/// # let _ = layer;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisDedupeStore {
    shared: Arc<Shared>,
}

struct Shared {
    commands: Connection,
    subscriber: Arc<Subscriber>,
    key_prefix: String,
    fallback_poll_interval: Duration,
    scripts: Scripts,
    fallback_polls: AtomicU64,
    pubsub_wakeups: AtomicU64,
}

struct Scripts {
    replace: Script,
    /// The release of a claim whose answer never came, sent as a plain `EVAL`.
    release: String,
    take_over: Script,
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
    /// A store at `target` (a node's URL, e.g. `redis://127.0.0.1:6379/`, or a
    /// [`RedisTarget`](crate::RedisTarget)) with the defaults.
    pub fn open(target: impl Into<crate::RedisTarget>) -> Result<RedisDedupeStore, ConfigError> {
        RedisDedupeStore::builder(target).build()
    }

    /// A builder for a store at `target`: a node's URL, or a cluster's seeds (see
    /// [`RedisTarget`](crate::RedisTarget)).
    pub fn builder(target: impl Into<crate::RedisTarget>) -> RedisDedupeStoreBuilder {
        RedisDedupeStoreBuilder {
            settings: StoreSettings::new(target.into(), DEFAULT_REDIS_KEY_PREFIX),
            fallback_poll_interval: DEFAULT_FALLBACK_POLL_INTERVAL,
        }
    }

    /// Checks that the server answers.
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.shared.command(&redis::cmd("PING")).await
    }

    /// What the store has done.
    pub fn stats(&self) -> RedisStoreStats {
        RedisStoreStats {
            fallback_polls: self.shared.fallback_polls.load(Ordering::Relaxed),
            pubsub_wakeups: self.shared.pubsub_wakeups.load(Ordering::Relaxed),
            subscribed_channels: self.shared.subscriber.channel_count(),
        }
    }

    /// The Redis key of the record of `store_key`.
    pub fn record_key(&self, store_key: &str) -> String {
        self.shared.record_key(store_key)
    }
}

impl fmt::Debug for RedisDedupeStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.shared
            .commands
            .debug_store(f, "RedisDedupeStore", &self.shared.key_prefix)
            .field(
                "fallback_poll_interval",
                &self.shared.fallback_poll_interval,
            )
            .finish_non_exhaustive()
    }
}

impl Shared {
    fn record_key(&self, store_key: &str) -> String {
        hash_tagged(&self.key_prefix, store_key, "")
    }

    fn channel(record_key: &str) -> String {
        format!("{record_key}:done")
    }

    /// Runs one command within the operation timeout.
    async fn command<T: FromRedisValue>(&self, command: &Cmd) -> Result<T, StoreError> {
        self.commands.command(command).await
    }

    /// Runs one script within the operation timeout.
    async fn eval<T: FromRedisValue>(
        &self,
        invocation: &redis::ScriptInvocation<'_>,
    ) -> Result<T, StoreError> {
        self.commands.eval(invocation).await
    }

    /// Replaces the in-flight record `claimed` by `next`, kept for `ttl`, if its claim still
    /// holds; publishes `next` when asked.
    async fn replace(
        &self,
        claimed: &DedupeRecord,
        next: &DedupeRecord,
        ttl: Duration,
        publish: bool,
    ) -> Result<Finalized, StoreError> {
        let record_key = self.record_key(&claimed.key);
        let reply: Vec<Value> = self
            .eval(
                self.scripts
                    .replace
                    .key(&record_key)
                    .key(Shared::channel(&record_key))
                    .arg(claimed.version)
                    .arg(encode(next)?)
                    .arg(millis(ttl).max(1))
                    .arg(u8::from(publish)),
            )
            .await?;
        let mut reply = reply.into_iter();
        if number(reply.next())? == 1 {
            return Ok(Finalized::Written);
        }
        let current_version = match reply.next() {
            None | Some(Value::Nil) => None,
            other => Some(number(other)?),
        };
        Ok(Finalized::Stale { current_version })
    }

    /// The record at `record_key` and how long it has left.
    async fn read(&self, record_key: &str) -> Result<Option<(DedupeRecord, Duration)>, StoreError> {
        let reply: Vec<Value> = self.eval(&self.scripts.read.key(record_key)).await?;
        let mut reply = reply.into_iter();
        let value = reply.next();
        let left = number(reply.next()).unwrap_or(0);
        match value {
            Some(Value::BulkString(bytes)) => {
                Ok(Some((decode(&bytes)?, Duration::from_millis(left))))
            }
            _ => Ok(None),
        }
    }

    /// One `SCAN` step of `shard` over the keys that match `pattern`.
    async fn scan(
        &self,
        shard: &Shard<'_>,
        cursor: u64,
        pattern: &str,
    ) -> Result<(u64, Vec<String>), StoreError> {
        shard
            .command(
                redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(pattern)
                    .arg("COUNT")
                    .arg(SCAN_COUNT),
            )
            .await
    }
}

/// `claimed`, cancelled now and kept for `keep_for`.
fn cancelled(claimed: &DedupeRecord, keep_for: Duration) -> DedupeRecord {
    let now_ms = unix_now_ms();
    let keep_ms = millis(keep_for);
    let mut record = claimed.clone();
    record.state = RecordState::Cancelled;
    record.updated_at_ms = now_ms;
    record.expires_at_ms = now_ms.saturating_add(keep_ms);
    record.ttl_ms = keep_ms;
    record.lock_until_ms = None;
    record
}

/// A claim sent to the server whose answer has not been read. Dropped before it is
/// [`answered`](Unanswered::answered) (its caller went away, or the server failed or did not
/// answer in time), it releases the record it sent, by its version, should the server have
/// applied it.
struct Unanswered<'a> {
    shared: &'a Arc<Shared>,
    record_key: &'a str,
    sent: Option<&'a DedupeRecord>,
}

impl<'a> Unanswered<'a> {
    fn new(shared: &'a Arc<Shared>, record_key: &'a str, sent: &'a DedupeRecord) -> Self {
        Unanswered {
            shared,
            record_key,
            sent: Some(sent),
        }
    }

    /// The server answered: the claim holds the key, or another record does.
    fn answered(mut self) {
        self.sent = None;
    }
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        let Some(sent) = self.sent else {
            return;
        };
        // Polled once here, the release is on the claim's connection before this task sends
        // anything else: the server runs it after the claim and before the caller's retry.
        let release = release_unanswered(
            self.shared.clone(),
            self.record_key.to_owned(),
            sent.clone(),
        );
        if !finish_detached(release) {
            tracing::warn!(
                "a claim whose answer never came could not be released: no Tokio runtime; \
                 if the server applied it, the key stays held until its lease ends"
            );
        }
    }
}

/// Deletes the in-flight record `sent` if it holds `record_key`, and tells its waiters.
///
/// A plain `EVAL`, not a script loaded by its hash: one command, run right after the claim
/// whatever scripts the server has loaded.
async fn release_unanswered(shared: Arc<Shared>, record_key: String, sent: DedupeRecord) {
    let released = async {
        let message = encode(&cancelled(&sent, Duration::ZERO))?;
        // Behind the claim, even if the claim's timeout made the server known to be down.
        shared
            .commands
            .command_behind::<u64>(
                redis::cmd("EVAL")
                    .arg(&shared.scripts.release)
                    .arg(2)
                    .arg(&record_key)
                    .arg(Shared::channel(&record_key))
                    .arg(sent.version)
                    .arg(message),
            )
            .await
    };
    let fingerprint = || sent.fingerprint();
    match released.await {
        Ok(1) => tracing::debug!(
            idempotency_key_hash = %fingerprint(),
            "idempotency key released: its claim was applied after its caller stopped waiting"
        ),
        // The claim was not applied, or the key changed hands since.
        Ok(_) => {}
        // The release was sent behind the claim: a server that answers neither in time still
        // runs both, in order.
        Err(error) => tracing::debug!(
            idempotency_key_hash = %fingerprint(),
            %error,
            "no answer to the release of a claim whose answer never came"
        ),
    }
}

/// A fencing token for a fresh claim at `now_ms`: unique to the claim, and growing with time.
fn fresh_version(now_ms: u64) -> u64 {
    static SALT: OnceLock<u64> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let salt = *SALT.get_or_init(|| RandomState::new().hash_one(std::process::id()));
    let low = salt.wrapping_add(COUNTER.fetch_add(1, Ordering::Relaxed)) & 1023;
    (now_ms << 10) | low
}

fn number(value: Option<Value>) -> Result<u64, StoreError> {
    match value {
        Some(Value::Int(n)) => u64::try_from(n).ok(),
        Some(Value::BulkString(bytes)) => std::str::from_utf8(&bytes)
            .ok()
            .and_then(|s| s.parse().ok()),
        _ => None,
    }
    .ok_or_else(|| StoreError::Corrupt("a script answered without a number".to_owned()))
}

impl DedupeStore for RedisDedupeStore {
    fn claim<'a>(&'a self, request: &'a ClaimRequest) -> StoreFuture<'a, ClaimOutcome> {
        Box::pin(async move {
            let shared = &self.shared;
            let record_key = shared.record_key(&request.key);
            let lease_ms = millis(request.lease).max(1);
            let now_ms = unix_now_ms();
            let record = request.inflight_record(fresh_version(now_ms), now_ms);
            let mut set = redis::cmd("SET");
            set.arg(&record_key)
                .arg(encode(&record)?)
                .arg("NX")
                .arg("PX")
                .arg(lease_ms)
                .arg("GET");
            let sent = Unanswered::new(shared, &record_key, &record);
            let previous: Option<Vec<u8>> = shared.command(&set).await?;
            sent.answered();
            let Some(previous) = previous else {
                return Ok(ClaimOutcome::Claimed(Arc::new(record)));
            };
            let mut existing = decode(&previous)?;
            if existing.version == record.version {
                // The claim was sent again after its connection broke, and the first one had
                // been applied: the record is this claim's own.
                return Ok(ClaimOutcome::Claimed(Arc::new(record)));
            }
            for _ in 0..TAKE_OVER_ATTEMPTS {
                // The server expires an in-flight record with its lease: one that exists is live.
                if existing.state == RecordState::Inflight || request.is_held_by(&existing, now_ms)
                {
                    break;
                }
                let version = fresh_version(now_ms).max(existing.version + 1);
                let record = request.inflight_record(version, now_ms);
                let mut take_over = shared.scripts.take_over.key(&record_key);
                take_over
                    .arg(existing.version)
                    .arg(encode(&record)?)
                    .arg(lease_ms);
                let sent = Unanswered::new(shared, &record_key, &record);
                let reply: Vec<Value> = shared.eval(&take_over).await?;
                sent.answered();
                let mut reply = reply.into_iter();
                if number(reply.next())? == 1 {
                    return Ok(ClaimOutcome::Claimed(Arc::new(record)));
                }
                existing = match reply.next() {
                    Some(Value::BulkString(bytes)) => decode(&bytes)?,
                    _ => {
                        return Err(StoreError::Corrupt(
                            "a takeover answered nothing".to_owned(),
                        ))
                    }
                };
                if existing.version == record.version {
                    // Sent again after a broken connection: the first takeover was applied.
                    return Ok(ClaimOutcome::Claimed(Arc::new(record)));
                }
            }
            Ok(ClaimOutcome::Existing {
                record: Arc::new(existing),
                now_ms,
            })
        })
    }

    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<DedupeRecord>> {
        Box::pin(async move {
            let value: Option<Vec<u8>> = self
                .shared
                .command(redis::cmd("GET").arg(self.shared.record_key(key)))
                .await?;
            value.as_deref().map(decode).transpose()
        })
    }

    fn finalize<'a>(
        &'a self,
        claimed: &'a DedupeRecord,
        completion: Completion,
    ) -> StoreFuture<'a, Finalized> {
        Box::pin(async move {
            let ttl = completion.ttl;
            let settled = completion.settle(claimed, unix_now_ms());
            // On a cluster, a result that cannot be written while its master fails over is
            // written again until a replica takes over (the write finds its own value should an
            // earlier try have landed): a result given up is a key released, and a duplicate
            // then runs the tool again.
            let patience = if self.shared.commands.is_cluster() {
                FINALIZE_PATIENCE.max(self.shared.commands.timeout() * 4)
            } else {
                Duration::ZERO
            };
            let give_up = tokio::time::Instant::now() + patience;
            loop {
                match self.shared.replace(claimed, &settled, ttl, true).await {
                    Err(StoreError::Unavailable(_) | StoreError::Timeout(_))
                        if tokio::time::Instant::now() < give_up =>
                    {
                        tokio::time::sleep(FINALIZE_RETRY_DELAY).await;
                    }
                    finalized => return finalized,
                }
            }
        })
    }

    fn cancel<'a>(
        &'a self,
        claimed: &'a DedupeRecord,
        keep_for: Duration,
    ) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let record = cancelled(claimed, keep_for);
            let written = self
                .shared
                .replace(claimed, &record, keep_for, true)
                .await?;
            Ok(written == Finalized::Written)
        })
    }

    fn renew<'a>(&'a self, claimed: &'a DedupeRecord, lease: Duration) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let now_ms = unix_now_ms();
            let until = now_ms.saturating_add(millis(lease));
            let mut renewed = claimed.clone();
            renewed.updated_at_ms = now_ms;
            renewed.expires_at_ms = until;
            renewed.lock_until_ms = Some(until);
            let written = self.shared.replace(claimed, &renewed, lease, false).await?;
            Ok(written == Finalized::Written)
        })
    }

    fn wait<'a>(&'a self, seen: &'a DedupeRecord) -> StoreFuture<'a, Option<DedupeRecord>> {
        Box::pin(async move {
            let shared = &self.shared;
            let record_key = shared.record_key(&seen.key);
            // Subscribe before reading the record again, so that no completion falls in between.
            let mut subscription = match shared
                .subscriber
                .subscribe(&Shared::channel(&record_key))
                .await
            {
                Ok(subscription) => Some(subscription),
                Err(error) => {
                    tracing::debug!(%error, "cannot subscribe to completions; waiting by polling");
                    None
                }
            };
            // Until when the record's lease holds, as last read: while it holds, a read that
            // fails (its master fails over, a connection is lost) is tried again, since the
            // record may finish meanwhile; past it, the failure is the answer.
            let mut lease_end = seen.lock_until_ms.map(|until_ms| {
                tokio::time::Instant::now()
                    + Duration::from_millis(until_ms.saturating_sub(unix_now_ms()))
            });
            loop {
                let lease_left = match shared.read(&record_key).await {
                    Ok(None) => return Ok(None),
                    Ok(Some((record, _)))
                        if record.state != RecordState::Inflight
                            || record.version != seen.version =>
                    {
                        return Ok(Some(record));
                    }
                    Ok(Some((_, left))) if left.is_zero() => return Ok(None),
                    Ok(Some((_, left))) => {
                        lease_end = Some(tokio::time::Instant::now() + left);
                        left
                    }
                    Err(error) => {
                        let left = lease_end.map_or(Duration::ZERO, |end| {
                            end.saturating_duration_since(tokio::time::Instant::now())
                        });
                        if left.is_zero() {
                            return Err(error);
                        }
                        tracing::debug!(%error, "a waited-on record could not be read; reading it again");
                        left
                    }
                };
                let next_read = shared
                    .fallback_poll_interval
                    .min(lease_left + Duration::from_millis(1));
                let message = match subscription.as_mut() {
                    Some(subscription) => subscription.next_message(next_read).await,
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
                match decode(&message) {
                    Ok(record) if record.state != RecordState::Inflight => return Ok(Some(record)),
                    Ok(_) => {}
                    Err(error) => {
                        tracing::warn!(%error, "unreadable completion message; reading the record");
                    }
                }
            }
        })
    }

    fn delete<'a>(&'a self, key: &'a str) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let deleted: u64 = self
                .shared
                .command(redis::cmd("DEL").arg(self.shared.record_key(key)))
                .await?;
            Ok(deleted > 0)
        })
    }

    fn flush_prefix<'a>(&'a self, prefix: &'a str) -> StoreFuture<'a, u64> {
        Box::pin(async move {
            let pattern = format!(
                "{}{{{}*",
                glob_escape(&self.shared.key_prefix),
                glob_escape(prefix)
            );
            let mut deleted = 0;
            for shard in self.shared.commands.shards().await? {
                let mut cursor = 0;
                loop {
                    let (next, keys) = self.shared.scan(&shard, cursor, &pattern).await?;
                    // On a cluster, the client splits the keys by slot.
                    if !keys.is_empty() {
                        let n: u64 = self.shared.command(redis::cmd("UNLINK").arg(keys)).await?;
                        deleted += n;
                    }
                    if next == 0 {
                        break;
                    }
                    cursor = next;
                }
            }
            Ok(deleted)
        })
    }

    fn sweep_expired(&self) -> StoreFuture<'_, u64> {
        Box::pin(async move {
            // Redis expires records itself.
            Ok(0)
        })
    }

    fn size(&self) -> StoreFuture<'_, u64> {
        Box::pin(async move {
            // On a cluster, the client sums every master's DBSIZE; each master is sampled alike.
            let total: u64 = self.shared.command(&redis::cmd("DBSIZE")).await?;
            let prefix = format!("{}{{", self.shared.key_prefix);
            let shards = self.shared.commands.shards().await?;
            let sample = SIZE_SAMPLE / shards.len().max(1) as u64;
            let (mut seen, mut records, mut complete) = (0u64, 0u64, true);
            for shard in &shards {
                let (mut seen_here, mut cursor) = (0u64, 0u64);
                loop {
                    let (next, keys): (u64, Vec<Vec<u8>>) = shard
                        .command(redis::cmd("SCAN").arg(cursor).arg("COUNT").arg(SCAN_COUNT))
                        .await?;
                    seen_here += keys.len() as u64;
                    records += keys
                        .iter()
                        .filter(|key| key.starts_with(prefix.as_bytes()))
                        .count() as u64;
                    if next == 0 {
                        break;
                    }
                    if seen_here >= sample {
                        complete = false;
                        break;
                    }
                    cursor = next;
                }
                seen += seen_here;
            }
            if complete || seen == 0 {
                return Ok(records);
            }
            // The keys a scan meets first are spread over the key space by its hash.
            Ok(records.saturating_mul(total.max(seen)) / seen)
        })
    }

    fn find_by_fingerprint<'a>(
        &'a self,
        fingerprint: &'a str,
    ) -> StoreFuture<'a, Option<DedupeRecord>> {
        Box::pin(async move {
            let prefix = format!("{}{{", self.shared.key_prefix);
            let pattern = format!("{}{{*", glob_escape(&self.shared.key_prefix));
            for shard in self.shared.commands.shards().await? {
                let mut cursor = 0;
                loop {
                    let (next, keys) = self.shared.scan(&shard, cursor, &pattern).await?;
                    let found = keys.iter().find_map(|record_key| {
                        let store_key = record_key.strip_prefix(&prefix)?.strip_suffix('}')?;
                        fingerprint_matches(store_key, fingerprint).then_some(store_key)
                    });
                    if let Some(store_key) = found {
                        return self.get(store_key).await;
                    }
                    if next == 0 {
                        break;
                    }
                    cursor = next;
                }
            }
            Ok(None)
        })
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

/// Builds a [`RedisDedupeStore`]; made by [`RedisDedupeStore::builder`].
#[derive(Debug)]
#[must_use]
pub struct RedisDedupeStoreBuilder {
    settings: StoreSettings,
    fallback_poll_interval: Duration,
}

impl RedisDedupeStoreBuilder {
    support::store_settings_setters!("toolcall:idem:");

    /// The longest a waiting call goes without reading the record it waits on, should a
    /// completion message be lost (default 2 s).
    pub fn fallback_poll_interval(mut self, interval: Duration) -> Self {
        self.fallback_poll_interval = interval;
        self
    }

    /// Checks the configuration and builds the store. No connection is made yet.
    pub fn build(self) -> Result<RedisDedupeStore, ConfigError> {
        let commands = self.settings.connect("idempotency.redis")?;
        at_least_a_millisecond(
            "idempotency.redis.fallback_poll_interval",
            self.fallback_poll_interval,
        )?;
        let publish = value::publish_command(commands.is_cluster());
        let subscriber = Subscriber::new(
            "idempotency.redis.url",
            commands.endpoint(),
            self.settings.operation_timeout,
        )?;
        Ok(RedisDedupeStore {
            shared: Arc::new(Shared {
                subscriber: Arc::new(subscriber),
                commands,
                key_prefix: self.settings.key_prefix,
                fallback_poll_interval: self.fallback_poll_interval,
                scripts: Scripts {
                    replace: Script::new(&value::replace(publish)),
                    release: value::release(publish),
                    take_over: Script::new(value::TAKE_OVER),
                    read: Script::new(value::READ),
                },
                fallback_polls: AtomicU64::new(0),
                pubsub_wakeups: AtomicU64::new(0),
            }),
        })
    }
}
