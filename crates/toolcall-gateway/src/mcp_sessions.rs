//! The MCP sessions (2025-11-25) of `/mcp`: whose each one is, and how many are open, in all
//! and per principal. A session id is a bearer of nothing: a request that names another
//! principal's session finds no session.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, PoisonError, RwLock};

use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use tower_toolcall::Principal;

/// Who opened each session, beside the sessions rmcp holds.
pub(crate) struct Sessions {
    /// rmcp's sessions: the open ones (those it closed when idle are gone from it).
    open: Arc<LocalSessionManager>,
    /// Read on every request in a session, written when one opens or ends.
    owners: RwLock<Owners>,
    max: usize,
    max_per_principal: usize,
}

#[derive(Default)]
struct Owners {
    /// Each session's owner: its principal's scope, empty without one.
    of: HashMap<Arc<str>, Arc<str>>,
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
        })
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
        owners.of.get(id).is_none_or(|of| **of == *owner)
    }

    /// Whether rmcp holds the session `id` open.
    pub(crate) async fn is_open(&self, id: &str) -> bool {
        self.open.sessions.read().await.contains_key(id)
    }

    /// Room for a session of `owner`, counting the sessions rmcp still holds; a principal's
    /// limit applies to authenticated owners only.
    pub(crate) async fn open(self: &Arc<Self>, owner: Arc<str>) -> Result<Opening, Refusal> {
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
        })
    }

    /// Forgets the session `id`, which its client ended.
    pub(crate) fn ended(&self, id: &str) {
        let mut owners = self.owners.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(owner) = owners.of.remove(id) {
            if let Some(held) = owners.by_owner.get_mut(&owner) {
                held.sessions.remove(id);
                if held.sessions.is_empty() && held.opening == 0 {
                    owners.by_owner.remove(&owner);
                }
            }
        }
    }
}

impl Opening {
    /// The session opened as `id`: it is its owner's.
    pub(crate) fn opened(self, id: &str) {
        let id: Arc<str> = Arc::from(id);
        let mut owners = self
            .sessions
            .owners
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        owners.of.insert(id.clone(), self.owner.clone());
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
        let first = sessions.open(alice.clone()).await.unwrap();
        let second = sessions.open(alice.clone()).await.unwrap();
        // Two under way are alice's two.
        assert_eq!(
            sessions.open(alice.clone()).await.err(),
            Some(Refusal::PrincipalFull(2))
        );
        first.opened("s1");
        drop(second);
        // A failed attempt gives its room back.
        let third = sessions.open(alice.clone()).await.unwrap();
        third.opened("s2");
        assert!(sessions.may_use("s1", &alice));
        assert!(!sessions.may_use("s1", &bob));
        assert!(sessions.may_use("unknown", &bob));
        // rmcp holds neither session (none was really opened): they do not count once the
        // limit would refuse.
        let again = sessions.open(alice.clone()).await.unwrap();
        drop(again);
        sessions.ended("s1");
        assert!(sessions.may_use("s1", &bob));
        // Without a principal: one user, bounded only in all.
        let anyone = Sessions::owner(None);
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(sessions.open(anyone.clone()).await.unwrap());
        }
        assert_eq!(
            sessions.open(bob.clone()).await.err(),
            Some(Refusal::Full(4))
        );
        drop(held);
        assert!(sessions.open(bob).await.is_ok());
    }
}
