//! Lake upkeep on a real lake table: merged manifests, expiry and orphan removal.

use std::collections::{BTreeSet, HashSet};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use iceberg::spec::{DataContentType, Operation};
use iceberg::table::Table;

use super::*;
use crate::catalog::Lake;
use crate::catalog::fixture::{lake_table_with, one_row_file};
use crate::changes::plan_changes;
use crate::commit::{
    DEFAULT_MIN_COUNT_TO_MERGE, SnapshotChanges, commit_snapshot, rewrite_would_merge,
};

/// A lake table and the snapshots committed to it.
struct Fixture {
    _dir: tempfile::TempDir,
    lake: Lake,
    table: Table,
    snapshots: Vec<i64>,
}

impl Fixture {
    async fn new(properties: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (lake, _, table) = lake_table_with(dir.path(), properties).await;
        Self {
            _dir: dir,
            lake,
            table,
            snapshots: Vec::new(),
        }
    }

    /// The location of data file `name` of bucket 0.
    fn path(&self, name: &str) -> String {
        format!(
            "{}/data/bucket=0/{name}.parquet",
            self.table.metadata().location()
        )
    }

    /// Writes the data files `added` (a byte each), then commits them with `removed`
    /// removed; returns the snapshot.
    async fn commit(&mut self, added: &[&str], removed: &[&str], rewrite_manifests: bool) -> i64 {
        let mut files = Vec::new();
        for name in added {
            let path = self.path(name);
            let output = self.table.file_io().new_output(&path).unwrap();
            output.write(Bytes::from_static(b"x")).await.unwrap();
            files.push(one_row_file(DataContentType::Data, &path));
        }
        let operation = match removed.is_empty() && !rewrite_manifests {
            true => Operation::Append,
            false => Operation::Replace,
        };
        let changes = SnapshotChanges {
            added_data_files: files,
            removed_files: removed.iter().map(|name| self.path(name)).collect(),
            rewrite_manifests,
            ..SnapshotChanges::default()
        };
        let parent = self.table.metadata().current_snapshot_id();
        self.table = commit_snapshot(&self.lake, &self.table, parent, operation, changes)
            .await
            .unwrap();
        let id = self.table.metadata().current_snapshot_id().unwrap();
        self.snapshots.push(id);
        id
    }

    /// The table as the catalog has it now.
    async fn reload(&mut self) {
        self.table = self
            .lake
            .catalog()
            .load_table(self.table.identifier())
            .await
            .unwrap();
    }

    async fn stats(&self) -> LakeTableStats {
        LakeTableStats::of(&self.table).await.unwrap()
    }

    /// The data files live in the current snapshot, by name.
    async fn live(&self) -> BTreeSet<String> {
        let snapshot = self.table.metadata().current_snapshot().unwrap();
        let list = self
            .table
            .manifest_list_reader(snapshot)
            .load()
            .await
            .unwrap();
        let mut live = BTreeSet::new();
        for manifest in list.entries() {
            let manifest = manifest.load_manifest(self.table.file_io()).await.unwrap();
            for entry in manifest.entries().iter().filter(|e| e.is_alive()) {
                let name = entry.file_path().rsplit('/').next().unwrap();
                live.insert(name.trim_end_matches(".parquet").to_string());
            }
        }
        live
    }

    async fn exists(&self, name: &str) -> bool {
        self.table.file_io().exists(self.path(name)).await.unwrap()
    }
}

fn names(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| n.to_string()).collect()
}

#[tokio::test]
async fn commits_merge_manifests_and_each_snapshot_keeps_its_own_additions() {
    let mut f = Fixture::new(&[]).await;
    let mut most = 0;
    let mut added = Vec::new();
    for i in 0..3 * DEFAULT_MIN_COUNT_TO_MERGE {
        added.push(format!("f{i}"));
        f.commit(&[added.last().unwrap()], &[], false).await;
        most = most.max(f.stats().await.manifests);
    }
    assert!(
        most <= DEFAULT_MIN_COUNT_TO_MERGE as u64,
        "{most} manifests at most"
    );
    let stats = f.stats().await;
    assert_eq!(stats.data_files, added.len() as u64);
    assert_eq!(f.live().await, added.iter().cloned().collect());
    // Every snapshot's incremental read still finds exactly the file it added.
    for (i, pair) in f.snapshots.windows(2).enumerate() {
        let changes = plan_changes(&f.table, pair[0], pair[1]).await.unwrap();
        let paths: Vec<&str> = changes.snapshots[0]
            .added_files
            .iter()
            .map(|a| a.path.as_str())
            .collect();
        assert_eq!(paths, [f.path(&added[i + 1])]);
    }
}

#[tokio::test]
async fn rewriting_manifests_merges_them_all_into_one_snapshot_of_the_same_files() {
    let mut f = Fixture::new(&[("commit.manifest-merge.enabled", "false")]).await;
    assert!(!rewrite_would_merge(&f.table).await.unwrap(), "no snapshot");
    f.commit(&["a"], &[], false).await;
    assert!(
        !rewrite_would_merge(&f.table).await.unwrap(),
        "one manifest"
    );
    for name in ["b", "c", "d", "e"] {
        f.commit(&[name], &[], false).await;
    }
    assert_eq!(f.stats().await.manifests, 5, "merging is off");
    assert!(rewrite_would_merge(&f.table).await.unwrap());
    f.commit(&[], &[], true).await;
    assert!(
        !rewrite_would_merge(&f.table).await.unwrap(),
        "merged already"
    );
    let stats = f.stats().await;
    assert_eq!((stats.manifests, stats.data_files), (1, 5));
    assert_eq!(f.live().await, names(&["a", "b", "c", "d", "e"]));
    let summary = f.table.metadata().current_snapshot().unwrap().summary();
    assert_eq!(summary.operation, Operation::Replace);
    let properties = &summary.additional_properties;
    assert_eq!(properties["manifests-replaced"], "5");
    assert_eq!(properties["manifests-created"], "1");
    assert_eq!(properties["total-data-files"], "5");
}

#[tokio::test]
async fn expiry_chooses_by_age_replacement_count_and_what_is_kept() {
    let mut f = Fixture::new(&[]).await;
    for name in ["a", "b"] {
        f.commit(&[name], &[], false).await;
    }
    tokio::time::sleep(Duration::from_millis(60)).await;
    f.commit(&["c"], &[], false).await;
    let [s1, s2, s3] = f.snapshots[..] else {
        unreachable!()
    };
    let metadata = f.table.metadata();
    let at = |id: i64| metadata.snapshot_by_id(id).unwrap().timestamp_ms();
    let retention = |age_ms, keep| Retention {
        max_snapshot_age: Duration::from_millis(age_ms),
        min_snapshots_to_keep: keep,
        gc_enabled: true,
    };
    let none = HashSet::new();
    let later = at(s3) + 3_600_000;
    assert_eq!(
        expirable_snapshots(metadata, &retention(1000, 1), later, &none),
        [s1, s2]
    );
    assert_eq!(
        expirable_snapshots(metadata, &retention(1000, 2), later, &none),
        [s1]
    );
    assert_eq!(
        expirable_snapshots(metadata, &retention(1000, 1), later, &HashSet::from([s1])),
        [s2]
    );
    assert!(expirable_snapshots(metadata, &retention(3_600_000 * 2, 1), later, &none).is_empty());
    // s2 is old enough, but was replaced (by s3) within the read grace (the maximum age).
    let now = at(s3) + 10;
    assert_eq!(
        expirable_snapshots(metadata, &retention(40, 1), now, &none),
        [s1]
    );
}

#[tokio::test]
async fn expiring_deletes_the_files_only_the_expired_snapshots_read() {
    let mut f = Fixture::new(&[]).await;
    let s1 = f.commit(&["a"], &[], false).await;
    let s2 = f.commit(&["b"], &[], false).await;
    let s3 = f.commit(&["c"], &["a"], false).await;
    let err = expire_snapshots(&f.lake, &f.table, &[s3])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("current snapshot"), "{err}");

    let expiry = expire_snapshots(&f.lake, &f.table, &[s1, s2])
        .await
        .unwrap();
    let report = expiry.delete_unreferenced(&f.lake).await;
    assert_eq!(report.expired, [s1, s2]);
    assert_eq!(report.data_files_deleted, 1, "{report:?}");
    assert_eq!(report.manifest_lists_deleted, 2, "{report:?}");
    assert!(
        !f.exists("a").await,
        "a was read by the expired snapshots only"
    );
    assert!(f.exists("b").await && f.exists("c").await);

    f.reload().await;
    let ids: Vec<i64> = f
        .table
        .metadata()
        .snapshots()
        .map(|s| s.snapshot_id())
        .collect();
    assert_eq!(ids, [s3]);
    assert_eq!(f.live().await, names(&["b", "c"]));
    let err = plan_changes(&f.table, s1, s3).await.unwrap_err();
    assert!(
        matches!(err, crate::LakeError::SnapshotNotFound { .. }),
        "{err}"
    );
    // The expired snapshots' manifest lists are gone, the kept one's is there.
    let snapshot = f.table.metadata().current_snapshot().unwrap();
    assert!(
        f.table
            .file_io()
            .exists(snapshot.manifest_list())
            .await
            .unwrap()
    );
}

#[tokio::test]
async fn an_expiry_planned_on_an_older_metadata_is_a_conflict() {
    let mut f = Fixture::new(&[]).await;
    let s1 = f.commit(&["a"], &[], false).await;
    f.commit(&["b"], &[], false).await;
    let stale = f.table.clone();
    f.commit(&["c"], &[], false).await;
    let err = expire_snapshots(&f.lake, &stale, &[s1]).await.unwrap_err();
    assert!(
        matches!(err, crate::LakeError::CommitConflict { .. }),
        "{err}"
    );
    f.reload().await;
    assert_eq!(f.table.metadata().snapshots().len(), 3, "nothing expired");
    assert!(f.exists("a").await);
}

#[tokio::test]
async fn no_file_goes_while_gc_is_disabled() {
    let mut f = Fixture::new(&[("gc.enabled", "false")]).await;
    let s1 = f.commit(&["a"], &[], false).await;
    f.commit(&["b"], &["a"], false).await;
    let err = expire_snapshots(&f.lake, &f.table, &[s1])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("gc.enabled"), "{err}");
    let err = remove_orphan_files(&f.lake, &f.table, i64::MAX, &HashSet::new())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("gc.enabled"), "{err}");
}

#[tokio::test]
async fn orphans_older_than_the_grace_go_and_referenced_files_stay() {
    let mut f = Fixture::new(&[]).await;
    f.commit(&["a"], &[], false).await;
    f.commit(&["b"], &["a"], false).await;
    let two_days_ago = SystemTime::now() - Duration::from_secs(2 * 86_400);
    for name in ["old-stray", "new-stray"] {
        let path = f.path(name);
        std::fs::write(&path, b"x").unwrap();
        if name == "old-stray" {
            let file = std::fs::File::options().write(true).open(&path).unwrap();
            file.set_modified(two_days_ago).unwrap();
        }
    }
    let one_day_ago = SystemTime::now() - Duration::from_secs(86_400);
    let cutoff = one_day_ago
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let report = remove_orphan_files(&f.lake, &f.table, cutoff, &HashSet::new())
        .await
        .unwrap();
    assert_eq!(report.removed, [f.path("old-stray")]);
    assert_eq!(report.bytes, 1);
    assert!(!f.exists("old-stray").await);
    assert!(f.exists("new-stray").await, "younger than the grace");
    // Every file a snapshot reads stays, a's too (the first snapshot reads it).
    let report = remove_orphan_files(&f.lake, &f.table, i64::MAX, &HashSet::new())
        .await
        .unwrap();
    assert_eq!(report.removed, [f.path("new-stray")]);
    assert!(f.exists("a").await && f.exists("b").await);
    f.reload().await;
    assert_eq!(f.live().await, names(&["b"]));
}

/// Waits (up to 10 s) until `done` holds.
async fn eventually(mut done: impl AsyncFnMut() -> bool) {
    for _ in 0..1000 {
        if done().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("not within 10 s");
}

/// The lease objects under a table's location.
fn lease_objects(f: &Fixture) -> Vec<std::path::PathBuf> {
    let dir = std::path::Path::new(f.table.metadata().location()).join(leases::LEASES_DIR);
    match std::fs::read_dir(dir) {
        Ok(entries) => entries.map(|entry| entry.unwrap().path()).collect(),
        Err(_) => Vec::new(),
    }
}

/// Writes a lease object as another process would.
fn foreign_lease(f: &Fixture, name: &str, body: &str) -> std::path::PathBuf {
    let dir = std::path::Path::new(f.table.metadata().location()).join(leases::LEASES_DIR);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, body).unwrap();
    path
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

#[tokio::test]
async fn a_lease_is_held_here_written_for_others_and_gone_once_dropped() {
    let mut f = Fixture::new(&[]).await;
    let s1 = f.commit(&["a"], &[], false).await;
    let location = f.table.metadata().location().to_string();
    let storage = f.lake.storage().clone();
    let lease = leases::Lease::take(&storage, &location, s1);
    let shared = leases::Lease::take(&storage, &location, s1);
    assert_eq!(leases::held_here(&location), HashSet::from([s1]));
    eventually(async || lease_objects(&f).len() == 1).await;
    // This process's own objects are left to its registry.
    let others = leases::leased_in_store(&storage, &location, now_ms())
        .await
        .unwrap();
    assert!(others.is_empty(), "{others:?}");
    drop(lease);
    assert_eq!(leases::held_here(&location), HashSet::from([s1]), "shared");
    drop(shared);
    assert!(leases::held_here(&location).is_empty());
    eventually(async || lease_objects(&f).is_empty()).await;
}

#[tokio::test]
async fn other_processes_leases_count_until_they_lapse_and_then_go() {
    let f = Fixture::new(&[]).await;
    let location = f.table.metadata().location().to_string();
    let storage = f.lake.storage().clone();
    let now = now_ms();
    let skew = limits::LEASE_CLOCK_SKEW.as_millis() as i64;
    let live = foreign_lease(
        &f,
        "other-1.json",
        &format!(
            r#"{{"snapshot-id": 7, "expires-at-ms": {}}}"#,
            now - skew + 60_000
        ),
    );
    let lapsed = foreign_lease(
        &f,
        "other-2.json",
        &format!(
            r#"{{"snapshot-id": 8, "expires-at-ms": {}}}"#,
            now - skew - 1
        ),
    );
    let junk = foreign_lease(&f, "other-3.json", "not a lease");
    let leased = leases::leased_in_store(&storage, &location, now)
        .await
        .unwrap();
    assert_eq!(leased, HashSet::from([7]), "within the clock skew");
    assert!(live.exists() && junk.exists(), "a young object is kept");
    assert!(!lapsed.exists(), "lapsed leases are deleted");
    let much_later = now + 3_600_000;
    let leased = leases::leased_in_store(&storage, &location, much_later)
        .await
        .unwrap();
    assert!(leased.is_empty());
    assert!(lease_objects(&f).is_empty(), "every lapsed object went");
}

#[tokio::test]
async fn a_planned_read_is_held_until_its_lease_takes_over() {
    let mut f = Fixture::new(&[]).await;
    let s1 = f.commit(&["a"], &[], false).await;
    let location = f.table.metadata().location().to_string();
    let (planned, hold) =
        leases::hold_planned(&location, || Ok::<_, ()>(Some(s1)), |s| *s).unwrap();
    assert_eq!(planned, Some(s1));
    hold.keep();
    leases::hold_planned_snapshots(&format!("file://{location}/"), &[42]).keep();
    assert_eq!(leases::held_here(&location), HashSet::from([s1, 42]));
    // The reader's lease releases the node's hold of its plan: once it is dropped, only
    // the other hold is left.
    drop(leases::Lease::take(f.lake.storage(), &location, s1));
    assert_eq!(leases::held_here(&location), HashSet::from([42]));
}

#[test]
fn a_plan_that_fails_holds_nothing() {
    let location = "/nowhere/shop/failed";
    let failed = leases::hold_planned(location, || Err::<Option<i64>, _>("no"), |s| *s);
    assert!(failed.is_err());
    // Held until the plan is made, released when it fails.
    let hold = leases::hold_planned_snapshots(location, &[7, 8]);
    assert_eq!(leases::held_here(location), HashSet::from([7, 8]));
    drop(hold);
    assert!(leases::held_here(location).is_empty());
}

#[tokio::test]
async fn an_expiry_spares_the_files_of_a_snapshot_held_meanwhile() {
    let mut f = Fixture::new(&[]).await;
    let s1 = f.commit(&["a"], &[], false).await;
    f.commit(&["b"], &["a"], false).await;
    let mut expiry = expire_snapshots(&f.lake, &f.table, &[s1]).await.unwrap();
    expiry.spare(&HashSet::from([s1])).await.unwrap();
    let report = expiry.delete_unreferenced(&f.lake).await;
    assert_eq!(report.expired, [s1]);
    assert_eq!(report.data_files_deleted, 0, "{report:?}");
    assert!(f.exists("a").await, "the read planned on s1 still finds a");
    // While a lease names the expired snapshot, orphan removal removes nothing; after,
    // its files are orphans.
    f.reload().await;
    let leased = HashSet::from([s1]);
    let report = remove_orphan_files(&f.lake, &f.table, i64::MAX, &leased)
        .await
        .unwrap();
    assert!(report.removed.is_empty(), "{report:?}");
    assert!(f.exists("a").await);
    let report = remove_orphan_files(&f.lake, &f.table, i64::MAX, &HashSet::new())
        .await
        .unwrap();
    assert!(report.removed.contains(&f.path("a")), "{report:?}");
}

#[tokio::test]
async fn orphan_removal_leaves_lease_objects_alone() {
    let mut f = Fixture::new(&[]).await;
    f.commit(&["a"], &[], false).await;
    let lease = foreign_lease(&f, "other-1.json", "{}");
    let report = remove_orphan_files(&f.lake, &f.table, i64::MAX, &HashSet::new())
        .await
        .unwrap();
    assert!(report.removed.is_empty(), "{report:?}");
    assert!(lease.exists());
}
