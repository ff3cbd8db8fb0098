//! The appender's group commit under injected faults: failed writes, syncs and cuts, a
//! full disk, a changelog whose update fails.

use arrow::array::{ArrayRef, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema};
use mink_core::options::TableOptions;
use mink_core::table::{TableDescriptor, TablePath};

use super::*;
use crate::read::{PlannedBatch, read_planned};
use crate::segment::{encode_frame, scan_frames, segment_path};
use crate::tests::ids;
use crate::{LogBatch, LogTablet, WriterTag};

fn table() -> Arc<TableDescriptor> {
    let schema = Schema::new(vec![Field::new("id", DataType::Int64, false)]);
    let path = TablePath::new("db", "t");
    let table = TableDescriptor::new(path, schema, vec![], vec![], TableOptions::default());
    Arc::new(table.unwrap())
}

/// A write of `ids` outside any stream: `op` makes the write from the batch.
fn request(
    table: &Arc<TableDescriptor>,
    ids: &[i64],
    op: fn(RecordBatch) -> WriteOp,
) -> WriteRequest {
    let column: ArrayRef = Arc::new(Int64Array::from(ids.to_vec()));
    let batch = RecordBatch::try_new(Arc::clone(table.schema()), vec![column]).unwrap();
    let write = Write {
        op: op(batch),
        table: Arc::clone(table),
        stream: None,
        writer: None,
        sent: None,
    };
    WriteRequest {
        write,
        reply: oneshot::channel().0,
    }
}

/// An append of `ids` in `stream`.
fn streamed(stream: &WriteStream, table: &Arc<TableDescriptor>, ids: &[i64]) -> WriteRequest {
    in_stream(stream, request(table, ids, WriteOp::Append))
}

/// `request`, as a write of `stream`.
fn in_stream(stream: &WriteStream, mut request: WriteRequest) -> WriteRequest {
    request.write.stream = Some(stream.clone());
    request
}

/// A group of one append per slice of ids.
fn group(table: &Arc<TableDescriptor>, batches: &[&[i64]]) -> Vec<WriteRequest> {
    let append = |ids: &&[i64]| request(table, ids, WriteOp::Append);
    batches.iter().map(append).collect()
}

fn open(dir: &Path) -> Appender {
    let config = LogConfig {
        sync: true,
        ..LogConfig::default()
    };
    Appender::recover("t".into(), dir, config, None).unwrap()
}

/// `(base_offset, last_offset)` of every acknowledged write of a group.
fn acked(acks: Vec<Result<AppendAck>>) -> Vec<(i64, i64)> {
    let ack = |a: Result<AppendAck>| a.map(|a| (a.base_offset, a.last_offset)).unwrap();
    acks.into_iter().map(ack).collect()
}

/// The offsets of each write of a group, `None` for a write that failed.
fn answers(acks: Vec<Result<AppendAck>>) -> Vec<Option<(i64, i64)>> {
    let ack = |a: Result<AppendAck>| a.ok().map(|a| (a.base_offset, a.last_offset));
    acks.into_iter().map(ack).collect()
}

/// Every id the log of `dir` holds, in log order, as a reopened appender reads them.
fn read_back(dir: &Path) -> Vec<i64> {
    let appender = open(dir);
    let batches = appender.shared.read_state().batches.clone();
    let plan = batches
        .iter()
        .map(|(header, segment)| PlannedBatch {
            header: *header,
            segment: *segment,
            stream: None,
            cached: None,
        })
        .collect();
    let read = read_planned(appender.shared.source(), plan, LogBatch::from_found);
    ids(&read.unwrap()).concat()
}

fn segment_bytes(dir: &Path) -> Vec<u8> {
    std::fs::read(segment_path(dir, 0)).unwrap()
}

#[test]
fn a_failed_group_leaves_the_segment_as_it_was_and_the_next_lands_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let table = table();
    let mut appender = open(dir.path());
    let first = appender.commit(&group(&table, &[&[1, 2], &[3]])).unwrap().0;
    assert_eq!(acked(first), [(0, 1), (2, 2)]);
    let good = segment_bytes(dir.path());

    let failing = || group(&table, &[&[4, 5, 6], &[7]]);
    let first_frame = {
        let WriteOp::Append(batch) = &failing()[0].write.op else {
            unreachable!()
        };
        let mut header = appender.active.frames[0];
        let stored = StoredBatch {
            batch: batch.clone(),
            changes: None,
            writer: None,
            sent: None,
        };
        encode_frame(&mut header, stored).unwrap().0.len() as u64
    };
    let len = good.len() as u64;
    let failures = [
        (
            "the disk fills in the first frame's header",
            Some(len + 10),
            false,
        ),
        (
            "the disk fills mid-frame",
            Some(len + first_frame / 2),
            false,
        ),
        (
            "the disk fills in the second frame",
            Some(len + first_frame + 20),
            false,
        ),
        ("fsync fails after whole frames", None, true),
    ];
    for (what, space, fail_sync) in failures {
        appender.faults.space = space;
        appender.faults.fail_sync = fail_sync;
        let error = appender.commit(&failing()).unwrap_err();
        assert!(
            !what.contains("disk fills") || matches!(error, LogError::DiskFull { .. }),
            "{what}: {error}"
        );
        assert_eq!(segment_bytes(dir.path()), good, "{what}: byte for byte");
        assert_eq!(appender.shared.read_state().high_watermark, 3, "{what}");
        assert_eq!(appender.active.frames.len(), 2, "{what}");
        appender.faults = Faults::default();
        if appender.uncut {
            // The failed fsync failed the cut's fsync too: the next group retries it.
            appender.cut_back().unwrap();
        }
    }

    // A cut that fails is retried before the next group writes.
    appender.faults.space = Some(good.len() as u64 + 40);
    appender.faults.fail_cuts = 1;
    appender.commit(&group(&table, &[&[4]])).unwrap_err();
    assert!(appender.uncut);
    assert!(
        segment_bytes(dir.path()).len() > good.len(),
        "the cut failed"
    );
    appender.faults = Faults::default();

    let next = appender.commit(&group(&table, &[&[8, 9]])).unwrap().0;
    assert_eq!(
        acked(next),
        [(3, 4)],
        "offsets continue after the last good frame"
    );
    assert!(!appender.uncut);
    let bytes = segment_bytes(dir.path());
    assert_eq!(bytes[..good.len()], good[..]);
    let scanned = scan_frames(&segment_path(dir.path(), 0), 0).unwrap();
    assert!(!scanned.torn, "no hole, no tail");
    assert_eq!(scanned.frames[2].position, good.len() as u64);
    assert_eq!(scanned.valid_len, bytes.len() as u64);
    drop(appender);

    // What recovery makes of it: every acknowledged row, once.
    assert_eq!(open(dir.path()).next_offset, 5);
    assert_eq!(read_back(dir.path()), [1, 2, 3, 8, 9]);
}

#[test]
fn a_stream_stops_at_its_first_refused_write() {
    let dir = tempfile::tempdir().unwrap();
    let table = table();
    let mut appender = open(dir.path());
    let (stream, other) = (WriteStream::default(), WriteStream::default());
    // An upsert into a table without a primary key: refused at append time.
    let refused = in_stream(&stream, request(&table, &[2], WriteOp::Upsert));
    let first = vec![
        streamed(&stream, &table, &[1]),
        refused,
        streamed(&other, &table, &[10]),
        streamed(&stream, &table, &[3]),
        request(&table, &[20], WriteOp::Append),
    ];
    let answers_of_first = answers(appender.commit(&first).unwrap().0);
    assert_eq!(
        answers_of_first,
        [Some((0, 0)), None, Some((1, 1)), None, Some((2, 2))],
        "the write after the refused one in the same group is not written"
    );

    let second = vec![
        streamed(&stream, &table, &[4]),
        streamed(&other, &table, &[11]),
    ];
    let answers_of_second = answers(appender.commit(&second).unwrap().0);
    assert_eq!(
        answers_of_second,
        [None, Some((3, 3))],
        "nor one in a later group; other streams go on"
    );
    drop(appender);
    assert_eq!(read_back(dir.path()), [1, 10, 20, 11]);
}

#[test]
fn a_failed_group_stops_every_stream_in_it() {
    let dir = tempfile::tempdir().unwrap();
    let table = table();
    let mut appender = open(dir.path());
    let (stream, other, third) = (
        WriteStream::default(),
        WriteStream::default(),
        WriteStream::default(),
    );
    let first = appender
        .commit(&[streamed(&stream, &table, &[1])])
        .unwrap()
        .0;
    assert_eq!(acked(first), [(0, 0)]);
    let good = segment_bytes(dir.path());

    // Room for one more small frame, not for a big one: the big write fails its group.
    let small_frame = good.len() as u64;
    appender.faults.space = Some(small_frame * 2 + small_frame / 2);
    let big: Vec<i64> = (0..1000).collect();
    let failing = [
        streamed(&stream, &table, &big),
        streamed(&other, &table, &[2]),
    ];
    let error = appender.commit(&failing).unwrap_err();
    assert!(matches!(error, LogError::DiskFull { .. }), "{error}");
    assert_eq!(segment_bytes(dir.path()), good, "byte for byte");

    // A small write of each stream would fit now: only the stream that had no write
    // in the failed group is written.
    let next = [
        streamed(&stream, &table, &[3]),
        streamed(&other, &table, &[4]),
        streamed(&third, &table, &[5]),
    ];
    let answers_of_next = answers(appender.commit(&next).unwrap().0);
    assert_eq!(answers_of_next, [None, None, Some((1, 1))]);
    drop(appender);
    assert_eq!(read_back(dir.path()), [1, 5]);
}

/// A changelog for the appender's tests: it stores writes as written and records the
/// high watermark it sees at each commit; when `failing`, every update it starts fails,
/// and with `reports_failure` it tells so before the next group is written (else
/// only the next commit finds it, as when the update fails while that group is
/// written).
#[derive(Debug, Default)]
struct TestChangelog {
    shared: Option<Arc<Shared>>,
    seen: Arc<std::sync::Mutex<Vec<(i64, i64)>>>,
    failing: bool,
    reports_failure: bool,
    commits: u32,
}

impl Changelog for TestChangelog {
    fn prepare(&mut self, write: &Write) -> Result<Option<StoredBatch>> {
        let (WriteOp::Append(batch) | WriteOp::Upsert(batch) | WriteOp::Delete(batch)) = &write.op;
        Ok(Some(StoredBatch {
            batch: batch.clone(),
            changes: None,
            writer: None,
            sent: None,
        }))
    }
    fn commit(&mut self, end_offset: i64) -> Result<Applying> {
        self.settle()?;
        self.commits += 1;
        if let Some(shared) = &self.shared {
            let high_watermark = shared.read_state().high_watermark;
            self.seen.lock().unwrap().push((end_offset, high_watermark));
        }
        if !self.failing {
            return Ok(Applying::done());
        }
        let (done, applying) = oneshot::channel();
        let _ = done.send(Err(LogError::Changelog(
            "injected: the update fails".into(),
        )));
        Ok(Applying::pending(applying))
    }
    fn settle(&mut self) -> Result<()> {
        match self.failing && self.commits > 0 {
            true => Err(LogError::Changelog("injected: the update failed".into())),
            false => Ok(()),
        }
    }
    fn failure(&self) -> Option<String> {
        let failed = self.failing && self.commits > 0 && self.reports_failure;
        failed.then(|| "injected: the update failed".into())
    }
    fn schema_id(&self) -> u32 {
        0
    }
    fn abort(&mut self) {}
    fn applied_offset(&self) -> i64 {
        0
    }
    fn replay(&mut self, _: &LogBatch) -> Result<()> {
        Ok(())
    }
}

#[test]
fn a_snapshot_never_names_an_offset_above_the_high_watermark() {
    let dir = tempfile::tempdir().unwrap();
    let table = table();
    let config = LogConfig::default();
    let changelog = Box::new(TestChangelog::default());
    let mut appender = Appender::recover("t".into(), dir.path(), config, Some(changelog)).unwrap();
    let seen = Arc::default();
    appender.changelog = Some(Box::new(TestChangelog {
        shared: Some(Arc::clone(&appender.shared)),
        seen: Arc::clone(&seen),
        ..TestChangelog::default()
    }));
    appender.commit(&group(&table, &[&[1, 2]])).unwrap();
    appender.commit(&group(&table, &[&[3]])).unwrap();
    // The store applies a group only once the high watermark covers it.
    assert_eq!(*seen.lock().unwrap(), [(2, 2), (3, 3)]);
}

/// An upsert of `ids`, outside any stream.
fn upsert(table: &Arc<TableDescriptor>, ids: &[i64]) -> Write {
    request(table, ids, WriteOp::Upsert).write
}

/// A log whose changelog fails every update, started.
fn failing_log(dir: &Path, reports_failure: bool) -> LogTablet {
    let changelog = Box::new(TestChangelog {
        failing: true,
        reports_failure,
        ..TestChangelog::default()
    });
    let config = LogConfig::default();
    LogTablet::start(Appender::recover("t".into(), dir, config, Some(changelog)).unwrap())
}

#[tokio::test]
async fn a_durable_group_is_acknowledged_though_its_store_update_fails() {
    let dir = tempfile::tempdir().unwrap();
    let table = table();
    let log = failing_log(dir.path(), false);
    let write = |ids: &[i64]| upsert(&table, ids);
    // The group whose update fails, then the one written while it ran: both durable,
    // both acknowledged.
    let first = log.write(write(&[1])).await.unwrap();
    assert_eq!((first.base_offset, first.last_offset), (0, 0));
    let second = log.write(write(&[2])).await.unwrap();
    assert_eq!((second.base_offset, second.last_offset), (1, 1));
    // The bucket is fenced: nothing more is written.
    let error = log.write(write(&[3])).await.unwrap_err();
    assert!(error.to_string().contains("restart the node"), "{error}");
    assert!(matches!(error, LogError::ShuttingDown(_)), "{error}");
    assert_eq!(ids(&log.read(0, u64::MAX).await.unwrap()), [[1], [2]]);
}

#[tokio::test]
async fn a_group_after_a_failure_the_store_reports_is_not_written() {
    let dir = tempfile::tempdir().unwrap();
    let table = table();
    let log = failing_log(dir.path(), true);
    log.write(upsert(&table, &[1])).await.unwrap();
    let error = log.write(upsert(&table, &[2])).await.unwrap_err();
    assert!(error.to_string().contains("restart the node"), "{error}");
    assert_eq!(ids(&log.read(0, u64::MAX).await.unwrap()), [[1]]);
    assert_eq!(log.offsets(), (0, 1), "no offset taken");
}

/// An append of `ids` by checked writer `producer_id`, numbered `sequence`.
fn numbered(table: &Arc<TableDescriptor>, ids: &[i64], producer_id: i64, sequence: i32) -> Write {
    let mut write = request(table, ids, WriteOp::Append).write;
    write.writer = Some(Writer::Checked(WriterTag {
        producer_id,
        epoch: 0,
        first_sequence: sequence,
        last_sequence: sequence,
    }));
    write
}

/// `(base_offset, last_offset, duplicate)` of an acknowledgement, `None` for a refusal.
fn answer(ack: Result<AppendAck>) -> Option<(i64, i64, bool)> {
    ack.ok()
        .map(|a| (a.base_offset, a.last_offset, a.duplicate))
}

#[test]
fn a_checked_writer_s_batches_are_written_once() {
    let dir = tempfile::tempdir().unwrap();
    let table = table();
    let mut appender = open(dir.path());
    let request = |ids: &[i64], producer_id, sequence| WriteRequest {
        write: numbered(&table, ids, producer_id, sequence),
        reply: oneshot::channel().0,
    };
    // An attempt and its retry in one group; another writer's batch between them.
    let first = [
        request(&[1], 7, 0),
        request(&[10], 8, 0),
        request(&[1], 7, 0),
    ];
    let acks = appender.commit(&first).unwrap().0;
    let answers: Vec<_> = acks.into_iter().map(answer).collect();
    assert_eq!(
        answers,
        [Some((0, 0, false)), Some((1, 1, false)), Some((0, 0, true))]
    );

    let second = [
        request(&[2], 7, 1),
        request(&[2], 7, 1),
        request(&[1], 7, 0),
        request(&[4], 7, 3),
        request(&[3], 7, 2),
    ];
    let acks = appender.commit(&second).unwrap().0;
    let answers: Vec<_> = acks.into_iter().map(answer).collect();
    assert_eq!(
        answers,
        [
            Some((2, 2, false)),
            Some((2, 2, true)),
            // Older than the writer's last batch: written, its offsets not kept.
            Some((-1, -1, true)),
            // Past a number the log may not hold (a delete that wrote nothing).
            Some((3, 3, false)),
            // Below the last written: taken for a late attempt (a writer sends its
            // numbers in order).
            Some((-1, -1, true)),
        ]
    );
    assert_eq!(read_back(dir.path()), [1, 10, 2, 4]);
}

#[test]
fn a_failed_group_leaves_its_writers_numbers_unwritten() {
    let dir = tempfile::tempdir().unwrap();
    let table = table();
    let mut appender = open(dir.path());
    let request = || WriteRequest {
        write: numbered(&table, &[1], 7, 0),
        reply: oneshot::channel().0,
    };
    appender.faults.fail_sync = true;
    assert!(appender.commit(&[request()]).is_err());
    appender.faults.fail_sync = false;
    let acks = appender.commit(&[request()]).unwrap().0;
    assert_eq!(
        answer(acks.into_iter().next().unwrap()),
        Some((0, 0, false))
    );
    assert_eq!(read_back(dir.path()), [1]);
}

#[tokio::test]
async fn a_tablet_that_does_not_know_a_writer_finds_it_in_its_log() {
    let dir = tempfile::tempdir().unwrap();
    let table = table();
    let log = LogTablet::open("t".into(), dir.path(), LogConfig::default(), None).unwrap();
    log.write(request(&table, &[100], WriteOp::Append).write)
        .await
        .unwrap();
    for (sequence, id) in (0..3).zip(1..) {
        log.write(numbered(&table, &[id], 7, sequence))
            .await
            .unwrap();
    }
    drop(log);

    // Reopened, as a new leader opens the bucket: the writer is found from `since`.
    let log = LogTablet::open("t".into(), dir.path(), LogConfig::default(), None).unwrap();
    let found = log.recall_writer(7, 1, 1).await.unwrap();
    let offsets: Vec<_> = (found.iter())
        .map(|batch| (batch.tag.last_sequence, batch.base_offset))
        .collect();
    assert_eq!(offsets, [(0, 1), (1, 2), (2, 3)]);
    let resent = log.write(numbered(&table, &[3], 7, 2)).await.unwrap();
    assert_eq!(answer(Ok(resent)), Some((3, 3, true)));
    // Past a number the log lacks (a delete of missing keys writes nothing): written.
    let next = log.write(numbered(&table, &[4], 7, 4)).await.unwrap();
    assert_eq!(answer(Ok(next)), Some((4, 4, false)));
    // Known now, and its DoPut numbered past its last batch: nothing to look for.
    assert!(log.recall_writer(7, 5, 0).await.unwrap().is_empty());
    assert_eq!(
        ids(&log.read(0, u64::MAX).await.unwrap()),
        [[100], [1], [2], [3], [4]]
    );
}

#[tokio::test]
async fn a_search_for_a_writer_reads_no_more_than_its_bound() {
    let dir = tempfile::tempdir().unwrap();
    let table = table();
    let log = LogTablet::open("t".into(), dir.path(), LogConfig::default(), None).unwrap();
    for (sequence, id) in (0..3).zip(1..) {
        log.write(numbered(&table, &[id], 7, sequence))
            .await
            .unwrap();
    }
    let all = log.bytes_from(0);
    assert!(all > log.bytes_from(2) && log.bytes_from(3) == 0, "{all}");
    let found = log.batches_of_writer(7, 0, all).await.unwrap();
    assert_eq!(found.len(), 3);
    let error = log.batches_of_writer(7, 0, all - 1).await.unwrap_err();
    assert!(error.to_string().contains("not looked for"), "{error}");
    let last = log.bytes_from(2);
    assert_eq!(log.batches_of_writer(7, 2, last).await.unwrap().len(), 1);
}
