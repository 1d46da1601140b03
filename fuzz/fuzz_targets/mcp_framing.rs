//! Any bytes as one MCP message (a stdio line or an HTTP body): decoded or refused with a
//! JSON-RPC error that is itself valid JSON, never a panic.
#![no_main]

use guildhall::mcp::framing::{self, INVALID_PARAMS, INVALID_REQUEST, PARSE_ERROR};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(refusal) = framing::decode(data) {
        assert!([PARSE_ERROR, INVALID_REQUEST, INVALID_PARAMS].contains(&refusal.code));
        let answer: serde_json::Value =
            serde_json::from_slice(&refusal.to_json()).expect("the answer is JSON");
        assert_eq!(answer["jsonrpc"], "2.0");
    }
});
