//! A split's deletes, for a scan that is not mink's own.
//!
//! DataFusion's Parquet scan skips rows it is told to skip (a `ParquetAccessPlan` per
//! file); it knows nothing of Iceberg's delete files. [`split_position_deletes`] reads the
//! split's position-delete files once, at planning time, and hands back each data file's
//! deleted positions, which the SQL engine turns into row selections. [`EqualityFilter`]
//! loads the equality-delete files of a group of data files and says which rows of a
//! batch they leave.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use arrow::array::{BooleanArray, RecordBatch};
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::StreamWriter;
use futures::stream::{self, StreamExt, TryStreamExt};

use super::delete_files::{EqualityDeletes, FileDeletes};
use super::{DeleteKind, LakeDeleteFile, LakeSplit, load_positions};
use crate::error::{LakeError, Result};
use crate::storage::LakeStorage;

/// How many position-delete files are read at once.
const CONCURRENT_LOADS: usize = 8;

/// Positions a [`PositionDeleteCache`] holds at most (8 bytes each: 64 MiB).
const CACHED_POSITIONS: usize = 8 << 20;

/// What a position-delete file deletes: data file -> positions, ascending.
type Deleted = HashMap<String, Vec<u64>>;

/// Position-delete files already read, by location: the lake never rewrites a file, so a
/// statement after the first finds each one here instead of reading it again. Bounded
/// (by default [`CACHED_POSITIONS`]): when a file would not fit, the cache starts over; a
/// file larger than the whole cache is not kept.
#[derive(Debug)]
pub struct PositionDeleteCache {
    files: Mutex<CachedFiles>,
    /// Positions held at most.
    capacity: usize,
}

impl Default for PositionDeleteCache {
    fn default() -> Self {
        Self::with_capacity(CACHED_POSITIONS)
    }
}

#[derive(Debug, Default)]
struct CachedFiles {
    by_path: HashMap<String, Arc<Deleted>>,
    positions: usize,
}

impl PositionDeleteCache {
    fn with_capacity(capacity: usize) -> Self {
        Self {
            files: Mutex::default(),
            capacity,
        }
    }

    fn get(&self, path: &str) -> Option<Arc<Deleted>> {
        let files = self.files.lock().unwrap_or_else(PoisonError::into_inner);
        files.by_path.get(path).cloned()
    }

    fn put(&self, path: &str, deleted: Arc<Deleted>) {
        let positions: usize = deleted.values().map(Vec::len).sum();
        if positions > self.capacity {
            return;
        }
        let mut files = self.files.lock().unwrap_or_else(PoisonError::into_inner);
        if files.positions + positions > self.capacity {
            *files = CachedFiles::default();
        }
        files.positions += positions;
        files.by_path.insert(path.to_string(), deleted);
    }
}

/// The deleted positions (ascending, without duplicates) of every data file of `split`
/// that has any, from the position-delete files each one lists and its
/// [`super::LakeFile::replaced_rows`]; each delete file is read
/// once, however many data files it covers, and kept in the storage's
/// [`PositionDeleteCache`] for the next statement. Equality deletes are not read (see
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
    let cache = storage.position_deletes();
    let loads: Vec<_> = listed_by
        .into_values()
        .map(|(delete, data_files)| async move {
            let whole = match cache.get(&delete.path) {
                Some(whole) => whole,
                None => {
                    let whole = Arc::new(load_positions(storage, delete, |_| true).await?);
                    cache.put(&delete.path, Arc::clone(&whole));
                    whole
                }
            };
            Ok::<_, crate::LakeError>((whole, data_files))
        })
        .collect();
    let loaded: Vec<(Arc<Deleted>, HashSet<&str>)> = stream::iter(loads)
        .buffer_unordered(CONCURRENT_LOADS)
        .try_collect()
        .await?;
    let mut deleted: HashMap<String, Vec<u64>> = HashMap::new();
    let mut merged: HashSet<String> = HashSet::new();
    for (whole, data_files) in &loaded {
        // Only the data files that list the delete file: the rest are not the split's, or
        // came after it.
        for (path, positions) in whole
            .iter()
            .filter(|(p, _)| data_files.contains(p.as_str()))
        {
            match deleted.get_mut(path) {
                Some(earlier) => {
                    earlier.extend_from_slice(positions);
                    merged.insert(path.clone());
                }
                None => {
                    deleted.insert(path.clone(), positions.clone());
                }
            }
        }
    }
    for file in split.files.iter().filter(|f| !f.replaced_rows.is_empty()) {
        let positions = deleted.entry(file.path.clone()).or_default();
        positions.extend_from_slice(&file.replaced_rows);
        merged.insert(file.path.clone());
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

    /// The loaded deletes as bytes, to rebuild the filter in another process of the
    /// same build ([`EqualityFilter::from_bytes`]): per delete file, its keys as an Arrow
    /// IPC stream of the equality columns, after the stream's length (8 bytes, little
    /// endian).
    ///
    /// # Errors
    /// The keys cannot be decoded or written as Arrow.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut bytes = Vec::new();
        for deletes in &self.0.equality {
            let batch = deletes.to_batch()?;
            let mut stream = StreamWriter::try_new(Vec::new(), batch.schema_ref())?;
            stream.write(&batch)?;
            let stream = stream.into_inner()?;
            bytes.extend_from_slice(&(stream.len() as u64).to_le_bytes());
            bytes.extend_from_slice(&stream);
        }
        Ok(bytes)
    }

    /// The filter [`EqualityFilter::to_bytes`] wrote.
    ///
    /// # Errors
    /// Bytes that are not such a filter.
    pub fn from_bytes(mut bytes: &[u8]) -> Result<Self> {
        let mut equality = Vec::new();
        while !bytes.is_empty() {
            let (length, rest) = bytes.split_first_chunk::<8>().ok_or_else(truncated)?;
            let length = usize::try_from(u64::from_le_bytes(*length)).map_err(|_| truncated())?;
            let stream = rest.get(..length).ok_or_else(truncated)?;
            bytes = &rest[length..];
            let reader = StreamReader::try_new(stream, None)?;
            let batches = reader.collect::<std::result::Result<Vec<_>, _>>()?;
            let batch = match batches.as_slice() {
                [batch] => batch,
                _ => return Err(truncated()),
            };
            equality.push(Arc::new(EqualityDeletes::from_batch(batch)?));
        }
        Ok(Self(FileDeletes {
            positions: Vec::new(),
            equality,
        }))
    }

    /// Which rows of `batch` no delete names; `None` when every row lives.
    ///
    /// # Errors
    /// A column cannot be cast to its type in a delete file.
    pub fn live(&self, batch: &RecordBatch) -> Result<Option<BooleanArray>> {
        self.0.equality_live(batch)
    }
}

/// Equality deletes in bytes that do not read back.
fn truncated() -> LakeError {
    LakeError::Core(mink_core::CoreError::InvalidRequest(
        "equality deletes in bytes that are not a whole filter".into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deleted(file: &str, positions: usize) -> Arc<Deleted> {
        Arc::new(HashMap::from([(
            file.to_string(),
            (0..positions as u64).collect(),
        )]))
    }

    #[test]
    fn the_cache_keeps_files_until_one_does_not_fit_and_never_one_too_large() {
        let cache = PositionDeleteCache::with_capacity(10);
        cache.put("a", deleted("data-a", 4));
        cache.put("b", deleted("data-b", 4));
        assert!(cache.get("a").is_some() && cache.get("b").is_some());
        cache.put("c", deleted("data-c", 4));
        assert!(
            cache.get("a").is_none() && cache.get("b").is_none(),
            "started over"
        );
        assert_eq!(cache.get("c").unwrap()["data-c"].len(), 4);
        cache.put("huge", deleted("data-h", 11));
        assert!(cache.get("huge").is_none());
        assert!(cache.get("c").is_some(), "a file too large leaves the rest");
    }
}
