//! A stdio server's process as a client transport: its stdout read as messages of at most a
//! bound, a longer one closing the connection with an error that names the server and the
//! bound (rmcp's own child transport drops such a message without a word, and its request
//! waits for an answer that never comes).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use process_wrap::tokio::ChildWrapper;
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::transport::Transport;
use rmcp::RoleClient;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout};

/// The longest message a stdio server may send unless told otherwise: 16 MiB, rmcp's own
/// bound (a list of 10 000 tools with their schemas is about 7 MiB).
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 16 << 20;

/// How long a server may take to exit once its stdin is closed, and again once told to
/// terminate, before it is killed (MCP's stdio shutdown).
const EXIT_WAIT: Duration = Duration::from_secs(3);

/// `SIGTERM`, the same number on every Unix this runs on.
#[cfg(unix)]
const SIGTERM: i32 = 15;

/// Why this side closed a server's connection, when it did: set by the transport, read by
/// whoever finds the connection closed under a request.
#[derive(Clone, Debug, Default)]
pub(crate) struct Verdict(Arc<Mutex<Option<Arc<str>>>>);

impl Verdict {
    fn set(&self, why: String) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(why.into());
    }

    /// The reason, once: a connection made again starts with none.
    pub(crate) fn take(&self) -> Option<Arc<str>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}

/// A server process and the transport over its stdin and stdout.
pub(crate) struct ChildTransport {
    child: Option<Child>,
    lines: AsyncRwTransport<RoleClient, Bounded<ChildStdout>, ChildStdin>,
}

impl ChildTransport {
    /// Starts `command` with piped stdin, stdout and stderr: the transport, and the stderr to
    /// read. A message longer than `max_message_bytes` from server `name` closes the
    /// connection, and `verdict` says why.
    pub(crate) fn spawn(
        mut command: tokio::process::Command,
        name: &str,
        max_message_bytes: usize,
        verdict: &Verdict,
    ) -> io::Result<(Self, Option<ChildStderr>)> {
        command
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn()?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(io::Error::other(
                "the server's stdin or stdout is not piped",
            ));
        };
        let stderr = child.stderr.take();
        let stdout = Bounded {
            inner: stdout,
            line: 0,
            max: max_message_bytes,
            server: name.into(),
            verdict: verdict.clone(),
        };
        // Killed when dropped (tokio reaps it); rmcp's own bound on a line is one more than
        // this one, which is met first and says so.
        let lines = AsyncRwTransport::new(stdout, stdin)
            .with_max_line_length(max_message_bytes.saturating_add(1));
        Ok((
            ChildTransport {
                child: Some(child),
                lines,
            },
            stderr,
        ))
    }

    /// MCP's stdio shutdown: stdin closed, then `SIGTERM`, then a kill, each after a wait.
    async fn shut_down(&mut self) -> io::Result<()> {
        let Some(child) = self.child.as_mut() else {
            return Ok(());
        };
        self.lines.close().await?;
        if tokio::time::timeout(EXIT_WAIT, child.wait()).await.is_err() {
            #[cfg(unix)]
            {
                let _ = ChildWrapper::signal(&*child, SIGTERM);
            }
            if tokio::time::timeout(EXIT_WAIT, child.wait()).await.is_err() {
                child.kill().await?;
            }
        }
        self.child = None;
        Ok(())
    }
}

impl Transport<RoleClient> for ChildTransport {
    type Error = io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.lines.send(item)
    }

    fn receive(&mut self) -> impl Future<Output = Option<RxJsonRpcMessage<RoleClient>>> + Send {
        self.lines.receive()
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.shut_down()
    }
}

/// A server's stdout that fails, instead of growing, at a line longer than `max`.
struct Bounded<R> {
    inner: R,
    /// The bytes of the current line read so far.
    line: usize,
    max: usize,
    server: Arc<str>,
    verdict: Verdict,
}

impl<R: AsyncRead + Unpin> AsyncRead for Bounded<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.line > this.max {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a message over the bound",
            )));
        }
        let before = buf.filled().len();
        std::task::ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        let read = &buf.filled()[before..];
        // Line by line (a newline found by memchr, not byte by byte): the index of the first
        // byte over the bound, if a line passes it.
        let mut start = 0;
        let mut over = None;
        for end in memchr::memchr_iter(b'\n', read).chain(std::iter::once(read.len())) {
            if this.line + (end - start) > this.max {
                over = Some(start + (this.max - this.line));
                this.line = this.max + 1;
                break;
            }
            if end == read.len() {
                this.line += end - start;
            } else {
                (this.line, start) = (0, end + 1);
            }
        }
        let Some(over) = over else {
            return Poll::Ready(Ok(()));
        };
        let why = format!(
            "the MCP server {} sent a message longer than {} bytes, the most this client \
             reads, and its connection was closed",
            this.server, this.max
        );
        tracing::error!(
            event = "upstream_message_too_large",
            upstream = %this.server,
            max_message_bytes = this.max,
            "{why}: raise the bound, or have the server send less (fewer tools in its \
             tools/list, smaller results)"
        );
        this.verdict.set(why.clone());
        // What came before the byte over the bound is read; the next read fails.
        buf.set_filled(before + over);
        if over == 0 {
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, why)));
        }
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn a_line_over_the_bound_fails_the_read_and_says_why() {
        let verdict = Verdict::default();
        let mut lines = Bounded {
            inner: &b"{\"a\":1}\n0123456789ABCDEF\n"[..],
            line: 0,
            max: 10,
            server: "big".into(),
            verdict: verdict.clone(),
        };
        let mut read = Vec::new();
        let err = lines.read_to_end(&mut read).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        // The first line, and the second up to the bound, were read.
        assert_eq!(read, b"{\"a\":1}\n0123456789");
        let why = verdict.take().unwrap();
        assert!(why.contains("MCP server big"), "{why}");
        assert!(why.contains("longer than 10 bytes"), "{why}");
        assert!(verdict.take().is_none());
        // A line of exactly the bound passes.
        let mut lines = Bounded {
            inner: &b"0123456789\n0123456789"[..],
            line: 0,
            max: 10,
            server: "big".into(),
            verdict: verdict.clone(),
        };
        read.clear();
        lines.read_to_end(&mut read).await.unwrap();
        assert_eq!(read.len(), 21);
        // A line counted across reads.
        let mut lines = Bounded {
            inner: (&b"01234"[..]).chain(&b"56789A\n"[..]),
            line: 0,
            max: 10,
            server: "big".into(),
            verdict: verdict.clone(),
        };
        read.clear();
        assert!(lines.read_to_end(&mut read).await.is_err());
        assert_eq!(read, b"0123456789");
    }
}
