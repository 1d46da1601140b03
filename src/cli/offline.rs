//! What a command run without a server opens: the data directory's store, or the database
//! its config names.

/// Read-only commands never create a store: a mistyped `--data-dir` gets an error instead
/// of a new, empty store.
pub(super) fn require_store(data_dir: &std::path::Path, reads_only: bool) -> Result<(), String> {
    let in_database = store_section(data_dir).is_ok_and(|store| store.url.is_some());
    if reads_only && !in_database {
        require_embedded_store(data_dir)?;
    }
    Ok(())
}

/// An error naming `data_dir` unless it holds an embedded store.
fn require_embedded_store(data_dir: &std::path::Path) -> Result<(), String> {
    if data_dir.join(guildhall::store::FILE_NAME).exists() {
        return Ok(());
    }
    Err(format!(
        "no guildhall store in {} (is --data-dir right? `guildhall serve`, `guildhall mcp` \
         and commands that write create one)",
        data_dir.display()
    ))
}

/// The `[store]` section of the data directory's config file (the default when there is
/// no file).
pub(super) fn store_section(
    data_dir: &std::path::Path,
) -> Result<guildhall::config::StoreSection, guildhall::config::ConfigError> {
    let file = data_dir.join(guildhall::config::CONFIG_FILE);
    Ok(guildhall::config::Config::load(&file, false)?.store)
}

/// The runtime of a command run without a server: on the database the data directory's
/// config names (`[store] url`), else on the embedded store in the data directory.
///
/// # Errors
/// The config file's error, when it cannot be read.
pub(super) fn offline_runtime(
    data_dir: &std::path::Path,
) -> Result<guildhall::RuntimeBuilder, guildhall::config::ConfigError> {
    let store = store_section(data_dir)?;
    #[cfg_attr(not(feature = "postgres"), allow(unused_mut))]
    let mut builder = guildhall::Runtime::builder().data_dir(data_dir);
    #[cfg(feature = "postgres")]
    if let Some(url) = store.url {
        builder = builder.store_url(url);
        if let Some(lease) = store.lease {
            builder = builder.store_lease(lease);
        }
    }
    #[cfg(not(feature = "postgres"))]
    let _ = store;
    Ok(builder)
}

/// The store of a command that only reads it, without a server: the database the data
/// directory's config names (`[store] url`), else the embedded store in the directory,
/// which must be there already ([`require_store`]).
///
/// # Errors
/// The config file's error, a directory without a store, or the store's error when it
/// cannot be opened.
pub(super) fn offline_store(
    data_dir: &std::path::Path,
) -> Result<std::sync::Arc<dyn guildhall::store::Store>, Box<dyn std::error::Error>> {
    let store = store_section(data_dir)?;
    if store.url.is_none() {
        require_embedded_store(data_dir)?;
    }
    #[cfg(feature = "postgres")]
    if let Some(url) = store.url {
        let lease = store.lease.unwrap_or(guildhall::store::DEFAULT_LEASE);
        return Ok(std::sync::Arc::new(
            guildhall::store::PostgresStore::open_url(&url, lease)?,
        ));
    }
    #[cfg(not(feature = "postgres"))]
    let _ = store;
    Ok(guildhall::store::open(data_dir)?)
}
