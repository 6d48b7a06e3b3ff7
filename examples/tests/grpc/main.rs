//! The `tonic` feature: `ToolError` ↔ `Status` both ways, and the example's gRPC tool service
//! called with the generated client on a loopback port.

#[allow(dead_code, unreachable_pub)]
#[path = "../../src/bin/grpc.rs"]
mod example;

use std::sync::atomic::Ordering;
use std::time::Duration;

use example::proto::tools_client::ToolsClient;
use example::proto::CallRequest;
use tonic::{Code, Status};
use tower_toolcall::grpc::{from_status, ERROR_CODE_METADATA, RETRY_PUSHBACK_METADATA};
use tower_toolcall::{ErrorClass, ErrorCode, ToolError};

#[test]
fn every_error_code_has_its_grpc_code_and_comes_back_unchanged() {
    let expected = [
        (ErrorCode::ValidationError, Code::InvalidArgument),
        (ErrorCode::PolicyDenied, Code::PermissionDenied),
        (ErrorCode::NotFound, Code::NotFound),
        (ErrorCode::Conflict, Code::Aborted),
        (ErrorCode::PreconditionFailed, Code::FailedPrecondition),
        (ErrorCode::Timeout, Code::DeadlineExceeded),
        (ErrorCode::Cancelled, Code::Cancelled),
        (ErrorCode::InternalError, Code::Internal),
        (ErrorCode::CircuitOpen, Code::Unavailable),
        (ErrorCode::RetryExhausted, Code::Unavailable),
        (ErrorCode::LoopDetected, Code::FailedPrecondition),
        (ErrorCode::RateLimited, Code::ResourceExhausted),
        (ErrorCode::IdempotencyInFlight, Code::Aborted),
        (ErrorCode::IdempotencyKeyReused, Code::AlreadyExists),
        (ErrorCode::PayloadTooLarge, Code::ResourceExhausted),
        (ErrorCode::StoreUnavailable, Code::Unavailable),
        (ErrorCode::UpstreamUnavailable, Code::Unavailable),
        (ErrorCode::UpstreamError, Code::Unknown),
    ];
    assert_eq!(
        expected.len(),
        ErrorCode::ALL.len(),
        "every code is in the table"
    );
    for (code, grpc) in expected {
        let status = Status::from(ToolError::new(code, "boom"));
        assert_eq!(status.code(), grpc, "{code}");
        assert_eq!(status.message(), "boom");
        assert_eq!(
            status.metadata().get(ERROR_CODE_METADATA).unwrap(),
            code.as_str()
        );
        assert!(status.metadata().get(RETRY_PUSHBACK_METADATA).is_none());
        let back = from_status(&status);
        assert_eq!(back.code(), code, "{code} round trip");
        assert_eq!(back.class(), code.default_class(), "{code} class");
    }
}

#[test]
fn retry_after_travels_as_retry_pushback() {
    let err = ToolError::new(ErrorCode::CircuitOpen, "open")
        .with_retry_after(Duration::from_millis(30_000));
    let status = Status::from(err);
    assert_eq!(
        status.metadata().get(RETRY_PUSHBACK_METADATA).unwrap(),
        "30000"
    );
    assert_eq!(
        from_status(&status).retry_after(),
        Some(Duration::from_secs(30))
    );

    let mut upstream = Status::resource_exhausted("quota");
    upstream
        .metadata_mut()
        .insert(RETRY_PUSHBACK_METADATA, "250".parse().unwrap());
    let err = ToolError::from(upstream);
    assert_eq!(err.code(), ErrorCode::RateLimited);
    assert_eq!(err.retry_after(), Some(Duration::from_millis(250)));

    let mut garbled = Status::unavailable("down");
    garbled
        .metadata_mut()
        .insert(RETRY_PUSHBACK_METADATA, "soon".parse().unwrap());
    assert_eq!(from_status(&garbled).retry_after(), None);
}

#[test]
fn an_upstream_status_is_classified_by_its_code() {
    use ErrorClass::{Retriable, Terminal, Unclassified};
    let table = [
        (
            Code::InvalidArgument,
            ErrorCode::ValidationError,
            Terminal,
            false,
        ),
        (
            Code::OutOfRange,
            ErrorCode::ValidationError,
            Terminal,
            false,
        ),
        (
            Code::PermissionDenied,
            ErrorCode::PolicyDenied,
            Terminal,
            false,
        ),
        (
            Code::Unauthenticated,
            ErrorCode::PolicyDenied,
            Terminal,
            false,
        ),
        (Code::NotFound, ErrorCode::NotFound, Terminal, false),
        (Code::Unimplemented, ErrorCode::NotFound, Terminal, false),
        (Code::AlreadyExists, ErrorCode::Conflict, Terminal, false),
        (Code::Aborted, ErrorCode::Conflict, Terminal, false),
        (
            Code::FailedPrecondition,
            ErrorCode::PreconditionFailed,
            Terminal,
            false,
        ),
        (
            Code::ResourceExhausted,
            ErrorCode::RateLimited,
            Retriable,
            true,
        ),
        (Code::DeadlineExceeded, ErrorCode::Timeout, Retriable, false),
        (
            Code::Unavailable,
            ErrorCode::UpstreamUnavailable,
            Retriable,
            false,
        ),
        (Code::Cancelled, ErrorCode::Cancelled, Terminal, false),
        (Code::DataLoss, ErrorCode::UpstreamError, Terminal, false),
        (Code::Unknown, ErrorCode::UpstreamError, Unclassified, false),
        (
            Code::Internal,
            ErrorCode::UpstreamError,
            Unclassified,
            false,
        ),
        (Code::Ok, ErrorCode::UpstreamError, Unclassified, false),
    ];
    for (grpc, code, class, not_processed) in table {
        let err = from_status(&Status::new(grpc, "upstream said no"));
        assert_eq!(err.code(), code, "{grpc:?}");
        assert_eq!(err.class(), class, "{grpc:?}");
        assert_eq!(err.is_not_processed(), not_processed, "{grpc:?}");
        assert!(!err.is_rejected(), "{grpc:?}: the upstream was called");
        assert_eq!(err.message(), "upstream said no");
    }
    // An unknown crate code in the metadata falls back to the gRPC code.
    let mut status = Status::unavailable("down");
    status
        .metadata_mut()
        .insert(ERROR_CODE_METADATA, "NOT_A_CODE".parse().unwrap());
    assert_eq!(from_status(&status).code(), ErrorCode::UpstreamUnavailable);
}

async fn started() -> (
    ToolsClient<tonic::transport::Channel>,
    example::UpstreamCalls,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let upstream = example::UpstreamCalls::default();
    tokio::spawn(example::serve(listener, upstream.clone()));
    let client = ToolsClient::connect(format!("http://{address}"))
        .await
        .unwrap();
    (client, upstream)
}

fn request(namespace: &str, name: &str, params: &str, key: &str) -> CallRequest {
    CallRequest {
        namespace: namespace.into(),
        name: name.into(),
        params_json: params.into(),
        session_key: "s-1".into(),
        idempotency_key: key.into(),
    }
}

#[tokio::test]
async fn the_example_service_retries_an_unavailable_upstream_over_grpc() {
    let (mut client, upstream) = started().await;
    let reply = client
        .call(request("weather", "forecast", r#"{"city": "Lyon"}"#, ""))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&reply.content_json).unwrap(),
        serde_json::json!({"city": "Lyon", "sky": "clear"})
    );
    assert!(!reply.from_cache);
    assert_eq!(
        upstream.0.load(Ordering::SeqCst),
        2,
        "UNAVAILABLE, then the retry"
    );
}

#[tokio::test]
async fn the_example_service_answers_errors_with_their_grpc_codes() {
    let (mut client, _) = started().await;

    let invalid = client
        .call(request("notes", "append", r#"{"text": ""}"#, "a-1"))
        .await
        .unwrap_err();
    assert_eq!(invalid.code(), Code::InvalidArgument);
    assert_eq!(
        invalid.metadata().get(ERROR_CODE_METADATA).unwrap(),
        "VALIDATION_ERROR"
    );

    let unknown = client
        .call(request("notes", "delete", "{}", ""))
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);

    let malformed = client
        .call(request("notes", "append", "not json", ""))
        .await
        .unwrap_err();
    assert_eq!(malformed.code(), Code::InvalidArgument);
    assert!(
        malformed.message().contains("params_json"),
        "{}",
        malformed.message()
    );

    let first = client
        .call(request("notes", "append", r#"{"text": "hi"}"#, "a-2"))
        .await
        .unwrap()
        .into_inner();
    let again = client
        .call(request("notes", "append", r#"{"text": "hi"}"#, "a-2"))
        .await
        .unwrap()
        .into_inner();
    assert!(!first.from_cache && again.from_cache);
    let reused = client
        .call(request("notes", "append", r#"{"text": "other"}"#, "a-2"))
        .await
        .unwrap_err();
    assert_eq!(reused.code(), Code::AlreadyExists);
    assert_eq!(from_status(&reused).code(), ErrorCode::IdempotencyKeyReused);
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn any_error_survives_the_status_round_trip(
            index in 0..ErrorCode::ALL.len(),
            message in "\\PC{0,80}",
            after in proptest::option::of(0u64..10_000_000),
        ) {
            let code = ErrorCode::ALL[index];
            let mut err = ToolError::new(code, message.clone());
            if let Some(millis) = after {
                err = err.with_retry_after(Duration::from_millis(millis));
            }
            let back = from_status(&Status::from(err));
            prop_assert_eq!(back.code(), code);
            prop_assert_eq!(back.message(), message.as_str());
            prop_assert_eq!(back.retry_after(), after.map(Duration::from_millis));
        }

        #[test]
        fn any_metadata_gives_a_classified_error_without_panic(
            grpc in 0i32..20,
            code_entry in "[ -~]{0,30}",
            pushback in "[ -~]{0,30}",
        ) {
            let mut status = Status::new(Code::from_i32(grpc), "upstream");
            let code_sent = code_entry.parse().ok().map(|value| {
                status.metadata_mut().insert(ERROR_CODE_METADATA, value);
            });
            let pushback_sent = pushback.parse().ok().map(|value| {
                status.metadata_mut().insert(RETRY_PUSHBACK_METADATA, value);
            });
            let err = from_status(&status);
            if let (Some(()), Some(code)) = (code_sent, ErrorCode::parse(&code_entry)) {
                prop_assert_eq!(err.code(), code);
            } else {
                prop_assert_eq!(err.code(), from_status(&Status::new(Code::from_i32(grpc), "")).code());
            }
            let expected = pushback_sent.and_then(|()| pushback.parse::<u64>().ok());
            prop_assert_eq!(err.retry_after(), expected.map(Duration::from_millis));
        }
    }
}
