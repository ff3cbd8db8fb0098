//! The engine's side of a union read's log tail: the bucket leaders' logs read with
//! Flight Scans (the session's client, so its login), each answer trimmed to the range,
//! or their live rows with LiveTail reads, folded by the leaders ([`FlightLog`], the
//! [`LogSource`] of the engine's `LogTailExec`). `t$changelog` reads
//! the log the same way ([`scan_log`]).

use arrow::array::RecordBatch;
use datafusion::error::Result;
use futures::stream::{self, BoxStream, StreamExt, TryStreamExt};
use mink_client::{ClientError, MinkClient, ReadBatch};
use mink_scan::tail::{LogSource, TailBatch, TailRange};

use crate::split::external;

/// Bytes of log asked for per Scan of a tail.
const TAIL_SCAN_BYTES: u64 = 8 << 20;

/// The bucket leaders' logs, read over Flight with a session's client.
#[derive(Debug)]
pub(crate) struct FlightLog {
    pub(crate) client: MinkClient,
}

impl LogSource for FlightLog {
    fn read(&self, range: &TailRange, columns: &[u32]) -> BoxStream<'static, Result<TailBatch>> {
        scan_log(&self.client, range.clone(), columns.to_vec())
    }

    fn read_live(
        &self,
        range: &TailRange,
        columns: &[u32],
    ) -> BoxStream<'static, Result<RecordBatch>> {
        let (client, range, columns) = (self.client.clone(), range.clone(), columns.to_vec());
        let live = async move {
            client
                .live_tail(&range.bucket, range.from, range.to, &columns)
                .await
        };
        stream::once(live).try_flatten().map_err(external).boxed()
    }
}

/// The log `range` (columns `columns` of the table), with each batch's change vector
/// (empty for a log table), read with Scans of the bucket's leader.
pub(crate) fn scan_log(
    client: &MinkClient,
    range: TailRange,
    columns: Vec<u32>,
) -> BoxStream<'static, Result<TailBatch>> {
    let client = client.clone();
    let TailRange { bucket, from, to } = range;
    stream::try_unfold(from, move |offset| {
        let (client, bucket, columns) = (client.clone(), bucket.clone(), columns.clone());
        async move {
            if offset >= to {
                return Ok(None);
            }
            let answer = client
                .scan(&bucket, offset, TAIL_SCAN_BYTES, &columns)
                .await
                .map_err(external)?;
            if answer.batches.is_empty() {
                // The node's answer breaks the read's plan: not the statement's fault.
                return Err(external(ClientError::Protocol(format!(
                    "the log of {bucket} ends at {} before the planned {to}",
                    answer.next_offset
                ))));
            }
            let next = answer.next_offset;
            let batches: Vec<Result<TailBatch>> = answer
                .batches
                .into_iter()
                .filter_map(|read| trim(read, offset, to))
                .map(Ok)
                .collect();
            Ok(Some((stream::iter(batches), next)))
        }
    })
    .try_flatten()
    .boxed()
}

/// The rows of a Scan batch inside `[from, to)`, with their change types.
fn trim(read: ReadBatch, from: i64, to: i64) -> Option<TailBatch> {
    let base = read.metadata.base_offset;
    let rows = read.batch.num_rows();
    let start = (from - base).clamp(0, rows as i64) as usize;
    let end = (to - base).clamp(0, rows as i64) as usize;
    if end <= start {
        return None;
    }
    // A change vector that does not fit the rows is left empty: the key merge refuses it.
    let changes = read
        .metadata
        .changes
        .and_then(|changes| changes.get(start..end).map(<[u8]>::to_vec))
        .unwrap_or_default();
    Some(TailBatch {
        rows: read.batch.slice(start, end - start),
        changes,
        base_offset: base + start as i64,
        commit_timestamp: read.metadata.commit_timestamp,
    })
}
