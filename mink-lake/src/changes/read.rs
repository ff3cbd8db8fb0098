//! Streaming a [`ChangesPlan`]'s changed rows.
//!
//! Per snapshot, oldest first:
//!
//! 1. its position-delete files are loaded (they are small): the positions naming data
//!    files of *other* snapshots are deletes; those naming its own data files net out
//!    rows it added and never showed;
//! 2. the rows at those positions are read from their data files, only the row groups
//!    holding them, only the selected rows decoded: the `delete` rows;
//! 3. the rows of its equality-delete files: `delete` rows too;
//! 4. its data files, through [`read_split`] with its own position deletes applied: the
//!    `insert` rows.
//!
//! Nothing is read before the stream is polled, and nothing beyond one batch and one
//! snapshot's delete positions is held.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use futures::stream::{self, BoxStream, StreamExt, TryStreamExt};
use mink_core::schema::normalize_batch;
use parquet::arrow::ParquetRecordBatchStreamBuilder;
use parquet::arrow::async_reader::ParquetObjectReader;

use super::{ChangedSnapshot, ChangesPlan};
use crate::error::{LakeError, Result};
use crate::reader::{
    DeleteKind, LakeDeleteFile, LakeFile, LakeSplit, READ_BATCH_ROWS, columns_mask, load_positions,
    open_parquet, pick_rows, read_split,
};
use crate::storage::LakeStorage;

/// The column holding a changed row's change type: [`INSERT`] or [`DELETE`].
pub const CHANGE_TYPE_COLUMN: &str = "_change_type";
/// The column holding the snapshot that made a change.
pub const SNAPSHOT_ID_COLUMN: &str = "_snapshot_id";
/// The column holding that snapshot's Iceberg sequence number, which grows with commit
/// order (snapshot ids do not): ordered by it, then by [`CHANGE_TYPE_COLUMN`]
/// ([`DELETE`] < [`INSERT`]), the rows are in the order to apply them.
pub const SEQUENCE_NUMBER_COLUMN: &str = "_sequence_number";
/// The change type of an inserted row.
pub const INSERT: &str = "insert";
/// The change type of a deleted row.
pub const DELETE: &str = "delete";

/// The schema of [`read_changes`]'s batches: `columns`, every one nullable (an equality
/// delete knows only its equality columns), then [`CHANGE_TYPE_COLUMN`],
/// [`SNAPSHOT_ID_COLUMN`] and [`SEQUENCE_NUMBER_COLUMN`].
pub fn changes_schema(columns: &Schema) -> SchemaRef {
    let mut fields: Vec<Field> = columns
        .fields()
        .iter()
        .map(|f| f.as_ref().clone().with_nullable(true))
        .collect();
    fields.push(Field::new(CHANGE_TYPE_COLUMN, DataType::Utf8, false));
    fields.push(Field::new(SNAPSHOT_ID_COLUMN, DataType::Int64, false));
    fields.push(Field::new(SEQUENCE_NUMBER_COLUMN, DataType::Int64, false));
    Arc::new(Schema::new(fields))
}

/// What a row deleted by position carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeletedRows<'a> {
    /// Every column read: the row as it was (its data file's rows decoded at its
    /// position, which touches most pages of a file when the deletes are spread).
    Whole,
    /// Only these columns (the table's identity, e.g. its primary key), the others null:
    /// enough to apply the delete by key, and only those columns are decoded.
    Identity(&'a [String]),
}

/// Streams the rows `plan` changed, in [`changes_schema`]`(columns)`: the table's
/// `columns` read by name (a column a file lacks reads as null), oldest snapshot first,
/// each snapshot's deletes before its inserts (see the [module docs](super)). Rows
/// deleted by position carry what `deleted` says.
///
/// Nothing is read before the stream is polled.
///
/// # Errors
/// The stream fails with [`LakeError::FullReloadNeeded`] when
/// [`ChangesPlan::needs_full_reload`], and with the errors of reading the files.
pub fn read_changes(
    storage: &LakeStorage,
    plan: ChangesPlan,
    columns: &Schema,
    deleted: DeletedRows<'_>,
) -> BoxStream<'static, Result<RecordBatch>> {
    if let Some(cause) = plan.full_reload_cause() {
        let error = LakeError::FullReloadNeeded {
            snapshot_id: cause.snapshot_id,
            operation: cause.operation.as_str().to_string(),
            removed_files: cause.removed_files,
            to: plan.to_snapshot_id,
        };
        return stream::once(async { Err(error) }).boxed();
    }
    let output = changes_schema(columns);
    let read_schema = Arc::new(Schema::new(
        output.fields()[..columns.fields().len()].to_vec(),
    ));
    let identity_schema = match deleted {
        DeletedRows::Whole => Arc::clone(&read_schema),
        DeletedRows::Identity(names) => {
            let fields = read_schema.fields().iter();
            let kept = fields.filter(|f| names.contains(f.name())).cloned();
            Arc::new(Schema::new(kept.collect::<Vec<_>>()))
        }
    };
    let storage = storage.clone();
    stream::iter(plan.snapshots)
        .flat_map(move |snapshot| {
            let schemas = Schemas {
                read: Arc::clone(&read_schema),
                identity: Arc::clone(&identity_schema),
                output: Arc::clone(&output),
            };
            snapshot_rows(storage.clone(), snapshot, schemas)
        })
        .boxed()
}

/// The schemas changes are read in.
#[derive(Debug, Clone)]
struct Schemas {
    /// The table's columns asked for.
    read: SchemaRef,
    /// Those of them a row deleted by position is read with.
    identity: SchemaRef,
    /// `read` and the change columns.
    output: SchemaRef,
}

/// The changed rows of one snapshot, tagged.
fn snapshot_rows(
    storage: LakeStorage,
    snapshot: ChangedSnapshot,
    schemas: Schemas,
) -> BoxStream<'static, Result<RecordBatch>> {
    let Schemas {
        read: read_schema,
        identity,
        output,
    } = schemas;
    stream::once(async move {
        let tag = Tag {
            snapshot_id: snapshot.snapshot_id,
            sequence_number: snapshot.sequence_number,
        };
        let added: HashSet<&str> = snapshot
            .added_files
            .iter()
            .map(|f| f.path.as_str())
            .collect();
        // Step 1: other snapshots' rows deleted, and the delete files netting out own rows.
        let mut deleted: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        let mut own_deletes: HashMap<String, Vec<LakeDeleteFile>> = HashMap::new();
        let mut equality = Vec::new();
        for delete in &snapshot.delete_files {
            if let DeleteKind::Equality { .. } = delete.kind {
                equality.push(delete.clone());
                continue;
            }
            for (file, positions) in load_positions(&storage, delete, |_| true).await? {
                match added.contains(file.as_str()) {
                    true => own_deletes.entry(file).or_default().push(delete.clone()),
                    false => deleted.entry(file).or_default().extend(positions),
                }
            }
        }
        for positions in deleted.values_mut() {
            positions.sort_unstable();
            positions.dedup();
        }
        // Steps 2 and 3.
        let (positioned, by_value) = (storage.clone(), storage.clone());
        let (schema, picked) = (Arc::clone(&read_schema), Arc::clone(&identity));
        let position_deletes = stream::iter(deleted)
            .then(move |(file, positions)| {
                let rows = picked_rows(positioned.clone(), file, positions, Arc::clone(&picked));
                let schema = Arc::clone(&schema);
                async move {
                    let rows = rows.await?;
                    Ok::<_, LakeError>(
                        rows.map(move |batch| Ok(normalize_batch(&batch?, &schema)?)),
                    )
                }
            })
            .try_flatten();
        let schema = Arc::clone(&read_schema);
        let equality_deletes = stream::iter(equality)
            .then(move |delete| equality_rows(by_value.clone(), delete, Arc::clone(&schema)))
            .try_flatten();
        // Step 4.
        let split = LakeSplit {
            snapshot_id: Some(tag.snapshot_id),
            files: snapshot
                .added_files
                .iter()
                .map(|file| LakeFile {
                    path: file.path.clone(),
                    size: file.size,
                    record_count: Some(file.record_count),
                    partition: None,
                    deletes: own_deletes.remove(&file.path).unwrap_or_default(),
                    replaced_rows: Vec::new(),
                })
                .collect(),
        };
        let inserts = read_split(&storage, split, read_schema);
        let deletes_output = Arc::clone(&output);
        let deletes = position_deletes
            .chain(equality_deletes)
            .map(move |batch| tagged(&batch?, DELETE, tag, &deletes_output));
        let inserts = inserts.map(move |batch| tagged(&batch?, INSERT, tag, &output));
        Ok::<_, LakeError>(deletes.chain(inserts))
    })
    .try_flatten()
    .boxed()
}

/// The rows at `positions` (ascending) of the data file `path`, in `schema`.
async fn picked_rows(
    storage: LakeStorage,
    path: String,
    positions: Vec<u64>,
    schema: SchemaRef,
) -> Result<BoxStream<'static, Result<RecordBatch>>> {
    let builder = open_parquet(&storage, &path, None).await?;
    let row_counts: Vec<u64> = builder
        .metadata()
        .row_groups()
        .iter()
        .map(|group| u64::try_from(group.num_rows()).unwrap_or(0))
        .collect();
    let picked = pick_rows(&row_counts, &positions);
    if picked.positions.is_empty() {
        return Ok(stream::empty().boxed());
    }
    let builder = builder
        .with_row_groups(picked.row_groups)
        .with_row_selection(picked.selection);
    rows_in(builder, schema)
}

/// The rows of an equality-delete file, in `schema` (the columns it lacks are null).
async fn equality_rows(
    storage: LakeStorage,
    delete: LakeDeleteFile,
    schema: SchemaRef,
) -> Result<BoxStream<'static, Result<RecordBatch>>> {
    let builder = open_parquet(&storage, &delete.path, Some(delete.size)).await?;
    rows_in(builder, schema)
}

/// The rows `builder` reads, in `schema`: its columns by name, those the file lacks null.
fn rows_in(
    builder: ParquetRecordBatchStreamBuilder<ParquetObjectReader>,
    schema: SchemaRef,
) -> Result<BoxStream<'static, Result<RecordBatch>>> {
    let mask = columns_mask(&builder, |name| schema.field_with_name(name).is_ok());
    let batches = builder
        .with_projection(mask)
        .with_batch_size(READ_BATCH_ROWS)
        .build()?;
    Ok(batches
        .map(move |batch| Ok(normalize_batch(&batch?, &schema)?))
        .boxed())
}

/// The snapshot a changed row is tagged with.
#[derive(Debug, Clone, Copy)]
struct Tag {
    snapshot_id: i64,
    sequence_number: i64,
}

/// `batch` with its change type, snapshot and sequence number as the last three columns
/// of `output`.
fn tagged(batch: &RecordBatch, change: &str, tag: Tag, output: &SchemaRef) -> Result<RecordBatch> {
    let rows = batch.num_rows();
    let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
    columns.push(Arc::new(StringArray::from(vec![change; rows])));
    columns.push(Arc::new(Int64Array::from(vec![tag.snapshot_id; rows])));
    columns.push(Arc::new(Int64Array::from(vec![tag.sequence_number; rows])));
    Ok(RecordBatch::try_new_with_options(
        Arc::clone(output),
        columns,
        &arrow::array::RecordBatchOptions::new().with_row_count(Some(rows)),
    )?)
}
