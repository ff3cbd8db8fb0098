//! Key and row encodings of primary-key tables' KV stores.
//!
//! **Keys** are memcomparable: the primary-key columns in the order *partition keys, bucket
//! key, rest of the primary key*, encoded with Arrow's row format, so byte order is key
//! order and the encoding of the first `k` key columns is a byte prefix of the whole key.
//! A `prefix_lookup` on partition keys plus the bucket key is therefore one range scan.
//!
//! **Values** are whole rows: a 4-byte little-endian `schema_id`, then the row in Arrow's
//! row format for that schema version. Rows written before a column was added decode under
//! their own version and are normalized to the current schema (the new column is null).
//!
//! ```text
//!   key   = row_format(partition keys ++ bucket key ++ other pk columns)
//!   value = schema_id (u32 LE) ++ row_format(all columns of that schema version)
//! ```
//!
//! **Key length.** The KV store keeps a key as it is encoded here, and cannot keep one
//! longer than 65 535 bytes (its format stores a key's length in 16 bits). A write is
//! refused when a key of it encodes to more than [`MAX_KEY_BYTES`]
//! ([`KeyCodec::check_lengths`]); the encoded length, not the columns' values, is what is
//! bounded: a string key of `n` bytes encodes to about `n * 33 / 32` bytes.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, RecordBatchOptions};
use arrow::compute::concat_batches;
use arrow::datatypes::{Schema, SchemaRef};
use arrow::row::{RowConverter, Rows, SortField};

use crate::schema::normalize_batch;
use crate::table::TableDescriptor;
use crate::{CoreError, Result};

/// An encoded key as an in-memory map holds it ([`KeyCodec`]'s bytes): inside the map's
/// entry up to [`INLINE_KEY_BYTES`] (any one-column numeric or date key, short strings),
/// so that a lookup reads one entry and never a key allocated elsewhere, and building a
/// map of millions of keys allocates nothing per key; longer keys are allocated.
pub type MapKey = smallvec::SmallVec<[u8; INLINE_KEY_BYTES]>;

/// The longest key a [`MapKey`] holds inline (a 64-bit integer key encodes to 9 bytes).
pub const INLINE_KEY_BYTES: usize = 24;

/// The longest encoded key a primary-key table takes: 63 KiB. The KV store asserts keys
/// of at most 65 535 bytes; mink adds nothing to the encoded key today (one keyspace per
/// bucket), and the bound keeps a KiB below the store's limit for a prefix a later layout
/// may add. Writes of a longer key are refused ([`KeyCodec::check_lengths`]).
pub const MAX_KEY_BYTES: usize = 63 << 10;

/// Encodes primary keys (and key prefixes) of one table.
#[derive(Debug)]
pub struct KeyCodec {
    columns: Vec<String>,
    /// The key columns' fields, in encoding order.
    key: SchemaRef,
    converter: RowConverter,
}

impl KeyCodec {
    /// The codec of a primary-key table.
    pub fn new(table: &TableDescriptor) -> Result<Self> {
        let columns = key_columns(table);
        if columns.is_empty() {
            return Err(CoreError::InvalidRequest(format!(
                "table {} has no primary key",
                table.path
            )));
        }
        KeyCodec::for_columns(table.schema(), columns)
    }

    /// The codec of the key `columns` (in encoding order) of rows in `schema`: the codec
    /// a table's [`KeyCodec::new`] makes, rebuilt from what a read's rows carry.
    ///
    /// # Errors
    /// No column, or one `schema` lacks.
    pub fn for_columns(schema: &Schema, columns: Vec<String>) -> Result<Self> {
        if columns.is_empty() {
            return Err(CoreError::InvalidRequest("a key of no column".into()));
        }
        let fields = columns
            .iter()
            .map(|c| Ok(schema.field_with_name(c)?.clone()))
            .collect::<Result<Vec<_>>>()?;
        let sort_fields = fields
            .iter()
            .map(|field| SortField::new(field.data_type().clone()))
            .collect();
        let converter = RowConverter::new(sort_fields)?;
        Ok(Self {
            columns,
            key: Arc::new(Schema::new(fields)),
            converter,
        })
    }

    /// The key columns' fields, in encoding order: what [`Self::for_columns`] needs to
    /// rebuild the codec where the rows lack the key.
    pub fn key_schema(&self) -> &SchemaRef {
        &self.key
    }

    /// The key columns, in encoding order.
    pub fn columns(&self) -> &[String] {
        &self.columns
    }

    /// Encodes the key of every row of `batch`, whose key columns are found by name.
    ///
    /// # Errors
    /// [`CoreError::InvalidRequest`] when a key column is missing or holds a null.
    pub fn encode(&self, batch: &RecordBatch) -> Result<Rows> {
        let columns = key_arrays(batch, &self.columns)?;
        Ok(self.converter.convert_columns(&columns)?)
    }

    /// Checks that every key of `keys` (this codec's) fits [`MAX_KEY_BYTES`].
    ///
    /// # Errors
    /// [`CoreError::InvalidRequest`] naming the first row whose key is longer, its
    /// length and the limit.
    pub fn check_lengths(&self, keys: &Rows) -> Result<()> {
        let Some((row, key)) = keys
            .iter()
            .enumerate()
            .find(|(_, key)| key.as_ref().len() > MAX_KEY_BYTES)
        else {
            return Ok(());
        };
        Err(CoreError::InvalidRequest(format!(
            "row {row}: its primary key ({}) encodes to {} bytes, more than the {MAX_KEY_BYTES} \
             a key may have (MAX_KEY_BYTES)",
            self.columns.join(", "),
            key.as_ref().len()
        )))
    }
}

/// Encodes key prefixes: the first `k` key columns.
#[derive(Debug)]
pub struct PrefixCodec {
    converter: RowConverter,
    columns: Vec<String>,
}

impl PrefixCodec {
    /// The codec for prefixes made of `columns`, which must be the first key columns and
    /// cover at least the partition keys and the whole bucket key (so a prefix names one
    /// bucket).
    pub fn new(table: &TableDescriptor, columns: &[String]) -> Result<Self> {
        let key = key_columns(table);
        let minimum = table.partition_keys.len() + table.bucket_key.len();
        if columns.len() < minimum || columns.len() > key.len() || key[..columns.len()] != *columns
        {
            return Err(CoreError::InvalidRequest(format!(
                "({}) is not a key prefix of table {}: a prefix is the first columns of ({}), at least ({})",
                columns.join(", "),
                table.path,
                key.join(", "),
                key[..minimum.min(key.len())].join(", ")
            )));
        }
        Ok(Self {
            converter: converter_for(table, columns)?,
            columns: columns.to_vec(),
        })
    }

    /// Encodes the prefix of every row of `batch`.
    pub fn encode(&self, batch: &RecordBatch) -> Result<Rows> {
        let columns = key_arrays(batch, &self.columns)?;
        Ok(self.converter.convert_columns(&columns)?)
    }
}

/// The key columns of a table in encoding order: partition keys, bucket key, the rest of
/// the primary key.
pub fn key_columns(table: &TableDescriptor) -> Vec<String> {
    let mut columns: Vec<String> = table.partition_keys.clone();
    for column in table.bucket_key.iter().chain(&table.primary_key) {
        if !columns.contains(column) {
            columns.push(column.clone());
        }
    }
    if table.primary_key.is_empty() {
        columns.clear();
    }
    columns
}

fn converter_for(table: &TableDescriptor, columns: &[String]) -> Result<RowConverter> {
    Ok(KeyCodec::for_columns(table.schema(), columns.to_vec())?.converter)
}

fn key_arrays(batch: &RecordBatch, columns: &[String]) -> Result<Vec<ArrayRef>> {
    columns
        .iter()
        .map(|name| {
            let column = batch.column_by_name(name).ok_or_else(|| {
                CoreError::InvalidRequest(format!("key column '{name}' is missing"))
            })?;
            if column.null_count() > 0 {
                return Err(CoreError::InvalidRequest(format!(
                    "key column '{name}' holds {} nulls; primary-key values cannot be null",
                    column.null_count()
                )));
            }
            Ok(Arc::clone(column))
        })
        .collect()
}

/// Rows encoded as KV values by [`RowCodec::encode`], back to back in one buffer.
#[derive(Debug)]
pub struct Values {
    data: Vec<u8>,
    /// Where each value ends in `data`.
    ends: Vec<usize>,
}

impl Values {
    /// Value `i`.
    pub fn get(&self, i: usize) -> &[u8] {
        let start = i.checked_sub(1).map_or(0, |before| self.ends[before]);
        &self.data[start..self.ends[i]]
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The bytes of all values.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// The values in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &[u8]> {
        (0..self.len()).map(|i| self.get(i))
    }
}

/// Encodes whole rows as KV values and decodes them back, across schema versions.
#[derive(Debug)]
pub struct RowCodec {
    current: SchemaRef,
    current_id: u32,
    versions: HashMap<u32, (SchemaRef, RowConverter)>,
}

impl RowCodec {
    /// A codec for every schema version of `table`.
    pub fn new(table: &TableDescriptor) -> Result<Self> {
        let mut versions = HashMap::new();
        for version in &table.schemas {
            let fields = version
                .schema
                .fields()
                .iter()
                .map(|f| SortField::new(f.data_type().clone()))
                .collect();
            versions.insert(
                version.schema_id,
                (Arc::clone(&version.schema), RowConverter::new(fields)?),
            );
        }
        Ok(Self {
            current: Arc::clone(table.schema()),
            current_id: table.current().schema_id,
            versions,
        })
    }

    /// The schema rows decode to.
    pub fn schema(&self) -> &SchemaRef {
        &self.current
    }

    /// Encodes every row of `batch`, written under `schema_id`; value `i` is row `i`.
    pub fn encode(&self, batch: &RecordBatch, schema_id: u32) -> Result<Values> {
        let (_, converter) = self.version(schema_id)?;
        let rows = converter.convert_columns(batch.columns())?;
        let prefix = schema_id.to_le_bytes();
        let mut values = Values {
            data: Vec::with_capacity(rows.size() + rows.num_rows() * prefix.len()),
            ends: Vec::with_capacity(rows.num_rows()),
        };
        for row in &rows {
            values.data.extend_from_slice(&prefix);
            values.data.extend_from_slice(row.as_ref());
            values.ends.push(values.data.len());
        }
        Ok(values)
    }

    /// Decodes values into one batch of the current schema, in order.
    pub fn decode<V: AsRef<[u8]>>(&self, values: &[V]) -> Result<RecordBatch> {
        let mut parts = Vec::new();
        let mut start = 0;
        while start < values.len() {
            let schema_id = value_schema_id(values[start].as_ref())?;
            let end = values[start..]
                .iter()
                .position(|v| value_schema_id(v.as_ref()).ok() != Some(schema_id))
                .map_or(values.len(), |n| start + n);
            parts.push(self.decode_run(&values[start..end], schema_id)?);
            start = end;
        }
        if parts.len() == 1 {
            return Ok(parts.pop().expect("one part"));
        }
        if parts.is_empty() {
            return Ok(RecordBatch::new_empty(Arc::clone(&self.current)));
        }
        Ok(concat_batches(&self.current, &parts)?)
    }

    fn decode_run<V: AsRef<[u8]>>(&self, values: &[V], schema_id: u32) -> Result<RecordBatch> {
        let (schema, converter) = self.version(schema_id)?;
        let parser = converter.parser();
        let columns =
            converter.convert_rows(values.iter().map(|v| parser.parse(&v.as_ref()[4..])))?;
        let options = RecordBatchOptions::new().with_row_count(Some(values.len()));
        let batch = RecordBatch::try_new_with_options(Arc::clone(schema), columns, &options)?;
        if schema_id == self.current_id {
            Ok(batch)
        } else {
            normalize_batch(&batch, &self.current)
        }
    }

    fn version(&self, schema_id: u32) -> Result<&(SchemaRef, RowConverter)> {
        self.versions
            .get(&schema_id)
            .ok_or_else(|| CoreError::InvalidRequest(format!("unknown schema version {schema_id}")))
    }
}

fn value_schema_id(value: &[u8]) -> Result<u32> {
    value
        .get(..4)
        .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
        .ok_or_else(|| CoreError::InvalidRequest("a stored row shorter than its header".into()))
}

#[cfg(test)]
mod tests {
    use arrow::array::{Array, AsArray, Int32Array, Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Int64Type, Schema};

    use super::*;
    use crate::options::TableOptions;
    use crate::table::TablePath;

    fn table() -> TableDescriptor {
        let schema = Schema::new(vec![
            Field::new("v", DataType::Utf8, true),
            Field::new("id", DataType::Int64, false),
            Field::new("dt", DataType::Utf8, false),
            Field::new("seq", DataType::Int32, false),
        ]);
        TableDescriptor::new(
            TablePath::new("db", "t"),
            schema,
            vec!["seq".into(), "id".into(), "dt".into()],
            vec!["dt".into()],
            TableOptions {
                bucket_key: Some(vec!["id".into()]),
                ..TableOptions::default()
            },
        )
        .unwrap()
    }

    fn rows(table: &TableDescriptor, rows: &[(&str, i64, &str, i32)]) -> RecordBatch {
        let columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0))),
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.2))),
            Arc::new(Int32Array::from_iter_values(rows.iter().map(|r| r.3))),
        ];
        RecordBatch::try_new(Arc::clone(table.schema()), columns).unwrap()
    }

    #[test]
    fn key_order_is_partition_bucket_rest() {
        assert_eq!(key_columns(&table()), ["dt", "id", "seq"]);
    }

    #[test]
    fn keys_sort_like_their_columns_and_prefixes_are_byte_prefixes() {
        let table = table();
        let codec = KeyCodec::new(&table).unwrap();
        let batch = rows(
            &table,
            &[
                ("a", 2, "d1", 1),
                ("b", -5, "d1", 9),
                ("c", 2, "d0", 3),
                ("d", 2, "d1", 0),
            ],
        );
        let keys = codec.encode(&batch).unwrap();
        let mut order: Vec<usize> = (0..4).collect();
        order.sort_by(|a, b| keys.row(*a).cmp(&keys.row(*b)));
        assert_eq!(order, vec![2, 1, 3, 0], "dt, then id, then seq");

        let prefix = PrefixCodec::new(&table, &["dt".into(), "id".into()]).unwrap();
        let prefixes = prefix.encode(&batch).unwrap();
        for i in 0..4 {
            assert!(keys.row(i).as_ref().starts_with(prefixes.row(i).as_ref()));
        }
    }

    #[test]
    fn bad_prefixes_and_null_keys_are_named() {
        let table = table();
        let err = PrefixCodec::new(&table, &["dt".into()]).unwrap_err();
        assert!(err.to_string().contains("at least (dt, id)"), "{err}");
        assert!(PrefixCodec::new(&table, &["id".into(), "dt".into()]).is_err());
        let codec = KeyCodec::new(&table).unwrap();
        let batch = RecordBatch::try_from_iter(vec![(
            "dt",
            Arc::new(StringArray::from(vec![Some("x")])) as ArrayRef,
        )])
        .unwrap();
        let err = codec.encode(&batch).unwrap_err();
        assert!(err.to_string().contains("'id' is missing"), "{err}");
    }

    #[test]
    fn keys_are_bounded_by_their_encoded_length() {
        let table = table();
        let codec = KeyCodec::new(&table).unwrap();
        let key_of = |dt_len: usize| {
            let dt = "x".repeat(dt_len);
            codec.encode(&rows(&table, &[("v", 1, &dt, 1)])).unwrap()
        };
        // The longest partition value whose whole key fits, found by bisection.
        let (mut fits, mut too_long) = (0, MAX_KEY_BYTES);
        while too_long - fits > 1 {
            let middle = (fits + too_long) / 2;
            match key_of(middle).row(0).as_ref().len() <= MAX_KEY_BYTES {
                true => fits = middle,
                false => too_long = middle,
            }
        }
        codec.check_lengths(&key_of(fits)).unwrap();
        let batch = rows(
            &table,
            &[("a", 1, "short", 1), ("b", 2, &"x".repeat(too_long), 2)],
        );
        let error = codec.check_lengths(&codec.encode(&batch).unwrap());
        let error = error.unwrap_err().to_string();
        assert!(error.contains("row 1"), "{error}");
        assert!(
            error.contains(&format!("more than the {MAX_KEY_BYTES}")),
            "{error}"
        );
    }

    #[test]
    fn rows_round_trip_across_schema_versions() {
        let v0 = table();
        let old = RowCodec::new(&v0)
            .unwrap()
            .encode(&rows(&v0, &[("a", 1, "d", 1), ("b", 2, "d", 2)]), 0)
            .unwrap();
        let v1 = v0
            .with_added_column(Field::new("w", DataType::Int64, true))
            .unwrap();
        let codec = RowCodec::new(&v1).unwrap();
        let mut new_batch = rows(&v0, &[("c", 3, "d", 3)]);
        let w: ArrayRef = Arc::new(Int64Array::from(vec![Some(7)]));
        let mut columns = new_batch.columns().to_vec();
        columns.push(w);
        new_batch = RecordBatch::try_new(Arc::clone(v1.schema()), columns).unwrap();
        let new = codec.encode(&new_batch, 1).unwrap();
        let values = [old.get(0), new.get(0), old.get(1)];
        let decoded = codec.decode(&values).unwrap();
        assert_eq!(decoded.schema(), *v1.schema());
        let ids = decoded
            .column(1)
            .as_primitive::<Int64Type>()
            .values()
            .to_vec();
        assert_eq!(ids, vec![1, 3, 2]);
        let w = decoded.column(4).as_primitive::<Int64Type>();
        assert_eq!((w.is_null(0), w.value(1), w.is_null(2)), (true, 7, true));
        assert_eq!(codec.decode::<Vec<u8>>(&[]).unwrap().num_rows(), 0);
    }
}
