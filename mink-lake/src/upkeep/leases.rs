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
//! node's own memory: [`hold_planned`] records the planned snapshot under the same lock
//! that upkeep reads the holds under ([`held_here`]), atomically with reading which
//! snapshot to plan on, and keeps it for a [`LEASE_PERIOD`]. A reader in this process
//! releases one such hold when it takes its lease, which holds the snapshot from then on
//! (a hold it releases may be another process's whose lease is not written yet: that
//! reader is then covered only while this one's lease lives, a gap of the few
//! milliseconds between a plan and its first write). Expiry reads the holds after it
//! fixed the seam it keeps, so a read planned before is held and one planned after plans
//! on a snapshot expiry keeps; a read that names an older snapshot itself
//! ([`hold_planned_snapshots`]) is held before its metadata is loaded, and expiry reads
//! the holds again after its commit, before it deletes anything.
//!
//! A lease of this process is the same one for every read of the snapshot at once (one
//! write per snapshot, not per statement); its objects are ignored by this process's own
//! upkeep, which sees the lease in memory. `table_changes` cursors kept by clients between
//! statements are not leases: an expired snapshot is a clear `NOT_FOUND` to them.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError, Weak};
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
        let mut registry = registry();
        if registry
            .leases
            .get(&self.key)
            .is_some_and(|held| held.strong_count() == 0)
        {
            registry.leases.remove(&self.key);
        }
    }
}

/// This process's leases and the node's holds of planned reads, by table key
/// ([`table_key`]).
#[derive(Debug, Default)]
struct Registry {
    leases: HashMap<(String, i64), Weak<Held>>,
    /// Per table: each planned read's snapshot and when its hold ends.
    planned: HashMap<String, Vec<(i64, Instant)>>,
}

impl Registry {
    /// The planned holds of `key` that have not ended, the ended ones dropped.
    fn planned(&mut self, key: &str) -> &mut Vec<(i64, Instant)> {
        let now = Instant::now();
        let holds = self.planned.entry(key.to_string()).or_default();
        holds.retain(|(_, until)| *until > now);
        holds
    }
}

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(Mutex::default);
    REGISTRY.lock().unwrap_or_else(PoisonError::into_inner)
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

/// Runs `plan` (which reads the snapshot a read plans on) under the registry's lock and
/// holds the snapshot `snapshot_of` finds in its result for a lease period: upkeep reading
/// the holds either sees it or runs after it, when the seam it keeps is what `plan` read.
///
/// # Errors
/// `plan`'s.
pub fn hold_planned<T, E>(
    location: &str,
    plan: impl FnOnce() -> std::result::Result<T, E>,
    snapshot_of: impl FnOnce(&T) -> Option<i64>,
) -> std::result::Result<T, E> {
    let mut registry = registry();
    let planned = plan()?;
    if let Some(snapshot_id) = snapshot_of(&planned) {
        let until = Instant::now() + lease_period();
        registry
            .planned(&table_key(location))
            .push((snapshot_id, until));
    }
    Ok(planned)
}

/// Holds `snapshots` of the table at `location` for a lease period: a read that names its
/// snapshots itself (a Lake read of an older one, the changes between two), before it
/// loads the metadata that has them.
pub fn hold_planned_snapshots(location: &str, snapshots: &[i64]) {
    let until = Instant::now() + lease_period();
    let mut registry = registry();
    let planned = registry.planned(&table_key(location));
    planned.extend(snapshots.iter().map(|id| (*id, until)));
}

/// Releases one hold of each of `snapshots` ([`hold_planned_snapshots`]): the read was
/// not planned (a snapshot it named is not the table's).
pub fn release_planned(location: &str, snapshots: &[i64]) {
    let mut registry = registry();
    let planned = registry.planned(&table_key(location));
    for snapshot_id in snapshots {
        if let Some(at) = planned.iter().position(|(id, _)| id == snapshot_id) {
            planned.remove(at);
        }
    }
}

/// The snapshots of the table at `location` that this process holds: its leases and the
/// holds of the reads it planned.
pub fn held_here(location: &str) -> HashSet<i64> {
    let key = table_key(location);
    let mut registry = registry();
    let mut held: HashSet<i64> = registry
        .leases
        .iter()
        .filter(|((table, _), lease)| *table == key && lease.strong_count() > 0)
        .map(|((_, snapshot), _)| *snapshot)
        .collect();
    held.extend(registry.planned(&key).iter().map(|(id, _)| *id));
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
        let mut registry = registry();
        if let Some(held) = registry.leases.get(&key).and_then(Weak::upgrade) {
            return Self { _held: held };
        }
        let (stop, stopped) = oneshot::channel();
        let held = Arc::new(Held {
            key: key.clone(),
            _stop: stop,
        });
        registry.leases.insert(key, Arc::downgrade(&held));
        drop(registry);
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
}
