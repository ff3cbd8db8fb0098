//! Bulk ingestion (`CommandStatementIngest`): what ADBC's `adbc_ingest` and the pandas
//! and polars loaders send.
//!
//! The client streams Arrow batches in one `DoPut`; each batch is conformed to the
//! table's current schema (columns matched by name, types cast, missing nullable columns
//! null) and queued as it arrives on the client's pipelined [`TableWriter`]: appended to
//! a log table, upserted into a primary-key table, buckets written side by side while
//! the next batch is read. At most [`ROWS_IN_FLIGHT`] rows are queued or being written;
//! each batch is reserved in the call's memory until they are acknowledged
//! ([`BATCH_COPIES`] times its bytes: the decoded batch and its conformed copy). The
//! answer is the number of rows written.
//!
//! The table definition options say what to do about the table:
//!
//! | table    | option (ADBC mode)                         | action                          |
//! |----------|--------------------------------------------|---------------------------------|
//! | exists   | append or unspecified (`append`, `create_append`) | write into it            |
//! | exists   | replace (`replace`)                        | drop it, create it, write       |
//! | exists   | fail (`create`)                            | `AlreadyExists`                 |
//! | missing  | create (`create`, `create_append`, `replace`) | create a log table of the stream's schema, write |
//! | missing  | fail or unspecified (`append`)             | `NotFound`                      |
//!
//! A created table is a log table in the default bucket layout; create a primary-key or
//! lake-tiered table with `CREATE TABLE` first, then ingest into it.
//!
//! There are no transactions: an ingest that fails midway keeps the batches it wrote
//! and says how many rows they held, except that a table it created is dropped again
//! (also when the client goes away).

use std::collections::VecDeque;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Field, Schema};
use arrow_flight::FlightData;
use arrow_flight::sql::{CommandStatementIngest, TableExistsOption, TableNotExistOption};
use futures::{Stream, TryStreamExt};
use mink_client::{ClientError, MinkClient, TableWriter, WriteKind};
use mink_core::options::TableOptions;
use mink_core::schema::normalize_batch;
use mink_core::table::{TableDescriptor, TablePath};
use mink_sql::{CATALOG_NAME, DEFAULT_DATABASE};
use tokio::runtime::Handle;
use tokio::task::JoinHandle;
use tonic::{Code, Status};
use tracing::{info, warn};

use crate::error::{client_status, invalid, put_stream_status};
use crate::limits::BATCH_COPIES;
use crate::memory::CallMemory;
use crate::prepared::record_batches;

/// Rows an ingest holds queued or being written at once.
const ROWS_IN_FLIGHT: usize = 1 << 18;

/// Writes the streamed batches into the table `command` names; answers the rows written.
///
/// A failure midway keeps the rows already written (each write is durable when it is
/// acknowledged) and says how many they are; a table this ingest created is dropped
/// again instead, also when the call is abandoned (the client goes away), so a failed
/// `create` leaves nothing behind.
pub(crate) async fn ingest(
    client: &MinkClient,
    command: &CommandStatementIngest,
    data: impl Stream<Item = Result<FlightData, Status>> + Send + Unpin + 'static,
    memory: &CallMemory,
) -> Result<i64, Status> {
    if command.temporary {
        return Err(Status::unimplemented("mink has no temporary tables"));
    }
    if command.transaction_id.is_some() {
        return Err(Status::unimplemented("mink has no transactions"));
    }
    let path = table_path(command)?;
    let mut batches = record_batches(data);
    let first = batches.try_next().await.map_err(put_stream_status)?;
    let Some(schema) = batches.schema().cloned() else {
        return Err(invalid("the ingest stream has no schema"));
    };
    let (table, origin) = target_table(client, command, &path, &schema).await?;
    let created = (origin == Origin::Created).then(|| CreatedTable {
        client: client.clone(),
        table: Some(table.clone()),
    });
    let mut writer = TableWriter::new(
        client,
        Arc::new(table.clone()),
        WriteKind::Write,
        ROWS_IN_FLIGHT,
    );
    // Each batch's memory stays held until the writer acknowledged the rows queued up to
    // and with it (an approximation: buckets acknowledge out of order).
    let mut held = VecDeque::new();
    let mut queued = 0u64;
    let mut next = first;
    let read = async {
        while let Some(batch) = next {
            let size = BATCH_COPIES * batch.get_array_memory_size();
            let hold = memory.hold(size, "a batch being ingested")?;
            let conformed = conform(&table, &batch)?;
            drop(batch);
            if writer.write(&conformed).await.is_err() {
                // The writer failed: `finish` says why.
                return Ok(());
            }
            queued += conformed.num_rows() as u64;
            held.push_back((queued, hold));
            let acknowledged = writer.acknowledged_rows();
            while held.front().is_some_and(|(upto, _)| *upto <= acknowledged) {
                held.pop_front();
            }
            next = batches.try_next().await.map_err(put_stream_status)?;
        }
        Ok::<_, Status>(())
    }
    .await;
    let (rows, written) = match writer.finish().await {
        Ok(rows) => (rows, read),
        Err(failed) => (failed.acknowledged_rows, Err(client_status(failed.error))),
    };
    let rows = i64::try_from(rows).unwrap_or(i64::MAX);
    drop(held);
    let failure = match (written, created) {
        (Ok(()), created) => {
            if let Some(created) = created {
                created.keep();
            }
            return Ok(rows);
        }
        (Err(failure), Some(created)) => return Err(created.drop_after(failure).await),
        (Err(failure), None) => failure,
    };
    let kept = match origin {
        Origin::Replaced => {
            format!("'{path}' was replaced: it holds the {rows} rows written before the failure")
        }
        _ => format!("{rows} rows were written before the failure and stay in '{path}'"),
    };
    Err(Status::new(
        failure.code(),
        format!("{} ({kept})", failure.message()),
    ))
}

/// How the table an ingest writes came to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// It was there.
    Existing,
    /// This ingest created it.
    Created,
    /// This ingest dropped the table of that name and created it anew.
    Replaced,
}

/// A table this ingest created: dropped again unless the ingest keeps it, also when the
/// ingest is abandoned midway. Only that very table is dropped, never one created again
/// under its name in the meantime.
struct CreatedTable {
    client: MinkClient,
    table: Option<TableDescriptor>,
}

impl CreatedTable {
    /// The ingest succeeded.
    fn keep(mut self) {
        self.table = None;
    }

    /// Drops the table after the ingest failed; answers the failure, saying so.
    async fn drop_after(mut self, failure: Status) -> Status {
        let Some(table) = self.table.take() else {
            return failure;
        };
        let path = table.path.clone();
        let outcome = match drop_table(self.client.clone(), table).await {
            Ok(Ok(())) => format!("table '{path}', created by this ingest, was dropped again"),
            Ok(Err(error)) => {
                format!("table '{path}', created by this ingest, could not be dropped: {error}")
            }
            Err(error) => format!("dropping table '{path}', created by this ingest: {error}"),
        };
        Status::new(failure.code(), format!("{} ({outcome})", failure.message()))
    }
}

impl Drop for CreatedTable {
    fn drop(&mut self) {
        let Some(table) = self.table.take() else {
            return;
        };
        let path = table.path.clone();
        if Handle::try_current().is_err() {
            warn!(table = %path, "the table of an abandoned ingest is left: no runtime");
            return;
        }
        let client = self.client.clone();
        drop(tokio::spawn(async move {
            match client.drop_table_instance(&table).await {
                Ok(()) => info!(table = %path, "dropped the table of an abandoned ingest"),
                Err(error) => warn!(
                    table = %path,
                    %error,
                    "could not drop the table of an abandoned ingest"
                ),
            }
        }));
    }
}

/// Drops `table` in a task of its own, so that the drop completes even when the call
/// waiting for it is abandoned (a client that goes away abandons its call at once).
fn drop_table(client: MinkClient, table: TableDescriptor) -> JoinHandle<Result<(), ClientError>> {
    tokio::spawn(async move { client.drop_table_instance(&table).await })
}

/// The table named by the command: `mink.db.t`, `db.t` or `t`.
fn table_path(command: &CommandStatementIngest) -> Result<TablePath, Status> {
    if let Some(catalog) = command.catalog.as_deref().filter(|c| *c != CATALOG_NAME) {
        return Err(Status::not_found(format!(
            "catalog '{catalog}' does not exist (mink's catalog is '{CATALOG_NAME}')"
        )));
    }
    let database = command.schema.as_deref().unwrap_or(DEFAULT_DATABASE);
    Ok(TablePath::new(database, command.table.as_str()))
}

/// The table to write, created (or replaced) as the options say.
async fn target_table(
    client: &MinkClient,
    command: &CommandStatementIngest,
    path: &TablePath,
    stream_schema: &Schema,
) -> Result<(TableDescriptor, Origin), Status> {
    let options = command.table_definition_options.unwrap_or_default();
    let existing = match client.describe_table(path).await {
        Ok(table) => Some(table),
        Err(error) if error.code() == Some(Code::NotFound) => None,
        Err(error) => return Err(client_status(error)),
    };
    match (existing, options.if_exists(), options.if_not_exist()) {
        (Some(table), TableExistsOption::Append | TableExistsOption::Unspecified, _) => {
            Ok((table, Origin::Existing))
        }
        (Some(_), TableExistsOption::Fail, _) => Err(Status::already_exists(format!(
            "table '{path}' already exists (ingest in append mode to add rows to it)"
        ))),
        (Some(table), TableExistsOption::Replace, _) => {
            if table.has_primary_key() || table.lake_enabled {
                return Err(Status::failed_precondition(format!(
                    "table '{path}' has a primary key or a lake, which replacing it with a \
                     log table of the stream's columns would lose: DROP it first, or ingest \
                     in append mode"
                )));
            }
            // The replacement is checked before the table it replaces is dropped.
            let replacement = log_table(path, stream_schema)?;
            client
                .drop_table(path, false)
                .await
                .map_err(client_status)?;
            Ok((create(client, &replacement).await?, Origin::Replaced))
        }
        (None, _, TableNotExistOption::Create) => Ok((
            create(client, &log_table(path, stream_schema)?).await?,
            Origin::Created,
        )),
        (None, _, TableNotExistOption::Fail | TableNotExistOption::Unspecified) => {
            Err(Status::not_found(format!(
                "table '{path}' does not exist (ingest in create mode, or CREATE TABLE it first)"
            )))
        }
    }
}

/// A log table of the stream's columns.
fn log_table(path: &TablePath, stream_schema: &Schema) -> Result<TableDescriptor, Status> {
    let fields: Vec<Field> = stream_schema
        .fields()
        .iter()
        .map(|f| Field::new(f.name(), storable(f.data_type()), f.is_nullable()))
        .collect();
    TableDescriptor::new(
        path.clone(),
        Schema::new(fields),
        vec![],
        vec![],
        TableOptions::default(),
    )
    .map_err(invalid)
}

/// Creates `table` on the node.
async fn create(client: &MinkClient, table: &TableDescriptor) -> Result<TableDescriptor, Status> {
    client
        .create_table(table, false)
        .await
        .map_err(client_status)
}

/// The type a created table stores a stream column as: mink stores strings and binaries
/// in their plain Arrow layout.
fn storable(data_type: &DataType) -> DataType {
    match data_type {
        DataType::LargeUtf8 | DataType::Utf8View => DataType::Utf8,
        DataType::LargeBinary | DataType::BinaryView => DataType::Binary,
        other => other.clone(),
    }
}

/// Conforms a batch to the table's schema: its columns matched by name, types cast,
/// missing nullable columns null.
fn conform(table: &TableDescriptor, batch: &RecordBatch) -> Result<RecordBatch, Status> {
    let target = table.schema();
    if let Some(extra) = batch
        .schema()
        .fields()
        .iter()
        .find(|f| target.field_with_name(f.name()).is_err())
    {
        return Err(invalid(format!(
            "table '{}' has no column '{}'",
            table.path,
            extra.name()
        )));
    }
    normalize_batch(batch, &Arc::clone(target)).map_err(invalid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_named_in_mink_or_without_a_catalog() {
        let command = |catalog: Option<&str>, schema: Option<&str>| CommandStatementIngest {
            table: "t".into(),
            catalog: catalog.map(Into::into),
            schema: schema.map(Into::into),
            ..Default::default()
        };
        assert_eq!(
            table_path(&command(None, None)).unwrap(),
            TablePath::new(DEFAULT_DATABASE, "t")
        );
        assert_eq!(
            table_path(&command(Some("mink"), Some("db"))).unwrap(),
            TablePath::new("db", "t")
        );
        assert_eq!(
            table_path(&command(Some("other"), None))
                .unwrap_err()
                .code(),
            Code::NotFound
        );
    }

    #[test]
    fn created_tables_store_plain_strings() {
        assert_eq!(storable(&DataType::LargeUtf8), DataType::Utf8);
        assert_eq!(storable(&DataType::Utf8View), DataType::Utf8);
        assert_eq!(storable(&DataType::Int32), DataType::Int32);
    }
}
