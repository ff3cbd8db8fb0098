use std::sync::Arc;

use arrow::array::{Int64Array, RecordBatch};
use arrow::ipc::CompressionType;
use arrow::ipc::writer::{IpcWriteOptions, StreamWriter};
use datafusion::prelude::SessionContext;
use datafusion_proto::bytes::physical_plan_to_bytes;
use datafusion_proto::generated::datafusion_common::ScalarNestedValue;
use datafusion_proto::generated::datafusion_common::scalar_value::Value;
use datafusion_proto::protobuf::physical_expr_node::ExprType;
use datafusion_proto::protobuf::physical_plan_node::PhysicalPlanType;
use datafusion_proto::protobuf::{
    EmptyExecNode, FilterExecNode, MemoryScanExecNode, PhysicalExprNode, PhysicalExtensionNode,
    PhysicalPlanNode, ScalarValue,
};
use prost::Message;

use super::*;

/// An IPC stream of one `a: Int64` batch, its buffers compressed when `compression`.
fn stream(compression: Option<CompressionType>) -> Vec<u8> {
    let batch = RecordBatch::try_from_iter([("a", Arc::new(Int64Array::from(vec![1, 2, 3])) as _)])
        .expect("batch");
    let options = IpcWriteOptions::default()
        .try_with_compression(compression)
        .expect("options");
    let mut writer =
        StreamWriter::try_new_with_options(Vec::new(), &batch.schema(), options).expect("writer");
    writer.write(&batch).expect("write");
    writer.into_inner().expect("finish")
}

/// The header of a stream's second message (its batch), as a nested literal keeps it.
fn batch_header(stream: &[u8]) -> Vec<u8> {
    let first = i32::from_le_bytes(stream[4..8].try_into().expect("length")) as usize;
    let at = 8 + first;
    let length = i32::from_le_bytes(stream[at + 4..at + 8].try_into().expect("length")) as usize;
    stream[at + 8..at + 8 + length].to_vec()
}

fn node(plan: PhysicalPlanType) -> PhysicalPlanNode {
    PhysicalPlanNode {
        physical_plan_type: Some(plan),
    }
}

fn memory_scan(partition: Vec<u8>) -> PhysicalPlanNode {
    node(PhysicalPlanType::MemoryScan(MemoryScanExecNode {
        partitions: vec![partition],
        ..Default::default()
    }))
}

/// A filter over an empty input whose predicate is a list literal of IPC `header`.
fn filter_on_literal(header: Vec<u8>) -> PhysicalPlanNode {
    let literal = ScalarValue {
        value: Some(Value::ListValue(ScalarNestedValue {
            ipc_message: header,
            ..Default::default()
        })),
    };
    node(PhysicalPlanType::Filter(Box::new(FilterExecNode {
        input: Some(Box::new(node(PhysicalPlanType::Empty(
            EmptyExecNode::default(),
        )))),
        expr: Some(PhysicalExprNode {
            expr_type: Some(ExprType::Literal(literal)),
            ..Default::default()
        }),
        ..Default::default()
    })))
}

fn refused(plan: &[u8]) -> String {
    check_plan(plan).expect_err("refused").to_string()
}

#[tokio::test]
async fn plans_mink_sends_pass_their_memory_tables_and_list_literals_included() {
    let context = SessionContext::new();
    let sql = "SELECT a FROM (VALUES (1), (2)) AS v(a) WHERE make_array(1, 2) = make_array(a, 2)";
    let plan = context
        .sql(sql)
        .await
        .expect("plans")
        .create_physical_plan()
        .await
        .expect("physical plan");
    let bytes = physical_plan_to_bytes(plan).expect("encode");
    assert!(check_plan(&bytes).is_ok());
    assert!(check_plan(&memory_scan(stream(None)).encode_to_vec()).is_ok());
    assert!(check_plan(&filter_on_literal(batch_header(&stream(None))).encode_to_vec()).is_ok());
}

#[test]
fn compressed_ipc_is_refused_in_a_memory_table_and_in_a_nested_literal() {
    let compressed = stream(Some(CompressionType::ZSTD));
    let error = refused(&memory_scan(compressed.clone()).encode_to_vec());
    assert!(error.contains("compressed Arrow IPC"), "{error}");
    let error = refused(&filter_on_literal(batch_header(&compressed)).encode_to_vec());
    assert!(error.contains("compressed Arrow IPC"), "{error}");
}

#[test]
fn compressed_ipc_is_found_inside_an_extension_node_and_after_a_group() {
    // mink's extension nodes: a kind byte, then a message.
    let mut bytes = vec![1];
    memory_scan(stream(Some(CompressionType::ZSTD)))
        .encode(&mut bytes)
        .expect("encode");
    let extension = node(PhysicalPlanType::Extension(PhysicalExtensionNode {
        node: bytes,
        inputs: Vec::new(),
    }));
    assert!(refused(&extension.encode_to_vec()).contains("compressed"));

    // An unknown group field (number 100, skipped by prost) before the memory table.
    let mut grouped = vec![0xa3, 0x06, 0x08, 0x01, 0xa4, 0x06];
    grouped.extend(memory_scan(stream(Some(CompressionType::ZSTD))).encode_to_vec());
    assert!(refused(&grouped).contains("compressed"));
}

#[test]
fn nesting_is_bounded_and_garbage_passes_to_the_decoder() {
    let nested = |depth: usize| {
        let mut message = Vec::new();
        for _ in 0..depth {
            let mut outer = vec![0x0a];
            prost::encoding::encode_varint(message.len() as u64, &mut outer);
            outer.extend(message);
            message = outer;
        }
        message
    };
    assert!(check_plan(&nested(MAX_PLAN_NESTING)).is_ok());
    assert!(refused(&nested(MAX_PLAN_NESTING + 2)).contains("nest deeper"));
    for garbage in [&[0xff; 64][..], &[], &[0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f]] {
        assert!(check_plan(garbage).is_ok());
    }
}
