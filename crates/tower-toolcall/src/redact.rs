//! Redaction of secrets before anything is logged, audited or used as a metric label.
//!
//! Three rules, applied at any depth and inside arrays:
//!
//! - a member whose *name* looks secret has its value replaced, whatever it is: after folding
//!   case and dropping `-`, `_`, `.` and spaces, the name ends with `token`, `secret`,
//!   `password`, `passwd`, `pwd`, `passphrase`, `authorization`, `apikey`, `cookie`,
//!   `cookies`, `privatekey`, `accesskey`, `secretkey` or `credential(s)`, or is `auth` or
//!   `pass` (so `api_key`, `X-Api-Key`, `session_token`, `client_secret` and `Set-Cookie`
//!   are secret, and `max_tokens` is not);
//! - a *value* that looks like a credential is cut out of any string: bearer and basic
//!   authorization values, JWTs, `sk-…` keys, GitHub tokens (`ghp_…`, `gho_…`,
//!   `github_pat_…`), AWS access key ids (`AKIA…`, `ASIA…`), Slack tokens (`xox…`), Google
//!   API keys (`AIza…`), Stripe secret and restricted keys (`sk_live_…`, `sk_test_…`,
//!   `rk_live_…`, `rk_test_…`; publishable `pk_…` keys are public and kept) and webhook
//!   signing secrets (`whsec_…`), PEM private keys, and the user and password of a URL
//!   (`scheme://user:pw@`);
//! - in any string, the value given to a secret name, as error messages and echoed requests
//!   write it: `password=…`, `api_key: …`, `?client_secret=…&`, `"token": "…"`, and
//!   `Authorization: Basic …` with its scheme. A quoted value is cut to its closing quote, a
//!   bare one to the next white space or `&`, `,`, `;`, quote, `<`, `>`, `)`, `]` or `}`.
//!
//! Both lists can be extended; the third rule follows the first rule's names.
//!
//! ```
//! use serde_json::json;
//! use tower_toolcall::trace::Redactor;
//!
//! let redactor = Redactor::default();
//! let params = json!({
//!     "query": "weather",
//!     "api_key": "abc123",
//!     "headers": [{"Authorization": "Bearer abc.def"}],
//!     "note": "use sk-proj-0123456789abcdefghij for the call",
//!     "error": "GET /v1?api_key=abc123&q=1 refused",
//! });
//! assert_eq!(redactor.redact_value(&params), json!({
//!     "query": "weather",
//!     "api_key": "[REDACTED]",
//!     "headers": [{"Authorization": "[REDACTED]"}],
//!     "note": "use [REDACTED] for the call",
//!     "error": "GET /v1?api_key=[REDACTED]&q=1 refused",
//! }));
//! ```

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;
use std::sync::{Arc, OnceLock};

use regex::{Captures, Regex};
use serde_json::{Map, Value};

use crate::error::ConfigError;

/// What a secret is replaced with.
pub const REDACTED: &str = "[REDACTED]";

/// How deep [`Redactor::redact_value`] goes; deeper values are replaced with `[TRUNCATED]`.
/// A copy it makes nests at most 127 arrays and objects, so that it is read back by parsers
/// that stop at 128 levels, as serde_json's does.
const MAX_DEPTH: usize = 127;

/// What stands for a value nested deeper than the redactor goes.
const TRUNCATED: &str = "[TRUNCATED]";

/// Replaces, in place, what `value` nests deeper than [`Redactor::redact_value`] goes with
/// `[TRUNCATED]`, as that copy would; a value cut this way serializes without recursing past
/// that depth. Nothing is redacted.
pub(crate) fn cut_too_deep(value: &mut Value) {
    cut_at(value, 0);
}

fn cut_at(value: &mut Value, depth: usize) {
    if depth >= MAX_DEPTH {
        *value = Value::String(TRUNCATED.to_owned());
        return;
    }
    match value {
        Value::Array(items) => items.iter_mut().for_each(|item| cut_at(item, depth + 1)),
        Value::Object(map) => map
            .values_mut()
            .for_each(|member| cut_at(member, depth + 1)),
        _ => {}
    }
}

/// Name endings that make a member secret, after normalization.
const SECRET_NAME_ENDINGS: [&str; 16] = [
    "token",
    "secret",
    "password",
    "passwd",
    "pwd",
    "passphrase",
    "authorization",
    "apikey",
    "cookie",
    "cookies",
    "privatekey",
    "accesskey",
    "secretkey",
    "credential",
    "credentials",
    "sessionid",
];

/// Names that are secret only as a whole.
const SECRET_NAMES: [&str; 2] = ["auth", "pass"];

/// Credential shapes cut out of strings.
const CREDENTIAL_PATTERNS: [&str; 13] = [
    r"(?i)\bbearer\s+[A-Za-z0-9\-._~+/]{16,}=*",
    r"(?i)\bbasic\s+[A-Za-z0-9+/]{16,}=*",
    r"\beyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}",
    r"\bsk-[A-Za-z0-9_-]{16,}",
    r"\bgh[pousr]_[A-Za-z0-9]{20,}",
    r"\bgithub_pat_[A-Za-z0-9_]{20,}",
    r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",
    r"\bxox[abposr]-[A-Za-z0-9-]{10,}",
    r"\bAIza[0-9A-Za-z_-]{35}",
    r"\b[sr]k_(?:live|test)_[0-9A-Za-z]{16,}",
    r"\bwhsec_[0-9A-Za-z+/=]{16,}",
    r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----(?s:.*?)(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|$)",
    // The password of a URL; the replacement keeps the scheme separator and the `@`.
    r"://[^/\s:@]*:[^/\s@]+@",
];

/// A name given a value in text: `name=`, `name: `, `"name": `. The value follows the match.
const ASSIGNMENT_PATTERN: &str = r#"(?P<name>[A-Za-z_][A-Za-z0-9_.\-]*)["']?[ \t]*[:=]{1,2}[ \t]*"#;

/// HTTP authorization schemes: after a secret name, the credentials that follow one are part
/// of its value (`Authorization: Basic dXNlcg==`).
const AUTH_SCHEMES: [&str; 8] = [
    "basic",
    "bearer",
    "digest",
    "token",
    "negotiate",
    "ntlm",
    "apikey",
    "aws4-hmac-sha256",
];

/// Folds case and drops the separators names are spelled with.
fn normalize_name(name: &str) -> String {
    name.chars()
        .filter(|c| !matches!(c, '-' | '_' | '.' | ' '))
        .flat_map(char::to_lowercase)
        .collect()
}

/// Replaces secrets in JSON values and strings. Cheap to clone.
#[derive(Clone)]
pub struct Redactor {
    inner: Arc<Inner>,
}

struct Inner {
    name_endings: Vec<String>,
    names: Vec<String>,
    credentials: Regex,
    assignments: Regex,
}

impl Default for Redactor {
    /// The built-in rules; every default redactor shares one compiled set.
    fn default() -> Self {
        static DEFAULT: OnceLock<Redactor> = OnceLock::new();
        DEFAULT
            .get_or_init(|| {
                Redactor::builder()
                    .build()
                    .expect("the built-in patterns compile")
            })
            .clone()
    }
}

/// [`Redactor::redact_identifier`] with the built-in rules, for the log lines of the layers
/// that have no redactor of their own.
pub(crate) fn identifier(id: &str) -> Cow<'_, str> {
    Redactor::default().redact_identifier(id)
}

impl fmt::Debug for Redactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redactor")
            .field("name_endings", &self.inner.name_endings)
            .field("names", &self.inner.names)
            .finish_non_exhaustive()
    }
}

impl Redactor {
    /// A builder that extends the built-in rules.
    pub fn builder() -> RedactorBuilder {
        RedactorBuilder::default()
    }

    /// `true` when a member called `name` holds a secret.
    pub fn is_secret_name(&self, name: &str) -> bool {
        let normalized = normalize_name(name);
        self.inner.names.contains(&normalized)
            || self
                .inner
                .name_endings
                .iter()
                .any(|ending| normalized.ends_with(ending.as_str()))
    }

    /// `text` with every credential and every value of a secret name cut out; borrowed
    /// when there was none.
    pub fn redact_str<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let shapes_cut = self
            .inner
            .credentials
            .replace_all(text, |caps: &Captures<'_>| {
                if caps[0].starts_with("://") {
                    format!("://{REDACTED}@")
                } else {
                    REDACTED.to_owned()
                }
            });
        match shapes_cut {
            Cow::Borrowed(text) => self.redact_assignments(text),
            Cow::Owned(text) => Cow::Owned(self.redact_assignments(&text).into_owned()),
        }
    }

    /// An identifier of a call (`requestId`, `sessionKey`, `correlationId`, `toolCallId`) as
    /// log lines and the audit log show it: with every credential in it cut out, as
    /// [`redact_str`](Redactor::redact_str) does to any string of an audit line, so that both
    /// name a call the same way.
    pub fn redact_identifier<'a>(&self, id: &'a str) -> Cow<'a, str> {
        self.redact_str(id)
    }

    /// `text` with the values of its secret names replaced.
    fn redact_assignments<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut redacted: Option<String> = None;
        let mut copied = 0;
        for value in self.secret_values(text) {
            let out = redacted.get_or_insert_with(|| String::with_capacity(text.len()));
            out.push_str(&text[copied..value.start]);
            out.push_str(REDACTED);
            copied = value.end;
        }
        match redacted {
            None => Cow::Borrowed(text),
            Some(mut out) => {
                out.push_str(&text[copied..]);
                Cow::Owned(out)
            }
        }
    }

    /// Where `text` gives a secret name a value not redacted yet, in order.
    fn secret_values<'t>(&'t self, text: &'t str) -> impl Iterator<Item = Range<usize>> + 't {
        let has_assignment = text.bytes().any(|b| b == b'=' || b == b':');
        let mut resume = 0;
        has_assignment
            .then(|| self.inner.assignments.captures_iter(text))
            .into_iter()
            .flatten()
            .filter_map(move |caps| {
                let (whole, name) = (caps.get(0)?, caps.name("name")?);
                if whole.start() < resume || !self.is_secret_name(name.as_str()) {
                    return None;
                }
                let value = value_at(text, whole.end())?;
                resume = value.end;
                Some(value)
            })
    }

    /// `true` when [`redact_value`](Redactor::redact_value) would change `value`; it builds
    /// no copy of the value.
    pub fn needs_redaction(&self, value: &Value) -> bool {
        self.needs_redaction_at(value, 0)
    }

    fn needs_redaction_at(&self, value: &Value, depth: usize) -> bool {
        if depth >= MAX_DEPTH {
            // `redact_value` cuts here.
            return true;
        }
        match value {
            Value::String(s) => {
                self.inner.credentials.is_match(s) || self.secret_values(s).next().is_some()
            }
            Value::Array(items) => items
                .iter()
                .any(|item| self.needs_redaction_at(item, depth + 1)),
            Value::Object(map) => map.iter().any(|(name, member)| {
                (!member.is_null() && self.is_secret_name(name))
                    || self.needs_redaction_at(member, depth + 1)
            }),
            _ => false,
        }
    }

    /// A copy of `value` with every secret replaced.
    pub fn redact_value(&self, value: &Value) -> Value {
        self.redact_at(value, 0)
    }

    /// [`redact_value`](Redactor::redact_value) of a value that will sit `depth` levels deep
    /// in another: the copy is cut where the whole would be (`[TRUNCATED]` below the
    /// redactor's depth limit), as the audit log cuts the params of `calls.jsonl`, three
    /// levels down (`line.call.payload.params`). A reader that compares params with that
    /// file redacts them the same way.
    pub fn redact_value_within(&self, value: &Value, depth: usize) -> Value {
        self.redact_at(value, depth)
    }

    fn redact_at(&self, value: &Value, depth: usize) -> Value {
        if depth >= MAX_DEPTH {
            return Value::String(TRUNCATED.to_owned());
        }
        match value {
            Value::String(s) => Value::String(self.redact_str(s).into_owned()),
            Value::Array(items) => Value::Array(
                items
                    .iter()
                    .map(|item| self.redact_at(item, depth + 1))
                    .collect(),
            ),
            Value::Object(map) => Value::Object(self.redact_map(map, depth + 1)),
            other => other.clone(),
        }
    }

    fn redact_map(&self, map: &Map<String, Value>, depth: usize) -> Map<String, Value> {
        map.iter()
            .map(|(name, member)| {
                let member = if member.is_null() || !self.is_secret_name(name) {
                    self.redact_at(member, depth)
                } else {
                    Value::String(REDACTED.to_owned())
                };
                (name.clone(), member)
            })
            .collect()
    }
}

/// The value that starts at `at` in `text`: a quoted string's content, or a bare run up to
/// a separator, with the credentials after an authorization scheme. `None` when it is empty
/// or already redacted.
fn value_at(text: &str, at: usize) -> Option<Range<usize>> {
    let rest = &text[at..];
    if rest.starts_with(REDACTED) {
        return None;
    }
    if let Some(quote) = rest.chars().next().filter(|c| matches!(c, '"' | '\'')) {
        let body = &rest[1..];
        let mut escaped = false;
        let end = body
            .char_indices()
            .find(|&(_, c)| {
                let closes = !escaped && c == quote;
                escaped = !escaped && c == '\\';
                closes
            })
            .map_or(body.len(), |(i, _)| i);
        return (end > 0 && !body.starts_with(REDACTED)).then(|| at + 1..at + 1 + end);
    }
    let bare_len = |s: &str| {
        s.find(|c: char| {
            c.is_whitespace()
                || matches!(
                    c,
                    '&' | ',' | ';' | '"' | '\'' | '<' | '>' | ')' | ']' | '}'
                )
        })
        .unwrap_or(s.len())
    };
    let mut end = bare_len(rest);
    if end == 0 {
        return None;
    }
    if AUTH_SCHEMES
        .iter()
        .any(|scheme| rest[..end].eq_ignore_ascii_case(scheme))
    {
        let after = &rest[end..];
        let spaces = after.len() - after.trim_start_matches(' ').len();
        let credentials = bare_len(&after[spaces..]);
        if spaces > 0 && credentials > 0 {
            end += spaces + credentials;
        }
    }
    Some(at..at + end)
}

/// Builds a [`Redactor`] with more secret names or credential patterns.
///
/// ```
/// use tower_toolcall::trace::Redactor;
///
/// let redactor = Redactor::builder()
///     .secret_name_ending("pin")
///     .credential_pattern(r"\bacme_[0-9a-f]{32}\b")
///     .build()?;
/// assert!(redactor.is_secret_name("card_pin"));
/// assert_eq!(
///     redactor.redact_str("key acme_0123456789abcdef0123456789abcdef"),
///     "key [REDACTED]"
/// );
/// # Ok::<(), tower_toolcall::ConfigError>(())
/// ```
#[derive(Debug, Default)]
#[must_use]
pub struct RedactorBuilder {
    name_endings: Vec<String>,
    names: Vec<String>,
    patterns: Vec<String>,
}

impl RedactorBuilder {
    /// Members whose normalized name ends with `ending` are secret.
    pub fn secret_name_ending(mut self, ending: impl Into<String>) -> Self {
        self.name_endings.push(ending.into());
        self
    }

    /// Members whose normalized name is `name` are secret.
    pub fn secret_name(mut self, name: impl Into<String>) -> Self {
        self.names.push(name.into());
        self
    }

    /// Strings matching `pattern` (a regular expression) are cut out of every value.
    pub fn credential_pattern(mut self, pattern: impl Into<String>) -> Self {
        self.patterns.push(pattern.into());
        self
    }

    /// Compiles the rules; a pattern that is not a valid regular expression is an error
    /// naming it.
    pub fn build(self) -> Result<Redactor, ConfigError> {
        for (i, pattern) in self.patterns.iter().enumerate() {
            Regex::new(pattern).map_err(|e| {
                ConfigError::new(
                    format!("redact.credential_patterns[{i}]"),
                    format!("is not a valid regular expression: {e}"),
                )
            })?;
        }
        let alternation = CREDENTIAL_PATTERNS
            .iter()
            .map(|p| (*p).to_owned())
            .chain(self.patterns)
            .map(|p| format!("(?:{p})"))
            .collect::<Vec<_>>()
            .join("|");
        let credentials = Regex::new(&alternation).map_err(|e| {
            ConfigError::new("redact.credential_patterns", format!("do not compile: {e}"))
        })?;
        Ok(Redactor {
            inner: Arc::new(Inner {
                name_endings: SECRET_NAME_ENDINGS
                    .iter()
                    .map(|s| (*s).to_owned())
                    .chain(self.name_endings.iter().map(|s| normalize_name(s)))
                    .collect(),
                names: SECRET_NAMES
                    .iter()
                    .map(|s| (*s).to_owned())
                    .chain(self.names.iter().map(|s| normalize_name(s)))
                    .collect(),
                credentials,
                assignments: Regex::new(ASSIGNMENT_PATTERN)
                    .expect("the assignment pattern compiles"),
            }),
        })
    }
}
