//! Routing rows to buckets: which partition and bucket each row of a batch belongs to.
//!
//! The client uses [`split_by_bucket`] to send each bucket its rows; the node uses
//! [`row_addresses`] to check that a batch sent to a bucket really belongs there.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, UInt32Array};
use arrow::compute::take_record_batch;

use crate::bucket::bucket_of_rows;
use crate::partition::partition_names;
use crate::protocol::BucketId;
use crate::table::TableDescriptor;
use crate::{CoreError, Result};

/// Per row: its bucket (when the table has a bucket key) and its partition (when the
/// table is partitioned).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowAddresses {
    /// The bucket of every row; `None` for round-robin tables.
    pub buckets: Option<Vec<u32>>,
    /// The partition name of every row; `None` for unpartitioned tables.
    pub partitions: Option<Vec<String>>,
}

/// Computes where each row of `batch` belongs. The batch needs the bucket-key and
/// partition-key columns (found by name), not necessarily every column: a batch of keys to
/// delete or look up is routed the same way as whole rows.
pub fn row_addresses(table: &TableDescriptor, batch: &RecordBatch) -> Result<RowAddresses> {
    let columns_of = |names: &[String]| -> Result<Vec<ArrayRef>> {
        names
            .iter()
            .map(|name| {
                batch.column_by_name(name).map(Arc::clone).ok_or_else(|| {
                    CoreError::InvalidRequest(format!(
                        "the batch has no column '{name}', which routes rows of table {}",
                        table.path
                    ))
                })
            })
            .collect()
    };
    let buckets = if table.bucket_key.is_empty() {
        None
    } else {
        Some(bucket_of_rows(
            &columns_of(&table.bucket_key)?,
            table.bucket_num,
        )?)
    };
    let partitions = if table.is_partitioned() {
        Some(partition_names(
            &table.partition_keys,
            &columns_of(&table.partition_keys)?,
        )?)
    } else {
        None
    };
    Ok(RowAddresses {
        buckets,
        partitions,
    })
}

/// Splits `batch` into one batch per bucket (and partition). Rows of a round-robin table
/// all go to `round_robin_bucket` (per partition), keeping the batch whole.
pub fn split_by_bucket(
    table: &TableDescriptor,
    batch: &RecordBatch,
    round_robin_bucket: u32,
) -> Result<Vec<(BucketId, RecordBatch)>> {
    Ok(split_rows_by_bucket(table, batch, round_robin_bucket)?
        .into_iter()
        .map(|part| (part.bucket, part.batch))
        .collect())
}

/// The rows of a batch that go to one bucket.
#[derive(Debug, Clone)]
pub struct BucketPart {
    /// The bucket.
    pub bucket: BucketId,
    /// Its rows.
    pub batch: RecordBatch,
    /// Where each of its rows was in the input batch.
    pub rows: Vec<u32>,
}

/// Like [`split_by_bucket`], also telling where each row came from (to map lookup results
/// back to the keys asked for).
pub fn split_rows_by_bucket(
    table: &TableDescriptor,
    batch: &RecordBatch,
    round_robin_bucket: u32,
) -> Result<Vec<BucketPart>> {
    let addresses = row_addresses(table, batch)?;
    let mut rows: BTreeMap<(Option<&str>, u32), Vec<u32>> = BTreeMap::new();
    for row in 0..batch.num_rows() {
        let partition = addresses.partitions.as_ref().map(|p| p[row].as_str());
        let bucket = addresses
            .buckets
            .as_ref()
            .map_or(round_robin_bucket % table.bucket_num, |b| b[row]);
        rows.entry((partition, bucket))
            .or_default()
            .push(row as u32);
    }
    let table_name = table.path.to_string();
    rows.into_iter()
        .map(|((partition, bucket), indices)| {
            let id = BucketId {
                table: table_name.clone(),
                partition: partition.map(str::to_string),
                bucket,
            };
            let part = if indices.len() == batch.num_rows() {
                batch.clone()
            } else {
                take_record_batch(batch, &UInt32Array::from(indices.clone()))?
            };
            Ok(BucketPart {
                bucket: id,
                batch: part,
                rows: indices,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use arrow::array::{AsArray, Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Int64Type, Schema};

    use super::*;
    use crate::options::TableOptions;
    use crate::table::TablePath;

    fn table(pk: &[&str], partitions: &[&str], buckets: u32) -> TableDescriptor {
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("dt", DataType::Utf8, false),
        ]);
        let options = TableOptions {
            bucket_num: buckets,
            ..TableOptions::default()
        };
        TableDescriptor::new(
            TablePath::new("db", "t"),
            schema,
            pk.iter().map(|s| s.to_string()).collect(),
            partitions.iter().map(|s| s.to_string()).collect(),
            options,
        )
        .unwrap()
    }

    fn batch(table: &TableDescriptor, n: i64) -> RecordBatch {
        let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(0..n));
        let dts: ArrayRef = Arc::new(StringArray::from_iter_values(
            (0..n).map(|i| format!("d{}", i % 2)),
        ));
        RecordBatch::try_new(Arc::clone(table.schema()), vec![ids, dts]).unwrap()
    }

    #[test]
    fn keyed_rows_land_in_their_bucket_and_partition() {
        let table = table(&["id", "dt"], &["dt"], 4);
        let input = batch(&table, 100);
        let parts = split_by_bucket(&table, &input, 0).unwrap();
        let total: usize = parts.iter().map(|(_, b)| b.num_rows()).sum();
        assert_eq!(total, 100);
        for (id, part) in &parts {
            let addresses = row_addresses(&table, part).unwrap();
            assert!(addresses.buckets.unwrap().iter().all(|b| *b == id.bucket));
            let partition = id.partition.as_deref().unwrap();
            assert!(addresses.partitions.unwrap().iter().all(|p| p == partition));
        }
        assert_eq!(
            parts
                .iter()
                .filter(|(id, _)| id.partition.as_deref() == Some("dt=d0"))
                .count(),
            4
        );
    }

    #[test]
    fn round_robin_keeps_the_batch_whole() {
        let table = table(&[], &[], 3);
        let input = batch(&table, 10);
        let parts = split_by_bucket(&table, &input, 7).unwrap();
        assert_eq!(parts.len(), 1);
        assert_eq!(parts[0].0.bucket, 1);
        assert_eq!(parts[0].1.column(0).as_primitive::<Int64Type>().len(), 10);
    }
}
