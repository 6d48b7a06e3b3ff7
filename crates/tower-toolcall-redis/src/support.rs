//! What every Redis store of the crate shares: a lazily made multiplexed connection that
//! reconnects by itself, every operation bounded by a timeout, an operation sent again once
//! when it found its connection broken, a short circuit that skips a server known to be down
//! (see [`circuit`]), hash-tagged key names, the checks of a store's settings, and the
//! coalescing of concurrent checks of one key into one script.

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Waker};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, Cmd, FromRedisValue, ProtocolVersion, RedisResult, ScriptInvocation};

use tower_toolcall::shared_store::SharedStoreError;
use tower_toolcall::ConfigError;

mod circuit;
mod coalesce;

use circuit::Server;
pub(crate) use coalesce::{check as coalesced, Batch, Coalescer};

pub(crate) use tower_toolcall::time::{at_least_a_millisecond, millis, unix_now_ms};

/// Runs `work`, which its caller leaves behind, to its end: polled once here, so that a
/// command is on its way before any the caller's task sends next, then on the Tokio runtime.
/// `false` when there is no runtime (nothing is polled then).
pub(crate) fn finish_detached(work: impl Future<Output = ()> + Send + 'static) -> bool {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return false;
    };
    let mut work = Box::pin(work);
    if work
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
        .is_pending()
    {
        runtime.spawn(work);
    }
    true
}

/// The default time one Redis operation may take.
pub(crate) const DEFAULT_OPERATION_TIMEOUT: Duration = Duration::from_secs(1);

/// Runs one Redis operation within `timeout`.
pub(crate) async fn bounded<T>(
    timeout: Duration,
    op: impl Future<Output = RedisResult<T>>,
) -> Result<T, SharedStoreError> {
    bounded_telling(timeout, op)
        .await
        .map_err(|(error, _)| error)
}

/// Runs one Redis operation within `timeout`; a failure comes with whether it says that the
/// server cannot be reached.
async fn bounded_telling<T>(
    timeout: Duration,
    op: impl Future<Output = RedisResult<T>>,
) -> Result<T, (SharedStoreError, bool)> {
    match tokio::time::timeout(timeout, op).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => Err((
            SharedStoreError::Unavailable(if error.to_string().contains("syntax error") {
                format!("{error} (the store needs Redis 7.0 or later)")
            } else {
                error.to_string()
            }),
            circuit::speaks_of_the_server(&error),
        )),
        Err(_) => Err((SharedStoreError::Timeout(timeout), true)),
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
        at_least_a_millisecond(
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
/// reconnects by itself; every operation on it is bounded by the operation timeout, and
/// fails at once while the server is known to be down (see [`circuit`]).
pub(crate) struct Connection {
    client: Client,
    config: ConnectionManagerConfig,
    cell: OnceLock<Result<ConnectionManager, String>>,
    timeout: Duration,
    server: Arc<Server>,
}

impl Connection {
    pub(crate) fn new(client: Client, timeout: Duration) -> Self {
        let server = Server::named(client.get_connection_info().addr().to_string());
        Connection {
            client,
            config: connection_config(timeout),
            cell: OnceLock::new(),
            timeout,
            server,
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
        self.run(|mut conn| async move { command.query_async(&mut conn).await })
            .await
    }

    /// Runs one command within the operation timeout even while the server is known to be
    /// down: for a command that must follow one already sent on this connection (the release
    /// of a claim whose answer never came), which a server that comes back runs in order.
    pub(crate) async fn command_behind<T: FromRedisValue>(
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
        self.run(|mut conn| async move { invocation.invoke_async(&mut conn).await })
            .await
    }

    /// Runs `op` on the connection within the operation timeout, unless the server is known
    /// to be down. An operation that finds its connection broken (the server restarted since
    /// the connection's last use: the request never reached it) is sent once more, on the
    /// connection the manager makes anew, within the same timeout. A failure that says the
    /// server cannot be reached marks it down for every store.
    async fn run<T, F, Fut>(&self, op: F) -> Result<T, SharedStoreError>
    where
        F: Fn(ConnectionManager) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        self.server.check()?;
        let conn = connection(&self.cell, &self.client, &self.config)?;
        let attempts = async {
            match op(conn.clone()).await {
                Err(error) if error.is_connection_dropped() => op(conn.clone()).await,
                answered => answered,
            }
        };
        match bounded_telling(self.timeout, attempts).await {
            Ok(value) => {
                self.server.answered();
                Ok(value)
            }
            Err((error, unreachable)) => {
                if unreachable {
                    self.server.unreachable(&error, &conn, self.timeout);
                }
                Err(error)
            }
        }
    }
}
