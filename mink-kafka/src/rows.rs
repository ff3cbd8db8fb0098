//! Produced Kafka records as rows of their table (the Produce direction, the inverse of
//! [`crate::records`]).
//!
//! - A table with a `value` column takes each record's fields as columns: `key`, `value`
//!   (their bytes; text for other types, parsed), `headers`, `timestamp` (the record's
//!   time); every other column is null.
//! - A table without one takes each value as a JSON object of its columns; a field it
//!   does not have, a missing NOT NULL column or a value of the wrong type refuses the
//!   record.
//! - A primary-key table upserts each record; a tombstone (no value) deletes the key,
//!   read from the record's key (the key's own bytes for one VARCHAR/BYTEA key column,
//!   else a JSON object of the key columns). A log table refuses tombstones.
//!
//! Every record of a produce is converted before any is written, so one that does not
//! fit refuses the whole batch with nothing written (`INVALID_RECORD`).

use std::sync::Arc;

use arrow::array::{
    ArrayRef, BinaryBuilder, MapBuilder, RecordBatch, StringBuilder, TimestampMillisecondArray,
    new_null_array,
};
use arrow::compute::{CastOptions, cast_with_options};
use arrow::datatypes::{DataType, Schema, SchemaRef};
use arrow::json::ReaderBuilder;
use bytes::Bytes;
use kafka_protocol::records::Record;
use mink_core::table::TableDescriptor;

use crate::error::{KafkaError, Result};
use crate::records::{HEADERS, KEY, TIMESTAMP, VALUE, is_bytes_like};

/// Rows to write, in the order the records came.
#[derive(Debug)]
pub(crate) enum Rows {
    /// Rows appended to a log table or upserted into a primary-key table.
    Write(RecordBatch),
    /// Keys deleted from a primary-key table.
    Delete(RecordBatch),
}

/// The rows of `records` for `table`: consecutive upserts in one batch, consecutive
/// deletes in another.
pub(crate) fn rows_of(table: &TableDescriptor, records: &[Record]) -> Result<Vec<Rows>> {
    let mut runs = Vec::new();
    let mut start = 0;
    while start < records.len() {
        let tombstones = records[start].value.is_none();
        let end = records[start..]
            .iter()
            .position(|r| r.value.is_none() != tombstones)
            .map_or(records.len(), |n| start + n);
        let run = &records[start..end];
        runs.push(if tombstones {
            if !table.has_primary_key() {
                return Err(invalid(format!(
                    "table {} is a log table: a record needs a value (tombstones delete keys of primary-key tables)",
                    table.path
                )));
            }
            Rows::Delete(keys_of(table, run)?)
        } else {
            Rows::Write(rows_of_values(table, run)?)
        });
        start = end;
    }
    Ok(runs)
}

fn invalid(message: String) -> KafkaError {
    KafkaError::InvalidRecord(message)
}

fn rows_of_values(table: &TableDescriptor, records: &[Record]) -> Result<RecordBatch> {
    let schema = Arc::clone(table.schema());
    if schema.column_with_name(VALUE).is_none() {
        return json_rows(&schema, records.iter().map(|r| r.value.as_ref()));
    }
    let columns = schema
        .fields()
        .iter()
        .map(|field| {
            let column: Option<ArrayRef> = match field.name().as_str() {
                KEY => Some(bytes_column(records.iter().map(|r| r.key.as_ref()))),
                VALUE => Some(bytes_column(records.iter().map(|r| r.value.as_ref()))),
                HEADERS => Some(headers_column(records)?),
                TIMESTAMP => Some(Arc::new(TimestampMillisecondArray::from_iter_values(
                    records.iter().map(|r| r.timestamp),
                ))),
                _ => None,
            };
            match column {
                Some(column) => convert(&column, field.data_type(), field.name()),
                None => Ok(new_null_array(field.data_type(), records.len())),
            }
        })
        .collect::<Result<Vec<_>>>()?;
    RecordBatch::try_new(schema, columns).map_err(|e| invalid(e.to_string()))
}

/// The keys of tombstones, as a batch of the primary-key columns.
fn keys_of(table: &TableDescriptor, records: &[Record]) -> Result<RecordBatch> {
    let schema = table.schema();
    let fields = table
        .primary_key
        .iter()
        .map(|name| Ok(schema.field_with_name(name)?.clone()))
        .collect::<Result<Vec<_>>>()?;
    let keys = Arc::new(Schema::new(fields));
    let missing = records.iter().position(|r| r.key.is_none());
    if let Some(index) = missing {
        return Err(invalid(format!(
            "tombstone {index} has no key: it names no row of {} to delete",
            table.path
        )));
    }
    match keys.fields().as_ref() {
        [field] if is_bytes_like(field.data_type()) => {
            let column = bytes_column(records.iter().map(|r| r.key.as_ref()));
            let column = convert(&column, field.data_type(), field.name())?;
            Ok(RecordBatch::try_new(keys, vec![column])?)
        }
        _ => json_rows(&keys, records.iter().map(|r| r.key.as_ref())),
    }
}

/// Rows from JSON objects, refusing fields the schema does not have.
fn json_rows<'a>(
    schema: &SchemaRef,
    objects: impl ExactSizeIterator<Item = Option<&'a Bytes>>,
) -> Result<RecordBatch> {
    let mut decoder = ReaderBuilder::new(Arc::clone(schema))
        .with_strict_mode(true)
        .with_batch_size(objects.len().max(1))
        .build_decoder()?;
    let mut rows = 0;
    for (index, object) in objects.enumerate() {
        let object = object.ok_or_else(|| invalid(format!("record {index} has no JSON object")))?;
        if !object.trim_ascii_start().starts_with(b"{") {
            return Err(invalid(format!("record {index} is not a JSON object")));
        }
        let read = decoder
            .decode(object)
            .map_err(|e| invalid(format!("record {index}: {e}")))?;
        if read != object.len() {
            return Err(invalid(format!(
                "record {index} holds more than one JSON value"
            )));
        }
        rows += 1;
    }
    let batch = decoder
        .flush()
        .map_err(|e| invalid(e.to_string()))?
        .unwrap_or_else(|| RecordBatch::new_empty(Arc::clone(schema)));
    if batch.num_rows() != rows {
        return Err(invalid(format!(
            "{rows} records gave {} rows (one JSON object per record)",
            batch.num_rows()
        )));
    }
    for (field, column) in schema.fields().iter().zip(batch.columns()) {
        if !field.is_nullable() && column.null_count() > 0 {
            return Err(invalid(format!("column '{}' is NOT NULL", field.name())));
        }
    }
    Ok(batch)
}

fn bytes_column<'a>(cells: impl Iterator<Item = Option<&'a Bytes>>) -> ArrayRef {
    let mut builder = BinaryBuilder::new();
    for cell in cells {
        builder.append_option(cell);
    }
    Arc::new(builder.finish())
}

fn headers_column(records: &[Record]) -> Result<ArrayRef> {
    let mut builder = MapBuilder::new(None, StringBuilder::new(), BinaryBuilder::new());
    for record in records {
        for (key, value) in &record.headers {
            builder.keys().append_value(key.as_str());
            builder.values().append_option(value.as_ref());
        }
        builder.append(true)?;
    }
    Ok(Arc::new(builder.finish()))
}

/// A column of record fields as the table's type: bytes as text (checked UTF-8) for
/// strings, parsed for other types.
fn convert(column: &ArrayRef, to: &DataType, name: &str) -> Result<ArrayRef> {
    if column.data_type() == to {
        return Ok(Arc::clone(column));
    }
    let strict = CastOptions {
        safe: false,
        ..CastOptions::default()
    };
    let cast = |column: &ArrayRef, to: &DataType| {
        cast_with_options(column, to, &strict)
            .map_err(|e| invalid(format!("column '{name}' ({to}): {e}")))
    };
    match (column.data_type(), to) {
        (DataType::Binary, to) if !matches!(to, DataType::LargeBinary | DataType::BinaryView) => {
            let text = cast(column, &DataType::Utf8)?;
            if to == &DataType::Utf8 {
                Ok(text)
            } else {
                cast(&text, to)
            }
        }
        _ => cast(column, to),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use arrow::array::{Array, AsArray};
    use arrow::datatypes::{Field, Int64Type};
    use indexmap::IndexMap;
    use kafka_protocol::records::{NO_PRODUCER_EPOCH, NO_PRODUCER_ID, TimestampType};
    use mink_core::options::TableOptions;
    use mink_core::table::TablePath;

    use super::*;

    /// A produced record of no producer, with a fixed time.
    pub(crate) fn record(key: Option<&str>, value: Option<&str>) -> Record {
        Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: NO_PRODUCER_ID,
            producer_epoch: NO_PRODUCER_EPOCH,
            timestamp_type: TimestampType::Creation,
            offset: 0,
            sequence: 0,
            timestamp: 1_700_000_000_123,
            key: key.map(|k| Bytes::copy_from_slice(k.as_bytes())),
            value: value.map(|v| Bytes::copy_from_slice(v.as_bytes())),
            headers: IndexMap::new(),
        }
    }

    /// `default.t` with `fields`, a log table when `primary_key` is empty.
    pub(crate) fn table(fields: Vec<Field>, primary_key: &[&str]) -> TableDescriptor {
        TableDescriptor::new(
            TablePath::new("default", "t"),
            Schema::new(fields),
            primary_key.iter().map(|k| k.to_string()).collect(),
            Vec::new(),
            TableOptions::default(),
        )
        .unwrap()
    }

    #[test]
    fn json_values_fill_a_table_and_bad_ones_refuse_the_batch() {
        let table = table(
            vec![
                Field::new("id", DataType::Int64, false),
                Field::new("name", DataType::Utf8, true),
            ],
            &["id"],
        );
        let runs = rows_of(
            &table,
            &[
                record(None, Some(r#"{"id": 1, "name": "a"}"#)),
                record(None, Some(r#"{"id": 2}"#)),
                record(Some(r#"{"id": 1}"#), None),
            ],
        )
        .unwrap();
        let [Rows::Write(rows), Rows::Delete(keys)] = runs.as_slice() else {
            panic!("{runs:?}");
        };
        assert_eq!(rows.num_rows(), 2);
        assert_eq!(keys.column(0).as_primitive::<Int64Type>().value(0), 1);
        for bad in [
            r#"{"id": 1, "extra": 2}"#,
            r#"{"name": "no id"}"#,
            r#"{"id": "x"}"#,
            "[1]",
            r#"{"id":1}{"id":2}"#,
        ] {
            let refused = rows_of(&table, &[record(None, Some(bad))]);
            assert!(
                matches!(refused, Err(KafkaError::InvalidRecord(_))),
                "{bad}: {refused:?}"
            );
        }
    }

    #[test]
    fn a_table_with_a_value_column_takes_the_record_fields() {
        let table = table(
            vec![
                Field::new("key", DataType::Utf8, true),
                Field::new("value", DataType::Int64, true),
                Field::new(
                    "timestamp",
                    DataType::Timestamp(arrow::datatypes::TimeUnit::Microsecond, None),
                    true,
                ),
                Field::new("note", DataType::Utf8, true),
            ],
            &[],
        );
        let runs = rows_of(&table, &[record(Some("k"), Some("42"))]).unwrap();
        let [Rows::Write(rows)] = runs.as_slice() else {
            panic!("{runs:?}")
        };
        assert_eq!(rows.column(0).as_string::<i32>().value(0), "k");
        assert_eq!(rows.column(1).as_primitive::<Int64Type>().value(0), 42);
        assert!(rows.column(3).is_null(0));
        assert!(rows_of(&table, &[record(Some("k"), Some("forty-two"))]).is_err());
        assert!(
            rows_of(&table, &[record(Some("k"), None)]).is_err(),
            "no tombstones in a log table"
        );
    }
}
