//! A SQL catalog (iceberg-catalog-sql on SQLite) and mink's own compare-and-swap of a
//! table's metadata location in its database: the catalog's `update_table` only takes
//! iceberg's own (crate-private) table commits.
//!
//! # Durability
//!
//! Two pools open the database: iceberg-catalog-sql's own (through the URI: create table,
//! drop table, iceberg's `Transaction::commit`), and mink's (the swap every round,
//! compaction and expiry commits through). A commit must survive a power cut, or the
//! catalog forgets a snapshot `meta.db` already recorded. SQLite's default rollback
//! journal does not promise that: a commit ends by deleting the journal, and until the
//! directory is synced the journal may come back and roll the commit back (SQLite's
//! `synchronous = EXTRA` exists for that). iceberg's pool cannot be given a pragma (sqlx
//! takes none from a URI), so the database itself is switched to the write-ahead log,
//! which is persistent in the file: every later connection, iceberg's included, runs in
//! it. In WAL mode a commit is durable when its frames are synced to the `-wal` file,
//! which `synchronous = FULL` does at every commit: mink's pool sets it, and iceberg's
//! connections get it as SQLite's compiled default (sqlx sends no `synchronous` unless
//! asked, and the bundled SQLite defaults both `SQLITE_DEFAULT_SYNCHRONOUS` and
//! `SQLITE_DEFAULT_WAL_SYNCHRONOUS` to FULL). SQLite syncs the directory when it creates
//! the `-wal` file, not when it creates the database: [`SqlDatabase::open`] does that.
//!
//! Other readers of the catalog (pyiceberg through SQLAlchemy, a later `mink` process)
//! read a WAL database as they read any other; they need to be able to write the `-shm`
//! file beside it, as they do the rollback journal.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;

use async_trait::async_trait;
use iceberg::{CatalogBuilder, TableIdent};
use iceberg_catalog_sql::{
    SQL_CATALOG_PROP_BIND_STYLE, SQL_CATALOG_PROP_URI, SQL_CATALOG_PROP_WAREHOUSE, SqlBindStyle,
    SqlCatalog, SqlCatalogBuilder,
};
use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteSynchronous};

use super::{CATALOG_NAME, LakeConfig, MetadataSwap};
use crate::error::{LakeError, Result};
use crate::storage::LakeStorageFactory;

/// Opens the SQL catalog of `config` and its database for the swaps: the database first,
/// so that it runs in WAL mode before iceberg's pool opens it (see the module docs).
///
/// # Errors
/// [`LakeError::Iceberg`] when the catalog cannot be opened, [`LakeError::Catalog`] when
/// its database cannot be opened for commits, and [`LakeError::Config`] for a URI that is
/// not `sqlite:...` or a database that cannot run in WAL mode.
pub(super) async fn open(config: &LakeConfig) -> Result<(SqlCatalog, SqlDatabase)> {
    if !config.catalog_uri.starts_with("sqlite:") {
        return Err(LakeError::Config(format!(
            "catalog '{}': give a SQLite catalog (sqlite:PATH?mode=rwc) or an Iceberg REST \
             catalog (rest:URL)",
            config.catalog_uri
        )));
    }
    let database = SqlDatabase::open(&config.catalog_uri).await?;
    let factory = Arc::new(LakeStorageFactory(config.storage.clone()));
    let catalog = SqlCatalogBuilder::default()
        .with_storage_factory(factory)
        .load(
            CATALOG_NAME,
            HashMap::from([
                (SQL_CATALOG_PROP_URI.to_string(), config.catalog_uri.clone()),
                (
                    SQL_CATALOG_PROP_WAREHOUSE.to_string(),
                    config.warehouse.clone(),
                ),
                (
                    SQL_CATALOG_PROP_BIND_STYLE.to_string(),
                    SqlBindStyle::QMark.to_string(),
                ),
            ]),
        )
        .await?;
    Ok((catalog, database))
}

/// The catalog's database, where a table's current metadata location is one row.
#[derive(Clone, Debug)]
pub(super) struct SqlDatabase(SqlitePool);

impl SqlDatabase {
    /// Opens the database at `uri` (creating it when the URI says `mode=rwc`) with
    /// `synchronous = FULL`, switches it to WAL mode if it is not in it yet, and syncs the
    /// directory holding it, so that after a power cut the file is there and every commit
    /// it acknowledged is in it (see the module docs). An in-memory database stays as it is.
    ///
    /// # Errors
    /// [`LakeError::Catalog`] when the database cannot be opened or the directory synced,
    /// [`LakeError::Config`] when it cannot run in WAL mode (a file system without the
    /// shared memory WAL needs).
    async fn open(uri: &str) -> Result<Self> {
        let options = SqliteConnectOptions::from_str(uri)?.synchronous(SqliteSynchronous::Full);
        let file = options.get_filename().to_path_buf();
        let pool = SqlitePool::connect_with(options).await?;
        let mut mode: String = sqlx::query_scalar("PRAGMA journal_mode")
            .fetch_one(&pool)
            .await?;
        if mode != "wal" && mode != "memory" {
            // Persistent: recorded in the database file, for every connection from now on.
            mode = sqlx::query_scalar("PRAGMA journal_mode = WAL")
                .fetch_one(&pool)
                .await?;
        }
        match mode.as_str() {
            "wal" => mink_durable::sync_parent(&file).map_err(sqlx::Error::Io)?,
            "memory" => {}
            other => {
                return Err(LakeError::Config(format!(
                    "the lake catalog {} stays in SQLite's {other} journal mode: mink needs \
                     its write-ahead log (WAL), so that no commit is lost to a power cut; \
                     keep the catalog on a local file system",
                    file.display()
                )));
            }
        }
        Ok(Self(pool))
    }
}

/// The swap of a table's metadata location in the SQL catalog's database.
///
/// Its two queries encode the schema of iceberg-catalog-sql's `iceberg_tables` table, and
/// select a table's row as its own `update_table` does: by catalog, namespace (joined by
/// `.`) and name, of record type (`iceberg_type`) `TABLE` or none (rows written before the
/// column existed).
///
/// The swap is durable once it returns, and by then so is every file the new metadata
/// names (the lake's storage syncs each local file it writes, see [`crate::storage`]): the
/// database runs in WAL mode with `synchronous = FULL` (see the module docs; WAL's
/// `NORMAL` would not sync the commit).
#[async_trait]
impl MetadataSwap for SqlDatabase {
    async fn swap(&self, table: &TableIdent, expected: &str, new: &str) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE iceberg_tables SET metadata_location = ?, previous_metadata_location = ? \
             WHERE catalog_name = ? AND table_namespace = ? AND table_name = ? \
             AND (iceberg_type = 'TABLE' OR iceberg_type IS NULL) \
             AND metadata_location = ?",
        )
        .bind(new)
        .bind(expected)
        .bind(CATALOG_NAME)
        .bind(table.namespace().join("."))
        .bind(table.name())
        .bind(expected)
        .execute(&self.0)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn metadata_location(&self, table: &TableIdent) -> Result<Option<String>> {
        Ok(sqlx::query_scalar(
            "SELECT metadata_location FROM iceberg_tables \
             WHERE catalog_name = ? AND table_namespace = ? AND table_name = ? \
             AND (iceberg_type = 'TABLE' OR iceberg_type IS NULL)",
        )
        .bind(CATALOG_NAME)
        .bind(table.namespace().join("."))
        .bind(table.name())
        .fetch_optional(&self.0)
        .await?)
    }
}

#[cfg(test)]
mod tests {
    use sqlx::any::{AnyPoolOptions, install_default_drivers};
    use sqlx::sqlite::SqliteJournalMode;

    use super::*;
    use crate::catalog::Lake;

    #[tokio::test]
    async fn every_connection_to_the_catalog_commits_durably_in_wal_mode() {
        let dir = tempfile::tempdir().unwrap();
        let config = LakeConfig::embedded(dir.path()).unwrap();
        // A catalog an earlier mink left in the rollback journal.
        let options = SqliteConnectOptions::from_str(&config.catalog_uri)
            .unwrap()
            .journal_mode(SqliteJournalMode::Delete);
        let earlier = SqlitePool::connect_with(options).await.unwrap();
        sqlx::query("CREATE TABLE earlier (x INTEGER)")
            .execute(&earlier)
            .await
            .unwrap();
        earlier.close().await;

        let _lake = Lake::open(config.clone()).await.unwrap();
        // The mode is the file's: bytes 18 and 19 of its header are 2 in WAL mode.
        let header = std::fs::read(dir.path().join("lake/catalog.db")).unwrap();
        assert_eq!(header[18..20], [2, 2]);
        // iceberg-catalog-sql connects through sqlx's Any driver with the URI alone, as
        // this pool does: WAL from the file, FULL (2) from SQLite's compiled default.
        install_default_drivers();
        let iceberg_like = AnyPoolOptions::new()
            .connect(&config.catalog_uri)
            .await
            .unwrap();
        let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
            .fetch_one(&iceberg_like)
            .await
            .unwrap();
        let synchronous: i64 = sqlx::query_scalar("PRAGMA synchronous")
            .fetch_one(&iceberg_like)
            .await
            .unwrap();
        assert_eq!((mode.as_str(), synchronous), ("wal", 2));
    }
}
