//! [`HostGuard`]: the `Host` and `Origin` checks that keep a web page from reaching a tool
//! server through the browser of someone who can (DNS rebinding, cross-origin requests).

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::extract::Request;
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::future::{BoxFuture, FutureExt as _};
use tower::{Layer, Service};

/// The names of this machine, which a server on a loopback address answers to by default.
pub const LOOPBACK_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// Checks every request's `Host` (or HTTP/2 `:authority`) and `Origin` against allow-lists,
/// and answers `403` naming the header when either is not allowed.
///
/// - **Host.** A page that rebinds its own name to `127.0.0.1` reaches a loopback server
///   with `Host: evil.example`: only the names the server answers to pass (by default
///   [`LOOPBACK_HOSTS`], any port). An entry `name` allows every port, `name:port` one.
/// - **Origin.** A browser sends it with cross-origin requests; a request that has one
///   passes only if it is allowed (by default the loopback names over `http` and `https`,
///   any port). A request without one (every non-browser client) passes.
///
/// ```
/// use tower_toolcall_axum::HostGuard;
///
/// let guard = HostGuard::loopback()
///     .allow_hosts(["tools.example.com"])
///     .allow_origins(["https://console.example.com"]);
/// assert!(guard.allows_host("tools.example.com:443"));
/// assert!(guard.allows_host("127.0.0.1:8080"));
/// assert!(!guard.allows_host("evil.example"));
/// assert!(guard.allows_origin("https://console.example.com"));
/// assert!(!guard.allows_origin("https://evil.example"));
/// let app: axum::Router = axum::Router::new().layer(guard);
/// # let _ = app;
/// ```
#[derive(Clone, Debug)]
pub struct HostGuard {
    inner: Arc<Lists>,
}

#[derive(Debug)]
struct Lists {
    hosts: Vec<String>,
    origins: Vec<String>,
}

impl HostGuard {
    /// The loopback names only: [`LOOPBACK_HOSTS`], and their origins.
    pub fn loopback() -> Self {
        let hosts: Vec<String> = LOOPBACK_HOSTS.iter().map(|h| (*h).to_owned()).collect();
        let origins = hosts
            .iter()
            .flat_map(|host| {
                let host = if host.contains(':') {
                    format!("[{host}]")
                } else {
                    host.clone()
                };
                [format!("http://{host}"), format!("https://{host}")]
            })
            .collect();
        HostGuard {
            inner: Arc::new(Lists { hosts, origins }),
        }
    }

    /// Allows these names too (`name` for any port, `name:port` for one).
    pub fn allow_hosts<I, S>(self, hosts: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut lists = self.lists();
        lists
            .hosts
            .extend(hosts.into_iter().map(|h| h.into().to_ascii_lowercase()));
        HostGuard {
            inner: Arc::new(lists),
        }
    }

    /// Allows these origins too (`scheme://host` for any port, `scheme://host:port` for one,
    /// `null` for the browser's opaque origin).
    pub fn allow_origins<I, S>(self, origins: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut lists = self.lists();
        lists.origins.extend(
            origins
                .into_iter()
                .map(|o| o.into().trim_end_matches('/').to_ascii_lowercase()),
        );
        HostGuard {
            inner: Arc::new(lists),
        }
    }

    fn lists(&self) -> Lists {
        Lists {
            hosts: self.inner.hosts.clone(),
            origins: self.inner.origins.clone(),
        }
    }

    /// Whether a request with `Host: host` passes.
    pub fn allows_host(&self, host: &str) -> bool {
        let host = host.trim().to_ascii_lowercase();
        let name = host_name(&host);
        self.inner
            .hosts
            .iter()
            .any(|allowed| *allowed == host || allowed == name)
    }

    /// Whether a request with `Origin: origin` passes.
    pub fn allows_origin(&self, origin: &str) -> bool {
        let origin = origin.trim().to_ascii_lowercase();
        if origin == "null" {
            return self.inner.origins.iter().any(|o| o == "null");
        }
        let Some((scheme, authority)) = origin.split_once("://") else {
            return false;
        };
        if authority.contains('/') {
            return false;
        }
        let without_port = format!("{scheme}://{}", bracketed(host_name(authority)));
        self.inner
            .origins
            .iter()
            .any(|allowed| *allowed == origin || *allowed == without_port)
    }

    /// `Err(the header refused)` when the request's headers do not pass.
    fn check(&self, uri: &Uri, headers: &HeaderMap) -> Result<(), &'static str> {
        let host = headers
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .or_else(|| uri.authority().map(|a| a.as_str().to_owned()));
        match host {
            Some(host) if self.allows_host(&host) => {}
            _ => return Err("Host"),
        }
        let mut origins = headers.get_all(header::ORIGIN).iter();
        match (origins.next(), origins.next()) {
            (None, _) => Ok(()),
            (Some(origin), None)
                if origin
                    .to_str()
                    .is_ok_and(|origin| self.allows_origin(origin)) =>
            {
                Ok(())
            }
            _ => Err("Origin"),
        }
    }
}

/// The name of `host[:port]` (an IPv6 address without its brackets).
fn host_name(authority: &str) -> &str {
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match authority.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => authority,
    }
}

/// An IPv6 address in brackets, as in an origin; any other name as it is.
fn bracketed(name: &str) -> std::borrow::Cow<'_, str> {
    if name.contains(':') {
        format!("[{name}]").into()
    } else {
        name.into()
    }
}

impl<S> Layer<S> for HostGuard {
    type Service = Guarded<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Guarded {
            guard: self.clone(),
            inner,
        }
    }
}

/// The service of [`HostGuard`].
#[derive(Clone, Debug)]
pub struct Guarded<S> {
    guard: HostGuard,
    inner: S,
}

impl<S> Service<Request> for Guarded<S>
where
    S: Service<Request, Response = Response, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        match self.guard.check(request.uri(), request.headers()) {
            Ok(()) => self.inner.call(request).boxed(),
            Err(refused) => {
                tracing::warn!(
                    target: "tower_toolcall::guard",
                    event = "request_refused",
                    header = refused,
                    "a request's {refused} is not one this server answers to (a web page \
                     reaching it through a browser?)"
                );
                let message = format!(
                    "the request's {refused} header is not allowed here; a server reached by \
                     another name or from a web page must list it (allowed hosts or origins)"
                );
                let body = Json(serde_json::json!({
                    "error": {"code": "FORBIDDEN", "field": refused.to_ascii_lowercase(), "message": message}
                }));
                std::future::ready(Ok((StatusCode::FORBIDDEN, body).into_response())).boxed()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_and_origins_by_default_are_the_loopback_names() {
        let guard = HostGuard::loopback();
        for host in [
            "127.0.0.1:8080",
            "localhost",
            "LOCALHOST:1",
            "[::1]:80",
            "::1",
        ] {
            assert!(guard.allows_host(host), "{host}");
        }
        for host in [
            "evil.example",
            "127.0.0.1.evil.example",
            "evil.example:8080",
            "",
        ] {
            assert!(!guard.allows_host(host), "{host}");
        }
        for origin in [
            "http://127.0.0.1:5173",
            "http://localhost",
            "https://[::1]:8443",
        ] {
            assert!(guard.allows_origin(origin), "{origin}");
        }
        for origin in [
            "http://evil.example",
            "null",
            "http://localhost.evil",
            "localhost",
        ] {
            assert!(!guard.allows_origin(origin), "{origin}");
        }
    }

    #[test]
    fn a_port_in_the_list_allows_that_port_only() {
        let guard = HostGuard::loopback()
            .allow_hosts(["tools.example.com:8443"])
            .allow_origins(["https://app.example.com:8443/"]);
        assert!(guard.allows_host("tools.example.com:8443"));
        assert!(!guard.allows_host("tools.example.com:80"));
        assert!(guard.allows_origin("https://app.example.com:8443"));
        assert!(!guard.allows_origin("https://app.example.com"));
    }
}
