use std::convert::Infallible;
use std::sync::Arc;

use arrow::array::{Int64Array, RecordBatch};
use arrow::ipc::CompressionType;
use arrow::ipc::writer::{DictionaryTracker, IpcDataGenerator, IpcWriteOptions};
use http_body_util::Full;
use prost::Message as _;
use tower::ServiceExt as _;

use super::*;

/// The IPC header of a batch `a: Int64 = [1, 2]`, its buffers compressed with
/// `compression` (none: plain).
fn header(compression: Option<CompressionType>) -> Vec<u8> {
    let batch = RecordBatch::try_from_iter([("a", Arc::new(Int64Array::from(vec![1, 2])) as _)])
        .expect("batch");
    let options = IpcWriteOptions::default()
        .try_with_compression(compression)
        .expect("options");
    let (_, encoded) = IpcDataGenerator::default()
        .encode(
            &batch,
            &mut DictionaryTracker::new(false),
            &options,
            &mut Default::default(),
        )
        .expect("encoded");
    encoded.ipc_message
}

/// One gRPC message (prefix and `FlightData`) whose IPC header is `header`.
fn message(header: Vec<u8>) -> Vec<u8> {
    let data = FlightDataHeader {
        data_header: header.into(),
    }
    .encode_to_vec();
    let mut framed = vec![0];
    framed.extend_from_slice(&u32::try_from(data.len()).expect("length").to_be_bytes());
    framed.extend_from_slice(&data);
    framed
}

#[test]
fn plain_messages_pass_whole_whatever_their_chunks() {
    let answer = [message(header(None)), message(header(None))].concat();
    for chunk in [1, 3, 5, 7, answer.len()] {
        let mut messages = Messages::default();
        let mut passed = Vec::new();
        for data in answer.chunks(chunk) {
            passed.extend_from_slice(&messages.feed(data).expect("plain"));
        }
        messages.finish().expect("nothing left");
        assert_eq!(passed, answer, "in chunks of {chunk}");
    }
}

#[test]
fn a_message_is_held_until_it_is_whole() {
    let answer = message(header(None));
    let mut messages = Messages::default();
    let held = messages.feed(&answer[..answer.len() - 1]).expect("plain");
    assert!(held.is_empty());
    let error = messages.finish().expect_err("ended within a message");
    assert!(
        error.message().contains("ended within a message"),
        "{error}"
    );
    assert_eq!(
        messages.feed(&answer[answer.len() - 1..]).expect("plain"),
        answer
    );
}

#[test]
fn compressed_ipc_is_refused_before_it_is_passed_on() {
    let answer = [
        message(header(None)),
        message(header(Some(CompressionType::ZSTD))),
    ]
    .concat();
    let mut messages = Messages::default();
    let error = messages.feed(&answer).expect_err("compressed");
    assert_eq!(error.code(), tonic::Code::InvalidArgument);
    assert!(error.message().contains("compressed Arrow IPC"), "{error}");
}

#[test]
fn compressed_grpc_and_oversized_messages_are_refused_by_their_prefix() {
    let mut messages = Messages::default();
    let error = messages.feed(&[1, 0, 0, 0, 1]).expect_err("compressed");
    assert!(error.message().contains("compressed gRPC"), "{error}");
    let declared = u32::try_from(MAX_ANSWER_MESSAGE_BYTES + 1).expect("fits");
    let mut prefix = vec![0];
    prefix.extend_from_slice(&declared.to_be_bytes());
    let error = Messages::default().feed(&prefix).expect_err("too large");
    assert_eq!(error.code(), tonic::Code::OutOfRange);
}

#[test]
fn a_header_that_is_not_ipc_is_refused() {
    let error = Messages::default()
        .feed(&message(b"garbage".to_vec()))
        .expect_err("garbage");
    assert!(
        error.message().contains("not an Arrow IPC message header"),
        "{error}"
    );
}

/// What the body of an answer of `path` gives, the answer being `body`.
async fn read_answer(path: &str, body: Vec<u8>) -> Result<Vec<u8>, Status> {
    let upstream = tower::service_fn(move |_: http::Request<Body>| {
        let body = body.clone();
        async move { Ok::<_, Infallible>(http::Response::new(Body::new(Full::new(Bytes::from(body))))) }
    });
    let request = http::Request::builder()
        .uri(format!("http://127.0.0.1:1{path}"))
        .body(Body::empty())
        .expect("request");
    let response = CheckedAnswers::new(upstream)
        .oneshot(request)
        .await
        .expect("answered");
    let collected = response.into_body().collect().await?;
    Ok(collected.to_bytes().to_vec())
}

#[tokio::test]
async fn only_execute_task_answers_are_checked() {
    let forged = message(header(Some(CompressionType::ZSTD)));
    let error = read_answer(EXECUTE_TASK, forged.clone())
        .await
        .expect_err("a compressed batch was passed on");
    assert!(error.message().contains("compressed Arrow IPC"), "{error}");
    let plain = message(header(None));
    assert_eq!(
        read_answer(EXECUTE_TASK, plain.clone())
            .await
            .expect("plain"),
        plain
    );
    let other = "/worker.WorkerService/GetWorkerInfo";
    assert_eq!(
        read_answer(other, forged.clone()).await.expect("unread"),
        forged
    );
}
