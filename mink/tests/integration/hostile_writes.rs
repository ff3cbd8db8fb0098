//! Hostile conditions on the write side of the real `mink server`: a disk that fills up
//! and empties again, `kill -9` in the middle of `CREATE TABLE`, tables too large to open.
//!
//! The full-disk test wants a real small file system: a 48 MB tmpfs mounted for the test
//! (sessions and CI run as root). Where mounting is refused it says why and runs the same
//! history under a file size limit instead (`ulimit -f`, SIGXFSZ ignored, so a write past
//! the limit fails with EFBIG and a smaller one after it fits).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use arrow::array::AsArray;
use arrow::datatypes::Int64Type;
use mink_client::MinkClient;
use mink_core::options::TableOptions;
use mink_core::protocol::{AppendAck, BucketId};
use mink_core::table::TableDescriptor;
use rand::{Rng, SeedableRng};

use crate::process::ServerProcess;
use crate::support::{events, events_table, seed};

/// Rows per insert: 20 of them are the 4000 rows.
const ROWS: i64 = 200;
/// Inserts acknowledged once space is back.
const AFTER_SPACE: usize = 20;

/// A tmpfs mounted over a directory for the life of the value; unmounted on drop, whatever
/// happened (a busy mount is detached lazily).
struct Tmpfs {
    dir: PathBuf,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` (`48m`) over `dir`; the reason when that is not permitted.
    fn mount(dir: &Path, size: &str) -> Result<Self, String> {
        let output = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !output.status.success() {
            return Err(format!(
                "mount -t tmpfs refused: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
        Ok(Self {
            dir: dir.to_path_buf(),
        })
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let unmounted = Command::new("umount").arg(&self.dir).status();
        if !unmounted.is_ok_and(|s| s.success()) {
            let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        }
    }
}

/// One acknowledged insert: its ack and its first id (ids `first..first + rows`).
type Acked = (AppendAck, i64);

/// The inserts of one history, with ids unique across it.
struct Writer {
    client: MinkClient,
    table: TableDescriptor,
    bucket: BucketId,
    next_id: i64,
    acked: Vec<Acked>,
}

impl Writer {
    async fn new(server: &ServerProcess) -> Self {
        let client = MinkClient::connect(&server.addr).await.expect("connect");
        let table = client
            .create_table(&events_table("full", 1, TableOptions::default()), false)
            .await
            .expect("create");
        let bucket = BucketId::new(&table.path, 0);
        Self {
            client,
            table,
            bucket,
            next_id: 0,
            acked: Vec::new(),
        }
    }

    /// Inserts `rows` new rows; the error when the insert is refused.
    async fn insert(&mut self, rows: i64) -> Result<(), mink_client::ClientError> {
        let first = self.next_id;
        self.next_id += rows;
        let ids: Vec<i64> = (first..first + rows).collect();
        let acks = self
            .client
            .append(&self.bucket, vec![events(&self.table, &ids)])
            .await?;
        self.acked.push((acks[0].clone(), first));
        Ok(())
    }

    /// Inserts until one is refused, which must be for want of space.
    async fn insert_until_full(&mut self) {
        for _ in 0..100_000 {
            match self.insert(ROWS).await {
                Ok(()) => {}
                Err(error) => {
                    assert_eq!(
                        error.code(),
                        Some(tonic::Code::ResourceExhausted),
                        "{error}"
                    );
                    return;
                }
            }
        }
        panic!("the disk never filled");
    }
}

/// Every row of the bucket after a restart, as `(offset, id)`, checked against the
/// acknowledged inserts: each acknowledged offset holds its id, no id appears twice, and
/// nothing that was not acknowledged is there.
async fn check_after_restart(data_dir: &Path, acked: &[Acked], bucket: &BucketId) {
    let server = ServerProcess::start(data_dir);
    let client = MinkClient::connect(&server.addr).await.expect("reconnect");
    let mut read = Vec::new();
    let mut offset = 0;
    loop {
        let answer = client.scan(bucket, offset, 0, &[]).await.expect("scan");
        for batch in &answer.batches {
            let ids = batch.batch.column(0).as_primitive::<Int64Type>().values();
            let base = batch.metadata.base_offset;
            read.extend(ids.iter().enumerate().map(|(i, id)| (base + i as i64, *id)));
        }
        if answer.next_offset >= answer.high_watermark {
            break;
        }
        offset = answer.next_offset;
    }
    let mut expected = Vec::new();
    for (ack, first) in acked {
        let rows = ack.last_offset - ack.base_offset + 1;
        expected.extend((0..rows).map(|i| (ack.base_offset + i, first + i)));
    }
    let mut ids: Vec<i64> = read.iter().map(|(_, id)| *id).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), read.len(), "no row read twice");
    assert_eq!(
        read.len(),
        expected.len(),
        "every acknowledged row and nothing else"
    );
    assert_eq!(
        read, expected,
        "every acknowledged offset reads back its row"
    );
    server.kill();
}

/// Fills the file system of `dir` with a file, then frees `keep` bytes of it again.
fn fill_leaving(dir: &Path, keep: u64) -> PathBuf {
    use std::io::Write as _;
    let path = dir.join("filler");
    let mut file = std::fs::File::create(&path).expect("filler");
    let chunk = vec![0xa5u8; 1 << 20];
    let mut written = 0u64;
    loop {
        match file.write(&chunk) {
            Ok(0) => break,
            Ok(n) => written += n as u64,
            Err(e) if e.kind() == std::io::ErrorKind::StorageFull => break,
            Err(e) => panic!("filling the disk: {e}"),
        }
    }
    file.set_len(written.saturating_sub(keep))
        .expect("free a little");
    file.sync_all().expect("sync filler");
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_then_space_again_keeps_every_acknowledged_insert_across_kill_9() {
    let dir = tempfile::tempdir().expect("temp dir");
    match Tmpfs::mount(dir.path(), "48m") {
        Ok(mount) => full_tmpfs(&mount.dir).await,
        Err(reason) => {
            eprintln!("skipping the tmpfs variant ({reason}); running it under ulimit -f");
            file_size_limit(dir.path()).await;
        }
    }
}

/// The history on a real 48 MB tmpfs: inserts until the disk is full, the space
/// freed, 20 more inserts, `kill -9`, restart.
async fn full_tmpfs(mount: &Path) {
    let data_dir = mount.join("data");
    std::fs::create_dir(&data_dir).expect("data dir");
    let server = ServerProcess::start(&data_dir);
    let mut writer = Writer::new(&server).await;
    writer.insert(ROWS).await.expect("a first insert");
    let filler = fill_leaving(mount, 512 << 10);
    writer.insert_until_full().await;
    let full_at = writer.acked.len();
    assert!(full_at > 2, "some inserts fit before the disk filled");
    for _ in 0..3 {
        assert!(writer.insert(ROWS).await.is_err(), "still full");
    }

    std::fs::remove_file(filler).expect("free the space");
    for i in 0..AFTER_SPACE {
        writer
            .insert(ROWS)
            .await
            .unwrap_or_else(|e| panic!("insert {i} after space returned: {e}"));
    }
    let last = &writer.acked.last().expect("acked").0;
    assert_eq!(
        last.last_offset + 1,
        writer.acked.len() as i64 * ROWS,
        "offsets continue right after the last good insert"
    );
    server.kill();
    check_after_restart(&data_dir, &writer.acked, &writer.bucket).await;
}

/// The same history where no tmpfs can be mounted: the server's files are limited to
/// `LIMIT_KIB`, the segment filled close to it, an insert too large to fit refused (EFBIG),
/// then inserts small enough to fit, `kill -9`, restart.
async fn file_size_limit(dir: &Path) {
    const LIMIT_KIB: u64 = 2048;
    let server = ServerProcess::start_limited(dir, LIMIT_KIB);
    let mut writer = Writer::new(&server).await;
    let segment = dir
        .join("log")
        .join(format!("t{}", writer.table.table_id))
        .join("b0")
        .join(format!("{:020}.log", 0));
    let size = || std::fs::metadata(&segment).expect("segment").len();
    writer.insert(ROWS).await.expect("a first insert");
    let frame = size();
    let room = frame * (AFTER_SPACE as u64 + 5);
    while size() + room < LIMIT_KIB << 10 {
        writer.insert(ROWS).await.expect("inserts below the limit");
    }
    let before = std::fs::read(&segment).expect("segment bytes");
    let error = writer
        .insert(ROWS * 40)
        .await
        .expect_err("an insert past the file size limit");
    assert_eq!(
        error.code(),
        Some(tonic::Code::ResourceExhausted),
        "{error}"
    );
    assert_eq!(
        std::fs::read(&segment).expect("segment bytes"),
        before,
        "the failed insert left the segment byte for byte as before"
    );
    for i in 0..AFTER_SPACE {
        writer
            .insert(ROWS)
            .await
            .unwrap_or_else(|e| panic!("insert {i} that fits: {e}"));
    }
    server.kill();
    check_after_restart(dir, &writer.acked, &writer.bucket).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_create_table_leaves_a_node_that_starts() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = ServerProcess::start_with_env(
        dir.path(),
        &[("MINK_FAILPOINT", "abort-during-create-table")],
    );
    let client = MinkClient::connect(&server.addr).await.expect("connect");
    let table = events_table("half", 8, TableOptions::default());
    client
        .create_table(&table, false)
        .await
        .expect_err("the node aborts half-way through the create");
    server.wait_for_exit();

    let server = ServerProcess::start(dir.path());
    let client = MinkClient::connect(&server.addr).await.expect("reconnect");
    // The metadata was committed before the abort: the table is there, every bucket
    // opens and takes writes.
    let listed = client.list_tables(Some("test")).await.expect("list");
    assert_eq!(listed, std::slice::from_ref(&table.path));
    let table = client.describe_table(&table.path).await.expect("describe");
    assert_eq!(
        client
            .list_buckets(&table.path)
            .await
            .expect("buckets")
            .len(),
        8
    );
    write_every_bucket(&client, &table).await;
    server.kill();
}

/// `kill -9` at random moments of a stream of `CREATE TABLE`s of many buckets: after
/// each restart the node starts and every acknowledged table is there and takes writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_at_random_moments_of_creates_leaves_a_node_that_starts() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed("kill_9_during_creates"));
    let mut created: Vec<TableDescriptor> = Vec::new();
    let mut attempt = 0;
    for _round in 0..3 {
        let server = ServerProcess::start(dir.path());
        let client = MinkClient::connect(&server.addr).await.expect("connect");
        for table in &created {
            let found = client.describe_table(&table.path).await.expect("describe");
            assert_eq!(found.bucket_num, table.bucket_num);
        }
        let creates = {
            let client = client.clone();
            let start = attempt;
            tokio::spawn(async move {
                let mut acked = Vec::new();
                for n in start.. {
                    let table = events_table(&format!("t{n}"), 32, TableOptions::default());
                    match client.create_table(&table, false).await {
                        Ok(table) => acked.push(table),
                        Err(_) => return (acked, n),
                    }
                }
                unreachable!()
            })
        };
        tokio::time::sleep(Duration::from_millis(rng.random_range(50..600))).await;
        server.kill();
        let (acked, next) = creates.await.expect("creates end with the server");
        created.extend(acked);
        attempt = next + 1;
    }
    let server = ServerProcess::start(dir.path());
    let client = MinkClient::connect(&server.addr).await.expect("connect");
    for table in &created {
        let found = client.describe_table(&table.path).await.expect("describe");
        write_every_bucket(&client, &found).await;
    }
    server.kill();
}

/// Appends one row to every bucket of an `events_table` and reads it back.
async fn write_every_bucket(client: &MinkClient, table: &TableDescriptor) {
    let buckets = client.list_buckets(&table.path).await.expect("buckets");
    assert_eq!(buckets.len(), table.bucket_num as usize);
    let mut todo: std::collections::BTreeSet<u32> = (0..table.bucket_num).collect();
    for id in 0i64.. {
        if todo.is_empty() {
            break;
        }
        let batch = events(table, &[id]);
        let bucket = mink_core::routing::row_addresses(table, &batch)
            .expect("route")
            .buckets
            .and_then(|b| b.first().copied())
            .unwrap_or(0);
        if !todo.remove(&bucket) {
            continue;
        }
        let bucket = BucketId::new(&table.path, bucket);
        let ack = client.append(&bucket, vec![batch]).await.expect("append");
        let read = client
            .scan(&bucket, ack[0].base_offset, 0, &[])
            .await
            .expect("scan");
        assert_eq!(read.batches.len(), 1, "bucket {bucket} reads its row");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bucket_num_past_the_bound_is_refused_and_the_node_stays_up() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = ServerProcess::start(dir.path());
    let client = MinkClient::connect(&server.addr).await.expect("connect");
    let too_many = events_table("huge", 1025, TableOptions::default());
    let error = client
        .create_table(&too_many, false)
        .await
        .expect_err("1025 buckets");
    assert_eq!(error.code(), Some(tonic::Code::InvalidArgument), "{error}");
    assert!(error.to_string().contains("1 to 1024 buckets"), "{error}");
    assert!(
        client.list_tables(None).await.expect("list").is_empty(),
        "nothing of it left"
    );
    assert!(!dir.path().join("log").join("t1").exists());
    let table = client
        .create_table(&events_table("ok", 4, TableOptions::default()), false)
        .await
        .expect("a table within the bound");
    write_every_bucket(&client, &table).await;
    server.kill();
    let server = ServerProcess::start(dir.path());
    server.kill();
}
