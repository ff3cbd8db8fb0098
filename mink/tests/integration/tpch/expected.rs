//! The expected side: the same writes, updates and deletes applied to plain Arrow batches
//! with DataFusion, the final rows written as plain Parquet files and queried by a plain
//! DataFusion context.
//!
//! An `UPDATE t SET c = v WHERE f` becomes the projection
//! `c := CAST(CASE WHEN f THEN v ELSE c END AS <type of c>)`, a `DELETE FROM t WHERE f`
//! the filter `f IS NOT TRUE`: the rows a mink statement touches are exactly those for which
//! its filter is true.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::dataframe::DataFrame;
use datafusion::datasource::MemTable;
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext, cast, col, when};
use parquet::arrow::ArrowWriter;

/// A plain DataFusion context configured like a mink session where it matters to results:
/// strings are `Utf8` (mink's columns and lake use `Utf8`, not views).
pub(super) fn plain_context() -> SessionContext {
    let mut config = SessionConfig::new();
    let options = config.options_mut();
    options.sql_parser.map_string_types_to_utf8view = false;
    options.execution.parquet.schema_force_view_types = false;
    SessionContext::new_with_config(config)
}

/// The rows every table should hold, kept as Arrow batches.
pub(super) struct Expected {
    context: SessionContext,
    tables: BTreeMap<&'static str, (SchemaRef, Vec<RecordBatch>)>,
}

impl Expected {
    pub(super) fn new() -> Self {
        Self {
            context: plain_context(),
            tables: BTreeMap::new(),
        }
    }

    /// Adds rows (appended to a log table; new keys of a primary-key table).
    pub(super) fn write(&mut self, table: &'static str, rows: RecordBatch) {
        let (_, batches) = self
            .tables
            .entry(table)
            .or_insert_with(|| (rows.schema(), Vec::new()));
        batches.push(rows);
    }

    /// How many rows `filter` (SQL) is true for: the count an `UPDATE` or `DELETE`
    /// answers.
    pub(super) async fn matching(&self, table: &str, filter: &str) -> usize {
        let frame = self.frame(table);
        let filter = frame.parse_sql_expr(filter).expect(filter);
        frame
            .filter(filter.is_true())
            .expect("filter")
            .count()
            .await
            .expect("count")
    }

    /// `UPDATE table SET column = value WHERE filter`.
    pub(super) async fn update(&mut self, table: &str, column: &str, value: &str, filter: &str) {
        let frame = self.frame(table);
        let (schema, _) = &self.tables[table];
        let data_type = schema
            .field_with_name(column)
            .expect("updated column")
            .data_type()
            .clone();
        let filter = frame.parse_sql_expr(filter).expect(filter);
        let value = frame.parse_sql_expr(value).expect(value);
        let updated = when(filter, value).otherwise(col(column)).expect("case");
        let frame = frame
            .with_column(column, cast(updated, data_type))
            .expect("projection");
        self.replace(table, frame).await;
    }

    /// `DELETE FROM table WHERE filter`.
    pub(super) async fn delete(&mut self, table: &str, filter: &str) {
        let frame = self.frame(table);
        let filter = frame.parse_sql_expr(filter).expect(filter);
        let frame = frame.filter(filter.is_not_true()).expect("filter");
        self.replace(table, frame).await;
    }

    /// Writes every table as one plain Parquet file under `dir` and answers a plain
    /// context with each registered under its name.
    pub(super) async fn into_parquet(self, dir: &Path) -> SessionContext {
        let context = plain_context();
        for (table, (schema, batches)) in self.tables {
            let path = dir.join(format!("{table}.parquet"));
            let file = File::create(&path).expect("create parquet file");
            let mut writer = ArrowWriter::try_new(file, schema, None).expect("parquet writer");
            for batch in &batches {
                writer.write(batch).expect("write parquet");
            }
            writer.close().expect("close parquet");
            context
                .register_parquet(
                    table,
                    path.to_str().expect("utf-8 path"),
                    ParquetReadOptions::default(),
                )
                .await
                .expect("register parquet");
        }
        context
    }

    fn frame(&self, table: &str) -> DataFrame {
        let (schema, batches) = &self.tables[table];
        let memory =
            MemTable::try_new(Arc::clone(schema), vec![batches.clone()]).expect("memory table");
        self.context
            .read_table(Arc::new(memory))
            .expect("read memory table")
    }

    /// Replaces a table's rows with those of `frame`, in the table's schema.
    async fn replace(&mut self, table: &str, frame: DataFrame) {
        let rows = frame.collect().await.expect("edited rows");
        let (schema, batches) = self.tables.get_mut(table).expect("known table");
        *batches = rows
            .into_iter()
            .map(|batch| {
                RecordBatch::try_new(Arc::clone(schema), batch.columns().to_vec())
                    .expect("edited rows fit the table's schema")
            })
            .collect();
    }
}
