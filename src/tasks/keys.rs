//! Store keys of the board: a task's record under its id, its history under its id and
//! version, both big-endian so keys sort as numbers.

use super::status::TaskId;

/// The key of task `id`'s record.
pub(crate) fn task(id: TaskId) -> Vec<u8> {
    id.to_be_bytes().to_vec()
}

/// The key of the history entry that made version `version` of task `id`.
pub(crate) fn event(id: TaskId, version: u64) -> Vec<u8> {
    let mut key = Vec::with_capacity(16);
    key.extend_from_slice(&id.to_be_bytes());
    key.extend_from_slice(&version.to_be_bytes());
    key
}
