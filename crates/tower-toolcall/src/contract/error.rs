//! The one error type of every layer, [`ToolError`], its stable [`ErrorCode`]s, and
//! [`ConfigError`] for configuration rejected when a stack is built.

use std::borrow::Cow;
use std::fmt;
use std::io;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde_json::Value;

use crate::contract::record::{CallRecord, ShortCircuit};

/// Stable, machine-readable error codes.
///
/// The string form ([`ErrorCode::as_str`]) is what appears in the `ToolResult` envelope and
/// in logs, and what the code serializes to; it never changes between releases.
/// [`ErrorCode::http_status`] gives the HTTP status of each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    /// The envelope or the params are malformed (HTTP 400 / 422 semantics).
    ValidationError,
    /// Policy forbids the call: a denied tool, a missing confirmation, an authorization failure.
    PolicyDenied,
    /// The tool, or what it was asked to act on, does not exist.
    NotFound,
    /// The call collides with the current state (an etag mismatch, for example).
    Conflict,
    /// A precondition of the tool does not hold.
    PreconditionFailed,
    /// An attempt, or the whole call, ran out of time.
    Timeout,
    /// The call was cancelled before it finished.
    Cancelled,
    /// The tool failed in an unexpected way.
    InternalError,
    /// The circuit breaker for the tool (or its dependency) is open: the tool was not called.
    CircuitOpen,
    /// Every allowed attempt failed, or the retry deadline passed.
    RetryExhausted,
    /// The model repeated the same call too often: the tool was not called.
    LoopDetected,
    /// A rate limit rejected the call: the tool was not called.
    RateLimited,
    /// A call with the same idempotency key is still running (HTTP 409 semantics).
    IdempotencyInFlight,
    /// The idempotency key was used before with other params (HTTP 422 semantics).
    IdempotencyKeyReused,
    /// The params are larger than the configured limit.
    PayloadTooLarge,
    /// The dedupe store could not be reached.
    StoreUnavailable,
    /// The tool's upstream dependency is unreachable or unavailable.
    UpstreamUnavailable,
    /// The tool's upstream dependency answered with an error.
    UpstreamError,
}

impl ErrorCode {
    /// Every code, in declaration order.
    pub const ALL: [ErrorCode; 18] = [
        ErrorCode::ValidationError,
        ErrorCode::PolicyDenied,
        ErrorCode::NotFound,
        ErrorCode::Conflict,
        ErrorCode::PreconditionFailed,
        ErrorCode::Timeout,
        ErrorCode::Cancelled,
        ErrorCode::InternalError,
        ErrorCode::CircuitOpen,
        ErrorCode::RetryExhausted,
        ErrorCode::LoopDetected,
        ErrorCode::RateLimited,
        ErrorCode::IdempotencyInFlight,
        ErrorCode::IdempotencyKeyReused,
        ErrorCode::PayloadTooLarge,
        ErrorCode::StoreUnavailable,
        ErrorCode::UpstreamUnavailable,
        ErrorCode::UpstreamError,
    ];

    /// The stable string form, e.g. `"VALIDATION_ERROR"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorCode::ValidationError => "VALIDATION_ERROR",
            ErrorCode::PolicyDenied => "POLICY_DENIED",
            ErrorCode::NotFound => "NOT_FOUND",
            ErrorCode::Conflict => "CONFLICT",
            ErrorCode::PreconditionFailed => "PRECONDITION_FAILED",
            ErrorCode::Timeout => "TIMEOUT",
            ErrorCode::Cancelled => "CANCELLED",
            ErrorCode::InternalError => "INTERNAL_ERROR",
            ErrorCode::CircuitOpen => "CIRCUIT_OPEN",
            ErrorCode::RetryExhausted => "RETRY_EXHAUSTED",
            ErrorCode::LoopDetected => "LOOP_DETECTED",
            ErrorCode::RateLimited => "RATE_LIMITED",
            ErrorCode::IdempotencyInFlight => "IDEMPOTENCY_IN_FLIGHT",
            ErrorCode::IdempotencyKeyReused => "IDEMPOTENCY_KEY_REUSED",
            ErrorCode::PayloadTooLarge => "PAYLOAD_TOO_LARGE",
            ErrorCode::StoreUnavailable => "STORE_UNAVAILABLE",
            ErrorCode::UpstreamUnavailable => "UPSTREAM_UNAVAILABLE",
            ErrorCode::UpstreamError => "UPSTREAM_ERROR",
        }
    }

    /// Parses the string form; `None` for a string that is not a known code.
    pub fn parse(code: &str) -> Option<ErrorCode> {
        ErrorCode::ALL.into_iter().find(|c| c.as_str() == code)
    }

    /// The HTTP status that answers a call which ended with this code, for gateways that
    /// put the stack behind HTTP (the `axum` feature uses it).
    ///
    /// | code | status |
    /// |---|---|
    /// | `VALIDATION_ERROR` | 400 Bad Request |
    /// | `POLICY_DENIED` | 403 Forbidden |
    /// | `NOT_FOUND` | 404 Not Found |
    /// | `CONFLICT`, `IDEMPOTENCY_IN_FLIGHT`, `LOOP_DETECTED` | 409 Conflict |
    /// | `PRECONDITION_FAILED` | 412 Precondition Failed |
    /// | `PAYLOAD_TOO_LARGE` | 413 Content Too Large |
    /// | `IDEMPOTENCY_KEY_REUSED` | 422 Unprocessable Content |
    /// | `RATE_LIMITED` | 429 Too Many Requests |
    /// | `CANCELLED` | 499 Client Closed Request |
    /// | `INTERNAL_ERROR` | 500 Internal Server Error |
    /// | `RETRY_EXHAUSTED`, `UPSTREAM_ERROR` | 502 Bad Gateway |
    /// | `CIRCUIT_OPEN`, `STORE_UNAVAILABLE`, `UPSTREAM_UNAVAILABLE` | 503 Service Unavailable |
    /// | `TIMEOUT` | 504 Gateway Timeout |
    ///
    /// `LOOP_DETECTED` is a 409, not a 429: the call conflicts with the session's own
    /// history (the same call made too often in a row), and sending it again later fails the
    /// same way, since the code is terminal. A 429 tells HTTP clients to wait and send the
    /// same request again, which is the loop the layer stopped; a 409 tells them to change
    /// the request. `CANCELLED` uses the 499 of nginx and other gateways: the caller went
    /// away before the answer.
    ///
    /// ```
    /// use tower_toolcall::ErrorCode;
    ///
    /// assert_eq!(ErrorCode::CircuitOpen.http_status(), 503);
    /// assert_eq!(ErrorCode::LoopDetected.http_status(), 409);
    /// assert_eq!(ErrorCode::IdempotencyKeyReused.http_status(), 422);
    /// ```
    pub const fn http_status(self) -> u16 {
        match self {
            ErrorCode::ValidationError => 400,
            ErrorCode::PolicyDenied => 403,
            ErrorCode::NotFound => 404,
            ErrorCode::Conflict | ErrorCode::IdempotencyInFlight | ErrorCode::LoopDetected => 409,
            ErrorCode::PreconditionFailed => 412,
            ErrorCode::PayloadTooLarge => 413,
            ErrorCode::IdempotencyKeyReused => 422,
            ErrorCode::RateLimited => 429,
            ErrorCode::Cancelled => 499,
            ErrorCode::InternalError => 500,
            ErrorCode::RetryExhausted | ErrorCode::UpstreamError => 502,
            ErrorCode::CircuitOpen
            | ErrorCode::StoreUnavailable
            | ErrorCode::UpstreamUnavailable => 503,
            ErrorCode::Timeout => 504,
        }
    }

    /// The class an error with this code has unless its creator says otherwise.
    pub const fn default_class(self) -> ErrorClass {
        match self {
            ErrorCode::Timeout
            | ErrorCode::RateLimited
            | ErrorCode::IdempotencyInFlight
            | ErrorCode::StoreUnavailable
            | ErrorCode::UpstreamUnavailable
            | ErrorCode::CircuitOpen => ErrorClass::Retriable,
            ErrorCode::InternalError | ErrorCode::UpstreamError => ErrorClass::Unclassified,
            _ => ErrorClass::Terminal,
        }
    }
}

impl PartialEq<str> for ErrorCode {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for ErrorCode {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl std::str::FromStr for ErrorCode {
    type Err = UnknownErrorCode;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ErrorCode::parse(s).ok_or_else(|| UnknownErrorCode(s.to_owned()))
    }
}

/// A string that is not one of the [`ErrorCode`]s, from [`ErrorCode`]'s `FromStr`.
///
/// ```
/// use tower_toolcall::ErrorCode;
///
/// assert_eq!("TIMEOUT".parse::<ErrorCode>().unwrap(), ErrorCode::Timeout);
/// assert!("SLOW".parse::<ErrorCode>().unwrap_err().to_string().contains("SLOW"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownErrorCode(String);

impl fmt::Display for UnknownErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown error code {:?}; use one of the codes of `ErrorCode`",
            self.0
        )
    }
}

impl std::error::Error for UnknownErrorCode {}

impl serde::Serialize for ErrorCode {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for ErrorCode {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let code = String::deserialize(deserializer)?;
        ErrorCode::parse(&code)
            .ok_or_else(|| serde::de::Error::unknown_variant(&code, &ALL_CODE_STRS))
    }
}

const ALL_CODE_STRS: [&str; 18] = {
    let mut names = [""; 18];
    let mut i = 0;
    while i < names.len() {
        names[i] = ErrorCode::ALL[i].as_str();
        i += 1;
    }
    names
};

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether trying the call again may succeed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorClass {
    /// A transient failure: a later attempt may succeed.
    Retriable,
    /// A permanent failure: another attempt fails the same way.
    Terminal,
    /// The error does not say. The classifier decides from the tool's risk level: retriable for
    /// read-only or idempotent tools, terminal for mutating tools.
    Unclassified,
}

/// The error of every layer and of every tool service.
///
/// A `ToolError` has a stable [`code`](ToolError::code), a message meant for a person (and for
/// the model), a [class](ErrorClass), whether the request is known *not* to have been processed
/// (so that retrying a mutating tool is safe), and optional details: the HTTP status of an
/// upstream answer, a retry-after hint and structured details. It also carries the
/// [`CallRecord`] that the layers enrich on the way out.
///
/// ```
/// use std::time::Duration;
/// use tower_toolcall::{ErrorClass, ErrorCode, ToolError};
///
/// let err = ToolError::from_http_status(503, "search backend is down")
///     .with_retry_after(Duration::from_secs(2));
/// assert_eq!(err.code(), ErrorCode::UpstreamUnavailable);
/// assert_eq!(err.class(), ErrorClass::Retriable);
/// assert_eq!(err.http_status(), Some(503));
/// assert_eq!(err.retry_after(), Some(Duration::from_secs(2)));
/// ```
#[derive(Clone)]
pub struct ToolError {
    inner: Box<Inner>,
}

#[derive(Clone)]
struct Inner {
    code: ErrorCode,
    message: Cow<'static, str>,
    class: ErrorClass,
    not_processed: bool,
    rejected: bool,
    health_failure: Option<bool>,
    http_status: Option<u16>,
    retry_after: Option<Duration>,
    details: Details,
    source: Option<Arc<dyn std::error::Error + Send + Sync>>,
    record: CallRecord,
}

/// Structured details: none, a value, or a value made when first read.
#[derive(Clone, Default)]
enum Details {
    #[default]
    None,
    Ready(Value),
    Lazy {
        make: Arc<dyn Fn() -> Value + Send + Sync>,
        made: OnceLock<Value>,
    },
}

impl ToolError {
    /// An error with `code`, its default class, and `message`.
    pub fn new(code: ErrorCode, message: impl Into<Cow<'static, str>>) -> Self {
        ToolError {
            inner: Box::new(Inner {
                code,
                message: message.into(),
                class: code.default_class(),
                not_processed: false,
                rejected: false,
                health_failure: None,
                http_status: None,
                retry_after: None,
                details: Details::None,
                source: None,
                record: CallRecord::default(),
            }),
        }
    }

    /// An error for a call that a layer rejected before the tool ran: the request is known
    /// not to have been processed ([`is_not_processed`](ToolError::is_not_processed)) and no
    /// attempt was made ([`is_rejected`](ToolError::is_rejected)).
    ///
    /// ```
    /// use tower_toolcall::{ErrorCode, ToolError};
    ///
    /// let err = ToolError::rejected(ErrorCode::RateLimited, "slow down");
    /// assert!(err.is_rejected());
    /// assert!(err.is_not_processed());
    /// ```
    pub fn rejected(code: ErrorCode, message: impl Into<Cow<'static, str>>) -> Self {
        ToolError::new(code, message).into_rejection()
    }

    /// Marks the error as the answer to a call that was rejected before the tool ran.
    pub(crate) fn into_rejection(mut self) -> Self {
        self.inner.not_processed = true;
        self.inner.rejected = true;
        self
    }

    /// Marks the error as the answer of a layer that did not run the tool, and on which path
    /// ([`CallRecord::short_circuit`]); hooks and logs tell such answers from attempts by it.
    pub fn short_circuited(mut self, path: ShortCircuit) -> Self {
        self.inner.record.short_circuit = Some(path);
        self
    }

    /// A `VALIDATION_ERROR` about `field` (a dotted path such as `target.sessionKey`); the
    /// field is also put in the details as `{"field": …}`.
    pub fn invalid_field(field: &str, problem: impl fmt::Display) -> Self {
        ToolError::rejected(
            ErrorCode::ValidationError,
            format!("invalid tool call: `{field}` {problem}"),
        )
        .with_details(serde_json::json!({ "field": field }))
    }

    /// A `TIMEOUT` after `elapsed`; retriable.
    pub fn timeout(elapsed: Duration) -> Self {
        ToolError::new(
            ErrorCode::Timeout,
            format!(
                "the tool did not answer within {} ms; try again or raise the timeout",
                elapsed.as_millis()
            ),
        )
    }

    /// An error for an answer of an upstream HTTP service with `status`.
    ///
    /// 400 and 422 become `VALIDATION_ERROR`, 401 and 403 `POLICY_DENIED`, 404 `NOT_FOUND`,
    /// 409 `CONFLICT`, 412 `PRECONDITION_FAILED`, 413 `PAYLOAD_TOO_LARGE` (all terminal);
    /// 408 `TIMEOUT`, 429 `RATE_LIMITED`, 502, 503 and 504 `UPSTREAM_UNAVAILABLE`, other 5xx
    /// `UPSTREAM_ERROR` (all retriable); 429 and 503 say the request was not processed. Any
    /// other status is an `UPSTREAM_ERROR` that is terminal for 4xx and unclassified otherwise.
    pub fn from_http_status(status: u16, message: impl Into<Cow<'static, str>>) -> Self {
        let (code, class, not_processed) = match status {
            400 | 422 => (ErrorCode::ValidationError, ErrorClass::Terminal, false),
            401 | 403 => (ErrorCode::PolicyDenied, ErrorClass::Terminal, false),
            404 => (ErrorCode::NotFound, ErrorClass::Terminal, false),
            409 => (ErrorCode::Conflict, ErrorClass::Terminal, false),
            412 => (ErrorCode::PreconditionFailed, ErrorClass::Terminal, false),
            413 => (ErrorCode::PayloadTooLarge, ErrorClass::Terminal, false),
            408 => (ErrorCode::Timeout, ErrorClass::Retriable, false),
            429 => (ErrorCode::RateLimited, ErrorClass::Retriable, true),
            503 => (ErrorCode::UpstreamUnavailable, ErrorClass::Retriable, true),
            502 | 504 => (ErrorCode::UpstreamUnavailable, ErrorClass::Retriable, false),
            500..=599 => (ErrorCode::UpstreamError, ErrorClass::Retriable, false),
            400..=499 => (ErrorCode::UpstreamError, ErrorClass::Terminal, false),
            _ => (ErrorCode::UpstreamError, ErrorClass::Unclassified, false),
        };
        let mut err = ToolError::new(code, message)
            .with_class(class)
            .not_processed(not_processed);
        err.inner.http_status = Some(status);
        err
    }

    /// An error for a failed I/O operation of the tool, classified by its kind.
    ///
    /// Connection refused, unreachable hosts and addresses that cannot be bound say the
    /// request was not processed; resets, aborts and broken pipes are retriable but may have
    /// been processed; a timed-out operation is a `TIMEOUT`; not-found, permission and
    /// invalid-input errors are terminal.
    pub fn from_io_error(err: io::Error) -> Self {
        use io::ErrorKind as K;
        let (code, class, not_processed) = match err.kind() {
            K::ConnectionRefused
            | K::AddrNotAvailable
            | K::NotConnected
            | K::HostUnreachable
            | K::NetworkUnreachable
            | K::NetworkDown => (ErrorCode::UpstreamUnavailable, ErrorClass::Retriable, true),
            K::ConnectionReset
            | K::ConnectionAborted
            | K::BrokenPipe
            | K::UnexpectedEof
            | K::Interrupted
            | K::WouldBlock => (ErrorCode::UpstreamUnavailable, ErrorClass::Retriable, false),
            K::TimedOut => (ErrorCode::Timeout, ErrorClass::Retriable, false),
            K::NotFound => (ErrorCode::NotFound, ErrorClass::Terminal, false),
            K::PermissionDenied => (ErrorCode::PolicyDenied, ErrorClass::Terminal, false),
            K::InvalidInput | K::InvalidData => {
                (ErrorCode::ValidationError, ErrorClass::Terminal, false)
            }
            K::AlreadyExists => (ErrorCode::Conflict, ErrorClass::Terminal, false),
            _ => (ErrorCode::InternalError, ErrorClass::Unclassified, false),
        };
        let message = err.to_string();
        ToolError::new(code, message)
            .with_class(class)
            .not_processed(not_processed)
            .with_source(err)
    }

    /// The stable code.
    pub fn code(&self) -> ErrorCode {
        self.inner.code
    }

    /// The message, meant for a person and for the model.
    pub fn message(&self) -> &str {
        &self.inner.message
    }

    /// Whether a later attempt may succeed.
    pub fn class(&self) -> ErrorClass {
        self.inner.class
    }

    /// `true` when the class is [`ErrorClass::Retriable`].
    pub fn is_retriable(&self) -> bool {
        self.inner.class == ErrorClass::Retriable
    }

    /// `true` when the request is known not to have been processed (connection refused,
    /// 429, 503, or a layer rejected the call), so that retrying a mutating tool is safe.
    pub fn is_not_processed(&self) -> bool {
        self.inner.not_processed
    }

    /// `true` when the call was rejected before the tool ran: by a layer
    /// ([`ToolError::rejected`]) or by a hook that denied the attempt. This is the one signal
    /// of a call that did not run: the classifier ignores such an error (it is neither
    /// retried nor counted by a breaker), the retry layer does not count it as an attempt, and
    /// the trace logs it as `tool_call_blocked`.
    ///
    /// A tool's own "not processed" errors (connection refused, 429, 503) are not rejections:
    /// the tool was called, the attempt counts, and a breaker counts the failure.
    ///
    /// ```
    /// use tower_toolcall::{ErrorCode, ToolError};
    ///
    /// assert!(ToolError::rejected(ErrorCode::CircuitOpen, "open").is_rejected());
    /// let refused = ToolError::from_http_status(503, "backend down");
    /// assert!(refused.is_not_processed());
    /// assert!(!refused.is_rejected());
    /// ```
    pub fn is_rejected(&self) -> bool {
        self.inner.rejected
    }

    /// Whether the failure speaks of the dependency's health, when whoever made the error
    /// knows ([`with_health_failure`](ToolError::with_health_failure)); `None`: the
    /// [classifier](crate::classify) decides from the code.
    pub fn health_failure(&self) -> Option<bool> {
        self.inner.health_failure
    }

    /// How many times the tool ran for the call that ended with this error: the count the
    /// retry layer wrote, else none for a rejected call, else one.
    pub(crate) fn attempts(&self) -> u32 {
        let ran_once = u32::from(!self.inner.rejected);
        self.inner.record.attempts.unwrap_or(ran_once)
    }

    /// The HTTP status of the upstream answer, if there was one.
    pub fn http_status(&self) -> Option<u16> {
        self.inner.http_status
    }

    /// How long the upstream asked to wait before the next attempt.
    pub fn retry_after(&self) -> Option<Duration> {
        self.inner.retry_after
    }

    /// Structured details, if any.
    pub fn details(&self) -> Option<&Value> {
        match &self.inner.details {
            Details::None => None,
            Details::Ready(value) => Some(value),
            Details::Lazy { make, made } => Some(made.get_or_init(|| make())),
        }
    }

    /// The record the layers enriched on the way out.
    pub fn record(&self) -> &CallRecord {
        &self.inner.record
    }

    /// Mutable access to the record, for layers.
    pub fn record_mut(&mut self) -> &mut CallRecord {
        &mut self.inner.record
    }

    /// Sets the class.
    pub fn with_class(mut self, class: ErrorClass) -> Self {
        self.inner.class = class;
        self
    }

    /// Says whether the request is known not to have been processed. A rejected call is never
    /// processed: `not_processed(false)` also clears [`is_rejected`](ToolError::is_rejected).
    pub fn not_processed(mut self, not_processed: bool) -> Self {
        self.inner.not_processed = not_processed;
        self.inner.rejected &= not_processed;
        self
    }

    /// Says whether the failure speaks of the dependency's health, overriding what the
    /// [classifier](crate::classify) would read from the code: an MCP result with `isError`
    /// is the tool speaking to the model (`false`), and a failure an adapter already counted
    /// on a breaker of its own need not be counted again per tool.
    ///
    /// ```
    /// use tower_toolcall::classify::{Classify, DefaultClassifier, ToolProfile};
    /// use tower_toolcall::registry::ToolPolicy;
    /// use tower_toolcall::{ErrorClass, ErrorCode, ToolError};
    ///
    /// let tool = ToolProfile::new(None, &ToolPolicy::default());
    /// let said = ToolError::new(ErrorCode::UpstreamError, "no such timezone: Mars/Olympus")
    ///     .with_class(ErrorClass::Terminal)
    ///     .with_health_failure(false);
    /// assert!(!DefaultClassifier.classify(&Err(said), &tool).is_health_failure());
    /// ```
    pub fn with_health_failure(mut self, counts: bool) -> Self {
        self.inner.health_failure = Some(counts);
        self
    }

    /// Sets the HTTP status of the upstream answer.
    pub fn with_http_status(mut self, status: u16) -> Self {
        self.inner.http_status = Some(status);
        self
    }

    /// Sets the retry-after hint.
    pub fn with_retry_after(mut self, retry_after: Duration) -> Self {
        self.inner.retry_after = Some(retry_after);
        self
    }

    /// Sets structured details.
    pub fn with_details(mut self, details: Value) -> Self {
        self.inner.details = Details::Ready(details);
        self
    }

    /// Sets structured details made by `make` when they are first read, so that an error
    /// nobody inspects costs no JSON. `make` must give the same value each time.
    ///
    /// ```
    /// use serde_json::json;
    /// use tower_toolcall::{ErrorCode, ToolError};
    ///
    /// let repeats = 4;
    /// let err = ToolError::rejected(ErrorCode::LoopDetected, "loop")
    ///     .with_details_fn(move || json!({"repeats": repeats}));
    /// assert_eq!(err.details(), Some(&json!({"repeats": 4})));
    /// ```
    pub fn with_details_fn(mut self, make: impl Fn() -> Value + Send + Sync + 'static) -> Self {
        self.inner.details = Details::Lazy {
            make: Arc::new(make),
            made: OnceLock::new(),
        };
        self
    }

    /// Replaces the message.
    pub fn with_message(mut self, message: impl Into<Cow<'static, str>>) -> Self {
        self.inner.message = message.into();
        self
    }

    /// Keeps the underlying error as the [source](std::error::Error::source).
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.inner.source = Some(Arc::new(source));
        self
    }
}

impl fmt::Debug for ToolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("ToolError");
        d.field("code", &self.inner.code)
            .field("message", &self.inner.message)
            .field("class", &self.inner.class)
            .field("not_processed", &self.inner.not_processed);
        if self.inner.rejected {
            d.field("rejected", &true);
        }
        if let Some(counts) = self.inner.health_failure {
            d.field("health_failure", &counts);
        }
        if let Some(status) = self.inner.http_status {
            d.field("http_status", &status);
        }
        if let Some(after) = self.inner.retry_after {
            d.field("retry_after", &after);
        }
        if let Some(details) = self.details() {
            d.field("details", details);
        }
        d.finish_non_exhaustive()
    }
}

impl fmt::Display for ToolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.inner.code, self.inner.message)
    }
}

impl std::error::Error for ToolError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.inner
            .source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl From<io::Error> for ToolError {
    fn from(err: io::Error) -> Self {
        ToolError::from_io_error(err)
    }
}

/// A service that cannot fail (a result envelope service, for one) fits where a
/// `ToolError` is expected.
impl From<std::convert::Infallible> for ToolError {
    fn from(never: std::convert::Infallible) -> Self {
        match never {}
    }
}

impl From<tokio::time::error::Elapsed> for ToolError {
    fn from(_: tokio::time::error::Elapsed) -> Self {
        ToolError::new(
            ErrorCode::Timeout,
            "the tool did not answer in time; try again or raise the timeout",
        )
    }
}

/// Configuration rejected when a layer, a registry or a stack is built.
///
/// It names the field (a dotted path such as `tools[2].policy.retry.max_attempts`) and what
/// is wrong with it.
///
/// ```
/// use tower_toolcall::ConfigError;
///
/// let err = ConfigError::new("retry.max_attempts", "must be at least 1, got 0");
/// assert_eq!(err.field(), "retry.max_attempts");
/// assert_eq!(
///     err.to_string(),
///     "invalid configuration: `retry.max_attempts` must be at least 1, got 0"
/// );
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    field: String,
    problem: String,
}

impl ConfigError {
    /// An error about `field`.
    pub fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        ConfigError {
            field: field.into(),
            problem: problem.into(),
        }
    }

    /// The field, as a dotted path.
    pub fn field(&self) -> &str {
        &self.field
    }

    /// What is wrong with it.
    pub fn problem(&self) -> &str {
        &self.problem
    }

    /// The same error with `prefix` put in front of the field path.
    pub fn within(mut self, prefix: &str) -> Self {
        self.field = if self.field.is_empty() {
            prefix.to_owned()
        } else if self.field.starts_with('[') {
            format!("{prefix}{}", self.field)
        } else {
            format!("{prefix}.{}", self.field)
        };
        self
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            write!(f, "invalid configuration: {}", self.problem)
        } else {
            write!(
                f,
                "invalid configuration: `{}` {}",
                self.field, self.problem
            )
        }
    }
}

impl std::error::Error for ConfigError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rejection_is_never_processed_and_no_attempt() {
        let rejected = ToolError::rejected(ErrorCode::RateLimited, "slow down");
        assert!(rejected.is_rejected() && rejected.is_not_processed());
        assert_eq!(rejected.record().attempts, None);
        assert_eq!(rejected.attempts(), 0);
        assert!(format!("{rejected:?}").contains("rejected: true"));

        let processed = rejected.not_processed(false);
        assert!(!processed.is_rejected());
        assert_eq!(processed.attempts(), 1);

        let denied = ToolError::new(ErrorCode::PolicyDenied, "paused").into_rejection();
        assert!(denied.is_rejected() && denied.is_not_processed());

        let refused = ToolError::from_io_error(io::Error::from(io::ErrorKind::ConnectionRefused));
        assert!(refused.is_not_processed() && !refused.is_rejected());
        assert_eq!(refused.attempts(), 1);

        let mut retried = ToolError::rejected(ErrorCode::CircuitOpen, "open");
        retried.record_mut().attempts = Some(2);
        assert_eq!(retried.attempts(), 2, "the retry layer's count wins");
    }
}
