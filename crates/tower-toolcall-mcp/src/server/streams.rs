//! The `subscriptions/listen` streams a server holds open: bounded in all and per caller.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tower_toolcall::Principal;

/// The open streams, shared by a server's connections, and their bounds.
#[derive(Debug)]
pub(crate) struct Streams {
    open: Mutex<Open>,
    max: usize,
    max_per_caller: usize,
}

#[derive(Debug, Default)]
struct Open {
    all: usize,
    by_caller: HashMap<String, usize>,
}

/// A stream admitted: it counts until dropped.
#[derive(Debug)]
pub(crate) struct Admitted {
    streams: Arc<Streams>,
    caller: String,
}

impl Streams {
    pub(crate) fn new(max: usize, max_per_caller: usize) -> Arc<Self> {
        Arc::new(Streams {
            open: Mutex::default(),
            max: max.max(1),
            max_per_caller: max_per_caller.max(1),
        })
    }

    /// Admits a stream of `principal` (none: the single user), or says why not in words a
    /// client can act on.
    pub(crate) fn admit(
        self: &Arc<Self>,
        principal: Option<&Principal>,
    ) -> Result<Admitted, String> {
        // The principal's scope (a digest of its tenant and id), as its sessions have it.
        let caller = principal.map_or_else(String::new, |p| p.session_key(""));
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if open.all >= self.max {
            return Err(format!(
                "the server holds its limit of {} open subscriptions/listen streams; close one, \
                 or try again later",
                self.max
            ));
        }
        let mine = open.by_caller.entry(caller.clone()).or_default();
        if *mine >= self.max_per_caller {
            return Err(format!(
                "you hold {} open subscriptions/listen streams, the limit for one caller; close \
                 one first: one stream carries every change you asked for",
                self.max_per_caller
            ));
        }
        *mine += 1;
        open.all += 1;
        Ok(Admitted {
            streams: self.clone(),
            caller,
        })
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut open = self
            .streams
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        open.all = open.all.saturating_sub(1);
        if let Some(mine) = open.by_caller.get_mut(&self.caller) {
            *mine = mine.saturating_sub(1);
            if *mine == 0 {
                open.by_caller.remove(&self.caller);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_bounded_in_all_and_per_caller_and_counted_until_dropped() {
        let streams = Streams::new(3, 2);
        let alice = Principal::new("alice");
        let bob = Principal::new("bob");
        let a1 = streams.admit(Some(&alice)).unwrap();
        let _a2 = streams.admit(Some(&alice)).unwrap();
        assert!(streams
            .admit(Some(&alice))
            .unwrap_err()
            .contains("limit for one caller"));
        let _b1 = streams.admit(Some(&bob)).unwrap();
        assert!(streams.admit(None).unwrap_err().contains("its limit of 3"));
        drop(a1);
        let _a3 = streams.admit(Some(&alice)).unwrap();
    }
}
