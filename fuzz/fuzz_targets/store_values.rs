//! Any bytes as a stored value of each kind the runtime reads back: decoded or refused with
//! an error, never a panic; a decoded message's times format.
#![no_main]

use guildhall::agents::{AgentRecord, Message};
use guildhall::context::{LoggedBatch, SessionRecord};
use guildhall::store::{Table, codec};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = codec::check(Table::Inbox, data);
    if let Ok(m) = codec::decode::<Message>(Table::Inbox, data) {
        let _ = guildhall::time::rfc3339(m.created_ms);
        let _ = m.expires_ms.map(guildhall::time::rfc3339);
    }
    let _ = codec::decode::<AgentRecord>(Table::Agents, data);
    let _ = codec::decode::<SessionRecord>(Table::Sessions, data);
    let _ = codec::decode::<LoggedBatch>(Table::ContextLog, data);
});
