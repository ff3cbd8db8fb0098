//! The lake's catalog in etcd (`etcd://HOST:PORT[,HOST:PORT...]/PREFIX`), for a cluster:
//! every node reads and commits the same tables, and each node's Iceberg REST catalog
//! serves them; no node holds the catalog alone.
//!
//! Layout under the prefix (names percent-escaped: `%`, `/` and `.` as `%25`, `%2F`, `%2E`):
//!
//! ```text
//! <prefix>/namespaces/<level>[.<level>...]          the namespace's properties (JSON)
//! <prefix>/tables/<level>[.<level>...]/<name>       the table's current metadata location
//! ```
//!
//! A table's metadata files are in the warehouse, as with any catalog; etcd holds only
//! where the current one is. A commit writes the next metadata file, then swaps the
//! location in one etcd transaction that holds only if the location is still the one the
//! commit was built on ([`MetadataSwap`]): of two nodes committing on the same metadata,
//! one wins and the other's commit is a conflict. Creating a table or a namespace is a
//! transaction that holds only if the name is free. etcd makes each transaction durable
//! on a quorum of its members before it answers. Renaming or registering tables and
//! changing a namespace's properties are not done (mink never does, and its REST catalog
//! refuses them).

use std::collections::HashMap;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Client, Compare, CompareOp, ConnectOptions, GetOptions, KvClient, Txn, TxnOp};
use iceberg::io::{FileIO, FileIOBuilder};
use iceberg::spec::{TableMetadata, TableMetadataBuilder};
use iceberg::table::Table;
use iceberg::{
    Catalog, Error, ErrorKind, MetadataLocation, Namespace, NamespaceIdent, TableCommit,
    TableCreation, TableIdent,
};

use super::{LakeConfig, MetadataSwap};
use crate::error::{LakeError, Result};
use crate::storage::LakeStorageFactory;

/// The prefix of an etcd catalog's `--lake-catalog`.
pub const ETCD_CATALOG_PREFIX: &str = "etcd://";

/// How long connecting to etcd may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The catalog in etcd.
#[derive(Clone)]
pub(super) struct EtcdCatalog {
    kv: KvClient,
    prefix: String,
    warehouse: String,
    file_io: FileIO,
}

impl std::fmt::Debug for EtcdCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdCatalog")
            .field("prefix", &self.prefix)
            .field("warehouse", &self.warehouse)
            .finish_non_exhaustive()
    }
}

/// The endpoints and key prefix of an `etcd://` catalog URI.
///
/// # Errors
/// [`LakeError::Config`] for a URI without endpoints or prefix.
pub fn parse_uri(uri: &str) -> Result<(Vec<String>, String)> {
    let bad = || {
        LakeError::Config(format!(
            "catalog '{uri}': an etcd catalog is etcd://HOST:PORT[,HOST:PORT...]/PREFIX"
        ))
    };
    let rest = uri.strip_prefix(ETCD_CATALOG_PREFIX).ok_or_else(bad)?;
    let (endpoints, prefix) = rest.split_once('/').ok_or_else(bad)?;
    let endpoints: Vec<String> = endpoints.split(',').map(str::to_string).collect();
    if endpoints.iter().any(String::is_empty) || prefix.trim_matches('/').is_empty() {
        return Err(bad());
    }
    Ok((endpoints, format!("/{}", prefix.trim_matches('/'))))
}

/// Opens the catalog `config` names (its URI an `etcd://` one); etcd is asked once, so
/// that a catalog that cannot be reached stops the start.
///
/// # Errors
/// [`LakeError::Config`] for a bad URI, [`LakeError::Iceberg`] when etcd cannot be reached.
pub(super) async fn open(config: &LakeConfig) -> Result<EtcdCatalog> {
    let (endpoints, prefix) = parse_uri(&config.catalog_uri)?;
    let options = ConnectOptions::new()
        .with_connect_timeout(CONNECT_TIMEOUT)
        .with_timeout(REQUEST_TIMEOUT);
    let unreachable = |error: etcd_client::Error| {
        let at = format!("etcd at {}", endpoints.join(","));
        LakeError::Iceberg(Error::new(ErrorKind::Unexpected, at).with_source(error))
    };
    let client = Client::connect(endpoints.clone(), Some(options))
        .await
        .map_err(unreachable)?;
    let mut kv = client.kv_client();
    kv.get(prefix.clone(), None).await.map_err(unreachable)?;
    let factory = std::sync::Arc::new(LakeStorageFactory(config.storage.clone()));
    Ok(EtcdCatalog {
        kv,
        prefix,
        warehouse: config.warehouse.clone(),
        file_io: FileIOBuilder::new(factory).build(),
    })
}

/// A catalog error of etcd's.
fn etcd_error(error: etcd_client::Error) -> Error {
    Error::new(
        ErrorKind::Unexpected,
        format!("the lake catalog in etcd: {error}"),
    )
}

/// A name as a key part: `%`, `/` and `.` escaped.
fn escape(name: &str) -> String {
    name.replace('%', "%25")
        .replace('/', "%2F")
        .replace('.', "%2E")
}

fn unescape(part: &str) -> String {
    part.replace("%2E", ".")
        .replace("%2F", "/")
        .replace("%25", "%")
}

fn namespace_part(namespace: &NamespaceIdent) -> String {
    let levels: Vec<String> = namespace.iter().map(|level| escape(level)).collect();
    levels.join(".")
}

fn namespace_of(part: &str) -> Result<NamespaceIdent, Error> {
    NamespaceIdent::from_vec(part.split('.').map(unescape).collect())
}

fn no_namespace(namespace: &NamespaceIdent) -> Error {
    Error::new(
        ErrorKind::NamespaceNotFound,
        format!("no namespace {}", namespace.join(".")),
    )
}

fn no_table(table: &TableIdent) -> Error {
    Error::new(ErrorKind::TableNotFound, format!("no table {table}"))
}

/// What the lake never does (nor its REST catalog: see mink-iceberg-rest's `unserved`).
fn unsupported(what: &str) -> Error {
    Error::new(
        ErrorKind::FeatureUnsupported,
        format!("{what} in mink's lake catalog"),
    )
}

fn table_exists_error(table: &TableIdent) -> Error {
    Error::new(
        ErrorKind::TableAlreadyExists,
        format!("table {table} exists"),
    )
}

impl EtcdCatalog {
    fn namespace_key(&self, namespace: &NamespaceIdent) -> String {
        format!("{}/namespaces/{}", self.prefix, namespace_part(namespace))
    }

    /// The prefix of a namespace's tables.
    fn tables_prefix(&self, namespace: &NamespaceIdent) -> String {
        format!("{}/tables/{}/", self.prefix, namespace_part(namespace))
    }

    fn table_key(&self, table: &TableIdent) -> String {
        self.tables_prefix(table.namespace()) + &escape(table.name())
    }

    async fn get(&self, key: String) -> Result<Option<Vec<u8>>, Error> {
        let mut kv = self.kv.clone();
        let response = kv.get(key, None).await.map_err(etcd_error)?;
        Ok(response.kvs().first().map(|kv| kv.value().to_vec()))
    }

    /// The keys under `prefix`, the prefix cut off.
    async fn keys_under(&self, prefix: String) -> Result<Vec<String>, Error> {
        let mut kv = self.kv.clone();
        let options = GetOptions::new().with_prefix().with_keys_only();
        let response = kv
            .get(prefix.clone(), Some(options))
            .await
            .map_err(etcd_error)?;
        Ok((response.kvs().iter())
            .map(|kv| String::from_utf8_lossy(kv.key())[prefix.len()..].to_string())
            .collect())
    }

    /// Runs `txn`; whether its compares held.
    async fn txn(&self, txn: Txn) -> Result<bool, Error> {
        let mut kv = self.kv.clone();
        Ok(kv.txn(txn).await.map_err(etcd_error)?.succeeded())
    }

    async fn table_at(&self, table: &TableIdent, location: String) -> Result<Table, Error> {
        let metadata = TableMetadata::read_from(&self.file_io, &location).await?;
        Table::builder()
            .identifier(table.clone())
            .metadata_location(location)
            .metadata(metadata)
            .file_io(self.file_io.clone())
            .runtime(iceberg::Runtime::try_current()?)
            .build()
    }

    /// Swaps `table`'s metadata location from `expected` to `new`, if it is `expected`.
    async fn swap_location(
        &self,
        table: &TableIdent,
        expected: &str,
        new: &str,
    ) -> Result<bool, Error> {
        let key = self.table_key(table);
        let unchanged = Compare::value(key.clone(), CompareOp::Equal, expected);
        let txn = Txn::new()
            .when([unchanged])
            .and_then([TxnOp::put(key, new, None)]);
        self.txn(txn).await
    }

    /// Registers `table` at `location` if its name is free.
    async fn insert_table(&self, table: &TableIdent, location: &str) -> Result<(), Error> {
        let key = self.table_key(table);
        let free = Compare::version(key.clone(), CompareOp::Equal, 0);
        let txn = Txn::new()
            .when([free])
            .and_then([TxnOp::put(key, location, None)]);
        match self.txn(txn).await? {
            true => Ok(()),
            false => Err(table_exists_error(table)),
        }
    }
}

#[async_trait]
impl MetadataSwap for EtcdCatalog {
    async fn swap(&self, table: &TableIdent, expected: &str, new: &str) -> Result<bool> {
        Ok(self.swap_location(table, expected, new).await?)
    }

    async fn metadata_location(&self, table: &TableIdent) -> Result<Option<String>> {
        let location = self.get(self.table_key(table)).await?;
        Ok(location.map(|bytes| String::from_utf8_lossy(&bytes).into_owned()))
    }
}

#[async_trait]
impl Catalog for EtcdCatalog {
    async fn list_namespaces(
        &self,
        parent: Option<&NamespaceIdent>,
    ) -> iceberg::Result<Vec<NamespaceIdent>> {
        let prefix = format!("{}/namespaces/", self.prefix);
        let depth = parent.map_or(1, |parent| parent.len() + 1);
        let mut namespaces = Vec::new();
        for part in self.keys_under(prefix).await? {
            let namespace = namespace_of(&part)?;
            let below = parent.is_none_or(|parent| namespace.starts_with(parent.as_ref()));
            if namespace.len() == depth && below {
                namespaces.push(namespace);
            }
        }
        Ok(namespaces)
    }

    async fn create_namespace(
        &self,
        namespace: &NamespaceIdent,
        properties: HashMap<String, String>,
    ) -> iceberg::Result<Namespace> {
        let key = self.namespace_key(namespace);
        let value = serde_json::to_vec(&properties).map_err(|e| {
            Error::new(ErrorKind::DataInvalid, "namespace properties").with_source(e)
        })?;
        let free = Compare::version(key.clone(), CompareOp::Equal, 0);
        let txn = Txn::new()
            .when([free])
            .and_then([TxnOp::put(key, value, None)]);
        if !self.txn(txn).await? {
            return Err(Error::new(
                ErrorKind::NamespaceAlreadyExists,
                format!("namespace {} exists", namespace.join(".")),
            ));
        }
        Ok(Namespace::with_properties(namespace.clone(), properties))
    }

    async fn get_namespace(&self, namespace: &NamespaceIdent) -> iceberg::Result<Namespace> {
        let value = (self.get(self.namespace_key(namespace)).await?)
            .ok_or_else(|| no_namespace(namespace))?;
        let properties: HashMap<String, String> = serde_json::from_slice(&value).map_err(|e| {
            Error::new(ErrorKind::DataInvalid, "namespace properties in etcd").with_source(e)
        })?;
        Ok(Namespace::with_properties(namespace.clone(), properties))
    }

    async fn namespace_exists(&self, namespace: &NamespaceIdent) -> iceberg::Result<bool> {
        Ok(self.get(self.namespace_key(namespace)).await?.is_some())
    }

    async fn update_namespace(
        &self,
        _namespace: &NamespaceIdent,
        _properties: HashMap<String, String>,
    ) -> iceberg::Result<()> {
        Err(unsupported("a namespace's properties are not changed"))
    }

    async fn drop_namespace(&self, namespace: &NamespaceIdent) -> iceberg::Result<()> {
        if !self.namespace_exists(namespace).await? {
            return Err(no_namespace(namespace));
        }
        if !self.list_tables(namespace).await?.is_empty() {
            return Err(Error::new(
                ErrorKind::Unexpected,
                format!("namespace {} is not empty", namespace.join(".")),
            ));
        }
        let mut kv = self.kv.clone();
        kv.delete(self.namespace_key(namespace), None)
            .await
            .map_err(etcd_error)?;
        Ok(())
    }

    async fn list_tables(&self, namespace: &NamespaceIdent) -> iceberg::Result<Vec<TableIdent>> {
        if !self.namespace_exists(namespace).await? {
            return Err(no_namespace(namespace));
        }
        let names = self.keys_under(self.tables_prefix(namespace)).await?;
        Ok((names.iter())
            .map(|name| TableIdent::new(namespace.clone(), unescape(name)))
            .collect())
    }

    async fn create_table(
        &self,
        namespace: &NamespaceIdent,
        creation: TableCreation,
    ) -> iceberg::Result<Table> {
        let properties = self.get_namespace(namespace).await?.properties().clone();
        let table = TableIdent::new(namespace.clone(), creation.name.clone());
        let location = match &creation.location {
            Some(location) => location.clone(),
            None => {
                let namespace_location = properties
                    .get("location")
                    .cloned()
                    .unwrap_or_else(|| format!("{}/{}", self.warehouse, namespace.join("/")));
                format!("{namespace_location}/{}", table.name())
            }
        };
        let creation = TableCreation {
            location: Some(location.clone()),
            ..creation
        };
        let metadata = TableMetadataBuilder::from_table_creation(creation)?
            .build()?
            .metadata;
        let metadata_location = MetadataLocation::new_with_metadata(location, &metadata);
        metadata.write_to(&self.file_io, &metadata_location).await?;
        let metadata_location = metadata_location.to_string();
        if let Err(error) = self.insert_table(&table, &metadata_location).await {
            // Best effort: the name was taken meanwhile, and the file is no one's.
            let _ = self.file_io.delete(&metadata_location).await;
            return Err(error);
        }
        self.table_at(&table, metadata_location).await
    }

    async fn load_table(&self, table: &TableIdent) -> iceberg::Result<Table> {
        let location = (self.get(self.table_key(table)).await?).ok_or_else(|| no_table(table))?;
        let location = String::from_utf8_lossy(&location).into_owned();
        self.table_at(table, location).await
    }

    async fn drop_table(&self, table: &TableIdent) -> iceberg::Result<()> {
        let mut kv = self.kv.clone();
        let deleted = kv
            .delete(self.table_key(table), None)
            .await
            .map_err(etcd_error)?;
        match deleted.deleted() {
            0 => Err(no_table(table)),
            _ => Ok(()),
        }
    }

    async fn purge_table(&self, table: &TableIdent) -> iceberg::Result<()> {
        let loaded = self.load_table(table).await?;
        self.drop_table(table).await?;
        iceberg::drop_table_data(&loaded).await
    }

    async fn table_exists(&self, table: &TableIdent) -> iceberg::Result<bool> {
        Ok(self.get(self.table_key(table)).await?.is_some())
    }

    async fn rename_table(&self, _src: &TableIdent, _dest: &TableIdent) -> iceberg::Result<()> {
        Err(unsupported("tables are not renamed"))
    }

    async fn register_table(
        &self,
        _table: &TableIdent,
        _metadata_location: String,
    ) -> iceberg::Result<Table> {
        Err(unsupported("tables are not registered"))
    }

    async fn update_table(&self, commit: TableCommit) -> iceberg::Result<Table> {
        let table = commit.identifier().clone();
        let current = self.load_table(&table).await?;
        let expected = current.metadata_location_result()?.to_string();
        let staged = commit.apply(current)?;
        let location = MetadataLocation::from_str(staged.metadata_location_result()?)?;
        staged
            .metadata()
            .write_to(staged.file_io(), &location)
            .await?;
        let location = location.to_string();
        let swapped = self.swap_location(&table, &expected, &location).await?;
        if !swapped {
            let _ = self.file_io.delete(&location).await;
            return Err(Error::new(
                ErrorKind::CatalogCommitConflicts,
                format!("another commit replaced the metadata of {table} first"),
            )
            .with_retryable(true));
        }
        Ok(staged)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_catalog_uri_names_its_endpoints_and_prefix() {
        let (endpoints, prefix) = parse_uri("etcd://a:2379,b:2379/mink/lake").unwrap();
        assert_eq!(endpoints, ["a:2379", "b:2379"]);
        assert_eq!(prefix, "/mink/lake");
        for bad in [
            "etcd://a:2379",
            "etcd:///x",
            "etcd://a:1,/x",
            "etcd://a:1/",
            "rest:x",
        ] {
            assert!(parse_uri(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn names_with_dots_and_slashes_keep_their_place_in_keys() {
        let namespace = NamespaceIdent::from_vec(vec!["a.b".into(), "c/d%".into()]).unwrap();
        let part = namespace_part(&namespace);
        assert_eq!(part, "a%2Eb.c%2Fd%25");
        assert_eq!(namespace_of(&part).unwrap(), namespace);
    }
}
