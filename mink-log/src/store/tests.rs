//! The log on a `file://` store: what is acknowledged is rebuilt from the store alone, a
//! newer writer fences an older one, and one upload carries many buckets' writes.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::segment;
use crate::store::listing::{Chains, PackDirectories};
use crate::store::writer::UPLOADS_IN_FLIGHT;
use crate::store::{compaction, coverage, stream};
use crate::testing::{rows, table, write};
use crate::tests::ids;
use crate::{LogConfig, LogTablet, Write, WriteOp};
use mink_core::protocol::AppendAck;
use mink_core::table::TableDescriptor;

fn store_config(store: &Path) -> LogStoreConfig {
    LogStoreConfig::new(file_store_url(store))
}

fn file_store_url(store: &Path) -> String {
    format!("file://{}", store.display())
}

fn log_config(store: &Arc<LogStore>) -> LogConfig {
    LogConfig {
        segment_bytes: 256,
        store: Some(Arc::clone(store)),
        ..LogConfig::default()
    }
}

/// A node's store over `store`, its logs under `disk`.
async fn open_store(store: &Path, disk: &Path) -> Arc<LogStore> {
    LogStore::open(store_config(store), disk, 256)
        .await
        .unwrap()
}

/// The log of bucket `key` under `disk`.
fn open_log(disk: &Path, key: &str, config: LogConfig) -> LogTablet {
    LogTablet::open(key.into(), &disk.join(key), config, None).unwrap()
}

/// A config whose one segment holds every write of a test: its frames go in no stream
/// object, so a restart reads them from the WAL objects.
fn one_segment(store: &Arc<LogStore>) -> LogConfig {
    LogConfig {
        segment_bytes: 1 << 20,
        ..log_config(store)
    }
}

/// A node's store over `store`, its logs under `disk`, and the log of bucket `t1/b0`.
async fn open_bucket(store: &Path, disk: &Path) -> (Arc<LogStore>, LogTablet) {
    let store = open_store(store, disk).await;
    let log = open_log(disk, "t1/b0", log_config(&store));
    (store, log)
}

/// The WAL objects of `epoch` in a local store, in order.
fn wal_objects(store: &Path, epoch: u64) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(store.join("wal").join(wal::number(epoch)))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| !name.contains('#'))
        .collect();
    names.sort();
    names
}

/// The furthest checkpoint of a local store once it reaches `place` (waiting up to 5 s).
async fn checkpoint_reaching(store: &Path, place: coverage::Place) -> coverage::Place {
    let mut furthest = None;
    for _ in 0..500 {
        furthest = std::fs::read_dir(store.join("checkpoints"))
            .into_iter()
            .flatten()
            .filter_map(|entry| coverage::parse_name(&entry.unwrap().file_name().to_string_lossy()))
            .max();
        if furthest.is_some_and(|furthest| furthest >= place) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let furthest = furthest.expect("a checkpoint");
    assert!(furthest >= place, "the checkpoint stops at {furthest:?}");
    furthest
}

#[tokio::test]
async fn a_node_that_lost_its_disk_rebuilds_every_acknowledged_batch_from_the_store() {
    let (store_dir, disk) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let table = table(&[]);
    let store = open_store(store_dir.path(), disk.path()).await;
    assert_eq!(store.epoch(), 1);
    let log_a = open_log(disk.path(), "t1/b0", log_config(&store));
    let log_b = open_log(disk.path(), "t1/p2/b1", log_config(&store));
    for i in 0..20 {
        write(
            &log_a,
            &table,
            WriteOp::Append(rows(&table, &[i, i + 100], "a")),
        )
        .await;
        write(&log_b, &table, WriteOp::Append(rows(&table, &[i], "b"))).await;
    }
    drop((log_a, log_b, store));

    let lost = tempfile::tempdir().unwrap();
    let store = open_store(store_dir.path(), lost.path()).await;
    assert_eq!(store.epoch(), 2);
    let log_a = open_log(lost.path(), "t1/b0", log_config(&store));
    let log_b = open_log(lost.path(), "t1/p2/b1", log_config(&store));
    assert_eq!((log_a.offsets(), log_b.offsets()), ((0, 40), (0, 20)));
    let expected_a: Vec<Vec<i64>> = (0..20).map(|i| vec![i, i + 100]).collect();
    assert_eq!(ids(&log_a.read(0, u64::MAX).await.unwrap()), expected_a);
    // The rebuilt log goes on, and its next life reads both epochs back.
    write(&log_b, &table, WriteOp::Append(rows(&table, &[20], "b"))).await;
    drop((log_a, log_b, store));
    let store = LogStore::open(store_config(store_dir.path()), lost.path(), 1 << 20)
        .await
        .unwrap();
    let log_b = open_log(lost.path(), "t1/p2/b1", log_config(&store));
    let expected_b: Vec<Vec<i64>> = (0..21).map(|i| vec![i]).collect();
    assert_eq!(ids(&log_b.read(0, u64::MAX).await.unwrap()), expected_b);
}

/// Appends row `id` to `log`: acknowledged or not.
async fn try_append(log: &LogTablet, table: &Arc<TableDescriptor>, id: i64) -> Result<AppendAck> {
    log.write(Write {
        op: WriteOp::Append(rows(table, &[id], "x")),
        table: Arc::clone(table),
        stream: None,
        writer: None,
        sent: None,
    })
    .await
}

/// Appends rows 0 to `count - 1` to `log`, one a write; each write's ids.
async fn append_each(log: &LogTablet, count: i64) -> Vec<Vec<i64>> {
    let table = table(&[]);
    let written: Vec<Vec<i64>> = (0..count).map(|i| vec![i]).collect();
    for ids in &written {
        write(log, &table, WriteOp::Append(rows(&table, ids, "x"))).await;
    }
    written
}

/// Waits until every segment `log` sealed is in the store, in stream objects of their
/// own or in packs (uploads run in the background; up to 5 s).
async fn all_sealed_streamed(log: &LogTablet) {
    for _ in 0..500 {
        {
            let state = log.shared.read_state();
            if (state.batches.iter()).all(|(_, segment)| {
                *segment == state.active_segment || state.streamed.contains_key(segment)
            }) {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("sealed segments not in the store after 5 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sealed_segments_become_stream_objects_the_history_is_read_from() {
    let (store_dir, disk) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let table = table(&[]);
    let (store, log) = open_bucket(store_dir.path(), disk.path()).await;
    let dir = disk.path().join("t1/b0");
    let written: Vec<Vec<i64>> = (0..30).map(|i| vec![i, i + 1000]).collect();
    for ids in &written {
        write(&log, &table, WriteOp::Append(rows(&table, ids, "x"))).await;
    }
    let sealed = segment::list_segments(&dir).unwrap().len() - 1;
    assert!(sealed >= 3, "{sealed} sealed segments");
    all_sealed_streamed(&log).await;
    let in_store = log.store_usage().unwrap().stream_bytes;
    // Without their local copies (as once the grace is over), reads go to the store.
    let active = log.shared.read_state().active_segment;
    for base in segment::list_segments(&dir).unwrap() {
        if base != active {
            std::fs::remove_file(segment::segment_path(&dir, base)).unwrap();
        }
    }
    assert_eq!(ids(&log.read(0, u64::MAX).await.unwrap()), written);
    assert_eq!(ids(&log.read(7, 600).await.unwrap())[0], written[3]);
    drop((log, store));

    // A lost disk: the history comes from the stream objects, the rest from the WAL.
    let lost = tempfile::tempdir().unwrap();
    let (_store, log) = open_bucket(store_dir.path(), lost.path()).await;
    assert_eq!(log.offsets(), (0, 60));
    let streamed = log.store_usage().unwrap().stream_bytes;
    assert!(
        streamed >= in_store,
        "{streamed} bytes of {in_store} read from the store"
    );
    assert_eq!(ids(&log.read(0, u64::MAX).await.unwrap()), written);
    write(&log, &table, WriteOp::Append(rows(&table, &[99], "x"))).await;
    assert_eq!(log.offsets(), (0, 61));
}

#[tokio::test]
async fn a_newer_writer_fences_the_older_which_acknowledges_nothing_more() {
    let (store_dir, disk_a, disk_b) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let table = table(&[]);
    let (old, old_log) = open_bucket(store_dir.path(), disk_a.path()).await;
    write(&old_log, &table, WriteOp::Append(rows(&table, &[1], "old"))).await;

    let new = open_store(store_dir.path(), disk_b.path()).await;
    assert!(new.epoch() > old.epoch());
    let refused = try_append(&old_log, &table, 2).await.unwrap_err();
    assert!(
        matches!(refused, LogError::Fenced { epoch: 1 }),
        "{refused}"
    );
    assert_eq!(
        old_log.offsets(),
        (0, 1),
        "the refused write is not visible"
    );

    let new_log = open_log(disk_b.path(), "t1/b0", log_config(&new));
    write(&new_log, &table, WriteOp::Append(rows(&table, &[3], "new"))).await;
    assert_eq!(ids(&new_log.read(0, u64::MAX).await.unwrap()), [[1], [3]]);
    drop((old_log, new_log));

    // A third life sees what each acknowledged, nothing the fenced one wrote after.
    let disk_c = tempfile::tempdir().unwrap();
    let (_store, log) = open_bucket(store_dir.path(), disk_c.path()).await;
    assert_eq!(ids(&log.read(0, u64::MAX).await.unwrap()), [[1], [3]]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_writer_stays_fenced_once_the_upkeep_cleared_the_wal_behind_a_checkpoint() {
    let (store_dir, disk_a, disk_b) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let table = table(&[]);
    let (_old, old_log) = open_bucket(store_dir.path(), disk_a.path()).await;
    write(&old_log, &table, WriteOp::Append(rows(&table, &[1], "old"))).await;

    // The old writer pauses; a newer one fences it, writes, checkpoints past its epoch,
    // and its upkeep deletes the old epoch's WAL objects.
    let (new, new_log) = open_bucket(store_dir.path(), disk_b.path()).await;
    let written = append_each(&new_log, 30).await;
    checkpoint_reaching(store_dir.path(), (new.epoch(), 1)).await;
    for _ in 0..500 {
        if wal_objects(store_dir.path(), 1).len() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        wal_objects(store_dir.path(), 1),
        [wal::number(1)],
        "the old epoch keeps its fence alone"
    );

    // The old writer wakes: its next place is still taken.
    let refused = try_append(&old_log, &table, 2).await.unwrap_err();
    assert!(
        matches!(refused, LogError::Fenced { epoch: 1 }),
        "{refused}"
    );
    drop((old_log, new_log));
    let lost = tempfile::tempdir().unwrap();
    let (_store, log) = open_bucket(store_dir.path(), lost.path()).await;
    let mut expected = vec![vec![1]];
    expected.extend(written);
    assert_eq!(ids(&log.read(0, u64::MAX).await.unwrap()), expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_upload_carries_the_writes_of_many_buckets() {
    let (store_dir, disk) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let table = table(&[]);
    let mut config = store_config(store_dir.path());
    config.interval = Duration::from_millis(200);
    let store = LogStore::open(config, disk.path(), 1 << 20).await.unwrap();
    let logs: Vec<LogTablet> = (0..8)
        .map(|b| {
            let dir = disk.path().join(format!("t1/b{b}"));
            LogTablet::open(format!("b{b}"), &dir, log_config(&store), None).unwrap()
        })
        .collect();
    let started = std::time::Instant::now();
    let writes = logs
        .iter()
        .map(|log| write(log, &table, WriteOp::Append(rows(&table, &[1], "x"))));
    futures::future::join_all(writes).await;
    let elapsed = started.elapsed();
    let objects = wal_objects(store_dir.path(), store.epoch());
    assert!(
        objects.len() <= 2,
        "8 buckets' writes in {elapsed:?} took {} uploads",
        objects.len()
    );
}

#[tokio::test]
async fn torn_objects_in_flight_on_a_local_store_were_never_acknowledged_and_go() {
    let (store_dir, disk) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let table = table(&[]);
    let (store, log) = open_bucket(store_dir.path(), disk.path()).await;
    write(&log, &table, WriteOp::Append(rows(&table, &[1], "x"))).await;
    drop((log, store));
    // A power cut kept the names of the next two objects in flight, not the first's bytes.
    let place = |seq| {
        (store_dir.path().join("wal"))
            .join(wal::number(1))
            .join(wal::number(seq))
    };
    std::fs::write(place(1), b"MINKWAL1\0\0").unwrap();
    let landed = wal::Section {
        key: "t1/b0".into(),
        frames: vec![Bytes::from_static(b"never acknowledged")],
    };
    let landed = Bytes::from(wal::encode_writes(1, 2, &[landed]).unwrap());
    std::fs::write(place(2), landed).unwrap();

    let (_store, log) = open_bucket(store_dir.path(), disk.path()).await;
    assert_eq!(ids(&log.read(0, u64::MAX).await.unwrap()), [[1]]);
    assert_eq!(
        wal_objects(store_dir.path(), 1),
        [wal::number(0), wal::number(1)],
        "the fence takes the first torn object's place, the one after it goes"
    );
}

#[tokio::test]
async fn a_damaged_object_before_those_a_writer_has_in_flight_is_corruption() {
    let (store_dir, disk) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let table = table(&[]);
    let store = open_store(store_dir.path(), disk.path()).await;
    // No stream object, no checkpoint: a restart reads every WAL object.
    let log = open_log(disk.path(), "t1/b0", one_segment(&store));
    for i in 0..=UPLOADS_IN_FLIGHT as i64 {
        write(&log, &table, WriteOp::Append(rows(&table, &[i], "x"))).await;
    }
    drop((log, store));
    let first = store_dir
        .path()
        .join("wal")
        .join(wal::number(1))
        .join(wal::number(0));
    let mut bytes = std::fs::read(&first).unwrap();
    bytes[40] ^= 0xff;
    std::fs::write(&first, bytes).unwrap();
    let error = LogStore::open(store_config(store_dir.path()), disk.path(), 256)
        .await
        .unwrap_err();
    assert!(matches!(error, LogError::Corrupt(_)), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_passes_wal_objects_wholly_in_stream_objects_even_of_an_idle_bucket() {
    let (store_dir, disk) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let table = table(&[]);
    let store = open_store(store_dir.path(), disk.path()).await;
    let config = LogConfig {
        segment_max_age: Duration::from_millis(200),
        ..log_config(&store)
    };
    let busy = open_log(disk.path(), "t1/b0", config.clone());
    let idle = open_log(disk.path(), "t1/b1", config.clone());
    let dropped = open_log(disk.path(), "t2/b0", config);
    write(&idle, &table, WriteOp::Append(rows(&table, &[-1], "idle"))).await;
    write(
        &dropped,
        &table,
        WriteOp::Append(rows(&table, &[-2], "dropped")),
    )
    .await;
    dropped.forget();
    let written = append_each(&busy, 30).await;
    // The idle bucket's segment is sealed and uploaded (in a pack or an object of its
    // own) after 200 ms without writes.
    let (epoch, seq) = checkpoint_reaching(store_dir.path(), (1, 30)).await;
    drop((busy, idle, dropped, store));

    // The WAL objects before the checkpoint are not needed any more: without them (the
    // upkeep may have deleted some already), a lost disk reads every bucket back.
    for before in 0..seq {
        let object = store_dir
            .path()
            .join("wal")
            .join(wal::number(epoch))
            .join(wal::number(before));
        let _ = std::fs::remove_file(object);
    }
    let lost = tempfile::tempdir().unwrap();
    let store = open_store(store_dir.path(), lost.path()).await;
    let open = |key: &str| open_log(lost.path(), key, log_config(&store));
    let (busy, idle) = (open("t1/b0"), open("t1/b1"));
    assert_eq!(ids(&busy.read(0, u64::MAX).await.unwrap()), written);
    assert_eq!(ids(&idle.read(0, u64::MAX).await.unwrap()), [[-1]]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_retention_removed_stays_removed_after_a_restart() {
    let (store_dir, disk) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (store, log) = open_bucket(store_dir.path(), disk.path()).await;
    let written = append_each(&log, 30).await;
    // The sealed segments are uploaded (some merged) before retention removes them.
    all_sealed_streamed(&log).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert!(log.enforce_retention(Duration::ZERO, None).unwrap() > 0);
    let (log_start, end) = log.offsets();
    assert!(log_start > 0);
    let starts = store_dir.path().join("starts/t1/b0");
    let recorded = stream::offset_name(log_start);
    while !starts.join(&recorded).exists() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop((log, store));

    let lost = tempfile::tempdir().unwrap();
    let (_store, log) = open_bucket(store_dir.path(), lost.path()).await;
    assert_eq!(log.offsets(), (log_start, end));
    let read = ids(&log.read(log_start, u64::MAX).await.unwrap());
    assert_eq!(read, written[log_start as usize..]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_segments_of_many_buckets_go_up_in_packs_and_read_back() {
    let (store_dir, disk) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let table = table(&[]);
    let buckets: Vec<String> = (0..6).map(|b| format!("t1/b{b}")).collect();
    let open_all = |store: &Arc<LogStore>, disk: &Path| -> Vec<LogTablet> {
        let open = |key: &String| open_log(disk, key, log_config(store));
        buckets.iter().map(open).collect()
    };
    // One segment per bucket: nothing is sealed while writing.
    let config = LogStoreConfig::new(file_store_url(store_dir.path()));
    let store = LogStore::open(config.clone(), disk.path(), 1 << 20)
        .await
        .unwrap();
    let logs: Vec<LogTablet> = buckets
        .iter()
        .map(|key| open_log(disk.path(), key, one_segment(&store)))
        .collect();
    // Fewer segments each than a merge takes (the `compaction` module): they stay packed.
    let written: Vec<Vec<i64>> = (0..6).map(|i| vec![i]).collect();
    for log in &logs {
        for ids in &written {
            write(log, &table, WriteOp::Append(rows(&table, ids, "x"))).await;
        }
    }
    drop((logs, store));

    // A lost disk: the logs are rebuilt in 256-byte segments, all sealed at once, and
    // go up together.
    let lost = tempfile::tempdir().unwrap();
    let store = LogStore::open(config.clone(), lost.path(), 256)
        .await
        .unwrap();
    let logs = open_all(&store, lost.path());
    let packs = store_dir.path().join("packs");
    for _ in 0..500 {
        if logs
            .iter()
            .all(|log| log.shared.read_state().streamed.len() > 1)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let packed = std::fs::read_dir(&packs)
        .map(|dir| dir.count())
        .unwrap_or(0);
    assert!(packed > 0, "no pack in {}", packs.display());
    for log in &logs {
        let state = log.shared.read_state();
        assert!(
            state
                .streamed
                .values()
                .any(|object| object.object.path.as_ref().starts_with("packs/"))
        );
    }
    drop((logs, store));

    // The upkeep's sweep: every pack is read while its buckets live, none once they are
    // dropped.
    let location = Location::parse(&file_store_url(store_dir.path())).unwrap();
    let (starts, mut directories) = (HashMap::new(), PackDirectories::default());
    for (dropped, unread) in [
        (HashSet::new(), 0),
        (buckets.iter().cloned().collect(), packed),
    ] {
        let listed = Chains::list(&location, &starts, &mut directories, &dropped).await;
        assert_eq!(listed.unwrap().unread_packs.len(), unread);
    }

    // Another lost disk: the history comes from the packs.
    let again = tempfile::tempdir().unwrap();
    let store = LogStore::open(config, again.path(), 256).await.unwrap();
    for log in open_all(&store, again.path()) {
        assert!(!log.shared.read_state().streamed.is_empty());
        assert_eq!(ids(&log.read(0, u64::MAX).await.unwrap()), written);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buckets_no_tablet_opens_after_a_restart_are_forgotten() {
    let (store_dir, disk) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let table = table(&[]);
    let store = open_store(store_dir.path(), disk.path()).await;
    // Its frames go in no stream object: its WAL object stays needed.
    let dropped = open_log(disk.path(), "t2/b0", one_segment(&store));
    write(&dropped, &table, WriteOp::Append(rows(&table, &[1], "x"))).await;
    drop((dropped, store));

    // Its table was dropped while the node was down: no tablet opens it after the restart.
    let (store, busy) = open_bucket(store_dir.path(), disk.path()).await;
    assert!(
        disk.path().join("t2/b0").exists(),
        "the open rebuilt its log"
    );
    store.forget_unopened().unwrap();
    assert!(!disk.path().join("t2").exists(), "and it goes");
    for i in 0..30 {
        write(&busy, &table, WriteOp::Append(rows(&table, &[i], "busy"))).await;
    }
    // The busy bucket's segments are streamed: nothing holds the checkpoint in epoch 1.
    checkpoint_reaching(store_dir.path(), (2, 1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upkeep_deletes_the_wal_behind_a_checkpoint_and_a_lost_disk_reads_everything() {
    let (store_dir, disk) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (store, log) = open_bucket(store_dir.path(), disk.path()).await;
    let written = append_each(&log, 30).await;
    checkpoint_reaching(store_dir.path(), (1, 1)).await;
    // The first checkpoint's pass runs at once.
    let first = wal::number(0);
    for _ in 0..500 {
        if wal_objects(store_dir.path(), 1).first() != Some(&first) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let left = wal_objects(store_dir.path(), 1);
    assert_ne!(
        left.first(),
        Some(&first),
        "the first WAL object is still there"
    );
    drop((log, store));

    let lost = tempfile::tempdir().unwrap();
    let (_store, log) = open_bucket(store_dir.path(), lost.path()).await;
    assert_eq!(ids(&log.read(0, u64::MAX).await.unwrap()), written);
}

/// The claims of epochs before the furthest checkpoint's are garbage: an open reads the
/// WAL from that epoch on, and fencing needs only the last claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_of_epochs_behind_the_furthest_checkpoint_are_garbage() {
    let store_dir = tempfile::tempdir().unwrap();
    for epoch in 1..=2 {
        let disk = tempfile::tempdir().unwrap();
        let (store, log) = open_bucket(store_dir.path(), disk.path()).await;
        assert_eq!(store.epoch(), epoch);
        append_each(&log, 30).await;
        checkpoint_reaching(store_dir.path(), (epoch, 1)).await;
    }
    let location = Location::parse(&file_store_url(store_dir.path())).unwrap();
    let disk = tempfile::tempdir().unwrap();
    let opened = open::open(&location, "the store", disk.path(), 256, false)
        .await
        .unwrap();
    assert_eq!(opened.epoch, 3);
    let stale: Vec<String> = (opened.stale_claims.iter())
        .map(ToString::to_string)
        .collect();
    assert_eq!(stale, [format!("epochs/{}", wal::number(1))]);
}

#[tokio::test]
async fn a_place_the_upkeep_emptied_behind_a_checkpoint_is_read_again_not_fenced() {
    let (store_dir, disk) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let table = table(&[]);
    let store = open_store(store_dir.path(), disk.path()).await;
    let log = open_log(disk.path(), "t1/b0", one_segment(&store));
    for i in 0..3 {
        write(&log, &table, WriteOp::Append(rows(&table, &[i], "x"))).await;
    }
    drop((log, store));
    // Between an open's listing of the checkpoints and its reading of epoch 1, a running
    // writer made a checkpoint and deleted what is behind it.
    let wal_1 = store_dir.path().join("wal").join(wal::number(1));
    std::fs::remove_file(wal_1.join(wal::number(0))).unwrap();
    let checkpoints = store_dir.path().join("checkpoints");
    std::fs::create_dir_all(&checkpoints).unwrap();
    std::fs::write(checkpoints.join(coverage::name((1, 1))), b"").unwrap();

    let location = location::Location::parse(&file_store_url(store_dir.path())).unwrap();
    let rebuild = rebuild::Rebuild::start(disk.path(), 256, HashMap::new()).unwrap();
    let reading = open::Reading {
        epoch: 1,
        first: 0,
        by: 2,
    };
    let mut coverage = Coverage::default();
    let read = reading.read(&location, rebuild, 0, &mut coverage).await;
    assert!(read.unwrap().is_none(), "the open reads the store again");
    assert!(
        !wal_1.join(wal::number(0)).exists(),
        "and puts no fence there"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_failed_upload_every_write_fails_and_a_restart_reads_none_of_them() {
    let (store_dir, disk) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let table = table(&[]);
    let store = open_store(store_dir.path(), disk.path()).await;
    let logs: Vec<LogTablet> = (0..8)
        .map(|b| open_log(disk.path(), &format!("t1/b{b}"), one_segment(&store)))
        .collect();
    try_append(&logs[0], &table, 0).await.unwrap();
    // A newer writer fenced the sequence at the next place: that upload fails, and so
    // does every later write, from eight buckets at once.
    let wal_1 = store_dir.path().join("wal").join(wal::number(1));
    std::fs::write(wal_1.join(wal::number(1)), wal::encode_fence(9)).unwrap();
    let writes = logs.iter().map(|log| async {
        let mut outcomes = Vec::new();
        for id in 1..=4 {
            outcomes.push(try_append(log, &table, id).await);
        }
        outcomes
    });
    let outcomes: Vec<_> = futures::future::join_all(writes)
        .await
        .into_iter()
        .flatten()
        .collect();
    assert!(
        outcomes
            .iter()
            .all(|outcome| matches!(outcome, Err(LogError::Fenced { epoch: 1 }))),
        "{outcomes:?}"
    );
    let offsets: Vec<_> = logs.iter().map(LogTablet::offsets).collect();
    assert_eq!(offsets[0], (0, 1));
    assert!(
        offsets[1..].iter().all(|offsets| *offsets == (0, 0)),
        "{offsets:?}"
    );
    drop((logs, store));

    let lost = tempfile::tempdir().unwrap();
    let store = open_store(store_dir.path(), lost.path()).await;
    for b in 0..8 {
        let log = open_log(lost.path(), &format!("t1/b{b}"), log_config(&store));
        let expected: &[[i64; 1]] = if b == 0 { &[[0]] } else { &[] };
        let read = ids(&log.read(0, u64::MAX).await.unwrap());
        assert_eq!(read, expected, "bucket {b}");
    }
}

/// The entries of a run read back from the store.
fn run_entries(store: &LogStore, dir: &Path, run: &KvRun) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
    let mut read = store.read_kv_run(dir, run).unwrap();
    let mut entries = Vec::new();
    while let Some((key, row)) = read.next_entry().unwrap() {
        entries.push((key.to_vec(), row.map(|row| row.to_vec())));
    }
    entries
}

#[tokio::test(flavor = "multi_thread")]
async fn kv_checkpoint_runs_go_up_in_parts_and_read_back_as_one_chain() {
    let (store_dir, disk) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let store = open_store(store_dir.path(), disk.path()).await;
    let dir = disk.path().join("t1/b0");
    // A base of two parts (12 MiB of rows), then a run after it with a deletion.
    let base: Vec<(Vec<u8>, Option<Vec<u8>>)> = (0..3_000_u32)
        .map(|key| (key.to_be_bytes().to_vec(), Some(vec![key as u8; 4096])))
        .collect();
    let after = vec![
        (7_u32.to_be_bytes().to_vec(), None),
        (9_000_u32.to_be_bytes().to_vec(), Some(b"new".to_vec())),
    ];
    let write = |from: i64, to: i64, entries: Vec<(Vec<u8>, Option<Vec<u8>>)>| {
        let (store, dir) = (Arc::clone(&store), dir.clone());
        tokio::task::spawn_blocking(move || {
            let mut writer = store.write_kv_run(&dir, from, to)?;
            for (key, row) in &entries {
                writer.push(key, row.as_deref())?;
            }
            writer.finish()
        })
    };
    let base_run = write(0, 100, base.clone()).await.unwrap().unwrap();
    assert!(base_run.bytes > 8 << 20, "{base_run:?}");
    let next_run = write(100, 150, after.clone()).await.unwrap().unwrap();
    // A writer dropped before its end uploads nothing.
    {
        let mut abandoned = store.write_kv_run(&dir, 150, 160).unwrap();
        tokio::task::block_in_place(|| abandoned.push(b"k", None)).unwrap();
    }

    let chain = tokio::task::block_in_place(|| store.kv_chain(&dir))
        .unwrap()
        .unwrap();
    assert_eq!(chain.runs, [base_run, next_run]);
    assert_eq!(chain.end(), 150);
    let read = |run: KvRun| {
        let (store, dir) = (Arc::clone(&store), dir.clone());
        tokio::task::spawn_blocking(move || run_entries(&store, &dir, &run))
    };
    assert_eq!(read(base_run).await.unwrap(), base);
    assert_eq!(read(next_run).await.unwrap(), after);
}

/// The bucket's own stream objects in a local store: their offsets, by name.
fn stream_object_offsets(store: &Path, key: &str) -> Vec<(i64, i64)> {
    let mut offsets: Vec<(i64, i64)> = std::fs::read_dir(store.join("streams").join(key))
        .map(|entries| {
            entries
                .filter_map(|entry| stream::parse_name(entry.ok()?.file_name().to_str()?))
                .collect()
        })
        .unwrap_or_default();
    offsets.sort_unstable();
    offsets
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buckets_small_stream_objects_are_merged_and_read_back() {
    let (store_dir, disk) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let table = table(&[]);
    let (store, log) = open_bucket(store_dir.path(), disk.path()).await;
    let written: Vec<Vec<i64>> = (0..60).map(|i| vec![i, i + 1000]).collect();
    for ids in &written {
        write(&log, &table, WriteOp::Append(rows(&table, ids, "x"))).await;
    }
    // Every segment sealed is uploaded, then merged with the small ones before it.
    let mut usage = log.store_usage().unwrap();
    for _ in 0..500 {
        usage = log.store_usage().unwrap();
        let merged = stream_object_offsets(store_dir.path(), "t1/b0")
            .iter()
            .any(|(base, end)| end - base >= 2 * compaction::MIN_OBJECTS as i64);
        if merged && usage.stream_objects < 2 * compaction::MIN_OBJECTS as u64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let segments = log.shared.read_state().streamed.len();
    assert!(
        usage.stream_objects < 2 * compaction::MIN_OBJECTS as u64,
        "{usage:?}, {segments} segments streamed"
    );
    assert_eq!(ids(&log.read(0, u64::MAX).await.unwrap()), written);
    assert_eq!(ids(&log.read(41, 600).await.unwrap())[0], written[20]);
    drop((log, store));

    // A lost disk: the merged objects are read, the ones they replaced are not (the
    // upkeep deletes those after its grace).
    let lost = tempfile::tempdir().unwrap();
    let (_store, log) = open_bucket(store_dir.path(), lost.path()).await;
    assert_eq!(log.offsets(), (0, 120));
    assert_eq!(ids(&log.read(0, u64::MAX).await.unwrap()), written);
    let state = log.shared.read_state();
    let first = state
        .streamed
        .values()
        .next()
        .expect("history in the store");
    assert!(
        first.base == 0 && first.end >= 2 * compaction::MIN_OBJECTS as i64,
        "the history is read from a merged object first: {first:?}"
    );
}
