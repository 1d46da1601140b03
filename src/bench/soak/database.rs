//! The soak's own PostgreSQL database: made on the server the operator names, shared by the
//! soaked servers, measured while they work, dropped after.
//!
//! Each use opens a connection of its own: the soak restarts PostgreSQL midway, which ends
//! every connection open then.

use tokio_postgres::{Client, NoTls};

/// A database made for one soak.
pub(super) struct Database {
    /// The server, as the operator gave it (its user may create databases).
    admin: String,
    name: String,
    /// The database's own connection string.
    url: String,
}

impl Database {
    /// Makes `guildhall_soak_PID` on the server `admin` names (dropping one a killed soak
    /// of this pid left).
    pub(super) async fn make(admin: &str) -> Result<Self, String> {
        let name = format!("guildhall_soak_{}", std::process::id());
        let client = connect(admin).await?;
        for statement in [
            format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
            format!("CREATE DATABASE {name}"),
        ] {
            client
                .batch_execute(&statement)
                .await
                .map_err(|e| format!("cannot make the soak's database ({statement}): {e}"))?;
        }
        let mut url: tokio_postgres::Config = admin
            .parse()
            .map_err(|e| format!("the PostgreSQL URL cannot be read: {e}"))?;
        url.dbname(&name);
        Ok(Self {
            admin: admin.to_owned(),
            url: super::super::cluster::libpq_string(&url),
            name,
        })
    }

    /// Its connection string, for the servers and the ledger.
    pub(super) fn url(&self) -> &str {
        &self.url
    }

    /// Its size on disk, bytes; `None` while the server does not answer.
    pub(super) async fn size(&self) -> Option<u64> {
        let client = connect(&self.admin).await.ok()?;
        let row = client
            .query_one("SELECT pg_database_size($1)", &[&self.name])
            .await
            .ok()?;
        u64::try_from(row.get::<_, i64>(0)).ok()
    }

    /// Drops it, whoever is still connected.
    pub(super) async fn remove(self) {
        if let Ok(client) = connect(&self.admin).await {
            let _ = client
                .batch_execute(&format!(
                    "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                    self.name
                ))
                .await;
        }
    }
}

async fn connect(url: &str) -> Result<Client, String> {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .map_err(|e| format!("cannot reach PostgreSQL: {e}"))?;
    tokio::spawn(connection);
    Ok(client)
}
