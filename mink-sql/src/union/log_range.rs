//! The engine's side of a union read's log range: the bucket leaders' logs read with
//! Flight Scans (the session's client, so its login; [`MinkClient::read_range`]),
//! or their live rows with LiveRange reads, folded by the leaders ([`FlightLog`], the
//! [`LogSource`] of the engine's `LogRangeExec`). `t$changelog` reads
//! the log the same way ([`scan_log`]).

use arrow::array::RecordBatch;
use datafusion::error::Result;
use futures::stream::{self, BoxStream, StreamExt, TryStreamExt};
use mink_client::MinkClient;
use mink_scan::log_range::{LogRange, LogRangeBatch, LogSource};

use crate::split::external;

/// The bucket leaders' logs, read over Flight with a session's client.
#[derive(Debug)]
pub(crate) struct FlightLog {
    pub(crate) client: MinkClient,
}

impl LogSource for FlightLog {
    fn read(&self, range: &LogRange, columns: &[u32]) -> BoxStream<'static, Result<LogRangeBatch>> {
        scan_log(&self.client, range.clone(), columns.to_vec())
    }

    fn read_live(
        &self,
        range: &LogRange,
        columns: &[u32],
    ) -> BoxStream<'static, Result<RecordBatch>> {
        let (client, range, columns) = (self.client.clone(), range.clone(), columns.to_vec());
        let live = async move {
            client
                .live_range(&range.bucket, range.from, range.to, &columns)
                .await
        };
        stream::once(live).try_flatten().map_err(external).boxed()
    }
}

/// The log `range` (columns `columns` of the table), with each batch's change vector
/// (empty for a log table), read with Scans of the bucket's leader.
pub(crate) fn scan_log(
    client: &MinkClient,
    range: LogRange,
    columns: Vec<u32>,
) -> BoxStream<'static, Result<LogRangeBatch>> {
    let LogRange { bucket, from, to } = range;
    client
        .read_range(&bucket, from, to, &columns)
        .map_ok(|read| LogRangeBatch {
            rows: read.batch,
            changes: read.metadata.changes.unwrap_or_default(),
            base_offset: read.metadata.base_offset,
            commit_timestamp: read.metadata.commit_timestamp,
        })
        .map_err(external)
        .boxed()
}
