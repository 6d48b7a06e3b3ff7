//! `toolcall-gateway`: tower-toolcall's stack in front of the MCP servers you already have.
//!
//! ```text
//! toolcall-gateway --config gateway.toml              # the HTTP fronts on 127.0.0.1:8080
//! toolcall-gateway --config gateway.toml --stdio      # what a host launches: MCP on stdio
//! toolcall-gateway --mcp-json ~/.cursor/mcp.json      # in front of a host's servers
//! toolcall-gateway --config gateway.toml --check      # every problem of the file, by field
//! ```
//!
//! Every upstream's tools are listed under one list, as `<upstream>__<tool>`; each call goes
//! through the whole stack (validation, loop detection, quotas, idempotency keys, safe
//! retries, a breaker per tool and one per upstream, timeouts, audit) to its upstream.

#![forbid(unsafe_code)]

mod auth;
mod config;
mod demo;
mod fronts;
mod gateway;
mod mcp_json;
mod mcp_sessions;
mod naming;
mod servers;
mod swap;
mod tls;
mod upstreams;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

use crate::config::{GatewayConfig, LogFormat};
use crate::gateway::{Gateway, Lasting};
use crate::swap::Swap;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The stack of tower-toolcall in front of MCP servers: idempotency keys, loop detection,
/// quotas, safe retries and breakers, over MCP (stdio and streamable HTTP) and the ToolCall
/// envelope.
#[derive(Clone, Debug, Parser)]
#[command(name = "toolcall-gateway", version)]
struct Args {
    /// The gateway's configuration (TOML).
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,
    /// A host's MCP servers file (Claude Desktop, Cursor, VS Code) whose servers the gateway
    /// fronts, untrusted unless the configuration says otherwise.
    #[arg(long, value_name = "PATH")]
    mcp_json: Option<PathBuf>,
    /// Trust this upstream (or imported server): its tool annotations become the policy, as
    /// `[servers.NAME] trust = "trusted"` says. Repeat it for each.
    #[arg(long, value_name = "NAME")]
    trust: Vec<String>,
    /// Serve MCP on stdin and stdout (for a host to launch the gateway).
    #[arg(long)]
    stdio: bool,
    /// The address of the HTTP fronts (default 127.0.0.1:8080; `PORT` changes the port).
    /// With `--stdio`, serves them there beside the stdio front (metrics, admin, probes).
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// Check the configuration, print every problem by its field, and exit.
    #[arg(long)]
    check: bool,
    /// The log lines' format: text or json.
    #[arg(long, value_name = "FORMAT")]
    log_format: Option<String>,
    /// Listen beyond this machine without `[auth]`: anyone who reaches the port may call
    /// every tool. Refused without this flag.
    #[arg(long)]
    allow_unauthenticated: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let config = match load(&args) {
        Ok(config) => config,
        Err(problems) => {
            eprintln!("{problems}");
            return ExitCode::FAILURE;
        }
    };
    if args.check {
        for warning in &config.warnings {
            println!("warning: {warning}");
        }
        let missing = upstreams::missing_commands(&config);
        if !missing.is_empty() {
            for problem in &missing {
                eprintln!("{problem}");
            }
            return ExitCode::FAILURE;
        }
        println!(
            "the configuration is valid: {} upstream(s)",
            config.upstreams.len()
        );
        return ExitCode::SUCCESS;
    }
    let json = match args.log_format.as_deref() {
        Some("json") => true,
        Some("text") => false,
        Some(other) => {
            eprintln!("--log-format: {other} is not a format; use text or json");
            return ExitCode::FAILURE;
        }
        None => config.log_format == LogFormat::Json,
    };
    logging(json);
    for warning in &config.warnings {
        tracing::warn!(event = "server_skipped", "{warning}");
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args, config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // The error's message, naming what to fix; never a debug dump.
            tracing::error!("{err}");
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

/// The configuration of `args`: the file, with the host's servers added.
fn load(args: &Args) -> Result<GatewayConfig, BoxError> {
    let mut config = match &args.config {
        Some(path) => GatewayConfig::from_path(path)?,
        None => GatewayConfig::empty(),
    };
    if let Some(path) = &args.mcp_json {
        let text = std::fs::read_to_string(path)
            .map_err(|err| format!("--mcp-json {}: {err}", path.display()))?;
        config = config.with_imported(mcp_json::import(&text, path)?)?;
    }
    let mut config = config.settle(&args.trust)?;
    // The environment overrides the file for the switches the crate reads.
    if let Ok(url) = std::env::var("TOOLCALL_REDIS_URL") {
        config.redis = Some(tower_toolcall_redis::RedisTarget::node(url));
    }
    if let Ok(seeds) = std::env::var("TOOLCALL_REDIS_CLUSTER") {
        config.redis = Some(config::cluster_of_list(&seeds));
    }
    Ok(config)
}

/// Logs to stderr (stdout is the MCP stream under `--stdio`), filtered by `RUST_LOG`.
fn logging(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,rmcp=warn"));
    // Colours only for a person at a terminal: never in a file, a pipe or a log collector.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

async fn run(args: Args, config: GatewayConfig) -> Result<(), BoxError> {
    let admin_token = match &config.admin_token_env {
        Some(var) => std::env::var(var).ok(),
        None => std::env::var("TOOLCALL_ADMIN_TOKEN").ok(),
    };
    let listen = match (args.listen, config.listen, std::env::var("PORT")) {
        (Some(listen), _, _) | (None, Some(listen), _) => listen,
        (None, None, Ok(port)) => format!("127.0.0.1:{port}")
            .parse()
            .map_err(|_| format!("PORT: {port} is not a port number"))?,
        (None, None, Err(_)) => SocketAddr::from(([127, 0, 0, 1], 8080)),
    };
    // The HTTP fronts: always without --stdio, and beside it when --listen asks for them.
    let http = !args.stdio || args.listen.is_some();
    let (lasting, changed) = Lasting::new(&config, stdio_principal(&config))?;
    let guard = if http {
        exposure(&args, &config, listen)?;
        config.http.guard(listen)?
    } else {
        None
    };
    let gateway = Gateway::start(&config, admin_token.as_deref(), &lasting, &[], &[]).await?;
    lasting.install(&gateway).await;
    // Bound once the upstreams are up (a client that connects finds the gateway serving),
    // and before the authentication, whose tokens' resource URL names the port.
    // The fronts' certificate, read before anything listens: a bad file stops the start.
    let tls = match (&config.http.tls, http) {
        (Some((cert, key)), true) => Some(
            tower_toolcall_axum::ServerTls::from_pem_files(cert, key)
                .map_err(|err| format!("http.{err}"))?,
        ),
        _ => None,
    };
    let listener = match http {
        false => None,
        true => Some(
            tokio::net::TcpListener::bind(listen)
                .await
                .map_err(|err| format!("cannot listen on {listen}: {err}"))?,
        ),
    };
    let auth = match (&config.auth, &listener) {
        (Some(auth), Some(listener)) => Some(
            auth.authentication(listener.local_addr()?, tls.is_some(), lasting.audit.clone())
                .await?,
        ),
        _ => None,
    };
    let metrics_here = config.http.metrics_listen.is_none();
    let authentication = auth.as_ref().map(|(auth, _)| auth.clone());
    let swap = http.then(|| {
        Swap::new(fronts::http_router(
            &gateway,
            &lasting,
            authentication.as_ref(),
            metrics_here,
        ))
    });
    let following = Following {
        args: args.clone(),
        admin_token,
        lasting: lasting.clone(),
        config: config.clone(),
        current: gateway,
        swap: swap.clone(),
        auth: authentication.clone(),
        metrics_here,
        tls: tls.clone(),
    };
    let follow = tokio::spawn(following.run(changed));
    let served = match (swap, listener) {
        // The host owns the process: serve until it closes stdin.
        (None, _) | (_, None) => fronts::serve_stdio(&lasting).await,
        (Some(swap), Some(listener)) => {
            tracing::info!(event = "gateway_listening", address = %listener.local_addr()?);
            // The address, for whoever started the gateway on port 0 (on stdout, unless
            // stdout is the MCP stream).
            if !args.stdio {
                println!("listening on {}", listener.local_addr()?);
            }
            // Every request but MCP's is served by the fronts in place when it arrives.
            let mut router = axum::Router::new()
                .fallback_service(swap)
                .merge(fronts::mcp_router(&lasting, authentication.as_ref()));
            if let Some((_, Some(metadata))) = &auth {
                router = router.merge(metadata.router());
            }
            if let Some(guard) = &guard {
                router = router.layer(guard.clone());
            }
            if let Some(address) = config.http.metrics_listen {
                let metrics = tokio::net::TcpListener::bind(address)
                    .await
                    .map_err(|err| {
                        format!("cannot listen on {address} (http.metrics_listen): {err}")
                    })?;
                tracing::info!(event = "metrics_listening", address = %metrics.local_addr()?);
                if !args.stdio {
                    println!("metrics on {}", metrics.local_addr()?);
                }
                let mut metrics_router = fronts::metrics_router(lasting.scrape.clone());
                if let Some(guard) = config.http.guard(address)? {
                    metrics_router = metrics_router.layer(guard);
                }
                tokio::spawn(fronts::serve_http(
                    metrics,
                    metrics_router,
                    None,
                    shutdown(),
                ));
            }
            let serving = fronts::serve_http(listener, router, tls, shutdown());
            if args.stdio {
                // The host owns the process: when it closes stdin, the HTTP side ends too.
                tokio::select! {
                    served = fronts::serve_stdio(&lasting) => served,
                    served = serving => served,
                }
            } else {
                serving.await
            }
        }
    };
    follow.abort();
    lasting.stop();
    tracing::info!(event = "gateway_stopped");
    served
}

/// The principal of the stdio front: `[auth.stdio]`, else `TOOLCALL_PRINCIPAL`; none for a
/// single-user gateway.
fn stdio_principal(config: &GatewayConfig) -> Option<tower_toolcall::Principal> {
    config
        .auth
        .as_ref()
        .and_then(|auth| auth.stdio.clone())
        .or_else(|| {
            std::env::var(auth::PRINCIPAL_ENV)
                .ok()
                .filter(|id| !id.is_empty())
                .map(tower_toolcall::Principal::new)
        })
}

/// Refuses to listen beyond this machine without authentication, unless told to; then warns
/// of what is exposed.
fn exposure(args: &Args, config: &GatewayConfig, listen: SocketAddr) -> Result<(), BoxError> {
    if listen.ip().is_loopback() || config.auth.is_some() {
        return Ok(());
    }
    if !args.allow_unauthenticated {
        return Err(format!(
            "listening on {listen}, beyond this machine, without [auth] would let anyone who \
             reaches the port call every tool; configure [auth] (the README's Authentication), \
             listen on 127.0.0.1, or pass --allow-unauthenticated to accept it"
        )
        .into());
    }
    tracing::warn!(
        event = "unauthenticated_exposure",
        address = %listen,
        upstreams = config.upstreams.len(),
        "listening beyond this machine without authentication: anyone who reaches {listen} may \
         call every tool of every upstream and read /metrics"
    );
    Ok(())
}

/// The gateway in service, and what it needs to put another in its place.
struct Following {
    args: Args,
    admin_token: Option<String>,
    lasting: Lasting,
    /// The configuration in service.
    config: GatewayConfig,
    current: Gateway,
    /// The HTTP fronts of the gateway in service (all but MCP's, which outlives reloads),
    /// when the gateway serves them: a reload puts the new gateway's in place while the
    /// requests already in flight finish on the old one.
    swap: Option<Swap<axum::Router>>,
    /// Their authentication (kept across reloads: a change of `[auth]`'s mode or keys takes
    /// a restart; its roles are read again).
    auth: Option<tower_toolcall_axum::authn::Authentication>,
    /// Whether `/metrics` is served beside the other routes.
    metrics_here: bool,
    /// The fronts' certificate, read again on SIGHUP.
    tls: Option<tower_toolcall_axum::ServerTls>,
}

/// Why the gateway in service is replaced.
enum Change {
    /// SIGHUP: the configuration is read again.
    Configuration,
    /// These upstreams' tools may have changed (they said so, or were connected to again).
    Tools(Vec<String>),
    /// An upstream that had failed to start came up.
    CameUp(Box<upstreams::Upstream>),
}

impl Following {
    /// Puts a new gateway in service on each SIGHUP (the configuration read again; a bad one
    /// is refused, its problems named, and the old one keeps serving) and each time an
    /// upstream's tools change; the clients are told when the tools they see change.
    async fn run(mut self, mut changes: gateway::Changes) {
        /// How long the changes of one burst take to arrive.
        const BURST: std::time::Duration = std::time::Duration::from_millis(50);
        /// The least time between two rebuilds for tool changes.
        const MIN_REBUILD_GAP: std::time::Duration = std::time::Duration::from_secs(1);
        let mut hangups = hangups();
        let mut last_tools_rebuild: Option<tokio::time::Instant> = None;
        loop {
            let change = tokio::select! {
                Some(()) = hangups.recv() => Change::Configuration,
                Some(first) = changes.tools.recv() => {
                    // A burst of changes is one change, and an upstream that keeps saying its
                    // tools changed gets at most one rebuild a second.
                    let settled = tokio::time::Instant::now() + BURST;
                    let gap_over = last_tools_rebuild.map_or(settled, |last| last + MIN_REBUILD_GAP);
                    tokio::time::sleep_until(settled.max(gap_over)).await;
                    last_tools_rebuild = Some(tokio::time::Instant::now());
                    let mut names = vec![first];
                    while let Ok(name) = changes.tools.try_recv() {
                        names.push(name);
                    }
                    Change::Tools(names)
                }
                Some(up) = changes.came_up.recv() => Change::CameUp(Box::new(up)),
                else => return,
            };
            if let (Change::Configuration, Some(tls)) = (&change, &self.tls) {
                // A renewed certificate for the connections to come; a bad one is refused
                // and the one in place serves on.
                match tls.reload() {
                    Ok(()) => tracing::info!(event = "tls_reloaded"),
                    Err(err) => tracing::error!(event = "tls_reload_refused", "http.{err}"),
                }
            }
            let (config, upstreams) = match change {
                Change::Configuration => match load(&self.args) {
                    Ok(config) => (config, self.current.upstreams.to_vec()),
                    Err(problems) => {
                        tracing::error!(event = "reload_refused", "{problems}");
                        continue;
                    }
                },
                Change::Tools(names) => match self.relisted(&names).await {
                    Some(upstreams) => (self.config.clone(), upstreams),
                    None => continue,
                },
                Change::CameUp(up) => {
                    // Only while the gateway in service still waits for it.
                    if !self.current.down.iter().any(|d| d.config == up.config) {
                        continue;
                    }
                    let mut upstreams = self.current.upstreams.to_vec();
                    upstreams.push(*up);
                    (self.config.clone(), upstreams)
                }
            };
            let admin_token = self.admin_token.as_deref();
            let down: Vec<_> = self
                .current
                .down
                .iter()
                .filter(|d| !upstreams.iter().any(|u| u.config == d.config))
                .cloned()
                .collect();
            match Gateway::start(&config, admin_token, &self.lasting, &upstreams, &down).await {
                Ok(next) => {
                    self.lasting.install(&next).await;
                    if let Some(swap) = &self.swap {
                        swap.replace(fronts::http_router(
                            &next,
                            &self.lasting,
                            self.auth.as_ref(),
                            self.metrics_here,
                        ));
                    }
                    tracing::info!(
                        event = "reloaded",
                        upstreams = next.upstreams.len(),
                        down = next.down.len(),
                        tools = next.registry.tools().count(),
                        "the new configuration is in service"
                    );
                    self.current = next;
                    self.config = config;
                }
                Err(err) => tracing::error!(event = "reload_refused", "{err}"),
            }
        }
    }

    /// The upstreams in service, those of `names` with the tools they list now; `None` when
    /// no list changed.
    async fn relisted(&self, names: &[String]) -> Option<Vec<upstreams::Upstream>> {
        let mut changed = false;
        let mut upstreams = Vec::with_capacity(self.current.upstreams.len());
        for upstream in self.current.upstreams.iter() {
            if !names.contains(&upstream.config.name) {
                upstreams.push(upstream.clone());
                continue;
            }
            match upstream.relisted().await {
                Ok(relisted) if relisted.tools != upstream.tools => {
                    tracing::info!(
                        event = "upstream_tools_changed",
                        upstream = %upstream.config.name,
                        tools = relisted.tools.len()
                    );
                    changed = true;
                    upstreams.push(relisted);
                }
                Ok(_) => upstreams.push(upstream.clone()),
                Err(err) => {
                    tracing::warn!(event = "upstream_tools_unlisted", "{err}");
                    upstreams.push(upstream.clone());
                }
            }
        }
        changed.then_some(upstreams)
    }
}

/// SIGHUP, each time it comes; closed at once on a platform without it.
fn hangups() -> tokio::sync::mpsc::Receiver<()> {
    let (tell, told) = tokio::sync::mpsc::channel(1);
    #[cfg(unix)]
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let Ok(mut hangups) = signal(SignalKind::hangup()) else {
            return;
        };
        while hangups.recv().await.is_some() {
            if tell.send(()).await.is_err() {
                return;
            }
        }
    });
    #[cfg(not(unix))]
    drop(tell);
    told
}

async fn shutdown() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(signal) => signal,
                Err(_) => return std::future::pending().await,
            };
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = interrupt.await;
    tracing::info!(event = "gateway_stopping", "finishing the calls in flight");
}
