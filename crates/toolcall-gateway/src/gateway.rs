//! The gateway assembled: its upstreams started, their tools under one list, one stack
//! in front of them all.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use rmcp::model::{Implementation, ServerCapabilities, ServerConfig, Tool};
use std::time::Duration;
use tokio::sync::mpsc;
use tower::util::BoxCloneSyncService;
use tower::Layer;
use tower_toolcall::breaker::BreakerAdmin;
use tower_toolcall::control::ReliabilityControl;
use tower_toolcall::idempotency::{DedupeStore, InMemoryDedupeStore};
use tower_toolcall::loop_detect::{InMemoryLoopStore, LoopStore};
use tower_toolcall::rate_limit::{InMemoryRateLimitStore, RateLimitStore};
use tower_toolcall::registry::{LayerSetting, RetrySettings, ToolDescriptor, ToolRegistry};
use tower_toolcall::trace::{AuditLog, ToolMetrics, DURATION_BUCKETS};
use tower_toolcall::{
    BulkheadLayer, ErrorCode, Principal, ToolCall, ToolError, ToolOutput, ToolStack,
};
use tower_toolcall_axum::{AdminRouter, CallSlots};
use tower_toolcall_mcp::{descriptor_for, registry_of, McpServer, ProgressRelay, ToolList};
use tower_toolcall_redis::{
    FleetControl, RedisDedupeStore, RedisLoopStore, RedisRateLimitStore, RedisTarget,
};

use crate::auth::{Access, AuthConfig, DenialAudit};
use crate::config::{GatewayConfig, ShownRedis};
use crate::demo;
use crate::naming::NameBook;
use crate::swap::Swap;
use crate::upstreams::{Down, Router, Upstream};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The stack around every upstream's tools.
pub(crate) type Tools = BoxCloneSyncService<ToolCall, ToolOutput, ToolError>;

/// The namespace of names the gateway does not list (the stack refuses them as unknown).
const GATEWAY_NAMESPACE: &str = "gateway";

/// What outlives a reload of the configuration: the metrics recorder (one per process), the
/// audit log (one writer for its files), the in-memory stores, so that a call sent again
/// after a reload still finds its record, a loop its session and a quota its count, the
/// listed names given so far, and the MCP front with its clients' sessions, told when the
/// tools change.
#[derive(Clone)]
pub(crate) struct Lasting {
    /// What `/metrics` answers.
    pub(crate) scrape: Scrape,
    pub(crate) audit: Option<AuditLog>,
    dedupe: Arc<dyn DedupeStore>,
    loops: Arc<dyn LoopStore>,
    quotas: Arc<dyn RateLimitStore>,
    /// The MCP server every connection is made from.
    pub(crate) mcp: Arc<McpServer<ToolList>>,
    /// The tools it lists: replaced on each reload, its clients told.
    pub(crate) listed: ToolList,
    /// The stack its calls go through: a reload (or a change of an upstream's tools) puts
    /// another in place, and the calls under way finish on the one they started on.
    in_service: Swap<Tools>,
    /// The upstreams' progress on its clients' calls.
    relay: ProgressRelay,
    /// The calls `/v1` runs at once: one count for the gateway's life.
    pub(crate) call_slots: CallSlots,
    /// The HTTP fronts' bounds (`[http]`), as the gateway started: they take a restart.
    pub(crate) http: crate::auth::HttpConfig,
    /// The names of the upstreams whose tools may have changed.
    changes: mpsc::UnboundedSender<String>,
    /// The upstreams that came up after failing to start.
    came_up: mpsc::UnboundedSender<Upstream>,
    /// The listed names given so far, kept for the gateway's life.
    names: Arc<Mutex<NameBook>>,
    /// The breakers of the gateway in service, which a rebuild carries on.
    breakers: Arc<Mutex<Option<BreakerAdmin>>>,
    /// What the principals of the gateway in service may do, for the MCP front.
    access: Arc<Mutex<Option<Access>>>,
}

/// Where a gateway's changes arrive: the names of the upstreams whose tools may have
/// changed, and the upstreams that came up after failing to start.
pub(crate) struct Changes {
    pub(crate) tools: mpsc::UnboundedReceiver<String>,
    pub(crate) came_up: mpsc::UnboundedReceiver<Upstream>,
}

impl Lasting {
    /// The recorder, the audit log of `config` (its `audit.path`), empty stores, and the MCP
    /// front, with no tools until a gateway is [installed](Lasting::install); and where its
    /// changes arrive.
    pub(crate) fn new(
        config: &GatewayConfig,
        principal: Option<Principal>,
    ) -> Result<(Lasting, Changes), BoxError> {
        let audit = match &config.audit_path {
            Some(dir) => {
                let log = AuditLog::builder(dir)
                    .build()
                    .map_err(|e| e.within("audit.path"))?;
                tracing::info!(event = "audit", dir = %dir.display());
                Some(log)
            }
            None => None,
        };
        let listed = ToolList::new(Vec::new()).with_info(server_info());
        let in_service = Swap::new(starting());
        let relay = ProgressRelay::default();
        let mut mcp = McpServer::over(GATEWAY_NAMESPACE, in_service.clone(), listed.clone())
            .relay_progress(&relay)
            .max_calls_in_flight(config.http.max_calls_in_flight)
            .max_listen_streams(
                config.http.max_listen_streams.0,
                config.http.max_listen_streams.1,
            );
        if let Some(principal) = principal {
            // The stdio front's one principal, with the priority its roles allow.
            let principal = match config.auth.as_ref() {
                Some(auth) => auth.access().capped(principal),
                None => principal,
            };
            mcp = mcp.principal(principal);
        }
        let mcp = Arc::new(mcp);
        let (changes, changed) = mpsc::unbounded_channel();
        let (came_up, up) = mpsc::unbounded_channel();
        let lasting = Lasting {
            scrape: Scrape {
                prometheus: prometheus()?,
                bulkheads: Arc::default(),
            },
            audit,
            dedupe: Arc::new(InMemoryDedupeStore::default()),
            loops: Arc::new(InMemoryLoopStore::default()),
            quotas: Arc::new(InMemoryRateLimitStore::default()),
            mcp,
            listed,
            in_service,
            relay,
            call_slots: CallSlots::new(config.http.max_calls_in_flight),
            http: config.http.clone(),
            changes,
            came_up,
            names: Arc::default(),
            breakers: Arc::default(),
            access: Arc::default(),
        };
        Ok((
            lasting,
            Changes {
                tools: changed,
                came_up: up,
            },
        ))
    }

    /// Puts `gateway` in service behind the MCP front: its stack for the calls to come, its
    /// tools listed, and every connected client told that the list changed.
    pub(crate) async fn install(&self, gateway: &Gateway) {
        self.in_service.replace(gateway.tools.clone());
        *self.breakers.lock().unwrap_or_else(PoisonError::into_inner) = gateway.breakers.clone();
        *self.access.lock().unwrap_or_else(PoisonError::into_inner) = gateway.access.clone();
        *self
            .scrape
            .bulkheads
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = gateway.bulkheads.clone();
        self.listed.replace(gateway.listed.clone()).await;
    }

    /// `principal` with the priority cap its roles give it under the gateway in service.
    pub(crate) fn capped(&self, principal: Principal) -> Principal {
        let access = self.access.lock().unwrap_or_else(PoisonError::into_inner);
        match &*access {
            Some(access) => access.capped(principal),
            None => principal,
        }
    }

    /// The breakers of the gateway in service.
    fn breakers(&self) -> Option<BreakerAdmin> {
        self.breakers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The bulkheads of the gateway in service.
    fn bulkheads(&self) -> Option<BulkheadLayer> {
        self.scrape
            .bulkheads
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(|(_, layer)| layer.clone())
    }

    /// Writes out the audit log.
    pub(crate) fn stop(&self) {
        if let Some(audit) = &self.audit {
            let stats = audit.shutdown();
            tracing::info!(
                event = "audit_closed",
                written = stats.written,
                dropped = stats.dropped
            );
        }
    }
}

/// A running gateway.
pub(crate) struct Gateway {
    pub(crate) upstreams: Arc<Vec<Upstream>>,
    /// The upstreams that failed to start, started again in the background.
    pub(crate) down: Arc<Vec<Down>>,
    pub(crate) registry: ToolRegistry,
    pub(crate) tools: Tools,
    /// The tools under their listed names; the calls of those safe to repeat stop when
    /// their client cancels them.
    listed: ToolList,
    /// The admin API, when there is a token.
    pub(crate) admin: Option<axum::Router>,
    /// The tools each principal may call, with `[auth]`.
    pub(crate) access: Option<Access>,
    /// The listed name of each tool, by its namespace and name.
    pub(crate) names: Names,
    /// Where calls refused to their caller are audited.
    pub(crate) denials: Option<DenialAudit>,
    /// With Redis, the fleet this gateway's stack joined: kept while the stack serves.
    _fleet: Option<FleetControl>,
    /// Its stack's breakers, which the gateway that replaces it carries on.
    breakers: Option<BreakerAdmin>,
    /// Its stack's bulkheads, whose gauges `/metrics` reads while it is in service, and
    /// whose places the gateway that replaces it carries on.
    bulkheads: Option<(ToolMetrics, BulkheadLayer)>,
}

/// What `/metrics` answers: every series of the recorder, the gauges of the bulkheads of
/// the gateway in service read from them at each scrape (they cost the calls nothing).
#[derive(Clone)]
pub(crate) struct Scrape {
    prometheus: PrometheusHandle,
    /// The metrics and the bulkheads of the gateway in service.
    bulkheads: Arc<Mutex<Option<(ToolMetrics, BulkheadLayer)>>>,
}

impl Scrape {
    /// Every series in the Prometheus text format.
    pub(crate) fn render(&self) -> String {
        let in_service = self
            .bulkheads
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some((metrics, bulkheads)) = in_service {
            metrics.record_bulkheads(&bulkheads);
        }
        self.prometheus.run_upkeep();
        self.prometheus.render()
    }
}

/// The listed name of each tool, by its namespace and name.
#[derive(Clone, Debug, Default)]
pub(crate) struct Names(Arc<HashMap<(String, String), String>>);

impl Names {
    /// The listed name of the tool `name` of `namespace` (for a tool the gateway does not
    /// list, the name it would have).
    pub(crate) fn listed_name(&self, namespace: &str, name: &str) -> String {
        self.0
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
            .unwrap_or_else(|| format!("{namespace}__{name}"))
    }
}

impl Gateway {
    /// Starts every upstream of `config` (all at once), lists their tools under one list
    /// and builds the stack, under the operator's switches from the environment; with
    /// `[store] redis`, its dedupe records, quotas and loop sessions in Redis.
    ///
    /// An upstream of `running` (those of the gateway this one replaces) whose configuration
    /// has not changed is kept as it is, its connection, process and listed tools with it,
    /// and so is one of `down` (still started again in the background). An upstream that
    /// fails to start (its command missing, no answer in its start-up time, a tool list the
    /// gateway cannot serve) is logged with its reason, left out, and started again in the
    /// background; the others serve. Nothing is in service until [installed](Lasting::install).
    pub(crate) async fn start(
        config: &GatewayConfig,
        admin_token: Option<&str>,
        lasting: &Lasting,
        running: &[Upstream],
        down: &[Down],
    ) -> Result<Gateway, BoxError> {
        enum Starting {
            Kept(Upstream),
            StillDown(Down),
            Started(tokio::task::JoinHandle<Result<Upstream, BoxError>>),
        }
        let starting: Vec<_> = config
            .upstreams
            .iter()
            .map(|wanted| {
                if let Some(kept) = running.iter().find(|r| r.config == *wanted) {
                    return Starting::Kept(kept.clone());
                }
                if let Some(still) = down.iter().find(|d| d.config == *wanted) {
                    return Starting::StillDown(still.clone());
                }
                Starting::Started(tokio::spawn(Upstream::start(
                    wanted.clone(),
                    lasting.relay.clone(),
                    lasting.changes.clone(),
                )))
            })
            .collect();
        let mut upstreams = Vec::with_capacity(starting.len());
        let mut downs = Vec::new();
        for (wanted, starting) in config.upstreams.iter().zip(starting) {
            match starting {
                Starting::Kept(kept) => upstreams.push(kept),
                Starting::StillDown(still) => downs.push(still),
                Starting::Started(started) => {
                    let reason = match started.await {
                        Ok(Ok(upstream)) => {
                            upstreams.push(upstream);
                            continue;
                        }
                        Ok(Err(err)) => err.to_string(),
                        Err(err) => format!("upstream {}: its start failed: {err}", wanted.name),
                    };
                    downs.push(Down::retrying(
                        wanted.clone(),
                        reason,
                        lasting.relay.clone(),
                        lasting.changes.clone(),
                        lasting.came_up.clone(),
                    ));
                }
            }
        }
        let (registry, router, listed) = if config.upstreams.is_empty() {
            tracing::info!(event = "demo", "no upstream: serving the demo tools");
            let registry = demo::registry()?;
            let routes = registry
                .tools()
                .map(|t| (t.descriptor().namespace.clone(), demo::service()))
                .collect();
            let listed = demo::mcp_tools(&registry);
            (registry, Router::new(routes), listed)
        } else {
            let registry = registry(&upstreams, config)?;
            let listed = upstreams
                .iter()
                .flat_map(|u| {
                    u.tools
                        .iter()
                        .map(|tool| (u.config.name.clone(), tool.clone()))
                })
                .collect();
            (registry, Router::of(&upstreams), listed)
        };
        let registry = registry.with_control(ReliabilityControl::from_env()?);
        let metrics = ToolMetrics::new(&registry);
        metrics.describe();
        let mut builder = ToolStack::builder(registry.clone()).on_event(metrics.clone());
        // `[servers.NAME]` max_concurrent: the places of all its tools together.
        let server_limits: Vec<_> = config
            .servers
            .iter()
            .filter_map(|(name, server)| Some((name.clone(), server.limit.clone()?)))
            .collect();
        // The places of the gateway in service go on where their limits are the same, so
        // that its calls still running count against them.
        let previous = lasting.bulkheads();
        builder = builder.bulkhead(move |mut bulkhead| {
            if let Some(previous) = &previous {
                bulkhead = bulkhead.carry(previous);
            }
            server_limits
                .into_iter()
                .fold(bulkhead, |bulkhead, (name, limit)| {
                    bulkhead.namespace(name, limit)
                })
        });
        // The breakers of the gateway in service go on where their tools still are.
        if let Some(previous) = lasting.breakers() {
            builder = builder.breaker(|breaker| breaker.carry(&previous));
        }
        if let Some(audit) = &lasting.audit {
            let audit = audit.clone();
            builder = builder.trace(move |trace| trace.audit(audit));
        }
        let audit = lasting.audit.clone();
        let (upstreams, downs) = (Arc::new(upstreams), Arc::new(downs));
        let upstream_states = {
            let (upstreams, downs) = (upstreams.clone(), downs.clone());
            axum::Router::new().route(
                "/upstreams",
                axum::routing::get(move || {
                    let states = crate::upstreams::states(&upstreams, &downs);
                    async move { axum::Json(states) }
                }),
            )
        };
        let stores = match &config.redis {
            Some(store) => Stores::redis(store).await?,
            None => Stores {
                dedupe: lasting.dedupe.clone(),
                quotas: lasting.quotas.clone(),
                loops: lasting.loops.clone(),
                fleet: None,
            },
        };
        let stack = builder
            .store(stores.dedupe)
            .rate_limit_store(stores.quotas)
            .loop_store(stores.loops)
            .build()?;
        let fleet = match stores.fleet {
            // An operator's action on any replica reaches this one, and this one starts with
            // the fleet's breakers held open and its switches.
            Some(target) => {
                let store = ShownRedis(&target);
                let fleet = FleetControl::builder(target.clone()).join(&stack)?;
                fleet.sync().await.map_err(|err| {
                    format!("{} ({store}): the fleet's actions: {err}", store.field())
                })?;
                Some(fleet)
            }
            None => None,
        };
        let breakers = stack.breakers();
        let bulkheads = stack.bulkheads().cloned().map(|layer| (metrics, layer));
        let (tools, admin) = assemble(
            stack,
            router,
            admin_token,
            audit,
            fleet.as_ref(),
            &upstream_states,
        )?;
        let (listed, names) = tool_list(listed, &lasting.names)?;
        let confirm = |namespace: &str, name: &str| {
            config
                .servers
                .get(namespace)
                .map(|server| server.confirm(name))
                .unwrap_or_default()
                .edge()
        };
        let mut listed = listed
            .stop_repeatable_when_cancelled(&registry)
            .confirm_by(&registry, confirm);
        let access = config.auth.as_ref().map(AuthConfig::access);
        let denials = lasting.audit.clone().map(DenialAudit::new);
        if let Some(access) = access.clone() {
            listed = listed.visible_to(move |principal, name| access.allows(principal, name));
            if let Some(denials) = denials.clone() {
                listed = listed.on_denied(move |principal, name| denials.denied(principal, name));
            }
        }
        Ok(Gateway {
            upstreams,
            down: downs,
            registry,
            tools,
            listed,
            admin,
            access,
            names: Names(Arc::new(names)),
            denials,
            _fleet: fleet,
            breakers,
            bulkheads,
        })
    }
}

/// Where a stack keeps its dedupe records, quotas and loop sessions: in this process (kept
/// across reloads), or in Redis with the fleet's operator actions.
struct Stores {
    dedupe: Arc<dyn DedupeStore>,
    quotas: Arc<dyn RateLimitStore>,
    loops: Arc<dyn LoopStore>,
    /// With Redis, where the fleet's operator actions are.
    fleet: Option<RedisTarget>,
}

impl Stores {
    /// The stores of `[store] redis` (or `cluster`), once Redis answers.
    async fn redis(target: &RedisTarget) -> Result<Stores, BoxError> {
        let store = ShownRedis(target);
        let dedupe = RedisDedupeStore::open(target.clone())?;
        dedupe
            .ping()
            .await
            .map_err(|err| format!("{} ({store}) cannot be reached: {err}", store.field()))?;
        tracing::info!(
            "dedupe records, quotas, loop sessions and operator actions in Redis at {store}"
        );
        Ok(Stores {
            dedupe: Arc::new(dedupe),
            quotas: Arc::new(RedisRateLimitStore::open(target.clone())?),
            loops: Arc::new(RedisLoopStore::open(target.clone())?),
            fleet: Some(target.clone()),
        })
    }
}

/// The stack around the upstreams, and its admin API when there is a token.
fn assemble(
    stack: ToolStack,
    router: Router,
    admin_token: Option<&str>,
    audit: Option<AuditLog>,
    fleet: Option<&FleetControl>,
    own_routes: &axum::Router,
) -> Result<(Tools, Option<axum::Router>), BoxError> {
    let admin = match admin_token {
        Some(token) => {
            let mut admin = AdminRouter::new(&stack, token)?.routes(own_routes.clone());
            if let Some(audit) = audit {
                admin = admin.audit(audit);
            }
            if let Some(fleet) = fleet {
                admin = admin.fleet(fleet.clone());
            }
            Some(admin.into_router())
        }
        None => None,
    };
    Ok((BoxCloneSyncService::new(stack.layer(router)), admin))
}

/// The policy of every upstream's tools: from their annotations (see
/// [`descriptor_for`]: believed from trusted upstreams only), under the operator's
/// `[servers.NAME]`, under the operator's `[policy]`.
fn registry(upstreams: &[Upstream], config: &GatewayConfig) -> Result<ToolRegistry, BoxError> {
    let descriptors = upstreams.iter().flat_map(|u| {
        let server = config.servers.get(&u.config.name);
        u.tools.iter().map(move |tool| {
            let descriptor = descriptor_for(&u.config.name, tool, u.config.trust);
            let descriptor = match server {
                Some(server) => server.apply(descriptor),
                None => descriptor,
            };
            with_upstream_timeout(descriptor, u.config.timeout)
        })
    });
    Ok(registry_of(descriptors, config.policy.as_ref())?)
}

/// `descriptor` with its upstream's per-call `timeout` as the time of one attempt, unless its
/// policy sets one: the stack's timeout layer is the one timeout of a call. The retry
/// layer's deadline over all attempts (30 s unless set) grows to the attempt's time, so that
/// a longer timeout takes effect.
fn with_upstream_timeout(descriptor: ToolDescriptor, timeout: Duration) -> ToolDescriptor {
    if descriptor.attempt_timeout().is_some() {
        return descriptor;
    }
    let mut descriptor = descriptor.with_attempt_timeout(timeout);
    let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
    if ms > DEFAULT_RETRY_DEADLINE_MS {
        match &mut descriptor.policy.retry {
            LayerSetting::Off => {}
            LayerSetting::On(retry) => {
                retry.deadline_ms.get_or_insert(ms);
            }
            other => *other = LayerSetting::On(RetrySettings::default().with_deadline_ms(ms)),
        }
    }
    descriptor
}

/// The retry layer's default deadline over a call's attempts, in milliseconds.
const DEFAULT_RETRY_DEADLINE_MS: u64 = 30_000;

/// The tools, each `(namespace, tool)`, under their listed names (see [`crate::naming`]),
/// and the listed name of each by its namespace and name.
type ListedNames = HashMap<(String, String), String>;

fn tool_list(
    tools: Vec<(String, Tool)>,
    book: &Mutex<NameBook>,
) -> Result<(ToolList, ListedNames), BoxError> {
    let names = book.lock().unwrap_or_else(PoisonError::into_inner).names(
        tools
            .iter()
            .map(|(namespace, tool)| (namespace.as_str(), tool.name.as_ref())),
    );
    let mut by_tool = HashMap::with_capacity(names.len());
    let routed: Vec<_> = tools
        .into_iter()
        .zip(names)
        .map(|((namespace, tool), listed)| {
            let name = tool.name.to_string();
            by_tool.insert((namespace.clone(), name.clone()), listed.clone());
            let mut shown = tool;
            shown.name = listed.into();
            (shown, namespace, name)
        })
        .collect();
    Ok((ToolList::routed(routed)?, by_tool))
}

/// The gateway's name and version, and its capabilities: tools, whose list changes.
fn server_info() -> ServerConfig {
    ServerConfig::new(
        ServerCapabilities::builder()
            .enable_tools()
            .enable_tool_list_changed()
            .build(),
    )
    .with_server_info(Implementation::new(
        env!("CARGO_PKG_NAME"),
        env!("CARGO_PKG_VERSION"),
    ))
}

/// The stack in service before the first gateway is: no tools yet, the gateway is starting.
fn starting() -> Tools {
    BoxCloneSyncService::new(tower::service_fn(|_call: ToolCall| async {
        Err::<ToolOutput, _>(ToolError::new(
            ErrorCode::UpstreamUnavailable,
            "the gateway is starting; send the call again",
        ))
    }))
}

/// The Prometheus recorder of the stack's metrics.
fn prometheus() -> Result<PrometheusHandle, BoxError> {
    Ok(PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Suffix("_duration_seconds".into()),
            &DURATION_BUCKETS,
        )?
        .install_recorder()?)
}
