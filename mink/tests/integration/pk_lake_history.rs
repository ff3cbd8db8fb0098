//! The lake of primary-key tables: random histories of upserts, updates, deletes,
//! re-inserts, tiering rounds, compactions, lake upkeep (snapshot expiry, manifest rewrites,
//! orphan removal), `kill -9` restarts and crashes on either side of a round's and of a
//! compaction's Iceberg commit and after an expiry's, run against the real `mink` binary
//! and checked after every step against a BTreeMap model:
//!
//! - every bucket's union read is exactly the model's rows of that bucket, whole and
//!   filtered on a non-key column that updates move rows into and out of (a tail filtered
//!   before the key merge would resurrect the lake's older version);
//! - the lake alone (all of it, one partition, filtered) is the table as of the last
//!   recorded round, and every older snapshot still reads as it was until an expiry,
//!   after which it is a clear `NOT_FOUND` (the table keeps one snapshot: its
//!   `history.expire.max-snapshot-age-ms` is 1).
//!
//! Then a deterministic history: compaction folds a bucket's files and deletes into one
//! file without changing a row, and the snapshots before it stay readable.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::time::{Duration, SystemTime};

use mink_client::MinkClient;
use mink_core::filter::{ColumnFilter, FilterOp};
use mink_core::protocol::BucketId;
use mink_core::routing::split_by_bucket;
use mink_core::table::{TableDescriptor, TablePath};
use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, IteratorRandom};
use rand::{Rng, SeedableRng};
use tonic::Code;

use crate::pk_support::{Cells, Key, State, lake_rows, lake_values, pk_keys, pk_lake_table};
use crate::process::ServerProcess;
use crate::support::{TestNode, seed};

const DATES: [&str; 2] = ["2024-01-01", "2024-01-02"];

/// Steps of a random history.
const STEPS: usize = 50;

/// A crash point of the server (before or after a round's or a compaction's commit, after
/// an expiry's), as `MINK_FAILPOINT` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failpoint {
    BeforeRound,
    AfterRound,
    BeforeCompaction,
    AfterCompaction,
    AfterExpiry,
}

/// What reaches a failpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    Round,
    Compaction,
    Expiry,
}

impl Failpoint {
    const ALL: [Self; 5] = [
        Self::BeforeRound,
        Self::AfterRound,
        Self::BeforeCompaction,
        Self::AfterCompaction,
        Self::AfterExpiry,
    ];

    fn name(self) -> &'static str {
        match self {
            Self::BeforeRound => "abort-before-lake-commit",
            Self::AfterRound => "abort-after-lake-commit",
            Self::BeforeCompaction => "abort-before-compaction-commit",
            Self::AfterCompaction => "abort-after-compaction-commit",
            Self::AfterExpiry => "abort-after-expiry-commit",
        }
    }

    fn call(self) -> Call {
        match self {
            Self::BeforeRound | Self::AfterRound => Call::Round,
            Self::BeforeCompaction | Self::AfterCompaction => Call::Compaction,
            Self::AfterExpiry => Call::Expiry,
        }
    }

    /// Whether a new Iceberg snapshot is committed when the process dies.
    fn after_commit(self) -> bool {
        matches!(self, Self::AfterRound | Self::AfterCompaction)
    }
}

/// The filtered reads: `n < 50`, and `n >= 50 AND v IS NOT NULL`. Updates move `n` across
/// 50, so rows leave and enter both.
fn filters() -> [Vec<ColumnFilter>; 2] {
    [
        vec![ColumnFilter::new("n", FilterOp::Lt, Some("50"))],
        vec![
            ColumnFilter::new("n", FilterOp::GtEq, Some("50")),
            ColumnFilter::new("v", FilterOp::IsNotNull, None),
        ],
    ]
}

/// What [`filters`]`()[which]` keeps of a state.
fn filtered(rows: &[(Key, Cells)], which: usize) -> Vec<(Key, Cells)> {
    rows.iter()
        .filter(|(_, (v, n))| match which {
            0 => n.is_some_and(|n| n < 50),
            _ => n.is_some_and(|n| n >= 50) && v.is_some(),
        })
        .cloned()
        .collect()
}

fn rows_of(state: &State) -> Vec<(Key, Cells)> {
    state.iter().map(|(k, c)| (k.clone(), c.clone())).collect()
}

/// Rows read back, sorted by key (a row read twice stays twice).
fn sorted_rows(batches: &[arrow::array::RecordBatch]) -> Vec<(Key, Cells)> {
    let mut rows: Vec<(Key, Cells)> = batches.iter().flat_map(lake_values).collect();
    rows.sort();
    rows
}

/// The model's rows of each bucket, routed as the client routes writes.
fn by_bucket(table: &TableDescriptor, state: &State) -> BTreeMap<BucketId, Vec<(Key, Cells)>> {
    if state.is_empty() {
        return BTreeMap::new();
    }
    split_by_bucket(table, &lake_rows(table, &rows_of(state)), 0)
        .expect("route")
        .into_iter()
        .map(|(bucket, batch)| {
            let mut rows = lake_values(&batch);
            rows.sort();
            (bucket, rows)
        })
        .collect()
}

/// The table as the test wrote it, and what the lake should hold.
#[derive(Debug, Default)]
struct Model {
    /// The table now.
    now: State,
    /// The lake as mink recorded it: the table as of the last recorded snapshot.
    lake: State,
    /// A snapshot committed to Iceberg by a process that died before recording it, and
    /// the table as of it. The next round or compaction records it first.
    unrecorded: Option<State>,
    /// Keys written, and existing keys deleted, since the last committed round.
    touched: BTreeSet<Key>,
    /// Whether the log moved since the last committed round.
    dirty: bool,
    /// Keys deleted and not written since (candidates for re-inserts).
    deleted: BTreeSet<Key>,
    /// Committed snapshots whose id the test knows, and the table as of each.
    snapshots: Vec<(i64, State)>,
    /// The recorded snapshot, when the test knows it.
    recorded: Option<Option<i64>>,
    /// Whether the recorded snapshot is compacted: at most one file per bucket.
    compacted: bool,
}

impl Model {
    fn new() -> Self {
        Self {
            recorded: Some(None),
            compacted: true,
            ..Self::default()
        }
    }

    fn upserted(&mut self, rows: &[(Key, Cells)], logged: bool) {
        assert!(logged, "an upsert is always logged");
        for (key, cells) in rows {
            self.now.insert(key.clone(), cells.clone());
            self.deleted.remove(key);
            self.touched.insert(key.clone());
        }
        self.dirty = true;
    }

    fn deleted(&mut self, keys: &[Key], logged: bool) {
        let mut existed = false;
        for key in keys {
            if self.now.remove(key).is_some() {
                existed = true;
                self.touched.insert(key.clone());
                self.deleted.insert(key.clone());
            }
        }
        assert_eq!(logged, existed, "a delete is logged iff a key existed");
        self.dirty |= logged;
    }

    /// A round or a compaction started: it records a snapshot left unrecorded first.
    /// Returns whether there was one.
    fn reconciled(&mut self) -> bool {
        match self.unrecorded.take() {
            Some(state) => {
                self.lake = state;
                self.recorded = None;
                self.compacted = false;
                true
            }
            None => false,
        }
    }

    /// A round committed (and recorded, when `snapshot_id` is known).
    fn round_committed(&mut self, snapshot_id: Option<i64>) {
        self.lake = self.now.clone();
        self.touched.clear();
        self.dirty = false;
        self.compacted = false;
        self.recorded = snapshot_id.map(Some);
        if let Some(id) = snapshot_id {
            self.snapshots.push((id, self.now.clone()));
        }
    }

    /// What the next round must write: `(rows, deleted_rows)`.
    fn round_size(&self) -> (u64, u64) {
        let live = self.touched.iter().filter(|k| self.now.contains_key(*k));
        let replaced = self.touched.iter().filter(|k| self.lake.contains_key(*k));
        (live.count() as u64, replaced.count() as u64)
    }
}

/// The server's lease period: the reads a step plans are held that long, so that the
/// expiry of a later step expires every snapshot but the recorded one.
const LEASES: &[(&str, &str)] = &[("MINK_LAKE_LEASE_MS", "100")];

/// How long an expiry waits after the reads before it: a planned read's hold counts for
/// the lease period and the clock skew the server allows (each 100 ms here), with a margin
/// for a loaded machine.
const HOLDS_LAPSE: Duration = Duration::from_millis(300);

/// The server under test and a client of it.
struct Server {
    dir: tempfile::TempDir,
    process: Option<ServerProcess>,
    client: MinkClient,
}

impl Server {
    async fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let process = ServerProcess::start_with_env(dir.path(), LEASES);
        let client = MinkClient::connect(&process.addr).await.expect("connect");
        Self {
            dir,
            process: Some(process),
            client,
        }
    }

    /// Removes the table's orphan files: every file of the lake is made two days old
    /// first (as a crash's leftovers would be by then), and orphans a day old go.
    async fn remove_orphan_files(&self, path: &TablePath) -> Vec<String> {
        let two_days_ago = SystemTime::now() - Duration::from_secs(2 * 86_400);
        let table = self
            .dir
            .path()
            .join(format!("lake/warehouse/{}/{}", path.database, path.name));
        let mut dirs = vec![table];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).expect("read the lake") {
                let path = entry.expect("entry").path();
                if path.is_dir() {
                    dirs.push(path);
                    continue;
                }
                let file = std::fs::File::options().write(true).open(&path);
                file.and_then(|f| f.set_modified(two_days_ago))
                    .expect("age a lake file");
            }
        }
        let day = Some(Duration::from_secs(86_400));
        let reply = self.client.remove_orphan_files(path, day).await;
        reply.expect("remove orphan files").removed
    }

    /// `kill -9`, then a normal start over the same files.
    async fn restart(&mut self) {
        if let Some(process) = self.process.take() {
            process.kill();
        }
        let process = ServerProcess::start_with_env(self.dir.path(), LEASES);
        self.client = MinkClient::connect(&process.addr).await.expect("reconnect");
        self.process = Some(process);
    }

    /// Stops the server, starts one that aborts at `failpoint`, runs a round (or a
    /// compaction) on it, then starts a normal one. Returns whether the process aborted.
    async fn crash_at(&mut self, failpoint: Failpoint, table: &TableDescriptor) -> bool {
        if let Some(process) = self.process.take() {
            process.kill();
        }
        let crashing =
            ServerProcess::start_with_env(self.dir.path(), &[("MINK_FAILPOINT", failpoint.name())]);
        let client = MinkClient::connect(&crashing.addr).await.expect("connect");
        let path = &table.path;
        let result = match failpoint.call() {
            Call::Round => client.tier(path).await.map(|r| r.snapshot_id.is_some()),
            Call::Compaction => client.compact(path).await.map(|r| r.snapshot_id.is_some()),
            Call::Expiry => {
                (client.expire_snapshots(path).await).map(|r| !r.expired_snapshots.is_empty())
            }
        };
        let crashed = match result {
            Ok(committed) => {
                // Only a call with nothing to commit passes the failpoint.
                assert!(
                    !committed,
                    "{}: committed without aborting",
                    failpoint.name()
                );
                crashing.kill();
                false
            }
            Err(error) => {
                let alive = match MinkClient::connect(&crashing.addr).await {
                    Ok(probe) => probe.list_tables(None).await.is_ok(),
                    Err(_) => false,
                };
                assert!(
                    !alive,
                    "{}: the call failed but the server did not abort: {error}",
                    failpoint.name()
                );
                crashing.wait_for_exit();
                true
            }
        };
        self.restart().await;
        crashed
    }
}

fn random_cells(rng: &mut StdRng) -> Cells {
    (
        rng.random_bool(0.8)
            .then(|| format!("v{}", rng.random_range(0..1000))),
        rng.random_bool(0.9).then(|| rng.random_range(0..100)),
    )
}

fn random_key(rng: &mut StdRng) -> Key {
    let dt = DATES.choose(rng).expect("dates").to_string();
    (dt, rng.random_range(0..20), rng.random_range(0..2))
}

/// Upserts of new keys, of existing ones (with new values) and of deleted ones.
fn random_upserts(rng: &mut StdRng, model: &Model) -> Vec<(Key, Cells)> {
    (0..rng.random_range(1..15))
        .map(|_| {
            let key = match rng.random_range(0..10) {
                0..4 => model.now.keys().choose(rng).cloned(),
                4..6 => model.deleted.iter().choose(rng).cloned(),
                _ => None,
            };
            (key.unwrap_or_else(|| random_key(rng)), random_cells(rng))
        })
        .collect()
}

/// Updates of keys the lake holds (else of any key) that move `n` across 50, and keep
/// `v` or change it.
fn crossing_updates(rng: &mut StdRng, model: &Model) -> Vec<(Key, Cells)> {
    let in_lake: Vec<&Key> = model
        .now
        .keys()
        .filter(|k| model.lake.contains_key(*k))
        .collect();
    let pool: Vec<&Key> = match in_lake.is_empty() {
        true => model.now.keys().collect(),
        false => in_lake,
    };
    pool.choose_multiple(rng, 6)
        .map(|key| {
            let (v, n) = model.now[*key].clone();
            let n = match n {
                Some(n) if n < 50 => rng.random_range(50..100),
                _ => rng.random_range(0..50),
            };
            let v = match rng.random_bool(0.5) {
                true => v,
                false => Some(format!("w{}", rng.random_range(0..1000))),
            };
            ((*key).clone(), (v, Some(n)))
        })
        .collect()
}

/// Some existing keys, at least one when there is any, and a few random ones.
fn random_deletes(rng: &mut StdRng, model: &Model) -> Vec<Key> {
    let mut keys: Vec<Key> = model
        .now
        .keys()
        .filter(|_| rng.random_bool(0.25))
        .cloned()
        .collect();
    if keys.is_empty() {
        keys.extend(model.now.keys().choose(rng).cloned());
    }
    keys.extend((0..2).map(|_| random_key(rng)));
    keys
}

async fn upsert(
    client: &MinkClient,
    table: &TableDescriptor,
    model: &mut Model,
    rows: &[(Key, Cells)],
) {
    if rows.is_empty() {
        return;
    }
    let acks = client
        .write(table, &lake_rows(table, rows))
        .await
        .expect("upsert");
    let logged = acks.iter().any(|(_, a)| a.last_offset >= a.base_offset);
    model.upserted(rows, logged);
}

async fn delete(client: &MinkClient, table: &TableDescriptor, model: &mut Model, keys: &[Key]) {
    let acks = client.delete(table, &pk_keys(keys)).await.expect("delete");
    let logged = acks.iter().any(|(_, a)| a.last_offset >= a.base_offset);
    model.deleted(keys, logged);
}

/// A tiering round, checked against what the model says it must write.
async fn tier(client: &MinkClient, table: &TableDescriptor, model: &mut Model, step: usize) {
    let repair = model.reconciled();
    let (rows, deleted_rows) = model.round_size();
    let dirty = model.dirty;
    let reply = client.tier(&table.path).await.expect("tier");
    assert_eq!(
        reply.repaired, repair,
        "step {step}: a round records an unrecorded snapshot first: {reply:?}"
    );
    if !dirty {
        assert_eq!(
            reply.snapshot_id, None,
            "step {step}: nothing to tier: {reply:?}"
        );
        return;
    }
    assert!(reply.snapshot_id.is_some(), "step {step}: {reply:?}");
    assert_eq!(
        (reply.rows, reply.deleted_rows),
        (rows, deleted_rows),
        "step {step}: a round writes every changed live key and deletes the lake rows of \
         every changed key: {reply:?}"
    );
    assert_eq!(reply.files > 0, rows > 0, "step {step}: {reply:?}");
    assert_eq!(
        reply.delete_files > 0,
        deleted_rows > 0,
        "step {step}: {reply:?}"
    );
    model.round_committed(reply.snapshot_id);
}

/// A compaction: the rows do not change, only the files.
async fn compact(client: &MinkClient, table: &TableDescriptor, model: &mut Model, step: usize) {
    model.reconciled();
    let reply = client.compact(&table.path).await.expect("compact");
    if let Some(id) = reply.snapshot_id {
        assert!(
            reply.buckets > 0 && reply.files_removed > reply.files_written,
            "step {step}: a compaction folds files: {reply:?}"
        );
        assert!(
            reply.rows <= model.lake.len() as u64,
            "step {step}: a compaction rewrites live rows only: {reply:?}"
        );
        model.snapshots.push((id, model.lake.clone()));
        model.recorded = Some(Some(id));
    }
    model.compacted = true;
}

/// An expiry: the table's retention (`history.expire.max-snapshot-age-ms` = 1, one
/// snapshot kept) leaves the lake only its current snapshot, the recorded one. Every
/// other snapshot the test knows then reads as `NOT_FOUND`, and mink's record lists only
/// the current one.
async fn expire(client: &MinkClient, table: &TableDescriptor, model: &mut Model, step: usize) {
    model.reconciled();
    tokio::time::sleep(HOLDS_LAPSE).await;
    let reply = client.expire_snapshots(&table.path).await.expect("expire");
    let recorded = client
        .lake_snapshots(&table.path)
        .await
        .expect("lake snapshots");
    let recorded: Vec<i64> = recorded.iter().map(|s| s.snapshot_id).collect();
    let Some(&current) = recorded.last() else {
        assert!(reply.expired_snapshots.is_empty(), "step {step}: {reply:?}");
        return;
    };
    assert_eq!(
        recorded,
        [current],
        "step {step}: only the current snapshot is recorded"
    );
    assert!(
        !reply.expired_snapshots.contains(&current),
        "step {step}: the recorded snapshot never expires: {reply:?}"
    );
    if let Some(Some(known)) = model.recorded {
        assert_eq!(
            known, current,
            "step {step}: the recorded snapshot stays current"
        );
    }
    model.recorded = Some(Some(current));
    let stats = client.lake_table_stats(&table.path).await.expect("stats");
    assert_eq!(stats.snapshots, 1, "step {step}: {stats:?}");
    let (kept, expired): (Vec<_>, Vec<_>) = std::mem::take(&mut model.snapshots)
        .into_iter()
        .partition(|(id, _)| *id == current);
    model.snapshots = kept;
    for (id, _) in expired {
        let err = client
            .lake(&table.path, None, Some(id), &[], &[])
            .await
            .expect_err("an expired snapshot");
        assert_eq!(
            err.code(),
            Some(Code::NotFound),
            "step {step}: snapshot {id}: {err}"
        );
    }
}

/// A manifest rewrite: one `replace` snapshot of the same files, in at most one data and
/// one delete manifest.
async fn rewrite_manifests(client: &MinkClient, table: &TableDescriptor, model: &mut Model) {
    model.reconciled();
    let reply = client
        .rewrite_manifests(&table.path)
        .await
        .expect("rewrite");
    if let Some(id) = reply.snapshot_id {
        model.snapshots.push((id, model.lake.clone()));
        model.recorded = Some(Some(id));
        let stats = client.lake_table_stats(&table.path).await.expect("stats");
        assert!(stats.manifests <= 2, "{reply:?}, {stats:?}");
    }
}

/// Two rounds over the same new keys, so the lake has a bucket with two data files and
/// position deletes: a compaction then has work.
async fn make_compaction_work(
    client: &MinkClient,
    table: &TableDescriptor,
    model: &mut Model,
    rng: &mut StdRng,
    step: usize,
) {
    let rows: Vec<(Key, Cells)> = (0..6)
        .map(|_| (random_key(rng), random_cells(rng)))
        .collect();
    upsert(client, table, model, &rows).await;
    tier(client, table, model, step).await;
    let updated: Vec<(Key, Cells)> = rows
        .into_iter()
        .map(|(key, _)| (key, random_cells(rng)))
        .collect();
    upsert(client, table, model, &updated).await;
    tier(client, table, model, step).await;
}

/// Checks every bucket's union read and the lake against the model.
async fn check(
    client: &MinkClient,
    table: &TableDescriptor,
    model: &Model,
    rng: &mut StdRng,
    step: usize,
) {
    let which = step % 2;
    let filter = &filters()[which];
    let mut expected = by_bucket(table, &model.now);
    let statuses = client.list_buckets(&table.path).await.expect("buckets");
    for status in statuses {
        let bucket = status.bucket.expect("bucket id");
        let want = expected.remove(&bucket).unwrap_or_default();
        let answer = client.union(&bucket, &[], &[]).await.expect("union");
        assert_eq!(
            sorted_rows(&answer.batches),
            want,
            "step {step}: the union of {bucket} = the model's rows of it"
        );
        let plan = &answer.plan;
        assert_eq!(
            (plan.log_from, plan.log_to),
            (plan.lake_log_end_offset, status.high_watermark),
            "step {step}: {bucket} reads the log from the seam to the high watermark"
        );
        if let Some(recorded) = model.recorded {
            assert_eq!(
                plan.snapshot_id, recorded,
                "step {step}: {bucket} reads the recorded snapshot"
            );
        }
        if model.compacted {
            assert!(
                plan.lake_files <= 1,
                "step {step}: {bucket} is compacted: {plan:?}"
            );
        }
        let answer = client.union(&bucket, &[], filter).await.expect("union");
        assert_eq!(
            sorted_rows(&answer.batches),
            filtered(&want, which),
            "step {step}: the union of {bucket} filtered by {filter:?}"
        );
    }
    assert!(
        expected.is_empty(),
        "step {step}: buckets with rows that are not listed: {expected:?}"
    );

    // The lake alone: the recorded snapshot (or, once recovered, one committed before a
    // crash).
    let lake = sorted_rows(
        &client
            .lake(&table.path, None, None, &[], &[])
            .await
            .expect("lake"),
    );
    let mut lake_state = &model.lake;
    if let Some(unrecorded) = &model.unrecorded
        && lake != rows_of(&model.lake)
    {
        lake_state = unrecorded;
    }
    assert_eq!(
        lake,
        rows_of(lake_state),
        "step {step}: the lake = the table as of the last round"
    );
    let lake = sorted_rows(
        &client
            .lake(&table.path, None, None, &[], filter)
            .await
            .expect("lake"),
    );
    assert_eq!(
        lake,
        filtered(&rows_of(lake_state), which),
        "step {step}: the lake filtered by {filter:?}"
    );
    let dt = DATES[step / 2 % 2];
    let lake = sorted_rows(
        &client
            .lake(&table.path, Some(&format!("dt={dt}")), None, &[], &[])
            .await
            .expect("lake partition"),
    );
    let partition: Vec<(Key, Cells)> = rows_of(lake_state)
        .into_iter()
        .filter(|(k, _)| k.0 == dt)
        .collect();
    assert_eq!(lake, partition, "step {step}: the lake partition dt={dt}");

    // An older snapshot reads as it was.
    if let Some((id, state)) = model.snapshots.choose(rng) {
        let lake = sorted_rows(
            &client
                .lake(&table.path, None, Some(*id), &[], &[])
                .await
                .expect("older snapshot"),
        );
        assert_eq!(lake, rows_of(state), "step {step}: snapshot {id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_pk_lake_histories_match_the_model() {
    let seed = seed("random_pk_lake_histories_match_the_model");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut server = Server::start().await;
    let mut table = pk_lake_table("pk_lake", 2);
    table
        .lake_properties
        .insert("history.expire.max-snapshot-age-ms".into(), "1".into());
    let table = server
        .client
        .create_table(&table, false)
        .await
        .expect("create");
    let mut model = Model::new();
    for step in 0..STEPS {
        // Every history crashes at each failpoint at least once.
        let forced = match step {
            8 => Some(Failpoint::BeforeRound),
            18 => Some(Failpoint::AfterRound),
            28 => Some(Failpoint::BeforeCompaction),
            38 => Some(Failpoint::AfterCompaction),
            44 => Some(Failpoint::AfterExpiry),
            _ => None,
        };
        let client = server.client.clone();
        let action = match forced {
            Some(_) => 100,
            None => rng.random_range(0..100),
        };
        match action {
            0..30 => {
                let rows = random_upserts(&mut rng, &model);
                upsert(&client, &table, &mut model, &rows).await;
            }
            30..42 => {
                let rows = crossing_updates(&mut rng, &model);
                upsert(&client, &table, &mut model, &rows).await;
            }
            42..54 => {
                let keys = random_deletes(&mut rng, &model);
                delete(&client, &table, &mut model, &keys).await;
            }
            54..68 => tier(&client, &table, &mut model, step).await,
            68..74 => compact(&client, &table, &mut model, step).await,
            74..78 => expire(&client, &table, &mut model, step).await,
            78..80 => rewrite_manifests(&client, &table, &mut model).await,
            80..82 => {
                let removed = server.remove_orphan_files(&table.path).await;
                eprintln!("step {step}: removed {} orphan files", removed.len());
                // Like every upkeep call, it records a snapshot left unrecorded first
                // (whose files are then no orphans).
                model.reconciled();
            }
            82..88 => server.restart().await,
            _ => {
                let failpoint =
                    forced.unwrap_or_else(|| *Failpoint::ALL.choose(&mut rng).expect("failpoints"));
                if forced.is_some() {
                    // Make sure the crash happens: something to tier, to compact or to
                    // expire.
                    match failpoint.call() {
                        Call::Round => {
                            let rows = random_upserts(&mut rng, &model);
                            upsert(&client, &table, &mut model, &rows).await;
                        }
                        Call::Compaction | Call::Expiry => {
                            make_compaction_work(&client, &table, &mut model, &mut rng, step).await;
                        }
                    }
                }
                let dirty = model.dirty;
                let crashed = server.crash_at(failpoint, &table).await;
                eprintln!("step {step}: {} crashed: {crashed}", failpoint.name());
                // The call recorded a snapshot left unrecorded before it failed.
                model.reconciled();
                let in_round = failpoint.call() == Call::Round;
                if forced.is_some() || in_round {
                    let expected = forced.is_some() || dirty;
                    assert_eq!(
                        crashed,
                        expected,
                        "step {step}: {} aborts iff there is something to commit",
                        failpoint.name()
                    );
                }
                if crashed {
                    model.recorded = None;
                    model.compacted = false;
                    match (failpoint.call(), failpoint.after_commit()) {
                        (Call::Round, true) => {
                            model.unrecorded = Some(model.now.clone());
                            model.touched.clear();
                            model.dirty = false;
                        }
                        (_, true) => model.unrecorded = Some(model.lake.clone()),
                        (_, false) => {}
                    }
                    if failpoint.call() == Call::Expiry {
                        // The lake dropped the snapshots; the next expiry forgets their
                        // records, and the files left are orphans.
                        let client = server.client.clone();
                        expire(&client, &table, &mut model, step).await;
                        let removed = server.remove_orphan_files(&table.path).await;
                        assert!(!removed.is_empty(), "step {step}: the crash left orphans");
                    }
                } else if failpoint.call() == Call::Compaction {
                    model.compacted = true;
                }
            }
        }
        check(&server.client, &table, &model, &mut rng, step).await;
    }
    // A last round and compaction: the lake then holds the whole table.
    let client = server.client.clone();
    tier(&client, &table, &mut model, STEPS).await;
    compact(&client, &table, &mut model, STEPS).await;
    check(&client, &table, &model, &mut rng, STEPS).await;
    assert_eq!(model.lake, model.now);
    for status in client.list_buckets(&table.path).await.expect("buckets") {
        let bucket = status.bucket.expect("bucket id");
        let plan = client.union(&bucket, &[], &[]).await.expect("union").plan;
        assert_eq!(plan.log_from, plan.log_to, "{bucket} is fully tiered");
    }
}

/// A union read leaves out the lake rows its tail replaces by position when the node's
/// lake index describes the planned snapshot, and probes every lake row's key when it
/// does not (after a restart, until a round builds the index again): the rows are the
/// same either way, updates and deletes of lake keys included, and when a plan extends
/// what the last one located.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn union_reads_locate_replaced_rows_or_probe_alike() {
    let mut server = Server::start().await;
    let table = server
        .client
        .create_table(&pk_lake_table("located", 2), false)
        .await
        .expect("create");
    let mut model = Model::new();
    let client = server.client.clone();
    let key = |id: i64| (DATES[(id % 2) as usize].to_string(), id, 0);
    let lake: Vec<(Key, Cells)> = (0..20)
        .map(|id| (key(id), (Some(format!("v{id}")), Some(id))))
        .collect();
    upsert(&client, &table, &mut model, &lake).await;
    tier(&client, &table, &mut model, 0).await;
    let updates: Vec<(Key, Cells)> = (0..22)
        .step_by(3)
        .map(|id| (key(id), (Some("new".to_string()), Some(99))))
        .collect();
    upsert(&client, &table, &mut model, &updates).await;
    delete(&client, &table, &mut model, &[key(5), key(9), key(30)]).await;

    /// Reads every bucket, checked against the model; asserts that each read merging a
    /// tail into lake files was planned with its replaced rows `located`, or not.
    async fn check_merges(
        client: &MinkClient,
        table: &TableDescriptor,
        model: &Model,
        located: bool,
    ) {
        let mut expected = by_bucket(table, &model.now);
        let mut merges = 0;
        for status in client.list_buckets(&table.path).await.expect("buckets") {
            let bucket = status.bucket.expect("bucket id");
            let answer = client.union(&bucket, &[], &[]).await.expect("union");
            let want = expected.remove(&bucket).unwrap_or_default();
            assert_eq!(sorted_rows(&answer.batches), want, "the union of {bucket}");
            let plan = &answer.plan;
            if plan.log_to > plan.log_from && plan.lake_files > 0 {
                merges += 1;
                assert_eq!(plan.replaced_rows_located, located, "{bucket}: {plan:?}");
            }
        }
        assert!(merges > 0, "some bucket merges a tail into the lake");
    }
    check_merges(&client, &table, &model, true).await;
    // More writes to the same tails: the next plans locate only the rows written since
    // (the node keeps what the last plan located), keys changed twice and lake keys
    // deleted after an update included.
    let again: Vec<(Key, Cells)> = (1..22)
        .step_by(2)
        .map(|id| (key(id), (Some("again".to_string()), Some(7))))
        .collect();
    upsert(&client, &table, &mut model, &again).await;
    delete(&client, &table, &mut model, &[key(3), key(4)]).await;
    check_merges(&client, &table, &model, true).await;
    server.restart().await;
    let client = server.client.clone();
    check_merges(&client, &table, &model, false).await;
    // A round builds the index again.
    tier(&client, &table, &mut model, 1).await;
    upsert(&client, &table, &mut model, &updates).await;
    delete(&client, &table, &mut model, &[key(0)]).await;
    check_merges(&client, &table, &model, true).await;
}

/// Every bucket's union rows, sorted.
async fn union_rows(client: &MinkClient, table: &TableDescriptor) -> Vec<(Key, Cells)> {
    let mut rows = Vec::new();
    for status in client.list_buckets(&table.path).await.expect("buckets") {
        let bucket = status.bucket.expect("bucket id");
        rows.extend(
            client
                .union(&bucket, &[], &[])
                .await
                .expect("union")
                .batches
                .iter()
                .flat_map(lake_values),
        );
    }
    rows.sort();
    rows
}

/// The lake files of every bucket's union read.
async fn lake_files(client: &MinkClient, table: &TableDescriptor) -> Vec<u64> {
    let mut files = Vec::new();
    for status in client.list_buckets(&table.path).await.expect("buckets") {
        let bucket = status.bucket.expect("bucket id");
        files.push(
            client
                .union(&bucket, &[], &[])
                .await
                .expect("union")
                .plan
                .lake_files,
        );
    }
    files
}

async fn lake_at(
    client: &MinkClient,
    table: &TableDescriptor,
    snapshot: Option<i64>,
) -> Vec<(Key, Cells)> {
    sorted_rows(
        &client
            .lake(&table.path, None, snapshot, &[], &[])
            .await
            .expect("lake"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_folds_files_and_keeps_older_snapshots_readable() {
    let mut node = TestNode::start().await;
    let table = node
        .client
        .create_table(&pk_lake_table("folded", 2), false)
        .await
        .expect("create");
    let mut model = Model::new();
    let keys: Vec<Key> = DATES
        .iter()
        .flat_map(|dt| (0..15).flat_map(move |id| (0..2).map(move |seq| (dt.to_string(), id, seq))))
        .collect();
    let cells = |round: i64, i: usize| -> Cells {
        (
            Some(format!("r{round}-{i}")),
            Some((i as i64 * 7 + round * 31) % 100),
        )
    };

    // Round 1: every key.
    let client = node.client.clone();
    let rows: Vec<(Key, Cells)> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| (k.clone(), cells(1, i)))
        .collect();
    upsert(&client, &table, &mut model, &rows).await;
    tier(&client, &table, &mut model, 1).await;
    let first = model.snapshots.last().expect("round 1").clone();
    // Round 2: every third key updated, every fifth deleted.
    let rows: Vec<(Key, Cells)> = keys
        .iter()
        .enumerate()
        .step_by(3)
        .map(|(i, k)| (k.clone(), cells(2, i)))
        .collect();
    upsert(&client, &table, &mut model, &rows).await;
    let gone: Vec<Key> = keys.iter().step_by(5).cloned().collect();
    delete(&client, &table, &mut model, &gone).await;
    tier(&client, &table, &mut model, 2).await;
    // Round 3: some keys updated again, the deleted ones back, new keys inserted and
    // deleted within the round.
    let mut rows: Vec<(Key, Cells)> = keys
        .iter()
        .enumerate()
        .step_by(4)
        .map(|(i, k)| (k.clone(), cells(3, i)))
        .collect();
    rows.extend(
        gone.iter()
            .enumerate()
            .map(|(i, k)| (k.clone(), cells(4, i))),
    );
    let fleeting: Vec<Key> = (100..104).map(|id| (DATES[0].to_string(), id, 0)).collect();
    rows.extend(fleeting.iter().map(|k| (k.clone(), (None, None))));
    upsert(&client, &table, &mut model, &rows).await;
    delete(&client, &table, &mut model, &fleeting).await;
    tier(&client, &table, &mut model, 3).await;
    let before = model.snapshots.last().expect("round 3").clone();

    let files_before = lake_files(&client, &table).await;
    assert!(
        files_before.iter().all(|f| *f >= 3),
        "three rounds wrote three data files per bucket: {files_before:?}"
    );
    let union_before = union_rows(&client, &table).await;
    assert_eq!(union_before, rows_of(&model.now));
    assert_eq!(lake_at(&client, &table, None).await, rows_of(&model.now));

    let reply = client.compact(&table.path).await.expect("compact");
    let compacted = reply.snapshot_id.expect("a compaction snapshot");
    assert_eq!(reply.buckets, files_before.len() as u64, "{reply:?}");
    assert!(reply.files_removed > 0, "{reply:?}");
    assert!(
        reply.files_removed >= files_before.iter().sum::<u64>()
            && reply.files_written < reply.files_removed,
        "every data file and delete file goes, fewer come: {reply:?}"
    );
    assert_eq!(reply.rows, model.now.len() as u64, "{reply:?}");
    model.snapshots.push((compacted, model.lake.clone()));
    model.recorded = Some(Some(compacted));
    model.compacted = true;

    let files_after = lake_files(&client, &table).await;
    assert!(files_after.iter().all(|f| *f == 1), "{files_after:?}");
    assert_eq!(
        union_rows(&client, &table).await,
        union_before,
        "compaction changes no row"
    );
    assert_eq!(lake_at(&client, &table, None).await, rows_of(&model.now));
    assert_eq!(
        lake_at(&client, &table, Some(before.0)).await,
        rows_of(&before.1),
        "the snapshot before the compaction still reads (its files are kept)"
    );
    assert_eq!(
        lake_at(&client, &table, Some(first.0)).await,
        rows_of(&first.1)
    );
    let mut rng = StdRng::seed_from_u64(7);
    check(&client, &table, &model, &mut rng, 0).await;

    // Nothing left to fold.
    let again = client.compact(&table.path).await.expect("compact");
    assert_eq!(again.snapshot_id, None, "{again:?}");

    // A round after the compaction deletes rows of the compacted files; then the same
    // after a restart (the lake index is rebuilt from the lake).
    for round in 5..7 {
        let client = node.client.clone();
        let rows: Vec<(Key, Cells)> = keys
            .iter()
            .enumerate()
            .skip(round as usize)
            .step_by(6)
            .map(|(i, k)| (k.clone(), cells(round, i)))
            .collect();
        upsert(&client, &table, &mut model, &rows).await;
        let gone: Vec<Key> = keys
            .iter()
            .skip(round as usize + 1)
            .step_by(7)
            .cloned()
            .collect();
        delete(&client, &table, &mut model, &gone).await;
        tier(&client, &table, &mut model, round as usize).await;
        check(&client, &table, &model, &mut rng, round as usize).await;
        node.restart().await;
        let client = node.client.clone();
        check(&client, &table, &model, &mut rng, round as usize).await;
    }
    let client = node.client.clone();
    compact(&client, &table, &mut model, 9).await;
    check(&client, &table, &model, &mut rng, 9).await;
}

/// Polls `done` every 100 ms until it holds; fails after `what` took 30 s.
async fn eventually<F: Future<Output = bool>>(what: &str, mut done: impl FnMut() -> F) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !done().await {
        assert!(std::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_tiers_and_compacts_on_its_own() {
    let node = TestNode::start().await;
    let client = &node.client;
    let mut table = pk_lake_table("auto", 1);
    table.lake_freshness = std::time::Duration::from_secs(1);
    let table = client.create_table(&table, false).await.expect("create");
    let key = |id: i64| ("d".to_string(), id, 0);
    let mut state: State = (0..10)
        .map(|id| (key(id), (Some(format!("v{id}")), Some(id))))
        .collect();
    client
        .write(&table, &lake_rows(&table, &rows_of(&state)))
        .await
        .expect("write");
    let expected = rows_of(&state);
    eventually("the first round", || async {
        lake_at(client, &table, None).await == expected
    })
    .await;

    // Half the lake rows are replaced: after that round the service compacts the bucket.
    let updates: Vec<(Key, Cells)> = (0..5)
        .map(|id| (key(id), (Some("new".to_string()), None)))
        .collect();
    client
        .write(&table, &lake_rows(&table, &updates))
        .await
        .expect("upsert");
    state.extend(updates);
    let expected = rows_of(&state);
    let lake = node.node().lake().await.expect("lake");
    eventually("a compaction by the service", || async {
        let lake_table = lake.load(&table.path).await.expect("lake table");
        let compacted = lake_table
            .metadata()
            .snapshots()
            .any(|s| s.summary().operation == mink_lake::Operation::Replace);
        compacted && lake_at(client, &table, None).await == expected
    })
    .await;
    assert_eq!(union_rows(client, &table).await, expected);
    assert_eq!(lake_files(client, &table).await, vec![1], "one file left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_after_add_column() {
    let node = TestNode::start().await;
    let client = &node.client;
    let table = client
        .create_table(&pk_lake_table("evolved", 1), false)
        .await
        .expect("create");
    let key = |id: i64| ("d".to_string(), id, 0);
    let mut state = State::new();
    for round in 0..2 {
        let rows: Vec<(Key, Cells)> = (0..6)
            .map(|id| (key(id), (Some(format!("r{round}")), Some(id))))
            .collect();
        client
            .write(&table, &lake_rows(&table, &rows))
            .await
            .expect("write");
        state.extend(rows);
        client.tier(&table.path).await.expect("tier");
    }
    let field = arrow::datatypes::Field::new("extra", arrow::datatypes::DataType::Utf8, true);
    client
        .add_column(&table.path, field)
        .await
        .expect("add column");
    // The lake's own columns now come before `extra`: compaction finds them by name.
    let reply = client.compact(&table.path).await.expect("compact");
    assert!(reply.files_removed > 0, "{reply:?}");
    assert_eq!(lake_at(client, &table, None).await, rows_of(&state));
    assert_eq!(union_rows(client, &table).await, rows_of(&state));
}
