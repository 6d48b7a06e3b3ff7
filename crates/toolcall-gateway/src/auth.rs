//! Who may call the gateway: `[auth]` (authentication of the HTTP fronts, the stdio front's
//! principal, and the tools each role may call) and `[http]` (the names and origins the HTTP
//! fronts answer to, and the address of `/metrics`).
//!
//! ```toml
//! [auth]
//! mode = "api-keys"                     # or "jwt", or "oauth" (jwt, and RFC 9728 metadata)
//! [[auth.keys]]
//! id = "alice"
//! tenant = "acme"
//! roles = ["reader"]
//! key_env = "ALICE_KEY"                 # or key_file = "/run/secrets/alice", or key_sha256
//! [[auth.roles]]
//! name = "reader"                       # a role, or a token scope
//! allow = ["time__*", "fs__read_*"]
//! deny = ["fs__read_secrets"]
//! max_priority = "high"                 # the priority its calls may claim (default normal)
//! ```
//!
//! A key's secret is read once, when the configuration is, and only its SHA-256 digest is
//! kept. Without `[auth]` the gateway is single-user.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use toml::{Table, Value};
use tower_toolcall::envelope::Priority;
use tower_toolcall::trace::{AuditLog, EventKind, EventLevel, ExecutionEvent};
use tower_toolcall::Principal;
use tower_toolcall_axum::authn::{
    ApiKeys, Authentication, ClaimNames, JwtAlgorithm, JwtVerifier, ProtectedResource,
};
use tower_toolcall_axum::HostGuard;

use crate::config::{key_path, kind, Checker};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const AUTH_KEYS: &[&str] = &[
    "mode",
    "resource",
    "required_scopes",
    "keys",
    "issuer",
    "audience",
    "jwks_url",
    "jwks_file",
    "algorithms",
    "leeway_s",
    "jwks_min_refresh_s",
    "claims",
    "authorization_servers",
    "scopes_supported",
    "roles",
    "stdio",
];
const KEY_KEYS: &[&str] = &["id", "tenant", "roles", "key_env", "key_file", "key_sha256"];
const CLAIM_KEYS: &[&str] = &["actor", "tenant", "roles", "scopes"];
const ROLE_KEYS: &[&str] = &["name", "allow", "deny", "max_priority"];
const PRINCIPAL_KEYS: &[&str] = &["id", "tenant", "roles"];
const HTTP_KEYS: &[&str] = &[
    "allowed_hosts",
    "allowed_origins",
    "metrics_listen",
    "max_calls_in_flight",
    "body_timeout_ms",
    "max_sessions",
    "max_sessions_per_principal",
    "session_idle_ms",
    "max_listen_streams",
    "max_listen_streams_per_caller",
    "tls_cert_file",
    "tls_key_file",
];

/// The environment variable naming the stdio front's principal when `[auth.stdio]` does not.
pub(crate) const PRINCIPAL_ENV: &str = "TOOLCALL_PRINCIPAL";

/// `[auth]`.
#[derive(Clone, Debug)]
pub(crate) struct AuthConfig {
    mode: Mode,
    /// This gateway's resource URL (the audience of its tokens); by default its `/mcp`.
    resource: Option<String>,
    required_scopes: Vec<String>,
    roles: Vec<RoleRule>,
    /// The principal of the stdio front.
    pub(crate) stdio: Option<Principal>,
}

#[derive(Clone, Debug)]
enum Mode {
    ApiKeys(ApiKeys),
    Jwt(Box<JwtConfig>),
}

/// A key entry's secret, or its digest in hexadecimal.
enum Key {
    Secret(String),
    Sha256(String),
}

#[derive(Clone, Debug)]
struct JwtConfig {
    issuer: String,
    audience: Option<String>,
    jwks: Jwks,
    algorithms: Vec<JwtAlgorithm>,
    leeway: Duration,
    min_refresh: Duration,
    claims: ClaimNames,
    /// `oauth`: the authorization servers named by the metadata.
    authorization_servers: Vec<String>,
    scopes_supported: Vec<String>,
}

#[derive(Clone, Debug)]
enum Jwks {
    Url(String),
    File(PathBuf),
}

/// `[[auth.roles]]`: the tools a role (or a token scope) may call.
#[derive(Clone, Debug)]
struct RoleRule {
    name: String,
    allow: Vec<String>,
    deny: Vec<String>,
    /// The highest `priority` the calls of the role's principals may claim.
    max_priority: Option<Priority>,
}

/// `[http]`.
#[derive(Clone, Debug)]
pub(crate) struct HttpConfig {
    /// Names the HTTP fronts answer to besides the loopback names; `*` for any.
    pub(crate) allowed_hosts: Vec<String>,
    /// Browser origins allowed besides the loopback ones.
    pub(crate) allowed_origins: Vec<String>,
    /// Where `/metrics` is served instead of beside the other routes.
    pub(crate) metrics_listen: Option<SocketAddr>,
    /// The calls each front (`/v1`, MCP) runs at once, those whose client left included.
    pub(crate) max_calls_in_flight: usize,
    /// How long a request's whole body may take to arrive.
    pub(crate) body_timeout: std::time::Duration,
    /// The most MCP sessions (2025-11-25) open at once, and for one principal.
    pub(crate) max_sessions: (usize, usize),
    /// How long an MCP session may go unused before it is closed.
    pub(crate) session_idle: std::time::Duration,
    /// The most `subscriptions/listen` streams open at once, and for one caller.
    pub(crate) max_listen_streams: (usize, usize),
    /// The certificate and key (PEM files) the HTTP fronts serve TLS with.
    pub(crate) tls: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

/// The `subscriptions/listen` streams open at once unless `[http]` says, in all and for
/// one caller.
pub(crate) const DEFAULT_LISTEN_STREAMS: (usize, usize) = (1024, 8);

/// The MCP sessions open at once unless `[http]` says, in all and for one principal.
pub(crate) const DEFAULT_MAX_SESSIONS: (usize, usize) = (10_000, 1_000);

/// How long an MCP session may idle unless `[http] session_idle_ms` says.
pub(crate) const DEFAULT_SESSION_IDLE: std::time::Duration = std::time::Duration::from_secs(300);

/// The calls each front runs at once unless `[http] max_calls_in_flight` says.
pub(crate) const DEFAULT_MAX_CALLS_IN_FLIGHT: usize = 256;

/// How long a request's body may take unless `[http] body_timeout_ms` says.
pub(crate) const DEFAULT_BODY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
            metrics_listen: None,
            max_calls_in_flight: DEFAULT_MAX_CALLS_IN_FLIGHT,
            body_timeout: DEFAULT_BODY_TIMEOUT,
            max_sessions: DEFAULT_MAX_SESSIONS,
            session_idle: DEFAULT_SESSION_IDLE,
            max_listen_streams: DEFAULT_LISTEN_STREAMS,
            tls: None,
        }
    }
}

impl HttpConfig {
    /// The Host and Origin checks of a gateway listening on `listen`: the loopback names,
    /// the listen address when it is a particular one, and the configured names; `None` when
    /// any host is allowed (`*`). `Err` for a gateway listening on every address with no
    /// names given.
    pub(crate) fn guard(&self, listen: SocketAddr) -> Result<Option<HostGuard>, BoxError> {
        if self.allowed_hosts.iter().any(|h| h == "*") {
            return Ok(None);
        }
        if listen.ip().is_unspecified() && self.allowed_hosts.is_empty() {
            return Err(format!(
                "listening on {listen} (every address) needs the names clients reach the gateway \
                 by in [http] allowed_hosts (such as [\"tools.example.com\"]), or [\"*\"] for any \
                 name: requests with another Host are refused, as a DNS-rebinding page would send"
            )
            .into());
        }
        let mut hosts = self.allowed_hosts.clone();
        if !listen.ip().is_loopback() && !listen.ip().is_unspecified() {
            hosts.push(listen.ip().to_string());
        }
        Ok(Some(
            HostGuard::loopback()
                .allow_hosts(hosts)
                .allow_origins(self.allowed_origins.clone()),
        ))
    }
}

impl AuthConfig {
    /// The resource URL of a gateway listening on `listen`, over TLS when `secure`.
    pub(crate) fn resource(&self, listen: SocketAddr, secure: bool) -> String {
        let scheme = if secure { "https" } else { "http" };
        self.resource
            .clone()
            .unwrap_or_else(|| format!("{scheme}://{listen}/mcp"))
    }

    /// The authentication of the HTTP fronts, its refusals written to `audit`; with it, the
    /// metadata to serve (modes `jwt` and `oauth`).
    pub(crate) async fn authentication(
        &self,
        listen: SocketAddr,
        secure: bool,
        audit: Option<AuditLog>,
    ) -> Result<(Authentication, Option<ProtectedResource>), BoxError> {
        let resource = self.resource(listen, secure);
        let (builder, metadata) = match &self.mode {
            Mode::ApiKeys(keys) => (Authentication::api_keys(keys.clone()), None),
            Mode::Jwt(jwt) => {
                let audience = jwt.audience.clone().unwrap_or_else(|| resource.clone());
                let verifier = JwtVerifier::builder(&jwt.issuer, audience)
                    .algorithms(jwt.algorithms.iter().copied())
                    .leeway(jwt.leeway)
                    .min_refresh(jwt.min_refresh)
                    .claims(jwt.claims.clone());
                let verifier = match &jwt.jwks {
                    Jwks::Url(url) => verifier.jwks_url(url),
                    Jwks::File(path) => verifier.jwks_file(path),
                };
                let verifier = verifier
                    .build()
                    .await
                    .map_err(|e| e.within("auth").to_string())?;
                let metadata = ProtectedResource::new(&resource)
                    .authorization_servers(jwt.authorization_servers.iter().cloned())
                    .scopes(jwt.scopes_supported.iter().cloned())
                    .name(env!("CARGO_PKG_NAME"));
                (Authentication::jwt(verifier), Some(metadata))
            }
        };
        let mut builder = builder.required_scopes(self.required_scopes.iter().cloned());
        if let Some(metadata) = &metadata {
            builder = builder.metadata_url(metadata.metadata_url());
        }
        if let Some(audit) = audit {
            builder = builder.on_refusal(move |refusal| {
                audit.record_event(
                    ExecutionEvent::of_run(
                        EventKind::AuthRefused,
                        "gateway",
                        refusal.description(),
                    )
                    .level(EventLevel::Warn)
                    .payload(serde_json::json!({
                        "status": refusal.status().as_u16(),
                        "reason": refusal.reason(),
                        "path": refusal.path(),
                    })),
                );
            });
        }
        Ok((builder.build(), metadata))
    }

    /// Which tools each principal may call.
    pub(crate) fn access(&self) -> Access {
        Access(Arc::new(self.roles.clone()))
    }
}

/// The tools each principal may call, by their listed names: with no `[[auth.roles]]`
/// every tool; else those a rule of one of its roles (or scopes) allows and none denies.
/// A call without a principal (a single-user gateway) may call every tool.
#[derive(Clone, Debug)]
pub(crate) struct Access(Arc<Vec<RoleRule>>);

impl Access {
    pub(crate) fn allows(&self, principal: Option<&Principal>, listed: &str) -> bool {
        let Some(principal) = principal else {
            return true;
        };
        if self.0.is_empty() {
            return true;
        }
        let mine = || {
            self.0
                .iter()
                .filter(|rule| principal.has_role(&rule.name) || principal.has_scope(&rule.name))
        };
        let matching = |patterns: &[String]| patterns.iter().any(|p| matches(p, listed));
        mine().any(|rule| matching(&rule.allow)) && !mine().any(|rule| matching(&rule.deny))
    }
}

impl Access {
    /// The highest `priority` the calls of `principal` may claim: the highest a rule of one
    /// of its roles (or scopes) grants, `normal` when none does. A client that says its
    /// call is urgent is believed only as far as its role allows, so that no caller can put
    /// its calls ahead of everyone else's in a bulkhead's queue.
    pub(crate) fn max_priority(&self, principal: &Principal) -> Priority {
        self.0
            .iter()
            .filter(|rule| principal.has_role(&rule.name) || principal.has_scope(&rule.name))
            .filter_map(|rule| rule.max_priority)
            .max()
            .unwrap_or(Priority::Normal)
    }

    /// `principal` with the priority cap its roles give it.
    pub(crate) fn capped(&self, principal: Principal) -> Principal {
        let max = self.max_priority(&principal);
        principal.with_max_priority(max)
    }
}

/// Whether `name` matches `pattern`, where `*` stands for any run of characters.
fn matches(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// Writes an audit event for a call refused because its caller may not call the tool, at
/// most once a second in a flood (with the count of those not written).
#[derive(Clone)]
pub(crate) struct DenialAudit {
    audit: AuditLog,
    window: Arc<std::sync::Mutex<(Option<std::time::Instant>, u64)>>,
}

impl DenialAudit {
    pub(crate) fn new(audit: AuditLog) -> Self {
        DenialAudit {
            audit,
            window: Arc::default(),
        }
    }

    pub(crate) fn denied(&self, principal: Option<&Principal>, tool: &str) {
        let suppressed = {
            let mut window = self
                .window
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let now = std::time::Instant::now();
            match window.0 {
                Some(at) if now.duration_since(at) < Duration::from_secs(1) => {
                    window.1 += 1;
                    return;
                }
                _ => {
                    window.0 = Some(now);
                    std::mem::take(&mut window.1)
                }
            }
        };
        self.audit.record_event(
            ExecutionEvent::of_run(
                EventKind::AuthDenied,
                "gateway",
                "a call of a tool its caller may not call",
            )
            .tool(tool)
            .level(EventLevel::Warn)
            .payload(serde_json::json!({
                "actorId": principal.map(Principal::id),
                "tenantId": principal.and_then(Principal::tenant),
                "suppressed": suppressed,
            })),
        );
    }
}

impl Checker {
    /// `[http]`.
    pub(crate) fn http(&mut self, root: &Table) -> HttpConfig {
        let Some(http) = self.table(root, "", "http") else {
            return HttpConfig::default();
        };
        self.known_keys(http, "http", HTTP_KEYS);
        let allowed_hosts = self.string_list(http, "http", "allowed_hosts");
        for (i, host) in allowed_hosts.iter().enumerate() {
            if host.is_empty() || host.contains(['/', ' ', '@']) {
                self.add(
                    format!("http.allowed_hosts[{i}]"),
                    format!("{host:?} is not a host name; write a name such as \"tools.example.com\" or \"tools.example.com:8443\", or \"*\""),
                );
            }
        }
        let allowed_origins = self.string_list(http, "http", "allowed_origins");
        for (i, origin) in allowed_origins.iter().enumerate() {
            if origin != "null" && !origin.starts_with("http://") && !origin.starts_with("https://")
            {
                self.add(
                    format!("http.allowed_origins[{i}]"),
                    format!("{origin:?} is not an origin; write it as https://host or https://host:port"),
                );
            }
        }
        let metrics_listen = self.text(http, "http", "metrics_listen").and_then(|s| {
            s.parse::<SocketAddr>()
                .map_err(|_| {
                    self.add(
                        "http.metrics_listen",
                        format!(
                            "{s:?} is not a socket address; write one such as \"127.0.0.1:9090\""
                        ),
                    )
                })
                .ok()
        });
        let max_calls_in_flight = self
            .count(http, "http", "max_calls_in_flight")
            .unwrap_or(DEFAULT_MAX_CALLS_IN_FLIGHT);
        let body_timeout = self
            .millis(http, "http", "body_timeout_ms")
            .unwrap_or(DEFAULT_BODY_TIMEOUT);
        let max_sessions = (
            self.count(http, "http", "max_sessions")
                .unwrap_or(DEFAULT_MAX_SESSIONS.0),
            self.count(http, "http", "max_sessions_per_principal")
                .unwrap_or(DEFAULT_MAX_SESSIONS.1),
        );
        let session_idle = self
            .millis(http, "http", "session_idle_ms")
            .unwrap_or(DEFAULT_SESSION_IDLE);
        let max_listen_streams = (
            self.count(http, "http", "max_listen_streams")
                .unwrap_or(DEFAULT_LISTEN_STREAMS.0),
            self.count(http, "http", "max_listen_streams_per_caller")
                .unwrap_or(DEFAULT_LISTEN_STREAMS.1),
        );
        let cert = self.text(http, "http", "tls_cert_file").map(PathBuf::from);
        let key = self.text(http, "http", "tls_key_file").map(PathBuf::from);
        let tls = crate::tls::cert_and_key(cert, key).unwrap_or_else(|(field, problem)| {
            self.add(key_path("http", field), problem);
            None
        });
        HttpConfig {
            allowed_hosts,
            allowed_origins,
            metrics_listen,
            max_calls_in_flight,
            body_timeout,
            max_sessions,
            session_idle,
            max_listen_streams,
            tls,
        }
    }

    /// `[auth]`.
    pub(crate) fn auth(&mut self, root: &Table) -> Option<AuthConfig> {
        let auth = self.table(root, "", "auth")?;
        self.known_keys(auth, "auth", AUTH_KEYS);
        let resource = self.text(auth, "auth", "resource").map(str::to_owned);
        let required_scopes = self.string_list(auth, "auth", "required_scopes");
        let roles = self.roles(auth);
        let stdio = self
            .table(auth, "auth", "stdio")
            .and_then(|table| self.stdio_principal(table, "auth.stdio"));
        let mode = match self.string(auth, "auth", "mode") {
            None => {
                self.add(
                    "auth.mode",
                    "is required; choose \"api-keys\", \"jwt\" or \"oauth\"",
                );
                return None;
            }
            Some("api-keys") => Mode::ApiKeys(self.keys(auth)),
            Some(mode @ ("jwt" | "oauth")) => Mode::Jwt(Box::new(self.jwt(auth, mode == "oauth")?)),
            Some(other) => {
                self.add(
                    "auth.mode",
                    format!("{other:?} is not a mode; choose \"api-keys\", \"jwt\" or \"oauth\""),
                );
                return None;
            }
        };
        Some(AuthConfig {
            mode,
            resource,
            required_scopes,
            roles,
            stdio,
        })
    }

    fn stdio_principal(&mut self, table: &Table, field: &str) -> Option<Principal> {
        self.known_keys(table, field, PRINCIPAL_KEYS);
        self.principal(table, field)
    }

    /// A principal's `id`, `tenant` and `roles`.
    fn principal(&mut self, table: &Table, field: &str) -> Option<Principal> {
        let id = self.text(table, field, "id");
        if id.is_none() && !table.contains_key("id") {
            self.add(
                key_path(field, "id"),
                "is required; name the principal (a user or service account)",
            );
        }
        let mut principal = Principal::new(id?);
        if let Some(tenant) = self.text(table, field, "tenant") {
            principal = principal.with_tenant(tenant);
        }
        Some(principal.with_roles(self.string_list(table, field, "roles")))
    }

    fn keys(&mut self, auth: &Table) -> ApiKeys {
        let mut keys = ApiKeys::new();
        let entries = self.tables(auth, "auth", "keys", "key");
        if entries.is_empty() && auth.get("keys").is_none_or(|k| k.is_array()) {
            self.add(
                "auth.keys",
                "mode \"api-keys\" needs at least one [[auth.keys]] entry (id, and key_env, \
                 key_file or key_sha256)",
            );
        }
        for (_, field, table) in entries {
            self.known_keys(table, &field, KEY_KEYS);
            let Some(principal) = self.principal(table, &field) else {
                continue;
            };
            keys = match self.key(table, &field) {
                Some(Key::Secret(secret)) => keys.with_key(secret, principal),
                Some(Key::Sha256(hex)) => match keys.clone().with_digest_hex(&hex, principal) {
                    Some(keys) => keys,
                    None => {
                        self.add(
                            key_path(&field, "key_sha256"),
                            "is not a SHA-256 digest; write the 64 hexadecimal digits sha256sum \
                             prints",
                        );
                        keys
                    }
                },
                None => keys,
            };
        }
        keys
    }

    /// A key entry's secret, read from its variable or file (never quoted in a problem), or
    /// its digest.
    fn key(&mut self, table: &Table, field: &str) -> Option<Key> {
        let given: Vec<&str> = ["key_env", "key_file", "key_sha256"]
            .into_iter()
            .filter(|k| table.contains_key(*k))
            .collect();
        if given.len() != 1 {
            self.add(
                field,
                "needs exactly one of key_env (a variable holding the key), key_file (a file \
                 holding it) or key_sha256 (its SHA-256, in hexadecimal); the key itself never \
                 goes in the file",
            );
            return None;
        }
        let secret = match given[0] {
            "key_env" => {
                let name = self.text(table, field, "key_env")?;
                match std::env::var(name) {
                    Ok(value) => value,
                    Err(_) => {
                        self.add(
                            key_path(field, "key_env"),
                            format!(
                                "the variable {name} is not set (or not UTF-8); set it to the key"
                            ),
                        );
                        return None;
                    }
                }
            }
            "key_file" => {
                let path = self.text(table, field, "key_file")?;
                match std::fs::read_to_string(path) {
                    Ok(value) => value.trim_end_matches(['\n', '\r']).to_owned(),
                    Err(err) => {
                        self.add(
                            key_path(field, "key_file"),
                            format!("{path} cannot be read ({err}); check the path"),
                        );
                        return None;
                    }
                }
            }
            _ => {
                return Some(Key::Sha256(
                    self.text(table, field, "key_sha256")?.to_owned(),
                ))
            }
        };
        if secret.len() < 16 {
            self.add(
                field,
                "has a key shorter than 16 bytes; use a long random key (openssl rand -hex 32)",
            );
            return None;
        }
        Some(Key::Secret(secret))
    }

    fn jwt(&mut self, auth: &Table, oauth: bool) -> Option<JwtConfig> {
        let issuer = self.text(auth, "auth", "issuer");
        if issuer.is_none() && !auth.contains_key("issuer") {
            self.add(
                "auth.issuer",
                "is required for a token mode; name the tokens' issuer (their iss)",
            );
        }
        let audience = self.text(auth, "auth", "audience").map(str::to_owned);
        let jwks = match (
            self.text(auth, "auth", "jwks_url"),
            self.text(auth, "auth", "jwks_file"),
        ) {
            (Some(url), None) => {
                if url.starts_with("http://") {
                    Some(Jwks::Url(url.to_owned()))
                } else {
                    self.add(
                        "auth.jwks_url",
                        "must be an http:// URL (an https:// JWKS needs the gateway's TLS client; \
                         until then, save the JWKS to a file and give jwks_file)",
                    );
                    None
                }
            }
            (None, Some(path)) => Some(Jwks::File(PathBuf::from(path))),
            (Some(_), Some(_)) => {
                self.add("auth.jwks_url", "is given with auth.jwks_file; keep one");
                None
            }
            (None, None) => {
                self.add(
                    "auth.jwks_url",
                    "is required for a token mode (or auth.jwks_file)",
                );
                None
            }
        };
        let mut algorithms = Vec::new();
        let names = if auth.contains_key("algorithms") {
            self.string_list(auth, "auth", "algorithms")
        } else {
            vec!["RS256".to_owned(), "ES256".to_owned()]
        };
        for (i, name) in names.iter().enumerate() {
            match name.parse::<JwtAlgorithm>() {
                Ok(alg) if !name.starts_with("HS") => algorithms.push(alg),
                _ => self.add(
                    format!("auth.algorithms[{i}]"),
                    format!(
                        "{name:?} is not an accepted algorithm; use asymmetric ones: RS256, RS384, \
                         RS512, PS256, PS384, PS512, ES256, ES384 or EdDSA (never none or HS*)"
                    ),
                ),
            }
        }
        let seconds = |checker: &mut Checker, key: &str, default: u64| match auth.get(key) {
            None => Some(Duration::from_secs(default)),
            Some(Value::Integer(s)) if (0..=3600).contains(s) => {
                Some(Duration::from_secs(s.unsigned_abs()))
            }
            Some(other) => {
                checker.add(
                    key_path("auth", key),
                    format!(
                        "must be a whole number of seconds from 0 to 3600, got {}",
                        kind(other)
                    ),
                );
                None
            }
        };
        let leeway = seconds(self, "leeway_s", 30);
        let min_refresh = seconds(self, "jwks_min_refresh_s", 10);
        let mut claims = ClaimNames::default();
        if let Some(table) = self.table(auth, "auth", "claims") {
            self.known_keys(table, "auth.claims", CLAIM_KEYS);
            if let Some(actor) = self.text(table, "auth.claims", "actor") {
                claims.actor = actor.to_owned();
            }
            claims.tenant = self.text(table, "auth.claims", "tenant").map(str::to_owned);
            if let Some(roles) = self.text(table, "auth.claims", "roles") {
                claims.roles = roles.to_owned();
            }
            if let Some(scopes) = self.text(table, "auth.claims", "scopes") {
                claims.scopes = scopes.to_owned();
            }
        }
        let authorization_servers = self.string_list(auth, "auth", "authorization_servers");
        if oauth && authorization_servers.is_empty() {
            self.add(
                "auth.authorization_servers",
                "is required in mode \"oauth\": the URLs of the authorization servers clients get tokens from",
            );
        }
        let scopes_supported = self.string_list(auth, "auth", "scopes_supported");
        Some(JwtConfig {
            issuer: issuer?.to_owned(),
            audience,
            jwks: jwks?,
            algorithms,
            leeway: leeway?,
            min_refresh: min_refresh?,
            claims,
            authorization_servers,
            scopes_supported,
        })
    }

    fn roles(&mut self, auth: &Table) -> Vec<RoleRule> {
        let mut rules = Vec::new();
        for (_, field, table) in self.tables(auth, "auth", "roles", "rule") {
            self.known_keys(table, &field, ROLE_KEYS);
            let name = self.text(table, &field, "name");
            if name.is_none() && !table.contains_key("name") {
                self.add(
                    key_path(&field, "name"),
                    "is required; name the role or scope the rule is for",
                );
            }
            let allow = self.string_list(table, &field, "allow");
            let deny = self.string_list(table, &field, "deny");
            let max_priority = self.string(table, &field, "max_priority").and_then(|name| {
                let parsed = serde_json::from_value(serde_json::Value::from(name)).ok();
                if parsed.is_none() {
                    self.add(
                        key_path(&field, "max_priority"),
                        format!("must be \"low\", \"normal\" or \"high\", got {name:?}"),
                    );
                }
                parsed
            });
            if allow.is_empty() && deny.is_empty() && max_priority.is_none() {
                self.add(
                    field.clone(),
                    "allows and denies nothing; list tools by their listed names in allow or \
                     deny (\"time__*\"), or grant a max_priority",
                );
            }
            if let Some(name) = name {
                rules.push(RoleRule {
                    name: name.to_owned(),
                    allow,
                    deny,
                    max_priority,
                });
            }
        }
        rules
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::config::problem_lines as problems;

    #[test]
    fn every_broken_auth_rule_is_named_by_its_field() {
        let lines = problems(
            r#"
            [auth]
            mode = "jwt"
            issuer = "https://auth.example.com/"
            jwks_url = "https://auth.example.com/jwks.json"
            algorithms = ["RS256", "HS256", "none"]
            leeway_s = -1
            [[auth.roles]]
            name = "reader"
            [http]
            allowed_origins = ["evil.example"]
            metrics_listen = "localhost"
            max_calls_in_flight = 0
            max_sessions = "many"
            session_idle_ms = 0
            tls_cert_file = "/etc/gateway/cert.pem"
            "#,
        );
        let expected = [
            "auth.algorithms[1]: \"HS256\" is not an accepted algorithm",
            "auth.algorithms[2]: \"none\" is not an accepted algorithm",
            "auth.jwks_url: must be an http:// URL",
            "auth.leeway_s: must be a whole number of seconds from 0 to 3600, got an integer",
            "auth.roles[0]: allows and denies nothing",
            "http.allowed_origins[0]: \"evil.example\" is not an origin",
            "http.max_calls_in_flight: must be from 1 to 1000000, got 0",
            "http.max_sessions: must be a whole number, got a string",
            "http.metrics_listen: \"localhost\" is not a socket address",
            "http.session_idle_ms: must be from 1 to 3600000 milliseconds (one hour), got 0",
            "http.tls_key_file: is required with tls_cert_file",
        ];
        assert_eq!(lines.len(), expected.len(), "{lines:#?}");
        for (line, expected) in lines.iter().zip(expected) {
            assert!(line.starts_with(expected), "{line} / {expected}");
        }

        let lines = problems(
            r#"
            [auth]
            mode = "api-keys"
            [[auth.keys]]
            id = "alice"
            key_env = "TOOLCALL_TEST_UNSET_KEY_VARIABLE"
            [[auth.keys]]
            key_sha256 = "abc"
            [[auth.keys]]
            id = "carol"
            key_file = "/nonexistent/carol"
            key_env = "X"
            "#,
        );
        let expected = [
            "auth.keys[0].key_env: the variable TOOLCALL_TEST_UNSET_KEY_VARIABLE is not set",
            "auth.keys[1].id: is required",
            "auth.keys[2]: needs exactly one of key_env",
        ];
        assert_eq!(lines.len(), expected.len(), "{lines:#?}");
        for (line, expected) in lines.iter().zip(expected) {
            assert!(line.starts_with(expected), "{line} / {expected}");
        }

        let lines = problems("[auth]\nmode = \"oauth\"\nissuer = \"i\"\njwks_file = \"/j\"\n");
        assert_eq!(lines.len(), 1, "{lines:#?}");
        assert!(lines[0].starts_with("auth.authorization_servers: is required in mode \"oauth\""));
        let lines = problems("[auth]\nmode = \"magic\"\n");
        assert_eq!(
            lines,
            ["auth.mode: \"magic\" is not a mode; choose \"api-keys\", \"jwt\" or \"oauth\""]
        );
        let lines = problems(
            "[auth]\nmode = \"api-keys\"\n[[auth.keys]]\nid = \"a\"\nkey_sha256 = \"abc\"\n",
        );
        assert_eq!(
            lines,
            ["auth.keys[0].key_sha256: is not a SHA-256 digest; write the 64 hexadecimal digits sha256sum prints"]
        );
    }

    #[test]
    fn a_gateway_on_every_address_needs_the_names_it_answers_to() {
        let none = HttpConfig::default();
        let every: SocketAddr = "0.0.0.0:8080".parse().unwrap();
        let err = none.guard(every).unwrap_err().to_string();
        assert!(err.contains("allowed_hosts"), "{err}");
        let one: SocketAddr = "10.1.2.3:8080".parse().unwrap();
        let guard = none.guard(one).unwrap().unwrap();
        assert!(guard.allows_host("10.1.2.3:8080") && guard.allows_host("localhost"));
        assert!(!guard.allows_host("evil.example"));
        let any = HttpConfig {
            allowed_hosts: vec!["*".into()],
            ..HttpConfig::default()
        };
        assert!(any.guard(every).unwrap().is_none());
    }

    #[test]
    fn patterns_match_with_stars_only() {
        assert!(matches("*", "anything"));
        assert!(matches("time__*", "time__get_current_time"));
        assert!(!matches("time__*", "timer__x"));
        assert!(matches("fs__read_*", "fs__read_file"));
        assert!(matches("*__read_*_v2", "fs__read_file_v2"));
        assert!(!matches("*__read_*_v2", "fs__read_file_v3"));
        assert!(matches("exact", "exact"));
        assert!(!matches("exact", "exactly"));
        assert!(matches("a*a", "aa"));
        assert!(!matches("a*a", "a"));
    }

    #[test]
    fn a_principal_gets_what_its_roles_allow_and_none_deny() {
        let access = Access(Arc::new(vec![
            RoleRule {
                name: "reader".into(),
                allow: vec!["time__*".into(), "fs__read_*".into()],
                deny: vec!["fs__read_secrets".into()],
                max_priority: None,
            },
            RoleRule {
                name: "mcp:write".into(),
                allow: vec!["fs__write_*".into()],
                deny: vec![],
                max_priority: None,
            },
        ]));
        let reader = Principal::new("bob").with_roles(["reader"]);
        assert!(access.allows(Some(&reader), "time__now"));
        assert!(access.allows(Some(&reader), "fs__read_file"));
        assert!(!access.allows(Some(&reader), "fs__read_secrets"));
        assert!(!access.allows(Some(&reader), "fs__write_file"));
        let writer = Principal::new("ci").with_scopes(["mcp:write"]);
        assert!(access.allows(Some(&writer), "fs__write_file"));
        assert!(!access.allows(Some(&writer), "time__now"));
        let nobody = Principal::new("eve");
        assert!(!access.allows(Some(&nobody), "time__now"));
        assert!(access.allows(None, "fs__write_file"), "single-user");
        assert!(Access(Arc::default()).allows(Some(&nobody), "anything"));
    }

    #[test]
    fn a_principal_claims_the_priority_its_roles_grant_and_normal_otherwise() {
        use tower_toolcall::ToolCall;

        let config = crate::config::GatewayConfig::from_toml_str(
            "[auth]\nmode = \"api-keys\"\n\
             [[auth.keys]]\nid = \"ada\"\nkey_sha256 = \"abababababababababababababababababababababababababababababababab\"\n\
             [[auth.roles]]\nname = \"oncall\"\nmax_priority = \"high\"\n\
             [[auth.roles]]\nname = \"batch\"\nallow = [\"*\"]\nmax_priority = \"low\"\n\
             [[auth.roles]]\nname = \"reader\"\nallow = [\"*\"]\n",
        );
        let access = config
            .expect("a valid configuration")
            .auth
            .unwrap()
            .access();
        let oncall = Principal::new("ada").with_roles(["reader", "oncall"]);
        let batch = Principal::new("bob").with_roles(["batch"]);
        let reader = Principal::new("eve").with_roles(["reader"]);
        assert_eq!(access.max_priority(&oncall), Priority::High);
        assert_eq!(access.max_priority(&batch), Priority::Low);
        assert_eq!(access.max_priority(&reader), Priority::Normal);

        // What a bound call claims is capped, whatever its body says.
        let urgent = || {
            ToolCall::builder("fs", "read_file")
                .session("s")
                .actor("spoofed")
                .priority(Priority::High)
                .build()
                .unwrap()
        };
        for (principal, expected) in [
            (oncall, Priority::High),
            (batch, Priority::Low),
            (reader, Priority::Normal),
        ] {
            let mut call = urgent();
            call.bind_principal(access.capped(principal));
            assert_eq!(call.priority(), expected);
        }
    }

    #[test]
    fn a_max_priority_that_is_not_one_is_refused_naming_the_field() {
        let lines = problems(
            "[auth]\nmode = \"api-keys\"\n[[auth.keys]]\nid = \"ada\"\nkey_sha256 = \"abababababababababababababababababababababababababababababababab\"\n[[auth.roles]]\nname = \"x\"\n\
             allow = [\"*\"]\nmax_priority = \"urgent\"\n",
        );
        assert_eq!(
            lines,
            ["auth.roles[0].max_priority: must be \"low\", \"normal\" or \"high\", got \"urgent\""]
        );
    }
}
