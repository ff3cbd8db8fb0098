//! Tables, each with all its schema versions, and the partitions created so far.
//!
//! A table's row holds its descriptor as its protobuf encoding
//! ([`TableDescriptorProto`]), with the `table_id` the row was given.

use mink_core::protocol::{TableDescriptorProto, decode};
use mink_core::table::{TableDescriptor, TablePath};
use prost::Message;
use rusqlite::{OptionalExtension, params};

use super::{Metadata, TableMetadata};
use crate::error::{NodeError, Result};

/// A partition of a partitioned table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionRecord {
    /// Unique within the node; names the partition's directory.
    pub partition_id: i64,
    /// The partition name (`col=value/...`).
    pub name: String,
}

impl TableMetadata for Metadata {
    fn load_tables(&self) -> Result<Vec<TableDescriptor>> {
        let connection = self.connection();
        let mut statement =
            connection.prepare("SELECT table_id, descriptor FROM tables ORDER BY table_id")?;
        let rows = statement.query_map([], |row| {
            Ok((row.get::<_, i64>(0)?, row.get::<_, Vec<u8>>(1)?))
        })?;
        rows.map(|row| {
            let (table_id, bytes) = row?;
            let mut table = TableDescriptor::try_from(decode::<TableDescriptorProto>(
                "stored table descriptor",
                &bytes,
            )?)?;
            table.table_id = table_id as u64;
            Ok(table)
        })
        .collect()
    }

    // One transaction: the descriptor carries the id, so the row is inserted, then filled.
    fn create_table(&self, table: &TableDescriptor) -> Result<TableDescriptor> {
        let mut connection = self.connection();
        let transaction = connection.transaction()?;
        let inserted = transaction.execute(
            "INSERT INTO tables (database, name, descriptor) VALUES (?1, ?2, x'')",
            params![table.path.database, table.path.name],
        );
        match inserted {
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::ConstraintViolation =>
            {
                return Err(NodeError::TableExists(table.path.to_string()));
            }
            other => other?,
        };
        let mut created = table.clone();
        created.table_id = transaction.last_insert_rowid() as u64;
        transaction.execute(
            "UPDATE tables SET descriptor = ?1 WHERE table_id = ?2",
            params![encode(&created), created.table_id as i64],
        )?;
        transaction.commit()?;
        Ok(created)
    }

    // Ids are never reused (`AUTOINCREMENT`).
    fn delete_table(&self, table_id: u64) -> Result<()> {
        self.connection()
            .execute("DELETE FROM tables WHERE table_id = ?1", [table_id as i64])?;
        Ok(())
    }

    fn update_table(&self, table: &TableDescriptor) -> Result<()> {
        let changed = self.connection().execute(
            "UPDATE tables SET descriptor = ?1 WHERE table_id = ?2",
            params![encode(table), table.table_id as i64],
        )?;
        if changed == 0 {
            return Err(NodeError::TableNotFound(table.path.to_string()));
        }
        Ok(())
    }

    fn drop_table(&self, path: &TablePath) -> Result<()> {
        let changed = self.connection().execute(
            "DELETE FROM tables WHERE database = ?1 AND name = ?2",
            params![path.database, path.name],
        )?;
        if changed == 0 {
            return Err(NodeError::TableNotFound(path.to_string()));
        }
        Ok(())
    }

    fn partitions(&self, table_id: u64) -> Result<Vec<PartitionRecord>> {
        let connection = self.connection();
        let mut statement = connection.prepare(
            "SELECT partition_id, name FROM partitions WHERE table_id = ?1 ORDER BY name",
        )?;
        let rows = statement.query_map([table_id as i64], |row| {
            Ok(PartitionRecord {
                partition_id: row.get(0)?,
                name: row.get(1)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    fn ensure_partition(&self, table_id: u64, name: &str) -> Result<PartitionRecord> {
        let mut connection = self.connection();
        let transaction = connection.transaction()?;
        transaction.execute(
            "INSERT OR IGNORE INTO partitions (table_id, name) VALUES (?1, ?2)",
            params![table_id as i64, name],
        )?;
        let partition_id = transaction
            .query_row(
                "SELECT partition_id FROM partitions WHERE table_id = ?1 AND name = ?2",
                params![table_id as i64, name],
                |row| row.get(0),
            )
            .optional()?
            .ok_or_else(|| NodeError::TableNotFound(format!("table id {table_id}")))?;
        transaction.commit()?;
        Ok(PartitionRecord {
            partition_id,
            name: name.to_string(),
        })
    }

    fn delete_partition(&self, partition_id: i64) -> Result<()> {
        self.connection().execute(
            "DELETE FROM partitions WHERE partition_id = ?1",
            [partition_id],
        )?;
        Ok(())
    }
}

fn encode(table: &TableDescriptor) -> Vec<u8> {
    TableDescriptorProto::from(table).encode_to_vec()
}
