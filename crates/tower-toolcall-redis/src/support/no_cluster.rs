//! A Redis Cluster in a build without the feature `cluster`: there is none. A store given a
//! cluster's seeds refuses them as it is built ([`Cluster::new`]), so no value of the types
//! here is ever made: [`Cluster`] and [`Link`] are enums without variants, the others hold a
//! cluster, and the crate's matches name them like the real ones of the module `cluster`
//! (built with the feature), in arms that are never taken.

use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Client, Cmd, FromRedisValue, Pipeline, RedisFuture, RedisResult, Value};

use tower_toolcall::shared_store::StoreError;
use tower_toolcall::ConfigError;

use super::{Backend, Pushes};

/// A store's cluster: none in this build.
pub(crate) enum Cluster {}

impl Cluster {
    /// Refuses the seeds of the cluster configured under `section`: this build has no
    /// cluster client.
    pub(crate) fn new(
        section: &str,
        _seeds: &[String],
        _timeout: Duration,
    ) -> Result<Cluster, ConfigError> {
        Err(ConfigError::new(
            format!("{section}.url"),
            "is a list of Redis Cluster seeds: build tower-toolcall-redis with its `cluster` \
             feature, or give the URL of one node",
        ))
    }

    pub(crate) async fn masters(&self) -> Result<Vec<Master<'_>>, StoreError> {
        match *self {}
    }

    pub(crate) fn listening(&self) -> Listening {
        match *self {}
    }

    pub(crate) fn subscriptions(&self) -> Subscriptions {
        match *self {}
    }
}

impl Backend for Cluster {
    type Link = Link;

    fn timeout(&self) -> Duration {
        match *self {}
    }

    fn describe(&self, _debug: &mut std::fmt::DebugStruct<'_, '_>) {
        match *self {}
    }

    fn ready(&self) -> Result<(), StoreError> {
        match *self {}
    }

    async fn link(&self) -> RedisResult<Link> {
        match *self {}
    }

    fn ended(&self, _outcome: Result<(), (&StoreError, bool)>) {
        match *self {}
    }
}

/// A connection to a cluster: none in this build.
#[derive(Clone)]
pub(crate) enum Link {}

impl Link {
    pub(crate) async fn ssubscribe(&mut self, _channel: &str) -> RedisResult<()> {
        match *self {}
    }

    pub(crate) async fn sunsubscribe(&mut self, _channel: &str) -> RedisResult<()> {
        match *self {}
    }
}

impl ConnectionLike for Link {
    fn req_packed_command<'a>(&'a mut self, _cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match *self {}
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        _pipeline: &'a Pipeline,
        _offset: usize,
        _count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match *self {}
    }

    fn get_db(&self) -> i64 {
        match *self {}
    }
}

/// One master of a cluster: none in this build.
pub(crate) struct Master<'a>(&'a Cluster);

impl Master<'_> {
    pub(crate) async fn command<T: FromRedisValue>(&self, _command: &Cmd) -> Result<T, StoreError> {
        match *self.0 {}
    }
}

/// Where the fleet's listener subscribes on a cluster: nowhere in this build.
pub(crate) struct Listening(&'static Cluster);

impl Listening {
    pub(crate) async fn next(&mut self) -> RedisResult<Client> {
        match *self.0 {}
    }

    pub(crate) fn lost(&mut self) {
        match *self.0 {}
    }
}

/// The connection of a store's subscriptions on a cluster: none in this build.
pub(crate) struct Subscriptions(&'static Cluster);

impl Subscriptions {
    pub(crate) async fn connection(&self, _pushes: Pushes) -> Result<Link, StoreError> {
        match *self.0 {}
    }
}
