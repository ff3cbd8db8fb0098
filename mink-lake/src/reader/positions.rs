//! A split's deletes, for a scan that is not mink's own.
//!
//! DataFusion's Parquet scan skips rows it is told to skip (a `ParquetAccessPlan` per
//! file); it knows nothing of Iceberg's delete files. [`split_position_deletes`] reads the
//! split's position-delete files once, at planning time, and hands back each data file's
//! deleted positions, which the SQL engine turns into row selections. [`EqualityFilter`]
//! loads the equality-delete files of a group of data files and says which rows of a
//! batch they leave.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use arrow::array::{BooleanArray, RecordBatch};
use futures::stream::{self, StreamExt, TryStreamExt};

use super::delete_files::{EqualityDeletes, FileDeletes};
use super::{DeleteKind, LakeDeleteFile, LakeSplit, load_positions};
use crate::error::Result;
use crate::storage::LakeStorage;

/// How many position-delete files are read at once.
const CONCURRENT_LOADS: usize = 8;

/// The deleted positions (ascending, without duplicates) of every data file of `split`
/// that has any, from the position-delete files each one lists; each delete file is read
/// once, however many data files it covers. Equality deletes are not read (see
/// [`LakeSplit::has_equality_deletes`]).
///
/// # Errors
/// A delete file could not be read or is not a position-delete file.
pub async fn split_position_deletes(
    storage: &LakeStorage,
    split: &LakeSplit,
) -> Result<HashMap<String, Vec<u64>>> {
    // Each position-delete file, with the data files that list it.
    let mut listed_by: HashMap<&str, (&LakeDeleteFile, HashSet<&str>)> = HashMap::new();
    for file in &split.files {
        for delete in &file.deletes {
            if delete.kind == DeleteKind::Positions {
                listed_by
                    .entry(delete.path.as_str())
                    .or_insert_with(|| (delete, HashSet::new()))
                    .1
                    .insert(file.path.as_str());
            }
        }
    }
    let loads: Vec<_> = listed_by
        .into_values()
        .map(|(delete, data_files)| async move {
            load_positions(storage, delete, |path| data_files.contains(path)).await
        })
        .collect();
    let loaded: Vec<HashMap<String, Vec<u64>>> = stream::iter(loads)
        .buffer_unordered(CONCURRENT_LOADS)
        .try_collect()
        .await?;
    let mut deleted: HashMap<String, Vec<u64>> = HashMap::new();
    let mut merged: HashSet<String> = HashSet::new();
    for by_file in loaded {
        for (path, positions) in by_file {
            match deleted.get_mut(&path) {
                Some(earlier) => {
                    earlier.extend(positions);
                    merged.insert(path);
                }
                None => {
                    deleted.insert(path, positions);
                }
            }
        }
    }
    for path in merged {
        if let Some(positions) = deleted.get_mut(&path) {
            positions.sort_unstable();
            positions.dedup();
        }
    }
    Ok(deleted)
}

/// The equality deletes that apply to some data files, loaded: the keys each delete file
/// names, arrow-row encoded, in hash sets (nulls equal to nulls, as Iceberg specifies).
#[derive(Debug)]
pub struct EqualityFilter(FileDeletes);

impl EqualityFilter {
    /// Loads the equality-delete files among `deletes` (position deletes are left out).
    ///
    /// # Errors
    /// A delete file could not be read or lacks one of its equality columns.
    pub async fn load(storage: &LakeStorage, deletes: &[LakeDeleteFile]) -> Result<Self> {
        let mut equality = Vec::new();
        for delete in deletes {
            if let DeleteKind::Equality { columns } = &delete.kind {
                equality.push(Arc::new(
                    EqualityDeletes::load(storage, delete, columns).await?,
                ));
            }
        }
        Ok(Self(FileDeletes {
            positions: Vec::new(),
            equality,
        }))
    }

    /// The columns the deletes compare, by name, each once: a batch given to
    /// [`EqualityFilter::live`] holds them (a column it lacks reads as null).
    pub fn columns(&self) -> impl Iterator<Item = &str> {
        self.0.equality_columns()
    }

    /// Which rows of `batch` no delete names; `None` when every row lives.
    ///
    /// # Errors
    /// A column cannot be cast to its type in a delete file.
    pub fn live(&self, batch: &RecordBatch) -> Result<Option<BooleanArray>> {
        self.0.equality_live(batch)
    }
}
