//! What every Redis store of the crate shares: a lazily made multiplexed connection that
//! reconnects by itself, every operation bounded by a timeout, hash-tagged key names, the
//! checks of a store's settings, and the coalescing of concurrent checks of one key into one
//! script.

use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, Cmd, FromRedisValue, ProtocolVersion, RedisResult, ScriptInvocation};

use crate::error::ConfigError;
use crate::shared_store::SharedStoreError;

mod coalesce;

pub(crate) use coalesce::{check as coalesced, Batch, Coalescer};

/// The default time one Redis operation may take.
pub(crate) const DEFAULT_OPERATION_TIMEOUT: Duration = Duration::from_secs(1);

/// Runs one Redis operation within `timeout`.
pub(crate) async fn bounded<T>(
    timeout: Duration,
    op: impl Future<Output = RedisResult<T>>,
) -> Result<T, SharedStoreError> {
    match tokio::time::timeout(timeout, op).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => Err(SharedStoreError::Unavailable(
            if error.to_string().contains("syntax error") {
                format!("{error} (the store needs Redis 7.0 or later)")
            } else {
                error.to_string()
            },
        )),
        Err(_) => Err(SharedStoreError::Timeout(timeout)),
    }
}

/// The connection in `cell`, made on first use.
pub(crate) fn connection(
    cell: &OnceLock<Result<ConnectionManager, String>>,
    client: &Client,
    config: &ConnectionManagerConfig,
) -> Result<ConnectionManager, SharedStoreError> {
    cell.get_or_init(|| {
        ConnectionManager::new_lazy_with_config(client.clone(), config.clone())
            .map_err(|e| e.to_string())
    })
    .clone()
    .map_err(SharedStoreError::Unavailable)
}

/// How a store's connection reconnects: each attempt bounded by `timeout`. Its operations
/// carry no timer of their own: [`bounded`] already bounds each one by the operation timeout,
/// and a second timer on every request only costs a wake-up of the runtime's timer.
pub(crate) fn connection_config(timeout: Duration) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(None)
        .set_number_of_retries(2)
        .set_min_delay(Duration::from_millis(50))
        .set_max_delay(Duration::from_secs(1))
}

/// What every Redis store's builder takes: where the server is, the prefix of the store's
/// keys, and the time one operation may take.
#[derive(Debug)]
pub(crate) struct StoreSettings {
    pub(crate) url: String,
    pub(crate) key_prefix: String,
    pub(crate) operation_timeout: Duration,
}

impl StoreSettings {
    pub(crate) fn new(url: String, key_prefix: &str) -> Self {
        StoreSettings {
            url,
            key_prefix: key_prefix.to_owned(),
            operation_timeout: DEFAULT_OPERATION_TIMEOUT,
        }
    }

    /// Checks the settings of the store configured under `section` (`rate_limit.redis`, …)
    /// and makes its connection, which connects on first use.
    pub(crate) fn connect(&self, section: &str) -> Result<Connection, ConfigError> {
        let client = Client::open(self.url.as_str()).map_err(|e| {
            ConfigError::new(
                format!("{section}.url"),
                format!("is not a usable Redis URL: {e}; write it as redis://host:port/db"),
            )
        })?;
        if self.key_prefix.is_empty() || self.key_prefix.contains(['{', '}']) {
            return Err(ConfigError::new(
                format!("{section}.key_prefix"),
                format!(
                    "must be non-empty and free of `{{` and `}}`, got {:?}",
                    self.key_prefix
                ),
            ));
        }
        crate::time::at_least_a_millisecond(
            &format!("{section}.operation_timeout"),
            self.operation_timeout,
        )?;
        Ok(Connection::new(client, self.operation_timeout))
    }
}

/// The `key_prefix` and `operation_timeout` setters of a Redis store's builder, whose
/// `settings` field is a [`StoreSettings`]; `$default` is the default prefix, for the docs.
macro_rules! store_settings_setters {
    ($default:expr) => {
        #[doc = concat!(
                    "The prefix of every key the store writes (default `", $default, "`); it must ",
                    "not hold `{` or `}`, which would break the hash tag."
                )]
        pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
            self.settings.key_prefix = prefix.into();
            self
        }

        /// The time one Redis operation may take (default 1 s); an operation that takes
        /// longer fails.
        pub fn operation_timeout(mut self, timeout: Duration) -> Self {
            self.settings.operation_timeout = timeout;
            self
        }
    };
}

pub(crate) use store_settings_setters;

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

/// `<prefix>{<tagged>}<suffix>`: the braces are a Redis Cluster hash tag, so every key of one
/// `tagged` name lives in one slot.
pub(crate) fn hash_tagged(prefix: &str, tagged: &str, suffix: &str) -> String {
    let mut key = String::with_capacity(prefix.len() + tagged.len() + suffix.len() + 2);
    key.push_str(prefix);
    key.push('{');
    key.push_str(tagged);
    key.push('}');
    key.push_str(suffix);
    key
}

/// One multiplexed connection to a server, made on first use inside the Tokio runtime, that
/// reconnects by itself; every operation on it is bounded by the operation timeout.
pub(crate) struct Connection {
    client: Client,
    config: ConnectionManagerConfig,
    cell: OnceLock<Result<ConnectionManager, String>>,
    timeout: Duration,
}

impl Connection {
    pub(crate) fn new(client: Client, timeout: Duration) -> Self {
        Connection {
            client,
            config: connection_config(timeout),
            cell: OnceLock::new(),
            timeout,
        }
    }

    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    pub(crate) fn config(&self) -> &ConnectionManagerConfig {
        &self.config
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// A store's `Debug` output, begun with what every Redis store shows: its server, key
    /// prefix and operation timeout; the store adds its own fields.
    pub(crate) fn debug_store<'a, 'b>(
        &self,
        f: &'a mut std::fmt::Formatter<'b>,
        store: &str,
        key_prefix: &str,
    ) -> std::fmt::DebugStruct<'a, 'b> {
        let mut debug = f.debug_struct(store);
        debug
            .field("server", &self.client.get_connection_info().addr())
            .field("key_prefix", &key_prefix)
            .field("operation_timeout", &self.timeout);
        debug
    }

    /// Runs one command within the operation timeout.
    pub(crate) async fn command<T: FromRedisValue>(
        &self,
        command: &Cmd,
    ) -> Result<T, SharedStoreError> {
        let mut conn = connection(&self.cell, &self.client, &self.config)?;
        bounded(self.timeout, command.query_async(&mut conn)).await
    }

    /// Runs one script (`EVALSHA`, loading it once should the server not know it) within the
    /// operation timeout.
    pub(crate) async fn eval<T: FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T, SharedStoreError> {
        let mut conn = connection(&self.cell, &self.client, &self.config)?;
        bounded(self.timeout, invocation.invoke_async(&mut conn)).await
    }
}
