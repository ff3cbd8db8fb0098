//! The log tablet's reads and writes, across reopens and failed groups.

use arrow::array::AsArray;
use arrow::datatypes::Int64Type;

use super::*;
use crate::testing::{one_write_per_segment, rows, table, write};

/// The ids of each batch.
pub(super) fn ids(batches: &[LogBatch]) -> Vec<Vec<i64>> {
    let ids = |b: &LogBatch| {
        b.batch
            .column(0)
            .as_primitive::<Int64Type>()
            .values()
            .to_vec()
    };
    batches.iter().map(ids).collect()
}

#[tokio::test]
async fn a_reopened_log_reads_back_every_batch_across_rolled_segments() {
    let dir = tempfile::tempdir().unwrap();
    let table = table(&[]);
    let log = LogTablet::open("t".into(), dir.path(), one_write_per_segment(), None).unwrap();
    for batch in [&[1, 2, 3][..], &[4], &[5, 6], &[7, 8]] {
        write(&log, &table, WriteOp::Append(rows(&table, batch, "x"))).await;
    }
    drop(log);
    assert_eq!(segment::list_segments(dir.path()).unwrap(), [0, 3, 4, 6]);
    // A missing index and a torn tail, as a crash leaves them.
    std::fs::remove_file(segment::index_path(dir.path(), 3)).unwrap();
    let mut active = std::fs::OpenOptions::new()
        .append(true)
        .open(segment::segment_path(dir.path(), 6))
        .unwrap();
    std::io::Write::write_all(&mut active, &[7; 20]).unwrap();

    let log = LogTablet::open("t".into(), dir.path(), one_write_per_segment(), None).unwrap();
    assert_eq!(log.offsets(), (0, 8));
    let read = log.read(0, u64::MAX).await.unwrap();
    assert_eq!(ids(&read), [&[1, 2, 3][..], &[4], &[5, 6], &[7, 8]]);
    let offsets: Vec<(i64, i64)> = read
        .iter()
        .map(|b| (b.base_offset, b.last_offset))
        .collect();
    assert_eq!(offsets, [(0, 2), (3, 3), (4, 5), (6, 7)]);
    let ack = write(&log, &table, WriteOp::Append(rows(&table, &[9], "x"))).await;
    assert_eq!((ack.base_offset, ack.last_offset), (8, 8));
    assert_eq!(ids(&log.read(8, u64::MAX).await.unwrap()), [[9]]);
}

#[tokio::test]
async fn a_write_queued_behind_a_failed_group_of_its_stream_is_not_written() {
    let dir = tempfile::tempdir().unwrap();
    let table = table(&[]);
    let config = LogConfig {
        sync: false,
        ..LogConfig::default()
    };
    let mut appender = Appender::recover("t".into(), dir.path(), config, None).unwrap();
    // Room for a few one-row frames, not for a thousand rows.
    appender.faults.space = Some(4096);
    let log = LogTablet::start(appender);
    let stream = WriteStream::default();
    let append = |ids: &[i64], stream: Option<&WriteStream>| Write {
        op: WriteOp::Append(rows(&table, ids, "x")),
        table: Arc::clone(&table),
        stream: stream.cloned(),
        writer: None,
        sent: None,
    };
    let first = log.write(append(&[1], Some(&stream))).await.unwrap();
    assert_eq!((first.base_offset, first.last_offset), (0, 0));

    let big: Vec<i64> = (0..1000).collect();
    let mut failing = std::pin::pin!(log.write(append(&big, Some(&stream))));
    assert!(futures::poll!(failing.as_mut()).is_pending());
    // Once the appender has taken it into a group, the next write lands in a later one.
    while log.writes.capacity() < log.writes.max_capacity() {
        tokio::task::yield_now().await;
    }
    let mut behind = std::pin::pin!(log.write(append(&[2], Some(&stream))));
    assert!(futures::poll!(behind.as_mut()).is_pending());
    let error = failing.await.unwrap_err();
    assert!(matches!(error, LogError::DiskFull { .. }), "{error}");
    let error = behind.await.unwrap_err();
    assert!(error.to_string().contains("earlier batch"), "{error}");

    // The write fits, another stream (or none) writes it: the stream alone stopped.
    let other = log.write(append(&[3], None)).await.unwrap();
    assert_eq!((other.base_offset, other.last_offset), (1, 1));
    assert_eq!(ids(&log.read(0, u64::MAX).await.unwrap()), [[1], [3]]);
}
