//! [`AnswerLimit`]: a proxied stdio server's output as rmcp reads it, with every line past
//! rmcp's limit turned into an error answer to the request it answered.
//!
//! rmcp drops a line longer than its limit (16 MiB) and reads on: the request that line
//! answered never hears back, so its caller waited out the whole timeout and was told
//! "timed out". Here each line's top-level `"id"` is found as the line streams by (a small
//! JSON scanner, no buffering), and a line that grows past the limit is cut: rmcp is given
//! its first `limit` bytes, then, once the line ends, its newline (on which rmcp drops it)
//! and an error answer with the same id, which names the size. Memory stays what rmcp's own
//! limit allows; the scanner keeps a few bytes.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, ReadBuf};

use crate::json_id::IdScan;

/// The longest line rmcp reads, its newline included: past it rmcp drops the line.
pub(crate) const LINE_LIMIT: usize = rmcp::transport::async_rw::DEFAULT_MAX_LINE_LENGTH;

/// The JSON-RPC code of the answer that stands in for an oversized one (internal error).
const INTERNAL_ERROR: i32 = -32603;

/// Bytes read from the server at a time.
const CHUNK: usize = 8 * 1024;

/// A server's output, lines past `limit` (newline included) replaced by an error answer.
pub(crate) struct AnswerLimit<R> {
    inner: R,
    limit: usize,
    /// Bytes of the current line so far, its newline not counted.
    line: u64,
    /// The current line is past the limit: its bytes are no longer handed on.
    over: bool,
    scan: IdScan,
    /// Bytes ready to be read, and how far they have been.
    ready: Vec<u8>,
    taken: usize,
    /// The server's output ended.
    ended: bool,
}

impl<R: AsyncRead + Unpin> AnswerLimit<R> {
    /// `inner` with rmcp's limit.
    pub(crate) fn new(inner: R) -> Self {
        Self::with_limit(inner, LINE_LIMIT)
    }

    fn with_limit(inner: R, limit: usize) -> Self {
        Self {
            inner,
            limit,
            line: 0,
            over: false,
            scan: IdScan::default(),
            ready: Vec::with_capacity(CHUNK + 256),
            taken: 0,
            ended: false,
        }
    }

    /// Takes `bytes` from the server: hands on what rmcp should read into `ready`.
    /// Takes in what the server wrote, line by line (found with `memchr`: a 400 KiB image
    /// answer is scanned in bulk, not byte by byte).
    fn take_in(&mut self, mut bytes: &[u8]) {
        loop {
            let end = memchr::memchr(b'\n', bytes);
            let segment = &bytes[..end.unwrap_or(bytes.len())];
            let before = self.line;
            self.scan.feed_all(segment);
            self.line += segment.len() as u64;
            if !self.over {
                // Below the limit so far: the bytes up to the one that reaches it are handed
                // on, and its newline, handed on when it comes, makes rmcp drop the line
                // (rmcp holds at most its limit meanwhile).
                let room = usize::try_from(self.limit as u64 - before).unwrap_or(usize::MAX);
                if segment.len() >= room {
                    self.ready.extend_from_slice(&segment[..room]);
                    self.over = true;
                } else {
                    self.ready.extend_from_slice(segment);
                }
            }
            let Some(at) = end else {
                return;
            };
            self.ready.push(b'\n');
            if self.over {
                self.answer_instead();
            }
            self.line = 0;
            self.over = false;
            self.scan = IdScan::default();
            bytes = &bytes[at + 1..];
        }
    }

    /// The error answer that stands in for the oversized line, when it answered a request.
    fn answer_instead(&mut self) {
        let Some(id) = self.scan.id() else {
            return;
        };
        let bytes = self.line;
        let answer = serde_json::json!({
            "jsonrpc": "2.0",
            "id": id,
            "error": {
                "code": INTERNAL_ERROR,
                "message": format!(
                    "the server's answer is {bytes} bytes, past the {} bytes guildhall reads \
                     from a proxied server; ask it for less",
                    self.limit - 1
                ),
            },
        });
        if let Ok(mut line) = serde_json::to_vec(&answer) {
            line.push(b'\n');
            self.ready.extend_from_slice(&line);
        }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for AnswerLimit<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if this.taken < this.ready.len() {
                let n = out.remaining().min(this.ready.len() - this.taken);
                out.put_slice(&this.ready[this.taken..this.taken + n]);
                this.taken += n;
                if this.taken == this.ready.len() {
                    this.ready.clear();
                    this.taken = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.ended {
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; CHUNK];
            let mut read = ReadBuf::new(&mut chunk);
            match Pin::new(&mut this.inner).poll_read(cx, &mut read) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(err)) => return Poll::Ready(Err(err)),
                Poll::Ready(Ok(())) if read.filled().is_empty() => {
                    // An oversized line cut off by the end: end it, so rmcp does not wait
                    // on it, and answer for it.
                    if this.over {
                        this.ready.push(b'\n');
                        this.answer_instead();
                    }
                    this.ended = true;
                }
                Poll::Ready(Ok(())) => {
                    let n = read.filled().len();
                    this.take_in(&chunk[..n]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt as _;

    async fn through(limit: usize, input: &[u8]) -> Vec<u8> {
        let mut limited = AnswerLimit::with_limit(input, limit);
        let mut out = Vec::new();
        limited.read_to_end(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn lines_within_the_limit_pass_unchanged() {
        let input = b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n{\"a\":[1,2]}\npartial";
        assert_eq!(through(64, input).await, input.to_vec());
    }

    #[tokio::test]
    async fn an_oversized_answer_becomes_an_error_for_its_id_wherever_the_id_is() {
        let big = "x".repeat(200);
        for (line, id) in [
            (
                format!("{{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{{\"t\":\"{big}\"}}}}"),
                "7",
            ),
            // The TypeScript SDK writes the id last; an "id" nested in the result is not it.
            (
                format!(
                    "{{\"result\":{{\"id\":99,\"t\":\"{big}\\\"id\\\":5\"}},\"jsonrpc\":\"2.0\",\"id\":\"r-3\"}}"
                ),
                "\"r-3\"",
            ),
        ] {
            let input = format!("{line}\n{{\"jsonrpc\":\"2.0\",\"id\":8,\"result\":{{}}}}\n");
            let out = String::from_utf8(through(100, input.as_bytes()).await).unwrap();
            let lines: Vec<&str> = out.split('\n').collect();
            // What rmcp is given of the long line: past the limit, so rmcp drops it.
            assert_eq!(lines[0].len(), 100, "{out}");
            let answer: serde_json::Value = serde_json::from_str(lines[1]).unwrap();
            assert_eq!(answer["id"].to_string(), id);
            let message = answer["error"]["message"].as_str().unwrap();
            assert!(
                message.contains(&format!("is {} bytes", line.len())),
                "{message}"
            );
            assert_eq!(lines[2], "{\"jsonrpc\":\"2.0\",\"id\":8,\"result\":{}}");
        }
    }

    #[tokio::test]
    async fn an_oversized_line_without_an_id_is_only_ended() {
        let input = format!("{}\nnext\n", "y".repeat(500));
        let out = through(100, input.as_bytes()).await;
        assert_eq!(out, format!("{}\nnext\n", "y".repeat(100)).into_bytes());
        // Cut off by the end of the output: ended all the same.
        let out = through(100, "z".repeat(300).as_bytes()).await;
        assert_eq!(out, format!("{}\n", "z".repeat(100)).into_bytes());
    }
}
