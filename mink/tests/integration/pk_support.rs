//! A primary-key table for tests, its rows as plain values, and folding a changelog; the
//! same table with a lake and a second non-key column.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Int32Array, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Int32Type, Int64Type, Schema};
use mink_client::MinkClient;
use mink_core::change::ChangeType;
use mink_core::options::TableOptions;
use mink_core::protocol::BucketId;
use mink_core::table::{TableDescriptor, TablePath};

use crate::support::lake_options;

/// `(dt, id, seq)`.
pub(crate) type Key = (String, i64, i32);
/// The state of a primary-key table: key -> value column.
pub(crate) type Model = BTreeMap<Key, Option<String>>;

/// `pk(dt STRING, id BIGINT, seq INT, v STRING, PRIMARY KEY (dt, id, seq))`, partitioned by
/// dt, bucketed by id.
pub(crate) fn pk_table(name: &str, buckets: u32) -> TableDescriptor {
    let schema = Schema::new(vec![
        Field::new("dt", DataType::Utf8, false),
        Field::new("id", DataType::Int64, false),
        Field::new("seq", DataType::Int32, false),
        Field::new("v", DataType::Utf8, true),
    ]);
    let options = TableOptions {
        bucket_num: buckets,
        bucket_key: Some(vec!["id".into()]),
        ..TableOptions::default()
    };
    let key = ["dt", "id", "seq"].map(String::from).to_vec();
    TableDescriptor::new(
        TablePath::new("test", name),
        schema,
        key,
        vec!["dt".into()],
        options,
    )
    .expect("table")
}

/// The non-key columns of [`pk_lake_table`]: `(v, n)`.
pub(crate) type Cells = (Option<String>, Option<i64>);
/// The state of a [`pk_lake_table`]: key -> non-key columns.
pub(crate) type State = BTreeMap<Key, Cells>;

/// `pk(dt STRING, id BIGINT, seq INT, v STRING, n BIGINT, PRIMARY KEY (dt, id, seq))`,
/// partitioned by dt, bucketed by id, with a lake whose rounds the test runs (the
/// service's first one would come in an hour).
pub(crate) fn pk_lake_table(name: &str, buckets: u32) -> TableDescriptor {
    let schema = Schema::new(vec![
        Field::new("dt", DataType::Utf8, false),
        Field::new("id", DataType::Int64, false),
        Field::new("seq", DataType::Int32, false),
        Field::new("v", DataType::Utf8, true),
        Field::new("n", DataType::Int64, true),
    ]);
    let options = TableOptions {
        bucket_num: buckets,
        bucket_key: Some(vec!["id".into()]),
        ..lake_options()
    };
    let key = ["dt", "id", "seq"].map(String::from).to_vec();
    TableDescriptor::new(
        TablePath::new("test", name),
        schema,
        key,
        vec!["dt".into()],
        options,
    )
    .expect("table")
}

/// Whole rows of a [`pk_lake_table`].
pub(crate) fn lake_rows(table: &TableDescriptor, rows: &[(Key, Cells)]) -> RecordBatch {
    let keyed: Vec<(Key, Option<String>)> = rows
        .iter()
        .map(|(key, (v, _))| (key.clone(), v.clone()))
        .collect();
    let mut columns = pk_rows(&pk_table("shape", 1), &keyed).columns().to_vec();
    columns.push(Arc::new(Int64Array::from(
        rows.iter().map(|(_, (_, n))| *n).collect::<Vec<_>>(),
    )));
    RecordBatch::try_new(Arc::clone(table.schema()), columns).expect("rows")
}

/// The rows of a batch of a [`pk_lake_table`]'s columns.
pub(crate) fn lake_values(batch: &RecordBatch) -> Vec<(Key, Cells)> {
    let n = batch
        .column_by_name("n")
        .expect("n")
        .as_primitive::<Int64Type>();
    values(batch)
        .into_iter()
        .enumerate()
        .map(|(i, (key, v))| (key, (v, n.is_valid(i).then(|| n.value(i)))))
        .collect()
}

/// Whole rows in the table's schema.
pub(crate) fn pk_rows(table: &TableDescriptor, rows: &[(Key, Option<String>)]) -> RecordBatch {
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|((dt, ..), _)| dt),
        )),
        Arc::new(Int64Array::from_iter_values(
            rows.iter().map(|((_, id, _), _)| *id),
        )),
        Arc::new(Int32Array::from_iter_values(
            rows.iter().map(|((.., seq), _)| *seq),
        )),
        Arc::new(StringArray::from(
            rows.iter().map(|(_, v)| v.clone()).collect::<Vec<_>>(),
        )),
    ];
    RecordBatch::try_new(Arc::clone(table.schema()), columns).expect("rows")
}

/// Key columns only (for deletes and lookups).
pub(crate) fn pk_keys(keys: &[Key]) -> RecordBatch {
    let columns: Vec<(&str, ArrayRef)> = vec![
        (
            "dt",
            Arc::new(StringArray::from_iter_values(keys.iter().map(|k| &k.0))),
        ),
        (
            "id",
            Arc::new(Int64Array::from_iter_values(keys.iter().map(|k| k.1))),
        ),
        (
            "seq",
            Arc::new(Int32Array::from_iter_values(keys.iter().map(|k| k.2))),
        ),
    ];
    let batch = RecordBatch::try_from_iter(columns).expect("keys");
    let fields: Vec<Field> = batch
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone().with_nullable(false))
        .collect();
    RecordBatch::try_new(Arc::new(Schema::new(fields)), batch.columns().to_vec()).expect("keys")
}

/// The rows of a batch of the table's schema.
pub(crate) fn values(batch: &RecordBatch) -> Vec<(Key, Option<String>)> {
    let dt = batch.column_by_name("dt").expect("dt").as_string::<i32>();
    let id = batch
        .column_by_name("id")
        .expect("id")
        .as_primitive::<Int64Type>();
    let seq = batch
        .column_by_name("seq")
        .expect("seq")
        .as_primitive::<Int32Type>();
    let v = batch.column_by_name("v").expect("v").as_string::<i32>();
    (0..batch.num_rows())
        .map(|i| {
            let key = (dt.value(i).to_string(), id.value(i), seq.value(i));
            (key, v.is_valid(i).then(|| v.value(i).to_string()))
        })
        .collect()
}

/// Folds a bucket's changelog from `from` into `state`, checking each `-U` and `-D`
/// carries the row it replaces.
pub(crate) async fn fold_changelog(
    client: &MinkClient,
    bucket: &BucketId,
    from: i64,
    state: &mut Model,
) -> i64 {
    let mut offset = from;
    loop {
        let answer = client.scan(bucket, offset, 0, &[]).await.expect("scan");
        for read in &answer.batches {
            let changes = read
                .metadata
                .changes
                .as_ref()
                .expect("a primary-key changelog has change types");
            let skip = (offset - read.metadata.base_offset).max(0) as usize;
            for ((key, value), change) in values(&read.batch).into_iter().zip(changes).skip(skip) {
                match ChangeType::from_byte(*change).expect("change type") {
                    ChangeType::Insert => {
                        assert!(
                            !state.contains_key(&key),
                            "+I of a key that exists: {key:?}"
                        );
                        state.insert(key, value);
                    }
                    ChangeType::UpdateAfter => {
                        state.insert(key, value);
                    }
                    ChangeType::UpdateBefore | ChangeType::Delete => {
                        assert_eq!(
                            state.remove(&key),
                            Some(value),
                            "-U/-D carries the replaced row of {key:?}"
                        );
                    }
                }
            }
        }
        if answer.next_offset >= answer.high_watermark {
            return answer.high_watermark;
        }
        offset = answer.next_offset;
    }
}

/// Deletes about a quarter of `state`'s keys, drawn with `rng`, from the table and from
/// `state`.
pub(crate) async fn delete_some_keys<V>(
    client: &MinkClient,
    table: &TableDescriptor,
    state: &mut BTreeMap<Key, V>,
    rng: &mut impl rand::Rng,
) {
    let keys: Vec<Key> = state
        .keys()
        .filter(|_| rng.random_ratio(1, 4))
        .cloned()
        .collect();
    if keys.is_empty() {
        return;
    }
    client.delete(table, &pk_keys(&keys)).await.expect("delete");
    for key in &keys {
        state.remove(key);
    }
}
