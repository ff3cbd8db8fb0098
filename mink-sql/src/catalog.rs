//! `MinkCatalog`: every mink database as a DataFusion schema, every table in it as a
//! [`MinkTable`], and the `system` schema of the node's state.
//!
//! A database exists while it holds a table, except [`DEFAULT_DATABASE`], where a table
//! named without a database goes: it is always listed, empty or not, so that clients
//! browsing the catalog (`information_schema.schemata`, Flight SQL's `GetDbSchemas`)
//! find the database their unqualified names mean.
//!
//! The catalog is a view of the node taken when it is loaded: the table names are listed
//! then (DataFusion asks for them synchronously), and a table's descriptor is fetched
//! when a query names it. Load it again to see tables created since.

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::catalog::{CatalogProvider, SchemaProvider, TableProvider};
use datafusion::datasource::TableType;
use datafusion::error::{DataFusionError, Result};
use mink_client::{ClientError, MinkClient};
use mink_core::table::TablePath;
use mink_lake::storage::LakeStorage;

use crate::split::external;
use crate::system::{SYSTEM_SCHEMA, SystemSchema};
use crate::table::{MinkTable, ReadKind};

/// The name mink's catalog is registered under.
pub const CATALOG_NAME: &str = "mink";
/// The database of a table named without one.
pub const DEFAULT_DATABASE: &str = "default";

/// The catalog of one mink node.
#[derive(Debug)]
pub struct MinkCatalog {
    databases: BTreeMap<String, Arc<MinkDatabase>>,
    system: Arc<SystemSchema>,
}

impl MinkCatalog {
    /// Lists the node's tables; lake files are read from `storage`.
    ///
    /// # Errors
    /// The node could not be reached.
    pub async fn load(client: MinkClient, storage: LakeStorage) -> Result<Self, ClientError> {
        let mut databases: BTreeMap<String, Vec<String>> = BTreeMap::new();
        databases.insert(DEFAULT_DATABASE.to_string(), Vec::new());
        for path in client.list_tables(None).await? {
            databases.entry(path.database).or_default().push(path.name);
        }
        let system = Arc::new(SystemSchema::new(client.clone()));
        let databases = databases
            .into_iter()
            .map(|(name, tables)| {
                let database = MinkDatabase {
                    name: name.clone(),
                    tables,
                    client: client.clone(),
                    storage: storage.clone(),
                };
                (name, Arc::new(database))
            })
            .collect();
        Ok(Self { databases, system })
    }
}

impl CatalogProvider for MinkCatalog {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.databases.keys().cloned().collect();
        names.push(SYSTEM_SCHEMA.to_string());
        names
    }

    fn schema(&self, name: &str) -> Option<Arc<dyn SchemaProvider>> {
        if name == SYSTEM_SCHEMA {
            return Some(Arc::clone(&self.system) as Arc<dyn SchemaProvider>);
        }
        self.databases
            .get(name)
            .map(|database| Arc::clone(database) as Arc<dyn SchemaProvider>)
    }
}

/// One mink database.
#[derive(Debug)]
struct MinkDatabase {
    name: String,
    tables: Vec<String>,
    client: MinkClient,
    storage: LakeStorage,
}

#[async_trait]
impl SchemaProvider for MinkDatabase {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn table_names(&self) -> Vec<String> {
        self.tables.clone()
    }

    async fn table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        let Some((table, kind)) = ReadKind::of_name(name) else {
            return Ok(None);
        };
        if !self.tables.iter().any(|t| t == table) {
            return Ok(None);
        }
        let path = TablePath::new(&self.name, table);
        let table = self.client.describe_table(&path).await.map_err(external)?;
        if kind == ReadKind::Lake && !table.lake_enabled {
            return Err(DataFusionError::Plan(format!(
                "{path}$lake: table {path} has no lake ('lake.enabled' is off)"
            )));
        }
        let provider = MinkTable::new(table, kind, self.client.clone(), self.storage.clone());
        Ok(Some(Arc::new(provider)))
    }

    /// Every table is a base table; answered without asking the node for it (as
    /// [`SchemaProvider::table`] does), so listing tables (`SHOW TABLES`, Flight SQL's
    /// `GetTables`) costs no call per table.
    async fn table_type(&self, name: &str) -> Result<Option<TableType>> {
        Ok(self.table_exist(name).then_some(TableType::Base))
    }

    /// `t`, `t$lake` and `t$changelog` for every table `t`.
    fn table_exist(&self, name: &str) -> bool {
        ReadKind::of_name(name).is_some_and(|(table, _)| self.tables.iter().any(|t| t == table))
    }
}
