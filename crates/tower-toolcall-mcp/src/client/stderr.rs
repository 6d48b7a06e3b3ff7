//! A stdio server's stderr as log events of the process that runs it.

use std::sync::Arc;

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};

/// The longest part of one stderr line that is logged.
const MAX_LINE_BYTES: usize = 4096;

/// Logs each line of `stderr` as an INFO event `upstream_stderr` of the server `upstream`,
/// until the stream ends; a line longer than [`MAX_LINE_BYTES`] is cut, and bytes that are
/// not UTF-8 are replaced.
pub(super) async fn log_lines(upstream: Arc<str>, stderr: impl AsyncRead + Unpin) {
    let mut lines = BufReader::new(stderr);
    let mut line = Vec::new();
    loop {
        line.clear();
        // At most one line's worth of bytes at a time: a server that never ends its line
        // holds no more than that.
        let read = read_line_bounded(&mut lines, &mut line).await;
        match read {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                let text = String::from_utf8_lossy(&line);
                let text = text.trim_end_matches(['\n', '\r']);
                if !text.is_empty() {
                    tracing::info!(event = "upstream_stderr", upstream = %upstream, "{text}");
                }
            }
        }
    }
}

/// Reads up to the end of a line into `line`, keeping at most [`MAX_LINE_BYTES`] of it and
/// skipping the rest of a longer line. `Ok(0)` at the end of the stream.
async fn read_line_bounded<R: AsyncBufReadExt + Unpin>(
    reader: &mut R,
    line: &mut Vec<u8>,
) -> std::io::Result<usize> {
    let mut total = 0;
    loop {
        let buffer = reader.fill_buf().await?;
        if buffer.is_empty() {
            return Ok(total);
        }
        let (take, done) = match buffer.iter().position(|&b| b == b'\n') {
            Some(end) => (end + 1, true),
            None => (buffer.len(), false),
        };
        let room = MAX_LINE_BYTES.saturating_sub(line.len());
        line.extend_from_slice(&buffer[..take.min(room)]);
        reader.consume(take);
        total += take;
        if done {
            return Ok(total);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn long_lines_are_cut_and_lines_kept_apart() {
        let long = "x".repeat(10_000);
        let text = format!("one\n{long}\nthree");
        let mut reader = BufReader::with_capacity(64, text.as_bytes());
        let mut lines = Vec::new();
        loop {
            let mut line = Vec::new();
            if read_line_bounded(&mut reader, &mut line).await.unwrap() == 0 {
                break;
            }
            lines.push(String::from_utf8(line).unwrap());
        }
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0], "one\n");
        assert_eq!(lines[1].len(), MAX_LINE_BYTES);
        assert_eq!(lines[2], "three");
    }
}
