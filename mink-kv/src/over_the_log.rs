//! The store as the log's changelog hook: a log tablet opened over a store that is behind
//! replays its changelog into the store.

use std::sync::Arc;

use arrow::array::{Array, AsArray, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Int64Type, Schema};
use mink_core::change::ChangeType;
use mink_core::key::RowCodec;
use mink_core::options::TableOptions;
use mink_core::table::{TableDescriptor, TablePath};
use mink_log::testing::{one_write_per_segment, rows, table, write};
use mink_log::{
    Applying, Changelog, LogBatch, LogConfig, LogError, LogTablet, REPLAY_CHUNK, StoredBatch,
    Write, WriteOp,
};

use crate::{KvConfig, KvStore, KvTablet, KvWriter};

/// Every stored row of a KV tablet as `(id, v)`, in key order.
fn kv_rows(table: &TableDescriptor, kv: &KvTablet) -> Vec<(i64, String)> {
    let batch = RowCodec::new(table)
        .unwrap()
        .decode(&kv.prefix(&[]).unwrap())
        .unwrap();
    let id = batch.column(0).as_primitive::<Int64Type>();
    let v = batch.column(1).as_string::<i32>();
    assert_eq!(v.null_count(), 0);
    (0..batch.num_rows())
        .map(|i| (id.value(i), v.value(i).to_string()))
        .collect()
}

/// A temporary directory with a KV store, a primary-key table (`id`) and a writer of
/// the store's tablet `tablet`.
fn kv_setup(tablet: &str) -> (tempfile::TempDir, Arc<TableDescriptor>, KvStore, KvWriter) {
    let dir = tempfile::tempdir().unwrap();
    let table = table(&["id"]);
    let kv = KvStore::open(&dir.path().join("kv"), &KvConfig::default()).unwrap();
    let writer = KvWriter::new(kv.tablet(tablet).unwrap(), Arc::clone(&table)).unwrap();
    (dir, table, kv, writer)
}

#[tokio::test]
async fn opening_replays_the_log_into_a_kv_store_that_is_behind() {
    let (dir, table, kv, writer) = kv_setup("up_to_date");
    let log_dir = dir.path().join("log");
    let log = LogTablet::open(
        "t".into(),
        &log_dir,
        one_write_per_segment(),
        Some(Box::new(writer)),
    )
    .unwrap();
    write(&log, &table, WriteOp::Upsert(rows(&table, &[1, 2, 3], "a"))).await;
    write(&log, &table, WriteOp::Upsert(rows(&table, &[2], "b"))).await;
    let ack = write(&log, &table, WriteOp::Delete(rows(&table, &[3, 4], "-"))).await;
    assert_eq!((ack.base_offset, ack.last_offset), (5, 5), "-D of 3 only");
    drop(log);

    let behind = kv.tablet("behind").unwrap();
    let writer = KvWriter::new(behind.clone(), Arc::clone(&table)).unwrap();
    let log = LogTablet::open(
        "t".into(),
        &log_dir,
        one_write_per_segment(),
        Some(Box::new(writer)),
    )
    .unwrap();
    assert_eq!(behind.applied_offset().unwrap(), 6);
    let expected = [(1, "a".to_string()), (2, "b".to_string())];
    assert_eq!(kv_rows(&table, &behind), expected);
    assert_eq!(kv_rows(&table, &kv.tablet("up_to_date").unwrap()), expected);
    let changes: Vec<Vec<u8>> = log
        .read(0, u64::MAX)
        .await
        .unwrap()
        .into_iter()
        .map(|b| b.changes.unwrap())
        .collect();
    assert_eq!(changes, [vec![0, 0, 0], vec![1, 2], vec![3]]);
}

/// A KV writer that records the offsets it is asked to commit.
#[derive(Debug)]
struct RecordingCommits {
    writer: KvWriter,
    commits: Arc<std::sync::Mutex<Vec<i64>>>,
}

impl Changelog for RecordingCommits {
    fn prepare(&mut self, write: &Write) -> mink_log::Result<Option<StoredBatch>> {
        self.writer.prepare(write)
    }
    fn schema_id(&self) -> u32 {
        self.writer.schema_id()
    }
    fn commit(&mut self, end_offset: i64) -> mink_log::Result<Applying> {
        self.commits.lock().unwrap().push(end_offset);
        self.writer.commit(end_offset)
    }
    fn settle(&mut self) -> mink_log::Result<()> {
        self.writer.settle()
    }
    fn failure(&self) -> Option<String> {
        self.writer.failure()
    }
    fn abort(&mut self) {
        self.writer.abort();
    }
    fn applied_offset(&self) -> i64 {
        self.writer.applied_offset()
    }
    fn replay(&mut self, batch: &LogBatch) -> mink_log::Result<()> {
        self.writer.replay(batch)
    }
}

#[tokio::test]
async fn a_long_replay_is_applied_a_chunk_at_a_time() {
    let (dir, table, kv, writer) = kv_setup("source");
    let config = || LogConfig {
        sync: false,
        ..LogConfig::default()
    };
    let log_dir = dir.path().join("log");
    let log = LogTablet::open("t".into(), &log_dir, config(), Some(Box::new(writer))).unwrap();
    // Two chunks and one batch of one-row batches.
    let batches = 2 * REPLAY_CHUNK + 1;
    for id in 0..batches as i64 {
        write(&log, &table, WriteOp::Upsert(rows(&table, &[id], "v"))).await;
    }
    drop(log);

    let rebuilt = kv.tablet("rebuilt").unwrap();
    let commits = Arc::new(std::sync::Mutex::new(Vec::new()));
    let recording = RecordingCommits {
        writer: KvWriter::new(rebuilt.clone(), Arc::clone(&table)).unwrap(),
        commits: Arc::clone(&commits),
    };
    let _log = LogTablet::open("t".into(), &log_dir, config(), Some(Box::new(recording))).unwrap();
    let chunk = REPLAY_CHUNK as i64;
    assert_eq!(*commits.lock().unwrap(), [chunk, 2 * chunk, 2 * chunk + 1]);
    assert_eq!(rebuilt.applied_offset().unwrap(), batches as i64);
    assert_eq!(
        kv_rows(&table, &rebuilt),
        kv_rows(&table, &kv.tablet("source").unwrap())
    );
    assert_eq!(kv_rows(&table, &rebuilt).len(), batches);
}

/// A changelog that logs each upsert as inserts and checks nothing: the log of a node
/// from before keys were bounded.
#[derive(Debug)]
struct Unchecked;

impl Changelog for Unchecked {
    fn prepare(&mut self, write: &Write) -> mink_log::Result<Option<StoredBatch>> {
        let (WriteOp::Append(batch) | WriteOp::Upsert(batch) | WriteOp::Delete(batch)) = &write.op;
        Ok(Some(StoredBatch {
            changes: Some(vec![ChangeType::Insert as u8; batch.num_rows()]),
            batch: batch.clone(),
            writer: None,
            sent: None,
        }))
    }
    fn schema_id(&self) -> u32 {
        0
    }
    fn commit(&mut self, _: i64) -> mink_log::Result<Applying> {
        Ok(Applying::done())
    }
    fn failure(&self) -> Option<String> {
        None
    }
    fn settle(&mut self) -> mink_log::Result<()> {
        Ok(())
    }
    fn abort(&mut self) {}
    fn applied_offset(&self) -> i64 {
        0
    }
    fn replay(&mut self, _: &LogBatch) -> mink_log::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn a_logged_key_too_long_for_the_store_is_left_out_of_it_on_replay() {
    // `v TEXT PRIMARY KEY, id BIGINT`, keyed by the string.
    let schema = Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("v", DataType::Utf8, false),
    ]);
    let path = TablePath::new("db", "t");
    let options = TableOptions::default();
    let table = TableDescriptor::new(path, schema, vec!["v".into()], vec![], options);
    let table = Arc::new(table.unwrap());
    let upsert = |ids: &[i64], keys: &[&str]| Write {
        op: WriteOp::Upsert(
            RecordBatch::try_new(
                Arc::clone(table.schema()),
                vec![
                    Arc::new(Int64Array::from(ids.to_vec())),
                    Arc::new(StringArray::from(keys.to_vec())),
                ],
            )
            .unwrap(),
        ),
        table: Arc::clone(&table),
        stream: None,
        writer: None,
        sent: None,
    };
    let long = "x".repeat(70_000);
    let dir = tempfile::tempdir().unwrap();
    let log_dir = dir.path().join("log");
    let config = || LogConfig {
        sync: false,
        ..LogConfig::default()
    };
    let log = LogTablet::open("t".into(), &log_dir, config(), Some(Box::new(Unchecked)));
    let log = log.unwrap();
    log.write(upsert(&[1, 2, 3], &["a", &long, "b"]))
        .await
        .unwrap();
    drop(log);

    // The replay leaves the long key out; the rest is stored, and flushed to fjall.
    let kv = KvStore::open(&dir.path().join("kv"), &KvConfig::default()).unwrap();
    let tablet = kv.tablet("b").unwrap();
    let writer = KvWriter::new(tablet.clone(), Arc::clone(&table)).unwrap();
    let log = LogTablet::open("t".into(), &log_dir, config(), Some(Box::new(writer)));
    let log = log.unwrap();
    tablet.flush().unwrap();
    assert_eq!(tablet.flushed_offset().unwrap(), 3);
    let stored = RowCodec::new(&table)
        .unwrap()
        .decode(&tablet.prefix(&[]).unwrap());
    let stored = stored.unwrap();
    let stored_ids = stored
        .column(0)
        .as_primitive::<Int64Type>()
        .values()
        .to_vec();
    assert_eq!(stored_ids, [1, 3]);

    // The bucket goes on: a long key is refused, nothing of it written; others are.
    let error = log.write(upsert(&[4], &[&long])).await.unwrap_err();
    assert!(matches!(error, LogError::InvalidArgument(_)), "{error}");
    assert!(error.to_string().contains("MAX_KEY_BYTES"), "{error}");
    let ack = log.write(upsert(&[5], &["c"])).await.unwrap();
    assert_eq!((ack.base_offset, ack.last_offset), (3, 3));
    tablet.flush().unwrap();
    assert_eq!(tablet.flushed_offset().unwrap(), 4);
}

#[tokio::test]
async fn a_kv_store_inside_a_batch_of_the_log_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let table = table(&["id"]);
    let kv = KvStore::open(&dir.path().join("kv"), &KvConfig::default()).unwrap();
    let log_dir = dir.path().join("log");
    let log = LogTablet::open("t".into(), &log_dir, LogConfig::default(), None).unwrap();
    write(&log, &table, WriteOp::Append(rows(&table, &[1, 2, 3], "a"))).await;
    drop(log);
    let mut writer = KvWriter::new(kv.tablet("b").unwrap(), Arc::clone(&table)).unwrap();
    writer.commit(1).unwrap();
    writer.settle().unwrap();
    let error = LogTablet::open(
        "t".into(),
        &log_dir,
        LogConfig::default(),
        Some(Box::new(writer)),
    )
    .unwrap_err();
    assert_eq!(
        error.to_string(),
        "corrupt log: bucket t: the KV store is at offset 1, which is not a batch boundary of the retained log"
    );
}
