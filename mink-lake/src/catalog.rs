//! The lake's catalog and object store.
//!
//! Embedded default: an Iceberg SQL catalog on SQLite at `<data-dir>/lake/catalog.db`
//! (catalog name `mink`, namespace = mink database) and the warehouse
//! `<data-dir>/lake/warehouse` on the local file system. Production: the warehouse on S3
//! ([`LakeConfig::s3`]). Either way one `object_store` store serves Iceberg's metadata and
//! data files and mink's own Parquet reads.

use std::collections::HashMap;
use std::path::Path;
use std::str::FromStr;
use std::sync::{Arc, Mutex, PoisonError};

use arrow::datatypes::Field;
use iceberg::arrow::arrow_type_to_type;
use iceberg::spec::TableProperties;
use iceberg::table::Table;
use iceberg::transaction::{AddColumn, ApplyTransactionAction, Transaction};
use iceberg::{Catalog, CatalogBuilder, ErrorKind, NamespaceIdent, TableCreation, TableIdent};
use iceberg_catalog_sql::{
    SQL_CATALOG_PROP_BIND_STYLE, SQL_CATALOG_PROP_URI, SQL_CATALOG_PROP_WAREHOUSE, SqlBindStyle,
    SqlCatalog, SqlCatalogBuilder,
};
use mink_core::table::{TableDescriptor, TablePath};
use object_store::ObjectStore;
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteSynchronous};
use tracing::{info, warn};

use crate::error::{LakeError, Result};
use crate::layout::{lake_schema, partition_spec};
use crate::storage::{LakeStorage, LakeStorageFactory};
use crate::upkeep::DEFAULT_MAX_SNAPSHOT_AGE;

/// The catalog name every mink lake table is registered under (pyiceberg finds tables
/// by it).
pub const CATALOG_NAME: &str = "mink";

/// The lake table property naming the mink table (by id) that owns it.
pub const TABLE_ID_PROPERTY: &str = "mink.table-id";

/// The properties of a new lake table: mink's own, the retention mink expires snapshots
/// by (written out so that every engine sees it), then the table's `WITH` properties.
fn lake_table_properties(table: &TableDescriptor) -> HashMap<String, String> {
    let mut properties = HashMap::from([
        // mink is the one writer of its lake tables and checks for conflicts itself.
        ("commit.retry.num-retries".to_string(), "0".to_string()),
        (TABLE_ID_PROPERTY.to_string(), table.table_id.to_string()),
        (
            TableProperties::PROPERTY_MAX_SNAPSHOT_AGE_MS.to_string(),
            DEFAULT_MAX_SNAPSHOT_AGE.as_millis().to_string(),
        ),
    ]);
    properties.extend(table.lake_properties.clone());
    properties
}

/// Where the lake lives.
#[derive(Debug, Clone)]
pub struct LakeConfig {
    /// The SQL catalog's database URL (`sqlite:PATH?mode=rwc`).
    pub catalog_uri: String,
    /// The warehouse location (an absolute path, or a URL of the store).
    pub warehouse: String,
    /// The store holding the warehouse.
    pub storage: LakeStorage,
}

impl LakeConfig {
    /// The embedded lake of a data directory: `<data-dir>/lake/{catalog.db,warehouse}`.
    pub fn embedded(data_dir: &Path) -> Result<Self> {
        let lake_dir = std::path::absolute(data_dir.join("lake")).map_err(|e| {
            LakeError::Config(format!("data directory {}: {e}", data_dir.display()))
        })?;
        let warehouse = lake_dir.join("warehouse");
        std::fs::create_dir_all(&warehouse)
            .map_err(|e| LakeError::Config(format!("creating {}: {e}", warehouse.display())))?;
        let store: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new());
        let warehouse = warehouse.display().to_string();
        Ok(Self {
            catalog_uri: format!("sqlite:{}?mode=rwc", lake_dir.join("catalog.db").display()),
            // Knowing its warehouse, the storage syncs every directory up to it after a write.
            storage: LakeStorage::new(store, "").with_warehouse(warehouse.clone()),
            warehouse,
        })
    }
}

/// How to reach an S3 (or S3-compatible) warehouse. Unset fields come from the
/// environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`,
/// `AWS_ENDPOINT_URL`, `AWS_ALLOW_HTTP`, ...), as the AWS tools read them.
#[derive(Debug, Clone, Default)]
pub struct S3Options {
    /// The endpoint of an S3-compatible server (`http://127.0.0.1:9000`).
    pub endpoint: Option<String>,
    /// The region.
    pub region: Option<String>,
    /// The access key id.
    pub access_key_id: Option<String>,
    /// The secret access key.
    pub secret_access_key: Option<String>,
}

impl LakeConfig {
    /// A warehouse on S3 (`s3://bucket/prefix`) with the SQL catalog at `catalog_uri`.
    ///
    /// # Errors
    /// [`LakeError::Config`] for a warehouse that is not an `s3://bucket/...` URL.
    pub fn s3(warehouse: &str, catalog_uri: String, options: S3Options) -> Result<Self> {
        let bucket = warehouse
            .strip_prefix("s3://")
            .and_then(|rest| rest.split('/').next())
            .filter(|bucket| !bucket.is_empty())
            .ok_or_else(|| {
                LakeError::Config(format!(
                    "warehouse '{warehouse}' is not an s3://bucket/... URL"
                ))
            })?;
        let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
        if let Some(endpoint) = options.endpoint {
            builder = builder
                .with_allow_http(endpoint.starts_with("http://"))
                .with_endpoint(endpoint);
        }
        if let Some(region) = options.region {
            builder = builder.with_region(region);
        }
        if let Some(key) = options.access_key_id {
            builder = builder.with_access_key_id(key);
        }
        if let Some(secret) = options.secret_access_key {
            builder = builder.with_secret_access_key(secret);
        }
        let store: Arc<dyn ObjectStore> = Arc::new(builder.build()?);
        Ok(Self {
            catalog_uri,
            warehouse: warehouse.trim_end_matches('/').to_string(),
            storage: LakeStorage::new(store, format!("s3://{bucket}/")),
        })
    }
}

/// The lake: its catalog, the catalog's database (for [`crate::commit`]'s own
/// compare-and-swap of a table's metadata location) and the store.
#[derive(Clone)]
pub struct Lake {
    catalog: Arc<SqlCatalog>,
    database: SqlitePool,
    storage: LakeStorage,
    /// The last table loaded for each path ([`Lake::load`]).
    loaded: Arc<Mutex<HashMap<TablePath, Table>>>,
}

impl std::fmt::Debug for Lake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lake")
            .field("storage", &self.storage)
            .finish_non_exhaustive()
    }
}

fn ident(path: &TablePath) -> TableIdent {
    TableIdent::new(
        NamespaceIdent::new(path.database.clone()),
        path.name.clone(),
    )
}

impl Lake {
    /// Opens the catalog (creating its tables if needed).
    ///
    /// # Errors
    /// [`LakeError::Iceberg`] when the catalog cannot be reached or opened,
    /// [`LakeError::Catalog`] when its database cannot be opened for commits, and
    /// [`LakeError::Config`] for a catalog URI that is not `sqlite:...`.
    pub async fn open(config: LakeConfig) -> Result<Self> {
        if !config.catalog_uri.starts_with("sqlite:") {
            return Err(LakeError::Config(format!(
                "catalog '{}': only a SQLite catalog (sqlite:PATH?mode=rwc) is supported",
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
        // Metadata-layer commits swap `iceberg_tables.metadata_location` themselves: the
        // catalog's `update_table` only takes iceberg's own (crate-private) table commits.
        // FULL: the swap is durable when it returns (see `swap_metadata_location`).
        let options = SqliteConnectOptions::from_str(&config.catalog_uri)?
            .synchronous(SqliteSynchronous::Full);
        let database = SqlitePool::connect_with(options).await?;
        Ok(Self {
            catalog: Arc::new(catalog),
            database,
            storage: config.storage,
            loaded: Arc::default(),
        })
    }

    /// The catalog.
    pub fn catalog(&self) -> &SqlCatalog {
        &self.catalog
    }

    /// The object store of the warehouse.
    pub fn store(&self) -> Result<Arc<dyn ObjectStore>> {
        Ok(self.storage.store()?)
    }

    /// The lake storage (location -> store path).
    pub fn storage(&self) -> &LakeStorage {
        &self.storage
    }

    /// Creates the lake table of a mink table. One of the same table is kept; one left by an
    /// earlier, dropped table of that name (`mink.table-id` differs) is dropped first.
    pub async fn create_table(&self, table: &TableDescriptor) -> Result<Table> {
        let namespace = NamespaceIdent::new(table.path.database.clone());
        if !self.catalog.namespace_exists(&namespace).await? {
            match self
                .catalog
                .create_namespace(&namespace, HashMap::new())
                .await
            {
                Err(e) if e.kind() != ErrorKind::NamespaceAlreadyExists => return Err(e.into()),
                _ => {}
            }
        }
        let ident = ident(&table.path);
        if self.catalog.table_exists(&ident).await? {
            let existing = self.load(&table.path).await?;
            let owner = existing.metadata().properties().get(TABLE_ID_PROPERTY);
            match owner {
                // Left by a dropped mink table of the same name (a crash between dropping
                // the table and its lake): its snapshots are not this table's.
                Some(owner) if *owner != table.table_id.to_string() => {
                    warn!(table = %table.path, owner, "dropping the lake table of an earlier table of this name");
                    self.drop_table(&table.path).await?;
                }
                _ => return Ok(existing),
            }
        }
        let schema = lake_schema(table)?;
        let spec = partition_spec(table, &schema)?;
        let creation = TableCreation::builder()
            .name(table.path.name.clone())
            .schema(schema)
            .partition_spec(spec)
            .properties(lake_table_properties(table))
            .build();
        let created = self.catalog.create_table(&namespace, creation).await?;
        info!(table = %table.path, location = created.metadata().location(), "created lake table");
        Ok(created)
    }

    /// Loads a lake table.
    ///
    /// The table loaded last for `path` is kept while the catalog still names its metadata
    /// (files the lake never rewrites): loading it again costs one catalog query, and its
    /// reads share iceberg's cache of the manifests they parsed, so planning a statement
    /// does not read and parse every manifest again until a commit moves the table on.
    pub async fn load(&self, path: &TablePath) -> Result<Table> {
        let ident = ident(path);
        let current = self.metadata_location(&ident).await?;
        let kept = self
            .loaded
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(path)
            .filter(|table| current.is_some() && table.metadata_location() == current.as_deref())
            .cloned();
        if let Some(table) = kept {
            return Ok(table);
        }
        let table = self.catalog.load_table(&ident).await?;
        self.loaded
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(path.clone(), table.clone());
        Ok(table)
    }

    /// Whether the lake has a table for `path`.
    pub async fn exists(&self, path: &TablePath) -> Result<bool> {
        Ok(self.catalog.table_exists(&ident(path)).await?)
    }

    /// Drops a lake table from the catalog and deletes its files.
    pub async fn drop_table(&self, path: &TablePath) -> Result<()> {
        let ident = ident(path);
        if !self.catalog.table_exists(&ident).await? {
            return Ok(());
        }
        let table = self.catalog.load_table(&ident).await?;
        self.catalog.drop_table(&ident).await?;
        self.loaded
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(path);
        table
            .file_io()
            .delete_prefix(table.metadata().location())
            .await?;
        Ok(())
    }

    /// Swaps a table's metadata location in the catalog's database from `expected` to
    /// `new` (the commit point of [`crate::commit`]); false when it was no longer
    /// `expected`.
    ///
    /// This and [`Lake::metadata_location`] encode the schema of iceberg-catalog-sql's
    /// `iceberg_tables` table, and select a table's row as its own `update_table` does:
    /// by catalog, namespace (joined by `.`) and name, of record type (`iceberg_type`)
    /// `TABLE` or none (rows written before the column existed).
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
    /// not (see [`Lake::metadata_location`]).
    pub(crate) async fn swap_metadata_location(
        &self,
        table: &TableIdent,
        expected: &str,
        new: &str,
    ) -> Result<bool> {
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
        .execute(&self.database)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// A table's metadata location in the catalog's database (None: no such table), read
    /// from the row [`Lake::swap_metadata_location`] swaps.
    ///
    /// # Errors
    /// [`LakeError::Catalog`] when the database fails.
    pub(crate) async fn metadata_location(&self, table: &TableIdent) -> Result<Option<String>> {
        Ok(sqlx::query_scalar(
            "SELECT metadata_location FROM iceberg_tables \
             WHERE catalog_name = ? AND table_namespace = ? AND table_name = ? \
             AND (iceberg_type = 'TABLE' OR iceberg_type IS NULL)",
        )
        .bind(CATALOG_NAME)
        .bind(table.namespace().join("."))
        .bind(table.name())
        .fetch_optional(&self.database)
        .await?)
    }

    /// Adds a (nullable) column to a lake table, as ADD COLUMN does to the mink table.
    pub async fn add_column(&self, path: &TablePath, field: &Field) -> Result<Table> {
        let table = self.load(path).await?;
        let lake_type = arrow_type_to_type(&crate::layout::lake_field_type(field.data_type()))?;
        let tx = Transaction::new(&table);
        let tx = tx
            .update_schema()
            .add_column(AddColumn::optional(field.name(), lake_type))
            .apply(tx)?;
        Ok(tx.commit(self.catalog.as_ref()).await?)
    }
}

/// A lake and one lake table in a temporary directory, for the crate's unit tests.
#[cfg(test)]
pub(crate) mod fixture {
    use arrow::datatypes::{DataType, Field, Schema};
    use iceberg::spec::{
        DataContentType, DataFile, DataFileBuilder, DataFileFormat, Literal, Struct,
    };
    use mink_core::options::TableOptions;
    use mink_core::table::{TableDescriptor, TablePath};

    use super::{Lake, LakeConfig, Table};

    /// The embedded lake of `dir` with the lake table of `db.t` (`id BIGINT NOT NULL`,
    /// two buckets by `id`).
    pub(crate) async fn lake_table(dir: &std::path::Path) -> (Lake, TableDescriptor, Table) {
        lake_table_with(dir, &[]).await
    }

    /// [`lake_table`] with Iceberg table properties.
    pub(crate) async fn lake_table_with(
        dir: &std::path::Path,
        properties: &[(&str, &str)],
    ) -> (Lake, TableDescriptor, Table) {
        let lake = Lake::open(LakeConfig::embedded(dir).unwrap())
            .await
            .unwrap();
        let options = TableOptions {
            bucket_num: 2,
            bucket_key: Some(vec!["id".into()]),
            lake_enabled: true,
            lake_properties: properties
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..TableOptions::default()
        };
        let descriptor = TableDescriptor::new(
            TablePath::new("db", "t"),
            Schema::new(vec![Field::new("id", DataType::Int64, false)]),
            vec![],
            vec![],
            options,
        )
        .unwrap();
        let table = lake.create_table(&descriptor).await.unwrap();
        (lake, descriptor, table)
    }

    /// A one-row file of `content` at `path` in bucket 0, for commits that never read it.
    pub(crate) fn one_row_file(content: DataContentType, path: &str) -> DataFile {
        DataFileBuilder::default()
            .content(content)
            .file_path(path.to_string())
            .file_format(DataFileFormat::Parquet)
            .partition(Struct::from_iter([Some(Literal::int(0))]))
            .record_count(1)
            .file_size_in_bytes(1)
            .build()
            .unwrap()
    }
}
