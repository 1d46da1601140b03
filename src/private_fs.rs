//! Files only their owner may read: the data directory (mode `0700`), the store and spill
//! files (`0600`). A leaf every layer may use.
//!
//! The store holds every agent's mail and context, spill files whole tool results, and the
//! local socket in the data directory is as reachable as the directory is: other local users
//! must not be able to read or reach any of it (docs/security.md). Modes are set when the
//! file or directory is created; an existing directory is left as its owner set it.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;

/// The mode of directories guildhall creates.
pub const DIR_MODE: u32 = 0o700;
/// The mode of files guildhall creates.
pub const FILE_MODE: u32 = 0o600;

/// Creates `dir` and any missing parents, each new one with mode `0700`.
///
/// # Errors
/// The I/O error.
pub fn create_dir_all(dir: &Path) -> io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, DIR_MODE);
    builder.create(dir)
}

/// Options that create a file with mode `0600`.
pub fn options() -> OpenOptions {
    let mut options = File::options();
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, FILE_MODE);
    options
}

/// Writes `bytes` to `path`, created with mode `0600` (or truncated).
///
/// # Errors
/// The I/O error.
pub fn write(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write;
    options()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?
        .write_all(bytes)
}

/// Makes an existing file `0600` (one made by a library that does not take a mode).
///
/// # Errors
/// The I/O error.
pub fn restrict(path: &Path) -> io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(FILE_MODE))
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        Ok(())
    }
}
