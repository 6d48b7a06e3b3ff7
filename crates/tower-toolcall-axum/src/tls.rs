//! TLS for [`serve`](crate::serve): a server certificate and key read from PEM files, read
//! again on [`reload`](ServerTls::reload) (a renewed certificate without a restart).

use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};

use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;
use tower_toolcall::ConfigError;

/// The certificate a server shows, from PEM files; clones share it, so that a
/// [`reload`](ServerTls::reload) reaches every connection accepted after it. Serve with it
/// through [`ServeConfig::tls`](crate::ServeConfig::tls).
///
/// ```no_run
/// use tower_toolcall_axum::{ServeConfig, ServerTls};
///
/// # fn run() -> Result<(), tower_toolcall::ConfigError> {
/// let tls = ServerTls::from_pem_files("/etc/gateway/cert.pem", "/etc/gateway/key.pem")?;
/// let config = ServeConfig::default().tls(tls.clone());
/// // Later, on SIGHUP: the renewed files, for the connections to come.
/// tls.reload()?;
/// # let _ = config;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ServerTls {
    files: Arc<(PathBuf, PathBuf)>,
    current: Arc<RwLock<TlsAcceptor>>,
}

impl ServerTls {
    /// Reads the certificate chain `cert_file` and its private key `key_file` (PEM). A file
    /// that cannot be read or holds no certificate or key, or a key that does not match,
    /// is an error naming the file (field `tls_cert_file` or `tls_key_file`).
    pub fn from_pem_files(
        cert_file: impl Into<PathBuf>,
        key_file: impl Into<PathBuf>,
    ) -> Result<ServerTls, ConfigError> {
        let files = (cert_file.into(), key_file.into());
        let acceptor = acceptor(&files.0, &files.1)?;
        Ok(ServerTls {
            files: Arc::new(files),
            current: Arc::new(RwLock::new(acceptor)),
        })
    }

    /// Reads the files again; the connections accepted from now on are shown the new
    /// certificate. When they are bad, the error names them and the old certificate stays.
    pub fn reload(&self) -> Result<(), ConfigError> {
        let acceptor = acceptor(&self.files.0, &self.files.1)?;
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = acceptor;
        Ok(())
    }

    /// The acceptor of the certificate in place now.
    pub(crate) fn acceptor(&self) -> TlsAcceptor {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("cert_file", &self.files.0)
            .field("key_file", &self.files.1)
            .finish_non_exhaustive()
    }
}

/// The acceptor of the certificate in `cert` and the key in `key`.
fn acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, ConfigError> {
    let problem = |field: &str, path: &Path, what: String| {
        ConfigError::new(field, format!("{}: {what}", path.display()))
    };
    let pem = |field: &str, path: &Path| {
        std::fs::read(path).map_err(|err| problem(field, path, format!("cannot be read ({err})")))
    };
    let chain = CertificateDer::pem_slice_iter(&pem("tls_cert_file", cert)?)
        .collect::<Result<Vec<_>, _>>()
        .ok()
        .filter(|chain| !chain.is_empty())
        .ok_or_else(|| {
            problem(
                "tls_cert_file",
                cert,
                "holds no PEM certificate (-----BEGIN CERTIFICATE-----)".to_owned(),
            )
        })?;
    let private = PrivateKeyDer::from_pem_slice(&pem("tls_key_file", key)?).map_err(|_| {
        problem(
            "tls_key_file",
            key,
            "holds no PEM private key (-----BEGIN PRIVATE KEY-----)".to_owned(),
        )
    })?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .and_then(|config| {
            config
                .with_no_client_auth()
                .with_single_cert(chain, private)
        })
        .map_err(|err| {
            problem(
                "tls_key_file",
                key,
                format!("is not the key of {} ({err})", cert.display()),
            )
        })?;
    let mut config = config;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_that_is_not_a_certificate_or_key_is_named_by_its_field() {
        let dir = std::env::temp_dir().join(format!("toolcall-axum-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let junk = dir.join("junk.pem");
        std::fs::write(&junk, "not pem").unwrap();
        let err = ServerTls::from_pem_files(dir.join("missing.pem"), &junk).unwrap_err();
        assert_eq!(err.field(), "tls_cert_file");
        assert!(
            err.problem().contains("missing.pem: cannot be read"),
            "{err}"
        );
        let err = ServerTls::from_pem_files(&junk, &junk).unwrap_err();
        assert_eq!(err.field(), "tls_cert_file");
        assert!(err
            .problem()
            .ends_with("holds no PEM certificate (-----BEGIN CERTIFICATE-----)"));
    }
}
