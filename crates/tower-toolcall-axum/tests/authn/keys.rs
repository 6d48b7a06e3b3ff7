//! Signing keys made by `openssl` for the authentication tests and bench, their JWKs, and
//! tokens they sign.

#![allow(dead_code)]

use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::jwk::Jwk;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{json, Value};

/// The issuer of the test's tokens.
pub(crate) const ISSUER: &str = "https://auth.example.com/";
/// Their audience: the resource of a gateway on 127.0.0.1:8080.
pub(crate) const AUDIENCE: &str = "http://127.0.0.1:8080/mcp";

/// A private key made by `openssl genpkey` (`RSA` 2048 or `EC` P-256), as PEM.
pub(crate) fn openssl_key(kind: &str) -> Vec<u8> {
    let dir = std::env::temp_dir().join(format!("authn-keys-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{kind}-{}.pem", ulid::Ulid::generate()));
    let options: &[&str] = match kind {
        "rsa" => &["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
        _ => &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
    };
    let status = std::process::Command::new("openssl")
        .arg("genpkey")
        .args(options)
        .arg("-out")
        .arg(&path)
        .stderr(std::process::Stdio::null())
        .status()
        .expect("openssl makes the test's keys: install it with `apt-get install -y openssl`");
    assert!(status.success(), "openssl genpkey {kind}");
    std::fs::read(path).unwrap()
}

/// A signing key of the test, with its `kid`.
pub(crate) struct SigningKey {
    pub(crate) kid: String,
    pub(crate) alg: Algorithm,
    pub(crate) encoding: EncodingKey,
    pub(crate) pem: Vec<u8>,
}

impl SigningKey {
    pub(crate) fn rsa(kid: &str) -> Self {
        let pem = openssl_key("rsa");
        SigningKey {
            kid: kid.into(),
            alg: Algorithm::RS256,
            encoding: EncodingKey::from_rsa_pem(&pem).unwrap(),
            pem,
        }
    }

    pub(crate) fn ec(kid: &str) -> Self {
        let pem = openssl_key("ec");
        SigningKey {
            kid: kid.into(),
            alg: Algorithm::ES256,
            encoding: EncodingKey::from_ec_pem(&pem).unwrap(),
            pem,
        }
    }

    /// Its public half, as a JWK.
    pub(crate) fn jwk(&self) -> Jwk {
        let mut jwk = Jwk::from_encoding_key(&self.encoding, self.alg).unwrap();
        jwk.common.key_id = Some(self.kid.clone());
        jwk
    }

    /// A token of `claims`, signed by this key and naming it.
    pub(crate) fn token(&self, claims: Value) -> String {
        let mut header = Header::new(self.alg);
        header.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&header, &claims, &self.encoding).unwrap()
    }
}

pub(crate) fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Claims that pass: this issuer, this audience, an hour to live.
pub(crate) fn claims(sub: &str) -> Value {
    json!({"sub": sub, "iss": ISSUER, "aud": AUDIENCE, "exp": now() + 3600, "iat": now(),
           "roles": ["reader"], "scope": "mcp:tools"})
}
