//! The key merge of a union read of a primary-key table (`docs/design.md#union-read`).
//!
//! A bucket's union read combines lake rows (the state as of the seam) with the log range
//! after it (a changelog). The log range is the only part held in memory:
//!
//! ```text
//!   range  [log_from, log_to)          lake snapshot (streamed)
//!   ┌──────────────────────────┐      ┌──────────────────────────┐
//!   │ +I k1 │ -U k2 +U k2 │ -D k3 │   │ k2 │ k3 │ k4 │ k5 │ ...  │
//!   └──────────────────────────┘      └──────────────────────────┘
//!        │ 1. index: key -> last change (k1 live, k2 live, k3 gone)
//!        ▼
//!   2. lake rows whose key is in the index are dropped  -> k4, k5, ...
//!   3. then the live range rows, in log order            -> k1, k2 (newest)
//! ```
//!
//! A key updated in the log range appears once with its newest values, a key deleted in the
//! range appears nowhere, a key untouched since tiering comes from the lake. No sort.
//!
//! The index is built from the whole, unfiltered range: a predicate applied to the log range
//! before indexing would let an older lake version of a key that moved out of the
//! predicate resurrect. Predicates apply to the lake stream (any predicate is exact there,
//! since lake rows are dropped only by key) and to the rows [`LogRangeIndex::live_rows`] emits.

use std::sync::{Arc, OnceLock};

use arrow::array::{Array, AsArray, BooleanArray, Int64Array, RecordBatch};
use arrow::buffer::BooleanBuffer;
use arrow::compute::kernels::aggregate::{max, min};
use arrow::compute::{cast, filter_record_batch, interleave};
use arrow::datatypes::{DataType, Int64Type, Schema};

use crate::change::ChangeType;
use crate::key::{KeyCodec, MapKey};
use crate::{CoreError, Result};

/// The log range of a bucket's changelog, indexed by key.
#[derive(Debug)]
pub struct LogRangeIndex {
    batches: Vec<RecordBatch>,
    changes: Vec<Vec<u8>>,
    last: LastChanges,
    /// The changed keys as plain integers, when the key is one integer column: lake
    /// batches are probed with their column's values, not with encoded keys. Built by
    /// the first probe (a merge that leaves lake rows out by position never probes).
    integers: OnceLock<Option<ChangedIntegers>>,
}

/// Each changed key's last change, `(batch, row)` in the log range.
#[derive(Debug)]
enum LastChanges {
    /// The key is one integer column ([`integer_values`]), keyed by its value: no key is
    /// encoded, and an entry is 16 bytes.
    Integers {
        column: String,
        last: ahash::HashMap<i64, (u32, u32)>,
    },
    /// Keyed by the key encoded by the index's [`KeyCodec`].
    Encoded(ahash::HashMap<MapKey, (u32, u32)>),
}

impl LastChanges {
    /// Keyed by value when `codec`'s key is one column that `first` (the log range's first
    /// batch) holds as integers.
    fn for_range(codec: &KeyCodec, first: Option<&RecordBatch>) -> Self {
        match (codec.columns(), first) {
            ([column], Some(first)) if integer_values(first, column).is_some() => Self::Integers {
                column: column.clone(),
                last: ahash::HashMap::default(),
            },
            _ => Self::Encoded(ahash::HashMap::default()),
        }
    }

    /// Records the rows of range batch `b` as the last changes of their keys.
    fn add(&mut self, codec: &KeyCodec, b: usize, batch: &RecordBatch) -> Result<()> {
        let b = b as u32;
        match self {
            Self::Integers { column, last } => {
                let values = integer_values(batch, column).ok_or_else(|| {
                    CoreError::InvalidRequest(format!(
                        "key column {column} of a log range batch is not an integer column without nulls"
                    ))
                })?;
                last.reserve(values.len());
                for (row, &key) in values.values().iter().enumerate() {
                    last.insert(key, (b, row as u32));
                }
            }
            Self::Encoded(last) => {
                let keys = codec.encode(batch)?;
                last.reserve(keys.num_rows());
                for (row, key) in keys.iter().enumerate() {
                    last.insert(MapKey::from_slice(key.as_ref()), (b, row as u32));
                }
            }
        }
        Ok(())
    }

    fn len(&self) -> usize {
        match self {
            Self::Integers { last, .. } => last.len(),
            Self::Encoded(last) => last.len(),
        }
    }

    /// Every changed key's last change, in no order.
    fn positions(&self) -> Box<dyn Iterator<Item = (usize, usize)> + '_> {
        let at = |&(b, row): &(u32, u32)| (b as usize, row as usize);
        match self {
            Self::Integers { last, .. } => Box::new(last.values().map(at)),
            Self::Encoded(last) => Box::new(last.values().map(at)),
        }
    }
}

impl LogRangeIndex {
    /// Indexes the log range: `batches` in log order (all in the read schema, which holds the
    /// key columns), each with its change vector.
    pub fn new(codec: &KeyCodec, range: Vec<(RecordBatch, Vec<u8>)>) -> Result<Self> {
        let mut index = Self::empty(codec);
        for (batch, changes) in range {
            index.push(codec, batch, changes)?;
        }
        Ok(index)
    }

    /// The index of an empty range, to [`Self::push`] its batches into.
    pub fn empty(codec: &KeyCodec) -> Self {
        Self {
            batches: Vec::new(),
            changes: Vec::new(),
            last: LastChanges::for_range(codec, None),
            integers: OnceLock::new(),
        }
    }

    /// Adds the next batch of the log range (in the schema of the ones before it), with its
    /// change vector: a log range indexed batch by batch is indexed as if all at once.
    pub fn push(&mut self, codec: &KeyCodec, batch: RecordBatch, changes: Vec<u8>) -> Result<()> {
        if changes.len() != batch.num_rows() {
            return Err(CoreError::InvalidRequest(format!(
                "a log range batch of {} rows has {} change types",
                batch.num_rows(),
                changes.len()
            )));
        }
        ChangeType::decode_vector(&changes)?;
        if self.batches.is_empty() {
            // The first batch says whether its key folds by value.
            self.last = LastChanges::for_range(codec, Some(&batch));
        }
        self.last.add(codec, self.batches.len(), &batch)?;
        self.batches.push(batch);
        self.changes.push(changes);
        // A probe built before this batch would miss its keys.
        self.integers = OnceLock::new();
        Ok(())
    }

    /// Whether the log range changed no key.
    pub fn is_empty(&self) -> bool {
        self.last.len() == 0
    }

    /// Keys the log range changed.
    pub fn len(&self) -> usize {
        self.last.len()
    }

    /// The keys the log range changed, encoded by `codec` (the index's), in no order.
    pub fn changed_keys(&self, codec: &KeyCodec) -> Result<Vec<MapKey>> {
        let column = match &self.last {
            LastChanges::Encoded(last) => return Ok(last.keys().cloned().collect()),
            LastChanges::Integers { column, .. } => column,
        };
        let Some(first) = self.batches.first() else {
            return Ok(Vec::new());
        };
        let field = Arc::new(first.schema().field_with_name(column)?.clone());
        let arrays = self
            .batches
            .iter()
            .map(|batch| batch.column_by_name(column).map(AsRef::as_ref))
            .collect::<Option<Vec<&dyn Array>>>()
            .ok_or_else(|| {
                CoreError::InvalidRequest(format!("a log range without key {column}"))
            })?;
        let positions: Vec<(usize, usize)> = self.last.positions().collect();
        let keys = interleave(&arrays, &positions)?;
        let keys = RecordBatch::try_new(Arc::new(Schema::new(vec![field])), vec![keys])?;
        let keys = codec.encode(&keys)?;
        Ok(keys
            .iter()
            .map(|key| MapKey::from_slice(key.as_ref()))
            .collect())
    }

    /// Step 2: the rows of a lake batch whose key the log range did not change.
    pub fn filter_lake(&self, codec: &KeyCodec, lake: &RecordBatch) -> Result<RecordBatch> {
        if self.is_empty() || lake.num_rows() == 0 {
            return Ok(lake.clone());
        }
        let probed = self
            .changed_integers()
            .and_then(|integers| integers.unchanged(lake));
        let keep = match (probed, &self.last) {
            (Some(keep), _) => keep,
            (None, LastChanges::Encoded(last)) => {
                let keys = codec.encode(lake)?;
                BooleanBuffer::collect_bool(keys.num_rows(), |row| {
                    !last.contains_key(keys.row(row).as_ref())
                })
            }
            (None, LastChanges::Integers { column, .. }) => {
                return Err(CoreError::InvalidRequest(format!(
                    "key column {column} of a lake batch is not an integer column without nulls"
                )));
            }
        };
        if keep.count_set_bits() == lake.num_rows() {
            return Ok(lake.clone());
        }
        Ok(filter_record_batch(lake, &BooleanArray::new(keep, None))?)
    }

    /// Step 3: the live rows of the log range, in log order: for each key its last change, when
    /// that change is `+I` or `+U`. One batch per range batch that keeps any row.
    pub fn live_rows(&self) -> Result<Vec<RecordBatch>> {
        let mut keep: Vec<Vec<bool>> = self
            .batches
            .iter()
            .map(|batch| vec![false; batch.num_rows()])
            .collect();
        for (b, row) in self.last.positions() {
            // The change vectors were checked when the index was built.
            let change = ChangeType::from_byte(self.changes[b][row]);
            keep[b][row] = change.is_ok_and(ChangeType::is_live);
        }
        let mut live = Vec::new();
        for (batch, keep) in self.batches.iter().zip(keep) {
            let rows = filter_record_batch(batch, &BooleanArray::from(keep))?;
            if rows.num_rows() > 0 {
                live.push(rows);
            }
        }
        Ok(live)
    }

    /// The changed keys as integers, when the key is one integer column (built once).
    fn changed_integers(&self) -> Option<&ChangedIntegers> {
        self.integers
            .get_or_init(|| match &self.last {
                LastChanges::Integers { column, last } => ChangedIntegers::of(column, last),
                LastChanges::Encoded(_) => None,
            })
            .as_ref()
    }
}

/// The keys a log range changed, when the primary key is one integer column: a lake row is
/// probed with its key column's value (a bit of a bitmap over the keys' range when they
/// are dense enough, else a hash set), with no key encoded; a lake batch whose values all
/// lie outside the keys' range is kept whole without a probe.
#[derive(Debug)]
struct ChangedIntegers {
    column: String,
    min: i64,
    max: i64,
    changed: IntegerSet,
}

#[derive(Debug)]
enum IntegerSet {
    /// Bit `key - min` is set for each changed key.
    Bitmap(Vec<u64>),
    Hashed(ahash::HashSet<i64>),
}

/// Bits of a bitmap over the changed keys' range, at most: 128 per changed key and 8 Mbit
/// (1 MiB) more, so a bitmap is never much larger than the hash set it replaces.
fn bitmap_allowed(keys: usize, span: u64) -> bool {
    span <= (keys as u64).saturating_mul(128).saturating_add(1 << 23)
}

impl ChangedIntegers {
    /// The changed keys of a log range keyed by integer column `column` (`last`'s keys).
    fn of(column: &str, last: &ahash::HashMap<i64, (u32, u32)>) -> Option<Self> {
        let keys: ahash::HashSet<i64> = last.keys().copied().collect();
        let (Some(&min), Some(&max)) = (keys.iter().min(), keys.iter().max()) else {
            return None;
        };
        let span = max.abs_diff(min).saturating_add(1);
        let changed = match bitmap_allowed(keys.len(), span) {
            true => {
                let mut bits = vec![0u64; span.div_ceil(64) as usize];
                for key in &keys {
                    let bit = key.abs_diff(min);
                    bits[(bit / 64) as usize] |= 1 << (bit % 64);
                }
                IntegerSet::Bitmap(bits)
            }
            false => IntegerSet::Hashed(keys),
        };
        Some(Self {
            column: column.to_string(),
            min,
            max,
            changed,
        })
    }

    /// Which rows of a lake batch keep their key unchanged; `None` when the batch's key
    /// column is not one this probe can read (the caller then encodes the keys).
    fn unchanged(&self, lake: &RecordBatch) -> Option<BooleanBuffer> {
        let values = integer_values(lake, &self.column)?;
        let (low, high) = (min(&values)?, max(&values)?);
        let values = values.values();
        if high < self.min || low > self.max {
            return Some(BooleanBuffer::new_set(values.len()));
        }
        let changed = |key: i64| {
            (self.min..=self.max).contains(&key)
                && match &self.changed {
                    IntegerSet::Bitmap(bits) => {
                        let bit = key.abs_diff(self.min);
                        bits[(bit / 64) as usize] & (1 << (bit % 64)) != 0
                    }
                    IntegerSet::Hashed(keys) => keys.contains(&key),
                }
        };
        Some(BooleanBuffer::collect_bool(values.len(), |row| {
            !changed(values[row])
        }))
    }
}

/// The column `name` of `batch` as 64-bit integers, when it is an integer column that
/// converts losslessly and holds no null.
fn integer_values(batch: &RecordBatch, name: &str) -> Option<Int64Array> {
    let column = batch.column_by_name(name)?;
    let convertible = matches!(
        column.data_type(),
        DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::UInt8
            | DataType::UInt16
            | DataType::UInt32
    );
    if !convertible || column.null_count() > 0 {
        return None;
    }
    // Widening an integer type to Int64 cannot fail.
    let values = cast(column, &DataType::Int64).ok()?;
    Some(values.as_primitive::<Int64Type>().clone())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use arrow::array::{ArrayRef, AsArray, Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Int64Type, Schema};

    use super::*;
    use crate::options::TableOptions;
    use crate::table::{TableDescriptor, TablePath};

    /// One changelog batch of the test table: `(key, value)` rows and their change types.
    type Change<'a> = (Vec<(i64, &'a str)>, Vec<u8>);

    const I: u8 = ChangeType::Insert as u8;
    const UB: u8 = ChangeType::UpdateBefore as u8;
    const UA: u8 = ChangeType::UpdateAfter as u8;
    const D: u8 = ChangeType::Delete as u8;

    /// The test table: key `k` (an integer column, which the index keys by value).
    fn table() -> TableDescriptor {
        table_keyed_by(DataType::Int64)
    }

    /// The test table with key `k` of type `key` (rows are written and read back as
    /// `i64`): a `Utf8` key is indexed by its encoding.
    fn table_keyed_by(key: DataType) -> TableDescriptor {
        let schema = Schema::new(vec![
            Field::new("k", key, false),
            Field::new("v", DataType::Utf8, true),
        ]);
        TableDescriptor::new(
            TablePath::new("db", "t"),
            schema,
            vec!["k".into()],
            vec![],
            TableOptions::default(),
        )
        .unwrap()
    }

    fn batch(table: &TableDescriptor, rows: &[(i64, &str)]) -> RecordBatch {
        let keys = Int64Array::from_iter_values(rows.iter().map(|r| r.0));
        let key_type = table.schema().field(0).data_type();
        let columns: Vec<ArrayRef> = vec![
            cast(&keys, key_type).unwrap(),
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.1))),
        ];
        RecordBatch::try_new(Arc::clone(table.schema()), columns).unwrap()
    }

    fn rows(batches: &[RecordBatch]) -> Vec<(i64, String)> {
        batches
            .iter()
            .flat_map(|b| {
                let k = cast(b.column(0), &DataType::Int64).unwrap();
                let k = k.as_primitive::<Int64Type>().clone();
                let v = b.column(1).as_string::<i32>().clone();
                (0..b.num_rows()).map(move |i| (k.value(i), v.value(i).to_string()))
            })
            .collect()
    }

    fn union(
        table: &TableDescriptor,
        lake: &[(i64, &str)],
        range: Vec<Change<'_>>,
    ) -> Vec<(i64, String)> {
        let codec = KeyCodec::new(table).unwrap();
        let lake = batch(table, lake);
        // Indexed batch by batch, probed in between: a probe built before a batch must
        // not miss its keys.
        let mut index = LogRangeIndex::empty(&codec);
        for (rows, changes) in range {
            index.filter_lake(&codec, &lake).unwrap();
            index.push(&codec, batch(table, &rows), changes).unwrap();
        }
        let mut out = vec![index.filter_lake(&codec, &lake).unwrap()];
        out.extend(index.live_rows().unwrap());
        rows(&out)
    }

    /// The keys the index of `range` says were changed, sorted.
    fn changed_keys(table: &TableDescriptor, range: Vec<Change<'_>>) -> Vec<MapKey> {
        let codec = KeyCodec::new(table).unwrap();
        let range = range
            .into_iter()
            .map(|(r, c)| (batch(table, &r), c))
            .collect();
        let mut keys = LogRangeIndex::new(&codec, range)
            .unwrap()
            .changed_keys(&codec)
            .unwrap();
        keys.sort();
        keys
    }

    /// Every key of `range`, encoded, each once, sorted.
    fn encoded_keys(table: &TableDescriptor, range: Vec<Change<'_>>) -> Vec<MapKey> {
        let codec = KeyCodec::new(table).unwrap();
        let mut keys: Vec<MapKey> = range
            .iter()
            .flat_map(|(rows, _)| {
                let keys = codec.encode(&batch(table, rows)).unwrap();
                keys.iter()
                    .map(|key| MapKey::from_slice(key.as_ref()))
                    .collect::<Vec<_>>()
            })
            .collect();
        keys.sort();
        keys.dedup();
        keys
    }

    #[test]
    fn an_empty_lake_batch_is_kept_empty_whatever_the_key() {
        for key in [DataType::Int64, DataType::Utf8] {
            let t = table_keyed_by(key);
            let range = vec![(vec![(1, "a")], vec![I])];
            assert_eq!(union(&t, &[], range), vec![(1, "a".to_string())]);
        }
    }

    #[test]
    fn updated_deleted_untouched_and_new_keys() {
        let t = table();
        let lake = [(1, "a"), (2, "b"), (3, "c"), (4, "d")];
        let range = vec![
            (vec![(5, "e"), (2, "b"), (2, "B")], vec![I, UB, UA]),
            (vec![(3, "c")], vec![D]),
            (
                vec![(5, "e"), (5, "E"), (4, "d"), (4, "D")],
                vec![UB, UA, UB, UA],
            ),
        ];
        assert_eq!(
            union(&t, &lake, range),
            vec![
                (1, "a".into()),
                (2, "B".into()),
                (5, "E".into()),
                (4, "D".into())
            ]
        );
    }

    #[test]
    fn deleted_then_reinserted_and_inserted_then_deleted() {
        let t = table();
        let range = vec![
            (vec![(1, "a")], vec![D]),
            (vec![(1, "again")], vec![I]),
            (vec![(9, "x")], vec![I]),
            (vec![(9, "x")], vec![D]),
        ];
        assert_eq!(
            union(&t, &[(1, "a"), (2, "b")], range),
            vec![(2, "b".into()), (1, "again".into())]
        );
    }

    #[test]
    fn an_empty_tail_keeps_the_lake_and_bad_vectors_are_errors() {
        let t = table();
        assert_eq!(union(&t, &[(1, "a")], vec![]), vec![(1, "a".into())]);
        let codec = KeyCodec::new(&t).unwrap();
        let short = vec![(batch(&t, &[(1, "a"), (2, "b")]), vec![I])];
        assert!(LogRangeIndex::new(&codec, short).is_err());
        let unknown = vec![(batch(&t, &[(1, "a")]), vec![9])];
        assert!(LogRangeIndex::new(&codec, unknown).is_err());
    }

    #[test]
    fn integer_keys_are_probed_by_bitmap_when_dense_and_hashed_when_sparse() {
        let t = table();
        let codec = KeyCodec::new(&t).unwrap();
        // Whether the keys are probed by bitmap (else by hash set).
        let by_bitmap = |keys: &[i64]| {
            let rows: Vec<(i64, &str)> = keys.iter().map(|&k| (k, "x")).collect();
            let range = vec![(batch(&t, &rows), vec![I; rows.len()])];
            let index = LogRangeIndex::new(&codec, range).unwrap();
            let integers = index.changed_integers().unwrap();
            matches!(integers.changed, IntegerSet::Bitmap(_))
        };
        assert!(by_bitmap(&[1, 5, 1000]));
        assert!(!by_bitmap(&[1, 1 << 40]));
        assert!(!by_bitmap(&[i64::MIN, i64::MAX]));
    }

    /// Random changelogs against a BTreeMap: lake = state at the seam, range = changes after.
    /// Keys are drawn densely (a bitmap probes them) and spread over the whole `i64` range
    /// (a hash set does).
    #[test]
    fn random_changelogs_fold_like_a_map() {
        for key in [DataType::Int64, DataType::Utf8] {
            for spread in [1, i64::MAX / 16] {
                random_changelogs(&table_keyed_by(key.clone()), spread);
            }
        }
    }

    fn random_changelogs(t: &TableDescriptor, spread: i64) {
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for _ in 0..200 {
            let mut state: BTreeMap<i64, String> = BTreeMap::new();
            let mut range = Vec::new();
            let mut lake = None;
            for step in 0..40 {
                if step == 20 {
                    lake = Some(state.clone());
                }
                let key = (next(10) as i64 - 5) * spread;
                let value = format!("v{}", next(100));
                let (rows, changes) = match (state.get(&key).cloned(), next(3)) {
                    (Some(old), 0) => {
                        state.remove(&key);
                        (vec![(key, old)], vec![D])
                    }
                    (Some(old), _) => {
                        state.insert(key, value.clone());
                        (vec![(key, old), (key, value)], vec![UB, UA])
                    }
                    (None, _) => {
                        state.insert(key, value.clone());
                        (vec![(key, value)], vec![I])
                    }
                };
                if step >= 20 {
                    range.push((rows, changes));
                }
            }
            let lake: Vec<(i64, String)> = lake.unwrap().into_iter().collect();
            let lake_rows: Vec<(i64, &str)> = lake.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let range: Vec<Change<'_>> = range
                .iter()
                .map(|(rows, c): &(Vec<(i64, String)>, Vec<u8>)| {
                    (
                        rows.iter().map(|(k, v)| (*k, v.as_str())).collect(),
                        c.clone(),
                    )
                })
                .collect();
            let mut merged = union(t, &lake_rows, range.clone());
            merged.sort();
            assert_eq!(merged, state.into_iter().collect::<Vec<_>>());
            assert_eq!(changed_keys(t, range.clone()), encoded_keys(t, range));
        }
    }
}
