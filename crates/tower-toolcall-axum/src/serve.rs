//! [`serve`]: an axum router on a TCP listener, with the limits a server facing untrusted
//! clients needs.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

use tower_toolcall::ConfigError;

/// How long a connection may take to send a request's headers by default: 20 seconds.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(20);

/// How many connections [`serve`] holds open at once by default: 512.
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;

/// The connection limits of [`serve`].
///
/// - `header_read_timeout` (default [`DEFAULT_HEADER_READ_TIMEOUT`]): how long a connection
///   may take to send a request's headers, counted from when it opened or from when its
///   previous answer was sent. It closes connections that send their headers slowly and
///   keep-alive connections left idle.
/// - `max_connections` (default [`DEFAULT_MAX_CONNECTIONS`]): connections held open at
///   once. When they are all in use, new ones wait in the listener's backlog until one
///   closes; keep it under the process's file descriptor limit (`ulimit -n`), with room for
///   the files and upstream connections the tools need.
///
/// The time a request's body may take is the router's:
/// [`ToolRouter::body_timeout`](super::ToolRouter::body_timeout).
///
/// ```
/// use std::time::Duration;
/// use tower_toolcall_axum::ServeConfig;
///
/// let config = ServeConfig::default()
///     .header_read_timeout(Duration::from_secs(10))
///     .max_connections(256);
/// # let _ = config;
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
#[must_use]
pub struct ServeConfig {
    header_read_timeout: Duration,
    max_connections: usize,
    #[cfg(feature = "tls")]
    tls: Option<crate::ServerTls>,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            #[cfg(feature = "tls")]
            tls: None,
        }
    }
}

impl ServeConfig {
    /// How long a connection may take to send a request's headers, or stay idle between
    /// requests; at least 1 ms.
    pub fn header_read_timeout(mut self, timeout: Duration) -> Self {
        self.header_read_timeout = timeout;
        self
    }

    /// How many connections are held open at once; at least 1.
    pub fn max_connections(mut self, connections: usize) -> Self {
        self.max_connections = connections;
        self
    }

    /// Serves HTTPS with `tls`'s certificate: each connection's handshake is done on the
    /// connection's own task, within the header-read timeout and under the connection cap,
    /// so that slow handshakes hold up no other client.
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls(mut self, tls: crate::ServerTls) -> Self {
        self.tls = Some(tls);
        self
    }

    fn check(&self) -> Result<u32, ConfigError> {
        if self.header_read_timeout.is_zero() {
            return Err(ConfigError::new(
                "serve.header_read_timeout",
                "must be at least 1 ms",
            ));
        }
        let most = Semaphore::MAX_PERMITS.min(u32::MAX as usize);
        match u32::try_from(self.max_connections) {
            Ok(n @ 1..) if self.max_connections <= most => Ok(n),
            _ => Err(ConfigError::new(
                "serve.max_connections",
                format!("must be from 1 to {most}, got {}", self.max_connections),
            )),
        }
    }
}

/// Serves `app` on `listener` over HTTP/1.1 within the limits of `config`, until `shutdown`
/// completes; then it stops accepting connections, lets every request in flight get its
/// answer, and returns once every connection is closed.
///
/// Use it rather than `axum::serve` for a gateway that untrusted clients can reach: that
/// one sets no header-read timeout and no connection cap, so connections that send nothing
/// (or their headers a byte at a time) stay open until the process runs out of file
/// descriptors. A bad `config` is an [`io::ErrorKind::InvalidInput`] error naming the field.
///
/// ```no_run
/// use tower_toolcall_axum::{serve, ServeConfig, ToolRouter};
/// # use tower_toolcall::{registry::ToolRegistry, tool_fn, ToolCall, ToolOutput};
///
/// # async fn run() -> std::io::Result<()> {
/// # let registry = ToolRegistry::open();
/// # let tools = tool_fn(|_call: ToolCall| async { Ok(ToolOutput::new(serde_json::json!(null))) });
/// let app = ToolRouter::new(registry, tools).into_router();
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
/// serve(listener, app, ServeConfig::default(), async {
///     tokio::signal::ctrl_c().await.ok();
/// })
/// .await
/// # }
/// ```
pub async fn serve(
    listener: TcpListener,
    app: Router,
    config: ServeConfig,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let max_connections = config
        .check()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let slots = Arc::new(Semaphore::new(max_connections as usize));
    let (stop, stopping) = watch::channel(false);
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(config.header_read_timeout);
    tokio::pin!(shutdown);
    loop {
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(error) => {
                    accept_failed(error).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let (http, app, stopping) = (http.clone(), app.clone(), stopping.clone());
        #[cfg(feature = "tls")]
        if let Some(tls) = &config.tls {
            let (acceptor, within) = (tls.acceptor(), config.header_read_timeout);
            tokio::spawn(async move {
                let _slot = slot;
                match tokio::time::timeout(within, acceptor.accept(stream)).await {
                    Ok(Ok(stream)) => connection(http, app, stopping, stream).await,
                    Ok(Err(error)) => tracing::debug!(%error, "a TLS handshake failed"),
                    Err(_) => tracing::debug!("a TLS handshake took too long"),
                }
            });
            continue;
        }
        tokio::spawn(async move {
            let _slot = slot;
            connection(http, app, stopping, stream).await;
        });
    }
    drop(listener);
    stop.send_replace(true);
    // Every connection holds a slot until it is closed.
    let _all = slots.acquire_many(max_connections).await;
    Ok(())
}

/// Serves one connection until it closes, or until the server stops (then its requests in
/// flight get their answers first).
async fn connection<S>(
    http: http1::Builder,
    app: Router,
    mut stopping: watch::Receiver<bool>,
    stream: S,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let connection = http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app));
    tokio::pin!(connection);
    let stop = async move {
        // An error means the server is gone: stop as well.
        let _ = stopping.wait_for(|stop| *stop).await;
    };
    let closed = tokio::select! {
        closed = connection.as_mut() => closed,
        () = stop => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(error) = closed {
        tracing::debug!(%error, "connection closed with an error");
    }
}

/// Waits after a failed accept that is not the client's doing (out of file descriptors,
/// say), so that the loop does not spin while it lasts.
async fn accept_failed(error: io::Error) {
    if matches!(
        error.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    ) {
        return;
    }
    tracing::error!(%error, "accepting a connection failed; trying again in 1 s");
    tokio::time::sleep(Duration::from_secs(1)).await;
}
