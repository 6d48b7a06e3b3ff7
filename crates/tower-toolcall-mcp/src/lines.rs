//! Servers over newline-delimited JSON-RPC (stdio, a pipe, a socket), with a bound on the
//! length of each incoming line.

use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::RoleServer;
use tokio::io::{AsyncRead, AsyncWrite};

use tower_toolcall::ConfigError;

/// The default bound on one incoming line (one JSON-RPC message) of a server's transport made
/// by [`line_transport`] or [`stdio_transport`]: 4 MiB, four times the envelope's default
/// bound on a call's params
/// ([`DEFAULT_MAX_PARAMS_BYTES`](tower_toolcall::validate::DEFAULT_MAX_PARAMS_BYTES)), which leaves
/// room for the JSON-RPC framing, `_meta` and escaped strings.
pub const DEFAULT_MAX_LINE_BYTES: usize = 4 << 20;

/// The smallest bound on a line: 4 KiB, room for an `initialize` request.
const MIN_MAX_LINE_BYTES: usize = 4 << 10;

/// A server's transport over `read` and `write` (newline-delimited JSON-RPC, as MCP's stdio
/// transport speaks it) that reads no incoming line longer than `max_line_bytes`
/// ([`DEFAULT_MAX_LINE_BYTES`] for most servers).
///
/// A longer line is read through and dropped without being kept (memory stays bounded by
/// the bound, however long the line) and logged at ERROR by rmcp. Its request gets no
/// answer, as its id is in the dropped line, and the connection stays open: the next lines
/// are served. Without it, rmcp's own bound is 16 MiB, and a line that long costs far more
/// in memory and time, once parsed, before the stack refuses the call as too large.
///
/// A bound under 4 KiB is refused, naming the field `mcp.max_line_bytes`.
///
/// ```
/// use tower_toolcall_mcp::{line_transport, DEFAULT_MAX_LINE_BYTES};
///
/// # tokio_test::block_on(async {
/// let (server_end, _client_end) = tokio::io::duplex(64 * 1024);
/// let (read, write) = tokio::io::split(server_end);
/// let transport = line_transport(read, write, DEFAULT_MAX_LINE_BYTES)?;
/// // rmcp::ServiceExt::serve(server, transport).await?;
/// # let _ = transport;
/// assert!(line_transport(tokio::io::empty(), tokio::io::sink(), 100).is_err());
/// # Ok::<(), tower_toolcall::ConfigError>(())
/// # }).unwrap();
/// ```
pub fn line_transport<R, W>(
    read: R,
    write: W,
    max_line_bytes: usize,
) -> Result<AsyncRwTransport<RoleServer, R, W>, ConfigError>
where
    R: AsyncRead + Send + Unpin,
    W: AsyncWrite + Send + Unpin + 'static,
{
    if max_line_bytes < MIN_MAX_LINE_BYTES {
        return Err(ConfigError::new(
            "mcp.max_line_bytes",
            format!("must be at least {MIN_MAX_LINE_BYTES} (4 KiB), got {max_line_bytes}"),
        ));
    }
    Ok(AsyncRwTransport::new_server(read, write).with_max_line_length(max_line_bytes))
}

/// A stdio server's transport (stdin and stdout) that reads no incoming line longer than
/// `max_line_bytes`: [`line_transport`] over the process's standard streams.
///
/// ```no_run
/// # async fn run<H: rmcp::ServerHandler>(server: tower_toolcall_mcp::McpServer<H>) -> Result<(), Box<dyn std::error::Error>> {
/// use tower_toolcall_mcp::{stdio_transport, DEFAULT_MAX_LINE_BYTES};
///
/// let transport = server.progress_events(stdio_transport(DEFAULT_MAX_LINE_BYTES)?);
/// let running = rmcp::ServiceExt::serve(server, transport).await?;
/// running.waiting().await?;
/// # Ok(()) }
/// ```
pub fn stdio_transport(
    max_line_bytes: usize,
) -> Result<AsyncRwTransport<RoleServer, tokio::io::Stdin, tokio::io::Stdout>, ConfigError> {
    let (stdin, stdout) = rmcp::transport::stdio();
    line_transport(stdin, stdout, max_line_bytes)
}
