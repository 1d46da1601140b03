//! Incoming JSON-RPC messages: decoding, and the error that answers one that cannot be taken.
//!
//! Every request a client sends gets an answer; notifications never do. A line that is not
//! JSON, not UTF-8 or nested deeper than the parser allows is answered `-32700` (parse
//! error, id `null`); a line past [`MAX_MESSAGE_BYTES`] is read to its end keeping only its
//! top-level id, and answered `-32600` with that id (`-32700` with id `null` when it has
//! none); well-formed JSON that is not a valid request gets `-32600`
//! (invalid request) with its id when the id can be read; a `tools/call` whose `name` is not
//! a string or whose `arguments` are not an object gets `-32602` (invalid params). rmcp's own
//! stdio transport drops unparsable lines without a word, which leaves a client waiting on
//! that request forever; [`LineTransport`] answers them. The HTTP endpoint uses the same
//! [`decode`] for its bodies.

use std::borrow::Cow;
use std::sync::Arc;

use rmcp::RoleServer;
use rmcp::model::{ClientJsonRpcMessage, ClientRequest, JsonRpcMessage, JsonRpcRequest};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use serde::de::Error as _;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::Mutex;

use crate::json_id::IdScan;

/// The longest message accepted, in bytes (one stdio line, or one HTTP body).
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// JSON-RPC's parse error.
pub const PARSE_ERROR: i64 = -32700;
/// JSON-RPC's invalid request.
pub const INVALID_REQUEST: i64 = -32600;
/// JSON-RPC's invalid params.
pub const INVALID_PARAMS: i64 = -32602;

/// Why a message was refused: the JSON-RPC error to answer it with.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    /// The request's id, when it could be read (`null` otherwise).
    pub id: Value,
    /// The JSON-RPC error code.
    pub code: i64,
    /// What was wrong, for the client's developer.
    pub message: String,
}

impl Refusal {
    fn parse(message: impl Into<String>) -> Self {
        Self {
            id: Value::Null,
            code: PARSE_ERROR,
            message: message.into(),
        }
    }

    /// The error response, as one line of JSON (no newline).
    pub fn to_json(&self) -> Vec<u8> {
        let response = json!({
            "jsonrpc": "2.0",
            "id": self.id,
            "error": { "code": self.code, "message": self.message },
        });
        serde_json::to_vec(&response).unwrap_or_default()
    }
}

/// Decodes one message. `Ok(None)`: a notification outside MCP, ignored as the other SDKs
/// do.
///
/// # Errors
/// The [`Refusal`] that answers a message that cannot be taken.
pub fn decode(bytes: &[u8]) -> Result<Option<ClientJsonRpcMessage>, Refusal> {
    const BOM: &[u8] = b"\xEF\xBB\xBF";
    let bytes = bytes.strip_prefix(BOM).unwrap_or(bytes);
    if bytes.len() > MAX_MESSAGE_BYTES {
        return Err(Refusal::parse(format!(
            "the message is {} bytes, over the limit of {MAX_MESSAGE_BYTES}",
            bytes.len()
        )));
    }
    // The common case: one typed parse. Diagnosis is for the rare message that fails it.
    match serde_json::from_slice::<ClientJsonRpcMessage>(bytes) {
        // rmcp takes a standard request whose params do not fit as a custom request, which
        // would be answered "method not found": its params are what is wrong.
        Ok(JsonRpcMessage::Request(JsonRpcRequest {
            request: ClientRequest::CustomRequest(custom),
            ..
        })) if custom.method == "tools/call" => {
            let why = serde_json::Error::custom("the params do not fit `tools/call`");
            diagnose(bytes, &why)
        }
        Ok(message) => Ok(Some(message)),
        Err(typed) => diagnose(bytes, &typed),
    }
}

fn diagnose(
    bytes: &[u8],
    typed: &serde_json::Error,
) -> Result<Option<ClientJsonRpcMessage>, Refusal> {
    if let Err(err) = std::str::from_utf8(bytes) {
        return Err(Refusal::parse(format!("the message is not UTF-8: {err}")));
    }
    let value: Value = match serde_json::from_slice(bytes) {
        Ok(value) => value,
        Err(err) => return Err(Refusal::parse(format!("the message is not JSON: {err}"))),
    };
    let id = value
        .get("id")
        .filter(|id| id.is_string() || id.is_i64() || id.is_u64())
        .cloned();
    let method = value.get("method").and_then(Value::as_str);
    if method.is_some() && value.get("id").is_none() {
        // A notification is never answered (JSON-RPC), even one that is not valid: rmcp and
        // the other SDKs ignore those outside MCP (an LSP client's, say) the same way.
        tracing::debug!(%typed, "ignored a notification that could not be taken");
        return Ok(None);
    }
    let invalid = |code: i64, message: String| Refusal {
        id: id.clone().unwrap_or(Value::Null),
        code,
        message,
    };
    if !value.is_object() {
        return Err(invalid(
            INVALID_REQUEST,
            "a JSON-RPC message must be an object".into(),
        ));
    }
    if value.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(invalid(INVALID_REQUEST, "`jsonrpc` must be \"2.0\"".into()));
    }
    if method == Some("tools/call") {
        let params = value.get("params");
        let name = params.and_then(|p| p.get("name"));
        if !name.is_some_and(Value::is_string) {
            return Err(invalid(
                INVALID_PARAMS,
                "`tools/call` needs `params.name`, a string naming the tool".into(),
            ));
        }
        if params
            .and_then(|p| p.get("arguments"))
            .is_some_and(|a| !a.is_object() && !a.is_null())
        {
            return Err(invalid(
                INVALID_PARAMS,
                "`tools/call` takes `params.arguments` as a JSON object".into(),
            ));
        }
        return Err(invalid(
            INVALID_PARAMS,
            format!("invalid `tools/call` params: {typed}"),
        ));
    }
    if method.is_some() && value.get("params").is_some() {
        return Err(invalid(
            INVALID_PARAMS,
            format!(
                "invalid params for `{}`: {typed}",
                method.unwrap_or_default()
            ),
        ));
    }
    Err(invalid(
        INVALID_REQUEST,
        format!("not a valid JSON-RPC request: {typed}"),
    ))
}

/// Newline-delimited JSON-RPC over a byte stream (stdio, the local socket), answering every
/// message it cannot take (see the module docs).
pub struct LineTransport<R, W> {
    read: BufReader<R>,
    line: Vec<u8>,
    /// Dropping the rest of a line found too long, its id sought as it passes.
    discarding: bool,
    scan: IdScan,
    write: Arc<Mutex<Option<W>>>,
}

impl<R, W> LineTransport<R, W>
where
    R: AsyncRead + Send + Unpin,
    W: AsyncWrite + Send + Unpin + 'static,
{
    /// Reads messages from `read`, writes answers to `write`.
    pub fn new(read: R, write: W) -> Self {
        Self {
            read: BufReader::new(read),
            line: Vec::new(),
            discarding: false,
            scan: IdScan::default(),
            write: Arc::new(Mutex::new(Some(write))),
        }
    }

    /// Reads one line into `self.line`, never past [`MAX_MESSAGE_BYTES`]: a longer one is
    /// read to its end with only its id kept. `Ok(None)`: the stream ended. A cancelled
    /// read leaves its partial line for the next call (rmcp's transport is read from inside
    /// a `select!`).
    async fn read_line(&mut self) -> std::io::Result<Option<Line>> {
        loop {
            let (consumed, step) = {
                let available = self.read.fill_buf().await?;
                if available.is_empty() {
                    return Ok(None);
                }
                let newline = available.iter().position(|b| *b == b'\n');
                let take = newline.map_or(available.len(), |i| i + 1);
                if self.discarding {
                    self.scan.feed_all(&available[..take]);
                    (take, newline.map(|_| Step::EndDiscard))
                } else if self.line.len() + take > MAX_MESSAGE_BYTES + 2 {
                    self.scan = IdScan::default();
                    self.scan.feed_all(&self.line);
                    self.scan.feed_all(&available[..take]);
                    self.line.clear();
                    self.discarding = true;
                    (take, newline.map(|_| Step::EndDiscard))
                } else {
                    self.line.extend_from_slice(&available[..take]);
                    (take, newline.map(|_| Step::Line))
                }
            };
            self.read.consume(consumed);
            match step {
                None => {}
                Some(Step::EndDiscard) => {
                    self.discarding = false;
                    return Ok(Some(Line::TooLong(self.scan.id())));
                }
                Some(Step::Line) => return Ok(Some(Line::Whole)),
            }
        }
    }

    /// Writes `bytes` and a newline, in a task of its own so a cancelled `receive` cannot
    /// leave half an answer on the stream.
    fn answer(&self, refusal: &Refusal) {
        tracing::debug!(code = refusal.code, message = %refusal.message, "refused a message");
        let mut bytes = refusal.to_json();
        bytes.push(b'\n');
        let write = Arc::clone(&self.write);
        tokio::spawn(async move {
            if let Some(w) = write.lock().await.as_mut() {
                let _ = w.write_all(&bytes).await;
                let _ = w.flush().await;
            }
        });
    }
}

enum Line {
    Whole,
    /// A line past the limit, read to its end, and its request's id when one was found.
    TooLong(Option<Value>),
}

enum Step {
    Line,
    EndDiscard,
}

impl<R, W> rmcp::transport::Transport<RoleServer> for LineTransport<R, W>
where
    R: AsyncRead + Send + Unpin,
    W: AsyncWrite + Send + Unpin + 'static,
{
    type Error = std::io::Error;

    fn name() -> Cow<'static, str> {
        "guildhall-line".into()
    }

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let write = Arc::clone(&self.write);
        async move {
            let mut bytes = serde_json::to_vec(&item).map_err(std::io::Error::other)?;
            bytes.push(b'\n');
            let mut guard = write.lock().await;
            let w = guard.as_mut().ok_or_else(|| {
                std::io::Error::new(std::io::ErrorKind::NotConnected, "the transport is closed")
            })?;
            w.write_all(&bytes).await?;
            w.flush().await
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        loop {
            match self.read_line().await {
                Ok(Some(Line::Whole)) => {}
                Ok(Some(Line::TooLong(id))) => {
                    // With its id, as the request's answer (the client then hears which
                    // call failed, and why), else as a parse error.
                    let mut refusal = Refusal::parse(format!(
                        "the message is longer than the limit of {MAX_MESSAGE_BYTES} bytes; \
                         send a large file's content in parts, or write it with a command"
                    ));
                    if let Some(id) = id.filter(|id| id.is_string() || id.is_i64() || id.is_u64()) {
                        refusal.id = id;
                        refusal.code = INVALID_REQUEST;
                    }
                    self.answer(&refusal);
                    continue;
                }
                Ok(None) => return None,
                Err(err) => {
                    tracing::debug!(error = %guildhall_actors::ErrorChain(&err), "reading the stream failed");
                    return None;
                }
            }
            let line = std::mem::take(&mut self.line);
            let text = line.strip_suffix(b"\n").unwrap_or(&line);
            let text = text.strip_suffix(b"\r").unwrap_or(text);
            let decoded = (!text.iter().all(u8::is_ascii_whitespace)).then(|| decode(text));
            // Keep the buffer's room for the next line.
            self.line = line;
            self.line.clear();
            match decoded {
                None | Some(Ok(None)) => {}
                Some(Ok(Some(message))) => return Some(message),
                Some(Err(refusal)) => self.answer(&refusal),
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        if let Some(mut w) = self.write.lock().await.take() {
            let _ = w.shutdown().await;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(bytes: &[u8]) -> Refusal {
        decode(bytes).expect_err("refused")
    }

    #[test]
    fn each_kind_of_bad_message_gets_its_code() {
        assert_eq!(refused(b"{not json").code, PARSE_ERROR);
        assert_eq!(refused(b"\"\xff\xfe\"").code, PARSE_ERROR);
        let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        assert_eq!(refused(deep.as_bytes()).code, PARSE_ERROR);
        let r = refused(br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":5}}"#);
        assert_eq!((r.code, r.id.clone()), (INVALID_PARAMS, json!(7)));
        let r = refused(
            br#"{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"x","arguments":[1]}}"#,
        );
        assert_eq!((r.code, r.id.clone()), (INVALID_PARAMS, json!("a")));
        let r = refused(br#"{"jsonrpc":"1.0","id":3,"method":"ping"}"#);
        assert_eq!((r.code, r.id.clone()), (INVALID_REQUEST, json!(3)));
        let r = refused(br#"[1,2]"#);
        assert_eq!((r.code, r.id.clone()), (INVALID_REQUEST, Value::Null));
        // A notification is never answered, whatever it holds.
        assert!(decode(br#"{"jsonrpc":"2.0","method":"notifications/whatever"}"#).is_ok());
        assert!(decode(br#"{"jsonrpc":"2.0","method":"tools/call","params":7}"#).is_ok());
        assert!(
            decode(br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#)
                .unwrap()
                .is_some()
        );
    }
}
