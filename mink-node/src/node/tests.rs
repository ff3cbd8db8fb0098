use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use mink_core::options::TableOptions;
use mink_core::routing::row_addresses;

use super::*;

fn rows(table: &TableDescriptor, partition: &str) -> (BucketId, RecordBatch) {
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from(vec![partition])),
        Arc::new(Int64Array::from(vec![1])),
    ];
    let batch = RecordBatch::try_new(Arc::clone(table.schema()), columns).unwrap();
    let name = row_addresses(table, &batch).unwrap().partitions.unwrap();
    let bucket = BucketId {
        table: table.path.to_string(),
        partition: Some(name[0].clone()),
        bucket: 0,
    };
    (bucket, batch)
}

#[tokio::test]
async fn a_write_past_the_partition_bound_is_refused_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = NodeConfig::new(dir.path());
    config.log.sync = false;
    config.max_partitions = 2;
    let node = Node::open(config.clone()).await.unwrap();
    let schema = Schema::new(vec![
        Field::new("p", DataType::Utf8, false),
        Field::new("v", DataType::Int64, false),
    ]);
    let path = TablePath::new("db", "t");
    let options = TableOptions::default();
    let table = TableDescriptor::new(path.clone(), schema, vec![], vec!["p".into()], options);
    let table = node.create_table(table.unwrap(), false).await.unwrap();
    for partition in ["a", "b"] {
        let (bucket, batch) = rows(&table, partition);
        node.write(&bucket, batch, false, None).await.unwrap();
    }
    let (bucket, batch) = rows(&table, "c");
    let error = node.write(&bucket, batch, false, None).await.unwrap_err();
    assert!(matches!(error, NodeError::InvalidArgument(_)), "{error}");
    assert!(error.to_string().contains("has 2 partitions"), "{error}");
    assert_eq!(node.metadata.partitions(table.table_id).unwrap().len(), 2);
    let (bucket, batch) = rows(&table, "a");
    node.write(&bucket, batch, false, None).await.unwrap();
    drop(node);

    let node = Node::open(config).await.unwrap();
    assert_eq!(node.list_buckets(&path).unwrap().len(), 2);
}

#[tokio::test]
async fn buckets_past_the_node_bound_are_refused_and_a_drop_gives_them_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = NodeConfig::new(dir.path());
    config.log.sync = false;
    config.max_open_buckets = Some(3);
    let node = Node::open(config).await.unwrap();
    let schema = Schema::new(vec![
        Field::new("p", DataType::Utf8, false),
        Field::new("v", DataType::Int64, false),
    ]);
    let daily = TableDescriptor::new(
        TablePath::new("db", "daily"),
        schema.clone(),
        vec![],
        vec!["p".into()],
        TableOptions::default(),
    );
    let daily = node.create_table(daily.unwrap(), false).await.unwrap();
    for partition in ["a", "b"] {
        let (bucket, batch) = rows(&daily, partition);
        node.write(&bucket, batch, false, None).await.unwrap();
    }
    let table_of = |name, bucket_num| {
        let options = TableOptions {
            bucket_num,
            ..TableOptions::default()
        };
        TableDescriptor::new(
            TablePath::new("db", name),
            schema.clone(),
            vec![],
            vec![],
            options,
        )
        .unwrap()
    };
    let error = node
        .create_table(table_of("two", 2), false)
        .await
        .unwrap_err();
    assert!(error.to_string().contains("holds 2 of the 3"), "{error}");
    assert_eq!(node.metadata.load_tables().unwrap().len(), 1);
    let one = node.create_table(table_of("one", 1), false).await.unwrap();
    let (bucket, batch) = rows(&daily, "c");
    let error = node.write(&bucket, batch.clone(), false, None).await;
    assert!(
        matches!(error, Err(NodeError::InvalidArgument(_))),
        "{error:?}"
    );
    assert_eq!(node.metadata.partitions(daily.table_id).unwrap().len(), 2);
    node.drop_table(&one.path, false, None).await.unwrap();
    node.write(&bucket, batch, false, None).await.unwrap();
}

#[tokio::test]
async fn a_bucket_num_past_the_bound_is_refused_before_anything_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = NodeConfig::new(dir.path());
    config.max_bucket_num = 4;
    let node = Node::open(config).await.unwrap();
    let schema = Schema::new(vec![Field::new("v", DataType::Int64, false)]);
    let options = TableOptions {
        bucket_num: 5,
        ..TableOptions::default()
    };
    let table = TableDescriptor::new(TablePath::new("db", "t"), schema, vec![], vec![], options);
    let error = node.create_table(table.unwrap(), false).await.unwrap_err();
    assert!(error.to_string().contains("1 to 4 buckets"), "{error}");
    assert!(node.metadata.load_tables().unwrap().is_empty());
    assert!(node.list_tables(None).is_empty());
}
