//! gRPC (feature `tonic`): a [`ToolError`] as a [`tonic::Status`], and a `Status` from an
//! upstream gRPC tool as a classified `ToolError`.
//!
//! A tonic service that runs calls through the stack answers its errors with
//! `Err(err.into())`; a tool that calls a gRPC upstream turns the upstream's `Status` into a
//! `ToolError` with [`from_status`], so that retry, the breaker and the result envelope
//! classify it like any other failure. tonic wants its service `Sync`: keep the stacked
//! tool in a `tower::util::BoxCloneSyncService` and `clone().oneshot(call)` it per request,
//! as `examples/src/bin/grpc.rs` does.
//!
//! | `ErrorCode` | gRPC code |
//! |---|---|
//! | `VALIDATION_ERROR` | `INVALID_ARGUMENT` |
//! | `POLICY_DENIED` | `PERMISSION_DENIED` |
//! | `NOT_FOUND` | `NOT_FOUND` |
//! | `CONFLICT`, `IDEMPOTENCY_IN_FLIGHT` | `ABORTED` |
//! | `IDEMPOTENCY_KEY_REUSED` | `ALREADY_EXISTS` |
//! | `PRECONDITION_FAILED`, `LOOP_DETECTED` | `FAILED_PRECONDITION` |
//! | `RATE_LIMITED`, `PAYLOAD_TOO_LARGE` | `RESOURCE_EXHAUSTED` |
//! | `TIMEOUT` | `DEADLINE_EXCEEDED` |
//! | `CANCELLED` | `CANCELLED` |
//! | `INTERNAL_ERROR` | `INTERNAL` |
//! | `UPSTREAM_ERROR` | `UNKNOWN` |
//! | `CIRCUIT_OPEN`, `RETRY_EXHAUSTED`, `STORE_UNAVAILABLE`, `UPSTREAM_UNAVAILABLE` | `UNAVAILABLE` |
//!
//! `LOOP_DETECTED` is `FAILED_PRECONDITION`, not `RESOURCE_EXHAUSTED`: gRPC clients retry the
//! latter after a pause, and sending the same call again is the loop the layer stopped; the
//! former tells the caller to change something first. The exact code also travels in the
//! `toolcall-error-code` metadata entry, so a `Status` made here turns back into the same
//! `ToolError` code; the retry-after hint travels as gRPC retry pushback
//! (`grpc-retry-pushback-ms`).
//!
//! ```
//! use std::time::Duration;
//! use tower_toolcall::{grpc, ErrorCode, ToolError};
//!
//! let err = ToolError::new(ErrorCode::RateLimited, "slow down")
//!     .with_retry_after(Duration::from_millis(1500));
//! let status = tonic::Status::from(err);
//! assert_eq!(status.code(), tonic::Code::ResourceExhausted);
//! assert_eq!(status.metadata().get("grpc-retry-pushback-ms").unwrap(), "1500");
//!
//! let back = grpc::from_status(&status);
//! assert_eq!(back.code(), ErrorCode::RateLimited);
//! assert_eq!(back.retry_after(), Some(Duration::from_millis(1500)));
//! ```

use std::time::Duration;

use tonic::metadata::MetadataValue;
use tonic::{Code, Status};

use crate::{ErrorClass, ErrorCode, ToolError};

/// The metadata entry that carries the crate's [`ErrorCode`] next to the gRPC code.
pub const ERROR_CODE_METADATA: &str = "toolcall-error-code";

/// The metadata entry of gRPC retry pushback: how many milliseconds to wait before retrying.
pub const RETRY_PUSHBACK_METADATA: &str = "grpc-retry-pushback-ms";

impl ErrorCode {
    /// The gRPC code that answers a call which ended with this code (the table of [`grpc`](crate::grpc)).
    ///
    /// ```
    /// use tower_toolcall::ErrorCode;
    ///
    /// assert_eq!(ErrorCode::CircuitOpen.grpc_code(), tonic::Code::Unavailable);
    /// assert_eq!(ErrorCode::LoopDetected.grpc_code(), tonic::Code::FailedPrecondition);
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
    pub const fn grpc_code(self) -> Code {
        match self {
            ErrorCode::ValidationError => Code::InvalidArgument,
            ErrorCode::PolicyDenied => Code::PermissionDenied,
            ErrorCode::NotFound => Code::NotFound,
            ErrorCode::Conflict | ErrorCode::IdempotencyInFlight => Code::Aborted,
            ErrorCode::IdempotencyKeyReused => Code::AlreadyExists,
            ErrorCode::PreconditionFailed | ErrorCode::LoopDetected => Code::FailedPrecondition,
            ErrorCode::RateLimited | ErrorCode::PayloadTooLarge => Code::ResourceExhausted,
            ErrorCode::Timeout => Code::DeadlineExceeded,
            ErrorCode::Cancelled => Code::Cancelled,
            ErrorCode::InternalError => Code::Internal,
            ErrorCode::UpstreamError => Code::Unknown,
            ErrorCode::CircuitOpen
            | ErrorCode::RetryExhausted
            | ErrorCode::StoreUnavailable
            | ErrorCode::UpstreamUnavailable => Code::Unavailable,
        }
    }
}

impl From<ToolError> for Status {
    fn from(err: ToolError) -> Self {
        let mut status = Status::new(err.code().grpc_code(), err.message());
        let metadata = status.metadata_mut();
        metadata.insert(
            ERROR_CODE_METADATA,
            MetadataValue::from_static(err.code().as_str()),
        );
        if let Some(after) = err.retry_after() {
            let millis = u64::try_from(after.as_millis()).unwrap_or(u64::MAX);
            metadata.insert(RETRY_PUSHBACK_METADATA, MetadataValue::from(millis));
        }
        status
    }
}

/// A `ToolError` for a `Status` answered by an upstream gRPC tool.
///
/// The crate's code in the `toolcall-error-code` entry wins (a `Status` made by this crate
/// keeps its code); otherwise the gRPC code decides:
///
/// | gRPC code | `ErrorCode` | class |
/// |---|---|---|
/// | `INVALID_ARGUMENT`, `OUT_OF_RANGE` | `VALIDATION_ERROR` | terminal |
/// | `PERMISSION_DENIED`, `UNAUTHENTICATED` | `POLICY_DENIED` | terminal |
/// | `NOT_FOUND`, `UNIMPLEMENTED` | `NOT_FOUND` | terminal |
/// | `ALREADY_EXISTS`, `ABORTED` | `CONFLICT` | terminal |
/// | `FAILED_PRECONDITION` | `PRECONDITION_FAILED` | terminal |
/// | `RESOURCE_EXHAUSTED` | `RATE_LIMITED` | retriable, not processed |
/// | `DEADLINE_EXCEEDED` | `TIMEOUT` | retriable |
/// | `UNAVAILABLE` | `UPSTREAM_UNAVAILABLE` | retriable |
/// | `CANCELLED` | `CANCELLED` | terminal |
/// | `DATA_LOSS` | `UPSTREAM_ERROR` | terminal |
/// | `UNKNOWN`, `INTERNAL`, `OK` | `UPSTREAM_ERROR` | unclassified |
///
/// `UNAVAILABLE` is retriable but not known to be unprocessed: the server may have acted
/// before it went away, so a mutating tool is retried only when another reason makes it safe.
/// Unclassified errors are retried for read-only and idempotent tools only. A
/// `grpc-retry-pushback-ms` entry becomes the retry-after hint.
///
/// ```
/// use tower_toolcall::{grpc, ErrorCode};
///
/// let err = grpc::from_status(&tonic::Status::unavailable("backend restarting"));
/// assert_eq!(err.code(), ErrorCode::UpstreamUnavailable);
/// assert!(err.is_retriable());
/// ```
pub fn from_status(status: &Status) -> ToolError {
    let crate_code = status
        .metadata()
        .get(ERROR_CODE_METADATA)
        .and_then(|value| value.to_str().ok())
        .and_then(ErrorCode::parse);
    let mut err = match crate_code {
        Some(code) => ToolError::new(code, status.message().to_owned()),
        None => {
            let (code, class, not_processed) = classify_code(status.code());
            ToolError::new(code, status.message().to_owned())
                .with_class(class)
                .not_processed(not_processed)
        }
    };
    let pushback = status
        .metadata()
        .get(RETRY_PUSHBACK_METADATA)
        .and_then(|value| value.to_str().ok())
        .and_then(|text| text.parse::<u64>().ok());
    if let Some(millis) = pushback {
        err = err.with_retry_after(Duration::from_millis(millis));
    }
    err
}

fn classify_code(code: Code) -> (ErrorCode, ErrorClass, bool) {
    use ErrorClass::{Retriable, Terminal, Unclassified};
    match code {
        Code::InvalidArgument | Code::OutOfRange => (ErrorCode::ValidationError, Terminal, false),
        Code::PermissionDenied | Code::Unauthenticated => {
            (ErrorCode::PolicyDenied, Terminal, false)
        }
        Code::NotFound | Code::Unimplemented => (ErrorCode::NotFound, Terminal, false),
        Code::AlreadyExists | Code::Aborted => (ErrorCode::Conflict, Terminal, false),
        Code::FailedPrecondition => (ErrorCode::PreconditionFailed, Terminal, false),
        Code::ResourceExhausted => (ErrorCode::RateLimited, Retriable, true),
        Code::DeadlineExceeded => (ErrorCode::Timeout, Retriable, false),
        Code::Unavailable => (ErrorCode::UpstreamUnavailable, Retriable, false),
        Code::Cancelled => (ErrorCode::Cancelled, Terminal, false),
        Code::DataLoss => (ErrorCode::UpstreamError, Terminal, false),
        Code::Unknown | Code::Internal | Code::Ok => {
            (ErrorCode::UpstreamError, Unclassified, false)
        }
    }
}

impl From<Status> for ToolError {
    fn from(status: Status) -> Self {
        from_status(&status)
    }
}
