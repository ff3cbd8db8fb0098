//! Bad input gets a precise gRPC status naming the problem, and the node keeps serving.

use std::sync::Arc;

use arrow::array::{ArrayRef, Int32Array, Int64Array, RecordBatch, StringArray};
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::{Action, FlightClient, Ticket};
use mink_client::ClientError;
use mink_core::options::TableOptions;
use mink_core::protocol::BucketId;
use mink_core::table::TablePath;
use tonic::Code;

use crate::support::{TestNode, events, events_table};

fn assert_status(result: Result<impl std::fmt::Debug, ClientError>, code: Code, needle: &str) {
    let err = result.expect_err("an error");
    assert_eq!(err.code(), Some(code), "{err}");
    assert!(
        err.to_string().contains(needle),
        "'{err}' should mention '{needle}'"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_precise_statuses() {
    let node = TestNode::start().await;
    let client = &node.client;
    let table = client
        .create_table(&events_table("keyed", 2, TableOptions::default()), false)
        .await
        .expect("create");
    let bucket0 = BucketId::new(&table.path, 0);

    assert_status(
        client.describe_table(&TablePath::new("test", "nope")).await,
        Code::NotFound,
        "test.nope",
    );
    assert_status(
        client
            .scan(
                &BucketId::new(&TablePath::new("test", "nope"), 0),
                0,
                0,
                &[],
            )
            .await,
        Code::NotFound,
        "does not exist",
    );
    assert_status(
        client.scan(&BucketId::new(&table.path, 7), 0, 0, &[]).await,
        Code::NotFound,
        "has 2 buckets",
    );
    assert_status(
        client.scan(&bucket0, 1, 0, &[]).await,
        Code::OutOfRange,
        "[0, 0)",
    );
    assert_status(
        client.scan(&bucket0, -1, 0, &[]).await,
        Code::OutOfRange,
        "out of range",
    );
    assert_status(
        client.scan(&bucket0, 0, 0, &[5]).await,
        Code::InvalidArgument,
        "column index 5",
    );
    assert_status(
        client.create_table(&table, false).await,
        Code::AlreadyExists,
        "already exists",
    );
    assert_status(
        client
            .drop_table(&TablePath::new("test", "nope"), false)
            .await,
        Code::NotFound,
        "test.nope",
    );

    // A batch whose columns are not the table's.
    let wrong: Vec<(&str, ArrayRef)> = vec![("id", Arc::new(Int32Array::from(vec![1])))];
    let wrong = RecordBatch::try_from_iter(wrong).expect("batch");
    assert_status(
        client.append(&bucket0, vec![wrong]).await,
        Code::InvalidArgument,
        "do not match",
    );
    // A null in a NOT NULL column.
    let ids: ArrayRef = Arc::new(Int64Array::from(vec![None, Some(1)]));
    let names: ArrayRef = Arc::new(StringArray::from(vec!["a", "b"]));
    let nullable = arrow::datatypes::Schema::new(vec![
        arrow::datatypes::Field::new("id", arrow::datatypes::DataType::Int64, true),
        arrow::datatypes::Field::new("name", arrow::datatypes::DataType::Utf8, true),
    ]);
    let with_null = RecordBatch::try_new(Arc::new(nullable), vec![ids, names]).expect("batch");
    assert_status(
        client.append(&bucket0, vec![with_null]).await,
        Code::InvalidArgument,
        "NOT NULL",
    );
    // Rows sent to a bucket they do not hash to.
    let ids: Vec<i64> = (0..50).collect();
    assert_status(
        client
            .append(&BucketId::new(&table.path, 1), vec![events(&table, &ids)])
            .await,
        Code::InvalidArgument,
        "belongs to bucket",
    );
    // A partition address on an unpartitioned table.
    let mut partitioned = bucket0.clone();
    partitioned.partition = Some("dt=1".into());
    assert_status(
        client
            .append(&partitioned, vec![events(&table, &[1])])
            .await,
        Code::InvalidArgument,
        "takes no partition",
    );

    // Raw Flight: a malformed ticket and an unknown action.
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", node.addr()))
        .expect("url")
        .connect()
        .await
        .expect("raw connect");
    let raw = FlightServiceClient::new(channel);
    let mut flight = FlightClient::new_from_inner(raw);
    let err = flight
        .do_get(Ticket::new(vec![0xff, 0x01, 0x02]))
        .await
        .expect_err("garbage ticket");
    assert_status(
        Err::<(), _>(ClientError::from(err)),
        Code::InvalidArgument,
        "malformed ticket",
    );
    let err = flight.do_action(Action::new("explode", vec![])).await;
    let err = match err {
        Err(e) => ClientError::from(e),
        Ok(mut results) => {
            use futures::TryStreamExt;
            ClientError::from(results.try_next().await.expect_err("unknown action"))
        }
    };
    assert_status(
        Err::<(), _>(err),
        Code::InvalidArgument,
        "unknown action 'explode'",
    );

    // Still serving: a routed write and a read.
    let acks = client
        .write(&table, &events(&table, &ids))
        .await
        .expect("routed write");
    let total: i64 = acks
        .iter()
        .map(|(_, ack)| ack.last_offset - ack.base_offset + 1)
        .sum();
    assert_eq!(total, 50);
    let answer = client.scan(&bucket0, 0, 0, &[]).await.expect("scan");
    assert!(answer.num_rows() > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_table_definitions_are_rejected() {
    let node = TestNode::start().await;
    let mut table = events_table("bad", 2, TableOptions::default());
    table.bucket_key = vec!["missing".into()];
    assert_status(
        node.client.create_table(&table, false).await,
        Code::InvalidArgument,
        "'missing'",
    );
    let err = node
        .client
        .add_column(
            &TablePath::new("test", "nope"),
            arrow::datatypes::Field::new("x", arrow::datatypes::DataType::Int32, true),
        )
        .await;
    assert_status(err, Code::NotFound, "test.nope");
    let table = node
        .client
        .create_table(&events_table("good", 1, TableOptions::default()), false)
        .await
        .expect("create");
    let not_null = arrow::datatypes::Field::new("x", arrow::datatypes::DataType::Int32, false);
    assert_status(
        node.client.add_column(&table.path, not_null).await,
        Code::InvalidArgument,
        "must be nullable",
    );
}
