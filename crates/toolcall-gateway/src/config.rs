//! The gateway's configuration file (TOML), checked field by field.
//!
//! The file is first read as loose TOML, then every field is checked on its own, so that one
//! bad field does not hide the others: [`ConfigProblems`] lists every problem found, each
//! naming its field (`upstreams[1].url`, `policy.tools[0].risk`, `store.redis`) and saying
//! what to do.
//!
//! Secrets never print: the values of HTTP headers are kept in [`Secret`], whose `Debug` and
//! `Display` print them redacted; the Redis URLs are shown through [`ShownRedis`], their
//! passwords redacted; and no problem text ever repeats them.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use toml::{Table, Value};
use tower_toolcall::registry::ToolRegistry;
use tower_toolcall::ConfigError;
use tower_toolcall_mcp::{Trust, DEFAULT_MAX_MESSAGE_BYTES};
use tower_toolcall_redis::RedisTarget;

use crate::auth::{AuthConfig, HttpConfig, DEFAULT_MAX_CALLS_IN_FLIGHT};
use crate::servers::ServerPolicy;
use crate::tls::UpstreamTls;

/// The per-call timeout of an upstream unless its entry says otherwise.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_millis(30_000);
/// How long an upstream may take to answer `initialize` and `tools/list` unless its entry
/// says otherwise.
pub(crate) const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_millis(20_000);
/// The longest timeout a file may set, in milliseconds (one hour).
const MAX_TIMEOUT_MS: i64 = 3_600_000;
/// The longest upstream name.
pub(crate) const MAX_NAME_LEN: usize = 32;

const TOP_KEYS: &[&str] = &[
    "listen",
    "log_format",
    "admin",
    "store",
    "audit",
    "upstreams",
    "policy",
    "auth",
    "http",
    "servers",
];
const ADMIN_KEYS: &[&str] = &["token_env"];
const STORE_KEYS: &[&str] = &["redis", "cluster"];
const AUDIT_KEYS: &[&str] = &["path"];
const UPSTREAM_KEYS: &[&str] = &[
    "name",
    "command",
    "args",
    "env",
    "cwd",
    "url",
    "headers",
    "headers_env",
    "trust",
    "timeout_ms",
    "startup_timeout_ms",
    "required",
    "max_message_bytes",
    "keep_alive",
    "tls_ca_file",
    "tls_cert_file",
    "tls_key_file",
];
const STDIO_ONLY_KEYS: &[&str] = &["args", "env", "cwd", "max_message_bytes"];
const HTTP_ONLY_KEYS: &[&str] = &[
    "headers",
    "headers_env",
    "keep_alive",
    "tls_ca_file",
    "tls_cert_file",
    "tls_key_file",
];

/// The gateway's configuration.
#[derive(Clone)]
pub(crate) struct GatewayConfig {
    /// The address of the HTTP fronts.
    pub(crate) listen: Option<SocketAddr>,
    /// How log lines are written.
    pub(crate) log_format: LogFormat,
    /// The environment variable that holds the admin bearer token.
    pub(crate) admin_token_env: Option<String>,
    /// Where the shared stores are: one Redis node (`[store] redis`) or a Redis Cluster by
    /// some of its nodes (`[store] cluster`); the memory stores when `None`.
    pub(crate) redis: Option<RedisTarget>,
    /// The directory of the JSONL audit log (`calls.jsonl`, `results.jsonl`, `events.jsonl`).
    pub(crate) audit_path: Option<PathBuf>,
    /// The MCP servers behind the gateway, in the order of the file.
    pub(crate) upstreams: Vec<UpstreamConfig>,
    /// The operator's per-tool policy (namespace = upstream name).
    pub(crate) policy: Option<ToolRegistry>,
    /// Who may call: `[auth]`; `None` for a single-user gateway.
    pub(crate) auth: Option<AuthConfig>,
    /// The HTTP fronts' names, origins and metrics address: `[http]`.
    pub(crate) http: HttpConfig,
    /// The operator's word on each upstream, by its name: `[servers.NAME]`.
    pub(crate) servers: BTreeMap<String, ServerPolicy>,
    /// What was left out of a host's file, and why: logged at start, printed by `--check`.
    pub(crate) warnings: Vec<String>,
}

impl fmt::Debug for GatewayConfig {
    /// Every field, the Redis URLs as [`ShownRedis`] shows them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Taken apart, so that a field added to the configuration is not left out here.
        let GatewayConfig {
            listen,
            log_format,
            admin_token_env,
            redis,
            audit_path,
            upstreams,
            policy,
            auth,
            http,
            servers,
            warnings,
        } = self;
        f.debug_struct("GatewayConfig")
            .field("listen", listen)
            .field("log_format", log_format)
            .field("admin_token_env", admin_token_env)
            .field("redis", &redis.as_ref().map(ShownRedis))
            .field("audit_path", audit_path)
            .field("upstreams", upstreams)
            .field("policy", policy)
            .field("auth", auth)
            .field("http", http)
            .field("servers", servers)
            .field("warnings", warnings)
            .finish()
    }
}

/// The shared stores' Redis as the gateway names it in its log lines and errors: by the
/// field of the file that sets it, and by its URLs, their user information and query values
/// redacted ([`redact_url`]).
pub(crate) struct ShownRedis<'a>(pub(crate) &'a RedisTarget);

impl ShownRedis<'_> {
    /// The field of the file it is set by.
    pub(crate) fn field(&self) -> &'static str {
        if self.0.is_cluster() {
            "store.cluster"
        } else {
            "store.redis"
        }
    }
}

impl fmt::Display for ShownRedis<'_> {
    /// The URLs, their passwords redacted, separated by commas.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, url) in self.0.urls().iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            f.write_str(&redact_url(url))?;
        }
        Ok(())
    }
}

impl fmt::Debug for ShownRedis<'_> {
    /// `Node(url)` or `Cluster([url, …])`, the URLs redacted.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let urls: Vec<Cow<'_, str>> = self.0.urls().iter().map(|url| redact_url(url)).collect();
        match urls.as_slice() {
            [url] if !self.0.is_cluster() => f.debug_tuple("Node").field(url).finish(),
            seeds => f.debug_tuple("Cluster").field(&seeds).finish(),
        }
    }
}

/// A cluster from a comma-separated list of seed URLs (`TOOLCALL_REDIS_CLUSTER`).
pub(crate) fn cluster_of_list(urls: &str) -> RedisTarget {
    RedisTarget::cluster(urls.split(',').map(str::trim).filter(|url| !url.is_empty()))
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// One MCP server behind the gateway.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct UpstreamConfig {
    /// Its name: the namespace of its tools and their name prefix.
    pub(crate) name: String,
    /// How the gateway reaches it.
    pub(crate) transport: UpstreamTransport,
    /// Whether its tool annotations may relax the policy.
    pub(crate) trust: Trust,
    /// The timeout of each call.
    pub(crate) timeout: Duration,
    /// How long it may take to answer `initialize` and `tools/list`.
    pub(crate) startup_timeout: Duration,
    /// Whether `/readyz` waits for it.
    pub(crate) required: bool,
    /// The longest message read from a stdio server (its `tools/list` answer included).
    pub(crate) max_message_bytes: usize,
    /// The requests in flight to a streamable-HTTP server at most: the calls the gateway
    /// runs at once (`[http] max_calls_in_flight`), so that none waits on the client.
    pub(crate) max_in_flight: usize,
    /// Whether the connections to a streamable-HTTP server are kept alive, in one pool.
    pub(crate) keep_alive: bool,
    /// The CA and client certificate of a streamable-HTTP server's TLS.
    pub(crate) tls: UpstreamTls,
}

/// How the gateway reaches an upstream.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum UpstreamTransport {
    /// A server the gateway launches and speaks to over its stdin and stdout.
    Stdio {
        command: String,
        args: Vec<String>,
        env: BTreeMap<String, String>,
        cwd: Option<PathBuf>,
    },
    /// A streamable HTTP server.
    Http {
        url: String,
        headers: BTreeMap<String, Secret>,
    },
}

impl fmt::Debug for UpstreamTransport {
    /// Environment values often hold API keys, so only their names are printed; header
    /// values are [`Secret`]s; the URL's user information is redacted.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UpstreamTransport::Stdio {
                command,
                args,
                env,
                cwd,
            } => f
                .debug_struct("Stdio")
                .field("command", command)
                .field("args", args)
                .field("env", &RedactedValues(env))
                .field("cwd", cwd)
                .finish(),
            UpstreamTransport::Http { url, headers } => f
                .debug_struct("Http")
                .field("url", &redact_url(url))
                .field("headers", headers)
                .finish(),
        }
    }
}

/// A map printed with `***` for every value.
struct RedactedValues<'a>(&'a BTreeMap<String, String>);

impl fmt::Debug for RedactedValues<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.0.keys().map(|k| (k, format_args!("***"))))
            .finish()
    }
}

/// A string that must not reach a log line: `Debug` and `Display` print it redacted.
///
/// An opaque secret ([`Secret::opaque`]) prints as `***`; a URL secret prints as
/// [`redact_url`] prints it.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Secret {
    value: String,
    url: bool,
}

impl Secret {
    /// A URL whose user information is secret (the tests'; the configuration's URLs are
    /// redacted where they are shown).
    #[cfg(test)]
    pub(crate) fn url(value: impl Into<String>) -> Secret {
        Secret {
            value: value.into(),
            url: true,
        }
    }

    /// A value that is secret as a whole (a header value, a token).
    pub(crate) fn opaque(value: impl Into<String>) -> Secret {
        Secret {
            value: value.into(),
            url: false,
        }
    }

    /// The secret itself, for the code that uses it.
    pub(crate) fn expose(&self) -> &str {
        &self.value
    }

    /// The form that may be printed.
    pub(crate) fn redacted(&self) -> Cow<'_, str> {
        if self.url {
            redact_url(&self.value)
        } else {
            Cow::Borrowed("***")
        }
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({:?})", self.redacted())
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

/// `url` with its user information replaced by `***`, and the value of each query
/// parameter too (`?key=***`: API keys often travel there). Text that is not a `scheme://`
/// URL but holds an `@` is replaced whole, since where a password would end cannot be told.
pub(crate) fn redact_url(url: &str) -> Cow<'_, str> {
    let without_user = match url.find("://") {
        Some(i) => {
            let rest = &url[i + 3..];
            // A password may hold `/` or `@` unescaped: everything up to the last `@` goes.
            match rest.rfind('@') {
                Some(at) => Cow::Owned(format!("{}://***{}", &url[..i], &rest[at..])),
                None => Cow::Borrowed(url),
            }
        }
        None if url.contains('@') => return Cow::Borrowed("***"),
        None => Cow::Borrowed(url),
    };
    match without_user.split_once('?') {
        None => without_user,
        Some((base, query)) => {
            let (query, fragment) = match query.split_once('#') {
                Some((query, fragment)) => (query, Some(fragment)),
                None => (query, None),
            };
            let params: Vec<String> = query
                .split('&')
                .map(|param| match param.split_once('=') {
                    Some((name, _)) => format!("{name}=***"),
                    None if param.is_empty() => String::new(),
                    None => "***".to_owned(),
                })
                .collect();
            let mut redacted = format!("{base}?{}", params.join("&"));
            if let Some(fragment) = fragment {
                redacted.push('#');
                redacted.push_str(fragment);
            }
            Cow::Owned(redacted)
        }
    }
}

/// Every problem found in a configuration, each naming its field.
///
/// `Display` writes one line per problem, `<field>: <problem>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ConfigProblems(pub(crate) Vec<ConfigError>);

impl fmt::Display for ConfigProblems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, problem) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            if problem.field().is_empty() {
                f.write_str(problem.problem())?;
            } else {
                write!(f, "{}: {}", problem.field(), problem.problem())?;
            }
        }
        Ok(())
    }
}

impl std::error::Error for ConfigProblems {}

impl From<ConfigError> for ConfigProblems {
    fn from(problem: ConfigError) -> Self {
        ConfigProblems(vec![problem])
    }
}

impl GatewayConfig {
    /// Reads and checks a configuration.
    pub(crate) fn from_toml_str(text: &str) -> Result<GatewayConfig, ConfigProblems> {
        let root: Table = toml::from_str(text).map_err(|e| syntax_problem(text, &e))?;
        let mut check = Checker::default();
        let config = check.gateway(&root);
        if check.problems.is_empty() {
            Ok(config)
        } else {
            Err(ConfigProblems(check.problems))
        }
    }

    /// Reads and checks the configuration file at `path`; a file that cannot be read is one
    /// problem naming the path.
    pub(crate) fn from_path(path: &Path) -> Result<GatewayConfig, ConfigProblems> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigError::new(
                path.display().to_string(),
                format!("cannot be read ({e}); check the path given to --config"),
            )
        })?;
        GatewayConfig::from_toml_str(&text)
    }

    /// Adds the servers of a host's MCP file (see [`crate::mcp_json`]), untrusted unless an
    /// upstream of the same name in this configuration says otherwise (then the
    /// configuration's entry wins entirely) or `[servers.NAME]` trusts them; other name
    /// clashes are problems.
    pub(crate) fn with_imported(
        mut self,
        imported: crate::mcp_json::Imported,
    ) -> Result<GatewayConfig, ConfigProblems> {
        self.warnings.extend(imported.skipped);
        let imported = imported.upstreams;
        let configured = self.upstreams.len();
        let mut problems = Vec::new();
        for upstream in imported {
            if self.upstreams[..configured]
                .iter()
                .any(|u| u.name == upstream.name)
            {
                continue;
            }
            if self.upstreams[configured..]
                .iter()
                .any(|u| u.name == upstream.name)
            {
                problems.push(ConfigError::new(
                    upstream.name.clone(),
                    "is the name of servers in two imported files; rename one of them, or \
                     define an upstream of this name in the gateway configuration, which then \
                     replaces both",
                ));
                continue;
            }
            if let Err(problem) = check_name(&upstream.name) {
                problems.push(ConfigError::new(upstream.name.clone(), problem));
                continue;
            }
            self.upstreams.push(upstream);
        }
        if problems.is_empty() {
            Ok(self)
        } else {
            Err(ConfigProblems(problems))
        }
    }

    /// Settles each upstream's trust (`[servers.NAME] trust`, then `--trust NAME`, which
    /// `trusted` lists) once every upstream is known; a `[servers.NAME]` or `--trust` that
    /// names no upstream is a problem.
    pub(crate) fn settle(mut self, trusted: &[String]) -> Result<GatewayConfig, ConfigProblems> {
        let names = || {
            let names: Vec<&str> = self.upstreams.iter().map(|u| u.name.as_str()).collect();
            if names.is_empty() {
                "there is none".to_owned()
            } else {
                format!("the upstreams are {}", names.join(", "))
            }
        };
        let mut problems = Vec::new();
        for name in self.servers.keys() {
            if !self.upstreams.iter().any(|u| &u.name == name) {
                problems.push(ConfigError::new(
                    key_path("servers", name),
                    format!(
                        "names no upstream; {} (an imported server's name is its name in the \
                         host's file, lowercased, other characters than a-z, 0-9, _ and - \
                         made -)",
                        names()
                    ),
                ));
            }
        }
        for name in trusted {
            if !self.upstreams.iter().any(|u| &u.name == name) {
                problems.push(ConfigError::new(
                    "--trust",
                    format!("{name:?} names no upstream; {}", names()),
                ));
            }
        }
        if !problems.is_empty() {
            return Err(ConfigProblems(problems));
        }
        for upstream in &mut self.upstreams {
            if let Some(trust) = self.servers.get(&upstream.name).and_then(|s| s.trust) {
                upstream.trust = trust;
            }
            if trusted.contains(&upstream.name) {
                upstream.trust = Trust::Trusted;
            }
            upstream.max_in_flight = self.http.max_calls_in_flight;
        }
        Ok(self)
    }

    /// The demo configuration when no `--config` is given: no upstreams.
    pub(crate) fn empty() -> GatewayConfig {
        GatewayConfig {
            listen: None,
            log_format: LogFormat::Text,
            admin_token_env: None,
            redis: None,
            audit_path: None,
            upstreams: Vec::new(),
            policy: None,
            auth: None,
            http: HttpConfig::default(),
            servers: BTreeMap::new(),
            warnings: Vec::new(),
        }
    }

    /// The upstream named `name`.
    #[cfg(test)]
    pub(crate) fn upstream(&self, name: &str) -> Option<&UpstreamConfig> {
        self.upstreams.iter().find(|u| u.name == name)
    }
}

/// The one problem of a file that is not TOML. The parser's own rendering quotes the
/// offending line, which may hold a secret, so only its message and position are kept.
fn syntax_problem(text: &str, err: &toml::de::Error) -> ConfigProblems {
    let message = err.message().trim_end_matches('\n').trim();
    let problem = match err.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            format!("is not valid TOML: {message} (line {line}, column {column})")
        }
        None => format!("is not valid TOML: {message}"),
    };
    ConfigError::new("", problem).into()
}

/// `true` when `name` may name an upstream: `[a-z0-9_-]{1,32}`.
pub(crate) fn is_upstream_name(name: &str) -> bool {
    check_name(name).is_ok()
}

fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("must not be empty; use 1 to 32 characters a-z, 0-9, _ or -".to_owned());
    }
    if name.len() > MAX_NAME_LEN {
        return Err(format!(
            "is {} characters long; use at most {MAX_NAME_LEN}",
            name.chars().count()
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !matches!(c, 'a'..='z' | '0'..='9' | '_' | '-'))
    {
        return Err(format!(
            "{name:?} has the character {c:?}; use only a-z, 0-9, _ and -"
        ));
    }
    // The listed names are `<upstream>__<tool>`: an upstream `a__b` (or `a_`) and one named
    // `a` would list the same name for two tools.
    if name.contains("__") || name.ends_with('_') {
        return Err(format!(
            "{name:?} holds \"__\" or ends with \"_\", which would make its tools' listed \
             names (<upstream>__<tool>) those of another upstream's; use single _ or -"
        ));
    }
    Ok(())
}

/// Checks that `url` is an `http` or `https` URL with a host. The problem quotes the URL
/// with its user information redacted.
pub(crate) fn check_http_url(url: &str) -> Result<(), String> {
    let shown = redact_url(url);
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(format!(
            "{shown:?} is not a URL; write it as http://host:port/path or https://…"
        ));
    };
    if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
        return Err(format!(
            "{shown:?} is not an http or https URL; the gateway speaks streamable HTTP only"
        ));
    }
    let host = host_of(rest);
    if host.is_empty() {
        return Err(format!("{shown:?} has no host"));
    }
    if !has_numeric_port(host) {
        // Not quoted: `user:password` without an `@` reads as a host and a port.
        return Err("has a port that is not a number; write it as http://host:port/path".into());
    }
    Ok(())
}

/// The host (and port) of what follows `scheme://`.
fn host_of(rest: &str) -> &str {
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = authority.rsplit('@').next().unwrap_or("");
    if host.starts_with(':') {
        ""
    } else {
        host
    }
}

/// `false` when `host` (`name`, `name:port`, `[v6]` or `[v6]:port`) has a port that is not a
/// number.
fn has_numeric_port(host: &str) -> bool {
    match host.rsplit_once(':') {
        Some(_) if host.ends_with(']') => true,
        Some((_, port)) => port.parse::<u16>().is_ok(),
        None => true,
    }
}

/// Checks a Redis URL. The problem never quotes the URL, which may hold a password.
fn check_redis_url(url: &str) -> Result<(), String> {
    const USE: &str = "write it as redis://[:password@]host[:port][/db] (or rediss://, \
                       redis+unix://, unix://)";
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(format!("is not a URL; {USE}"));
    };
    match scheme {
        "redis" | "rediss" => {
            let host = host_of(rest);
            if host.is_empty() {
                return Err(format!("has no host; {USE}"));
            }
            if !has_numeric_port(host) {
                return Err(format!("has a port that is not a number; {USE}"));
            }
            Ok(())
        }
        "redis+unix" | "unix" => {
            if rest.is_empty() {
                Err(format!("has no socket path; {USE}"))
            } else {
                Ok(())
            }
        }
        _ => Err(format!("has a scheme other than redis or rediss; {USE}")),
    }
}

/// `true` for a name a program can read from its environment: `[A-Za-z_][A-Za-z0-9_]*`.
pub(crate) fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `true` for an HTTP header name (an RFC 9110 token).
pub(crate) fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// `true` for a header value an HTTP client can send: visible ASCII, spaces and tabs.
pub(crate) fn is_header_value(value: &str) -> bool {
    value
        .bytes()
        .all(|b| b == b'\t' || (b' '..=b'~').contains(&b))
}

/// The path of `key` inside `prefix`; keys that are not bare TOML keys are quoted.
pub(crate) fn key_path(prefix: &str, key: &str) -> String {
    let bare = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    let key: Cow<'_, str> = if bare {
        Cow::Borrowed(key)
    } else {
        Cow::Owned(format!("{key:?}"))
    };
    if prefix.is_empty() {
        key.into_owned()
    } else {
        format!("{prefix}.{key}")
    }
}

/// What a TOML value is, for problems.
pub(crate) fn kind(value: &Value) -> &'static str {
    match value {
        Value::String(_) => "a string",
        Value::Integer(_) => "an integer",
        Value::Float(_) => "a float",
        Value::Boolean(_) => "a boolean",
        Value::Datetime(_) => "a date-time",
        Value::Array(_) => "an array",
        Value::Table(_) => "a table",
    }
}

/// Walks the loose TOML and collects every problem.
#[derive(Default)]
pub(crate) struct Checker {
    problems: Vec<ConfigError>,
}

impl Checker {
    pub(crate) fn add(&mut self, field: impl Into<String>, problem: impl Into<String>) {
        self.problems.push(ConfigError::new(field, problem));
    }

    /// Every key of `table` that is not in `allowed` is a problem.
    pub(crate) fn known_keys(&mut self, table: &Table, prefix: &str, allowed: &[&str]) {
        for key in table.keys() {
            if allowed.contains(&key.as_str()) {
                continue;
            }
            let field = key_path(prefix, key);
            if prefix == "admin" && key == "token" {
                self.add(
                    field,
                    "unknown field; the token never goes in the file: put it in an environment \
                     variable and name that variable with token_env",
                );
            } else {
                self.add(
                    field,
                    format!("unknown field; expected one of {}", allowed.join(", ")),
                );
            }
        }
    }

    pub(crate) fn table<'a>(
        &mut self,
        parent: &'a Table,
        prefix: &str,
        key: &str,
    ) -> Option<&'a Table> {
        match parent.get(key)? {
            Value::Table(t) => Some(t),
            other => {
                self.add(
                    key_path(prefix, key),
                    format!("must be a table, got {}", kind(other)),
                );
                None
            }
        }
    }

    pub(crate) fn string<'a>(
        &mut self,
        parent: &'a Table,
        prefix: &str,
        key: &str,
    ) -> Option<&'a str> {
        match parent.get(key)? {
            Value::String(s) => Some(s),
            other => {
                self.add(
                    key_path(prefix, key),
                    format!("must be a string, got {}", kind(other)),
                );
                None
            }
        }
    }

    /// A string that must not be empty.
    pub(crate) fn text<'a>(
        &mut self,
        parent: &'a Table,
        prefix: &str,
        key: &str,
    ) -> Option<&'a str> {
        let s = self.string(parent, prefix, key)?;
        if s.is_empty() {
            self.add(key_path(prefix, key), "must not be empty");
            return None;
        }
        Some(s)
    }

    pub(crate) fn boolean(&mut self, parent: &Table, prefix: &str, key: &str) -> Option<bool> {
        match parent.get(key)? {
            Value::Boolean(b) => Some(*b),
            other => {
                self.add(
                    key_path(prefix, key),
                    format!("must be true or false, got {}", kind(other)),
                );
                None
            }
        }
    }

    /// A count of things, from 1 to a million.
    pub(crate) fn count(&mut self, parent: &Table, prefix: &str, key: &str) -> Option<usize> {
        match parent.get(key)? {
            Value::Integer(n) if (1..=1_000_000).contains(n) => usize::try_from(*n).ok(),
            Value::Integer(n) => {
                self.add(
                    key_path(prefix, key),
                    format!("must be from 1 to 1000000, got {n}"),
                );
                None
            }
            other => {
                self.add(
                    key_path(prefix, key),
                    format!("must be a whole number, got {}", kind(other)),
                );
                None
            }
        }
    }

    /// A timeout in milliseconds, from 1 ms to one hour.
    pub(crate) fn millis(&mut self, parent: &Table, prefix: &str, key: &str) -> Option<Duration> {
        let field = key_path(prefix, key);
        match parent.get(key)? {
            Value::Integer(ms) if (1..=MAX_TIMEOUT_MS).contains(ms) => {
                Some(Duration::from_millis(ms.unsigned_abs()))
            }
            Value::Integer(ms) => {
                self.add(
                    field,
                    format!("must be from 1 to {MAX_TIMEOUT_MS} milliseconds (one hour), got {ms}"),
                );
                None
            }
            other => {
                self.add(
                    field,
                    format!(
                        "must be a whole number of milliseconds, got {}",
                        kind(other)
                    ),
                );
                None
            }
        }
    }

    fn gateway(&mut self, root: &Table) -> GatewayConfig {
        self.known_keys(root, "", TOP_KEYS);

        let listen = self.string(root, "", "listen").and_then(|s| {
            s.parse::<SocketAddr>()
                .map_err(|_| {
                    self.add(
                        "listen",
                        format!(
                            "{s:?} is not a socket address; write an IP address and a port, \
                             such as \"127.0.0.1:8080\" or \"[::1]:8080\""
                        ),
                    );
                })
                .ok()
        });

        let log_format = match self.string(root, "", "log_format") {
            None | Some("text") => LogFormat::Text,
            Some("json") => LogFormat::Json,
            Some(other) => {
                self.add(
                    "log_format",
                    format!("must be \"text\" or \"json\", got {other:?}"),
                );
                LogFormat::Text
            }
        };

        let mut admin_token_env = None;
        if let Some(admin) = self.table(root, "", "admin") {
            self.known_keys(admin, "admin", ADMIN_KEYS);
            if let Some(name) = self.string(admin, "admin", "token_env") {
                if is_env_name(name) {
                    admin_token_env = Some(name.to_owned());
                } else {
                    self.add(
                        "admin.token_env",
                        format!(
                            "{name:?} is not an environment variable name; use letters, digits \
                             and _, not starting with a digit (the token itself goes in that \
                             variable, never in the file)"
                        ),
                    );
                }
            }
        }

        let mut redis = None;
        if let Some(store) = self.table(root, "", "store") {
            self.known_keys(store, "store", STORE_KEYS);
            if let Some(url) = self.string(store, "store", "redis") {
                match check_redis_url(url) {
                    Ok(()) => redis = Some(RedisTarget::node(url)),
                    Err(problem) => self.add("store.redis", problem),
                }
            }
            if store.contains_key("cluster") {
                let seeds = self.string_list(store, "store", "cluster");
                let mut good = Vec::new();
                for (i, seed) in seeds.iter().enumerate() {
                    match check_redis_url(seed) {
                        Ok(()) => good.push(seed.as_str()),
                        Err(problem) => self.add(format!("store.cluster[{i}]"), problem),
                    }
                }
                if redis.is_some() {
                    self.add(
                        "store.cluster",
                        "is given with store.redis; keep one: redis for one node, cluster for \
                         the URLs of some nodes of a Redis Cluster",
                    );
                } else if seeds.is_empty() && store.get("cluster").is_some_and(Value::is_array) {
                    self.add(
                        "store.cluster",
                        "is empty; list the URLs of some nodes of the cluster, such as \
                         [\"redis://10.0.0.1:6379\", \"redis://10.0.0.2:6379\"]",
                    );
                } else if good.len() == seeds.len() && !seeds.is_empty() {
                    redis = Some(RedisTarget::cluster(good));
                }
            }
        }

        let mut audit_path = None;
        if let Some(audit) = self.table(root, "", "audit") {
            self.known_keys(audit, "audit", AUDIT_KEYS);
            audit_path = self.text(audit, "audit", "path").map(PathBuf::from);
        }

        let upstreams = self.upstreams(root);
        let auth = self.auth(root);
        let http = self.http(root);
        let servers = self.servers(root);

        let policy = match root.get("policy") {
            None => None,
            Some(Value::Table(table)) => self.policy(table),
            Some(other) => {
                self.add(
                    "policy",
                    format!(
                        "must be a table in the format of a tool registry file, got {}",
                        kind(other)
                    ),
                );
                None
            }
        };

        GatewayConfig {
            listen,
            log_format,
            admin_token_env,
            redis,
            audit_path,
            upstreams,
            policy,
            auth,
            http,
            servers,
            warnings: Vec::new(),
        }
    }

    /// The tables of the array of tables `key` of `parent` (`[[key]]`), each with its field
    /// (`prefix.key[i]`); anything else is a problem saying how to write one `what`.
    pub(crate) fn tables<'a>(
        &mut self,
        parent: &'a Table,
        prefix: &str,
        key: &str,
        what: &str,
    ) -> Vec<(usize, String, &'a Table)> {
        let path = key_path(prefix, key);
        let items = match parent.get(key) {
            None => return Vec::new(),
            Some(Value::Array(items)) => items,
            Some(other) => {
                self.add(
                    path.clone(),
                    format!(
                        "must be an array of tables (write each {what} as [[{path}]]), got {}",
                        kind(other)
                    ),
                );
                return Vec::new();
            }
        };
        let mut tables = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let field = format!("{path}[{i}]");
            match item {
                Value::Table(table) => tables.push((i, field, table)),
                other => self.add(
                    field,
                    format!(
                        "must be a table (write each {what} as [[{path}]]), got {}",
                        kind(other)
                    ),
                ),
            }
        }
        tables
    }

    fn upstreams(&mut self, root: &Table) -> Vec<UpstreamConfig> {
        let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
        let mut upstreams = Vec::new();
        for (i, field, table) in self.tables(root, "", "upstreams", "upstream") {
            if let Some(Value::String(name)) = table.get("name") {
                if is_upstream_name(name) {
                    if let Some(first) = seen.get(name.as_str()) {
                        self.add(
                            format!("{field}.name"),
                            format!(
                                "{name:?} is already the name of upstreams[{first}]; give each \
                                 upstream its own name"
                            ),
                        );
                    } else {
                        seen.insert(name, i);
                    }
                }
            }
            if let Some(upstream) = self.upstream(table, &field) {
                upstreams.push(upstream);
            }
        }
        upstreams
    }

    fn upstream(&mut self, table: &Table, field: &str) -> Option<UpstreamConfig> {
        self.known_keys(table, field, UPSTREAM_KEYS);

        let name = match self.string(table, field, "name") {
            None if !table.contains_key("name") => {
                self.add(
                    format!("{field}.name"),
                    "is required; name the upstream with 1 to 32 characters a-z, 0-9, _ or - \
                     (it becomes the namespace of its tools)",
                );
                None
            }
            None => None,
            Some(name) => match check_name(name) {
                Ok(()) => Some(name.to_owned()),
                Err(problem) => {
                    self.add(format!("{field}.name"), problem);
                    None
                }
            },
        };

        let has_command = table.contains_key("command");
        let has_url = table.contains_key("url");
        match (has_command, has_url) {
            (true, true) => self.add(
                field,
                "has both command and url; keep command for a stdio server the gateway \
                 launches, or url for a streamable HTTP server",
            ),
            (false, false) => self.add(
                field,
                "needs command (a stdio server the gateway launches) or url (a streamable HTTP \
                 server)",
            ),
            (true, false) => {
                for key in HTTP_ONLY_KEYS {
                    if table.contains_key(*key) {
                        let hint = if key.starts_with("headers") {
                            " (a command upstream takes env)"
                        } else {
                            ""
                        };
                        self.add(
                            key_path(field, key),
                            format!("only applies to a url upstream; remove it{hint}"),
                        );
                    }
                }
            }
            (false, true) => {
                for key in STDIO_ONLY_KEYS {
                    if table.contains_key(*key) {
                        self.add(
                            key_path(field, key),
                            "only applies to a command upstream; remove it",
                        );
                    }
                }
            }
        }

        let command = self.text(table, field, "command");
        let args = self.string_list(table, field, "args");
        let env = self.env(table, field);
        let cwd = self.text(table, field, "cwd").map(PathBuf::from);
        let url = self
            .string(table, field, "url")
            .and_then(|url| match check_http_url(url) {
                Ok(()) => Some(url),
                Err(problem) => {
                    self.add(key_path(field, "url"), problem);
                    None
                }
            });
        let headers = self.headers(table, field);

        let trust = match self.string(table, field, "trust") {
            None | Some("untrusted") => Trust::Untrusted,
            Some("trusted") => Trust::Trusted,
            Some(other) => {
                self.add(
                    key_path(field, "trust"),
                    format!("must be \"trusted\" or \"untrusted\", got {other:?}"),
                );
                Trust::Untrusted
            }
        };
        let timeout = self
            .millis(table, field, "timeout_ms")
            .unwrap_or(DEFAULT_TIMEOUT);
        let startup_timeout = self
            .millis(table, field, "startup_timeout_ms")
            .unwrap_or(DEFAULT_STARTUP_TIMEOUT);
        let required = self.boolean(table, field, "required").unwrap_or(true);
        let keep_alive = self.boolean(table, field, "keep_alive").unwrap_or(true);
        let file = |this: &mut Self, key| this.text(table, field, key).map(PathBuf::from);
        let (ca, cert, key) = (
            file(self, "tls_ca_file"),
            file(self, "tls_cert_file"),
            file(self, "tls_key_file"),
        );
        let tls = UpstreamTls::read(ca.as_deref(), cert.as_deref(), key.as_deref()).unwrap_or_else(
            |(key, problem)| {
                self.add(key_path(field, key), problem);
                UpstreamTls::default()
            },
        );
        let max_message_bytes = self
            .message_bytes(table, field)
            .unwrap_or(DEFAULT_MAX_MESSAGE_BYTES);

        let transport = match (command, url) {
            (Some(command), None) if !has_url => UpstreamTransport::Stdio {
                command: command.to_owned(),
                args,
                env,
                cwd,
            },
            (None, Some(url)) if !has_command => UpstreamTransport::Http {
                url: url.to_owned(),
                headers,
            },
            _ => return None,
        };
        Some(UpstreamConfig {
            name: name?,
            transport,
            trust,
            timeout,
            startup_timeout,
            required,
            max_message_bytes,
            max_in_flight: DEFAULT_MAX_CALLS_IN_FLIGHT,
            keep_alive,
            tls,
        })
    }

    /// `max_message_bytes` of an upstream: from 64 KiB to 1 GiB.
    fn message_bytes(&mut self, table: &Table, prefix: &str) -> Option<usize> {
        const BOUNDS: std::ops::RangeInclusive<i64> = (64 << 10)..=(1 << 30);
        match table.get("max_message_bytes")? {
            Value::Integer(n) if BOUNDS.contains(n) => usize::try_from(*n).ok(),
            other => {
                let got = match other {
                    Value::Integer(n) => n.to_string(),
                    other => kind(other).to_owned(),
                };
                self.add(
                    key_path(prefix, "max_message_bytes"),
                    format!("must be a number of bytes from 65536 (64 KiB) to 1073741824 (1 GiB), got {got}"),
                );
                None
            }
        }
    }

    pub(crate) fn string_list(&mut self, table: &Table, prefix: &str, key: &str) -> Vec<String> {
        let field = key_path(prefix, key);
        match table.get(key) {
            None => Vec::new(),
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .filter_map(|(i, item)| match item {
                    Value::String(s) => Some(s.clone()),
                    other => {
                        self.add(
                            format!("{field}[{i}]"),
                            format!(
                                "must be a string, got {} (quote numbers: \"8080\")",
                                kind(other)
                            ),
                        );
                        None
                    }
                })
                .collect(),
            Some(other) => {
                self.add(
                    field,
                    format!("must be an array of strings, got {}", kind(other)),
                );
                Vec::new()
            }
        }
    }

    fn env(&mut self, table: &Table, prefix: &str) -> BTreeMap<String, String> {
        let mut env = BTreeMap::new();
        let Some(vars) = self.table(table, prefix, "env") else {
            return env;
        };
        let field = key_path(prefix, "env");
        for (name, value) in vars {
            let var_field = key_path(&field, name);
            if name.is_empty() || name.contains(['=', '\0']) {
                self.add(
                    var_field.clone(),
                    "is not an environment variable name; it must not be empty or hold = or NUL",
                );
            }
            match value {
                Value::String(s) if s.contains('\0') => {
                    self.add(var_field, "must not hold a NUL character");
                }
                Value::String(s) => {
                    env.insert(name.clone(), s.clone());
                }
                other => self.add(
                    var_field,
                    format!(
                        "must be a string, got {} (quote numbers and booleans)",
                        kind(other)
                    ),
                ),
            }
        }
        env
    }

    /// `headers` (values in the file) and `headers_env` (values read from the gateway's
    /// environment, by the variable each names, so that a credential stays out of the file).
    fn headers(&mut self, table: &Table, prefix: &str) -> BTreeMap<String, Secret> {
        let mut headers = self.header_table(table, prefix, "headers", |value| match value {
            Value::String(value) => Ok(value.clone()),
            other => Err(format!("must be a string, got {}", kind(other))),
        });
        let from_env = self.header_table(table, prefix, "headers_env", |value| match value {
            Value::String(var) => std::env::var(var).map_err(|_| {
                format!("the variable {var} is not set (or not UTF-8); set it to the value")
            }),
            other => Err(format!(
                "must be the name of an environment variable, got {}",
                kind(other)
            )),
        });
        headers.extend(from_env);
        headers
    }

    /// The headers of the table `key`, each value given by `value_of`.
    fn header_table(
        &mut self,
        table: &Table,
        prefix: &str,
        key: &str,
        value_of: impl Fn(&Value) -> Result<String, String>,
    ) -> BTreeMap<String, Secret> {
        let mut headers = BTreeMap::new();
        let Some(values) = self.table(table, prefix, key) else {
            return headers;
        };
        let field = key_path(prefix, key);
        for (name, value) in values {
            let header_field = key_path(&field, name);
            if !is_header_name(name) {
                self.add(
                    header_field.clone(),
                    "is not an HTTP header name; use letters, digits and -",
                );
            }
            match value_of(value) {
                // The value is never quoted: it usually holds a credential.
                Ok(value) if !is_header_value(&value) => self.add(
                    header_field,
                    "has a value an HTTP header cannot carry; use visible ASCII characters and \
                     spaces only",
                ),
                Ok(value) => {
                    headers.insert(name.clone(), Secret::opaque(value));
                }
                Err(problem) => self.add(header_field, problem),
            }
        }
        headers
    }

    /// The `[policy]` table, read by the tool registry's own loader.
    fn policy(&mut self, table: &Table) -> Option<ToolRegistry> {
        match ToolRegistry::from_toml_table(table) {
            Ok(registry) => {
                // A name is matched as it is: `*` would register a tool no server has.
                let before = self.problems.len();
                let entries = match table.get("tools") {
                    Some(Value::Array(entries)) => entries.as_slice(),
                    _ => &[],
                };
                for (i, entry) in entries.iter().enumerate() {
                    let (Some(Value::String(name)), Some(Value::String(namespace))) =
                        (entry.get("name"), entry.get("namespace"))
                    else {
                        continue;
                    };
                    if name.contains('*') {
                        self.add(
                            format!("policy.tools[{i}].name"),
                            format!(
                                "{name:?} names no tool: a tool's name is matched as it is; set \
                                 a policy for every tool of a server in [servers.{namespace}]"
                            ),
                        );
                    }
                }
                (self.problems.len() == before).then_some(registry)
            }
            Err(e) => {
                self.problems.push(e.within("policy"));
                None
            }
        }
    }
}

/// Every problem of the configuration `text`, which must be invalid, as `field: problem`,
/// sorted (so that the order of map keys does not matter).
#[cfg(test)]
pub(crate) fn problem_lines(text: &str) -> Vec<String> {
    let problems = GatewayConfig::from_toml_str(text).expect_err("the configuration is invalid");
    tests::lines(&problems)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: &str = include_str!("../tests/fixtures/gateway.toml");

    /// Every problem as `field: problem`, sorted, so that the order of map keys does not
    /// matter.
    pub(super) fn lines(problems: &ConfigProblems) -> Vec<String> {
        let mut lines: Vec<String> = problems
            .0
            .iter()
            .map(|p| format!("{}: {}", p.field(), p.problem()))
            .collect();
        lines.sort();
        lines
    }

    fn rejected(text: &str) -> ConfigProblems {
        GatewayConfig::from_toml_str(text).expect_err("the configuration is invalid")
    }

    #[test]
    fn a_full_configuration_is_read() {
        let config = GatewayConfig::from_toml_str(FULL).unwrap();
        assert_eq!(config.listen, Some("127.0.0.1:8080".parse().unwrap()));
        assert_eq!(config.log_format, LogFormat::Json);
        assert_eq!(
            config.admin_token_env.as_deref(),
            Some("TOOLCALL_ADMIN_TOKEN")
        );
        assert_eq!(
            config.redis.as_ref().and_then(|store| match store {
                RedisTarget::Node(url) => Some(url.as_str()),
                _ => None,
            }),
            Some("redis://:secret@127.0.0.1:6379/0")
        );
        assert_eq!(config.audit_path, Some(PathBuf::from("audit")));
        assert_eq!(config.upstreams.len(), 3);

        let time = &config.upstreams[0];
        assert_eq!(time.name, "time");
        assert_eq!(
            time.transport,
            UpstreamTransport::Stdio {
                command: "uvx".into(),
                args: vec!["mcp-server-time".into()],
                env: BTreeMap::from([("TZ".into(), "UTC".into())]),
                cwd: Some(PathBuf::from("/srv/time")),
            }
        );
        assert_eq!(time.trust, Trust::Trusted);
        assert_eq!(time.timeout, Duration::from_millis(15_000));
        assert_eq!(time.startup_timeout, Duration::from_millis(60_000));
        assert!(!time.required);

        let search = &config.upstreams[1];
        assert_eq!(search.name, "search");
        let UpstreamTransport::Http { url, headers } = &search.transport else {
            panic!("search is an HTTP upstream: {:?}", search.transport);
        };
        assert_eq!(url, "http://127.0.0.1:9000/mcp");
        assert_eq!(headers["Authorization"].expose(), "Bearer xyz");
        assert_eq!(search.trust, Trust::Untrusted);
        assert_eq!(search.timeout, DEFAULT_TIMEOUT);
        assert_eq!(search.startup_timeout, DEFAULT_STARTUP_TIMEOUT);
        assert!(search.required);

        assert_eq!(config.upstreams[2].name, "notes_2-b");
        assert_eq!(
            config.upstream("search").map(|u| &u.name),
            Some(&"search".to_owned())
        );

        let policy = config.policy.expect("a policy");
        let tool = policy.get("time", "get_current_time").expect("registered");
        assert!(tool.descriptor().idempotent);
        assert_eq!(policy.len(), 1);
    }

    #[test]
    fn defaults_and_the_empty_configuration() {
        let config = GatewayConfig::from_toml_str("").unwrap();
        assert_eq!(config.listen, None);
        assert_eq!(config.log_format, LogFormat::Text);
        assert!(config.admin_token_env.is_none() && config.redis.is_none());
        assert!(config.audit_path.is_none() && config.policy.is_none());
        assert!(config.upstreams.is_empty());

        let empty = GatewayConfig::empty();
        assert!(empty.upstreams.is_empty() && empty.listen.is_none());
        assert_eq!(empty.log_format, LogFormat::Text);

        let one = GatewayConfig::from_toml_str(
            "listen = \"[::1]:9\"\n[[upstreams]]\nname = \"a\"\ncommand = \"a\"\n",
        )
        .unwrap();
        assert_eq!(one.listen, Some("[::1]:9".parse().unwrap()));
        let a = &one.upstreams[0];
        assert_eq!(a.trust, Trust::Untrusted);
        assert_eq!(
            (a.timeout, a.startup_timeout, a.required),
            (DEFAULT_TIMEOUT, DEFAULT_STARTUP_TIMEOUT, true)
        );
    }

    #[test]
    fn every_broken_rule_is_named_by_its_field() {
        let text = r#"
            listen = "localhost:8080"
            log_format = "yaml"
            colour = true

            [admin]
            token_env = "1TOKEN"
            token = "do-not-echo-admin-token"

            [store]
            redis = "mysql://user:hunter2@db:3306"

            [audit]
            path = ""

            [[upstreams]]
            name = "Time"
            comand = "uvx"
            command = "uvx"
            url = "http://x/mcp"
            timeout_ms = 0

            [[upstreams]]
            name = "search"
            url = "ftp://files.example.com/mcp"
            args = ["--port", 8080]
            cwd = "/tmp"
            headers = { "Bad Header" = "x", Authorization = 42 }
            trust = "maybe"
            startup_timeout_ms = 3600001
            required = "yes"
            max_message_bytes = 1048576
            keep_alive = "no"

            [[upstreams]]
            name = "search"
            command = "srv"
            headers = { X = "y" }
            env = { PORT = 8080, "A=B" = "c" }
            timeout_ms = 1.5
            max_message_bytes = 100
            keep_alive = false

            [[upstreams]]
            args = "one"

            [[upstreams]]
            name = "this-name-is-far-too-long-for-an-upstream"
            command = ""

            [policy]
            [[policy.tools]]
            namespace = "time"
            name = "get_current_time"
            risk = "dangerous"
        "#;
        let problems = rejected(text);
        let expected = [
            "admin.token: unknown field; the token never goes in the file: put it in an \
             environment variable and name that variable with token_env",
            "admin.token_env: \"1TOKEN\" is not an environment variable name; use letters, \
             digits and _, not starting with a digit (the token itself goes in that variable, \
             never in the file)",
            "audit.path: must not be empty",
            "colour: unknown field; expected one of listen, log_format, admin, store, audit, \
             upstreams, policy, auth, http, servers",
            "listen: \"localhost:8080\" is not a socket address; write an IP address and a \
             port, such as \"127.0.0.1:8080\" or \"[::1]:8080\"",
            "log_format: must be \"text\" or \"json\", got \"yaml\"",
            "policy.tools[0].risk: unknown variant `dangerous`, expected one of `read-only`, \
             `writes`, `commands`",
            "store.redis: has a scheme other than redis or rediss; write it as \
             redis://[:password@]host[:port][/db] (or rediss://, redis+unix://, unix://)",
            "upstreams[0].comand: unknown field; expected one of name, command, args, env, \
             cwd, url, headers, headers_env, trust, timeout_ms, startup_timeout_ms, required, \
             max_message_bytes, keep_alive, tls_ca_file, tls_cert_file, tls_key_file",
            "upstreams[0].name: \"Time\" has the character 'T'; use only a-z, 0-9, _ and -",
            "upstreams[0].timeout_ms: must be from 1 to 3600000 milliseconds (one hour), got 0",
            "upstreams[0]: has both command and url; keep command for a stdio server the \
             gateway launches, or url for a streamable HTTP server",
            "upstreams[1].args: only applies to a command upstream; remove it",
            "upstreams[1].args[1]: must be a string, got an integer (quote numbers: \"8080\")",
            "upstreams[1].cwd: only applies to a command upstream; remove it",
            "upstreams[1].headers.\"Bad Header\": is not an HTTP header name; use letters, \
             digits and -",
            "upstreams[1].headers.Authorization: must be a string, got an integer",
            "upstreams[1].keep_alive: must be true or false, got a string",
            "upstreams[1].max_message_bytes: only applies to a command upstream; remove it",
            "upstreams[1].required: must be true or false, got a string",
            "upstreams[1].startup_timeout_ms: must be from 1 to 3600000 milliseconds (one \
             hour), got 3600001",
            "upstreams[1].trust: must be \"trusted\" or \"untrusted\", got \"maybe\"",
            "upstreams[1].url: \"ftp://files.example.com/mcp\" is not an http or https URL; \
             the gateway speaks streamable HTTP only",
            "upstreams[2].env.\"A=B\": is not an environment variable name; it must not be \
             empty or hold = or NUL",
            "upstreams[2].env.PORT: must be a string, got an integer (quote numbers and \
             booleans)",
            "upstreams[2].headers: only applies to a url upstream; remove it (a command \
             upstream takes env)",
            "upstreams[2].keep_alive: only applies to a url upstream; remove it",
            "upstreams[2].max_message_bytes: must be a number of bytes from 65536 (64 KiB) to \
             1073741824 (1 GiB), got 100",
            "upstreams[2].name: \"search\" is already the name of upstreams[1]; give each \
             upstream its own name",
            "upstreams[2].timeout_ms: must be a whole number of milliseconds, got a float",
            "upstreams[3].args: must be an array of strings, got a string",
            "upstreams[3].name: is required; name the upstream with 1 to 32 characters a-z, \
             0-9, _ or - (it becomes the namespace of its tools)",
            "upstreams[3]: needs command (a stdio server the gateway launches) or url (a \
             streamable HTTP server)",
            "upstreams[4].command: must not be empty",
            "upstreams[4].name: is 41 characters long; use at most 32",
        ];
        assert_eq!(lines(&problems), expected);

        let shown = problems.to_string();
        assert_eq!(shown.lines().count(), expected.len());
        assert!(shown.contains("\nupstreams[0].comand: unknown field; expected one of name,"));
        assert!(!shown.contains("hunter2") && !shown.contains("do-not-echo-admin-token"));
    }

    #[test]
    fn wrong_types_of_tables_are_named() {
        let problems = rejected(
            "admin = 1\nstore = \"redis\"\naudit = []\nupstreams = { name = \"x\" }\npolicy = 3\n",
        );
        assert_eq!(
            lines(&problems),
            [
                "admin: must be a table, got an integer",
                "audit: must be a table, got an array",
                "policy: must be a table in the format of a tool registry file, got an integer",
                "store: must be a table, got a string",
                "upstreams: must be an array of tables (write each upstream as [[upstreams]]), \
                 got a table",
            ]
        );
        let problems = rejected("upstreams = [1]\n");
        assert_eq!(
            lines(&problems),
            [
                "upstreams[0]: must be a table (write each upstream as [[upstreams]]), got an \
              integer"
            ]
        );
    }

    #[test]
    fn secrets_never_print() {
        let redis = Secret::url("redis://:hunter2@127.0.0.1:6379/0");
        assert_eq!(redis.to_string(), "redis://***@127.0.0.1:6379/0");
        assert_eq!(
            format!("{redis:?}"),
            "Secret(\"redis://***@127.0.0.1:6379/0\")"
        );
        assert_eq!(redis.expose(), "redis://:hunter2@127.0.0.1:6379/0");
        assert_eq!(
            Secret::url("rediss://user:p@ss/w@host/0").to_string(),
            "rediss://***@host/0"
        );
        assert_eq!(
            Secret::url("redis://127.0.0.1:6379/").to_string(),
            "redis://127.0.0.1:6379/"
        );
        assert_eq!(Secret::url("user:hunter2@host").to_string(), "***");
        assert_eq!(
            redact_url("https://mcp.example.com/sse?api_key=hunter2&region=eu#top"),
            "https://mcp.example.com/sse?api_key=***&region=***#top"
        );
        assert_eq!(
            redact_url("http://me:hunter2@h/mcp?hunter2"),
            "http://***@h/mcp?***"
        );
        let bad_port = check_http_url("http://h:x/mcp?key=hunter2").unwrap_err();
        assert!(!bad_port.contains("hunter2"), "{bad_port}");
        let not_http = check_http_url("ftp://h/mcp?key=hunter2").unwrap_err();
        assert!(!not_http.contains("hunter2"), "{not_http}");
        let header = Secret::opaque("Bearer hunter2");
        assert_eq!(
            (header.to_string(), format!("{header:?}")),
            ("***".into(), "Secret(\"***\")".into())
        );

        let config = GatewayConfig::from_toml_str(
            r#"
            [store]
            redis = "redis://:hunter2@127.0.0.1:6379/0"
            [[upstreams]]
            name = "a"
            url = "https://me:hunter2@example.com/mcp"
            headers = { Authorization = "Bearer hunter2" }
            [[upstreams]]
            name = "b"
            command = "srv"
            env = { API_KEY = "hunter2" }
            "#,
        )
        .unwrap();
        let debug = format!("{config:?}");
        assert!(!debug.contains("hunter2"), "{debug}");
        // A header from the environment is a secret too, and a missing variable a problem.
        std::env::set_var("TOOLCALL_TEST_UPSTREAM_TOKEN", "Bearer hunter3");
        let from_env = GatewayConfig::from_toml_str(
            "[[upstreams]]\nname = \"a\"\nurl = \"http://h/mcp\"\n\
             headers_env = { Authorization = \"TOOLCALL_TEST_UPSTREAM_TOKEN\" }\n",
        )
        .unwrap();
        let UpstreamTransport::Http { headers, .. } = &from_env.upstreams[0].transport else {
            panic!("an http upstream");
        };
        assert_eq!(headers["Authorization"].expose(), "Bearer hunter3");
        assert!(!format!("{from_env:?}").contains("hunter3"));
        let missing = rejected(
            "[[upstreams]]\nname = \"a\"\nurl = \"http://h/mcp\"\n\
             headers_env = { X-Key = \"TOOLCALL_TEST_UNSET_VARIABLE\" }\n",
        );
        assert_eq!(
            lines(&missing),
            ["upstreams[0].headers_env.X-Key: the variable TOOLCALL_TEST_UNSET_VARIABLE is not set (or not UTF-8); set it to the value"]
        );
        assert!(debug.contains("redis://***@127.0.0.1:6379/0"), "{debug}");
        assert!(debug.contains("https://***@example.com/mcp"), "{debug}");
        assert!(debug.contains("\"API_KEY\": ***"), "{debug}");
    }

    #[test]
    fn a_bad_redis_url_never_echoes_its_password() {
        for (url, problem) in [
            ("redis//:hunter2@host", "is not a URL"),
            (
                "http://:hunter2@host",
                "has a scheme other than redis or rediss",
            ),
            ("redis://:hunter2", "has no host"),
            ("redis://:hunter2@", "has no host"),
            (
                "redis://:hunter2@host:port",
                "has a port that is not a number",
            ),
            ("unix://", "has no socket path"),
        ] {
            let problems = rejected(&format!("[store]\nredis = {url:?}\n"));
            assert_eq!(problems.0.len(), 1, "{url}");
            assert_eq!(problems.0[0].field(), "store.redis");
            assert!(
                problems.0[0].problem().starts_with(problem),
                "{url}: {problems}"
            );
            assert!(!problems.to_string().contains("hunter2"), "{problems}");
        }
        for url in [
            "rediss://h",
            "redis://[::1]:6379/0",
            "redis+unix:///tmp/r.sock",
        ] {
            GatewayConfig::from_toml_str(&format!("[store]\nredis = {url:?}\n")).unwrap();
        }
    }

    #[test]
    fn a_syntax_error_names_its_place_without_quoting_the_line() {
        let problems =
            rejected("listen = \"127.0.0.1:1\"\n[store]\nredis = \"redis://:hunter2@h\n");
        assert_eq!(
            problems.to_string(),
            "is not valid TOML: invalid basic string, expected `\"` (line 3, column 28)"
        );
        assert_eq!(problems.0[0].field(), "");
        assert_eq!(
            rejected("a = 1\na = 2\n").to_string(),
            "is not valid TOML: duplicate key (line 2, column 1)"
        );
    }

    #[test]
    fn policy_problems_are_prefixed() {
        let problem = |text: &str| {
            let problems = rejected(text);
            assert_eq!(problems.0.len(), 1, "{problems}");
            problems.to_string()
        };
        assert_eq!(
            problem("[policy]\nopen = \"yes\"\n"),
            "policy.open: invalid type: string \"yes\", expected a boolean"
        );
        assert_eq!(
            problem("[policy]\nunknown = 1\n"),
            "policy.unknown: unknown field `unknown`, expected one of `open`, `denied`, \
             `unregistered`, `tools`"
        );
        assert_eq!(
            problem(
                "[policy]\n[[policy.tools]]\nnamespace = \"t\"\nname = \"x\"\n\
                 risk = \"read-only\"\n[policy.tools.policy]\nretry = { max_attempts = 0 }\n"
            ),
            "policy.tools[0].policy.retry.max_attempts: must be at least 1, got 0"
        );
        // An empty table is a closed registry without tools.
        let config = GatewayConfig::from_toml_str("[policy]\n").unwrap();
        let policy = config.policy.unwrap();
        assert!(policy.is_empty() && !policy.is_open());
    }

    #[test]
    fn an_unreadable_file_is_one_problem_naming_it() {
        let path = Path::new("/nonexistent/gateway.toml");
        let problems = GatewayConfig::from_path(path).unwrap_err();
        assert_eq!(problems.0.len(), 1);
        assert_eq!(problems.0[0].field(), "/nonexistent/gateway.toml");
        assert!(problems
            .to_string()
            .starts_with("/nonexistent/gateway.toml: cannot be read ("));

        let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gateway.toml");
        assert_eq!(
            GatewayConfig::from_path(&fixture).unwrap().upstreams.len(),
            3
        );
    }

    fn imported(name: &str, url: &str) -> UpstreamConfig {
        UpstreamConfig {
            name: name.to_owned(),
            transport: UpstreamTransport::Http {
                url: url.to_owned(),
                headers: BTreeMap::new(),
            },
            trust: Trust::Untrusted,
            timeout: DEFAULT_TIMEOUT,
            startup_timeout: DEFAULT_STARTUP_TIMEOUT,
            required: true,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            max_in_flight: DEFAULT_MAX_CALLS_IN_FLIGHT,
            keep_alive: true,
            tls: UpstreamTls::default(),
        }
    }

    #[test]
    fn imported_servers_join_and_the_configuration_wins() {
        let config = GatewayConfig::from_toml_str(FULL).unwrap();
        let merged = config
            .with_imported(crate::mcp_json::Imported {
                upstreams: vec![
                    imported("time", "http://elsewhere/mcp"),
                    imported("github", "https://api.example.com/mcp"),
                ],
                skipped: vec!["mcpServers.old is skipped".into()],
            })
            .unwrap();
        let names: Vec<&str> = merged.upstreams.iter().map(|u| u.name.as_str()).collect();
        assert_eq!(names, ["time", "search", "notes_2-b", "github"]);
        let time = merged.upstream("time").unwrap();
        assert_eq!(time.trust, Trust::Trusted);
        assert!(matches!(time.transport, UpstreamTransport::Stdio { .. }));
        assert_eq!(merged.upstream("github").unwrap().trust, Trust::Untrusted);
        assert_eq!(merged.warnings, ["mcpServers.old is skipped"]);

        let problems = GatewayConfig::empty()
            .with_imported(crate::mcp_json::Imported {
                upstreams: vec![
                    imported("github", "http://a/mcp"),
                    imported("github", "http://b/mcp"),
                    imported("Bad Name", "http://c/mcp"),
                ],
                skipped: Vec::new(),
            })
            .unwrap_err();
        assert_eq!(
            lines(&problems),
            [
                "Bad Name: \"Bad Name\" has the character 'B'; use only a-z, 0-9, _ and -",
                "github: is the name of servers in two imported files; rename one of them, or \
                 define an upstream of this name in the gateway configuration, which then \
                 replaces both",
            ]
        );
    }

    /// Every TOML block of the gateway's README is a configuration it reads: what the
    /// README shows works as written.
    #[test]
    fn the_readmes_toml_blocks_are_valid_configurations() {
        let readme = include_str!("../README.md");
        let blocks: Vec<&str> = readme
            .split("```toml\n")
            .skip(1)
            .map(|rest| rest.split("\n```").next().unwrap())
            .collect();
        assert!(blocks.len() >= 4, "{}", blocks.len());
        for block in blocks {
            // A tool's policy alone is shown as it goes under [policy]; roles, as they go
            // with an [auth] of keys.
            let start = block.trim_start();
            let text = if start.starts_with("[[policy.tools]]") {
                format!("[policy]\n{block}")
            } else if start.starts_with("[[auth.roles]]") {
                format!(
                    "[auth]\nmode = \"api-keys\"\n[[auth.keys]]\nid = \"alice\"\n\
                     key_sha256 = \"{}\"\n{block}",
                    "ab".repeat(32)
                )
            } else {
                block.to_owned()
            };
            // The secrets an example names by their variables are not set here.
            let problems: Vec<String> = match GatewayConfig::from_toml_str(&text) {
                Ok(_) => Vec::new(),
                Err(problems) => lines(&problems)
                    .into_iter()
                    .filter(|line| !line.contains("is not set"))
                    .collect(),
            };
            assert!(problems.is_empty(), "{problems:#?}\nin:\n{block}");
        }
    }

    #[test]
    fn trust_is_settled_by_server_tables_and_the_command_line() {
        let config = GatewayConfig::from_toml_str(
            "[servers.github]\ntrust = \"trusted\"\n[servers.time]\ntrust = false\n",
        )
        .unwrap()
        .with_imported(crate::mcp_json::Imported {
            upstreams: vec![
                imported("time", "http://a/mcp"),
                imported("github", "http://b/mcp"),
                imported("memory", "http://c/mcp"),
            ],
            skipped: Vec::new(),
        })
        .unwrap();
        let settled = config.clone().settle(&["memory".to_owned()]).unwrap();
        let trust = |name| settled.upstream(name).unwrap().trust;
        assert_eq!(trust("github"), Trust::Trusted);
        assert_eq!(trust("memory"), Trust::Trusted);
        assert_eq!(trust("time"), Trust::Untrusted);

        let problems = GatewayConfig::from_toml_str("[servers.gihtub]\ntrust = true\n")
            .unwrap()
            .settle(&["tiem".to_owned()])
            .unwrap_err();
        assert_eq!(
            lines(&problems),
            [
                "--trust: \"tiem\" names no upstream; there is none",
                "servers.gihtub: names no upstream; there is none (an imported server's name is \
                 its name in the host's file, lowercased, other characters than a-z, 0-9, _ and \
                 - made -)",
            ]
        );
    }

    #[test]
    fn a_policy_for_a_tool_named_with_a_star_is_refused() {
        let problems = rejected(
            "[policy]\n[[policy.tools]]\nnamespace = \"fs\"\nname = \"*\"\nrisk = \"read-only\"\n",
        );
        assert_eq!(
            lines(&problems),
            ["policy.tools[0].name: \"*\" names no tool: a tool's name is matched as it is; set \
              a policy for every tool of a server in [servers.fs]"]
        );
    }

    #[test]
    fn http_urls_and_names() {
        assert!(check_http_url("https://example.com").is_ok());
        assert!(check_http_url("HTTP://127.0.0.1:9000/mcp").is_ok());
        assert_eq!(
            check_http_url("http:///mcp").unwrap_err(),
            "\"http:///mcp\" has no host"
        );
        assert_eq!(
            check_http_url("example.com/mcp").unwrap_err(),
            "\"example.com/mcp\" is not a URL; write it as http://host:port/path or https://…"
        );
        assert_eq!(
            check_http_url("http://user:hunter2/mcp").unwrap_err(),
            "has a port that is not a number; write it as http://host:port/path"
        );
        assert!(check_http_url("http://[::1]/mcp").is_ok());
        assert!(check_http_url("http://[::1]:80/mcp").is_ok());
        let problem = check_http_url("ws://u:hunter2@h/mcp").unwrap_err();
        assert!(
            problem.starts_with("\"ws://***@h/mcp\" is not an http"),
            "{problem}"
        );
        assert!(is_upstream_name("a_b-9") && !is_upstream_name("") && !is_upstream_name("a.b"));
        assert!(!is_upstream_name("up__b") && !is_upstream_name("up_"));
        assert_eq!(key_path("", "a"), "a");
        assert_eq!(key_path("env", "a.b"), "env.\"a.b\"");
    }

    #[test]
    fn a_cluster_is_named_by_some_of_its_nodes() {
        let config = GatewayConfig::from_toml_str(
            "[store]\ncluster = [\"redis://:pw@10.0.0.1:6379\", \"redis://10.0.0.2:6379\"]\n",
        )
        .unwrap();
        let target = config.redis.expect("a store");
        let store = ShownRedis(&target);
        assert_eq!(store.field(), "store.cluster");
        assert_eq!(
            store.to_string(),
            "redis://***@10.0.0.1:6379, redis://10.0.0.2:6379"
        );
        for (text, problem) in [
            (
                "[store]\ncluster = []\n",
                "store.cluster: is empty; list the URLs of some nodes of the cluster, such as \
                 [\"redis://10.0.0.1:6379\", \"redis://10.0.0.2:6379\"]",
            ),
            (
                "[store]\ncluster = [\"redis://a:1\", \"http://b:2\"]\n",
                "store.cluster[1]: has a scheme other than redis or rediss; write it as \
                 redis://[:password@]host[:port][/db] (or rediss://, redis+unix://, unix://)",
            ),
            (
                "[store]\nredis = \"redis://a:1\"\ncluster = [\"redis://b:2\"]\n",
                "store.cluster: is given with store.redis; keep one: redis for one node, \
                 cluster for the URLs of some nodes of a Redis Cluster",
            ),
            (
                "[store]\ncluster = \"redis://a:1\"\n",
                "store.cluster: must be an array of strings, got a string",
            ),
        ] {
            let problems = GatewayConfig::from_toml_str(text).unwrap_err();
            assert_eq!(lines(&problems), [problem], "{text}");
        }
        assert_eq!(
            cluster_of_list(" redis://a:1, redis://b:2 ,"),
            RedisTarget::cluster(["redis://a:1", "redis://b:2"])
        );
    }
}
