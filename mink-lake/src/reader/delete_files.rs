//! A split's delete files, each loaded at most once per read.
//!
//! A position-delete file usually covers many data files of a bucket, and an
//! equality-delete file every data file written before it: a read of a split loads each
//! one the first time a data file needs it and keeps it until the read ends. What is kept
//! is the delete file's content, reduced to what the split can use:
//!
//! - position deletes: per data file *of the split*, its deleted positions, sorted and
//!   deduplicated (rows naming other files are dropped while loading; the file need not
//!   be sorted);
//! - equality deletes: the deleted keys, arrow-row encoded, in a hash set, with the
//!   converter that encodes a data file's rows the same way.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, BooleanBufferBuilder, RecordBatch, RecordBatchOptions,
    new_null_array,
};
use arrow::compute::{and, cast};
use arrow::datatypes::{DataType, Field, Int64Type, Schema};
use arrow::row::{RowConverter, SortField};
use futures::TryStreamExt;
use parquet::arrow::{PARQUET_FIELD_ID_META_KEY, ProjectionMask};
use parquet::errors::ParquetError;
use tokio::sync::OnceCell;

use super::{DeleteKind, LakeDeleteFile, LakeFile, open_parquet};
use crate::error::{LakeError, Result};
use crate::storage::LakeStorage;

/// The field id of a position-delete file's `file_path` column (Iceberg reserves it).
pub(super) const FILE_PATH_FIELD_ID: i32 = 2_147_483_546;
/// The field id of a position-delete file's `pos` column (Iceberg reserves it).
pub(super) const POS_FIELD_ID: i32 = 2_147_483_545;

/// The delete files of one read of a split.
#[derive(Debug)]
pub(super) struct SplitDeletes {
    storage: LakeStorage,
    /// The split's data files: position deletes of other files are not kept.
    data_files: HashSet<String>,
    loaded: Mutex<HashMap<String, Arc<OnceCell<Arc<Loaded>>>>>,
    /// How many delete files were read.
    loads: AtomicUsize,
}

#[derive(Debug)]
enum Loaded {
    /// Data file -> its deleted positions, ascending, without duplicates.
    Positions(HashMap<String, Vec<u64>>),
    Equality(Arc<EqualityDeletes>),
}

/// The deletes that apply to one data file.
#[derive(Debug, Default)]
pub(super) struct FileDeletes {
    /// Deleted positions, ascending, without duplicates.
    pub(super) positions: Vec<u64>,
    /// Deleted keys.
    pub(super) equality: Vec<Arc<EqualityDeletes>>,
}

impl SplitDeletes {
    pub(super) fn new<'a>(
        storage: LakeStorage,
        data_files: impl IntoIterator<Item = &'a LakeFile>,
    ) -> Self {
        Self {
            storage,
            data_files: data_files.into_iter().map(|f| f.path.clone()).collect(),
            loaded: Mutex::default(),
            loads: AtomicUsize::new(0),
        }
    }

    /// How many delete files have been read.
    #[cfg(test)]
    pub(super) fn loads(&self) -> usize {
        self.loads.load(Ordering::Relaxed)
    }

    /// The deletes of `file`, loading the delete files not loaded yet.
    pub(super) async fn for_file(&self, file: &LakeFile) -> Result<FileDeletes> {
        let mut deletes = FileDeletes::default();
        let mut position_files = 0;
        for delete in &file.deletes {
            match (&delete.kind, &*self.load(delete).await?) {
                (DeleteKind::Positions, Loaded::Positions(by_file)) => {
                    if let Some(positions) = by_file.get(&file.path) {
                        deletes.positions.extend_from_slice(positions);
                        position_files += 1;
                    }
                }
                (DeleteKind::Equality { columns }, Loaded::Equality(keys))
                    if *columns == keys.columns =>
                {
                    deletes.equality.push(Arc::clone(keys));
                }
                _ => {
                    return Err(malformed(
                        &delete.path,
                        "listed twice with different kinds or equality columns",
                    ));
                }
            }
        }
        if position_files > 1 {
            deletes.positions.sort_unstable();
            deletes.positions.dedup();
        }
        Ok(deletes)
    }

    async fn load(&self, delete: &LakeDeleteFile) -> Result<Arc<Loaded>> {
        let cell = Arc::clone(
            self.loaded
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(delete.path.clone())
                .or_default(),
        );
        let loaded = cell
            .get_or_try_init(|| async {
                self.loads.fetch_add(1, Ordering::Relaxed);
                let loaded = match &delete.kind {
                    DeleteKind::Positions => Loaded::Positions(
                        load_positions(&self.storage, delete, |path| {
                            self.data_files.contains(path)
                        })
                        .await?,
                    ),
                    DeleteKind::Equality { columns } => Loaded::Equality(Arc::new(
                        EqualityDeletes::load(&self.storage, delete, columns).await?,
                    )),
                };
                Ok::<_, LakeError>(Arc::new(loaded))
            })
            .await?;
        Ok(Arc::clone(loaded))
    }
}

/// A delete file whose content is not what its kind requires.
fn malformed(path: &str, message: impl std::fmt::Display) -> LakeError {
    LakeError::Parquet(ParquetError::General(format!(
        "delete file {path}: {message}"
    )))
}

/// The column of `schema` with Iceberg field id `field_id`, else the one named `name`.
fn column_index(schema: &Schema, field_id: i32, name: &str) -> Option<usize> {
    let id = field_id.to_string();
    schema
        .fields()
        .iter()
        .position(|f| f.metadata().get(PARQUET_FIELD_ID_META_KEY) == Some(&id))
        .or_else(|| schema.index_of(name).ok())
}

/// Reads a position-delete file: the deleted positions (ascending, without duplicates) of
/// each data file `keep` accepts.
pub(crate) async fn load_positions(
    storage: &LakeStorage,
    delete: &LakeDeleteFile,
    keep: impl Fn(&str) -> bool,
) -> Result<HashMap<String, Vec<u64>>> {
    let builder = open_parquet(storage, &delete.path, Some(delete.size)).await?;
    let schema = Arc::clone(builder.schema());
    let (Some(path_column), Some(pos_column)) = (
        column_index(&schema, FILE_PATH_FIELD_ID, "file_path"),
        column_index(&schema, POS_FIELD_ID, "pos"),
    ) else {
        return Err(malformed(
            &delete.path,
            "a position-delete file needs file_path and pos columns",
        ));
    };
    let (path_name, pos_name) = (
        schema.field(path_column).name(),
        schema.field(pos_column).name(),
    );
    let mask = ProjectionMask::roots(builder.parquet_schema(), [path_column, pos_column]);
    let mut batches = builder.with_projection(mask).build()?;
    let mut by_file: HashMap<String, Vec<u64>> = HashMap::new();
    while let Some(batch) = batches.try_next().await? {
        let column = |name: &str| {
            batch
                .column_by_name(name)
                .ok_or_else(|| malformed(&delete.path, format!("no column {name}")))
        };
        let paths = cast(column(path_name)?, &DataType::Utf8)?;
        let paths = paths.as_string::<i32>();
        let positions = cast(column(pos_name)?, &DataType::Int64)?;
        let positions = positions.as_primitive::<Int64Type>();
        // Rows of one data file are usually adjacent (the files are sorted by path):
        // look the entry up once per run of equal paths.
        let mut row = 0;
        while row < batch.num_rows() {
            let path = paths.is_valid(row).then(|| paths.value(row));
            let mut end = row + 1;
            while end < batch.num_rows() && paths.is_valid(end).then(|| paths.value(end)) == path {
                end += 1;
            }
            if let Some(path) = path.filter(|p| keep(p)) {
                // Negative positions name no row.
                let run = (row..end)
                    .filter(|&i| positions.is_valid(i))
                    .filter_map(|i| u64::try_from(positions.value(i)).ok());
                match by_file.get_mut(path) {
                    Some(deleted) => deleted.extend(run),
                    None => {
                        by_file.insert(path.to_string(), run.collect());
                    }
                }
            }
            row = end;
        }
    }
    for positions in by_file.values_mut() {
        if !positions.is_sorted() {
            positions.sort_unstable();
        }
        positions.dedup();
        positions.shrink_to_fit();
    }
    Ok(by_file)
}

/// The keys of an equality-delete file.
#[derive(Debug)]
pub(super) struct EqualityDeletes {
    /// The equality columns, by name.
    columns: Vec<String>,
    /// Their types in the delete file; a data file's columns are cast to them.
    types: Vec<DataType>,
    converter: RowConverter,
    keys: HashSet<Box<[u8]>>,
}

impl EqualityDeletes {
    pub(super) async fn load(
        storage: &LakeStorage,
        delete: &LakeDeleteFile,
        columns: &[String],
    ) -> Result<Self> {
        let builder = open_parquet(storage, &delete.path, Some(delete.size)).await?;
        let schema = Arc::clone(builder.schema());
        let indexes = columns
            .iter()
            .map(|name| {
                schema
                    .index_of(name)
                    .map_err(|_| malformed(&delete.path, format!("no equality column {name}")))
            })
            .collect::<Result<Vec<_>>>()?;
        let types: Vec<DataType> = indexes
            .iter()
            .map(|&i| schema.field(i).data_type().clone())
            .collect();
        let converter = RowConverter::new(types.iter().cloned().map(SortField::new).collect())?;
        let mask = ProjectionMask::roots(builder.parquet_schema(), indexes);
        let mut batches = builder.with_projection(mask).build()?;
        let mut keys = HashSet::new();
        while let Some(batch) = batches.try_next().await? {
            let key_columns = columns
                .iter()
                .map(|name| {
                    batch.column_by_name(name).cloned().ok_or_else(|| {
                        malformed(&delete.path, format!("no equality column {name}"))
                    })
                })
                .collect::<Result<Vec<ArrayRef>>>()?;
            let rows = converter.convert_columns(&key_columns)?;
            keys.extend(rows.iter().map(|row| Box::<[u8]>::from(row.as_ref())));
        }
        keys.shrink_to_fit();
        Ok(Self {
            columns: columns.to_vec(),
            types,
            converter,
            keys,
        })
    }

    /// The equality columns, by name.
    pub(super) fn columns(&self) -> &[String] {
        &self.columns
    }

    /// The deleted keys as rows of the equality columns, in their types.
    pub(super) fn to_batch(&self) -> Result<RecordBatch> {
        let parser = self.converter.parser();
        let columns = self
            .converter
            .convert_rows(self.keys.iter().map(|key| parser.parse(key)))?;
        let fields: Vec<Field> = self
            .columns
            .iter()
            .zip(&self.types)
            .map(|(name, data_type)| Field::new(name, data_type.clone(), true))
            .collect();
        let options = RecordBatchOptions::new().with_row_count(Some(self.keys.len()));
        Ok(RecordBatch::try_new_with_options(
            Arc::new(Schema::new(fields)),
            columns,
            &options,
        )?)
    }

    /// The deletes whose keys are the rows of `batch` ([`Self::to_batch`]).
    pub(super) fn from_batch(batch: &RecordBatch) -> Result<Self> {
        let schema = batch.schema();
        let types: Vec<DataType> = schema
            .fields()
            .iter()
            .map(|f| f.data_type().clone())
            .collect();
        let converter = RowConverter::new(types.iter().cloned().map(SortField::new).collect())?;
        let rows = converter.convert_columns(batch.columns())?;
        Ok(Self {
            columns: schema.fields().iter().map(|f| f.name().clone()).collect(),
            types,
            converter,
            keys: rows
                .iter()
                .map(|row| Box::<[u8]>::from(row.as_ref()))
                .collect(),
        })
    }

    /// Which rows of `batch` keep living: those whose key is not deleted. A column the
    /// batch lacks (added to the table after its file was written) reads as null.
    fn live(&self, batch: &RecordBatch) -> Result<BooleanArray> {
        let rows = batch.num_rows();
        let key_columns = self
            .columns
            .iter()
            .zip(&self.types)
            .map(|(name, data_type)| match batch.column_by_name(name) {
                Some(column) if column.data_type() == data_type => Ok(Arc::clone(column)),
                Some(column) => Ok(cast(column, data_type)?),
                None => Ok(new_null_array(data_type, rows)),
            })
            .collect::<Result<Vec<ArrayRef>>>()?;
        let encoded = self.converter.convert_columns(&key_columns)?;
        let mut live = BooleanBufferBuilder::new(rows);
        for row in encoded.iter() {
            live.append(!self.keys.contains(row.as_ref()));
        }
        Ok(BooleanArray::new(live.finish(), None))
    }
}

impl FileDeletes {
    /// Which rows of `batch` survive the equality deletes, or `None` when all do.
    pub(super) fn equality_live(&self, batch: &RecordBatch) -> Result<Option<BooleanArray>> {
        let mut live: Option<BooleanArray> = None;
        for deletes in self.equality.iter().filter(|d| !d.keys.is_empty()) {
            let this = deletes.live(batch)?;
            live = Some(match live {
                Some(live) => and(&live, &this)?,
                None => this,
            });
        }
        Ok(live.filter(|l| l.false_count() > 0))
    }

    /// The columns equality deletes compare, by name, each once.
    pub(super) fn equality_columns(&self) -> impl Iterator<Item = &str> {
        let mut seen = HashSet::new();
        self.equality
            .iter()
            .flat_map(|d| d.columns().iter().map(String::as_str))
            .filter(move |c| seen.insert(*c))
    }
}
