//! One upstream MCP server, kept connected: a connection that ends (a stdio server that
//! exits, an HTTP session that is lost) is made again with backoff, without rebuilding the
//! stack, and while it is down every call of every tool fails at once.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use rmcp::service::{Peer, RunningService};
use rmcp::{ClientHandler, RoleClient};
use tokio::sync::Notify;
use tokio::time::Instant;

use tower_toolcall::registry::JitterKind;
use tower_toolcall::retry::Backoff;
use tower_toolcall::time::millis;
use tower_toolcall::{ErrorCode, ToolError};

/// The backoff between reconnection attempts after the first, which is made at once: from
/// 100 ms, doubling, up to 5 s, with equal jitter (each delay between half its ceiling and
/// the ceiling), so that replicas that lost the same server do not come back in step.
pub const DEFAULT_RECONNECT_BACKOFF: Backoff = Backoff::new(
    Duration::from_millis(100),
    Duration::from_secs(5),
    JitterKind::Equal,
    0,
);

/// How long a reconnection attempt may take (a process started again that never answers
/// `initialize` is given up and started again with the backoff), unless the client says.
pub const DEFAULT_RECONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// The shortest retry-after told to calls while a connection is being made.
const RETRY_AFTER_FLOOR: Duration = Duration::from_millis(100);

/// A connection being made: the running rmcp client, or why it could not start.
pub(crate) type Connecting = Pin<
    Box<dyn Future<Output = Result<Connection, Box<dyn std::error::Error + Send + Sync>>> + Send>,
>;

/// Makes a connection to the server, each time it is called.
pub(crate) type Connector = Arc<dyn Fn() -> Connecting + Send + Sync>;

/// A running connection to the server.
pub(crate) struct Connection {
    peer: Peer<RoleClient>,
    /// Ends the connection when told.
    stop: Arc<Notify>,
    /// Done when the connection has ended.
    ended: Pin<Box<dyn Future<Output = ()> + Send>>,
}

impl Connection {
    pub(crate) fn of<H: ClientHandler>(running: RunningService<RoleClient, H>) -> Self {
        let stop = Arc::new(Notify::new());
        let told = stop.clone();
        let peer = running.peer().clone();
        let cancel = running.cancellation_token();
        let ended = async move {
            let waiting = running.waiting();
            tokio::pin!(waiting);
            tokio::select! {
                _ = &mut waiting => return,
                _ = told.notified() => cancel.cancel(),
            }
            let _ = waiting.await;
        };
        Connection {
            peer,
            stop,
            ended: Box::pin(ended),
        }
    }
}

/// Where an upstream server's connection stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum UpstreamState {
    /// Connected: calls go to the server.
    Connected,
    /// The connection ended; calls fail at once with `UPSTREAM_UNAVAILABLE` until it is made
    /// again.
    Reconnecting {
        /// Failed attempts to connect since the connection ended.
        failed_attempts: u32,
        /// How long until the next attempt (zero while one is under way).
        next_attempt_in: Duration,
    },
}

/// What an upstream's supervision has done so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct UpstreamStats {
    /// Connections that ended (the server exited, closed the stream, or lost the session).
    pub disconnects: u64,
    /// Connections made again after one ended.
    pub reconnects: u64,
    /// Attempts to connect again that failed.
    pub failed_attempts: u64,
}

enum State {
    Up {
        peer: Peer<RoleClient>,
        generation: u64,
        stop: Arc<Notify>,
    },
    Down {
        failed_attempts: u32,
        next_attempt_at: Instant,
    },
}

/// An upstream server kept connected; clones share it. The supervision stops, and the
/// connection with it, when the last clone is dropped.
#[derive(Clone)]
pub(crate) struct Upstream {
    shared: Arc<Shared>,
}

struct Shared {
    name: Arc<str>,
    state: Mutex<State>,
    disconnects: AtomicU64,
    reconnects: AtomicU64,
    failed_attempts: AtomicU64,
    /// How long a reconnection attempt may take, in milliseconds.
    reconnect_timeout_ms: AtomicU64,
    /// Told when the last clone is dropped.
    dropped: Arc<Notify>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.dropped.notify_one();
    }
}

impl Upstream {
    /// Bounds each reconnection attempt by `timeout`.
    pub(crate) fn reconnect_within(&self, timeout: Duration) {
        self.shared
            .reconnect_timeout_ms
            .store(millis(timeout).max(1), Ordering::Relaxed);
    }

    /// Connects with `connect`, and keeps the connection: `Err` when the first connection
    /// cannot be made.
    pub(crate) async fn start(
        name: Arc<str>,
        connect: Connector,
        backoff: Backoff,
    ) -> Result<Upstream, ToolError> {
        let connection = connect().await.map_err(|err| {
            tracing::warn!(event = "mcp_upstream_unreachable", upstream = %name, error = %err);
            ToolError::new(
                ErrorCode::UpstreamUnavailable,
                format!(
                    "cannot connect to the MCP server {name}: {}",
                    root_cause(&*err)
                ),
            )
        })?;
        let dropped = Arc::new(Notify::new());
        let shared = Arc::new(Shared {
            name,
            state: Mutex::new(State::Up {
                peer: connection.peer.clone(),
                generation: 0,
                stop: connection.stop.clone(),
            }),
            disconnects: AtomicU64::new(0),
            reconnects: AtomicU64::new(0),
            failed_attempts: AtomicU64::new(0),
            reconnect_timeout_ms: AtomicU64::new(millis(DEFAULT_RECONNECT_TIMEOUT)),
            dropped: dropped.clone(),
        });
        let supervisor = Supervisor {
            shared: Arc::downgrade(&shared),
            connect,
            backoff,
            dropped,
        };
        tokio::spawn(supervisor.run(connection));
        Ok(Upstream { shared })
    }

    /// The server's peer and its connection's generation, or the `UPSTREAM_UNAVAILABLE`
    /// error of a call made while the connection is down.
    pub(crate) fn current(&self) -> Result<(Peer<RoleClient>, u64), ToolError> {
        match &*self.shared.lock() {
            State::Up {
                peer, generation, ..
            } => Ok((peer.clone(), *generation)),
            State::Down {
                next_attempt_at, ..
            } => {
                let wait = next_attempt_at
                    .saturating_duration_since(Instant::now())
                    .max(RETRY_AFTER_FLOOR);
                Err(ToolError::new(
                    ErrorCode::UpstreamUnavailable,
                    format!(
                        "the MCP server {} is restarting; the call did not run; call again in \
                         {} ms",
                        self.shared.name,
                        millis(wait)
                    ),
                )
                .not_processed(true)
                .with_retry_after(wait)
                .with_health_failure(false))
            }
        }
    }

    /// Says that the connection of `generation` failed under a call (its transport closed
    /// or refused a send): it is dropped and made again, unless that is already under way.
    pub(crate) fn lost(&self, generation: u64) {
        if let State::Up {
            generation: current,
            stop,
            ..
        } = &*self.shared.lock()
        {
            if *current == generation {
                stop.notify_one();
            }
        }
    }

    pub(crate) fn state(&self) -> UpstreamState {
        match &*self.shared.lock() {
            State::Up { .. } => UpstreamState::Connected,
            State::Down {
                failed_attempts,
                next_attempt_at,
            } => UpstreamState::Reconnecting {
                failed_attempts: *failed_attempts,
                next_attempt_in: next_attempt_at.saturating_duration_since(Instant::now()),
            },
        }
    }

    pub(crate) fn stats(&self) -> UpstreamStats {
        UpstreamStats {
            disconnects: self.shared.disconnects.load(Ordering::Relaxed),
            reconnects: self.shared.reconnects.load(Ordering::Relaxed),
            failed_attempts: self.shared.failed_attempts.load(Ordering::Relaxed),
        }
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl fmt::Debug for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Upstream")
            .field("name", &self.shared.name)
            .field("state", &self.state())
            .finish_non_exhaustive()
    }
}

/// What `err` comes down to: its innermost cause (a refused connection, a certificate no
/// root vouches for), which the errors around it wrap in their own words.
pub(super) fn root_cause(err: &(dyn std::error::Error + 'static)) -> String {
    let mut root = err;
    while let Some(source) = root.source() {
        root = source;
    }
    root.to_string()
}

/// The task that watches the connection and makes it again.
struct Supervisor {
    shared: Weak<Shared>,
    connect: Connector,
    backoff: Backoff,
    dropped: Arc<Notify>,
}

impl Supervisor {
    async fn run(self, mut connection: Connection) {
        let mut generation = 0;
        loop {
            tokio::select! {
                _ = &mut connection.ended => {}
                _ = self.dropped.notified() => {
                    connection.stop.notify_one();
                    connection.ended.await;
                    return;
                }
            }
            let Some(next) = self.reconnect().await else {
                return;
            };
            generation += 1;
            let Some(shared) = self.shared.upgrade() else {
                next.stop.notify_one();
                return;
            };
            *shared.lock() = State::Up {
                peer: next.peer.clone(),
                generation,
                stop: next.stop.clone(),
            };
            connection = next;
        }
    }

    /// Connects again: at once, then after each failure with the backoff. `None` when the
    /// upstream is gone.
    async fn reconnect(&self) -> Option<Connection> {
        let down_at = Instant::now();
        {
            let shared = self.shared.upgrade()?;
            shared.disconnects.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(event = "mcp_upstream_down", upstream = %shared.name);
        }
        let (mut failed, mut previous) = (0u32, None);
        loop {
            let delay = match failed {
                0 => Duration::ZERO,
                n => self.backoff.random_delay(n, previous),
            };
            previous = Some(delay);
            *self.shared.upgrade()?.lock() = State::Down {
                failed_attempts: failed,
                next_attempt_at: Instant::now() + delay,
            };
            let within = Duration::from_millis(
                self.shared
                    .upgrade()?
                    .reconnect_timeout_ms
                    .load(Ordering::Relaxed),
            );
            let attempt = async {
                tokio::time::sleep(delay).await;
                match tokio::time::timeout(within, (self.connect)()).await {
                    Ok(connected) => connected,
                    Err(_) => Err(format!(
                        "no answer to initialize within {} ms; started again after a pause",
                        within.as_millis()
                    )
                    .into()),
                }
            };
            let outcome = tokio::select! {
                outcome = attempt => outcome,
                _ = self.dropped.notified() => return None,
            };
            let shared = self.shared.upgrade()?;
            match outcome {
                Ok(connection) => {
                    shared.reconnects.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(
                        event = "mcp_upstream_reconnected",
                        upstream = %shared.name,
                        failed_attempts = failed,
                        down_ms = millis(down_at.elapsed()),
                    );
                    return Some(connection);
                }
                Err(err) => {
                    failed = failed.saturating_add(1);
                    shared.failed_attempts.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        event = "mcp_upstream_reconnect_failed",
                        upstream = %shared.name,
                        failed_attempts = failed,
                        error = %err,
                    );
                }
            }
        }
    }
}
