//! Shipping a union read's plan to another process: a DataFusion
//! [`PhysicalExtensionCodec`] for mink's plan nodes ([`MinkCodec`]).
//!
//! DataFusion's own operators travel in `datafusion-proto`'s form; mink's nodes travel as
//! the [`MinkPlanNode`] message inside it:
//!
//! - `KeyMergeExec`: the key's fields (neither input carries them when it merges the
//!   lake by positions), how it merges the lake and how many columns it outputs (the
//!   children travel as the extension's inputs);
//! - `LogRangeExec`: its buckets' log ranges, columns, read schema and what its rows are
//!   (log rows, changes, live rows). The log source is
//!   not serialized: the process that decodes the plan reads the logs with its own
//!   source (a worker, with its own login), the one its codec was made with;
//! - `EqualityDeleteExec`: the keys the deletes name, as loaded;
//! - the lake scan's position deletes. DataFusion serializes a `DataSourceExec` itself
//!   and drops what `PartitionedFile::extensions` carries, so a scan whose files have
//!   access plans (the row selections that leave deleted rows out) would silently read
//!   them back. [`MinkCodec::encode`] therefore wraps every such scan, for the time of
//!   the encoding, in a marker node that carries the scan and its access plans, and
//!   decoding puts them back on the files. A plan must be encoded with
//!   [`MinkCodec::encode`]: DataFusion's own entry points never ask the codec about a
//!   `DataSourceExec`, so through them a lake scan would lose its deletes. Decoding also
//!   gives every Parquet scan the lake scan's reader ([`reader_factory`]: footers cached,
//!   fetched row groups reserved in the memory pool), which DataFusion's form drops.
//!
//! The messages are an internal format between mink processes of the same build.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use arrow::datatypes::Schema;
use datafusion_common::tree_node::{Transformed, TreeNode};
use datafusion_common::{DataFusionError, Result};
use datafusion_datasource::file_groups::FileGroup;
use datafusion_datasource::file_scan_config::FileScanConfig;
use datafusion_datasource::source::DataSourceExec;
use datafusion_datasource_parquet::source::ParquetSource;
use datafusion_datasource_parquet::{ParquetAccessPlan, RowGroupAccess};
use datafusion_execution::TaskContext;
use datafusion_physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, SendableRecordBatchStream,
};
use datafusion_proto::bytes::{
    physical_plan_from_bytes_with_extension_codec, physical_plan_to_bytes_with_extension_codec,
};
use datafusion_proto::physical_plan::{AsExecutionPlan, PhysicalExtensionCodec};
use datafusion_proto::protobuf;
use mink_core::key::KeyCodec;
use mink_core::protocol::BucketId;
use mink_lake::reader::EqualityFilter;
use parquet::arrow::arrow_reader::{RowSelection, RowSelector};
use prost::Message;

use crate::equality::EqualityDeleteExec;
use crate::external;
use crate::lake_scan::reader_factory;
use crate::log_range::{LogRange, LogRangeExec, LogRangeRows, LogSource};
use crate::merge::{KeyMergeExec, LakeMerge};

/// Encodes and decodes plans holding mink's nodes (see the module docs).
#[derive(Debug)]
pub struct MinkCodec {
    log: Arc<dyn LogSource>,
}

impl MinkCodec {
    /// A codec whose decoded log ranges read with `log`.
    pub fn new(log: Arc<dyn LogSource>) -> Self {
        Self { log }
    }

    /// `plan` as bytes, the position deletes of its lake scans included.
    ///
    /// # Errors
    /// A node neither DataFusion nor mink can serialize.
    pub fn encode(&self, plan: Arc<dyn ExecutionPlan>) -> Result<bytes::Bytes> {
        physical_plan_to_bytes_with_extension_codec(with_deletes_carried(plan)?, self)
    }

    /// `plan` as the protobuf message of DataFusion's plans, the position deletes of its
    /// lake scans included: for a node of another codec that carries a union read's plan
    /// inside it.
    ///
    /// # Errors
    /// A node neither DataFusion nor mink can serialize.
    pub fn to_proto(&self, plan: Arc<dyn ExecutionPlan>) -> Result<protobuf::PhysicalPlanNode> {
        protobuf::PhysicalPlanNode::try_from_physical_plan(with_deletes_carried(plan)?, self)
    }

    /// The plan a [`MinkCodec::to_proto`] message holds.
    ///
    /// # Errors
    /// A message that is not a plan of this build.
    pub fn from_proto(
        &self,
        node: &protobuf::PhysicalPlanNode,
        context: &TaskContext,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        with_lake_readers(node.try_into_physical_plan(context, self)?, context)
    }

    /// The plan `bytes` encode, its lake files read from the object stores registered
    /// in `context`'s runtime.
    ///
    /// # Errors
    /// Bytes that are not a plan of this build.
    pub fn decode(&self, bytes: &[u8], context: &TaskContext) -> Result<Arc<dyn ExecutionPlan>> {
        let plan = physical_plan_from_bytes_with_extension_codec(bytes, context, self)?;
        with_lake_readers(plan, context)
    }
}

/// `plan` with the Parquet scans DataFusion decoded (which open their files with its
/// default reader) opening them as a lake scan does ([`reader_factory`]): footers cached,
/// fetched row groups reserved in `context`'s memory pool.
fn with_lake_readers(
    plan: Arc<dyn ExecutionPlan>,
    context: &TaskContext,
) -> Result<Arc<dyn ExecutionPlan>> {
    plan.transform_up(|node| {
        let Some((config, parquet)) = node
            .as_any()
            .downcast_ref::<DataSourceExec>()
            .and_then(|exec| exec.downcast_to_file_source::<ParquetSource>())
        else {
            return Ok(Transformed::no(node));
        };
        let store = context
            .runtime_env()
            .object_store(&config.object_store_url)?;
        let source = parquet
            .clone()
            .with_parquet_file_reader_factory(reader_factory(context, store));
        let mut config = config.clone();
        config.file_source = Arc::new(source);
        Ok(Transformed::yes(DataSourceExec::from_data_source(config)))
    })
    .map(|transformed| transformed.data)
}

impl PhysicalExtensionCodec for MinkCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        context: &TaskContext,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let node = MinkPlanNode::decode(buf).map_err(|e| malformed(&e))?;
        match node.node.ok_or_else(|| malformed(&"no node"))? {
            Node::KeyMerge(merge) => {
                let [lake, log_range] = inputs else {
                    return Err(malformed(&"a key merge without its two inputs"));
                };
                // Neither input carries the key when the lake is merged by positions.
                let key = Schema::try_from(
                    &merge
                        .key
                        .ok_or_else(|| malformed(&"a key merge without its key"))?,
                )?;
                let columns = key.fields().iter().map(|f| f.name().clone()).collect();
                let codec = KeyCodec::for_columns(&key, columns).map_err(external)?;
                let lake_merge = match merge.by_positions {
                    true => LakeMerge::Positions,
                    false => LakeMerge::Probe,
                };
                Ok(Arc::new(KeyMergeExec::try_new(
                    Arc::clone(lake),
                    Arc::clone(log_range),
                    Arc::new(codec),
                    lake_merge,
                    usize::try_from(merge.columns).map_err(|e| malformed(&e))?,
                )?))
            }
            Node::LogRange(log_range) => {
                let schema = log_range
                    .read_schema
                    .ok_or_else(|| malformed(&"a log range without schema"))?;
                let ranges = log_range
                    .ranges
                    .into_iter()
                    .map(|range| {
                        Ok(LogRange {
                            bucket: range.bucket.ok_or_else(|| malformed(&"a range's bucket"))?,
                            from: range.from,
                            to: range.to,
                        })
                    })
                    .collect::<Result<_>>()?;
                Ok(Arc::new(LogRangeExec::new(
                    Arc::clone(&self.log),
                    ranges,
                    log_range.columns,
                    Arc::new(Schema::try_from(&schema)?),
                    LogRangeRowsKind::try_from(log_range.rows)
                        .map_err(|_| malformed(&"a log range's rows of no known kind"))?
                        .into(),
                )))
            }
            Node::EqualityDelete(deletes) => {
                let [input] = inputs else {
                    return Err(malformed(&"an equality delete without its input"));
                };
                let filter = EqualityFilter::from_bytes(&deletes.filter).map_err(external)?;
                Ok(Arc::new(EqualityDeleteExec::new(
                    Arc::clone(input),
                    Arc::new(filter),
                    deletes.kept as usize,
                )))
            }
            Node::LakeDeletes(deletes) => {
                let LakeDeletesNode { scan, files } = *deletes;
                let scan = scan.ok_or_else(|| malformed(&"deletes without a scan"))?;
                let scan = scan.try_into_physical_plan(context, self)?;
                with_access_plans(scan, files)
            }
        }
    }

    fn try_encode(&self, node: Arc<dyn ExecutionPlan>, buf: &mut Vec<u8>) -> Result<()> {
        let any = node.as_any();
        let encoded = if let Some(merge) = any.downcast_ref::<KeyMergeExec>() {
            Node::KeyMerge(KeyMergeNode {
                key: Some(protobuf::Schema::try_from(merge.key_schema().as_ref())?),
                by_positions: merge.merge() == LakeMerge::Positions,
                columns: merge.schema().fields().len() as u64,
            })
        } else if let Some(log_range) = any.downcast_ref::<LogRangeExec>() {
            Node::LogRange(LogRangeExecNode {
                ranges: log_range
                    .ranges()
                    .iter()
                    .map(|range| LogRangeNode {
                        bucket: Some(range.bucket.clone()),
                        from: range.from,
                        to: range.to,
                    })
                    .collect(),
                columns: log_range.columns().to_vec(),
                read_schema: Some(protobuf::Schema::try_from(
                    log_range.read_schema().as_ref(),
                )?),
                rows: LogRangeRowsKind::from(log_range.rows()) as i32,
            })
        } else if let Some(deletes) = any.downcast_ref::<EqualityDeleteExec>() {
            Node::EqualityDelete(EqualityDeleteNode {
                filter: deletes.filter().to_bytes().map_err(external)?,
                kept: deletes.kept() as u64,
            })
        } else if let Some(deletes) = any.downcast_ref::<LakeDeletesExec>() {
            let scan = protobuf::PhysicalPlanNode::try_from_physical_plan(
                Arc::clone(&deletes.scan),
                self,
            )?;
            Node::LakeDeletes(Box::new(LakeDeletesNode {
                scan: Some(scan),
                files: deletes.files.clone(),
            }))
        } else {
            return Err(DataFusionError::NotImplemented(format!(
                "mink's codec cannot encode {}",
                node.name()
            )));
        };
        MinkPlanNode {
            node: Some(encoded),
        }
        .encode(buf)
        .map_err(|e| DataFusionError::Internal(format!("encoding a mink plan node: {e}")))
    }
}

/// `plan` with every Parquet scan whose files carry access plans wrapped, with them, in
/// a [`LakeDeletesExec`] (see the module docs).
fn with_deletes_carried(plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    let wrapped = plan.transform_up(|node| match access_plans(node.as_ref()) {
        Some(files) => Ok(Transformed::yes(
            Arc::new(LakeDeletesExec { scan: node, files }) as Arc<dyn ExecutionPlan>,
        )),
        None => Ok(Transformed::no(node)),
    })?;
    Ok(wrapped.data)
}

/// Whether `plan` is a Parquet scan whose files carry access plans, which DataFusion's
/// own serialization would drop (see the module docs).
pub fn has_access_plans(plan: &dyn ExecutionPlan) -> bool {
    access_plans(plan).is_some()
}

/// A plan node in bytes that do not decode.
fn malformed(error: &dyn fmt::Display) -> DataFusionError {
    DataFusionError::Plan(format!("a mink plan node that does not decode: {error}"))
}

/// The access plans of a Parquet scan's files, where any file has one.
fn access_plans(plan: &dyn ExecutionPlan) -> Option<Vec<FileAccessNode>> {
    let (config, _) = plan
        .as_any()
        .downcast_ref::<DataSourceExec>()?
        .downcast_to_file_source::<ParquetSource>()?;
    let files: Vec<FileAccessNode> = config
        .file_groups
        .iter()
        .enumerate()
        .flat_map(|(group, files)| {
            files.iter().enumerate().filter_map(move |(file, scanned)| {
                let access = scanned
                    .extensions
                    .as_ref()?
                    .downcast_ref::<ParquetAccessPlan>()?;
                Some(FileAccessNode {
                    group: group as u64,
                    file: file as u64,
                    row_groups: access.inner().iter().map(row_group_node).collect(),
                })
            })
        })
        .collect();
    (!files.is_empty()).then_some(files)
}

/// `scan` (a decoded Parquet scan) with `files`' access plans put back on its files.
fn with_access_plans(
    scan: Arc<dyn ExecutionPlan>,
    files: Vec<FileAccessNode>,
) -> Result<Arc<dyn ExecutionPlan>> {
    let parquet = scan
        .as_any()
        .downcast_ref::<DataSourceExec>()
        .and_then(|exec| exec.data_source().as_any().downcast_ref::<FileScanConfig>())
        .ok_or_else(|| malformed(&"lake deletes over something else than a Parquet scan"))?;
    let mut config = parquet.clone();
    let mut groups: Vec<Vec<_>> = config
        .file_groups
        .iter()
        .map(|group| group.files().to_vec())
        .collect();
    for access in files {
        let scanned = groups
            .get_mut(access.group as usize)
            .and_then(|group| group.get_mut(access.file as usize))
            .ok_or_else(|| malformed(&"an access plan for a file the scan lacks"))?;
        let row_groups = access
            .row_groups
            .into_iter()
            .map(row_group_access)
            .collect::<Result<_>>()?;
        scanned.extensions = Some(Arc::new(ParquetAccessPlan::new(row_groups)));
    }
    config.file_groups = groups.into_iter().map(FileGroup::new).collect();
    Ok(DataSourceExec::from_data_source(config))
}

fn row_group_node(access: &RowGroupAccess) -> RowGroupNode {
    let (kind, runs) = match access {
        RowGroupAccess::Scan => (RowGroupKind::Scan, Vec::new()),
        RowGroupAccess::Skip => (RowGroupKind::Skip, Vec::new()),
        RowGroupAccess::Selection(selection) => (
            RowGroupKind::Selection,
            selection
                .iter()
                .map(|run| RowRun {
                    skip: run.skip,
                    rows: run.row_count as u64,
                })
                .collect(),
        ),
    };
    RowGroupNode {
        kind: kind as i32,
        runs,
    }
}

fn row_group_access(node: RowGroupNode) -> Result<RowGroupAccess> {
    match RowGroupKind::try_from(node.kind) {
        Ok(RowGroupKind::Scan) => Ok(RowGroupAccess::Scan),
        Ok(RowGroupKind::Skip) => Ok(RowGroupAccess::Skip),
        Ok(RowGroupKind::Selection) => {
            let runs: Vec<RowSelector> = node
                .runs
                .into_iter()
                .map(|run| match run.skip {
                    true => RowSelector::skip(run.rows as usize),
                    false => RowSelector::select(run.rows as usize),
                })
                .collect();
            Ok(RowGroupAccess::Selection(RowSelection::from(runs)))
        }
        Err(_) => Err(malformed(&format!("row group access {}", node.kind))),
    }
}

/// A Parquet scan whose files carry access plans, wrapped with them while a plan is
/// encoded (see the module docs); never executed.
#[derive(Debug)]
struct LakeDeletesExec {
    scan: Arc<dyn ExecutionPlan>,
    files: Vec<FileAccessNode>,
}

impl DisplayAs for LakeDeletesExec {
    fn fmt_as(&self, _format: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LakeDeletesExec")
    }
}

impl ExecutionPlan for LakeDeletesExec {
    fn name(&self) -> &str {
        "LakeDeletesExec"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.scan.properties()
    }

    /// None: the scan travels inside the node, not as DataFusion's input.
    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        Vec::new()
    }

    fn with_new_children(
        self: Arc<Self>,
        _children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn execute(
        &self,
        _partition: usize,
        _context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        Err(DataFusionError::Internal(
            "LakeDeletesExec exists only while a plan is encoded".into(),
        ))
    }
}

/// One of mink's plan nodes.
#[derive(Clone, PartialEq, Message)]
struct MinkPlanNode {
    #[prost(oneof = "Node", tags = "1, 2, 3, 4")]
    node: Option<Node>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum Node {
    #[prost(message, tag = "1")]
    KeyMerge(KeyMergeNode),
    #[prost(message, tag = "2")]
    LogRange(LogRangeExecNode),
    #[prost(message, tag = "3")]
    EqualityDelete(EqualityDeleteNode),
    #[prost(message, tag = "4")]
    LakeDeletes(Box<LakeDeletesNode>),
}

#[derive(Clone, PartialEq, Message)]
struct KeyMergeNode {
    /// The key columns' fields, in encoding order.
    #[prost(message, optional, tag = "1")]
    key: Option<protobuf::Schema>,
    /// The lake rows of changed keys are left out by the scan ([`LakeMerge::Positions`]),
    /// not probed.
    #[prost(bool, tag = "2")]
    by_positions: bool,
    /// How many of the inputs' columns are output.
    #[prost(uint64, tag = "3")]
    columns: u64,
}

#[derive(Clone, PartialEq, Message)]
struct LogRangeExecNode {
    #[prost(message, repeated, tag = "1")]
    ranges: Vec<LogRangeNode>,
    /// The read schema's columns, by index in the table.
    #[prost(uint32, repeated, tag = "2")]
    columns: Vec<u32>,
    #[prost(message, optional, tag = "3")]
    read_schema: Option<protobuf::Schema>,
    #[prost(enumeration = "LogRangeRowsKind", tag = "5")]
    rows: i32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
#[repr(i32)]
enum LogRangeRowsKind {
    Log = 0,
    Changes = 1,
    Live = 2,
}

impl From<LogRangeRows> for LogRangeRowsKind {
    fn from(rows: LogRangeRows) -> Self {
        match rows {
            LogRangeRows::Log => Self::Log,
            LogRangeRows::Changes => Self::Changes,
            LogRangeRows::Live => Self::Live,
        }
    }
}

impl From<LogRangeRowsKind> for LogRangeRows {
    fn from(kind: LogRangeRowsKind) -> Self {
        match kind {
            LogRangeRowsKind::Log => Self::Log,
            LogRangeRowsKind::Changes => Self::Changes,
            LogRangeRowsKind::Live => Self::Live,
        }
    }
}

#[derive(Clone, PartialEq, Message)]
struct LogRangeNode {
    #[prost(message, optional, tag = "1")]
    bucket: Option<BucketId>,
    #[prost(int64, tag = "2")]
    from: i64,
    #[prost(int64, tag = "3")]
    to: i64,
}

#[derive(Clone, PartialEq, Message)]
struct EqualityDeleteNode {
    /// The loaded deletes ([`EqualityFilter::to_bytes`]).
    #[prost(bytes = "vec", tag = "1")]
    filter: Vec<u8>,
    /// How many of the input's columns are output.
    #[prost(uint64, tag = "2")]
    kept: u64,
}

#[derive(Clone, PartialEq, Message)]
struct LakeDeletesNode {
    /// The Parquet scan, as DataFusion serializes it (without its access plans).
    #[prost(message, optional, tag = "1")]
    scan: Option<protobuf::PhysicalPlanNode>,
    #[prost(message, repeated, tag = "2")]
    files: Vec<FileAccessNode>,
}

/// The access plan of the `file`-th file of the `group`-th file group.
#[derive(Clone, PartialEq, Message)]
struct FileAccessNode {
    #[prost(uint64, tag = "1")]
    group: u64,
    #[prost(uint64, tag = "2")]
    file: u64,
    #[prost(message, repeated, tag = "3")]
    row_groups: Vec<RowGroupNode>,
}

#[derive(Clone, PartialEq, Message)]
struct RowGroupNode {
    #[prost(enumeration = "RowGroupKind", tag = "1")]
    kind: i32,
    /// For a selection: its runs of rows read or skipped.
    #[prost(message, repeated, tag = "2")]
    runs: Vec<RowRun>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
#[repr(i32)]
enum RowGroupKind {
    Scan = 0,
    Skip = 1,
    Selection = 2,
}

#[derive(Clone, PartialEq, Message)]
struct RowRun {
    #[prost(bool, tag = "1")]
    skip: bool,
    #[prost(uint64, tag = "2")]
    rows: u64,
}
