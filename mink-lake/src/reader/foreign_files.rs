//! The bucket of a data file another engine wrote.
//!
//! mink writes a bucket's files into the bucket's directory ([`bucket_dir`]) and finds
//! them there. Another engine appending to a log table's lake (pyiceberg, Spark, through
//! the REST catalog) writes where its own location provider puts them, e.g.
//! `data/id_bucket=0/...`, never in mink's directories; but it partitions them by the
//! table's spec, and mink's partitioning is the lake's (`crate::layout`): the identity
//! fields are the mink partition's keys and the last field is the bucket (Iceberg's
//! `bucket[N](key)` is mink's bucketing, or `identity(__bucket)`). So a file's partition
//! values name its mink bucket, which is how such a file joins the bucket's reads.
//!
//! Such rows carry no offset of mink's log (their `__offset` is whatever the engine
//! wrote): they were never in it, so they are read with the bucket's lake rows, below
//! every seam, and never again from the log.
//!
//! A partition key whose values have no exact text in mink's partition names here
//! (floating point, decimal, timestamp, binary keys) leaves the file in no bucket: its
//! rows are not read (`docs/iceberg-rest.md`).
//!
//! [`bucket_dir`]: crate::layout::bucket_dir

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{
    ArrayRef, BooleanArray, Date32Array, Int32Array, Int64Array, StringArray, new_null_array,
};
use arrow::datatypes::DataType;
use iceberg::spec::{Literal, PrimitiveLiteral, PrimitiveType, Struct, TableMetadata, Type};
use mink_core::partition::partition_names;
use mink_core::protocol::BucketId;

/// Some buckets by their partition: the buckets a file outside their directories belongs to.
#[derive(Debug)]
pub(super) struct BucketPartitions<'a> {
    /// The table's metadata (its default partition spec).
    metadata: &'a TableMetadata,
    /// (partition name, bucket) -> the indexes of the buckets it is (one, unless a bucket
    /// is listed twice).
    buckets: HashMap<(Option<String>, u32), Vec<usize>>,
}

impl<'a> BucketPartitions<'a> {
    pub(super) fn new(metadata: &'a TableMetadata, buckets: &[BucketId]) -> Self {
        let mut by_partition: HashMap<(Option<String>, u32), Vec<usize>> = HashMap::new();
        for (index, bucket) in buckets.iter().enumerate() {
            by_partition
                .entry((bucket.partition.clone(), bucket.bucket))
                .or_default()
                .push(index);
        }
        Self {
            metadata,
            buckets: by_partition,
        }
    }

    /// The indexes of the buckets a file of `partition` belongs to.
    pub(super) fn owners(&self, partition: Option<&Struct>) -> Vec<usize> {
        partition
            .and_then(|partition| bucket_of_partition(self.metadata, partition))
            .and_then(|bucket| self.buckets.get(&bucket))
            .cloned()
            .unwrap_or_default()
    }
}

/// The mink bucket whose rows a data file of `partition` (in the table's default spec)
/// holds: its partition name (`None` for a table without partition keys) and number.
/// `None` when the values name no bucket (see the module docs).
pub fn bucket_of_partition(
    metadata: &TableMetadata,
    partition: &Struct,
) -> Option<(Option<String>, u32)> {
    let spec = metadata.default_partition_spec();
    let partition_type = metadata.default_partition_type();
    let values: Vec<Option<&Literal>> = partition.iter().collect();
    if values.len() != spec.fields().len() {
        return None;
    }
    let (bucket, keys) = values.split_last()?;
    let bucket = match bucket {
        Some(Literal::Primitive(PrimitiveLiteral::Int(bucket))) => u32::try_from(*bucket).ok()?,
        _ => return None,
    };
    if keys.is_empty() {
        return Some((None, bucket));
    }
    let names: Vec<String> = spec.fields().iter().map(|f| f.name.clone()).collect();
    let columns = keys
        .iter()
        .zip(partition_type.fields())
        .map(|(value, field)| key_value(&field.field_type, *value))
        .collect::<Option<Vec<ArrayRef>>>()?;
    let name = partition_names(&names[..keys.len()], &columns)
        .ok()?
        .pop()?;
    Some((Some(name), bucket))
}

/// One partition key's value as a one-row array mink's partition names are made of.
fn key_value(field_type: &Type, value: Option<&Literal>) -> Option<ArrayRef> {
    let Some(Literal::Primitive(value)) = value else {
        return value.is_none().then(|| new_null_array(&DataType::Utf8, 1));
    };
    let array: ArrayRef = match (field_type.as_primitive_type()?, value) {
        (PrimitiveType::Boolean, PrimitiveLiteral::Boolean(v)) => {
            Arc::new(BooleanArray::from(vec![*v]))
        }
        (PrimitiveType::Int, PrimitiveLiteral::Int(v)) => Arc::new(Int32Array::from(vec![*v])),
        (PrimitiveType::Long, PrimitiveLiteral::Long(v)) => Arc::new(Int64Array::from(vec![*v])),
        (PrimitiveType::Date, PrimitiveLiteral::Int(v)) => Arc::new(Date32Array::from(vec![*v])),
        (PrimitiveType::String, PrimitiveLiteral::String(v)) => {
            Arc::new(StringArray::from(vec![v.as_str()]))
        }
        _ => return None,
    };
    Some(array)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::fixture::lake_table;

    #[tokio::test]
    async fn a_files_partition_names_its_bucket() {
        let dir = tempfile::tempdir().unwrap();
        let (_lake, _descriptor, table) = lake_table(dir.path()).await;
        let metadata = table.metadata();
        let of = |values: Vec<Option<Literal>>| {
            bucket_of_partition(metadata, &Struct::from_iter(values))
        };
        assert_eq!(of(vec![Some(Literal::int(1))]), Some((None, 1)));
        assert_eq!(of(vec![Some(Literal::int(-1))]), None);
        assert_eq!(of(vec![None]), None);
        assert_eq!(of(vec![]), None);
        assert_eq!(of(vec![Some(Literal::long(1))]), None);
    }

    #[test]
    fn key_values_read_as_mink_names_them() {
        let name = |field_type: PrimitiveType, value: Option<Literal>| {
            let column = key_value(&Type::Primitive(field_type), value.as_ref())?;
            partition_names(&["k".to_string()], &[column]).ok()?.pop()
        };
        assert_eq!(
            name(PrimitiveType::Date, Some(Literal::date(19723))),
            Some("k=2024-01-01".into())
        );
        assert_eq!(
            name(PrimitiveType::String, Some(Literal::string("a/b"))),
            Some("k=a%2Fb".into())
        );
        assert_eq!(name(PrimitiveType::Long, None), Some("k=__null__".into()));
        assert_eq!(
            name(PrimitiveType::Long, Some(Literal::long(7))),
            Some("k=7".into())
        );
        assert_eq!(
            name(PrimitiveType::Double, Some(Literal::double(1.5))),
            None
        );
    }
}
