//! Who calls, over real HTTP: bearer API keys and JWTs (keys made by `openssl` in the test,
//! their JWKS served over HTTP by the test and rotated while it runs), the `/v1` route taking
//! its caller from the principal, the tools each caller sees, and the Host and Origin checks.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::response::Response;
use axum::routing::get;
use axum::{Extension, Json, Router};
use http_body_util::BodyExt;
use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{json, Value};
use tower::ServiceExt as _;
use tower_toolcall::registry::ToolRegistry;
use tower_toolcall::{tool_fn, Principal, ToolCall, ToolOutput, ToolStack};
use tower_toolcall_axum::authn::{ApiKeys, Authentication, JwtVerifier, ProtectedResource};
use tower_toolcall_axum::{HostGuard, ToolRouter};

mod keys;

use keys::{claims, now, SigningKey, AUDIENCE, ISSUER};

/// A JWKS served over HTTP on a free loopback port: the keys can be replaced while it
/// runs, and its fetches are counted.
#[derive(Clone)]
struct JwksServer {
    url: String,
    keys: Arc<Mutex<JwkSet>>,
    fetches: Arc<AtomicUsize>,
}

impl JwksServer {
    async fn start(keys: Vec<Jwk>) -> Self {
        let keys = Arc::new(Mutex::new(JwkSet { keys }));
        let fetches = Arc::new(AtomicUsize::new(0));
        let app = {
            let (keys, fetches) = (keys.clone(), fetches.clone());
            Router::new().route(
                "/jwks.json",
                get(move || {
                    fetches.fetch_add(1, Ordering::SeqCst);
                    let set = keys.lock().unwrap().clone();
                    async move { Json(set) }
                }),
            )
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/jwks.json", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        JwksServer { url, keys, fetches }
    }

    fn rotate(&self, keys: Vec<Jwk>) {
        *self.keys.lock().unwrap() = JwkSet { keys };
    }

    fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }
}

/// `/whoami` behind `auth`: the principal's id, tenant, roles and scopes.
fn whoami(auth: &Authentication) -> Router {
    Router::new()
        .route(
            "/whoami",
            get(|Extension(p): Extension<Principal>| async move {
                Json(json!({"id": p.id(), "tenant": p.tenant(), "roles": p.roles(), "scopes": p.scopes()}))
            }),
        )
        .layer(auth.layer())
}

async fn send(app: &Router, request: Request<Body>) -> (StatusCode, Option<String>, Value) {
    let response: Response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let challenge = response
        .headers()
        .get(header::WWW_AUTHENTICATE)
        .map(|v| v.to_str().unwrap().to_owned());
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
    (status, challenge, body)
}

async fn get_with(app: &Router, token: Option<&str>) -> (StatusCode, Option<String>, Value) {
    let mut request = Request::get("/whoami");
    if let Some(token) = token {
        request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    send(app, request.body(Body::empty()).unwrap()).await
}

async fn jwt_auth(jwks: &JwksServer, min_refresh: Duration) -> Authentication {
    let verifier = JwtVerifier::builder(ISSUER, AUDIENCE)
        .jwks_url(&jwks.url)
        .min_refresh(min_refresh)
        .build()
        .await
        .unwrap();
    let resource = ProtectedResource::new(AUDIENCE);
    Authentication::jwt(verifier)
        .metadata_url(resource.metadata_url())
        .build()
}

#[tokio::test]
async fn rs256_and_es256_tokens_are_admitted_as_their_principals() {
    let (rsa, ec) = (SigningKey::rsa("rsa-1"), SigningKey::ec("ec-1"));
    let jwks = JwksServer::start(vec![rsa.jwk(), ec.jwk()]).await;
    let app = whoami(&jwt_auth(&jwks, Duration::from_secs(60)).await);

    let (status, _, body) = get_with(&app, Some(&rsa.token(claims("alice")))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body,
        json!({"id": "alice", "tenant": null, "roles": ["reader"], "scopes": ["mcp:tools"]})
    );
    let (status, _, body) = get_with(&app, Some(&ec.token(claims("bob")))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["id"], "bob");
    assert_eq!(jwks.fetches(), 1, "the keys were read once, at build");
}

#[tokio::test]
async fn every_bad_token_is_refused_with_401_and_the_metadata_url() {
    let rsa = SigningKey::rsa("rsa-1");
    let jwks = JwksServer::start(vec![rsa.jwk()]).await;
    let app = whoami(&jwt_auth(&jwks, Duration::from_secs(60)).await);
    let b64 = |value: Value| {
        use base64::Engine as _;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(value.to_string())
    };
    let with = |change: Value| {
        let mut c = claims("alice");
        for (k, v) in change.as_object().unwrap() {
            c[k] = v.clone();
        }
        c
    };
    // An HMAC token whose secret is the RSA public key, naming the RSA key.
    let public_pem = {
        let jwk = rsa.jwk();
        serde_json::to_vec(&jwk).unwrap()
    };
    let mut hmac_header = Header::new(Algorithm::HS256);
    hmac_header.kid = Some("rsa-1".into());
    let hmac = jsonwebtoken::encode(
        &hmac_header,
        &claims("alice"),
        &EncodingKey::from_secret(&public_pem).unwrap(),
    )
    .unwrap();
    let hmac_pem = jsonwebtoken::encode(
        &hmac_header,
        &claims("alice"),
        &EncodingKey::from_secret(&rsa.pem).unwrap(),
    )
    .unwrap();
    let stranger = SigningKey::rsa("rsa-1");
    let cases = [
        ("expired", rsa.token(with(json!({"exp": now() - 3600})))),
        (
            "wrong issuer",
            rsa.token(with(json!({"iss": "https://evil.example/"}))),
        ),
        (
            "wrong audience",
            rsa.token(with(json!({"aud": "https://other.example/mcp"}))),
        ),
        ("no exp", {
            let mut c = claims("alice");
            c.as_object_mut().unwrap().remove("exp");
            rsa.token(c)
        }),
        (
            "unknown kid",
            SigningKey {
                kid: "rsa-9".into(),
                ..SigningKey::rsa("x")
            }
            .token(claims("alice")),
        ),
        ("signed by another key", stranger.token(claims("alice"))),
        (
            "alg none",
            format!(
                "{}.{}.",
                b64(json!({"alg": "none", "typ": "JWT"})),
                b64(claims("alice"))
            ),
        ),
        ("HMAC with the public JWK", hmac),
        ("HMAC with the key's PEM", hmac_pem),
        ("not a JWT", "not-a-token".to_owned()),
    ];
    for (what, token) in cases {
        let (status, challenge, body) = get_with(&app, Some(&token)).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{what}: {body}");
        let challenge = challenge.expect("WWW-Authenticate");
        assert!(challenge.starts_with("Bearer "), "{what}: {challenge}");
        assert!(
            challenge.contains("error=\"invalid_token\""),
            "{what}: {challenge}"
        );
        assert!(
            challenge.contains(
                "resource_metadata=\"http://127.0.0.1:8080/.well-known/oauth-protected-resource/mcp\""
            ),
            "{what}: {challenge}"
        );
        assert!(
            !body.to_string().contains(&token),
            "{what}: the token is never repeated"
        );
    }
    let (status, challenge, _) = get_with(&app, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        challenge.unwrap(),
        "Bearer resource_metadata=\"http://127.0.0.1:8080/.well-known/oauth-protected-resource/mcp\""
    );
}

#[tokio::test]
async fn a_key_rotated_in_is_fetched_once_and_made_up_kids_cost_no_fetch() {
    let (old, new) = (SigningKey::rsa("2026-01"), SigningKey::ec("2026-02"));
    let jwks = JwksServer::start(vec![old.jwk()]).await;
    let app = whoami(&jwt_auth(&jwks, Duration::ZERO).await);
    assert_eq!(
        get_with(&app, Some(&old.token(claims("a")))).await.0,
        StatusCode::OK
    );

    // The identity provider rotates: the new key is found by the first token naming it.
    jwks.rotate(vec![new.jwk()]);
    assert_eq!(
        get_with(&app, Some(&new.token(claims("a")))).await.0,
        StatusCode::OK
    );
    assert_eq!(jwks.fetches(), 2);
    // The old key left the JWKS: a token it signed, never verified before, is refused.
    let (status, _, _) = get_with(&app, Some(&old.token(claims("b")))).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // With a minimum interval between fetches, a flood of made-up key ids costs no fetch.
    let guarded = JwksServer::start(vec![old.jwk()]).await;
    let app = whoami(&jwt_auth(&guarded, Duration::from_secs(60)).await);
    for i in 0..20 {
        let forged = SigningKey {
            kid: format!("made-up-{i}"),
            alg: Algorithm::RS256,
            encoding: old.encoding.clone(),
            pem: Vec::new(),
        };
        let (status, _, _) = get_with(&app, Some(&forged.token(claims("eve")))).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
    }
    assert_eq!(guarded.fetches(), 1, "only the fetch at build");
}

#[tokio::test]
async fn a_verified_token_is_not_checked_again_until_it_expires() {
    let rsa = SigningKey::rsa("rsa-1");
    let jwks = JwksServer::start(vec![rsa.jwk()]).await;
    let app = whoami(&jwt_auth(&jwks, Duration::ZERO).await);
    let token = rsa.token(claims("alice"));
    assert_eq!(get_with(&app, Some(&token)).await.0, StatusCode::OK);
    // The key leaves the JWKS: a token checked again would be refused, a cached one is not.
    jwks.rotate(Vec::new());
    let (status, _, body) = get_with(&app, Some(&token)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(jwks.fetches(), 1, "no fetch: no check");
}

#[tokio::test]
async fn a_token_without_a_required_scope_is_refused_403_naming_it() {
    let keys = ApiKeys::new().with_key(
        "k-alice-0123456789",
        Principal::new("alice").with_scopes(["mcp:read"]),
    );
    let auth = Authentication::api_keys(keys)
        .required_scopes(["mcp:tools"])
        .build();
    let (status, challenge, body) = get_with(&whoami(&auth), Some("k-alice-0123456789")).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let challenge = challenge.unwrap();
    assert!(
        challenge.contains("error=\"insufficient_scope\""),
        "{challenge}"
    );
    assert!(challenge.contains("scope=\"mcp:tools\""), "{challenge}");
}

#[tokio::test]
async fn api_keys_admit_their_principal_and_nothing_else() {
    let refused = Arc::new(Mutex::new(Vec::new()));
    let keys = ApiKeys::new()
        .with_key(
            "k-alice-0123456789",
            Principal::new("alice").with_tenant("acme"),
        )
        .with_key("k-bob-0123456789ab", Principal::new("bob"));
    let auth = {
        let refused = refused.clone();
        Authentication::api_keys(keys)
            .on_refusal(move |r| refused.lock().unwrap().push(r.reason()))
            .build()
    };
    let app = whoami(&auth);
    let (status, _, body) = get_with(&app, Some("k-alice-0123456789")).await;
    assert_eq!(
        (status, &body["id"], &body["tenant"]),
        (StatusCode::OK, &json!("alice"), &json!("acme"))
    );
    assert_eq!(
        get_with(&app, Some("k-bob-0123456789ab")).await.2["id"],
        "bob"
    );
    let (status, challenge, _) = get_with(&app, Some("k-alice-012345678")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        challenge.unwrap(),
        "Bearer error=\"invalid_token\", error_description=\"the API key is not one of this server's\""
    );
    // A token in the query string is not a token.
    let request = Request::get("/whoami?access_token=k-alice-0123456789")
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&app, request).await.0, StatusCode::UNAUTHORIZED);
    // Two Authorization headers: refused rather than one chosen.
    let request = Request::get("/whoami")
        .header(header::AUTHORIZATION, "Bearer k-alice-0123456789")
        .header(header::AUTHORIZATION, "Bearer k-bob-0123456789ab")
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&app, request).await.0, StatusCode::UNAUTHORIZED);
    // Refusals are reported (the first of a flood within a second).
    assert_eq!(refused.lock().unwrap().first(), Some(&"invalid_token"));
}

/// The `/v1` route behind API keys, over two tools; the calls that reached the tools.
fn envelope_app() -> (Router, Arc<Mutex<Vec<ToolCall>>>) {
    let registry = ToolRegistry::from_json_str(
        r#"{"tools": [
            {"namespace": "notes", "name": "read", "risk": "read-only", "idempotent": true,
             "policy": {"idempotency": {"scope": "global", "derive_key": true, "read_cache_ttl_ms": 30000}}},
            {"namespace": "notes", "name": "write", "risk": "writes"},
            {"namespace": "admin", "name": "wipe", "risk": "commands"}
        ]}"#,
    )
    .unwrap();
    let stack = ToolStack::builder(registry).build().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let tools = {
        let seen = seen.clone();
        tower::Layer::layer(
            &stack,
            tool_fn(move |call: ToolCall| {
                let seen = seen.clone();
                async move {
                    let result = json!({"by": call.actor_id(), "n": seen.lock().unwrap().len()});
                    seen.lock().unwrap().push(call);
                    Ok(ToolOutput::new(result))
                }
            }),
        )
    };
    let keys = ApiKeys::new()
        .with_key(
            "k-alice-0123456789",
            Principal::new("alice").with_roles(["admin"]),
        )
        .with_key(
            "k-bob-0123456789ab",
            Principal::new("bob").with_roles(["reader"]),
        );
    let auth = Authentication::new(keys);
    let app = ToolRouter::new(stack.registry().clone(), tools)
        .visible_to(
            |principal: Option<&Principal>, namespace: &str, _name: &str| {
                namespace == "notes" || principal.is_some_and(|p| p.has_role("admin"))
            },
        )
        .into_router()
        .layer(auth.layer());
    (app, seen)
}

fn envelope(name: &str, actor: &str, key: Option<&str>) -> Value {
    let (namespace, name) = name.split_once("::").unwrap();
    let mut call = json!({
        "contractVersion": "1.1", "requestId": ulid::Ulid::generate().to_string(),
        "toolName": name, "toolNamespace": namespace,
        "target": {"sessionKey": "s-1", "actorId": actor, "tenantId": "whoever"},
        "payload": {"version": "1.0", "params": {"path": "/notes/a"}}
    });
    if let Some(key) = key {
        call["payload"]["idempotencyKey"] = json!(key);
    }
    call
}

async fn post(app: &Router, key: &str, body: &Value) -> (StatusCode, Value) {
    let request = Request::post("/v1/tools/call")
        .header(header::AUTHORIZATION, format!("Bearer {key}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let (status, _, body) = send(app, request).await;
    (status, body)
}

#[tokio::test]
async fn over_v1_the_caller_is_the_principal_and_no_key_reaches_another() {
    let (app, seen) = envelope_app();
    const ALICE: &str = "k-alice-0123456789";
    const BOB: &str = "k-bob-0123456789ab";
    // Bob says he is alice, with her key and her arguments: his own call runs.
    let (status, first) = post(
        &app,
        ALICE,
        &envelope("notes::write", "alice", Some("order-1")),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let (status, second) = post(
        &app,
        BOB,
        &envelope("notes::write", "alice", Some("order-1")),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{second}");
    assert_eq!(second["output"]["content"]["by"], "bob", "{second}");
    assert_ne!(second["output"], first["output"], "not alice's result");
    // The same key again from alice: her record.
    let (_, again) = post(
        &app,
        ALICE,
        &envelope("notes::write", "bob", Some("order-1")),
    )
    .await;
    assert_eq!(again["output"], first["output"], "{again}");
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2, "one run each");
    let who: Vec<_> = seen.iter().map(|c| (c.actor_id(), c.tenant_id())).collect();
    assert_eq!(
        who,
        [("alice", None), ("bob", None)],
        "the body's actor and tenant are ignored"
    );
    assert_ne!(
        seen[0].session_key(),
        seen[1].session_key(),
        "one session name, two sessions"
    );
}

#[tokio::test]
async fn no_derived_key_reaches_another_principal_even_a_global_one() {
    let (app, seen) = envelope_app();
    for tool in ["notes::write", "notes::read"] {
        // The same call from two principals, without a key: each runs; the same again from
        // alice is her re-send.
        let before = seen.lock().unwrap().len();
        let (_, first) = post(&app, "k-alice-0123456789", &envelope(tool, "alice", None)).await;
        let (_, second) = post(&app, "k-bob-0123456789ab", &envelope(tool, "alice", None)).await;
        assert_eq!(second["fromCache"], false, "{tool}: {second}");
        let (_, again) = post(&app, "k-alice-0123456789", &envelope(tool, "alice", None)).await;
        assert_eq!(again["fromCache"], true, "{tool}: {again}");
        assert_eq!(again["output"], first["output"], "{tool}");
        assert_eq!(
            seen.lock().unwrap().len(),
            before + 2,
            "{tool}: one run each"
        );
    }
}

#[tokio::test]
async fn over_v1_a_caller_sees_and_calls_only_its_tools() {
    let (app, seen) = envelope_app();
    let list = |key: &'static str| {
        let app = app.clone();
        async move {
            let request = Request::get("/v1/tools")
                .header(header::AUTHORIZATION, format!("Bearer {key}"))
                .body(Body::empty())
                .unwrap();
            let (_, _, body) = send(&app, request).await;
            let names: Vec<String> = body["tools"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| {
                    format!(
                        "{}::{}",
                        t["namespace"].as_str().unwrap(),
                        t["name"].as_str().unwrap()
                    )
                })
                .collect();
            names
        }
    };
    assert_eq!(
        list("k-bob-0123456789ab").await,
        ["notes::read", "notes::write"]
    );
    assert_eq!(list("k-alice-0123456789").await.len(), 3);
    // A hidden tool and one that does not exist are refused in the same words.
    let (status, hidden) = post(
        &app,
        "k-bob-0123456789ab",
        &envelope("admin::wipe", "bob", None),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{hidden}");
    assert_eq!(hidden["error"]["code"], "POLICY_DENIED");
    let (status, missing) = post(
        &app,
        "k-bob-0123456789ab",
        &envelope("admin::nothing", "bob", None),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{missing}");
    let words = |body: &Value| {
        body["error"]["message"]
            .as_str()
            .unwrap()
            .replace("nothing", "wipe")
    };
    assert_eq!(
        words(&hidden),
        words(&missing),
        "no hint that the tool exists"
    );
    assert!(seen.lock().unwrap().is_empty(), "the tool never ran");
    let (status, _) = post(
        &app,
        "k-alice-0123456789",
        &envelope("admin::wipe", "alice", None),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn a_rebinding_host_or_a_foreign_origin_is_refused_on_every_route() {
    let app = Router::new()
        .route("/v1/tools", get(|| async { "tools" }))
        .route("/metrics", get(|| async { "metrics" }))
        .layer(HostGuard::loopback());
    for path in ["/v1/tools", "/metrics"] {
        let request = |host: &str, origin: Option<&str>| {
            let mut r = Request::get(path).header(header::HOST, host);
            if let Some(origin) = origin {
                r = r.header(header::ORIGIN, origin);
            }
            r.body(Body::empty()).unwrap()
        };
        assert_eq!(
            send(&app, request("127.0.0.1:8080", None)).await.0,
            StatusCode::OK
        );
        let (status, _, body) = send(&app, request("evil.example:8080", None)).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}");
        assert_eq!(body["error"]["field"], "host");
        let (status, _, body) =
            send(&app, request("127.0.0.1:8080", Some("http://evil.example"))).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}");
        assert_eq!(body["error"]["field"], "origin");
        let local = send(
            &app,
            request("localhost:8080", Some("http://localhost:5173")),
        )
        .await;
        assert_eq!(local.0, StatusCode::OK);
    }
}

#[test]
fn the_metadata_document_has_rfc_9728s_members() {
    let resource = ProtectedResource::new(AUDIENCE)
        .authorization_servers([ISSUER])
        .scopes(["mcp:tools"]);
    let document = resource.document();
    assert_eq!(document["resource"], AUDIENCE);
    assert_eq!(document["authorization_servers"], json!([ISSUER]));
    assert_eq!(document["bearer_methods_supported"], json!(["header"]));
}
