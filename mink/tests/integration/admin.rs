//! Table admin over Flight actions, partitions created on first write, and schema
//! versions, all surviving a restart.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Int64Type, Schema};
use mink_core::options::TableOptions;
use mink_core::protocol::BucketId;
use mink_core::table::{TableDescriptor, TablePath};
use tonic::Code;

use crate::support::{TestNode, events, events_table};

fn partitioned_table() -> TableDescriptor {
    let schema = Schema::new(vec![
        Field::new("dt", DataType::Utf8, false),
        Field::new("id", DataType::Int64, false),
    ]);
    let options = TableOptions {
        bucket_num: 2,
        bucket_key: Some(vec!["id".into()]),
        ..TableOptions::default()
    };
    TableDescriptor::new(
        TablePath::new("test", "daily"),
        schema,
        vec![],
        vec!["dt".into()],
        options,
    )
    .expect("table")
}

fn daily_rows(table: &TableDescriptor, dt: &str, ids: std::ops::Range<i64>) -> RecordBatch {
    let n = ids.end - ids.start;
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values((0..n).map(|_| dt))),
        Arc::new(Int64Array::from_iter_values(ids)),
    ];
    RecordBatch::try_new(Arc::clone(table.schema()), columns).expect("batch")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_are_created_by_their_first_write_and_persist() {
    let mut node = TestNode::start().await;
    let table = node
        .client
        .create_table(&partitioned_table(), false)
        .await
        .expect("create");
    assert!(
        node.client
            .list_buckets(&table.path)
            .await
            .expect("buckets")
            .is_empty(),
        "no partition before a write"
    );

    let mut rows = daily_rows(&table, "2024-01-01", 0..40);
    rows = arrow::compute::concat_batches(
        table.schema(),
        [&rows, &daily_rows(&table, "2024-01-02", 40..60)],
    )
    .expect("concat");
    node.client.write(&table, &rows).await.expect("write");

    node.restart().await;
    let buckets = node
        .client
        .list_buckets(&table.path)
        .await
        .expect("buckets");
    let partitions: Vec<_> = buckets
        .iter()
        .map(|s| s.bucket.clone().expect("id").partition.expect("partition"))
        .collect();
    assert_eq!(
        partitions,
        [
            "dt=2024-01-01",
            "dt=2024-01-01",
            "dt=2024-01-02",
            "dt=2024-01-02"
        ]
    );
    let mut per_partition = std::collections::BTreeMap::<String, Vec<i64>>::new();
    for status in &buckets {
        let bucket = status.bucket.clone().expect("id");
        let answer = node.client.scan(&bucket, 0, 0, &[1]).await.expect("scan");
        let ids = per_partition
            .entry(bucket.partition.clone().expect("partition"))
            .or_default();
        for read in answer.batches {
            ids.extend_from_slice(read.batch.column(0).as_primitive::<Int64Type>().values());
        }
    }
    for ids in per_partition.values_mut() {
        ids.sort_unstable();
    }
    assert_eq!(per_partition["dt=2024-01-01"], (0..40).collect::<Vec<_>>());
    assert_eq!(per_partition["dt=2024-01-02"], (40..60).collect::<Vec<_>>());

    // A bucket address without a partition, and rows sent to the wrong partition.
    let err = node
        .client
        .append(
            &BucketId::new(&table.path, 0),
            vec![daily_rows(&table, "x", 0..1)],
        )
        .await
        .expect_err("no partition");
    assert_eq!(err.code(), Some(Code::InvalidArgument), "{err}");
    let mut wrong = BucketId::new(&table.path, 0);
    wrong.partition = Some("dt=2024-01-02".into());
    let row_in_bucket_0 = (0..100).find(|i| {
        let batch = daily_rows(&table, "2024-01-01", *i..*i + 1);
        mink_core::routing::row_addresses(&table, &batch)
            .expect("route")
            .buckets
            == Some(vec![0])
    });
    let i = row_in_bucket_0.expect("some id hashes to bucket 0");
    let err = node
        .client
        .append(&wrong, vec![daily_rows(&table, "2024-01-01", i..i + 1)])
        .await
        .expect_err("wrong partition");
    assert!(
        err.to_string()
            .contains("belongs to partition 'dt=2024-01-01'"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_list_describe_add_column_drop() {
    let mut node = TestNode::start().await;
    let client = node.client.clone();
    let a = client
        .create_table(&events_table("a", 2, TableOptions::default()), false)
        .await
        .expect("create a");
    client
        .create_table(&events_table("b", 1, TableOptions::default()), false)
        .await
        .expect("create b");
    let again = client
        .create_table(&events_table("a", 2, TableOptions::default()), true)
        .await
        .expect("if not exists");
    assert_eq!(again.table_id, a.table_id);
    let names = |tables: Vec<TablePath>| tables.iter().map(ToString::to_string).collect::<Vec<_>>();
    assert_eq!(
        names(client.list_tables(None).await.expect("list")),
        ["test.a", "test.b"]
    );
    assert!(
        client
            .list_tables(Some("other"))
            .await
            .expect("list")
            .is_empty()
    );

    client
        .write(&a, &events(&a, &[1, 2, 3]))
        .await
        .expect("write v0");
    let evolved = client
        .add_column(&a.path, Field::new("score", DataType::Int64, true))
        .await
        .expect("add column");
    assert_eq!(evolved.current().schema_id, 1);

    node.restart().await;
    let client = node.client.clone();
    let described = client.describe_table(&a.path).await.expect("describe");
    assert_eq!(described, evolved, "schema versions persist");
    let bucket_key_rows = events(&a, &[4]);
    let score: ArrayRef = Arc::new(Int64Array::from(vec![Some(40)]));
    let v1 = RecordBatch::try_new(
        Arc::clone(described.schema()),
        vec![
            Arc::clone(bucket_key_rows.column(0)),
            Arc::clone(bucket_key_rows.column(1)),
            score,
        ],
    )
    .expect("v1 batch");
    client.write(&described, &v1).await.expect("write v1");
    let err = client
        .write(&described, &bucket_key_rows)
        .await
        .expect_err("old schema");
    assert_eq!(err.code(), Some(Code::InvalidArgument), "{err}");

    // Every batch reads with the current schema; old rows have a null score.
    let mut scores = Vec::new();
    for status in client.list_buckets(&a.path).await.expect("buckets") {
        let answer = client
            .scan(&status.bucket.expect("id"), 0, 0, &[])
            .await
            .expect("scan");
        for read in answer.batches {
            assert_eq!(read.batch.num_columns(), 3);
            let column = read.batch.column(2).as_primitive::<Int64Type>();
            scores.extend((0..column.len()).map(|i| {
                (
                    read.metadata.schema_id,
                    column.is_valid(i).then(|| column.value(i)),
                )
            }));
        }
    }
    scores.sort();
    assert_eq!(scores.last(), Some(&(1, Some(40))));
    assert!(
        scores
            .iter()
            .filter(|(v, _)| *v == 0)
            .all(|(_, s)| s.is_none())
    );

    client.drop_table(&a.path, false).await.expect("drop");
    client
        .drop_table(&a.path, true)
        .await
        .expect("drop if exists");
    let err = client.describe_table(&a.path).await.expect_err("dropped");
    assert_eq!(err.code(), Some(Code::NotFound));
    let recreated = client
        .create_table(&events_table("a", 2, TableOptions::default()), false)
        .await
        .expect("recreate");
    assert_ne!(recreated.table_id, a.table_id);
    // A drop meant for the first table leaves the new one alone.
    let stale = client
        .drop_table_instance(&a)
        .await
        .expect_err("another table now");
    assert_eq!(stale.code(), Some(Code::FailedPrecondition));
    client.describe_table(&a.path).await.expect("still there");
    for status in client.list_buckets(&a.path).await.expect("buckets") {
        assert_eq!(
            (status.log_start, status.high_watermark),
            (0, 0),
            "a re-created table starts empty"
        );
    }
    node.restart().await;
    assert_eq!(
        names(node.client.list_tables(None).await.expect("list")),
        ["test.a", "test.b"]
    );
}
