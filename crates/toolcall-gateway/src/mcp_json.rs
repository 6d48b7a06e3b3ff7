//! The MCP servers of a host's configuration file, as upstreams.
//!
//! Reads the files of Claude Desktop and Cursor (`{"mcpServers": {…}}`), of VS Code
//! (`{"servers": {…}}`, with comments and trailing commas, `inputs` ignored) and VS Code's
//! settings (`{"mcp": {"servers": {…}}}`). A server is either `{"command", "args", "env",
//! "cwd"}` or `{"url", "headers"}` (`"serverUrl"` in Windsurf's files), optionally with
//! `"type"`: `"stdio"`, `"http"` or `"streamable-http"`. A server of a kind the gateway
//! cannot serve (`"sse"`, or a type it does not know) is skipped with a warning naming it,
//! and the others are imported. Servers with
//! `"disabled": true` are skipped, and keys hosts add for themselves (`autoApprove`,
//! `alwaysAllow`, …) are ignored.
//!
//! Names become upstream names: lowercased, every character other than `a-z`, `0-9`, `_`
//! and `-` replaced by `-`, a run of `_` made one and a last `_` dropped, cut to 32
//! characters. Every imported upstream is untrusted and
//! required, with the default timeouts. `${env:NAME}` and `${userHome}` in strings are
//! replaced from the environment; `${input:…}` and `${workspaceFolder}`, which only the
//! host can fill in, are problems.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};
use tower_toolcall::envelope::json_kind;
use tower_toolcall::ConfigError;
use tower_toolcall_mcp::{Trust, DEFAULT_MAX_MESSAGE_BYTES};

use crate::auth::DEFAULT_MAX_CALLS_IN_FLIGHT;
use crate::config::{
    check_http_url, is_header_name, is_header_value, key_path, ConfigProblems, Secret,
    UpstreamConfig, UpstreamTransport, DEFAULT_STARTUP_TIMEOUT, DEFAULT_TIMEOUT, MAX_NAME_LEN,
};

/// The servers of a host's file the gateway imported, and those it skipped.
#[derive(Debug, Default)]
pub(crate) struct Imported {
    pub(crate) upstreams: Vec<UpstreamConfig>,
    /// Each skipped server, by its path, and why.
    pub(crate) skipped: Vec<String>,
}

/// The servers of the host's MCP file `text`, read from `source` (named in problems).
pub(crate) fn import(text: &str, source: &Path) -> Result<Imported, ConfigProblems> {
    import_with(text, source, &|name| std::env::var(name).ok())
}

/// [`import`] with `env` for the values of environment variables.
fn import_with(
    text: &str,
    source: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Imported, ConfigProblems> {
    let mut import = Importer {
        source,
        env,
        problems: Vec::new(),
        skipped: Vec::new(),
    };
    let upstreams = import.file(text);
    if import.problems.is_empty() {
        Ok(Imported {
            upstreams,
            skipped: import.skipped,
        })
    } else {
        Err(ConfigProblems(import.problems))
    }
}

/// The upstream name of a host's server name: lowercased, other characters than `a-z`,
/// `0-9`, `_` and `-` made `-`, a run of `_` made one, no `_` at the end (the listed names
/// are `<upstream>__<tool>`), at most 32 characters.
pub(crate) fn normalize_name(name: &str) -> String {
    let mut normalized = String::with_capacity(name.len());
    for c in name.chars() {
        let c = match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '_' | '-') => c,
            _ => '-',
        };
        if !(c == '_' && normalized.ends_with('_')) {
            normalized.push(c);
        }
    }
    let kept: String = normalized.chars().take(MAX_NAME_LEN).collect();
    kept.trim_end_matches('_').to_owned()
}

/// JSON with comments and trailing commas (VS Code's files) as plain JSON. Comments become
/// spaces, so that the parser's line and column numbers still point into the file.
fn strip_jsonc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    // The byte offset in `out` of a comma that a `}` or `]` may show to be trailing.
    let mut pending_comma: Option<usize> = None;
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                pending_comma = None;
                out.push(c);
                while let Some(c) = chars.next() {
                    out.push(c);
                    match c {
                        '\\' => {
                            if let Some(escaped) = chars.next() {
                                out.push(escaped);
                            }
                        }
                        '"' => break,
                        _ => {}
                    }
                }
            }
            '/' if chars.peek() == Some(&'/') => {
                out.push(' ');
                while let Some(&c) = chars.peek() {
                    if c == '\n' {
                        break;
                    }
                    chars.next();
                    out.push(' ');
                }
            }
            '/' if chars.peek() == Some(&'*') => {
                chars.next();
                out.push_str("  ");
                let mut last = ' ';
                for c in chars.by_ref() {
                    out.push(if c == '\n' { '\n' } else { ' ' });
                    if last == '*' && c == '/' {
                        break;
                    }
                    last = c;
                }
            }
            ',' => {
                pending_comma = Some(out.len());
                out.push(c);
            }
            '}' | ']' => {
                if let Some(at) = pending_comma.take() {
                    out.replace_range(at..=at, " ");
                }
                out.push(c);
            }
            c if c.is_whitespace() => out.push(c),
            c => {
                pending_comma = None;
                out.push(c);
            }
        }
    }
    out
}

/// How a server is reached, as its entry says.
enum Kind {
    Stdio,
    Http,
}

struct Importer<'a> {
    source: &'a Path,
    env: &'a dyn Fn(&str) -> Option<String>,
    problems: Vec<ConfigError>,
    skipped: Vec<String>,
}

impl Importer<'_> {
    /// Skips the server at `path`, saying why.
    fn skip(&mut self, path: &str, why: impl std::fmt::Display) {
        self.skipped.push(format!(
            "{path} (in {}) is skipped: {why}",
            self.source.display()
        ));
    }

    fn add(&mut self, field: impl Into<String>, problem: impl std::fmt::Display) {
        self.problems.push(ConfigError::new(
            field,
            format!("{problem} (in {})", self.source.display()),
        ));
    }

    fn file(&mut self, text: &str) -> Vec<UpstreamConfig> {
        let root: Value = match serde_json::from_str(&strip_jsonc(text)) {
            Ok(root) => root,
            Err(e) => {
                self.add("", format_args!("is not valid JSON: {e}"));
                return Vec::new();
            }
        };
        let Value::Object(root) = root else {
            self.add(
                "",
                "must be a JSON object with mcpServers (Claude Desktop, Cursor) or servers (VS \
                 Code)",
            );
            return Vec::new();
        };
        let mut sections: Vec<(&str, &Value)> = Vec::new();
        if let Some(servers) = root.get("mcpServers") {
            sections.push(("mcpServers", servers));
        }
        if let Some(servers) = root.get("servers") {
            sections.push(("servers", servers));
        }
        if let Some(servers) = root
            .get("mcp")
            .and_then(|mcp| mcp.as_object())
            .and_then(|mcp| mcp.get("servers"))
        {
            sections.push(("mcp.servers", servers));
        }
        if sections.is_empty() {
            self.add(
                "",
                "has no mcpServers (Claude Desktop, Cursor) or servers (VS Code) object; is it \
                 a host's MCP servers file?",
            );
            return Vec::new();
        }

        // Upstream name → the path of the server that took it.
        let mut taken: BTreeMap<String, String> = BTreeMap::new();
        let mut upstreams = Vec::new();
        for (section, servers) in sections {
            let Value::Object(servers) = servers else {
                self.add(section, "must be an object of servers by name");
                continue;
            };
            for (name, entry) in servers {
                let path = key_path(section, name);
                let Value::Object(entry) = entry else {
                    self.add(path, "must be an object");
                    continue;
                };
                match entry.get("disabled") {
                    None | Some(Value::Bool(false)) => {}
                    Some(Value::Bool(true)) => continue,
                    // Hosts write it quoted too; read it as they do.
                    Some(Value::String(s)) if s == "true" => continue,
                    Some(Value::String(s)) if s == "false" => {}
                    Some(other) => {
                        self.add(
                            key_path(&path, "disabled"),
                            format_args!("must be true or false, got {}", json_kind(other)),
                        );
                        continue;
                    }
                }
                let upstream_name = normalize_name(name);
                if upstream_name.is_empty() {
                    self.add(path, "has an empty name; give the server a name");
                    continue;
                }
                if let Some(first) = taken.get(&upstream_name) {
                    let problem = format!(
                        "becomes the upstream name {upstream_name:?}, as does {first}; rename \
                         one of them"
                    );
                    self.add(path, problem);
                    continue;
                }
                taken.insert(upstream_name.clone(), path.clone());
                if let Some(transport) = self.server(entry, &path) {
                    upstreams.push(UpstreamConfig {
                        name: upstream_name,
                        transport,
                        trust: Trust::Untrusted,
                        timeout: DEFAULT_TIMEOUT,
                        startup_timeout: DEFAULT_STARTUP_TIMEOUT,
                        required: true,
                        max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
                        max_in_flight: DEFAULT_MAX_CALLS_IN_FLIGHT,
                        keep_alive: true,
                        tls: crate::tls::UpstreamTls::default(),
                    });
                }
            }
        }
        upstreams
    }

    fn server(&mut self, entry: &Map<String, Value>, path: &str) -> Option<UpstreamTransport> {
        // Windsurf names it `serverUrl`.
        let url_key = if !entry.contains_key("url") && entry.contains_key("serverUrl") {
            "serverUrl"
        } else {
            "url"
        };
        let has_command = entry.contains_key("command");
        let has_url = entry.contains_key(url_key);
        let kind = match entry.get("type") {
            Some(Value::String(kind)) => match kind.as_str() {
                "stdio" => Kind::Stdio,
                "http" | "streamable-http" | "streamableHttp" => Kind::Http,
                "sse" => {
                    self.skip(
                        path,
                        "the gateway does not speak SSE, which MCP replaced with streamable \
                         HTTP; point the entry at the server's streamable HTTP endpoint (type \
                         \"http\")",
                    );
                    return None;
                }
                other => {
                    self.skip(
                        path,
                        format_args!(
                            "{other:?} is not a transport the gateway knows; it serves \
                             \"stdio\" and \"http\" servers"
                        ),
                    );
                    return None;
                }
            },
            Some(_) => {
                self.add(
                    key_path(path, "type"),
                    "must be a string: \"stdio\" or \"http\"",
                );
                return None;
            }
            None => match (has_command, has_url) {
                (true, false) => Kind::Stdio,
                (false, true) => Kind::Http,
                (true, true) => {
                    self.add(
                        path,
                        "has both command and url; say which with \"type\": \"stdio\" or \"http\"",
                    );
                    return None;
                }
                (false, false) => {
                    self.add(
                        path,
                        "needs command (a stdio server) or url (a streamable HTTP server)",
                    );
                    return None;
                }
            },
        };
        if entry.contains_key("envFile") {
            self.add(
                key_path(path, "envFile"),
                "is not supported; put the variables in env",
            );
        }
        let before = self.problems.len();
        let transport = match kind {
            Kind::Stdio => {
                let command = self.required_string(entry, path, "command");
                let args = self.strings(entry, path, "args");
                let env = self.string_map(entry, path, "env");
                let cwd = self.string(entry, path, "cwd").map(PathBuf::from);
                UpstreamTransport::Stdio {
                    command: command?,
                    args,
                    env,
                    cwd,
                }
            }
            Kind::Http => {
                let url =
                    self.required_string(entry, path, url_key).and_then(
                        |url| match check_http_url(&url) {
                            Ok(()) => Some(url),
                            Err(problem) => {
                                self.add(key_path(path, url_key), problem);
                                None
                            }
                        },
                    );
                let headers = self.headers(entry, path);
                UpstreamTransport::Http { url: url?, headers }
            }
        };
        (self.problems.len() == before).then_some(transport)
    }

    /// A string with the host's variables filled in; `None` after a problem.
    fn expand(&mut self, value: &str, field: &str) -> Option<String> {
        let mut out = String::with_capacity(value.len());
        let mut rest = value;
        while let Some(start) = rest.find("${") {
            out.push_str(&rest[..start]);
            let after = &rest[start + 2..];
            let Some(end) = after.find('}') else {
                out.push_str(&rest[start..]);
                return Some(out);
            };
            let variable = &after[..end];
            if let Some(name) = variable.strip_prefix("env:") {
                match (self.env)(name) {
                    Some(v) => out.push_str(&v),
                    None => {
                        self.add(
                            field,
                            format_args!(
                                "uses ${{env:{name}}}, but {name} is not set; set it before \
                                 starting the gateway"
                            ),
                        );
                        return None;
                    }
                }
            } else if variable == "userHome" {
                match (self.env)("HOME").or_else(|| (self.env)("USERPROFILE")) {
                    Some(v) => out.push_str(&v),
                    None => {
                        self.add(field, "uses ${userHome}, but HOME is not set");
                        return None;
                    }
                }
            } else if variable.starts_with("input:") {
                self.add(
                    field,
                    format_args!(
                        "uses ${{{variable}}}, a value the host asks its user for; define this \
                         server in the gateway configuration with the value instead"
                    ),
                );
                return None;
            } else if matches!(
                variable,
                "workspaceFolder" | "workspaceFolderBasename" | "workspaceRoot" | "cwd"
            ) {
                self.add(
                    field,
                    format_args!(
                        "uses ${{{variable}}}, which only the host knows; write the path out"
                    ),
                );
                return None;
            } else {
                out.push_str(&rest[start..start + 2 + end + 1]);
            }
            rest = &after[end + 1..];
        }
        out.push_str(rest);
        Some(out)
    }

    fn string(&mut self, entry: &Map<String, Value>, path: &str, key: &str) -> Option<String> {
        let field = key_path(path, key);
        match entry.get(key)? {
            Value::String(s) => self.expand(s, &field),
            other => {
                self.add(
                    field,
                    format_args!("must be a string, got {}", json_kind(other)),
                );
                None
            }
        }
    }

    fn required_string(
        &mut self,
        entry: &Map<String, Value>,
        path: &str,
        key: &str,
    ) -> Option<String> {
        if !entry.contains_key(key) {
            self.add(key_path(path, key), "is required");
            return None;
        }
        let s = self.string(entry, path, key)?;
        if s.is_empty() {
            self.add(key_path(path, key), "must not be empty");
            return None;
        }
        Some(s)
    }

    fn strings(&mut self, entry: &Map<String, Value>, path: &str, key: &str) -> Vec<String> {
        let field = key_path(path, key);
        match entry.get(key) {
            None => Vec::new(),
            Some(Value::Array(items)) => {
                let mut out = Vec::with_capacity(items.len());
                for (i, item) in items.iter().enumerate() {
                    let item_field = format!("{field}[{i}]");
                    match item {
                        Value::String(s) => out.extend(self.expand(s, &item_field)),
                        other => self.add(
                            item_field,
                            format_args!("must be a string, got {}", json_kind(other)),
                        ),
                    }
                }
                out
            }
            Some(other) => {
                self.add(
                    field,
                    format_args!("must be an array of strings, got {}", json_kind(other)),
                );
                Vec::new()
            }
        }
    }

    fn string_map(
        &mut self,
        entry: &Map<String, Value>,
        path: &str,
        key: &str,
    ) -> BTreeMap<String, String> {
        let field = key_path(path, key);
        let mut out = BTreeMap::new();
        match entry.get(key) {
            None => {}
            Some(Value::Object(vars)) => {
                for (name, value) in vars {
                    let var_field = key_path(&field, name);
                    if name.is_empty() || name.contains(['=', '\0']) {
                        self.add(
                            var_field,
                            "is not an environment variable name; it must not be empty or \
                             hold = or NUL",
                        );
                        continue;
                    }
                    match value {
                        Value::String(s) => {
                            if let Some(v) = self.expand(s, &var_field) {
                                out.insert(name.clone(), v);
                            }
                        }
                        // The value is not quoted: it is often a credential.
                        other => self.add(
                            var_field,
                            format_args!("must be a string, got {}", json_kind(other)),
                        ),
                    }
                }
            }
            Some(other) => self.add(
                field,
                format_args!("must be an object of strings, got {}", json_kind(other)),
            ),
        }
        out
    }

    fn headers(&mut self, entry: &Map<String, Value>, path: &str) -> BTreeMap<String, Secret> {
        let field = key_path(path, "headers");
        let mut out = BTreeMap::new();
        for (name, value) in self.string_map(entry, path, "headers") {
            if !is_header_name(&name) {
                self.add(
                    key_path(&field, &name),
                    "is not an HTTP header name; use letters, digits and -",
                );
            } else if !is_header_value(&value) {
                self.add(
                    key_path(&field, &name),
                    "has a value an HTTP header cannot carry; use visible ASCII characters and \
                     spaces only",
                );
            } else {
                out.insert(name, Secret::opaque(value));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOURCE: &str = "/home/u/mcp.json";

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn ok(text: &str) -> Vec<UpstreamConfig> {
        let imported = import_with(text, Path::new(SOURCE), &no_env).unwrap();
        assert_eq!(imported.skipped, Vec::<String>::new());
        imported.upstreams
    }

    /// Every problem as `field: problem`, without the file's name, sorted.
    fn lines(text: &str) -> Vec<String> {
        let problems = import_with(text, Path::new(SOURCE), &no_env).unwrap_err();
        let suffix = format!(" (in {SOURCE})");
        let mut lines: Vec<String> = problems
            .0
            .iter()
            .map(|p| {
                let problem = p.problem().strip_suffix(&suffix).expect("names the file");
                format!("{}: {problem}", p.field())
            })
            .collect();
        lines.sort();
        lines
    }

    fn stdio(command: &str, args: &[&str], env: &[(&str, &str)]) -> UpstreamTransport {
        UpstreamTransport::Stdio {
            command: command.into(),
            args: args.iter().map(|&a| a.into()).collect(),
            env: env.iter().map(|&(k, v)| (k.into(), v.into())).collect(),
            cwd: None,
        }
    }

    fn http(url: &str, headers: &[(&str, &str)]) -> UpstreamTransport {
        UpstreamTransport::Http {
            url: url.into(),
            headers: headers
                .iter()
                .map(|&(k, v)| (k.into(), Secret::opaque(v)))
                .collect(),
        }
    }

    fn summary(upstreams: &[UpstreamConfig]) -> Vec<(&str, &UpstreamTransport)> {
        for u in upstreams {
            assert_eq!(u.trust, Trust::Untrusted);
            assert!(u.required);
            assert_eq!(
                (u.timeout, u.startup_timeout),
                (DEFAULT_TIMEOUT, DEFAULT_STARTUP_TIMEOUT)
            );
        }
        upstreams
            .iter()
            .map(|u| (u.name.as_str(), &u.transport))
            .collect()
    }

    #[test]
    fn claude_desktop_and_cursor() {
        let upstreams = ok(r#"{
            "mcpServers": {
                "time": {
                    "command": "uvx",
                    "args": ["mcp-server-time", "--local-timezone=UTC"],
                    "env": {"TZ": "UTC"},
                    "autoApprove": ["get_current_time"],
                    "alwaysAllow": [],
                    "disabled": false
                },
                "search": {"url": "https://search.example.com/mcp", "headers": {"Authorization": "Bearer xyz"}},
                "typed": {"type": "streamable-http", "url": "http://127.0.0.1:9000/mcp"},
                "windsurf": {"serverUrl": "http://127.0.0.1:9001/mcp"},
                "local": {"type": "stdio", "command": "node", "args": ["server.js"], "cwd": "/srv/local"},
                "off": {"command": "never", "disabled": true}
            },
            "globalShortcut": "Ctrl+Space"
        }"#);
        assert_eq!(
            summary(&upstreams),
            [
                (
                    "local",
                    &UpstreamTransport::Stdio {
                        command: "node".into(),
                        args: vec!["server.js".into()],
                        env: BTreeMap::new(),
                        cwd: Some("/srv/local".into()),
                    }
                ),
                (
                    "search",
                    &http(
                        "https://search.example.com/mcp",
                        &[("Authorization", "Bearer xyz")]
                    )
                ),
                (
                    "time",
                    &stdio(
                        "uvx",
                        &["mcp-server-time", "--local-timezone=UTC"],
                        &[("TZ", "UTC")]
                    )
                ),
                ("typed", &http("http://127.0.0.1:9000/mcp", &[])),
                ("windsurf", &http("http://127.0.0.1:9001/mcp", &[])),
            ]
        );
    }

    #[test]
    fn vs_code_with_comments_inputs_and_trailing_commas() {
        let upstreams = ok(r#"{
            // Inputs are prompts of VS Code's; the gateway ignores them.
            "inputs": [{"type": "promptString", "id": "key", "password": true}],
            "servers": {
                /* a stdio server */
                "fetch": {"type": "stdio", "command": "uvx", "args": ["mcp-server-fetch", "http://a//b"],},
                "remote": {"type": "http", "url": "https://example.com/mcp", "headers": {"X-Key": "k"}},
            },
        }"#);
        assert_eq!(
            summary(&upstreams),
            [
                (
                    "fetch",
                    &stdio("uvx", &["mcp-server-fetch", "http://a//b"], &[])
                ),
                (
                    "remote",
                    &http("https://example.com/mcp", &[("X-Key", "k")])
                ),
            ]
        );

        let settings =
            ok(r#"{"editor.fontSize": 12, "mcp": {"servers": {"git": {"command": "git-mcp"}}}}"#);
        assert_eq!(summary(&settings), [("git", &stdio("git-mcp", &[], &[]))]);
    }

    #[test]
    fn disabled_is_read_as_hosts_write_it() {
        let upstreams = ok(r#"{"mcpServers": {
            "a": {"command": "a", "disabled": "true"},
            "b": {"command": "b", "disabled": true},
            "c": {"command": "c", "disabled": "false"},
            "d": {"command": "d", "disabled": false}
        }}"#);
        let names: Vec<&str> = upstreams.iter().map(|u| u.name.as_str()).collect();
        assert_eq!(names, ["c", "d"]);
        assert_eq!(
            lines(r#"{"mcpServers": {"e": {"command": "e", "disabled": "yes"}}}"#),
            ["mcpServers.e.disabled: must be true or false, got a string"]
        );
    }

    #[test]
    fn servers_of_unknown_kinds_are_skipped_and_the_others_imported() {
        let imported = import_with(
            r#"{"mcpServers": {
                "old": {"type": "sse", "url": "http://h/sse"},
                "odd": {"type": "websocket", "url": "ws://h/mcp"},
                "remote": {"type": "http", "url": "http://127.0.0.1:9000/mcp"},
                "time": {"command": "uvx", "args": ["mcp-server-time"]}
            }}"#,
            Path::new(SOURCE),
            &no_env,
        )
        .unwrap();
        assert_eq!(
            summary(&imported.upstreams),
            [
                ("remote", &http("http://127.0.0.1:9000/mcp", &[])),
                ("time", &stdio("uvx", &["mcp-server-time"], &[])),
            ]
        );
        assert_eq!(
            imported.skipped,
            [
                format!(
                    "mcpServers.odd (in {SOURCE}) is skipped: \"websocket\" is not a transport \
                     the gateway knows; it serves \"stdio\" and \"http\" servers"
                ),
                format!(
                    "mcpServers.old (in {SOURCE}) is skipped: the gateway does not speak SSE, \
                     which MCP replaced with streamable HTTP; point the entry at the server's \
                     streamable HTTP endpoint (type \"http\")"
                ),
            ]
        );
    }

    #[test]
    fn names_are_normalized_and_clashes_named() {
        let long = "A".repeat(40);
        let text = format!(
            r#"{{"mcpServers": {{"My Server.v2": {{"command": "a"}}, "{long}": {{"command": "b"}}, "ünï": {{"command": "c"}}}}}}"#
        );
        let upstreams = ok(&text);
        let names: Vec<&str> = upstreams.iter().map(|u| u.name.as_str()).collect();
        assert_eq!(
            names,
            ["aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "my-server-v2", "-n-"]
        );
        assert_eq!(normalize_name("GitHub_MCP-2"), "github_mcp-2");
        assert_eq!(normalize_name("a__b_"), "a_b");

        assert_eq!(
            lines(
                r#"{"mcpServers": {"Time": {"command": "a"}, "time": {"command": "b"}},
                    "servers": {"TIME": {"command": "c"}, "": {"command": "d"}}}"#
            ),
            [
                "mcpServers.time: becomes the upstream name \"time\", as does mcpServers.Time; \
                 rename one of them",
                "servers.\"\": has an empty name; give the server a name",
                "servers.TIME: becomes the upstream name \"time\", as does mcpServers.Time; \
                 rename one of them",
            ]
        );
    }

    #[test]
    fn every_problem_names_its_json_path() {
        let text = r#"{"mcpServers": {
            "a": {"command": 3, "args": "x", "env": {"K": 1}},
            "b": {"url": "ftp://h/mcp", "headers": {"Bad Name": "v", "X": "line\nbreak"}},
            "c": {"command": "x", "url": "http://h/mcp"},
            "d": {"alwaysAllow": []},
            "f": {"type": "http"},
            "g": {"type": "stdio", "command": "", "args": [1], "envFile": ".env"},
            "h": "nope",
            "i": {"type": "stdio", "command": "${input:cmd}", "cwd": "${workspaceFolder}/x",
                  "env": {"TOKEN": "${env:GITHUB_TOKEN}"}}
        }}"#;
        assert_eq!(
            lines(text),
            [
                "mcpServers.a.args: must be an array of strings, got a string",
                "mcpServers.a.command: must be a string, got a number",
                "mcpServers.a.env.K: must be a string, got a number",
                "mcpServers.b.headers.\"Bad Name\": is not an HTTP header name; use letters, \
                 digits and -",
                "mcpServers.b.headers.X: has a value an HTTP header cannot carry; use visible \
                 ASCII characters and spaces only",
                "mcpServers.b.url: \"ftp://h/mcp\" is not an http or https URL; the gateway \
                 speaks streamable HTTP only",
                "mcpServers.c: has both command and url; say which with \"type\": \"stdio\" or \
                 \"http\"",
                "mcpServers.d: needs command (a stdio server) or url (a streamable HTTP server)",
                "mcpServers.f.url: is required",
                "mcpServers.g.args[0]: must be a string, got a number",
                "mcpServers.g.command: must not be empty",
                "mcpServers.g.envFile: is not supported; put the variables in env",
                "mcpServers.h: must be an object",
                "mcpServers.i.command: uses ${input:cmd}, a value the host asks its user for; \
                 define this server in the gateway configuration with the value instead",
                "mcpServers.i.cwd: uses ${workspaceFolder}, which only the host knows; write \
                 the path out",
                "mcpServers.i.env.TOKEN: uses ${env:GITHUB_TOKEN}, but GITHUB_TOKEN is not set; \
                 set it before starting the gateway",
            ]
        );
    }

    #[test]
    fn environment_variables_are_filled_in() {
        let env = |name: &str| match name {
            "GITHUB_TOKEN" => Some("ghp_1".to_owned()),
            "HOME" => Some("/home/u".to_owned()),
            _ => None,
        };
        let upstreams = import_with(
            r#"{"mcpServers": {
                "gh": {"url": "https://api.example.com/mcp",
                       "headers": {"Authorization": "Bearer ${env:GITHUB_TOKEN}"}},
                "fs": {"command": "${userHome}/bin/fs", "args": ["${unknown}", "${open"]}
            }}"#,
            Path::new(SOURCE),
            &env,
        )
        .unwrap()
        .upstreams;
        assert_eq!(
            summary(&upstreams),
            [
                (
                    "fs",
                    &stdio("/home/u/bin/fs", &["${unknown}", "${open"], &[])
                ),
                (
                    "gh",
                    &http(
                        "https://api.example.com/mcp",
                        &[("Authorization", "Bearer ghp_1")]
                    )
                ),
            ]
        );
    }

    #[test]
    fn files_that_are_not_a_hosts_file() {
        let problems = import_with("{", Path::new(SOURCE), &no_env).unwrap_err();
        assert_eq!(problems.0.len(), 1);
        assert_eq!(problems.0[0].field(), "");
        assert!(
            problems.0[0]
                .problem()
                .starts_with("is not valid JSON: EOF while parsing"),
            "{problems}"
        );
        assert!(problems.to_string().ends_with("(in /home/u/mcp.json)"));
        assert_eq!(
            lines("[]"),
            [
                ": must be a JSON object with mcpServers (Claude Desktop, Cursor) or servers (VS \
              Code)"
            ]
        );
        assert_eq!(
            lines(r#"{"other": {}}"#),
            [
                ": has no mcpServers (Claude Desktop, Cursor) or servers (VS Code) object; is it \
              a host's MCP servers file?"
            ]
        );
        assert_eq!(
            lines(r#"{"mcpServers": []}"#),
            ["mcpServers: must be an object of servers by name"]
        );
        assert!(ok(r#"{"mcpServers": {}}"#).is_empty());
    }

    #[test]
    fn jsonc_keeps_strings_and_positions() {
        assert_eq!(
            strip_jsonc("{\"a\": \"//x,}\", // c\n\"b\": [1,], /* d\n */}"),
            "{\"a\": \"//x,}\",     \n\"b\": [1 ]      \n   }"
        );
        assert_eq!(strip_jsonc(r#"{"a": "\"//"}"#), r#"{"a": "\"//"}"#);
    }
}
