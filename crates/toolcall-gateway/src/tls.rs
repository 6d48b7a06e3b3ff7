//! TLS towards a streamable-HTTP upstream: the CA certificates it is trusted by besides the
//! web PKI's roots, and the client certificate the gateway shows it.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use tower_toolcall_mcp::reqwest;

/// An upstream's TLS settings, read and checked from their files when the configuration is.
#[derive(Clone, Default, PartialEq, Eq)]
pub(crate) struct UpstreamTls {
    /// The CA certificates (PEM) trusted besides the web PKI's roots.
    ca: Option<Arc<[u8]>>,
    /// The client certificate and its private key (PEM), one after the other.
    identity: Option<Arc<[u8]>>,
}

impl UpstreamTls {
    /// Reads `ca_file`, and `cert_file` with `key_file` (both or neither): the settings, or
    /// the problem in words naming the field (`tls_ca_file`, `tls_cert_file`,
    /// `tls_key_file`) to set right.
    pub(crate) fn read(
        ca_file: Option<&Path>,
        cert_file: Option<&Path>,
        key_file: Option<&Path>,
    ) -> Result<UpstreamTls, (&'static str, String)> {
        let read = |field: &'static str, path: &Path| {
            std::fs::read(path)
                .map_err(|err| (field, format!("{} cannot be read ({err})", path.display())))
        };
        let ca = match ca_file {
            Some(path) => {
                let pem = read("tls_ca_file", path)?;
                match reqwest::Certificate::from_pem_bundle(&pem) {
                    Ok(certs) if !certs.is_empty() => Some(Arc::from(pem)),
                    _ => {
                        return Err((
                            "tls_ca_file",
                            format!(
                                "{} holds no PEM certificate; give the CA's certificate \
                                 (-----BEGIN CERTIFICATE-----)",
                                path.display()
                            ),
                        ))
                    }
                }
            }
            None => None,
        };
        let identity = match cert_and_key(cert_file, key_file)
            .map_err(|(field, problem)| (field, problem.to_owned()))?
        {
            None => None,
            Some((cert, key)) => {
                let mut pem = read("tls_cert_file", cert)?;
                pem.push(b'\n');
                pem.extend(read("tls_key_file", key)?);
                if reqwest::Identity::from_pem(&pem).is_err() {
                    return Err((
                        "tls_cert_file",
                        format!(
                            "{} and {} are not a PEM certificate and its private key",
                            cert.display(),
                            key.display()
                        ),
                    ));
                }
                Some(Arc::from(pem))
            }
        };
        Ok(UpstreamTls { ca, identity })
    }

    /// `client` trusting the CA and showing the client certificate, where there are.
    pub(crate) fn apply(
        &self,
        mut client: reqwest::ClientBuilder,
    ) -> reqwest::Result<reqwest::ClientBuilder> {
        if let Some(ca) = &self.ca {
            client = client.tls_certs_merge(reqwest::Certificate::from_pem_bundle(ca)?);
        }
        if let Some(identity) = &self.identity {
            client = client.identity(reqwest::Identity::from_pem(identity)?);
        }
        Ok(client)
    }
}

/// A certificate and its private key, given both or neither (upstreams' and the fronts'
/// `tls_cert_file` and `tls_key_file`): the pair, or the field missing and what it takes.
pub(crate) fn cert_and_key<P>(
    cert: Option<P>,
    key: Option<P>,
) -> Result<Option<(P, P)>, (&'static str, &'static str)> {
    match (cert, key) {
        (Some(cert), Some(key)) => Ok(Some((cert, key))),
        (None, None) => Ok(None),
        (Some(_), None) => Err((
            "tls_key_file",
            "is required with tls_cert_file: name the certificate's private key",
        )),
        (None, Some(_)) => Err((
            "tls_cert_file",
            "is required with tls_key_file: name the certificate",
        )),
    }
}

impl fmt::Debug for UpstreamTls {
    /// Never the key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UpstreamTls")
            .field("ca", &self.ca.is_some())
            .field("client_certificate", &self.identity.is_some())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bad_file_is_named_by_its_field() {
        let dir = std::env::temp_dir().join(format!("toolcall-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let not_pem = dir.join("not.pem");
        std::fs::write(&not_pem, "hello").unwrap();
        let missing = dir.join("missing.pem");
        let problem = |ca: Option<&Path>, cert: Option<&Path>, key: Option<&Path>| {
            UpstreamTls::read(ca, cert, key).unwrap_err()
        };
        let (field, said) = problem(Some(&missing), None, None);
        assert_eq!(field, "tls_ca_file");
        assert!(said.contains("missing.pem cannot be read"), "{said}");
        let (field, said) = problem(Some(&not_pem), None, None);
        assert_eq!(field, "tls_ca_file");
        assert!(
            said.ends_with(
                "holds no PEM certificate; give the CA's certificate (-----BEGIN CERTIFICATE-----)"
            ),
            "{said}"
        );
        assert_eq!(problem(None, Some(&not_pem), None).0, "tls_key_file");
        assert_eq!(problem(None, None, Some(&not_pem)).0, "tls_cert_file");
        let (field, said) = problem(None, Some(&not_pem), Some(&not_pem));
        assert_eq!(field, "tls_cert_file");
        assert!(
            said.contains("are not a PEM certificate and its private key"),
            "{said}"
        );
        // Nothing asked: nothing to do, and the key never shows in a debug print.
        let none = UpstreamTls::read(None, None, None).unwrap();
        assert_eq!(
            format!("{none:?}"),
            "UpstreamTls { ca: false, client_certificate: false }"
        );
    }
}
