//! Log batches as Kafka record batches (the Fetch direction).
//!
//! Each record is built from the row's columns, found by name in the batch's own schema
//! (an older batch may have an older one):
//!
//! | record field | log table | primary-key table |
//! |---|---|---|
//! | key | the `key` column, if any | the primary key: its bytes for one VARCHAR/BYTEA key column, else a JSON object of the key columns |
//! | value | the `value` column; without one, the row as a JSON object | the same for `+I`/`+U`; none (a tombstone) for `-D` |
//! | headers | the `headers` column (`MAP<VARCHAR, BYTEA>`), if any | the same |
//! | timestamp | the `timestamp` column (ms); without one, the commit time | the same |
//!
//! A `-U` row is not sent. One mink batch becomes Kafka record batches of at most
//! [`FETCH_CHUNK_ROWS`] rows each, whose offsets still reach the chunk's last row (the
//! last chunk's: the mink batch's last offset; `lastOffsetDelta`), so a consumer moves
//! past rows that were not sent. A Fetch stops after the chunk that fills its byte
//! bound, so a stored batch of millions of rows is sent, and converted, in parts.
//! String and binary columns are sent as their bytes, other types as their text (`42`,
//! `2026-12-02T10:00:00`).

use std::ops::Range;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, MapArray, RecordBatch};
use arrow::compute::{CastOptions, cast_with_options};
use arrow::datatypes::{DataType, TimeUnit};
use bytes::{Bytes, BytesMut};
use indexmap::IndexMap;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    Compression, NO_PARTITION_LEADER_EPOCH, NO_PRODUCER_EPOCH, NO_PRODUCER_ID, Record,
    RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use mink_core::change::ChangeType;
use mink_core::table::TableDescriptor;
use mink_log::LogBatch;

use crate::error::{KafkaError, Result};
use crate::limits::FETCH_CHUNK_ROWS;

/// The column a record's key comes from in a log table.
pub(crate) const KEY: &str = "key";
/// The column a record's value comes from.
pub(crate) const VALUE: &str = "value";
/// The column of a record's headers.
pub(crate) const HEADERS: &str = "headers";
/// The column of a record's timestamp.
pub(crate) const TIMESTAMP: &str = "timestamp";

/// Appends the rows of `batch` from offset `from` on to `out`, as Kafka record batches
/// of at most [`FETCH_CHUNK_ROWS`] rows each, until `out` holds `budget` bytes (one
/// chunk at least; nothing when no row at or after `from` is sent). A stored batch of
/// millions of small rows is so sent in parts, and only the rows sent are converted.
pub(crate) fn encode_batch(
    table: &TableDescriptor,
    batch: &LogBatch,
    from: i64,
    budget: u64,
    out: &mut BytesMut,
) -> Result<()> {
    let rows = batch.batch.num_rows();
    let mut start = usize::try_from(from.saturating_sub(batch.base_offset)).unwrap_or(0);
    while start < rows {
        let end = rows.min(start + FETCH_CHUNK_ROWS);
        encode_chunk(table, batch, start..end, out)?;
        if out.len() as u64 >= budget {
            break;
        }
        start = end;
    }
    Ok(())
}

/// Appends the rows `chunk` of `batch` to `out` as one Kafka record batch whose offsets
/// reach the chunk's last row (the batch's last offset for its last chunk), sent or not.
fn encode_chunk(
    table: &TableDescriptor,
    batch: &LogBatch,
    chunk: Range<usize>,
    out: &mut BytesMut,
) -> Result<()> {
    let rows = batch.batch.slice(chunk.start, chunk.len());
    let changes = batch
        .changes
        .as_deref()
        .map(|changes| ChangeType::decode_vector(&changes[chunk.clone()]))
        .transpose()?;
    let first_offset = batch.base_offset + chunk.start as i64;
    let last_offset = if chunk.end == batch.batch.num_rows() {
        batch.last_offset
    } else {
        batch.base_offset + chunk.end as i64 - 1
    };
    let columns = RecordColumns::of(table, &rows)?;
    let mut records = Vec::with_capacity(rows.num_rows());
    for row in 0..rows.num_rows() {
        let change = changes.as_ref().map(|c| c[row]);
        if change == Some(ChangeType::UpdateBefore) {
            continue;
        }
        let offset = first_offset + row as i64;
        let value = match change {
            Some(ChangeType::Delete) => None,
            _ => columns.value[row].clone(),
        };
        records.push(Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: NO_PARTITION_LEADER_EPOCH,
            producer_id: NO_PRODUCER_ID,
            producer_epoch: NO_PRODUCER_EPOCH,
            timestamp_type: TimestampType::Creation,
            offset,
            // The encoder keeps records in one batch while offset - sequence is the same
            // for all; this gives the batch a base sequence of -1 (no sequence).
            sequence: (offset - first_offset) as i32 - 1,
            timestamp: columns
                .timestamps
                .as_ref()
                .and_then(|t| t[row])
                .unwrap_or(batch.commit_timestamp),
            key: columns.key[row].clone(),
            value,
            headers: columns
                .headers
                .as_ref()
                .map(|h| h[row].clone())
                .unwrap_or_default(),
        });
    }
    let Some(first) = records.first() else {
        return Ok(());
    };
    let base_offset = first.offset;
    let start = out.len();
    let options = RecordEncodeOptions {
        version: 2,
        compression: Compression::None,
    };
    RecordBatchEncoder::encode(out, &records, &options)
        .map_err(|e| KafkaError::Internal(format!("encoding a record batch: {e}")))?;
    cover_offsets(&mut out[start..], last_offset - base_offset);
    Ok(())
}

/// Byte offsets in a v2 record batch: the CRC, and the first byte it covers.
const CRC_AT: usize = 17;
const CRC_FROM: usize = 21;
const LAST_OFFSET_DELTA_AT: usize = 23;

/// Sets the `lastOffsetDelta` of the record batch in `batch` (its only one) and its CRC
/// again, so the batch covers offsets past its last record.
fn cover_offsets(batch: &mut [u8], last_offset_delta: i64) {
    let delta = i32::try_from(last_offset_delta).unwrap_or(i32::MAX);
    batch[LAST_OFFSET_DELTA_AT..LAST_OFFSET_DELTA_AT + 4].copy_from_slice(&delta.to_be_bytes());
    let crc = crc32c::crc32c(&batch[CRC_FROM..]);
    batch[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
}

/// Per row of a batch: the parts of its record.
struct RecordColumns {
    key: Vec<Option<Bytes>>,
    value: Vec<Option<Bytes>>,
    headers: Option<Vec<IndexMap<StrBytes, Option<Bytes>>>>,
    timestamps: Option<Vec<Option<i64>>>,
}

impl RecordColumns {
    fn of(table: &TableDescriptor, rows: &RecordBatch) -> Result<Self> {
        let column = |name: &str| rows.column_by_name(name);
        let key = if table.has_primary_key() {
            primary_key_bytes(table, rows)?
        } else {
            match column(KEY) {
                Some(key) => cell_bytes(key)?,
                None => vec![None; rows.num_rows()],
            }
        };
        let value = match column(VALUE) {
            Some(value) => cell_bytes(value)?,
            None => json_rows(rows)?,
        };
        let headers = column(HEADERS)
            .and_then(|h| h.as_map_opt())
            .map(header_maps)
            .transpose()?;
        let timestamps = column(TIMESTAMP).and_then(milliseconds);
        Ok(Self {
            key,
            value,
            headers,
            timestamps,
        })
    }
}

/// The Kafka key of a primary-key table's rows: the key's own bytes for one string or
/// binary column, else a JSON object of the key columns.
pub(crate) fn primary_key_bytes(
    table: &TableDescriptor,
    rows: &RecordBatch,
) -> Result<Vec<Option<Bytes>>> {
    let keys = rows.project(&column_indices(rows, &table.primary_key)?)?;
    match table.primary_key.as_slice() {
        [_] if is_bytes_like(keys.column(0).data_type()) => cell_bytes(keys.column(0)),
        _ => json_rows(&keys),
    }
}

fn column_indices(rows: &RecordBatch, names: &[String]) -> Result<Vec<usize>> {
    names
        .iter()
        .map(|name| Ok(rows.schema().index_of(name)?))
        .collect()
}

/// Whether a type is sent as its own bytes.
pub(crate) fn is_bytes_like(data_type: &DataType) -> bool {
    matches!(
        data_type,
        DataType::Utf8
            | DataType::LargeUtf8
            | DataType::Utf8View
            | DataType::Binary
            | DataType::LargeBinary
            | DataType::BinaryView
    )
}

/// Each cell as bytes: strings and binaries as they are, other types as their text.
fn cell_bytes(column: &ArrayRef) -> Result<Vec<Option<Bytes>>> {
    let binary = match column.data_type() {
        DataType::Binary => Arc::clone(column),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {
            cast_with_options(column, &DataType::Binary, &CastOptions::default())?
        }
        DataType::LargeBinary | DataType::BinaryView => {
            cast_with_options(column, &DataType::Binary, &CastOptions::default())?
        }
        _ => {
            let text = cast_with_options(column, &DataType::Utf8, &CastOptions::default())?;
            cast_with_options(&text, &DataType::Binary, &CastOptions::default())?
        }
    };
    Ok(binary
        .as_binary::<i32>()
        .iter()
        .map(|cell| cell.map(Bytes::copy_from_slice))
        .collect())
}

/// Each row as a JSON object of its columns (nulls left out).
fn json_rows(rows: &RecordBatch) -> Result<Vec<Option<Bytes>>> {
    let mut text = Vec::new();
    {
        let mut writer = arrow::json::LineDelimitedWriter::new(&mut text);
        writer.write(rows)?;
        writer.finish()?;
    }
    // JSON escapes a newline inside a string, so each line is one row.
    let lines: Vec<Option<Bytes>> = Bytes::from(text)
        .split(|b| *b == b'\n')
        .filter(|line| !line.is_empty())
        .map(|line| Some(Bytes::copy_from_slice(line)))
        .collect();
    if lines.len() != rows.num_rows() {
        return Err(KafkaError::Internal(format!(
            "{} rows gave {} JSON objects",
            rows.num_rows(),
            lines.len()
        )));
    }
    Ok(lines)
}

fn header_maps(headers: &MapArray) -> Result<Vec<IndexMap<StrBytes, Option<Bytes>>>> {
    let keys = cast_with_options(headers.keys(), &DataType::Utf8, &CastOptions::default())?;
    let keys = keys.as_string::<i32>();
    let values = cell_bytes(headers.values())?;
    let offsets = headers.value_offsets();
    Ok((0..headers.len())
        .map(|row| {
            let (start, end) = (offsets[row] as usize, offsets[row + 1] as usize);
            if headers.is_null(row) {
                return IndexMap::new();
            }
            (start..end)
                .map(|entry| {
                    let key = StrBytes::from_string(keys.value(entry).to_string());
                    (key, values[entry].clone())
                })
                .collect()
        })
        .collect())
}

/// A timestamp column in milliseconds since the epoch; `None` for other types.
fn milliseconds(column: &ArrayRef) -> Option<Vec<Option<i64>>> {
    let per_ms = match column.data_type() {
        DataType::Timestamp(TimeUnit::Second, _) => -1000,
        DataType::Timestamp(TimeUnit::Millisecond, _) | DataType::Int64 => 1,
        DataType::Timestamp(TimeUnit::Microsecond, _) => 1000,
        DataType::Timestamp(TimeUnit::Nanosecond, _) => 1_000_000,
        _ => return None,
    };
    let raw = cast_with_options(column, &DataType::Int64, &CastOptions::default()).ok()?;
    let raw = raw.as_primitive::<arrow::datatypes::Int64Type>();
    Some(
        raw.iter()
            .map(|v| {
                v.map(|v| {
                    if per_ms < 0 {
                        v.saturating_mul(-per_ms)
                    } else {
                        v / per_ms
                    }
                })
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::Field;
    use kafka_protocol::records::RecordBatchDecoder;

    use super::*;

    fn table(primary_key: &[&str]) -> TableDescriptor {
        let fields = vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
        ];
        crate::rows::tests::table(fields, primary_key)
    }

    fn log_batch(table: &TableDescriptor, changes: Option<Vec<u8>>) -> LogBatch {
        let batch = RecordBatch::try_new(
            Arc::clone(table.schema()),
            vec![
                Arc::new(Int64Array::from(vec![1, 1, 1, 2])),
                Arc::new(StringArray::from(vec![
                    Some("a"),
                    Some("a"),
                    Some("b\nc"),
                    None,
                ])),
            ],
        )
        .unwrap();
        LogBatch {
            base_offset: 10,
            last_offset: 13,
            commit_timestamp: 1_700_000_000_000,
            schema_id: 0,
            batch,
            changes,
            writer: None,
            size: 0,
        }
    }

    /// The rows of `batch` from `from` on, with no byte bound.
    fn encode_whole(table: &TableDescriptor, batch: &LogBatch, from: i64) -> BytesMut {
        let mut out = BytesMut::new();
        encode_batch(table, batch, from, u64::MAX, &mut out).unwrap();
        out
    }

    fn decode(bytes: BytesMut) -> Vec<Record> {
        let mut bytes = bytes.freeze();
        let sets = RecordBatchDecoder::decode_all(&mut bytes).unwrap();
        assert_eq!(sets.len(), 1, "one mink batch is one record batch");
        sets.into_iter().next().unwrap().records
    }

    #[test]
    fn a_log_table_without_value_sends_rows_as_json() {
        let table = table(&[]);
        let out = encode_whole(&table, &log_batch(&table, None), 11);
        let records = decode(out);
        let offsets: Vec<i64> = records.iter().map(|r| r.offset).collect();
        assert_eq!(offsets, [11, 12, 13]);
        let values: Vec<&[u8]> = records
            .iter()
            .map(|r| r.value.as_deref().unwrap())
            .collect();
        assert_eq!(values[1], br#"{"id":1,"name":"b\nc"}"#);
        assert_eq!(values[2], br#"{"id":2}"#);
        assert!(records.iter().all(|r| r.key.is_none()));
        assert!(records.iter().all(|r| r.timestamp == 1_700_000_000_000));
    }

    #[test]
    fn a_primary_key_table_sends_an_upsert_stream() {
        let table = table(&["id"]);
        let changes = vec![
            ChangeType::Insert as u8,
            ChangeType::UpdateBefore as u8,
            ChangeType::UpdateAfter as u8,
            ChangeType::Delete as u8,
        ];
        let out = encode_whole(&table, &log_batch(&table, Some(changes)), 10);
        let mut bytes = out.clone().freeze();
        let info = RecordBatchDecoder::decode_batch_info(&mut bytes).unwrap();
        assert_eq!(info[0].min_offset, 10);
        let records = decode(out);
        let offsets: Vec<i64> = records.iter().map(|r| r.offset).collect();
        assert_eq!(offsets, [10, 12, 13], "-U is not sent");
        assert_eq!(records[0].key.as_deref(), Some(&br#"{"id":1}"#[..]));
        assert_eq!(
            records[1].value.as_deref(),
            Some(&br#"{"id":1,"name":"b\nc"}"#[..])
        );
        assert_eq!(records[2].value, None, "-D is a tombstone");
    }

    /// A produced record comes back from a fetch with its key, value, headers and time.
    #[test]
    fn record_fields_round_trip_through_a_table_with_those_columns() {
        let headers = DataType::Map(
            Arc::new(Field::new(
                "entries",
                DataType::Struct(
                    vec![
                        Field::new("keys", DataType::Utf8, false),
                        Field::new("values", DataType::Binary, true),
                    ]
                    .into(),
                ),
                false,
            )),
            false,
        );
        let fields = vec![
            Field::new(KEY, DataType::Utf8, true),
            Field::new(VALUE, DataType::Binary, true),
            Field::new(HEADERS, headers, true),
            Field::new(
                TIMESTAMP,
                DataType::Timestamp(TimeUnit::Millisecond, None),
                true,
            ),
        ];
        let table = crate::rows::tests::table(fields, &[]);
        let mut produced = crate::rows::tests::record(Some("k"), None);
        produced.value = Some(Bytes::from_static(b"\x00\xffbytes"));
        produced.headers.insert(
            StrBytes::from_static_str("trace"),
            Some(Bytes::from_static(b"t-1")),
        );
        produced
            .headers
            .insert(StrBytes::from_static_str("empty"), None);
        let mut runs = crate::rows::rows_of(&table, &[produced.clone()]).unwrap();
        let Some(crate::rows::Rows::Write(rows)) = runs.pop() else {
            panic!("one write");
        };
        let batch = LogBatch {
            base_offset: 0,
            last_offset: 0,
            commit_timestamp: 1,
            schema_id: 0,
            batch: rows,
            changes: None,
            writer: None,
            size: 0,
        };
        let out = encode_whole(&table, &batch, 0);
        let fetched = decode(out).remove(0);
        assert_eq!(fetched.key, produced.key);
        assert_eq!(fetched.value, produced.value);
        assert_eq!(fetched.headers, produced.headers);
        assert_eq!(fetched.timestamp, produced.timestamp);
    }

    #[test]
    fn the_batch_covers_rows_that_are_not_sent() {
        let table = table(&["id"]);
        let changes = vec![
            ChangeType::Insert as u8,
            ChangeType::Insert as u8,
            ChangeType::Insert as u8,
            ChangeType::UpdateBefore as u8,
        ];
        let out = encode_whole(&table, &log_batch(&table, Some(changes)), 10);
        // lastOffsetDelta reaches offset 13, and the CRC still checks (decode verifies it).
        assert_eq!(&out[23..27], &3i32.to_be_bytes());
        assert_eq!(decode(out).len(), 3);
    }

    /// A stored batch of many rows goes out in chunks, and a Fetch's byte bound stops
    /// it after the chunk that reaches it: the consumer goes on from there.
    #[test]
    fn a_large_batch_is_sent_in_chunks_up_to_the_budget() {
        let table = table(&[]);
        let rows = FETCH_CHUNK_ROWS * 2 + 5;
        let batch = RecordBatch::try_new(
            Arc::clone(table.schema()),
            vec![
                Arc::new(Int64Array::from_iter_values(0..rows as i64)),
                Arc::new(StringArray::from(vec![Some("x"); rows])),
            ],
        )
        .unwrap();
        let batch = LogBatch {
            base_offset: 100,
            last_offset: 100 + rows as i64 - 1,
            batch,
            ..log_batch(&table, None)
        };
        let mut out = BytesMut::new();
        encode_batch(&table, &batch, 100, 1, &mut out).unwrap();
        let info = RecordBatchDecoder::decode_batch_info(&mut out.clone().freeze()).unwrap();
        assert_eq!(info.len(), 1, "one chunk reaches a budget of one byte");
        assert_eq!(info[0].record_count as usize, FETCH_CHUNK_ROWS);
        assert_eq!(
            &out[23..27],
            &(FETCH_CHUNK_ROWS as i32 - 1).to_be_bytes(),
            "the chunk covers its own rows only"
        );

        let from = 100 + FETCH_CHUNK_ROWS as i64 + 3;
        let mut bytes = encode_whole(&table, &batch, from).freeze();
        let sets = RecordBatchDecoder::decode_all(&mut bytes).unwrap();
        let offsets: Vec<i64> = sets
            .iter()
            .flat_map(|s| &s.records)
            .map(|r| r.offset)
            .collect();
        assert_eq!(offsets, (from..=batch.last_offset).collect::<Vec<_>>());
        assert_eq!(sets.len(), 2, "two chunks from the fetch offset on");
    }
}
