//! [`JwtVerifier`]: bearer JWTs checked against a JWKS (a URL, fetched again when a token
//! names a key it does not have, or a file), an issuer, an audience, an expiry and an
//! allow-list of algorithms; their claims mapped to a [`Principal`].

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use jsonwebtoken::jwk::{AlgorithmParameters, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value};
use tokio::time::Instant;
use tower_toolcall::{ConfigError, Principal};

use super::Invalid;

/// How long a JWKS fetched from a URL is used before it is fetched again, by default.
pub const DEFAULT_JWKS_TTL: Duration = Duration::from_secs(600);

/// The least time between two fetches of a JWKS, by default: a flood of tokens naming
/// unknown keys costs the identity provider one request per interval.
pub const DEFAULT_JWKS_MIN_REFRESH: Duration = Duration::from_secs(10);

/// The clock skew allowed on `exp` and `nbf`, by default.
pub const DEFAULT_LEEWAY: Duration = Duration::from_secs(30);

/// The largest JWKS document read.
const MAX_JWKS_BYTES: usize = 1 << 20;

/// How long a fetch of the JWKS may take.
const JWKS_FETCH_TIMEOUT: Duration = Duration::from_secs(5);

/// The names of the claims a principal is read from.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClaimNames {
    /// The principal's id (default `sub`).
    pub actor: String,
    /// The principal's tenant, if the tokens carry one (default none).
    pub tenant: Option<String>,
    /// The principal's roles: an array of strings or one space-separated string (default
    /// `roles`).
    pub roles: String,
    /// The token's scopes: a space-separated string or an array (default `scope`; `scp` is
    /// read when it is absent).
    pub scopes: String,
}

impl Default for ClaimNames {
    fn default() -> Self {
        ClaimNames {
            actor: "sub".into(),
            tenant: None,
            roles: "roles".into(),
            scopes: "scope".into(),
        }
    }
}

/// Where the signing keys come from.
#[derive(Clone, Debug)]
enum Source {
    Url {
        url: String,
        client: reqwest::Client,
    },
    File(PathBuf),
}

/// Checks bearer JWTs and maps their claims to a [`Principal`].
///
/// A token is admitted when its header names an algorithm of the allow-list (by default
/// RS256 and ES256; `none` and the HMAC algorithms are never admitted, so that a public key
/// can never be used as an HMAC secret), its `kid` names a key of the JWKS whose type fits
/// the algorithm (and whose `alg`, when the key has one, is that algorithm), its signature
/// verifies, its `iss` is the issuer, its `aud` contains the audience, and its `exp` (which it
/// must have) and `nbf` hold within the leeway. A token naming a key the JWKS lacks makes the
/// verifier fetch the JWKS again, at most once per
/// [`min_refresh`](JwtVerifierBuilder::min_refresh), so that a key rotated in at the identity
/// provider is found at once while a flood of made-up key ids cannot hammer it.
///
/// ```no_run
/// use tower_toolcall_axum::authn::JwtVerifier;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let verifier = JwtVerifier::builder("https://auth.example.com/", "https://tools.example.com/mcp")
///     .jwks_url("https://auth.example.com/.well-known/jwks.json")
///     .build()
///     .await?;
/// # let _ = verifier;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct JwtVerifier {
    inner: Arc<Inner>,
}

struct Inner {
    issuer: String,
    audience: String,
    algorithms: Vec<Algorithm>,
    leeway: Duration,
    claims: ClaimNames,
    source: Source,
    ttl: Duration,
    min_refresh: Duration,
    keys: RwLock<Keys>,
    /// One fetch at a time.
    fetching: tokio::sync::Mutex<()>,
}

/// The keys of the JWKS, by `kid`, and when they were read.
struct Keys {
    by_kid: HashMap<String, Key>,
    read_at: Instant,
}

#[derive(Clone)]
struct Key {
    decoding: DecodingKey,
    /// The key's `alg`, when the JWKS names one.
    alg: Option<Algorithm>,
    family: jsonwebtoken::AlgorithmFamily,
}

impl fmt::Debug for JwtVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = &self.inner;
        f.debug_struct("JwtVerifier")
            .field("issuer", &inner.issuer)
            .field("audience", &inner.audience)
            .field("algorithms", &inner.algorithms)
            .field("source", &inner.source)
            .finish_non_exhaustive()
    }
}

/// Builds a [`JwtVerifier`].
#[derive(Debug)]
#[must_use]
pub struct JwtVerifierBuilder {
    issuer: String,
    audience: String,
    algorithms: Vec<Algorithm>,
    leeway: Duration,
    claims: ClaimNames,
    source: Option<Source>,
    ttl: Duration,
    min_refresh: Duration,
}

impl JwtVerifier {
    /// A verifier of tokens from `issuer` for `audience` (this server's resource: its URL).
    pub fn builder(issuer: impl Into<String>, audience: impl Into<String>) -> JwtVerifierBuilder {
        JwtVerifierBuilder {
            issuer: issuer.into(),
            audience: audience.into(),
            algorithms: vec![Algorithm::RS256, Algorithm::ES256],
            leeway: DEFAULT_LEEWAY,
            claims: ClaimNames::default(),
            source: None,
            ttl: DEFAULT_JWKS_TTL,
            min_refresh: DEFAULT_JWKS_MIN_REFRESH,
        }
    }

    /// The principal of `token`, and when the token expires (seconds since the epoch).
    pub(crate) async fn verify(&self, token: &str) -> Result<(Principal, u64), Invalid> {
        let header = jsonwebtoken::decode_header(token)
            .map_err(|_| Invalid::token("the bearer token is not a well-formed JWT"))?;
        let inner = &self.inner;
        if !inner.algorithms.contains(&header.alg) {
            return Err(Invalid::token(format!(
                "the token's algorithm {:?} is not accepted",
                header.alg
            )));
        }
        let key = self.key_for(header.kid.as_deref(), header.alg).await?;
        let mut validation = Validation::new(header.alg);
        validation.set_issuer(&[&inner.issuer]);
        validation.set_audience(&[&inner.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        validation.leeway = inner.leeway.as_secs();
        validation.validate_nbf = true;
        let data = jsonwebtoken::decode::<Map<String, Value>>(token, &key.decoding, &validation)
            .map_err(|err| Invalid::token(refusal_of(err.kind())))?;
        let claims = data.claims;
        let exp = claims.get("exp").and_then(Value::as_u64).unwrap_or(0);
        Ok((principal_of(&claims, &inner.claims)?, exp))
    }

    /// The key `kid` names (or, without a `kid`, the one key of the algorithm's family),
    /// fetching the JWKS again when it is stale or lacks the key.
    async fn key_for(&self, kid: Option<&str>, alg: Algorithm) -> Result<Key, Invalid> {
        let inner = &self.inner;
        let stale = inner.read_keys().read_at.elapsed() >= inner.ttl;
        if !stale {
            if let Some(key) = inner.find(kid, alg)? {
                return Ok(key);
            }
        }
        // An unknown key, or keys past their time: fetch them again, unless they were
        // fetched a moment ago.
        {
            let _one_at_a_time = inner.fetching.lock().await;
            let read_at = inner.read_keys().read_at;
            if read_at.elapsed() >= inner.min_refresh {
                match inner.source.load().await {
                    Ok(by_kid) => {
                        *inner.keys.write().unwrap_or_else(PoisonError::into_inner) = Keys {
                            by_kid,
                            read_at: Instant::now(),
                        };
                    }
                    // The keys held go on serving; a token they cannot check is refused.
                    Err(err) => tracing::warn!(
                        target: "tower_toolcall::auth",
                        event = "jwks_unavailable",
                        "{err}"
                    ),
                }
            }
        }
        inner.find(kid, alg)?.ok_or_else(|| {
            Invalid::token("the token's signing key is not one of the issuer's keys")
        })
    }
}

impl Inner {
    fn read_keys(&self) -> std::sync::RwLockReadGuard<'_, Keys> {
        self.keys.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn find(&self, kid: Option<&str>, alg: Algorithm) -> Result<Option<Key>, Invalid> {
        let keys = self.read_keys();
        let key = match kid {
            Some(kid) => keys.by_kid.get(kid).cloned(),
            None => {
                let mut fitting = keys.by_kid.values().filter(|k| k.family == alg.family());
                match (fitting.next(), fitting.next()) {
                    (Some(key), None) => Some(key.clone()),
                    _ => None,
                }
            }
        };
        match key {
            Some(key) if key.family != alg.family() || key.alg.is_some_and(|a| a != alg) => Err(
                Invalid::token("the token's algorithm does not fit its signing key"),
            ),
            key => Ok(key),
        }
    }
}

impl Source {
    /// The keys the source holds now, by `kid`: keys of a type the verifier does not take
    /// (symmetric keys, unknown types) are left out.
    async fn load(&self) -> Result<HashMap<String, Key>, String> {
        let text = match self {
            Source::File(path) => std::fs::read(path)
                .map_err(|err| format!("the JWKS file {} cannot be read: {err}", path.display()))?,
            Source::Url { url, client } => {
                let response = client
                    .get(url)
                    .timeout(JWKS_FETCH_TIMEOUT)
                    .send()
                    .await
                    .map_err(|err| format!("the JWKS at {url} cannot be fetched: {err}"))?;
                if !response.status().is_success() {
                    return Err(format!("the JWKS at {url} answered {}", response.status()));
                }
                let body = response
                    .bytes()
                    .await
                    .map_err(|err| format!("the JWKS at {url} cannot be read: {err}"))?;
                if body.len() > MAX_JWKS_BYTES {
                    return Err(format!("the JWKS at {url} is over {MAX_JWKS_BYTES} bytes"));
                }
                body.to_vec()
            }
        };
        let set: JwkSet = serde_json::from_slice(&text)
            .map_err(|err| format!("the JWKS is not a JSON Web Key Set: {err}"))?;
        let mut keys = HashMap::new();
        for jwk in &set.keys {
            let family = match &jwk.algorithm {
                AlgorithmParameters::RSA(_) => jsonwebtoken::AlgorithmFamily::Rsa,
                AlgorithmParameters::EllipticCurve(_) => jsonwebtoken::AlgorithmFamily::Ec,
                AlgorithmParameters::OctetKeyPair(_) => jsonwebtoken::AlgorithmFamily::Ed,
                // Symmetric keys are never taken: HMAC is not an algorithm this verifier admits.
                _ => continue,
            };
            let Ok(decoding) = DecodingKey::from_jwk(jwk) else {
                continue;
            };
            let alg = jwk
                .common
                .key_algorithm
                .and_then(|a| a.to_string().parse::<Algorithm>().ok());
            let kid = jwk.common.key_id.clone().unwrap_or_default();
            keys.insert(
                kid,
                Key {
                    decoding,
                    alg,
                    family,
                },
            );
        }
        Ok(keys)
    }
}

impl JwtVerifierBuilder {
    /// Fetches the issuer's keys from `url` (at start, when they are older than the
    /// [`ttl`](JwtVerifierBuilder::ttl), and when a token names a key they lack).
    pub fn jwks_url(mut self, url: impl Into<String>) -> Self {
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap_or_default();
        self.source = Some(Source::Url {
            url: url.into(),
            client,
        });
        self
    }

    /// Reads the issuer's keys from the file at `path` (read again as a URL is fetched, so
    /// that a rotated file is picked up).
    pub fn jwks_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.source = Some(Source::File(path.into()));
        self
    }

    /// The algorithms a token may be signed with (default RS256 and ES256). `Err` at
    /// [`build`](JwtVerifierBuilder::build) for an HMAC algorithm.
    pub fn algorithms(mut self, algorithms: impl IntoIterator<Item = Algorithm>) -> Self {
        self.algorithms = algorithms.into_iter().collect();
        self
    }

    /// The clock skew allowed on `exp` and `nbf` (default [`DEFAULT_LEEWAY`]).
    pub fn leeway(mut self, leeway: Duration) -> Self {
        self.leeway = leeway;
        self
    }

    /// The claims a principal is read from.
    pub fn claims(mut self, claims: ClaimNames) -> Self {
        self.claims = claims;
        self
    }

    /// How long fetched keys are used before they are fetched again (default
    /// [`DEFAULT_JWKS_TTL`]).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The least time between two fetches of the keys (default [`DEFAULT_JWKS_MIN_REFRESH`]).
    pub fn min_refresh(mut self, interval: Duration) -> Self {
        self.min_refresh = interval;
        self
    }

    /// The verifier, with the keys read once: `Err` names what is wrong (no source, an HMAC
    /// algorithm, keys that cannot be read).
    pub async fn build(self) -> Result<JwtVerifier, ConfigError> {
        let source = self.source.ok_or_else(|| {
            ConfigError::new(
                "jwks",
                "the JWT verifier needs its keys: give a JWKS URL or file",
            )
        })?;
        if self.algorithms.is_empty() {
            return Err(ConfigError::new(
                "algorithms",
                "is empty: name the algorithms the issuer signs with (RS256, ES256, …)",
            ));
        }
        if let Some(hmac) = self
            .algorithms
            .iter()
            .find(|a| a.family() == jsonwebtoken::AlgorithmFamily::Hmac)
        {
            return Err(ConfigError::new(
                "algorithms",
                format!(
                    "{hmac:?} is an HMAC algorithm, which a verifier of public keys must \
                 never take; use RS256, ES256 or another asymmetric algorithm"
                ),
            ));
        }
        let by_kid = source
            .load()
            .await
            .map_err(|problem| ConfigError::new("jwks", problem))?;
        Ok(JwtVerifier {
            inner: Arc::new(Inner {
                issuer: self.issuer,
                audience: self.audience,
                algorithms: self.algorithms,
                leeway: self.leeway,
                claims: self.claims,
                source,
                ttl: self.ttl,
                min_refresh: self.min_refresh,
                keys: RwLock::new(Keys {
                    by_kid,
                    read_at: Instant::now(),
                }),
                fetching: tokio::sync::Mutex::new(()),
            }),
        })
    }
}

/// What a refused token is told, by the reason `jsonwebtoken` gave.
fn refusal_of(kind: &jsonwebtoken::errors::ErrorKind) -> &'static str {
    use jsonwebtoken::errors::ErrorKind;
    match kind {
        ErrorKind::ExpiredSignature => "the token has expired",
        ErrorKind::ImmatureSignature => "the token is not valid yet",
        ErrorKind::InvalidIssuer => "the token's issuer is not accepted",
        ErrorKind::InvalidAudience => "the token is not for this resource (its audience)",
        ErrorKind::InvalidSignature => "the token's signature does not verify",
        ErrorKind::MissingRequiredClaim(_) => "the token lacks a required claim (exp, iss, aud)",
        ErrorKind::InvalidAlgorithm => "the token's algorithm does not fit its signing key",
        _ => "the token cannot be verified",
    }
}

/// The principal the verified `claims` name.
fn principal_of(claims: &Map<String, Value>, names: &ClaimNames) -> Result<Principal, Invalid> {
    let id = claims
        .get(&names.actor)
        .and_then(Value::as_str)
        .filter(|id| !id.is_empty() && id.len() <= tower_toolcall::envelope::MAX_IDENTIFIER_BYTES)
        .ok_or_else(|| {
            Invalid::token(format!(
                "the token's `{}` claim must name the caller (a string of 1 to 256 bytes)",
                names.actor
            ))
        })?;
    let mut principal = Principal::new(id);
    if let Some(tenant_claim) = &names.tenant {
        if let Some(tenant) = claims.get(tenant_claim).and_then(Value::as_str) {
            principal = principal.with_tenant(tenant);
        }
    }
    principal = principal.with_roles(strings(claims.get(&names.roles)));
    let scopes = claims.get(&names.scopes).or_else(|| claims.get("scp"));
    Ok(principal.with_scopes(strings(scopes)))
}

/// The strings of a claim: an array's strings, or a space-separated string's words.
fn strings(claim: Option<&Value>) -> Vec<String> {
    match claim {
        Some(Value::String(words)) => words.split_whitespace().map(str::to_owned).collect(),
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn claims_become_a_principal() {
        let claims = json!({"sub": "alice", "org": "acme", "roles": ["reader"], "scope": "mcp:tools mcp:read"});
        let names = ClaimNames {
            tenant: Some("org".into()),
            ..ClaimNames::default()
        };
        let principal = principal_of(claims.as_object().unwrap(), &names).unwrap();
        assert_eq!(principal.id(), "alice");
        assert_eq!(principal.tenant(), Some("acme"));
        assert!(principal.has_role("reader"));
        assert!(principal.has_scope("mcp:read"));

        let nameless = json!({"sub": 7});
        let err = principal_of(nameless.as_object().unwrap(), &names).unwrap_err();
        assert!(err.description().contains("`sub`"), "{}", err.description());
    }

    #[tokio::test]
    async fn an_hmac_algorithm_is_refused_at_build() {
        let err = JwtVerifier::builder("iss", "aud")
            .jwks_file("/nonexistent")
            .algorithms([Algorithm::RS256, Algorithm::HS256])
            .build()
            .await
            .unwrap_err();
        assert!(err.to_string().contains("HS256"), "{err}");
    }
}
