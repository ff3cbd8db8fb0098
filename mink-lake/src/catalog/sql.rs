//! A SQL catalog (iceberg-catalog-sql on SQLite) and mink's own compare-and-swap of a
//! table's metadata location in its database: the catalog's `update_table` only takes
//! iceberg's own (crate-private) table commits.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;

use iceberg::spec::TableMetadata;
use iceberg::table::Table;
use iceberg::{CatalogBuilder, MetadataLocation, TableIdent};
use iceberg_catalog_sql::{
    SQL_CATALOG_PROP_BIND_STYLE, SQL_CATALOG_PROP_URI, SQL_CATALOG_PROP_WAREHOUSE, SqlBindStyle,
    SqlCatalog, SqlCatalogBuilder,
};
use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteSynchronous};

use super::{CATALOG_NAME, LakeConfig, Swap};
use crate::error::{LakeError, Result};
use crate::storage::LakeStorageFactory;
use crate::writer::delete_files;

/// Opens the SQL catalog of `config` and its database for the swaps.
///
/// # Errors
/// [`LakeError::Iceberg`] when the catalog cannot be opened, [`LakeError::Catalog`] when
/// its database cannot be opened for commits, and [`LakeError::Config`] for a URI that is
/// not `sqlite:...`.
pub(super) async fn open(config: &LakeConfig) -> Result<(SqlCatalog, SqlDatabase)> {
    if !config.catalog_uri.starts_with("sqlite:") {
        return Err(LakeError::Config(format!(
            "catalog '{}': give a SQLite catalog (sqlite:PATH?mode=rwc) or an Iceberg REST \
             catalog (rest:URL)",
            config.catalog_uri
        )));
    }
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
    // FULL: the swap is durable when it returns (see `SqlDatabase::swap`).
    let options =
        SqliteConnectOptions::from_str(&config.catalog_uri)?.synchronous(SqliteSynchronous::Full);
    let pool = SqlitePool::connect_with(options).await?;
    Ok((catalog, SqlDatabase(pool)))
}

/// The catalog's database, where a table's current metadata location is one row.
#[derive(Clone, Debug)]
pub(super) struct SqlDatabase(SqlitePool);

impl SqlDatabase {
    /// Publishes `next` as the metadata of `current`'s table: writes it as the next
    /// metadata file beside the current one and swaps the location in. A lost swap deletes
    /// the file again.
    pub(super) async fn publish(&self, current: &Table, next: TableMetadata) -> Swap {
        let written = async {
            let current_location = current.metadata_location_result()?;
            let location = MetadataLocation::from_str(current_location)?
                .with_next_version()
                .with_new_metadata(&next);
            next.write_to(current.file_io(), &location).await?;
            Ok::<_, LakeError>((current_location.to_string(), location.to_string()))
        };
        let (expected, new_location) = match written.await {
            Ok(locations) => locations,
            Err(error) => return Swap::Lost(error),
        };
        let ident = current.identifier();
        let swap = match self.swap(ident, &expected, &new_location).await {
            Ok(true) => Swap::Committed(Box::new(next), new_location.clone()),
            Ok(false) => Swap::Lost(LakeError::CommitConflict {
                table: ident.to_string(),
                message: "another commit replaced the table's metadata first".into(),
            }),
            Err(error) => match self.metadata_location(ident).await {
                // The swap went through after all.
                Ok(Some(location)) if location == new_location => {
                    Swap::Committed(Box::new(next), new_location.clone())
                }
                Ok(_) => Swap::Lost(error),
                Err(_) => Swap::Unknown(error),
            },
        };
        if matches!(swap, Swap::Lost(_)) {
            // Best effort (failures are logged): the error to report is the swap's.
            let _ = delete_files(current, std::slice::from_ref(&new_location)).await;
        }
        swap
    }

    /// Swaps a table's metadata location from `expected` to `new`; false when it was no
    /// longer `expected`.
    ///
    /// This and [`SqlDatabase::metadata_location`] encode the schema of
    /// iceberg-catalog-sql's `iceberg_tables` table, and select a table's row as its own
    /// `update_table` does: by catalog, namespace (joined by `.`) and name, of record type
    /// (`iceberg_type`) `TABLE` or none (rows written before the column existed).
    ///
    /// The swap is durable once it returns, and by then so is every file the new metadata
    /// names (the lake's storage syncs each local file it writes, see [`crate::storage`]).
    /// Its connection sets `synchronous = FULL` (SQLite's default, set explicitly so the
    /// guarantee does not rest on a default) and no journal mode: the catalog stays in
    /// SQLite's rollback journal (`DELETE`), and FULL syncs every transaction in WAL mode
    /// too, should a tool switch the file to it (WAL's `NORMAL` would not).
    ///
    /// # Errors
    /// [`LakeError::Catalog`] when the database fails; the swap may then have happened or
    /// not (see [`SqlDatabase::metadata_location`]).
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

    /// A table's metadata location in the catalog's database (None: no such table), read
    /// from the row [`SqlDatabase::swap`] swaps.
    ///
    /// # Errors
    /// [`LakeError::Catalog`] when the database fails.
    pub(super) async fn metadata_location(&self, table: &TableIdent) -> Result<Option<String>> {
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
