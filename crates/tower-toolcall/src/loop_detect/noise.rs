//! Per-call noise: members that differ from one call to the next without making it another
//! call (request ids, nonces, client timestamps), ignored when calls and answers are
//! compared for loop detection.
//!
//! The list is kept apart from canonical params' volatile list: idempotency keys and the
//! canonical form never drop these members. A call whose params name none of them is
//! compared by the canonical form already cached in its params, at no further cost.

use std::borrow::Cow;
use std::collections::HashSet;

use serde_json::{Map, Value};

/// The members ignored in loop signatures and answers unless the layer or the tool says
/// otherwise: request and trace ids, nonces, idempotency keys and client timestamps under
/// their common names.
pub const DEFAULT_IGNORED_MEMBERS: &[&str] = &[
    "request_id",
    "requestId",
    "nonce",
    "idempotencyKey",
    "idempotency_key",
    "correlationId",
    "correlation_id",
    "traceId",
    "trace_id",
    "timestamp",
    "ts",
    "clientTs",
    "client_ts",
    "clientTimestamp",
    "client_timestamp",
    "sentAt",
    "sent_at",
    "requestTime",
    "request_time",
    "requestedAt",
    "requested_at",
    "cacheBuster",
    "cache_buster",
];

/// How deep the members of a value are looked at; deeper members are compared as they are.
const MAX_DEPTH: usize = 64;

/// The members one tool's calls and answers are compared without.
#[derive(Clone, Debug, Default)]
pub(super) struct Noise {
    names: HashSet<Box<str>>,
}

impl Noise {
    pub(super) fn new<S: AsRef<str>>(names: impl IntoIterator<Item = S>) -> Self {
        Noise {
            names: names.into_iter().map(|n| n.as_ref().into()).collect(),
        }
    }

    /// `value` without the noise members, at any depth; borrowed when it has none.
    pub(super) fn strip<'v>(&self, value: &'v Value) -> Cow<'v, Value> {
        if self.names.is_empty() || !self.touches(value, 0) {
            return Cow::Borrowed(value);
        }
        Cow::Owned(self.without(value, 0))
    }

    fn touches(&self, value: &Value, depth: usize) -> bool {
        if depth >= MAX_DEPTH {
            return false;
        }
        match value {
            Value::Object(members) => members
                .iter()
                .any(|(name, v)| self.names.contains(name.as_str()) || self.touches(v, depth + 1)),
            Value::Array(items) => items.iter().any(|v| self.touches(v, depth + 1)),
            _ => false,
        }
    }

    fn without(&self, value: &Value, depth: usize) -> Value {
        if depth >= MAX_DEPTH {
            return value.clone();
        }
        match value {
            Value::Object(members) => Value::Object(
                members
                    .iter()
                    .filter(|(name, _)| !self.names.contains(name.as_str()))
                    .map(|(name, v)| (name.clone(), self.without(v, depth + 1)))
                    .collect::<Map<_, _>>(),
            ),
            Value::Array(items) => {
                Value::Array(items.iter().map(|v| self.without(v, depth + 1)).collect())
            }
            other => other.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn noise_is_removed_at_any_depth_and_nothing_is_copied_without_it() {
        let noise = Noise::new(DEFAULT_IGNORED_MEMBERS);
        let quiet = json!({"query": "rust", "page": {"cursor": "c2"}});
        assert!(matches!(noise.strip(&quiet), Cow::Borrowed(_)));
        let noisy = json!({
            "query": "rust",
            "requestId": "r-1",
            "meta": {"nonce": 7, "tags": [{"sentAt": 1, "name": "a"}]}
        });
        assert_eq!(
            noise.strip(&noisy).into_owned(),
            json!({"query": "rust", "meta": {"tags": [{"name": "a"}]}})
        );
        // Only member names count: a value that looks like one is kept.
        let value = json!({"query": "requestId"});
        assert!(matches!(noise.strip(&value), Cow::Borrowed(_)));
        let none = Noise::new::<&str>([]);
        assert!(matches!(none.strip(&noisy), Cow::Borrowed(_)));
    }
}
