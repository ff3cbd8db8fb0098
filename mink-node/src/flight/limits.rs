//! The bounds of one request on the node port, in one place (`docs/security.md`,
//! "Request limits").
//!
//! A client controls every size in a ticket, an action and a DoPut stream. Each one the
//! node acts on is bounded here, in one of two ways:
//!
//! - **clamped**, silently, where the read protocol (`docs/design.md#read-protocol`) lets
//!   a server answer less than asked: a Scan or Tail is "bounded by max_bytes" and the client continues from the answer's
//!   next offset; a Snapshot's `batch_rows` only shapes the batches, not the rows; a Tail
//!   may end its wait early (an empty or short answer is a normal result). The client
//!   cannot tell a clamp from a log that held less.
//! - **refused** with `InvalidArgument` naming the limit, where answering less would be a
//!   wrong answer: a projection that repeats or invents a column, a lookup with more keys
//!   than one call may carry.
//!
//! The bounds of the wire itself (messages, frames, streams, a Scan's or Tail's answer) are
//! [`mink_core::protocol::limits`], shared with the Flight SQL port and the Kafka
//! listener, and re-exported here:
//!
//! | limit                            | value      | how      |
//! |----------------------------------|------------|----------|
//! | [`DEFAULT_MAX_BYTES`]            | 8 MiB      | a Scan/Tail `max_bytes` of 0 |
//! | [`MAX_ANSWER_BYTES`]             | 32 MiB     | clamped  |
//! | [`LIMIT_SCAN_READ_BYTES`]        | 8 MiB      | a log table's LimitScan is streamed, read this much of the log at a time; its `limit` (a row count) is not clamped |
//! | [`DEFAULT_BATCH_ROWS`]           | 8192       | a Snapshot `batch_rows` of 0 |
//! | [`MAX_BATCH_ROWS`]               | 65 536     | clamped  |
//! | [`mink_kv::MAX_CHUNK_BYTES`]   | 2 MiB      | a Snapshot batch ends past it (clamped) |
//! | [`MAX_TAIL_WAIT`]                | 60 s       | clamped  |
//! | min_bytes                        | the answer's max_bytes | clamped |
//! | projection                       | unique indexes < table width | refused |
//! | [`MAX_LOOKUP_KEYS`]              | 65 536     | refused  |
//! | [`MAX_MESSAGE_BYTES`]            | 256 MiB    | refused by tonic (`OutOfRange`) |
//! | [`MAX_STREAMS_PER_CONNECTION`]   | 256        | HTTP/2 SETTINGS: the client waits |
//! | [`MAX_REQUESTS_PER_CONNECTION`]  | 256        | queued per connection |
//! | [`MAX_HEADER_LIST_BYTES`]        | 64 KiB     | refused by HTTP/2 |
//! | [`MAX_FRAME_BYTES`]              | 1 MiB      | HTTP/2 SETTINGS: the client sends smaller frames |
//! | [`PUT_PIPELINE`]                 | 64         | batches of one DoPut in flight |
//! | [`PUT_PIPELINE_BYTES`]           | 32 MiB     | bytes (twice the messages) of one DoPut's batches in flight, reserved in the node's memory pool: the stream waits for its acks (a batch alone that the pool cannot take: `ResourceExhausted`) |
//! | [`mink_core::key::MAX_KEY_BYTES`] | 63 KiB    | an encoded primary key: the write refused, naming the row |
//!
//! A table's definition is bounded too, on every path that creates or alters one (the
//! node port, SQL, Flight SQL's bulk ingest), since each schema version is a full copy of
//! the columns stored in `meta.db`, held in memory and sent by `describe_table`:
//!
//! | limit                            | value      | how      |
//! |----------------------------------|------------|----------|
//! | [`MAX_COLUMNS`]                  | 4096       | fields of a schema, nested ones counted: refused |
//! | [`MAX_SCHEMA_VERSIONS`]          | 1000       | schema versions of a table (an ADD COLUMN adds one): refused |
//! | [`MAX_DESCRIPTOR_BYTES`]         | 64 MiB     | a table's encoded descriptor (every schema version): refused |
//! | [`mink_core::options::MIN_LAKE_FRESHNESS`] | 1 s | `lake.freshness`: refused below |
//! | table options                    | those of [`mink_core::options`] | anything else refused, Iceberg properties included |
//!
//! The node as a whole is bounded too: every open bucket holds files for as long as the
//! node runs, so the buckets of every table and partition together are bounded by the
//! process's open-file limit (`ulimit -n`, raised to its hard limit at start), less what
//! connections and the node's own files take ([`max_open_buckets`]). A `create_table` or
//! a write creating a partition past it is refused, naming the bound; a start opens every
//! table it has, over the bound or not:
//!
//! | limit                            | value      | how      |
//! |----------------------------------|------------|----------|
//! | [`crate::node::DEFAULT_MAX_BUCKET_NUM`] | 1024 | `bucket.num` of a table: refused |
//! | [`crate::node::DEFAULT_MAX_PARTITIONS`] | 1024 | partitions of a table: refused |
//! | open buckets of the node         | (`ulimit -n` - [`RESERVED_FILES`] - [`KV_CACHED_FILES`] - connections) / [`FILES_PER_BUCKET`], at least [`MIN_OPEN_BUCKETS`] (16) | refused |
//! | [`FILES_PER_BUCKET`]             | 2          | files counted for each bucket |
//! | [`RESERVED_FILES`]               | 256        | files kept for the node's own use |
//! | [`KV_CACHED_FILES`]              | 900        | files kept for the KV store's cache of open table files |
//!
//! Compressed Arrow IPC is refused wherever the node decodes a client's IPC (DoPut
//! batches, lookup keys, prefix-lookup prefixes) by [`mink_core::ipc_guard`].

pub use mink_core::protocol::limits::{
    DEFAULT_MAX_BYTES, MAX_ANSWER_BYTES, MAX_FRAME_BYTES, MAX_HEADER_LIST_BYTES, MAX_MESSAGE_BYTES,
    MAX_REQUESTS_PER_CONNECTION, MAX_STREAMS_PER_CONNECTION, MAX_TAIL_WAIT, answer_bytes,
    min_bytes, tail_wait,
};

use crate::error::NodeError;

/// The log a log table's LimitScan reads at a time: its answer is streamed as the client
/// takes it, so a `limit` beyond the rows of the bucket (up to 2^32 - 1) holds one such
/// read in memory, not the bucket's whole log.
pub const LIMIT_SCAN_READ_BYTES: u64 = 8 << 20;
/// Rows per Snapshot batch when the request says 0.
pub const DEFAULT_BATCH_ROWS: u32 = 8192;
/// The most rows of one Snapshot batch. Larger `batch_rows` are clamped: the client gets
/// the same rows in more batches.
pub const MAX_BATCH_ROWS: u32 = 1 << 16;
/// The most keys (or prefixes) of one `lookup` or `prefix_lookup`; more are refused.
pub const MAX_LOOKUP_KEYS: usize = 1 << 16;
/// Batches of one DoPut stream in flight at once (they are group-committed together).
pub const PUT_PIPELINE: usize = 64;
/// The bytes one DoPut stream's batches in flight hold, each counted as twice its IPC
/// message (what the node measurably holds per message received: the message and the
/// buffer it came in): a batch that would take them past this waits for the
/// acknowledgements of earlier ones. They are reserved in the node's memory pool, so many
/// streams together stay within it. A batch larger than this is still written, alone.
/// Four streams of 8 MiB batches wrote as fast with 16 MiB of messages in flight each as
/// with 64 MiB, and held a quarter of the memory.
pub const PUT_PIPELINE_BYTES: usize = 32 << 20;
/// The most fields one schema of a table has, nested fields counted.
pub const MAX_COLUMNS: usize = 4096;
/// The most schema versions a table has: every ADD COLUMN stores a new one, a full copy
/// of the columns.
pub const MAX_SCHEMA_VERSIONS: usize = 1000;
/// The largest table descriptor (names, options and every schema version, as `meta.db`
/// stores it and `describe_table` sends it). A column costs about 50 bytes in each
/// version, so a table of one column takes its 999 additions (26 MB) while a wide one
/// reaches this bound first.
pub const MAX_DESCRIPTOR_BYTES: usize = 64 << 20;

/// The files one open bucket is counted for: its log's active segment stays open (reads
/// open older segments only while they read them). One was measured per bucket, of log
/// and primary-key tables alike; the second is a margin.
pub const FILES_PER_BUCKET: u64 = 2;
/// The open files kept out of the bucket bound for the node's own use beyond buckets,
/// connections and the KV cache: `meta.db` and the lake catalog with their journals, the
/// KV store's journal, segments being read, files a tiering round writes, the runtime's
/// descriptors (a node of no table holds about 25).
pub const RESERVED_FILES: u64 = 256;
/// The table files the KV store keeps open for its reads, over every primary-key bucket:
/// fjall's descriptor cache, 900 files on Linux (fjall 3.1's default, `db_config.rs`).
pub const KV_CACHED_FILES: u64 = 900;

/// The most buckets a node may hold open when the process may open `open_files` files
/// and its ports together may hold `connections` connections (each one a socket): what
/// is left once [`RESERVED_FILES`], [`KV_CACHED_FILES`] and the connections are set
/// aside, divided by [`FILES_PER_BUCKET`]. No fewer than [`MIN_OPEN_BUCKETS`]: the
/// headroom is a worst case, and a node whose hard limit is as low as 1024 files still
/// takes a few small tables (`mink server --demo`'s among them).
pub fn max_open_buckets(open_files: u64, connections: u64) -> usize {
    let left = open_files
        .saturating_sub(RESERVED_FILES + KV_CACHED_FILES)
        .saturating_sub(connections);
    usize::try_from(left / FILES_PER_BUCKET)
        .unwrap_or(usize::MAX)
        .max(MIN_OPEN_BUCKETS)
}

/// The fewest buckets a node may hold open, whatever its open-file limit.
pub const MIN_OPEN_BUCKETS: usize = 16;

// A default never exceeds its limit.
const _: () = assert!(DEFAULT_BATCH_ROWS <= MAX_BATCH_ROWS);
// Every table the node keeps can be described in one message.
const _: () = assert!(MAX_DESCRIPTOR_BYTES <= MAX_MESSAGE_BYTES);

/// The rows per Snapshot batch for a requested `batch_rows`: 0 means
/// [`DEFAULT_BATCH_ROWS`], anything above [`MAX_BATCH_ROWS`] is clamped to it.
pub fn batch_rows(requested: u32) -> usize {
    let rows = match requested {
        0 => DEFAULT_BATCH_ROWS,
        n => n.min(MAX_BATCH_ROWS),
    };
    rows as usize
}

/// Checks a projection against a table of `width` columns: every index in range and none
/// repeated. Empty means every column.
///
/// # Errors
///
/// [`NodeError::InvalidArgument`] naming the first index out of range or repeated.
pub fn check_projection(
    table: &str,
    width: usize,
    columns: &[u32],
) -> Result<Vec<usize>, NodeError> {
    if columns.is_empty() {
        return Ok((0..width).collect());
    }
    let mut seen = vec![false; width];
    let mut projection = Vec::with_capacity(columns.len().min(width));
    for &column in columns {
        let index = usize::try_from(column).unwrap_or(usize::MAX);
        match seen.get_mut(index) {
            None => {
                return Err(NodeError::InvalidArgument(format!(
                    "column index {column} is out of range: table {table} has {width} columns"
                )));
            }
            Some(true) => {
                return Err(NodeError::InvalidArgument(format!(
                    "column index {column} appears more than once in the projection: \
                     name each column once"
                )));
            }
            Some(seen) => {
                *seen = true;
                projection.push(index);
            }
        }
    }
    Ok(projection)
}

/// Checks the number of keys (or prefixes) of one lookup.
///
/// # Errors
///
/// [`NodeError::InvalidArgument`] above [`MAX_LOOKUP_KEYS`].
pub fn check_lookup_keys(what: &str, keys: usize) -> Result<(), NodeError> {
    if keys > MAX_LOOKUP_KEYS {
        return Err(NodeError::InvalidArgument(format!(
            "a {what} of {keys} keys: one call takes at most {MAX_LOOKUP_KEYS}, split it"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(result: Result<Vec<usize>, NodeError>) -> String {
        match result {
            Err(NodeError::InvalidArgument(message)) => message,
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }

    #[test]
    fn open_buckets_are_what_the_file_limit_leaves() {
        // 20 000 files, four ports of 1024 connections: (20000 - 256 - 900 - 4096) / 2.
        assert_eq!(max_open_buckets(20_000, 4 * 1024), 7374);
        assert_eq!(max_open_buckets(2048, 0), 446);
        assert_eq!(max_open_buckets(1024, 64), MIN_OPEN_BUCKETS);
        assert!(max_open_buckets(u64::MAX, 0) > 1 << 60);
    }

    #[test]
    fn an_empty_projection_is_every_column() {
        assert_eq!(check_projection("t", 3, &[]).unwrap(), vec![0, 1, 2]);
        assert_eq!(check_projection("t", 0, &[]).unwrap(), Vec::<usize>::new());
    }

    #[test]
    fn a_unique_in_range_projection_keeps_its_order() {
        assert_eq!(check_projection("t", 3, &[2, 0]).unwrap(), vec![2, 0]);
        assert_eq!(check_projection("t", 3, &[1]).unwrap(), vec![1]);
        assert_eq!(check_projection("t", 3, &[0, 1, 2]).unwrap(), vec![0, 1, 2]);
    }

    #[test]
    fn a_repeated_column_is_refused() {
        let message = refused(check_projection("t", 3, &[1, 0, 1]));
        assert!(
            message.contains("column index 1 appears more than once"),
            "{message}"
        );
        let many = vec![0u32; 200_000];
        let message = refused(check_projection("t", 2, &many));
        assert!(message.contains("more than once"), "{message}");
    }

    #[test]
    fn an_index_out_of_range_is_refused() {
        let message = refused(check_projection("test.t", 2, &[0, 2]));
        assert!(
            message.contains("column index 2 is out of range"),
            "{message}"
        );
        assert!(message.contains("test.t has 2 columns"), "{message}");
        let message = refused(check_projection("t", 2, &[u32::MAX]));
        assert!(message.contains("4294967295"), "{message}");
        assert!(check_projection("t", 0, &[0]).is_err());
    }

    #[test]
    fn batch_rows_zero_is_the_default_and_large_ones_are_clamped() {
        assert_eq!(batch_rows(0), DEFAULT_BATCH_ROWS as usize);
        assert_eq!(batch_rows(1), 1);
        assert_eq!(batch_rows(MAX_BATCH_ROWS), MAX_BATCH_ROWS as usize);
        assert_eq!(batch_rows(u32::MAX), MAX_BATCH_ROWS as usize);
    }

    #[test]
    fn lookups_above_the_key_limit_are_refused() {
        assert!(check_lookup_keys("lookup", 0).is_ok());
        assert!(check_lookup_keys("lookup", MAX_LOOKUP_KEYS).is_ok());
        let err = check_lookup_keys("prefix_lookup", MAX_LOOKUP_KEYS + 1).unwrap_err();
        assert!(err.to_string().contains("at most 65536"), "{err}");
        assert!(matches!(err, NodeError::InvalidArgument(_)));
    }
}
