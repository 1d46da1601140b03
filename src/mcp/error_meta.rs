//! How a client tells guildhall's own errors from a tool's or a proxied server's: the
//! `_meta` (of an `isError` result) or `data` (of a protocol error) key [`ERROR_META`],
//! whose value is the error's kind (`crashed`, `timeout`, `circuit_open`, …); and beside it
//! [`TRANSIENT_META`], `true` on an error that the same call may not meet again (a crash, or
//! what it needs unavailable for now: the store while the database restarts).

/// The key that marks an error as guildhall's own, its value the kind.
pub(crate) const ERROR_META: &str = "guildhall/error";

/// The key, beside [`ERROR_META`], that says the same call may succeed when made again.
pub(crate) const TRANSIENT_META: &str = "guildhall/transient";
