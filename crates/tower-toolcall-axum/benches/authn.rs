//! Run with: `cargo bench -p tower-toolcall-axum --features jwt --bench authn`.
//!
//! What authentication adds to a request, in one run: a `POST /v1/tools/call` route whose
//! handler only reads the principal and the body (`tower::ServiceExt::oneshot` on the axum
//! `Router`, no network), so that the difference between the groups is the authentication's:
//!
//! - `none`: the route without authentication, the baseline;
//! - `api_key`: behind [`ApiKeys`] (a SHA-256 of the key, compared with every stored digest);
//! - `jwt_verified`: behind a [`JwtVerifier`] (ES256), with a token verified before: the
//!   cost of every request after a token's first (a SHA-256 of the token and a cache hit);
//! - `jwt_first_call`: each request with a token never seen before (signed in the setup, not
//!   measured): the signature checked and the claims read.
//!
//! The keys are made by `openssl` (keys.rs), the JWKS read from a file.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::routing::post;
use axum::{Extension, Router};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use serde_json::json;
use tower::ServiceExt as _;
use tower_toolcall::{Principal, ToolCall};
use tower_toolcall_axum::authn::{ApiKeys, Authentication, JwtVerifier};

#[path = "../tests/authn/keys.rs"]
mod keys;

const API_KEY: &str = "k-bench-0123456789abcdef";

/// The route: the handler reads the principal (when there is one) and the body.
fn router() -> Router {
    Router::new().route(
        "/v1/tools/call",
        post(
            |principal: Option<Extension<Principal>>, body: axum::body::Bytes| async move {
                black_box((principal.map(|Extension(p)| p.id().len()), body.len()));
                "ok"
            },
        ),
    )
}

/// Call `n`: fresh params, so that each is a new call to the stack.
fn request(n: u64, token: Option<&str>) -> Request<Body> {
    let call = ToolCall::builder("web", "search")
        .session("s")
        .actor("u")
        .params(json!({"query": format!("q-{n}")}))
        .build()
        .unwrap();
    let mut request =
        Request::post("/v1/tools/call").header(header::CONTENT_TYPE, "application/json");
    if let Some(token) = token {
        request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    request.body(Body::from(call.to_json())).unwrap()
}

fn bench(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let key = keys::SigningKey::ec("bench-1");
    let jwks = std::env::temp_dir().join(format!("authn-bench-jwks-{}.json", std::process::id()));
    std::fs::write(&jwks, json!({"keys": [key.jwk()]}).to_string()).unwrap();
    let verifier = runtime
        .block_on(
            JwtVerifier::builder(keys::ISSUER, keys::AUDIENCE)
                .jwks_file(&jwks)
                .build(),
        )
        .unwrap();
    let apps = [
        ("none", router()),
        (
            "api_key",
            router().layer(
                Authentication::new(ApiKeys::new().with_key(API_KEY, Principal::new("bench")))
                    .layer(),
            ),
        ),
        (
            "jwt",
            router().layer(Authentication::jwt(verifier).build().layer()),
        ),
    ];
    let token = key.token(keys::claims("bench"));
    let counter = AtomicU64::new(0);
    let mut group = c.benchmark_group("authn");
    for (name, app) in &apps {
        let credential = match *name {
            "none" => None,
            "api_key" => Some(API_KEY),
            _ => Some(token.as_str()),
        };
        let label = if *name == "jwt" { "jwt_verified" } else { name };
        group.bench_function(label, |b| {
            b.iter(|| {
                let n = counter.fetch_add(1, Ordering::Relaxed);
                let app = app.clone();
                runtime.block_on(async move {
                    let response = app.oneshot(request(n, credential)).await.unwrap();
                    assert_eq!(response.status(), StatusCode::OK);
                    black_box(response)
                })
            })
        });
    }
    let jwt = apps[2].1.clone();
    group.bench_function("jwt_first_call", |b| {
        b.iter_batched(
            || {
                let n = counter.fetch_add(1, Ordering::Relaxed);
                let mut claims = keys::claims("bench");
                claims["jti"] = json!(n);
                (n, key.token(claims))
            },
            |(n, token)| {
                let app = jwt.clone();
                runtime.block_on(async move {
                    let response = app.oneshot(request(n, Some(&token))).await.unwrap();
                    assert_eq!(response.status(), StatusCode::OK);
                    black_box(response)
                })
            },
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
