//! What the process knows of each Redis server its stores use: whether an outage is known.
//!
//! Every store's [`Connection`](super::Connection) to one server (the rate-limit, loop,
//! dedupe and fleet stores alike) shares one [`Server`]. An operation that times out, or
//! fails because the server cannot be reached, marks the server down; from then on every
//! operation of every store on it fails at once, without touching the network, and each
//! store's failure policy decides (open for quotas and loops, closed for idempotency). One
//! background probe then sends `PING` every [`PROBE_INTERVAL`]; the first that is answered
//! ends the outage. So a server that hangs costs a call at most one operation timeout, not
//! one per store, and later calls nothing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::Duration;

use redis::aio::ConnectionManager;

use super::bounded;
use tower_toolcall::shared_store::StoreError;

/// How often the probe of a server that is down asks it for `PING`.
pub(crate) const PROBE_INTERVAL: Duration = Duration::from_millis(200);

/// One server, as every store of the process sees it.
#[derive(Debug)]
pub(crate) struct Server {
    /// `host:port`, for the logs and the errors.
    name: String,
    /// An outage is known: operations fail at once.
    down: AtomicBool,
    /// A probe task runs.
    probing: AtomicBool,
}

/// The servers in use, by address: the stores that point at one server share its state.
fn servers() -> &'static Mutex<HashMap<String, Weak<Server>>> {
    static SERVERS: OnceLock<Mutex<HashMap<String, Weak<Server>>>> = OnceLock::new();
    SERVERS.get_or_init(Mutex::default)
}

impl Server {
    /// The shared state of the server at `name` (its address).
    pub(crate) fn named(name: String) -> Arc<Server> {
        let mut servers = servers().lock().unwrap_or_else(PoisonError::into_inner);
        servers.retain(|_, server| server.strong_count() > 0);
        if let Some(server) = servers.get(&name).and_then(Weak::upgrade) {
            return server;
        }
        let server = Arc::new(Server {
            name: name.clone(),
            down: AtomicBool::new(false),
            probing: AtomicBool::new(false),
        });
        servers.insert(name, Arc::downgrade(&server));
        server
    }

    /// `Err` at once while an outage of the server is known.
    pub(crate) fn check(&self) -> Result<(), StoreError> {
        if self.down.load(Ordering::Relaxed) {
            return Err(StoreError::Unavailable(format!(
                "Redis at {} stopped answering; its stores are skipped until it answers a \
                 probe",
                self.name
            )));
        }
        Ok(())
    }

    /// An operation was answered: the server is up.
    pub(crate) fn answered(&self) {
        if self.down.load(Ordering::Relaxed) {
            self.up();
        }
    }

    fn up(&self) {
        if self.down.swap(false, Ordering::Relaxed) {
            tracing::info!(server = %self.name, "Redis answers again: its stores are used again");
        }
    }

    /// An operation found the server unreachable (`error`): every store skips it from now
    /// on, and a probe on `connection`, each bounded by `timeout`, watches for its return.
    pub(crate) fn unreachable(
        self: &Arc<Self>,
        error: &StoreError,
        connection: &ConnectionManager,
        timeout: Duration,
    ) {
        if !self.down.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                server = %self.name,
                %error,
                "Redis does not answer: every store on it fails by its policy at once until \
                 it answers a probe"
            );
        }
        if self.probing.swap(true, Ordering::Relaxed) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.probing.store(false, Ordering::Relaxed);
            return;
        };
        runtime.spawn(probe(Arc::downgrade(self), connection.clone(), timeout));
    }
}

/// Asks the server for `PING` every [`PROBE_INTERVAL`] until it answers (the outage ends),
/// an operation found it up, or no store uses it any more.
async fn probe(server: Weak<Server>, mut connection: ConnectionManager, timeout: Duration) {
    loop {
        tokio::time::sleep(PROBE_INTERVAL).await;
        let Some(state) = server.upgrade() else {
            return;
        };
        if state.down.load(Ordering::Relaxed) {
            // A failed PING also makes the connection reconnect.
            let ping = bounded(timeout, async {
                redis::cmd("PING")
                    .query_async::<String>(&mut connection)
                    .await
            })
            .await;
            if ping.is_ok() {
                state.up();
            }
        }
        if state.done_probing() {
            return;
        }
    }
}

impl Server {
    /// Whether the probe may end: the server is up, and no operation found it down again
    /// while the probe was ending (that one spawned no probe of its own).
    fn done_probing(&self) -> bool {
        if self.down.load(Ordering::Relaxed) {
            return false;
        }
        self.probing.store(false, Ordering::Relaxed);
        !self.down.load(Ordering::Relaxed) || self.probing.swap(true, Ordering::Relaxed)
    }
}

/// Whether a failed operation's `error` says the server cannot be reached (rather than that
/// it refused one command, which says nothing of the others).
pub(crate) fn speaks_of_the_server(error: &redis::RedisError) -> bool {
    error.is_io_error()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || error.is_timeout()
}
