//! The lake's catalog and object store.
//!
//! Embedded default: an Iceberg SQL catalog on SQLite at `<data-dir>/lake/catalog.db`
//! (catalog name `mink`, namespace = mink database) and the warehouse
//! `<data-dir>/lake/warehouse` on the local file system. Production: the warehouse on S3
//! ([`LakeConfig::s3`]), the catalog another SQL database or an Iceberg REST catalog
//! (`rest:URL`, [`rest`]). Either way one `object_store` store serves Iceberg's metadata
//! and data files and mink's own Parquet reads.
//!
//! - [`config`]: where the lake lives, and how a data directory remembers it;
//! - `sql`: the SQL catalog and the compare-and-swap of its metadata locations;
//! - [`etcd`]: the catalog in etcd, a cluster's (`etcd://...`), with the same swap;
//! - `rest`: a REST catalog and mink's commits to it;
//! - `swap`: the commit of the SQL and etcd catalogs ([`MetadataSwap`]).
//!
//! Every change to a lake table ends in [`Lake::publish`], the commit point: the SQL and
//! etcd catalogs swap in a metadata file mink wrote ([`MetadataSwap`]), the REST catalog
//! takes the updates and writes it.

pub mod config;
pub mod etcd;
mod rest;
mod sql;
mod swap;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use arrow::datatypes::Field;
use iceberg::arrow::arrow_type_to_type;
use iceberg::spec::{TableMetadata, TableMetadataBuildResult, TableProperties};
use iceberg::table::Table;
use iceberg::transaction::{AddColumn, ApplyTransactionAction, Transaction};
use iceberg::{Catalog, ErrorKind, Namespace, NamespaceIdent, TableCreation, TableIdent};
use mink_core::table::{TableDescriptor, TablePath};
use object_store::ObjectStore;
use tracing::{debug, info, warn};

pub use self::config::{LakeConfig, S3Options};
use self::etcd::ETCD_CATALOG_PREFIX;
use self::rest::RestCommits;
pub(crate) use self::swap::MetadataSwap;
use self::swap::publish_by_swap;
use crate::error::{LakeError, Result};
use crate::layout::{lake_schema, partition_spec};
use crate::reader::plan_tasks;
use crate::storage::LakeStorage;
use crate::upkeep::DEFAULT_MAX_SNAPSHOT_AGE;

/// The catalog name every mink lake table is registered under (pyiceberg finds tables
/// by it).
pub const CATALOG_NAME: &str = "mink";

/// The lake table property naming the mink table (by id) that owns it.
pub const TABLE_ID_PROPERTY: &str = "mink.table-id";

/// The namespace property marking a namespace that a client of mink's REST catalog created
/// (`"true"`): its tables are that client's, never a mink database's.
pub const HOSTED_NAMESPACE_PROPERTY: &str = "mink.hosted";

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

/// The lake: its catalog, how commits are published to it, and the store.
#[derive(Clone)]
pub struct Lake {
    catalog: Arc<dyn Catalog>,
    publisher: Arc<Publisher>,
    warehouse: String,
    storage: LakeStorage,
    /// The last table loaded or committed for each table ([`Lake::load`]).
    loaded: Arc<Mutex<HashMap<TableIdent, Table>>>,
}

/// How a table's next metadata becomes its current one.
#[derive(Debug)]
enum Publisher {
    /// A compare-and-swap mink makes itself: in the SQL catalog's database, or in etcd.
    Swap(Box<dyn MetadataSwap>),
    /// A commit request to the REST catalog.
    Rest(RestCommits),
}

/// What became of publishing a table's next metadata.
pub(crate) enum Swap {
    /// The catalog names the new metadata (as committed) at this location.
    Committed(Box<TableMetadata>, String),
    /// Certainly not committed: another commit came first, or the catalog refused.
    Lost(LakeError),
    /// Maybe committed: the catalog failed and the outcome could not be checked.
    Unknown(LakeError),
}

impl std::fmt::Debug for Lake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lake")
            .field("storage", &self.storage)
            .finish_non_exhaustive()
    }
}

/// The most one length in an Avro file (a manifest list's or a manifest's) may ask the
/// decoder to allocate: a block's bytes, an array's or a map's items, a string. The Avro
/// crate's own bound is 512 MiB, and an array's count reserves that many values of about
/// 48 bytes each: a manifest of a few bytes another engine committed through the REST
/// catalog could ask for 24 GiB at once and abort the process. Real manifests are written
/// in blocks of about 64 KB (Iceberg's and Avro's default sync interval).
pub const MAX_AVRO_ALLOCATION_BYTES: usize = 16 << 20;

/// Sets the Avro decoder's allocation bound for the process ([`MAX_AVRO_ALLOCATION_BYTES`]);
/// the crate takes the first value it is given, so this runs before any lake is read.
fn bound_avro_allocations() {
    let bound = apache_avro::util::max_allocation_bytes(MAX_AVRO_ALLOCATION_BYTES);
    if bound != MAX_AVRO_ALLOCATION_BYTES {
        tracing::warn!(
            bound,
            "the Avro decoder's allocation bound was set before mink's"
        );
    }
}

/// Whether a REST catalog client created `namespace` ([`HOSTED_NAMESPACE_PROPERTY`]).
fn is_hosted(namespace: &Namespace) -> bool {
    namespace
        .properties()
        .get(HOSTED_NAMESPACE_PROPERTY)
        .is_some_and(|hosted| hosted == "true")
}

fn ident(path: &TablePath) -> TableIdent {
    TableIdent::new(
        NamespaceIdent::new(path.database.clone()),
        path.name.clone(),
    )
}

impl Lake {
    /// Opens the catalog (a SQL catalog's tables are created if needed; a REST catalog is
    /// reached on first use, with the `client_id:secret` in
    /// [`config::CATALOG_CREDENTIAL_ENV`] if set). A local warehouse is created, durably,
    /// if it is missing.
    ///
    /// # Errors
    /// [`LakeError::Iceberg`] when the catalog cannot be reached or opened,
    /// [`LakeError::Catalog`] when a SQL catalog's database cannot be opened for commits,
    /// and [`LakeError::Config`] for a catalog URI that is neither `sqlite:...` nor
    /// `rest:URL`, or a local warehouse that cannot be created.
    pub async fn open(config: LakeConfig) -> Result<Self> {
        bound_avro_allocations();
        config.create_local_warehouse()?;
        let (catalog, publisher): (Arc<dyn Catalog>, _) = match config.rest_uri() {
            Some(uri) => {
                let (catalog, commits) = rest::open(&config, uri).await?;
                (Arc::new(catalog), Publisher::Rest(commits))
            }
            None if config.catalog_uri.starts_with(ETCD_CATALOG_PREFIX) => {
                let catalog = etcd::open(&config).await?;
                (
                    Arc::new(catalog.clone()),
                    Publisher::Swap(Box::new(catalog)),
                )
            }
            None => {
                let (catalog, database) = sql::open(&config).await?;
                (Arc::new(catalog), Publisher::Swap(Box::new(database)))
            }
        };
        Ok(Self {
            catalog,
            publisher: Arc::new(publisher),
            warehouse: config.warehouse,
            storage: config.storage,
            loaded: Arc::default(),
        })
    }

    /// The catalog.
    pub fn catalog(&self) -> &dyn Catalog {
        self.catalog.as_ref()
    }

    /// The warehouse location (every table's location is `<warehouse>/<database>/<name>`).
    pub fn warehouse(&self) -> &str {
        &self.warehouse
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
        let existing = self.namespace(&namespace).await?;
        // Hosted namespaces are those the REST clients of this lake's SQL or etcd catalog
        // created; a lake reached over REST is itself such a client, and its namespaces
        // are hosted.
        let serves_rest_clients = matches!(self.publisher.as_ref(), Publisher::Swap(_));
        if serves_rest_clients && existing.as_ref().is_some_and(is_hosted) {
            return Err(LakeError::Refused {
                table: table.path.to_string(),
                message: format!(
                    "the lake namespace {} was created by a client of the REST catalog and \
                     holds its tables: give the database another name",
                    table.path.database
                ),
            });
        }
        if existing.is_none() {
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
        let kept = |current: Option<&str>| {
            self.loaded
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(&ident)
                .filter(|table| current.is_some() && table.metadata_location() == current)
                .cloned()
        };
        let table = match self.publisher.as_ref() {
            Publisher::Swap(swaps) => {
                let current = swaps.metadata_location(&ident).await?;
                if let Some(table) = kept(current.as_deref()) {
                    return Ok(table);
                }
                self.catalog.load_table(&ident).await?
            }
            // A REST catalog answers a load with the whole metadata: the table kept is
            // still worth its parsed manifests.
            Publisher::Rest(_) => {
                let table = self.catalog.load_table(&ident).await?;
                if let Some(kept) = kept(table.metadata_location()) {
                    return Ok(kept);
                }
                table
            }
        };
        self.loaded
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(ident, table.clone());
        Ok(table)
    }

    /// Keeps the version of `current` just committed (`metadata` at `location`) as the
    /// table [`Self::load`] returns while the catalog names it, and, for a table of a
    /// mink database ([`TABLE_ID_PROPERTY`]; mink plans no reads of hosted tables),
    /// plans its current snapshot's files once on a task of its own: a new version starts
    /// with an empty cache of parsed manifests, and the first statement after every commit
    /// would otherwise read and parse each of them again. Best effort: without a runtime
    /// nothing is kept, and a failed warm-up is logged (a statement reads what it needs).
    fn keep_committed(&self, current: &Table, metadata: &TableMetadata, location: &str) {
        let (Ok(handle), Ok(runtime)) = (
            tokio::runtime::Handle::try_current(),
            iceberg::Runtime::try_current(),
        ) else {
            return;
        };
        let committed = Table::builder()
            .file_io(current.file_io().clone())
            .identifier(current.identifier().clone())
            .metadata_location(location)
            .metadata(metadata.clone())
            .runtime(runtime)
            .build();
        let Ok(committed) = committed else {
            return;
        };
        self.loaded
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(committed.identifier().clone(), committed.clone());
        let metadata = committed.metadata();
        let Some(snapshot_id) = metadata.current_snapshot_id() else {
            return;
        };
        if !metadata.properties().contains_key(TABLE_ID_PROPERTY) {
            return;
        }
        handle.spawn(async move {
            if let Err(error) = plan_tasks(&committed, snapshot_id, None).await {
                let table = committed.identifier();
                debug!(%table, %error, "warming the manifests of a commit failed");
            }
        });
    }

    /// Whether `namespace` exists and a REST catalog client created it
    /// ([`HOSTED_NAMESPACE_PROPERTY`]).
    pub async fn is_hosted(&self, namespace: &NamespaceIdent) -> Result<bool> {
        Ok(self
            .namespace(namespace)
            .await?
            .as_ref()
            .is_some_and(is_hosted))
    }

    /// A namespace with its properties; `None` when there is no such namespace.
    async fn namespace(&self, namespace: &NamespaceIdent) -> Result<Option<Namespace>> {
        match self.catalog.get_namespace(namespace).await {
            Ok(found) => Ok(Some(found)),
            Err(e) if e.kind() == ErrorKind::NamespaceNotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Whether the lake has a table for `path`.
    pub async fn exists(&self, path: &TablePath) -> Result<bool> {
        Ok(self.catalog.table_exists(&ident(path)).await?)
    }

    /// Drops a lake table from the catalog and deletes its files.
    pub async fn drop_table(&self, path: &TablePath) -> Result<()> {
        if let Some(table) = self.forget(path).await? {
            table
                .file_io()
                .delete_prefix(table.metadata().location())
                .await?;
        }
        Ok(())
    }

    /// Drops a lake table from the catalog and leaves its files (a REST client's drop
    /// without purge).
    pub async fn forget_table(&self, path: &TablePath) -> Result<()> {
        self.forget(path).await.map(|_| ())
    }

    /// Drops a lake table from the catalog; returns it as it was (None: no such table).
    async fn forget(&self, path: &TablePath) -> Result<Option<Table>> {
        let ident = ident(path);
        if !self.catalog.table_exists(&ident).await? {
            return Ok(None);
        }
        let table = self.catalog.load_table(&ident).await?;
        self.catalog.drop_table(&ident).await?;
        self.loaded
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&ident);
        Ok(Some(table))
    }

    /// Publishes `next`, built from `current`'s metadata, as the table's metadata if the
    /// table is still at `current`: the commit point of every change to a lake table.
    ///
    /// The SQL and etcd catalogs take a metadata file mink writes beside the current one
    /// (deleted again when the swap is lost); the REST catalog takes `next`'s changes,
    /// asserting the table's uuid and its `main` snapshot, and writes the file itself.
    ///
    /// The committed version is kept warm for the next loads ([`Self::keep_committed`]).
    pub(crate) async fn publish(&self, current: &Table, next: TableMetadataBuildResult) -> Swap {
        let swap = match self.publisher.as_ref() {
            Publisher::Swap(swaps) => publish_by_swap(swaps.as_ref(), current, next.metadata).await,
            Publisher::Rest(commits) => commits.publish(current, next.changes).await,
        };
        if let Swap::Committed(metadata, location) = &swap {
            self.keep_committed(current, metadata, location);
        }
        swap
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_avro_count_past_the_bound_is_an_error_not_an_allocation() {
        bound_avro_allocations();
        let schema = apache_avro::Schema::parse_str(r#"{"type": "array", "items": "long"}"#)
            .expect("schema");
        // An array block announcing 2^40 items in five bytes (a zigzag varint).
        let mut count = Vec::new();
        let mut zigzag = (1u64 << 40) << 1;
        while zigzag >= 0x80 {
            count.push(u8::try_from(zigzag & 0x7f).expect("7 bits") | 0x80);
            zigzag >>= 7;
        }
        count.push(u8::try_from(zigzag).expect("7 bits"));
        let error = apache_avro::from_avro_datum(&schema, &mut count.as_slice(), None)
            .expect_err("a count past the bound");
        assert!(
            error
                .to_string()
                .contains(&MAX_AVRO_ALLOCATION_BYTES.to_string()),
            "{error}"
        );
    }
}
