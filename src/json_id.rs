//! [`IdScan`]: a JSON-RPC message's top-level `"id"`, found as its bytes stream by, for a
//! message too long to be parsed: its answer can still name the request it answers.
//!
//! Used both ways: a proxied server's answer past rmcp's line limit (`servers`), and a
//! client's request past the transport's message limit (`mcp`). Either would otherwise be
//! dropped, or answered with a `null` id that no client matches to its request, and its
//! caller would wait out its whole timeout.

/// Finds a JSON object's top-level `"id"` as its bytes stream by: strings, escapes and
/// nesting are followed, the value of a key `id` at depth 1 is kept (at most
/// [`IdScan::MAX_ID`] bytes). Anything that is not JSON simply yields no id.
#[derive(Default)]
pub(crate) struct IdScan {
    depth: u32,
    in_string: bool,
    escaped: bool,
    /// The string being read at depth 1, while it may still be `id`.
    key: Vec<u8>,
    /// The last string closed at depth 1 was `id`: the next `:` starts its value.
    id_key: bool,
    /// Reading the id's value.
    value: Option<Vec<u8>>,
    /// The id's value, once read whole.
    found: Option<Vec<u8>>,
}

impl IdScan {
    /// Bytes of an id kept: request ids are numbers or short strings.
    const MAX_ID: usize = 256;

    pub(crate) fn feed(&mut self, b: u8) {
        if let Some(value) = &mut self.value {
            // A value at depth 1 ends at the `,` or `}` after it (outside its string).
            let ends = !self.in_string && self.depth == 1 && (b == b',' || b == b'}');
            if ends {
                let value = self.value.take().unwrap_or_default();
                self.found.get_or_insert(value);
            } else if value.len() < Self::MAX_ID {
                value.push(b);
            } else {
                self.value = None;
            }
        }
        if self.in_string {
            if self.escaped {
                self.escaped = false;
            } else if b == b'\\' {
                self.escaped = true;
            } else if b == b'"' {
                self.in_string = false;
                if self.depth == 1 && self.value.is_none() {
                    self.id_key = self.key == b"id";
                }
            } else if self.depth == 1 && self.key.len() <= 2 {
                self.key.push(b);
            }
            return;
        }
        match b {
            b'"' => {
                self.in_string = true;
                self.key.clear();
            }
            b'{' | b'[' => self.depth += 1,
            b'}' | b']' => self.depth = self.depth.saturating_sub(1),
            b':' if self.depth == 1 && self.id_key && self.found.is_none() => {
                self.value = Some(Vec::new());
                self.id_key = false;
            }
            b',' => self.id_key = false,
            _ => {}
        }
    }

    /// [`IdScan::feed`] for each of `bytes`; the inside of a string that is neither a
    /// top-level key nor the id (an image's base64, a long text) is skipped to its next quote
    /// or backslash in bulk.
    pub(crate) fn feed_all(&mut self, mut bytes: &[u8]) {
        while let Some((&b, rest)) = bytes.split_first() {
            let inert = self.in_string
                && !self.escaped
                && self.value.is_none()
                && !(self.depth == 1 && self.key.len() <= 2);
            if inert {
                match memchr::memchr2(b'"', b'\\', bytes) {
                    // The quote or backslash itself is fed below.
                    Some(0) => {}
                    Some(at) => {
                        bytes = &bytes[at..];
                        continue;
                    }
                    None => return,
                }
            }
            self.feed(b);
            bytes = rest;
        }
    }

    /// The id read, as JSON.
    pub(crate) fn id(&self) -> Option<serde_json::Value> {
        let raw = self.found.as_deref()?;
        serde_json::from_slice(raw.trim_ascii()).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::IdScan;

    /// The id as byte-by-byte feeding finds it, and as [`IdScan::feed_all`] does in one go
    /// and in pieces of every size.
    fn ids(line: &str) -> Vec<Option<serde_json::Value>> {
        let mut one_by_one = IdScan::default();
        for &b in line.as_bytes() {
            one_by_one.feed(b);
        }
        let mut found = vec![one_by_one.id()];
        for piece in [1, 2, 3, 7, 64, line.len().max(1)] {
            let mut scan = IdScan::default();
            for chunk in line.as_bytes().chunks(piece) {
                scan.feed_all(chunk);
            }
            found.push(scan.id());
        }
        found
    }

    #[test]
    fn bulk_feeding_finds_the_same_id_as_byte_by_byte() {
        let data = "QUJD".repeat(500);
        for (line, id) in [
            (
                format!(r#"{{"jsonrpc":"2.0","id":7,"result":{{"data":"{data}"}}}}"#),
                "7",
            ),
            (
                format!(r#"{{"result":{{"id":99,"t":"{data}\"id\":5\\"}},"id":"r-3"}}"#),
                "\"r-3\"",
            ),
            (format!(r#"{{"a":"x\\\"y","id":[1],"b":"{data}"}}"#), "[1]"),
            (r#"{"id":"a\"b","x":1}"#.to_owned(), r#""a\"b""#),
        ] {
            for found in ids(&line) {
                assert_eq!(
                    found.map(|v| v.to_string()).as_deref(),
                    Some(id),
                    "{line:.80}"
                );
            }
        }
        assert!(
            ids(&format!(r#"{{"result":"{data}"}}"#))
                .iter()
                .all(Option::is_none)
        );
    }
}
