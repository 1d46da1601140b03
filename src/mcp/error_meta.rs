//! How a client tells guildhall's own errors from a tool's or a proxied server's: the
//! `_meta` (of an `isError` result) or `data` (of a protocol error) key [`ERROR_META`],
//! whose value is the error's kind (`crashed`, `timeout`, `circuit_open`, …).

/// The key that marks an error as guildhall's own, its value the kind.
pub(crate) const ERROR_META: &str = "guildhall/error";
