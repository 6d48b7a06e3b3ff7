//! The MCP sessions (2025-11-25) of `/mcp`: whose each one is, how many are open, in all and
//! per principal, and which idle too long. A session id is a bearer of nothing: a request
//! that names another principal's session finds no session.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock, Weak};
use std::time::Duration;

use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::SessionManager;
use tokio::time::Instant;
use tower_toolcall::Principal;

/// Who opened each session, beside the sessions rmcp holds, and when each was last used.
pub(crate) struct Sessions {
    /// rmcp's sessions: the open ones.
    open: Arc<LocalSessionManager>,
    /// Read on every request in a session, written when one opens or ends.
    owners: RwLock<Owners>,
    max: usize,
    max_per_principal: usize,
    /// What the sessions' last uses are counted from.
    epoch: Instant,
}

/// An open session, as the gateway knows it.
struct Session {
    /// Its principal's scope, empty without one.
    owner: Arc<str>,
    /// The name its client gave itself in `initialize`.
    client: Option<Arc<str>>,
    /// When a request last named it, in milliseconds from [`Sessions::epoch`].
    used: AtomicU64,
}

#[derive(Default)]
struct Owners {
    /// Each session the gateway knows.
    of: HashMap<Arc<str>, Session>,
    /// Each owner's sessions, and the `initialize` requests of its under way.
    by_owner: HashMap<Arc<str>, Held>,
}

#[derive(Default)]
struct Held {
    sessions: HashSet<Arc<str>>,
    opening: usize,
}

/// Why a session was not opened, in words a client can act on.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The gateway holds its limit of sessions.
    Full(usize),
    /// The principal holds its limit.
    PrincipalFull(usize),
}

/// Room for one session of `owner`, held until the session opens or the attempt fails.
pub(crate) struct Opening {
    sessions: Arc<Sessions>,
    owner: Arc<str>,
    client: Option<Arc<str>>,
}

impl Sessions {
    pub(crate) fn new(
        open: Arc<LocalSessionManager>,
        max: usize,
        max_per_principal: usize,
    ) -> Arc<Self> {
        Arc::new(Sessions {
            open,
            owners: RwLock::default(),
            max: max.max(1),
            max_per_principal: max_per_principal.max(1),
            epoch: Instant::now(),
        })
    }

    /// Closes every session no request named for `idle`, checking a few times per `idle`,
    /// for as long as the sessions are kept. rmcp's own idle timer cannot be the judge: the
    /// requests the gateway answers itself never reach rmcp's session.
    pub(crate) fn expire_idle(self: &Arc<Self>, idle: Duration) {
        let sessions: Weak<Sessions> = Arc::downgrade(self);
        let every = (idle / 4).clamp(Duration::from_millis(100), Duration::from_secs(30));
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                let Some(sessions) = sessions.upgrade() else {
                    return;
                };
                sessions.close_idle(idle).await;
            }
        });
    }

    /// Closes the sessions no request named for `idle`. A session rmcp holds that the
    /// gateway does not know (its `initialize` was never answered: the client left) is
    /// counted as used now, and closed in turn unless its opening completes.
    async fn close_idle(&self, idle: Duration) {
        let now = self.now();
        let idle = u64::try_from(idle.as_millis()).unwrap_or(u64::MAX);
        let stale: Vec<Arc<str>> = {
            let open = self.open.sessions.read().await;
            let mut owners = self.owners.write().unwrap_or_else(PoisonError::into_inner);
            for id in open.keys() {
                owners.of.entry(id.clone()).or_insert_with(|| Session {
                    owner: Arc::from(UNKNOWN_OWNER),
                    client: None,
                    used: AtomicU64::new(now),
                });
            }
            owners
                .of
                .iter()
                .filter(|(_, session)| {
                    now.saturating_sub(session.used.load(Ordering::Relaxed)) >= idle
                })
                .map(|(id, _)| id.clone())
                .collect()
        };
        for id in stale {
            tracing::debug!(event = "mcp_session_idle", session = %id, "an idle MCP session was closed");
            if let Err(error) = self.open.close_session(&id).await {
                tracing::debug!(%error, "an idle MCP session did not close cleanly");
            }
            self.ended(&id);
        }
    }

    /// The time now, in milliseconds from the epoch.
    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Marks the session `id` used now; the name its client gave itself, when it is known.
    pub(crate) fn touch(&self, id: &str) -> Option<Arc<str>> {
        let owners = self.owners.read().unwrap_or_else(PoisonError::into_inner);
        let session = owners.of.get(id)?;
        session.used.store(self.now(), Ordering::Relaxed);
        session.client.clone()
    }

    /// The owner of the requests of `principal`: one for every request without a principal
    /// (a gateway without authentication has one user).
    pub(crate) fn owner(principal: Option<&Principal>) -> Arc<str> {
        principal.map_or_else(|| Arc::from(""), |p| Arc::from(p.session_key("")))
    }

    /// Whether `owner` may use the session `id`: it opened it, or the gateway does not know
    /// it (rmcp answers for an id it does not hold).
    pub(crate) fn may_use(&self, id: &str, owner: &str) -> bool {
        let owners = self.owners.read().unwrap_or_else(PoisonError::into_inner);
        owners
            .of
            .get(id)
            .is_none_or(|session| *session.owner == *owner)
    }

    /// Whether rmcp holds the session `id` open.
    pub(crate) async fn is_open(&self, id: &str) -> bool {
        self.open.sessions.read().await.contains_key(id)
    }

    /// Room for a session of `owner`, counting the sessions rmcp still holds; a principal's
    /// limit applies to authenticated owners only.
    pub(crate) async fn open(
        self: &Arc<Self>,
        owner: Arc<str>,
        client: Option<&str>,
    ) -> Result<Opening, Refusal> {
        let open = self.open.sessions.read().await;
        let mut owners = self.owners.write().unwrap_or_else(PoisonError::into_inner);
        let opening: usize = owners.by_owner.values().map(|held| held.opening).sum();
        if open.len() + opening >= self.max {
            return Err(Refusal::Full(self.max));
        }
        // Sessions rmcp closed while idle are forgotten here when they would count.
        if owners.of.len() >= self.max {
            owners.of.retain(|id, _| open.contains_key(id));
            owners.by_owner.retain(|_, held| {
                held.sessions.retain(|id| open.contains_key(id));
                !held.sessions.is_empty() || held.opening > 0
            });
        }
        let held = owners.by_owner.entry(owner.clone()).or_default();
        if !owner.is_empty() && held.sessions.len() + held.opening >= self.max_per_principal {
            held.sessions.retain(|id| open.contains_key(id));
            if held.sessions.len() + held.opening >= self.max_per_principal {
                return Err(Refusal::PrincipalFull(self.max_per_principal));
            }
        }
        held.opening += 1;
        Ok(Opening {
            sessions: self.clone(),
            owner,
            client: client.map(Arc::from),
        })
    }

    /// Forgets the session `id`, which its client ended.
    pub(crate) fn ended(&self, id: &str) {
        let mut owners = self.owners.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(session) = owners.of.remove(id) {
            if let Some(held) = owners.by_owner.get_mut(&session.owner) {
                held.sessions.remove(id);
                if held.sessions.is_empty() && held.opening == 0 {
                    owners.by_owner.remove(&session.owner);
                }
            }
        }
    }
}

impl Opening {
    /// The session opened as `id`: it is its owner's.
    pub(crate) fn opened(mut self, id: &str) {
        let id: Arc<str> = Arc::from(id);
        let mut owners = self
            .sessions
            .owners
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let session = Session {
            owner: self.owner.clone(),
            client: self.client.take(),
            used: AtomicU64::new(self.sessions.now()),
        };
        owners.of.insert(id.clone(), session);
        owners
            .by_owner
            .entry(self.owner.clone())
            .or_default()
            .sessions
            .insert(id);
    }
}

impl Drop for Opening {
    fn drop(&mut self) {
        let mut owners = self
            .sessions
            .owners
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(held) = owners.by_owner.get_mut(&self.owner) {
            held.opening -= 1;
            if held.sessions.is_empty() && held.opening == 0 {
                owners.by_owner.remove(&self.owner);
            }
        }
    }
}

/// The owner of a session rmcp holds whose opening the gateway never saw complete: no
/// principal's (a principal's scope is never empty), nor the one user's (empty).
const UNKNOWN_OWNER: &str = "\u{0}unknown";

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Full(max) => write!(
                f,
                "the gateway holds its limit of {max} open MCP sessions; try again later, or \
                 end the sessions you no longer use (DELETE /mcp)"
            ),
            Refusal::PrincipalFull(max) => write!(
                f,
                "you hold {max} open MCP sessions, the limit for one caller; end the sessions \
                 you no longer use (DELETE /mcp with their Mcp-Session-Id), or wait for an \
                 unused one to close"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn sessions_are_bounded_in_all_and_per_principal_and_owned() {
        let open = Arc::new(LocalSessionManager::default());
        let sessions = Sessions::new(open, 4, 2);
        let alice = Sessions::owner(Some(&Principal::new("alice").with_tenant("acme")));
        let bob = Sessions::owner(Some(&Principal::new("bob").with_tenant("acme")));
        let first = sessions.open(alice.clone(), None).await.unwrap();
        let second = sessions.open(alice.clone(), None).await.unwrap();
        // Two under way are alice's two.
        assert_eq!(
            sessions.open(alice.clone(), None).await.err(),
            Some(Refusal::PrincipalFull(2))
        );
        first.opened("s1");
        drop(second);
        // A failed attempt gives its room back.
        let third = sessions.open(alice.clone(), None).await.unwrap();
        third.opened("s2");
        assert!(sessions.may_use("s1", &alice));
        assert!(!sessions.may_use("s1", &bob));
        assert!(sessions.may_use("unknown", &bob));
        // rmcp holds neither session (none was really opened): they do not count once the
        // limit would refuse.
        let again = sessions.open(alice.clone(), None).await.unwrap();
        drop(again);
        sessions.ended("s1");
        assert!(sessions.may_use("s1", &bob));
        // Without a principal: one user, bounded only in all.
        let anyone = Sessions::owner(None);
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(sessions.open(anyone.clone(), None).await.unwrap());
        }
        assert_eq!(
            sessions.open(bob.clone(), None).await.err(),
            Some(Refusal::Full(4))
        );
        drop(held);
        assert!(sessions.open(bob, None).await.is_ok());
    }
}
