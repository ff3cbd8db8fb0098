//! `MinkCodec` round trips: a union read's plan (a Parquet scan whose file carries
//! position deletes as an access plan, a log range, the key merge, equality deletes and
//! DataFusion's own operators above) encoded and decoded reads exactly the rows the
//! original reads, and shows the same tree.

#![expect(
    unused_crate_dependencies,
    reason = "an integration test crate sees every dependency of the library"
)]

use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef};
use arrow::ipc::writer::StreamWriter;
use datafusion_common::Result;
use datafusion_datasource::PartitionedFile;
use datafusion_datasource::file_groups::FileGroup;
use datafusion_datasource::file_scan_config::FileScanConfigBuilder;
use datafusion_datasource::source::DataSourceExec;
use datafusion_datasource_parquet::source::ParquetSource;
use datafusion_datasource_parquet::{ParquetAccessPlan, RowGroupAccess};
use datafusion_execution::TaskContext;
use datafusion_execution::object_store::ObjectStoreUrl;
use datafusion_expr_common::operator::Operator;
use datafusion_physical_expr::expressions::{BinaryExpr, Column, Literal};
use datafusion_physical_plan::empty::EmptyExec;
use datafusion_physical_plan::filter::FilterExec;
use datafusion_physical_plan::{ExecutionPlan, displayable};
use futures::stream::{self, BoxStream, StreamExt, TryStreamExt};
use mink_core::change::ChangeType;
use mink_core::key::KeyCodec;
use mink_core::merge::LogRangeIndex;
use mink_core::protocol::BucketId;
use mink_lake::reader::EqualityFilter;
use mink_scan::codec::MinkCodec;
use mink_scan::equality::EqualityDeleteExec;
use mink_scan::external;
use mink_scan::log_range::{LogRange, LogRangeBatch, LogRangeExec, LogRangeRows, LogSource};
use mink_scan::merge::{KeyMergeExec, LakeMerge};
use mink_scan::union::execute_in_order;
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::{RowSelection, RowSelector};
use parquet::file::properties::WriterProperties;

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
    ]))
}

fn rows(ids: &[i64], tag: &str) -> RecordBatch {
    let names: StringArray = ids.iter().map(|id| Some(format!("{tag}{id}"))).collect();
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from(ids.to_vec())) as ArrayRef,
            Arc::new(names),
        ],
    )
    .unwrap()
}

/// A log of one bucket, held in memory: `+U` of key 3, `-D` of key 0, `+I` of key 11.
#[derive(Debug)]
struct MemoryLog;

impl LogSource for MemoryLog {
    fn read(
        &self,
        range: &LogRange,
        _columns: &[u32],
    ) -> BoxStream<'static, Result<LogRangeBatch>> {
        let changes = [
            ChangeType::UpdateAfter,
            ChangeType::Delete,
            ChangeType::Insert,
        ];
        let batch = LogRangeBatch {
            rows: rows(&[3, 0, 11], "range"),
            changes: changes.iter().map(|&change| change as u8).collect(),
            base_offset: range.from,
            commit_timestamp: 0,
        };
        stream::iter([Ok(batch)]).boxed()
    }

    /// The same log folded by key, as a leader folds it.
    fn read_live(
        &self,
        range: &LogRange,
        columns: &[u32],
    ) -> BoxStream<'static, Result<RecordBatch>> {
        let codec = KeyCodec::for_columns(&schema(), vec!["id".into()]).unwrap();
        let changes = self
            .read(range, columns)
            .map_ok(|batch| (batch.rows, batch.changes))
            .try_collect::<Vec<_>>();
        stream::once(changes)
            .map(move |changes| -> Result<_> {
                let index = LogRangeIndex::new(&codec, changes?).map_err(external)?;
                let live = index.live_rows().map_err(external)?;
                Ok(stream::iter(live.into_iter().map(Ok)))
            })
            .try_flatten()
            .boxed()
    }
}

/// A Parquet file of ids 0..10 in two row groups of 5, in `dir`.
fn lake_file(dir: &std::path::Path) -> PartitionedFile {
    let path = dir.join("data.parquet");
    let file = std::fs::File::create(&path).unwrap();
    let properties = WriterProperties::builder()
        .set_max_row_group_row_count(Some(5))
        .build();
    let mut writer = ArrowWriter::try_new(file, schema(), Some(properties)).unwrap();
    writer
        .write(&rows(&(0..10).collect::<Vec<_>>(), "lake"))
        .unwrap();
    writer.close().unwrap();
    let size = std::fs::metadata(&path).unwrap().len();
    PartitionedFile::new(path.to_str().unwrap().trim_start_matches('/'), size)
}

/// The scan of `file` (two row groups of 5 rows) with positions `deleted` left out.
fn lake_scan(file: PartitionedFile, deleted: &[usize]) -> Arc<dyn ExecutionPlan> {
    let group = |first: usize| {
        let selectors = (first..first + 5).map(|row| match deleted.contains(&row) {
            true => RowSelector::skip(1),
            false => RowSelector::select(1),
        });
        RowGroupAccess::Selection(RowSelection::from(selectors.collect::<Vec<_>>()))
    };
    let file = file.with_extensions(Arc::new(ParquetAccessPlan::new(vec![group(0), group(5)])));
    let config = FileScanConfigBuilder::new(
        ObjectStoreUrl::local_filesystem(),
        Arc::new(ParquetSource::new(schema())),
    )
    .with_file_groups(vec![FileGroup::new(vec![file])])
    .build();
    DataSourceExec::from_data_source(config)
}

/// Equality deletes naming ids 4 and 9, in the form `EqualityFilter::to_bytes` writes.
fn equality_filter() -> EqualityFilter {
    let keys =
        RecordBatch::try_from_iter([("id", Arc::new(Int64Array::from(vec![4, 9])) as ArrayRef)])
            .unwrap();
    let mut stream = StreamWriter::try_new(Vec::new(), keys.schema_ref()).unwrap();
    stream.write(&keys).unwrap();
    let stream = stream.into_inner().unwrap();
    let mut bytes = (stream.len() as u64).to_le_bytes().to_vec();
    bytes.extend(stream);
    EqualityFilter::from_bytes(&bytes).unwrap()
}

/// `id <> 6` over the merge of the lake (minus position deletes 1 and 7 and equality
/// deletes) and the log range, the lake rows of the log range's keys probed or, at positions 0 and
/// 3, left out by the scan.
fn plan(dir: &std::path::Path, merge: LakeMerge) -> Arc<dyn ExecutionPlan> {
    let deleted: &[usize] = match merge {
        LakeMerge::Probe => &[1, 7],
        LakeMerge::Positions => &[0, 1, 3, 7],
    };
    let lake = Arc::new(EqualityDeleteExec::new(
        lake_scan(lake_file(dir), deleted),
        Arc::new(equality_filter()),
        2,
    ));
    let bucket = BucketId {
        table: "default.t".into(),
        partition: None,
        bucket: 0,
    };
    let ranges = vec![LogRange {
        bucket,
        from: 7,
        to: 10,
    }];
    let rows = match merge {
        LakeMerge::Probe => LogRangeRows::Changes,
        LakeMerge::Positions => LogRangeRows::Live,
    };
    let log = Arc::new(LogRangeExec::new(
        Arc::new(MemoryLog),
        ranges,
        vec![0, 1],
        schema(),
        rows,
    ));
    let codec = KeyCodec::for_columns(&schema(), vec!["id".into()]).unwrap();
    let merge = KeyMergeExec::try_new(lake, log, Arc::new(codec), merge, 2).unwrap();
    let predicate = Arc::new(BinaryExpr::new(
        Arc::new(Column::new("id", 0)),
        Operator::NotEq,
        Arc::new(Literal::new(6i64.into())),
    ));
    Arc::new(FilterExec::try_new(predicate, Arc::new(merge)).unwrap())
}

async fn read(plan: Arc<dyn ExecutionPlan>) -> Vec<(i64, String)> {
    let batches: Vec<RecordBatch> = execute_in_order(plan, Arc::new(TaskContext::default()))
        .try_collect()
        .await
        .unwrap();
    let mut rows: Vec<(i64, String)> = batches
        .iter()
        .flat_map(|batch| {
            let ids = batch.column(0).as_primitive::<Int64Type>().clone();
            let names = batch.column(1).as_string::<i32>().clone();
            (0..batch.num_rows())
                .map(move |i| (ids.value(i), names.value(i).to_string()))
                .collect::<Vec<_>>()
        })
        .collect();
    rows.sort();
    rows
}

#[tokio::test]
async fn a_union_plan_reads_the_same_rows_after_a_round_trip() {
    for merge in [LakeMerge::Probe, LakeMerge::Positions] {
        let dir = tempfile::tempdir().unwrap();
        let original = plan(dir.path(), merge);
        // Lake 0..10 minus positions 1 and 7 (position deletes), 4 and 9 (equality
        // deletes), the log range's keys 0 (deleted) and 3 (updated), and 6 (the filter); then
        // the log range's live rows 3 and 11.
        let want: Vec<(i64, String)> = [
            (2, "lake"),
            (3, "range"),
            (5, "lake"),
            (8, "lake"),
            (11, "range"),
        ]
        .iter()
        .map(|(id, tag)| (*id, format!("{tag}{id}")))
        .collect();
        assert_eq!(read(Arc::clone(&original)).await, want, "{merge:?}");

        let codec = MinkCodec::new(Arc::new(MemoryLog));
        let bytes = codec.encode(Arc::clone(&original)).unwrap();
        let decoded = codec.decode(&bytes, &TaskContext::default()).unwrap();
        assert_eq!(
            displayable(decoded.as_ref()).indent(true).to_string(),
            displayable(original.as_ref()).indent(true).to_string(),
        );
        assert_eq!(
            read(decoded).await,
            want,
            "the decoded plan ({merge:?}) reads the same rows"
        );
    }
}

#[test]
fn a_merge_by_positions_of_columns_without_the_key_round_trips() {
    let names = Arc::new(schema().project(&[1]).unwrap());
    let lake = Arc::new(EmptyExec::new(Arc::clone(&names)));
    let range = LogRange {
        bucket: BucketId {
            table: "default.t".into(),
            partition: None,
            bucket: 0,
        },
        from: 0,
        to: 3,
    };
    let log = LogRangeExec::new(
        Arc::new(MemoryLog),
        vec![range],
        vec![1],
        names,
        LogRangeRows::Live,
    );
    let key = KeyCodec::for_columns(&schema(), vec!["id".into()]).unwrap();
    let merge: Arc<dyn ExecutionPlan> = Arc::new(
        KeyMergeExec::try_new(lake, Arc::new(log), Arc::new(key), LakeMerge::Positions, 1).unwrap(),
    );
    let codec = MinkCodec::new(Arc::new(MemoryLog));
    let bytes = codec.encode(Arc::clone(&merge)).unwrap();
    let decoded = codec.decode(&bytes, &TaskContext::default()).unwrap();
    assert_eq!(
        displayable(decoded.as_ref()).indent(true).to_string(),
        displayable(merge.as_ref()).indent(true).to_string(),
    );
}

#[test]
fn bytes_that_are_not_a_plan_are_an_error() {
    let codec = MinkCodec::new(Arc::new(MemoryLog));
    for bytes in [&b"\xff\xff\xff"[..], b"", b"\x0a\x05hello"] {
        assert!(codec.decode(bytes, &TaskContext::default()).is_err());
    }
}

#[tokio::test]
async fn a_decoded_lake_scan_reserves_its_fetches_in_the_decoding_context_pool() {
    use datafusion_execution::memory_pool::GreedyMemoryPool;
    use datafusion_execution::runtime_env::RuntimeEnvBuilder;

    let dir = tempfile::tempdir().unwrap();
    let codec = MinkCodec::new(Arc::new(MemoryLog));
    let bytes = codec
        .encode(lake_scan(lake_file(dir.path()), &[1]))
        .unwrap();
    let runtime = RuntimeEnvBuilder::new()
        .with_memory_pool(Arc::new(GreedyMemoryPool::new(16)))
        .build_arc()
        .unwrap();
    let tiny = Arc::new(TaskContext::default().with_runtime(runtime));
    let decoded = codec.decode(&bytes, &tiny).unwrap();
    let error = execute_in_order(decoded, tiny)
        .try_collect::<Vec<RecordBatch>>()
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("LakeScan[0] fetched row groups"),
        "{error}"
    );

    // With room, the same bytes read the file's rows but the deleted one.
    let decoded = codec.decode(&bytes, &TaskContext::default()).unwrap();
    assert_eq!(read(decoded).await.len(), 9);
}
