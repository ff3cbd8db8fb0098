//! A primary-key table for tests, its rows as plain values, and folding a changelog.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Int32Array, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Int32Type, Int64Type, Schema};
use mink_client::MinkClient;
use mink_core::change::ChangeType;
use mink_core::options::TableOptions;
use mink_core::protocol::BucketId;
use mink_core::table::{TableDescriptor, TablePath};

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
