//! Key reads of a primary-key table: the KV tablet of a bucket, and lookups of keys or
//! key prefixes in it.

use std::sync::Arc;

use arrow::array::RecordBatch;
use mink_core::protocol::BucketId;
use mink_core::table::{TableDescriptor, TablePath};
use mink_kv::{Found, KvTablet, encode_keys, lookup, prefix_lookup};

use super::Node;
use super::validate::{check_bucket_address, check_routing};
use crate::error::{NodeError, Result};

impl Node {
    /// The table and KV tablet of a primary-key table's bucket; `None` for a partition
    /// that has no rows yet.
    pub fn kv_bucket(&self, bucket: &BucketId) -> Result<(Arc<TableDescriptor>, Option<KvTablet>)> {
        let state = self.table(&TablePath::parse(&bucket.table)?)?;
        let table = state.descriptor();
        check_bucket_address(&table, bucket)?;
        if !table.has_primary_key() {
            return Err(NodeError::InvalidArgument(format!(
                "table {} is a log table: key reads need a primary key",
                table.path
            )));
        }
        let slot = state
            .partitions()
            .get(&bucket.partition)
            .and_then(|slots| slots.get(bucket.bucket as usize))
            .cloned();
        let kv = match slot {
            Some(slot) => slot.led_tablets()?.kv.clone(),
            None => None,
        };
        Ok((table, kv))
    }

    /// `lookup` (`prefix == false`) or `prefix_lookup` of a batch of keys or prefixes that
    /// all belong to `bucket`.
    pub async fn lookup(
        &self,
        bucket: &BucketId,
        keys: RecordBatch,
        prefix: bool,
    ) -> Result<Found> {
        let (table, kv) = self.kv_bucket(bucket)?;
        check_routing(&table, bucket, &keys)?;
        let Some(kv) = kv else {
            // A partition with no rows yet: nothing to find, the keys checked all the same.
            encode_keys(&table, &keys, prefix)?;
            return Ok(Found {
                rows: RecordBatch::new_empty(Arc::clone(table.schema())),
                key_indices: Vec::new(),
            });
        };
        let store = kv.clone();
        let found = store
            .read(move || match prefix {
                true => prefix_lookup(&table, &kv, &keys),
                false => lookup(&table, &kv, &keys),
            })
            .await?;
        Ok(found)
    }
}
