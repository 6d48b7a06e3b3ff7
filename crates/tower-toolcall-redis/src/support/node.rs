//! One Redis node as every store of the crate reaches it: one multiplexed connection, made
//! on first use, that reconnects by itself, and what the process knows of the node's
//! outages, shared by every store on it (see [`circuit`](super::circuit)).

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, ProtocolVersion, RedisResult};

use tower_toolcall::shared_store::StoreError;
use tower_toolcall::ConfigError;

use super::circuit::Server;
use super::Backend;

/// A store's node: its client, its connection once made, and the node's shared state.
pub(crate) struct Node {
    client: Client,
    config: ConnectionManagerConfig,
    connection: OnceLock<Result<ConnectionManager, String>>,
    /// What the process knows of the node's outages.
    server: Arc<Server>,
    timeout: Duration,
}

impl Node {
    /// The node at `url` of the store configured under `section`, each operation bounded by
    /// `timeout`; no connection is made yet.
    pub(crate) fn new(section: &str, url: &str, timeout: Duration) -> Result<Node, ConfigError> {
        let client = Client::open(url).map_err(|e| {
            ConfigError::new(
                format!("{section}.url"),
                format!("is not a usable Redis URL: {e}; write it as redis://host:port/db"),
            )
        })?;
        let server = Server::named(client.get_connection_info().addr().to_string());
        Ok(Node {
            client,
            config: connection_config(timeout),
            connection: OnceLock::new(),
            server,
            timeout,
        })
    }

    /// The node's client.
    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// How the store's connection reconnects.
    pub(crate) fn config(&self) -> &ConnectionManagerConfig {
        &self.config
    }
}

impl Backend for Node {
    type Link = ConnectionManager;

    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn describe(&self, debug: &mut std::fmt::DebugStruct<'_, '_>) {
        debug.field("server", &self.client.get_connection_info().addr());
    }

    fn ready(&self) -> Result<(), StoreError> {
        self.server.check()
    }

    fn link(&self) -> impl Future<Output = RedisResult<ConnectionManager>> + Send {
        std::future::ready(
            connection(&self.connection, &self.client, &self.config).map_err(|e| {
                redis::RedisError::from((redis::ErrorKind::Io, "connect", e.to_string()))
            }),
        )
    }

    /// An answer says the server is up; a failure that says it cannot be reached marks it
    /// down for every store, and a probe on the connection watches for its return.
    fn ended(&self, outcome: Result<(), (&StoreError, bool)>) {
        match outcome {
            Ok(()) => self.server.answered(),
            Err((error, true)) => {
                if let Some(Ok(conn)) = self.connection.get() {
                    self.server.unreachable(error, conn, self.timeout);
                }
            }
            Err((_, false)) => {}
        }
    }
}

/// The connection in `cell`, made on first use.
pub(crate) fn connection(
    cell: &OnceLock<Result<ConnectionManager, String>>,
    client: &Client,
    config: &ConnectionManagerConfig,
) -> Result<ConnectionManager, StoreError> {
    cell.get_or_init(|| {
        ConnectionManager::new_lazy_with_config(client.clone(), config.clone())
            .map_err(|e| e.to_string())
    })
    .clone()
    .map_err(StoreError::Unavailable)
}

/// How a store's connection reconnects: each attempt bounded by `timeout`. Its operations
/// carry no timer of their own: [`bounded`](super::bounded) already bounds each one by the
/// operation timeout, and a second timer on every request only costs a wake-up of the
/// runtime's timer.
fn connection_config(timeout: Duration) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(None)
        .set_number_of_retries(2)
        .set_min_delay(Duration::from_millis(50))
        .set_max_delay(Duration::from_secs(1))
}

/// A client like `client`, that speaks RESP3, for subscriptions; `field` names the URL's
/// setting in the error.
pub(crate) fn resp3_client(field: &str, client: &Client) -> Result<Client, ConfigError> {
    let info = client.get_connection_info().clone();
    let resp3 = info
        .redis_settings()
        .clone()
        .set_protocol(ProtocolVersion::RESP3);
    Client::open(info.set_redis_settings(resp3))
        .map_err(|e| ConfigError::new(field, format!("cannot be used for subscriptions: {e}")))
}
