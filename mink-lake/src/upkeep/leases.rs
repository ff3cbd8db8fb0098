//! Leases: a running read's hold on the lake snapshot it planned on, so that upkeep never
//! deletes a file under it, in any process that reads the lake.
//!
//! A read plans on one snapshot (the node answers its plan from the seam it recorded) and
//! then reads that snapshot's data files for as long as its client takes. Expiry deletes
//! the files only expired snapshots read, and the reader may be another process: the
//! server's SQL engine, a `mink worker`, a `mink sql --connect` client reading the
//! warehouse itself. They share only the lake, so a lease is an object in the lake's
//! store, under the table's location:
//!
//! ```text
//!  <table location>/leases/<process>-<n>.json    {"snapshot-id": 42, "expires-at-ms": ...}
//!
//!  node     plans a read on S ──────── holds S in memory for a LEASE_PERIOD
//!  reader   takes a Lease on S ─┬──── writes its object (in the background), rewrites it
//!                               │     LEASE_RENEWALS times a period while the read runs
//!                               └──── deletes it when the read's plan is dropped
//!  upkeep   keeps every snapshot held here or by an object whose expiry (+ LEASE_CLOCK_SKEW)
//!           is ahead; deletes the objects of lapsed leases
//! ```
//!
//! The node is the only process that expires its tables' snapshots, and it plans every
//! read of them, so the gap between a plan and the reader's first write is covered by the
//! node's own memory: [`hold_planned`] records the planned snapshot under the table's own
//! lock, the one upkeep reads the table's holds under ([`held_here`]), atomically with
//! reading which snapshot to plan on, and keeps it for a [`LEASE_PERIOD`]. The holds of a
//! table are one entry per snapshot (how many reads hold it, until when), so a client
//! planning reads in a loop grows a count, not a list; lapsed entries are pruned as holds
//! are added. A plan that fails releases its holds ([`PlannedHold`]). A reader in this
//! process releases one such hold when it takes its lease, which holds the snapshot from
//! then on (a hold it releases may be another process's whose lease is not written yet:
//! that reader is then covered only while this one's lease lives, a gap of the few
//! milliseconds between a plan and its first write). Expiry reads the holds after it
//! fixed the seam it keeps, so a read planned before is held and one planned after plans
//! on a snapshot expiry keeps. A read that names an older snapshot itself
//! ([`hold_planned_snapshots`]) is held before its metadata is loaded, and expiry reads
//! this node's holds again after its commit, before it deletes anything: a read that
//! loaded the metadata before the commit is held; one that loads it after finds the
//! snapshot gone, a clear `NOT_FOUND`.
//!
//! A lease of this process is the same one for every read of the snapshot at once (one
//! write per snapshot, not per statement); its objects are ignored by this process's own
//! upkeep, which sees the lease in memory. `table_changes` cursors kept by clients between
//! statements are not leases: an expired snapshot is a clear `NOT_FOUND` to them.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::TryStreamExt;
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;
use tracing::{debug, warn};

use super::limits::{LEASE_CLOCK_SKEW, LEASE_PERIOD, LEASE_RENEWALS};
use crate::error::Result;
use crate::layout::without_file_scheme;
use crate::storage::LakeStorage;

/// The directory of a table's leases, under its location. Orphan removal leaves it alone.
pub const LEASES_DIR: &str = "leases";

/// The environment variable that shortens [`LEASE_PERIOD`] and [`LEASE_CLOCK_SKEW`] to its
/// milliseconds, for tests that watch a lease lapse (their processes share one clock).
/// Every process of a deployment must see the same value.
pub const LEASE_PERIOD_ENV: &str = "MINK_LAKE_LEASE_MS";

/// [`LEASE_PERIOD_ENV`]'s period, when set.
fn test_period() -> Option<Duration> {
    static PERIOD: LazyLock<Option<Duration>> = LazyLock::new(|| {
        let ms = std::env::var(LEASE_PERIOD_ENV).ok()?;
        ms.trim().parse().ok().map(Duration::from_millis)
    });
    *PERIOD
}

/// The lease period in force: [`LEASE_PERIOD`], or [`LEASE_PERIOD_ENV`]'s.
pub fn lease_period() -> Duration {
    test_period().unwrap_or(LEASE_PERIOD)
}

/// The clock skew allowed for in force: [`LEASE_CLOCK_SKEW`], or [`LEASE_PERIOD_ENV`]'s.
fn clock_skew() -> Duration {
    test_period().unwrap_or(LEASE_CLOCK_SKEW)
}

/// A lease object's content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct LeaseBody {
    snapshot_id: i64,
    /// Milliseconds since the epoch, by the reader's clock.
    expires_at_ms: i64,
}

/// A read's lease on a snapshot of a lake table (see the module docs): held while any
/// clone lives; its object is written and renewed in the background and deleted once the
/// last clone is dropped.
#[derive(Debug, Clone)]
pub struct Lease {
    _held: Arc<Held>,
}

#[derive(Debug)]
struct Held {
    key: (String, i64),
    /// Dropped with the lease: its writer then deletes the object and ends.
    _stop: oneshot::Sender<()>,
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut leases = leases();
        if leases
            .get(&self.key)
            .is_some_and(|held| held.strong_count() == 0)
        {
            leases.remove(&self.key);
        }
    }
}

/// This process's leases, by table key ([`table_key`]) and snapshot.
type LeaseRegistry = HashMap<(String, i64), Weak<Held>>;

fn leases() -> MutexGuard<'static, LeaseRegistry> {
    static LEASES: LazyLock<Mutex<LeaseRegistry>> = LazyLock::new(Mutex::default);
    lock(&LEASES)
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The node's holds of one planned snapshot: how many reads hold it, and when the latest
/// hold ends.
#[derive(Debug, Clone, Copy)]
struct Holds {
    count: u64,
    until: Instant,
}

/// The smallest number of held snapshots at which a table's lapsed holds are pruned.
const MIN_PRUNE_AT: usize = 16;

/// The node's holds of planned reads of one table: one entry per snapshot, however many
/// reads hold it, dropped once its last hold lapses or is released.
#[derive(Debug, Default)]
struct TableHolds {
    by_snapshot: HashMap<i64, Holds>,
    /// The number of held snapshots at which lapsed holds are next pruned: twice the
    /// number left by the last pruning, so that pruning costs O(1) a hold, amortised.
    prune_at: usize,
}

impl TableHolds {
    /// Holds each of `snapshots` once more, until `until` at least.
    fn hold(&mut self, snapshots: &[i64], until: Instant) {
        for snapshot_id in snapshots {
            let holds = self
                .by_snapshot
                .entry(*snapshot_id)
                .or_insert(Holds { count: 0, until });
            holds.count += 1;
            holds.until = holds.until.max(until);
        }
        if self.by_snapshot.len() >= self.prune_at {
            self.prune(Instant::now());
        }
    }

    /// Releases one hold of each of `snapshots`; a snapshot released by all its holders is
    /// dropped.
    fn release(&mut self, snapshots: &[i64]) {
        for snapshot_id in snapshots {
            if let Entry::Occupied(mut holds) = self.by_snapshot.entry(*snapshot_id) {
                holds.get_mut().count -= 1;
                if holds.get().count == 0 {
                    holds.remove();
                }
            }
        }
    }

    /// Drops the snapshots whose every hold has lapsed by `now`.
    fn prune(&mut self, now: Instant) {
        self.by_snapshot.retain(|_, holds| holds.until > now);
        self.prune_at = (2 * self.by_snapshot.len()).max(MIN_PRUNE_AT);
    }

    /// The snapshots held now, the lapsed ones dropped.
    fn held(&mut self) -> impl Iterator<Item = i64> {
        self.prune(Instant::now());
        self.by_snapshot.keys().copied()
    }
}

/// Every table's planned holds, by table key ([`table_key`]); a table holding nothing has
/// no entry. Each table has its own lock, taken while its holds are read or changed and
/// while a read plans on it ([`hold_planned`]); this one is held only to find it.
type PlannedRegistry = HashMap<String, Arc<Mutex<TableHolds>>>;

fn planned() -> MutexGuard<'static, PlannedRegistry> {
    static PLANNED: LazyLock<Mutex<PlannedRegistry>> = LazyLock::new(Mutex::default);
    lock(&PLANNED)
}

/// Runs `f` on the planned holds of the table at `location` under that table's lock, then
/// drops the table's entry if it holds nothing.
fn with_table<R>(location: &str, f: impl FnOnce(&mut TableHolds) -> R) -> R {
    let key = table_key(location);
    let table = Arc::clone(planned().entry(key.clone()).or_default());
    let result = f(&mut lock(&table));
    let mut planned = planned();
    // Shared only by the registry and this call, nobody else can be holding its lock or
    // about to add a hold: the lock below is free.
    if Arc::strong_count(&table) == 2 && lock(&table).by_snapshot.is_empty() {
        planned.remove(&key);
    }
    // Dropped under the registry's lock, so that of two calls ending together the last
    // sees itself alone.
    drop(table);
    drop(planned);
    result
}

/// This process's prefix of its lease objects' names.
fn process_token() -> &'static str {
    static TOKEN: LazyLock<String> = LazyLock::new(|| uuid::Uuid::new_v4().simple().to_string());
    &TOKEN
}

/// How a table is named in this process's registry: its location without a `file:`
/// scheme or a trailing `/`.
pub fn table_key(location: &str) -> String {
    without_file_scheme(location)
        .trim_end_matches('/')
        .to_string()
}

/// The location of the table `database.name` that the lake file `file` lies in
/// (`<location>/data/...`, the location ending in `/<database>/<name>`); `None` when its
/// path does not show it.
pub fn location_of_file(database: &str, name: &str, file: &str) -> Option<String> {
    let table = format!("/{database}/{name}");
    let at = file.find(&format!("{table}/data/"))?;
    Some(file[..at + table.len()].to_string())
}

/// The node's holds of the snapshots a read it is planning names: released when dropped,
/// unless [`Self::keep`] is called once the plan is made (they then last a lease period,
/// or until the reader's lease takes over). A plan that fails leaves nothing held. The
/// default holds nothing.
#[derive(Debug, Default)]
#[must_use = "dropping the hold releases it"]
pub struct PlannedHold {
    location: String,
    snapshots: Vec<i64>,
}

impl PlannedHold {
    /// Keeps the holds for their lease period: the read was planned.
    pub fn keep(mut self) {
        self.snapshots.clear();
    }
}

impl Drop for PlannedHold {
    fn drop(&mut self) {
        if !self.snapshots.is_empty() {
            release_planned(&self.location, &self.snapshots);
        }
    }
}

/// Runs `plan` (which reads the snapshot a read plans on) under the table's lock and holds
/// the snapshot `snapshot_of` finds in its result for a lease period: upkeep reading the
/// table's holds either sees it or runs after it, when the seam it keeps is what `plan`
/// read. Other tables' reads and upkeep do not wait for `plan`.
///
/// # Errors
/// `plan`'s.
pub fn hold_planned<T, E>(
    location: &str,
    plan: impl FnOnce() -> std::result::Result<T, E>,
    snapshot_of: impl FnOnce(&T) -> Option<i64>,
) -> std::result::Result<(T, PlannedHold), E> {
    with_table(location, |holds| {
        let planned = plan()?;
        let snapshots: Vec<i64> = snapshot_of(&planned).into_iter().collect();
        holds.hold(&snapshots, Instant::now() + lease_period());
        Ok((planned, planned_hold(location, snapshots)))
    })
}

/// Holds `snapshots` of the table at `location` for a lease period: a read that names its
/// snapshots itself (a Lake read of an older one, the changes between two), before it
/// loads the metadata that has them.
pub fn hold_planned_snapshots(location: &str, snapshots: &[i64]) -> PlannedHold {
    let until = Instant::now() + lease_period();
    with_table(location, |holds| holds.hold(snapshots, until));
    planned_hold(location, snapshots.to_vec())
}

fn planned_hold(location: &str, snapshots: Vec<i64>) -> PlannedHold {
    PlannedHold {
        location: location.to_string(),
        snapshots,
    }
}

/// Releases one hold of each of `snapshots` of the table at `location`.
fn release_planned(location: &str, snapshots: &[i64]) {
    with_table(location, |holds| holds.release(snapshots));
}

/// The snapshots of the table at `location` that this process holds: its leases and the
/// holds of the reads it planned.
pub fn held_here(location: &str) -> HashSet<i64> {
    let key = table_key(location);
    let mut held: HashSet<i64> = leases()
        .iter()
        .filter(|((table, _), lease)| *table == key && lease.strong_count() > 0)
        .map(|((_, snapshot), _)| *snapshot)
        .collect();
    with_table(location, |holds| held.extend(holds.held()));
    held
}

impl Lease {
    /// This process's lease on `snapshot_id` of the table at `location`: the one already
    /// held, or a new one whose object a background task writes, renews and deletes. Must
    /// be called in a tokio runtime; without one the lease is held in this process only
    /// (logged).
    pub fn take(storage: &LakeStorage, location: &str, snapshot_id: i64) -> Self {
        let key = (table_key(location), snapshot_id);
        // This read's lease now covers what the node's hold of its plan did.
        release_planned(location, &[snapshot_id]);
        let mut leases = leases();
        if let Some(held) = leases.get(&key).and_then(Weak::upgrade) {
            return Self { _held: held };
        }
        let (stop, stopped) = oneshot::channel();
        let held = Arc::new(Held {
            key: key.clone(),
            _stop: stop,
        });
        leases.insert(key, Arc::downgrade(&held));
        drop(leases);
        match (
            tokio::runtime::Handle::try_current(),
            lease_object(storage, location),
        ) {
            (Ok(runtime), Ok((store, path))) => {
                runtime.spawn(keep_lease(store, path, snapshot_id, stopped));
            }
            (Err(error), _) => {
                warn!(%location, %error, "no runtime to write a lake lease; held in this process only");
            }
            (_, Err(error)) => {
                warn!(%location, %error, "cannot write a lake lease; held in this process only");
            }
        }
        Self { _held: held }
    }
}

/// Where a new lease of this process on the table at `location` is written.
fn lease_object(
    storage: &LakeStorage,
    location: &str,
) -> iceberg::Result<(Arc<dyn ObjectStore>, StorePath)> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = format!("{}/{LEASES_DIR}", location.trim_end_matches('/'));
    let path = storage.path(&format!("{dir}/{}-{n}.json", process_token()))?;
    Ok((storage.store()?, path))
}

/// Writes a lease's object, rewrites it [`LEASE_RENEWALS`] times a period until `stopped`
/// (the lease was dropped), then deletes it.
async fn keep_lease(
    store: Arc<dyn ObjectStore>,
    path: StorePath,
    snapshot_id: i64,
    mut stopped: oneshot::Receiver<()>,
) {
    let period = lease_period();
    loop {
        let body = LeaseBody {
            snapshot_id,
            expires_at_ms: now_ms().saturating_add(millis(period)),
        };
        let bytes = serde_json::to_vec(&body).unwrap_or_default();
        if let Err(error) = store.put(&path, PutPayload::from(bytes)).await {
            warn!(%path, %error, "could not write a lake lease; retried at its next renewal");
        }
        tokio::select! {
            () = tokio::time::sleep(period / LEASE_RENEWALS) => {}
            _ = &mut stopped => break,
        }
    }
    match store.delete(&path).await {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
        Err(error) => warn!(%path, %error, "could not delete a lake lease; it lapses"),
    }
}

/// The snapshots the lease objects under the table at `location` hold at `now_ms`,
/// besides this process's own (which [`held_here`] knows). Lapsed leases, and objects that
/// are not leases and older than one, are deleted.
///
/// # Errors
/// The leases could not be listed or read.
pub async fn leased_in_store(
    storage: &LakeStorage,
    location: &str,
    now_ms: i64,
) -> Result<HashSet<i64>> {
    let store = storage.store()?;
    let dir = storage.path(&format!("{}/{LEASES_DIR}", location.trim_end_matches('/')))?;
    let objects: Vec<_> = store.list(Some(&dir)).try_collect().await?;
    let mut leased = HashSet::new();
    for object in objects {
        let own = object
            .location
            .filename()
            .is_some_and(|name| name.starts_with(process_token()));
        if own {
            continue;
        }
        let body = match store.get(&object.location).await {
            Ok(read) => serde_json::from_slice::<LeaseBody>(&read.bytes().await?).ok(),
            Err(object_store::Error::NotFound { .. }) => continue,
            Err(error) => return Err(error.into()),
        };
        let lapsed_at = match body {
            Some(body) => body.expires_at_ms.saturating_add(millis(clock_skew())),
            None => object
                .last_modified
                .timestamp_millis()
                .saturating_add(millis(lease_period() + clock_skew())),
        };
        match body {
            Some(body) if lapsed_at > now_ms => {
                leased.insert(body.snapshot_id);
            }
            _ if lapsed_at > now_ms => {}
            _ => {
                debug!(path = %object.location, "deleting a lapsed lake lease");
                if let Err(error) = store.delete(&object.location).await {
                    warn!(path = %object.location, %error, "could not delete a lapsed lake lease");
                }
            }
        }
    }
    Ok(leased)
}

/// Every snapshot of the table at `location` a running read holds: this process's holds
/// and leases, and the lease objects of others.
///
/// # Errors
/// As [`leased_in_store`].
pub async fn leased_snapshots(storage: &LakeStorage, location: &str) -> Result<HashSet<i64>> {
    let mut leased = leased_in_store(storage, location, now_ms()).await?;
    leased.extend(held_here(location));
    Ok(leased)
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_shows_its_table_location() {
        let file = "/w/shop/orders/data/bucket=0/a.parquet";
        assert_eq!(
            location_of_file("shop", "orders", file).as_deref(),
            Some("/w/shop/orders")
        );
        let nested = "s3://b/w/shop/orders/data/day=shop/orders/data/bucket=1/a.parquet";
        assert_eq!(
            location_of_file("shop", "orders", nested).as_deref(),
            Some("s3://b/w/shop/orders")
        );
        assert_eq!(location_of_file("shop", "other", file), None);
        assert_eq!(table_key("file:///w/shop/orders/"), "/w/shop/orders");
    }

    #[test]
    fn many_holds_of_a_snapshot_take_one_entry_and_lapsed_ones_are_pruned() {
        let now = Instant::now();
        let mut holds = TableHolds::default();
        for _ in 0..10_000 {
            holds.hold(&[5], now + Duration::from_secs(60));
        }
        assert_eq!(holds.by_snapshot.len(), 1, "one entry a snapshot");
        holds.release(&[5]);
        assert_eq!(holds.by_snapshot[&5].count, 9_999);
        // Holds that lapse are pruned as new ones are added, once their number doubles.
        let lapsed = now.checked_sub(Duration::from_secs(1)).unwrap();
        for snapshot_id in 100..100 + 4 * MIN_PRUNE_AT as i64 {
            holds.hold(&[snapshot_id], lapsed);
        }
        assert!(
            holds.by_snapshot.len() < 2 * MIN_PRUNE_AT,
            "pruned while held"
        );
        assert_eq!(holds.held().collect::<Vec<_>>(), [5]);
    }

    #[test]
    fn a_table_holding_nothing_has_no_entry() {
        let location = "/nowhere/shop/released";
        let hold = hold_planned_snapshots(location, &[7, 7, 8]);
        assert_eq!(held_here(location), HashSet::from([7, 8]));
        drop(hold);
        assert!(held_here(location).is_empty());
        assert!(!planned().contains_key(location), "the table's entry went");
    }
}
