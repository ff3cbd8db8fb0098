//! Where a round reads a table's buckets: on a single node every bucket is led here; in a
//! cluster each bucket's status and log come from the node leading it: this node's
//! tablets for the buckets it leads, Flight Scans of the leader for the others
//! ([`Node::peers`], which follows NotLeader while buckets move).
//!
//! A range below the high watermark the leader reported is acknowledged, so in the log
//! store: a bucket that moved since is read from its new leader, which took it over from
//! there.

use std::ops::Range;

use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use mink_client::ReadBatch;
use mink_core::protocol::{BucketId, BucketStatus};
use mink_core::table::TablePath;
use mink_log::LogBatch;

use crate::error::{NodeError, Result};
use crate::node::Node;
use crate::node::union::log_range;

/// The status of every bucket of table `path`, each from its leader.
pub(super) async fn bucket_statuses(node: &Node, path: &TablePath) -> Result<Vec<BucketStatus>> {
    match node.peers().await? {
        Some(peers) => Ok(peers.list_buckets(path).await?),
        None => node.list_buckets(path),
    }
}

/// The log `range` of a bucket, in log order, trimmed to the range.
pub(super) async fn bucket_log(
    node: &Node,
    bucket: &BucketId,
    range: Range<i64>,
) -> Result<BoxStream<'static, Result<LogBatch>>> {
    let not_leader = match node.bucket(bucket) {
        Ok((_, tablets)) => return Ok(log_range(tablets, range.start, range.end)),
        Err(NodeError::NotLeader(not_leader)) => not_leader,
        Err(error) => return Err(error),
    };
    let Some(peers) = node.peers().await? else {
        return Err(NodeError::NotLeader(not_leader));
    };
    let log = peers.read_range(bucket, range.start, range.end, &[]);
    Ok(log.map_ok(log_batch).map_err(NodeError::from).boxed())
}

/// A batch read from a leader as the log holds it (its rows already in the table's
/// current schema).
fn log_batch(read: ReadBatch) -> LogBatch {
    let metadata = read.metadata;
    LogBatch {
        base_offset: metadata.base_offset,
        last_offset: metadata.last_offset,
        commit_timestamp: metadata.commit_timestamp,
        schema_id: metadata.schema_id,
        size: read.batch.get_array_memory_size() as u64,
        batch: read.batch,
        changes: metadata.changes,
        writer: None,
    }
}
