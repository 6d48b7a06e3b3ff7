//! Redis stores for [`tower_toolcall`], shared by every replica of a fleet.
//!
//! Behind a load balancer, each replica of a gateway keeps its own idempotency records,
//! quotas and loop histories, and an operator's switch reaches one replica out of N. This
//! crate keeps them in Redis (7.0 or later), through the store seams of the core:
//!
//! | type | seam of the core | what every replica then shares |
//! |---|---|---|
//! | [`RedisDedupeStore`] | [`DedupeStore`](tower_toolcall::idempotency::DedupeStore) | idempotency records: a call runs once in the fleet |
//! | [`RedisRateLimitStore`] | [`RateLimitStore`](tower_toolcall::rate_limit::RateLimitStore) | rate-limit quotas: 10 calls a second is 10 for the fleet |
//! | [`RedisLoopStore`] | [`LoopStore`](tower_toolcall::loop_detect::LoopStore) | loop-detection histories and a session's own settings |
//! | [`FleetControl`] | [`FleetActions`](tower_toolcall::stack::FleetActions) | operator actions: force-open, resets, the kill switch, shadow mode |
//!
//! Every operation is bounded by a timeout (1 s by default); what a layer does while Redis
//! cannot be reached is its [`FailurePolicy`](tower_toolcall::shared_store::FailurePolicy).
//! The stores of one process on one server share what they know of its outages: once one
//! times out, the others fail at once until the server answers again.
//!
//! # Example
//!
//! The whole stack, its records, quotas and loop histories in Redis, and the fleet's
//! operator actions through it:
//!
//! ```no_run
//! use std::sync::Arc;
//! use tower_toolcall::registry::{RateLimitSettings, ToolRegistry};
//! use tower_toolcall::ToolStack;
//! use tower_toolcall_redis::{FleetControl, RedisDedupeStore, RedisLoopStore, RedisRateLimitStore};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let url = "redis://127.0.0.1:6379/";
//! let stack = ToolStack::builder(ToolRegistry::open())
//!     .store(Arc::new(RedisDedupeStore::open(url)?))
//!     .rate_limit(|limits| limits.settings(RateLimitSettings::default().with_per_second(20)))
//!     .rate_limit_store(Arc::new(RedisRateLimitStore::open(url)?))
//!     .loop_store(Arc::new(RedisLoopStore::open(url)?))
//!     .build()?;
//! let fleet = FleetControl::builder(url).join(&stack)?;
//! fleet.sync().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # On a Redis Cluster
//!
//! With the feature `cluster`, every store and the fleet also run on a Redis Cluster (7.0 or
//! later). Where a URL goes, give the URLs of some of its nodes instead, a
//! [`RedisTarget`]: a list of strings is a cluster, one string a node, in code and in a
//! configuration file alike, so a fleet moves to a cluster by configuration only.
//!
//! ```no_run
//! # #[cfg(feature = "cluster")]
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use tower_toolcall::registry::{RateLimitSettings, ToolRegistry};
//! use tower_toolcall::ToolStack;
//! use tower_toolcall_redis::{
//!     FleetControl, RedisDedupeStore, RedisLoopStore, RedisRateLimitStore, RedisTarget,
//! };
//!
//! let cluster = RedisTarget::cluster([
//!     "redis://10.0.0.1:7000/",
//!     "redis://10.0.0.2:7000/",
//!     "redis://10.0.0.3:7000/",
//! ]);
//! let stack = ToolStack::builder(ToolRegistry::open())
//!     .store(Arc::new(RedisDedupeStore::open(cluster.clone())?))
//!     .rate_limit(|limits| limits.settings(RateLimitSettings::default().with_per_second(20)))
//!     .rate_limit_store(Arc::new(RedisRateLimitStore::open(cluster.clone())?))
//!     .loop_store(Arc::new(RedisLoopStore::open(cluster.clone())?))
//!     .build()?;
//! let fleet = FleetControl::builder(cluster).join(&stack)?;
//! fleet.sync().await?;
//! # Ok(())
//! # }
//! ```
//!
//! What changes on a cluster, and what does not:
//!
//! - **Keys.** Every key of one record, quota or session is hash-tagged
//!   (`<prefix>{<key>}…`), so it lives in one slot with its completion channel; every
//!   script declares each key it touches in `KEYS`, and they all share that tag. Concurrent
//!   checks of one quota or session are coalesced into one script per key, so a batch never
//!   spans slots. The fleet's switches share the tag `{fleet}`.
//! - **Round trips.** As on a node: a fresh idempotency key costs two commands on the
//!   master of its slot (the claim and the finalize), a hit one, a quota check and a loop
//!   check one each. The cluster client keeps one connection per node and sends each
//!   command to the master of its slot, following `MOVED` and `ASK` while slots move.
//! - **Waiting.** A duplicate waiting on a call that runs in another replica is woken
//!   through sharded pub/sub (`SSUBSCRIBE`, published by the finalize script with
//!   `SPUBLISH`) on the record's own slot: the message never crosses the cluster bus.
//! - **Operator actions** use classic pub/sub, which a cluster sends to every node: a
//!   replica hears them whatever node it subscribes through. When that node dies, the
//!   replica subscribes through another (the next seed, or a node the cluster names) and
//!   reads the switches again, so it misses nothing. Give several seeds.
//! - **A failover.** When a master dies, the calls whose keys it served cannot complete
//!   until the cluster promotes its replica (about `cluster-node-timeout` plus an election:
//!   2.0–2.7 s with a 1 s timeout in the tests); each fails after its operation timeout, by
//!   the store's failure policy: closed for idempotency (`STORE_UNAVAILABLE`, the tool does
//!   not run), open for quotas and loops. Keys on the other masters go on. No call runs
//!   twice: a claim whose answer was lost is released behind it, a claim or finalize the
//!   client sends again finds its own record, and a record that was acknowledged is on the
//!   replica that takes over. Under 200 calls a second, with a master killed, the tests
//!   count 131–267 calls of 2 000 failed by policy, on the dead master's slots, and every
//!   call working again 2.0–2.9 s after the kill. While slots move (`redis-cli --cluster
//!   reshard`), `MOVED` and `ASK` cost no call. A duplicate that waits on a record whose
//!   master fails over keeps reading it until its lease ends, and learns of the result from
//!   the new master (at most the fallback poll interval after it is written: the message
//!   published while its subscription moved may be lost). A result that cannot be written meanwhile is written again for up to 3 s (or four
//!   operation timeouts), until the replica takes over: a result given up would release
//!   its key, and a duplicate would run the tool again. The `redis` crate's cluster client
//!   (1.8) pauses every request while it reads the slot map again, and reads it again after
//!   each request that failed on the dead master; on a busy machine it was seen to stay in
//!   that loop, every shard failing, long after the failover. A store whose cluster
//!   connection answers nothing for 2 s (or four operation timeouts) while operations fail
//!   makes a new one from the seeds.
//! - **Throughput.** In the bench (`benches/cluster.rs`: 10 000 concurrent fresh keys, two
//!   replicas, a 2-core machine shared by the client and the six servers), the cluster
//!   served 0.53 times the calls per second of one node (0.57 with six replicas); each
//!   grows with the replicas' connections, so a fleet's replicas add throughput on both.
//! - **Replication is asynchronous** in Redis Cluster: a write acknowledged in the last
//!   instant before its master dies can be lost with it (none was in the tests, on
//!   loopback). A lost claim frees its key; a lost result lets a later duplicate run the
//!   tool again.
//! - **No short circuit.** On a node, the stores of a process skip a server known to be
//!   down; on a cluster they do not, since a dead master stops one shard, not the others.
//!
//! Breaker counting stays per replica, on a node and on a cluster alike (see
//! [`fleet`](fleet#breaker-counting-stays-local)): a breaker measures how its own replica's
//! calls fare; only the operator's force-open and reset are shared.
//!
//! # Feature flags
//!
//! | feature | what it adds |
//! |---|---|
//! | `cluster` | Redis Cluster as a [`RedisTarget`], through the `redis` crate's cluster client |

#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod dedupe;
pub mod fleet;
mod loop_store;
mod rate_limit;
mod support;
mod target;

pub use dedupe::{
    RedisDedupeStore, RedisDedupeStoreBuilder, RedisStoreStats, DEFAULT_FALLBACK_POLL_INTERVAL,
    DEFAULT_REDIS_KEY_PREFIX, DEFAULT_REDIS_OPERATION_TIMEOUT,
};
pub use fleet::{FleetControl, FleetControlBuilder, FleetStats, DEFAULT_FLEET_KEY_PREFIX};
pub use loop_store::{RedisLoopStore, RedisLoopStoreBuilder, DEFAULT_LOOP_KEY_PREFIX};
pub use rate_limit::{
    RedisRateLimitStore, RedisRateLimitStoreBuilder, DEFAULT_RATE_LIMIT_KEY_PREFIX,
};
pub use target::RedisTarget;
