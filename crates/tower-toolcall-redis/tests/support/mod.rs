//! The shared test helpers of `tower-toolcall-test`, and the store suite run on Redis.
#![allow(dead_code, unused_imports, unreachable_pub)]

pub use tower_toolcall_test::*;

/// Runs each case of a table (shared with the core's tests, which run it in memory) on a
/// `redis-server` of its own; the test attribute given first is the memory suite's.
#[allow(unused_macros)]
macro_rules! store_suite {
    (#[$memory:meta] $($case:ident),* $(,)?) => {
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let server = super::support::redis_server::RedisServer::start();
                    super::$case(super::Store::Redis(server)).await;
                }
            )*
        }

        #[cfg(feature = "cluster")]
        mod cluster {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let cluster = super::support::cluster::RedisCluster::start();
                    super::$case(super::Store::Cluster(cluster)).await;
                }
            )*
        }
    };
}
#[allow(unused_imports)]
pub(crate) use store_suite;
