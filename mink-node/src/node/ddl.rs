//! Table definitions: creating a table (its metadata, its tablets, its lake table),
//! dropping one and adding a column. One DDL statement at a time; a create that fails
//! at any step removes what the earlier steps made.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::datatypes::Field;
use mink_core::table::{TableDescriptor, TablePath};
use tracing::info;

use super::validate::check_table_size;
use super::{Bucket, Node, Slot, TableState};
use crate::error::{NodeError, Result};

impl Node {
    /// Creates a table (and its lake table when `lake.enabled`); with `if_not_exists`, an
    /// existing table of that name is returned.
    ///
    /// The table's metadata is one SQLite transaction; its tablets are opened next and its
    /// lake table created, and only then is the table visible. A failure at any step
    /// removes what the earlier steps made, so a failed create leaves nothing behind (a
    /// crash leaves at most a table whose missing tablets the next start creates).
    ///
    /// # Errors
    /// [`NodeError::TableExists`]; [`NodeError::InvalidArgument`] for a `bucket.num`
    /// above [`NodeConfig::max_bucket_num`](super::NodeConfig::max_bucket_num), buckets
    /// past [`NodeConfig::max_open_buckets`](super::NodeConfig::max_open_buckets), an
    /// option SQL's `WITH` would not take, a
    /// table over the size bounds of [`crate::flight::limits`] or an invalid descriptor;
    /// I/O, metadata and lake errors.
    pub async fn create_table(
        &self,
        descriptor: TableDescriptor,
        if_not_exists: bool,
    ) -> Result<TableDescriptor> {
        let _ddl = self.ddl.lock().await;
        let validated = self.validate_new_table(descriptor)?;
        if let Some(existing) = self.tables_read().get(&validated.path) {
            return if if_not_exists {
                Ok(existing.descriptor().as_ref().clone())
            } else {
                Err(NodeError::TableExists(validated.path.to_string()))
            };
        }
        // A partitioned table opens its buckets with each partition, a cluster's node
        // those the assignment gives it.
        let buckets = if validated.is_partitioned() || self.membership.is_some() {
            0
        } else {
            validated.bucket_num as usize
        };
        self.open_buckets
            .reserve(buckets, &format!("table {}", validated.path))?;
        let created = self.create_new_table(&validated).await;
        if created.is_err() {
            self.open_buckets.release(buckets);
        }
        created
    }

    /// Creates a table that does not exist yet, its buckets reserved: its metadata, its
    /// tablets and its lake table, each step undone when a later one fails.
    async fn create_new_table(&self, validated: &TableDescriptor) -> Result<TableDescriptor> {
        let created = Arc::new(self.metadata.create_table(validated)?);
        let mut partitions = BTreeMap::new();
        if !created.is_partitioned() && self.membership.is_none() {
            match self.storage.create_partition(&created, None) {
                Ok(buckets) => {
                    partitions.insert(None, buckets);
                }
                Err(error) => {
                    self.undo_create(&created, partitions);
                    return Err(error);
                }
            }
        }
        if created.lake_enabled {
            let lake_created = match self.lake().await {
                Ok(lake) => lake.create_table(&created).await.map_err(NodeError::from),
                Err(error) => Err(error),
            };
            if let Err(error) = lake_created {
                self.undo_create(&created, partitions);
                return Err(error);
            }
        }
        info!(table = %created.path, table_id = created.table_id, "created table");
        let mut partitions: BTreeMap<_, _> = (partitions.into_iter())
            .map(|(partition, buckets)| (partition, Slot::led(buckets)))
            .collect();
        if !created.is_partitioned() && self.membership.is_some() {
            partitions.insert(None, Slot::moving(&created, None));
        }
        self.tables_write().insert(
            created.path.clone(),
            Arc::new(TableState::new(Arc::clone(&created), partitions)),
        );
        Ok(created.as_ref().clone())
    }

    /// Re-validates what a client sent (the constructor derives and checks everything)
    /// and applies the node's bounds.
    fn validate_new_table(&self, descriptor: TableDescriptor) -> Result<TableDescriptor> {
        let current = descriptor.schema().as_ref().clone();
        let validated = TableDescriptor::new(
            descriptor.path.clone(),
            current,
            descriptor.primary_key.clone(),
            descriptor.partition_keys.clone(),
            descriptor.options().checked()?,
        )?;
        check_table_size(&validated)?;
        let max = self.storage.config.max_bucket_num;
        if validated.bucket_num == 0 || validated.bucket_num > max {
            return Err(NodeError::InvalidArgument(format!(
                "table {}: bucket.num = {} is out of range: a table has 1 to {max} buckets",
                validated.path, validated.bucket_num
            )));
        }
        Ok(validated)
    }

    /// Takes back a create that failed after its metadata was committed.
    fn undo_create(
        &self,
        created: &TableDescriptor,
        partitions: BTreeMap<Option<String>, Vec<Arc<Bucket>>>,
    ) {
        let buckets = partitions.into_values().flatten().collect();
        self.storage.remove_buckets(created, None, buckets);
        if let Err(error) = self.metadata.delete_table(created.table_id) {
            tracing::warn!(table = %created.path, %error, "could not roll back a failed create");
        }
    }

    /// Drops a table: its log, its KV store and its lake table. With `table_id`, only
    /// while the table of that name is still that table.
    pub async fn drop_table(
        &self,
        path: &TablePath,
        if_exists: bool,
        table_id: Option<u64>,
    ) -> Result<()> {
        let _ddl = self.ddl.lock().await;
        let dropped = self.table(path).map(|t| t.descriptor());
        self.drop_table_storage(path, if_exists, table_id)?;
        if let Ok(table) = dropped
            && table.lake_enabled
        {
            // Under the tiering lock: no round writes the lake table while it goes.
            let mut lake_indexes = self.tiering.lock().await;
            lake_indexes.remove(&table.table_id);
            self.lake().await?.drop_table(path).await?;
        }
        Ok(())
    }

    fn drop_table_storage(
        &self,
        path: &TablePath,
        if_exists: bool,
        table_id: Option<u64>,
    ) -> Result<()> {
        let mut tables = self.tables.write().unwrap_or_else(|p| p.into_inner());
        let Some(state) = tables.get(path).cloned() else {
            return if if_exists {
                Ok(())
            } else {
                Err(NodeError::TableNotFound(path.to_string()))
            };
        };
        if let Some(expected) = table_id
            && state.descriptor().table_id != expected
        {
            return Err(NodeError::TableReplaced(format!(
                "table '{path}' is no longer table {expected}: it was dropped and created again"
            )));
        }
        self.metadata.drop_table(path)?;
        tables.remove(path);
        let descriptor = state.descriptor();
        let buckets: Vec<Arc<Bucket>> = std::mem::take(&mut *state.partitions())
            .into_values()
            .flatten()
            .filter_map(|slot| slot.tablets().cloned())
            .collect();
        self.open_buckets.release(buckets.len());
        self.storage.remove_buckets(&descriptor, None, buckets);
        mink_metrics::forget_table(&path.to_string());
        info!(table = %path, "dropped table");
        Ok(())
    }

    /// Adds a nullable column; older batches keep their schema_id. The lake table, if any,
    /// gets the column too.
    pub async fn add_column(&self, path: &TablePath, field: Field) -> Result<TableDescriptor> {
        let evolved = self.add_column_metadata(path, field.clone())?;
        if evolved.lake_enabled {
            self.lake().await?.add_column(path, &field).await?;
        }
        Ok(evolved)
    }

    fn add_column_metadata(&self, path: &TablePath, field: Field) -> Result<TableDescriptor> {
        let state = self.table(path)?;
        let mut descriptor = state.descriptor.write().unwrap_or_else(|p| p.into_inner());
        let evolved = descriptor.with_added_column(field)?;
        check_table_size(&evolved)?;
        self.metadata.update_table(&evolved)?;
        *descriptor = Arc::new(evolved.clone());
        info!(table = %path, schema_id = evolved.current().schema_id, "added column");
        Ok(evolved)
    }
}
