use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use tower_service::Service;

use super::admin::Events;
use super::cell::BreakerCell;
use super::future::ResponseFuture;
use super::map::BreakerMap;
use super::state::{Admission, BreakerConfig};
use crate::breaker_view::BreakerView;
use crate::classify::{SharedClassifier, ToolProfile};
use crate::control::ShadowLayer;
use crate::envelope::{BreakerScope, ToolCall};
use crate::error::ToolError;
use crate::event::BreakerKey;
use crate::middleware::{shadow_decision, Passthrough};
use crate::outcome::{BreakerState, ShadowVerdict, ToolOutput};
use crate::tool_table::{Acting, ToolTable};

/// Fails calls fast while the breaker that guards them is open; made by
/// [`CircuitBreakerLayer`](super::CircuitBreakerLayer).
#[derive(Clone, Debug)]
pub struct CircuitBreaker<S> {
    inner: S,
    shared: Arc<Shared>,
}

/// What the clones of a layer share: the breakers and how to classify outcomes.
#[derive(Debug)]
pub(crate) struct Shared {
    /// Per tool; `None` where the tool's policy switches the layer off.
    pub(super) tools: ToolTable<Option<Arc<ToolBreaker>>>,
    /// The dependency breakers of registered namespaces.
    pub(super) dependencies: HashMap<String, Arc<BreakerCell>>,
    pub(super) global: Arc<BreakerCell>,
    /// Breakers made on demand: those of unregistered tools and namespaces.
    pub(super) on_demand: BreakerMap,
    /// The configuration of the dependency and global breakers.
    pub(super) scoped_config: BreakerConfig,
    pub(super) events: Arc<Events>,
    /// The dependency and global breakers an operator holds open.
    pub(super) held: Held,
}

/// The dependency and global breakers an operator holds open: each stops every call under it
/// (of its namespace, or all), whatever breaker the call's own scope picks. Read on every
/// call only while one is held.
#[derive(Debug, Default)]
pub(super) struct Held {
    any: AtomicBool,
    keys: Mutex<HashSet<BreakerKey>>,
}

impl Held {
    /// Holds `key` open, when it is a dependency or the global breaker.
    pub(super) fn hold(&self, key: &BreakerKey) {
        if matches!(key, BreakerKey::Tool { .. }) {
            return;
        }
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        keys.insert(key.clone());
        self.any.store(true, Ordering::Release);
    }

    /// Lets `key` go; every key when `None`.
    pub(super) fn release(&self, key: Option<&BreakerKey>) {
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        match key {
            Some(key) => {
                keys.remove(key);
            }
            None => keys.clear(),
        }
        self.any.store(!keys.is_empty(), Ordering::Release);
    }

    /// The same keys held, for the layer that replaces this one.
    pub(super) fn carried(&self) -> Held {
        let keys = self
            .keys
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        Held {
            any: AtomicBool::new(!keys.is_empty()),
            keys: Mutex::new(keys),
        }
    }

    /// The held breaker over `call`, if any.
    fn over(&self, call: &ToolCall) -> Option<BreakerKey> {
        if !self.any.load(Ordering::Acquire) {
            return None;
        }
        let keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        if keys.contains(&BreakerKey::Global) {
            return Some(BreakerKey::Global);
        }
        let dependency = BreakerKey::dependency(call.tool_namespace());
        keys.contains(&dependency).then_some(dependency)
    }
}

/// A tool's breaker settings, resolved once.
#[derive(Debug)]
pub(crate) struct ToolBreaker {
    pub(super) profile: ToolProfile,
    pub(super) classifier: SharedClassifier,
    /// The tool's configuration: its risk preset with its overrides.
    pub(super) config: BreakerConfig,
    /// The tool's own breaker (registered tools only).
    pub(super) own: Option<Arc<BreakerCell>>,
    /// Its namespace's breaker (registered tools only).
    pub(super) dependency: Option<Arc<BreakerCell>>,
}

impl Shared {
    /// The breaker that guards `call`, in the scope the call asks for: `None` for the tool's
    /// own breaker, which `tool` holds.
    fn scoped_cell(&self, call: &ToolCall, tool: &ToolBreaker) -> Option<Arc<BreakerCell>> {
        let (namespace, name) = (call.tool_namespace(), call.tool_name());
        let scope = call
            .transport()
            .circuit_breaker_hint
            .unwrap_or(BreakerScope::Tool);
        match scope {
            BreakerScope::Tool if tool.own.is_some() => None,
            BreakerScope::Tool => Some(self.on_demand.tool(namespace, name, || {
                self.make_cell(BreakerKey::tool(namespace, name), tool.config.clone())
            })),
            BreakerScope::Dependency => Some(match &tool.dependency {
                Some(cell) => cell.clone(),
                None => self.on_demand.dependency(namespace, || {
                    self.make_cell(
                        BreakerKey::dependency(namespace),
                        self.scoped_config.clone(),
                    )
                }),
            }),
            BreakerScope::Global => Some(self.global.clone()),
        }
    }

    pub(super) fn make_cell(&self, key: BreakerKey, config: BreakerConfig) -> BreakerCell {
        BreakerCell::new(key, config, self.events.clone())
    }

    /// The breaker with `key`, if it exists.
    pub(super) fn find(&self, key: &BreakerKey) -> Option<Arc<BreakerCell>> {
        match key {
            BreakerKey::Tool { namespace, name } => self
                .tools
                .registered(namespace, name)
                .map(|tool| tool.as_ref().and_then(|tool| tool.own.clone()))
                .unwrap_or_else(|| self.on_demand.find(key)),
            BreakerKey::Dependency { namespace } => self
                .dependencies
                .get(namespace)
                .cloned()
                .or_else(|| self.on_demand.find(key)),
            BreakerKey::Global => Some(self.global.clone()),
        }
    }

    /// The breaker with `key`, made when no call has needed it yet.
    pub(super) fn find_or_create(&self, key: &BreakerKey) -> Arc<BreakerCell> {
        if let Some(cell) = self.find(key) {
            return cell;
        }
        match key {
            BreakerKey::Tool { namespace, name } => {
                let config = self
                    .tools
                    .get(namespace, name)
                    .as_ref()
                    .map_or_else(|| self.scoped_config.clone(), |t| t.config.clone());
                self.on_demand
                    .tool(namespace, name, || self.make_cell(key.clone(), config))
            }
            BreakerKey::Dependency { namespace } => self.on_demand.dependency(namespace, || {
                self.make_cell(key.clone(), self.scoped_config.clone())
            }),
            BreakerKey::Global => self.global.clone(),
        }
    }

    /// Every breaker.
    pub(super) fn cells(&self) -> Vec<Arc<BreakerCell>> {
        let mut cells: Vec<Arc<BreakerCell>> = self
            .tools
            .iter()
            .filter_map(|(_, _, tool)| tool.as_ref()?.own.clone())
            .collect();
        cells.extend(self.dependencies.values().cloned());
        cells.push(self.global.clone());
        cells.extend(self.on_demand.cells());
        cells
    }
}

impl BreakerView for Shared {
    /// While the breaker over `call` is not closed, a call that is not needed (a hedge) must
    /// not be sent, for it could be a probe of a half-open breaker.
    fn closed_for(&self, call: &ToolCall) -> bool {
        if self.held.over(call).is_some() {
            return false;
        }
        let Some(tool) = self.tools.for_call(call) else {
            return true;
        };
        let namespace = call.tool_namespace();
        let scope = call
            .transport()
            .circuit_breaker_hint
            .unwrap_or(BreakerScope::Tool);
        let cell = match scope {
            BreakerScope::Tool => tool.own.clone().or_else(|| {
                self.on_demand
                    .find(&BreakerKey::tool(namespace, call.tool_name()))
            }),
            BreakerScope::Dependency => tool
                .dependency
                .clone()
                .or_else(|| self.on_demand.find(&BreakerKey::dependency(namespace))),
            BreakerScope::Global => Some(self.global.clone()),
        };
        cell.is_none_or(|cell| cell.is_closed())
    }
}

impl<S> CircuitBreaker<S> {
    pub(super) fn new(inner: S, shared: Arc<Shared>) -> Self {
        CircuitBreaker { inner, shared }
    }

    crate::middleware::inner_service_accessors!();
}

impl<S> Service<ToolCall> for CircuitBreaker<S>
where
    S: Service<ToolCall, Response = ToolOutput, Error = ToolError>,
{
    type Response = ToolOutput;
    type Error = ToolError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // An open breaker refuses per call, in the future, so that one open tool never
        // holds up the others.
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: ToolCall) -> Self::Future {
        let gate = self.shared.tools.gate(&call, Some(ShadowLayer::Breaker));
        let Some(Acting { tool, shadow }) = gate else {
            return ResponseFuture::passthrough(Passthrough::new(self.inner.call(call)));
        };
        if !shadow {
            if let Some(held) = self.shared.held.over(&call) {
                tracing::debug!(
                    event = "tool_call_blocked",
                    request_id = call.request_id(),
                    tool = call.tool_name(),
                    breaker = %held,
                    breaker_state = BreakerState::ForcedOpen.as_str(),
                    "an operator holds this call's dependency (or every call) open"
                );
                return ResponseFuture::rejected(BreakerState::ForcedOpen, None);
            }
        }
        let scoped = self.shared.scoped_cell(&call, tool);
        let cell = scoped
            .as_ref()
            .or(tool.own.as_ref())
            .expect("a registered tool has its own breaker");
        match cell.admit() {
            Admission::Admitted(ticket) => ResponseFuture::admitted(
                self.inner.call(call),
                tool.clone(),
                scoped,
                ticket,
                !shadow,
            ),
            // Not enforced: the call runs, uncounted, as if it had been refused.
            Admission::Rejected { .. } if shadow => {
                let decision =
                    shadow_decision(&call, ShadowLayer::Breaker, ShadowVerdict::WouldReject);
                ResponseFuture::passthrough(Passthrough::shadowed(self.inner.call(call), decision))
            }
            Admission::Rejected { state, retry_after } => {
                tracing::debug!(
                    event = "tool_call_blocked",
                    request_id = call.request_id(),
                    tool = call.tool_name(),
                    breaker = %cell.key(),
                    breaker_state = state.as_str(),
                    "circuit breaker rejected the call"
                );
                ResponseFuture::rejected(state, retry_after)
            }
        }
    }
}
