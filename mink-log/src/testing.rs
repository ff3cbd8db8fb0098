//! What tests of the log and of the stores fed by it share (the `testing` feature):
//! a two-column table, its rows, a log that rolls at every write, and a write that must
//! succeed.

use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use mink_core::options::TableOptions;
use mink_core::protocol::AppendAck;
use mink_core::table::{TableDescriptor, TablePath};

use crate::{LogConfig, LogTablet, Write, WriteOp};

/// Rolls to a new segment before every write that finds the active one non-empty.
pub fn one_write_per_segment() -> LogConfig {
    LogConfig {
        sync: false,
        segment_bytes: 1,
        ..LogConfig::default()
    }
}

/// `db.t (id BIGINT NOT NULL, v STRING)` with `primary_key` (none: a log table).
pub fn table(primary_key: &[&str]) -> Arc<TableDescriptor> {
    let schema = Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("v", DataType::Utf8, true),
    ]);
    let table = TableDescriptor::new(
        TablePath::new("db", "t"),
        schema,
        primary_key.iter().map(|c| c.to_string()).collect(),
        vec![],
        TableOptions::default(),
    );
    Arc::new(table.unwrap())
}

/// Rows of [`table`]: each id with the value `v`.
pub fn rows(table: &TableDescriptor, ids: &[i64], v: &str) -> RecordBatch {
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(ids.to_vec())),
        Arc::new(StringArray::from_iter_values(ids.iter().map(|_| v))),
    ];
    RecordBatch::try_new(Arc::clone(table.schema()), columns).unwrap()
}

/// Writes `op` outside any stream; panics unless it is acknowledged.
pub async fn write(log: &LogTablet, table: &Arc<TableDescriptor>, op: WriteOp) -> AppendAck {
    let table = Arc::clone(table);
    log.write(Write {
        op,
        table,
        stream: None,
        writer: None,
        sent: None,
    })
    .await
    .unwrap()
}
