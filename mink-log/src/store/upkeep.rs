//! The store's upkeep: deletes the objects no open needs any more.
//!
//! * **Behind the furthest checkpoint.** An open reads the WAL from the furthest checkpoint
//!   on, so the WAL objects before it, and every earlier checkpoint, are garbage. The
//!   fences stay (one small object per fenced epoch): a writer paused before its fence
//!   was put may wake at any time, and must find its next place taken. A checkpoint is in the store before anything behind it is deleted, so an
//!   open that finds a place of a WAL sequence empty checks whether a checkpoint passes it
//!   now (the `open` module): a place the upkeep emptied is not a free place to fence, and
//!   the open reads the store again.
//! * **Before a recorded start.** Once retention's new log start for a bucket is recorded
//!   (`starts/<key>/<offset>`), an open reads none of its stream objects that end at or
//!   before it, nor the older starts: they go after [`GRACE`], as the local segments do,
//!   for reads that began before the start moved. Packs stay (their other entries may be
//!   needed; the uploader deletes those nothing reads).
//! * **Off a KV checkpoint's chain.** Once a new base of a bucket's KV checkpoint is in
//!   the store, its runs off the furthest chain (the `kv_runs` module) go after [`GRACE`], for
//!   a restore that listed the store before.
//! * **Unread.** Stream objects a merged one replaced (the `compaction` module), or that
//!   an open found covered by others, packs an open found no bucket reads, and the claims
//!   of epochs before the furthest checkpoint's (an open reads the WAL of the epochs from
//!   that one on; fencing needs only the last claim) go after [`GRACE`].
//! * **A dropped bucket's.** Its stream objects, starts and runs go after [`GRACE`] too (a
//!   bucket's key, its table's and partition's ids, is never used again).
//! * **Packs nothing reads.** Every [`SWEEP_EVERY`] the upkeep lists the store as an open
//!   would (the `listing` module) and the packs no bucket's chain reads, nor would after a
//!   restart (their entries merged into a bucket's own objects, behind its recorded
//!   start, or of a bucket dropped), go after [`GRACE`]. Only what is in the store counts:
//!   an entry a running tablet dropped before retention recorded its start keeps its pack.
//!
//! ```text
//!   uploader: checkpoint created ──▶ upkeep: LIST wal/, checkpoints/ ────────┐
//!             start recorded ──(GRACE)──▶  LIST streams/<key>/, starts/<key>/ ─┤
//!             objects merged ──(GRACE)──▶  the objects the merge replaced ──────┤
//!   KV store: base written ────(GRACE)──▶  LIST kv/<key>/ ─────────────────────┼─▶ DELETE
//!   store:    bucket forgotten ─(GRACE)──▶  streams, starts and runs, all ──────┤
//!   every SWEEP_EVERY: LIST streams/, packs/ ─(GRACE)──▶  packs nothing reads ───┘
//! ```
//!
//! At most one pass runs every [`PASS_EVERY`]; a pass that fails is logged, and what it
//! left goes with the next checkpoint's or the bucket's next start's. Each pass first
//! lists the epochs: once a newer writer claimed the store, this one's upkeep stops
//! (what it would delete, the newer writer may read). An object already gone counts as
//! deleted.

use std::collections::{HashSet, VecDeque};
use std::time::Duration;

use futures::StreamExt as _;
use object_store::path::Path as StorePath;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::{debug, warn};

use super::coverage::{self, Place};
use super::kv_runs;
use super::listing::{Chains, PackDirectories, find_starts, list_under};
use super::location::Location;
use super::open::{list_numbers, store_error};
use super::{StoreCrash, StoreFailpoint, stream, wal};
use crate::error::Result;

/// The least time between two passes (each lists and deletes in batches).
const PASS_EVERY: Duration = Duration::from_secs(10);
/// How long a bucket's leftovers stay for reads that began before the start moved (or
/// the bucket was dropped).
const GRACE: Duration = Duration::from_secs(60);
/// How often the upkeep looks for packs nothing reads (it lists the store's stream
/// objects and packs, and reads the directories of packs it has not seen).
const SWEEP_EVERY: Duration = Duration::from_secs(600);

/// A handle on the upkeep: told of every checkpoint made, every start recorded and every
/// bucket dropped. The upkeep stops with the last clone.
#[derive(Debug, Clone)]
pub(crate) struct Upkeep {
    furthest: watch::Sender<Place>,
    leftovers: mpsc::UnboundedSender<Leftover>,
}

/// A bucket's objects that no open reads any more.
#[derive(Debug)]
struct Leftover {
    key: String,
    what: Left,
}

/// Which of a bucket's objects are left over.
#[derive(Debug, Clone)]
enum Left {
    /// Its stream objects and starts before this offset (its start moved there).
    Before(i64),
    /// Its KV checkpoint's runs off its furthest chain (a run was added).
    OffChain,
    /// Every one (the bucket is dropped).
    Everything,
    /// These stream objects (a merged one replaced them).
    Objects(Vec<StorePath>),
}

impl Upkeep {
    /// Starts the upkeep on the current runtime.
    pub(crate) fn start(location: Location, epoch: u64, failpoint: Option<StoreCrash>) -> Self {
        let (furthest, checkpoints) = watch::channel(Place::default());
        let (leftovers, left) = mpsc::unbounded_channel();
        let task = Task {
            location,
            passed: Place::default(),
            leftovers: VecDeque::new(),
            sweep: Sweep {
                next: Instant::now() + SWEEP_EVERY,
                directories: PackDirectories::default(),
                dropped: HashSet::new(),
            },
            epoch,
            failpoint,
        };
        tokio::spawn(task.run(checkpoints, left));
        Self {
            furthest,
            leftovers,
        }
    }

    /// A checkpoint at `place` is in the store.
    pub(crate) fn checkpointed(&self, place: Place) {
        self.furthest.send_if_modified(|furthest| {
            let further = place > *furthest;
            *furthest = (*furthest).max(place);
            further
        });
    }

    /// Bucket `key`'s log start `start` is recorded in the store.
    pub(crate) fn start_recorded(&self, key: &str, start: i64) {
        self.leave(key, Left::Before(start));
    }

    /// A new base of bucket `key`'s KV checkpoint is in the store.
    pub(crate) fn kv_checkpointed(&self, key: &str) {
        self.leave(key, Left::OffChain);
    }

    /// Bucket `key` is dropped.
    pub(crate) fn forgotten(&self, key: &str) {
        self.leave(key, Left::Everything);
    }

    /// No open reads the objects at `paths` any more: stream objects of bucket `key` a
    /// merged one replaced, or that an open found covered by others, packs, old epochs'
    /// claims.
    pub(crate) fn unread(&self, key: &str, paths: Vec<StorePath>) {
        if !paths.is_empty() {
            self.leave(key, Left::Objects(paths));
        }
    }

    fn leave(&self, key: &str, what: Left) {
        let leftover = Leftover {
            key: key.to_string(),
            what,
        };
        let _ = self.leftovers.send(leftover);
    }
}

/// The upkeep's look for packs nothing reads: those a running node's merges and
/// retention left behind, and those holding only entries of dropped buckets.
struct Sweep {
    next: Instant,
    directories: PackDirectories,
    /// The buckets dropped while the store is open (a bucket's key is never used again).
    dropped: HashSet<String>,
}

impl Sweep {
    /// The packs nothing reads, as the store's listing says, if a sweep is due.
    async fn unread_packs(&mut self, location: &Location) -> Result<Vec<StorePath>> {
        let now = Instant::now();
        if now < self.next {
            return Ok(Vec::new());
        }
        self.next = now + SWEEP_EVERY;
        let starts = find_starts(location).await?;
        let listed = Chains::list(location, &starts, &mut self.directories, &self.dropped);
        Ok(listed.await?.unread_packs)
    }
}

struct Task {
    location: Location,
    /// The checkpoint the last pass deleted behind.
    passed: Place,
    /// Leftovers, each with when it may go, in order.
    leftovers: VecDeque<(Instant, Leftover)>,
    sweep: Sweep,
    /// The writer's epoch: once a newer one is claimed, the upkeep deletes nothing more.
    epoch: u64,
    failpoint: Option<StoreCrash>,
}

impl Task {
    async fn run(
        mut self,
        mut checkpoints: watch::Receiver<Place>,
        mut leftovers: mpsc::UnboundedReceiver<Leftover>,
    ) {
        loop {
            let due = (self.leftovers.front())
                .map_or(self.sweep.next, |(due, ..)| (*due).min(self.sweep.next));
            tokio::select! {
                changed = checkpoints.changed() => if changed.is_err() {
                    return;
                },
                left = leftovers.recv() => {
                    let Some(leftover) = left else {
                        return;
                    };
                    if let Left::Everything = leftover.what {
                        self.sweep.dropped.insert(leftover.key.clone());
                    }
                    self.leftovers.push_back((Instant::now() + GRACE, leftover));
                    continue;
                }
                () = tokio::time::sleep_until(due) => {}
            }
            let furthest = *checkpoints.borrow_and_update();
            match list_numbers(&self.location, "epochs").await {
                Ok(claimed) if claimed.last().is_some_and(|&last| last > self.epoch) => {
                    warn!(
                        epoch = self.epoch,
                        "a newer writer claimed the log store: its upkeep deletes nothing more"
                    );
                    return;
                }
                Ok(_) => {}
                Err(error) => {
                    warn!(%error, "listing the log store's epochs failed; the upkeep waits");
                    tokio::time::sleep(PASS_EVERY).await;
                    continue;
                }
            }
            match self.pass(furthest).await {
                Ok(deleted) => debug!(?furthest, deleted, "log store upkeep: objects deleted"),
                Err(error) => warn!(%error, "a pass of the log store's upkeep failed"),
            }
            tokio::time::sleep(PASS_EVERY).await;
        }
    }

    /// Deletes what is behind `furthest` (if a pass has not yet) and the leftovers whose
    /// grace is over; the objects deleted.
    async fn pass(&mut self, furthest: Place) -> Result<usize> {
        let location = &self.location;
        let mut doomed = Vec::new();
        if furthest > self.passed {
            doomed.extend(behind_checkpoint(location, furthest).await?);
        }
        match self.sweep.unread_packs(location).await {
            Ok(unread) if !unread.is_empty() => {
                let leftover = Leftover {
                    key: "packs".into(),
                    what: Left::Objects(unread),
                };
                self.leftovers.push_back((Instant::now() + GRACE, leftover));
            }
            Ok(_) => {}
            Err(error) => warn!(%error, "looking for packs nothing reads failed"),
        }
        let now = Instant::now();
        while let Some((due, ..)) = self.leftovers.front()
            && *due <= now
        {
            let (_, leftover) = self.leftovers.pop_front().expect("a front");
            doomed.extend(left_over(location, &leftover).await?);
        }
        let count = doomed.len();
        let rest = doomed.split_off(count / 2);
        delete(location, doomed).await?;
        if count > 0 {
            StoreCrash::at(self.failpoint, StoreFailpoint::AbortMidUpkeepDeletion);
        }
        delete(location, rest).await?;
        self.passed = self.passed.max(furthest);
        Ok(count)
    }
}

/// Deletes the objects at `paths` (one already gone counts as deleted).
async fn delete(location: &Location, paths: Vec<StorePath>) -> Result<()> {
    let paths = futures::stream::iter(paths.into_iter().map(Ok)).boxed();
    let mut deleted = location.store.delete_stream(paths);
    while let Some(outcome) = deleted.next().await {
        match outcome {
            Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(store_error("deleting objects no open needs", e)),
        }
    }
    Ok(())
}

/// The WAL objects before `furthest`, and the checkpoints before it. Fences stay: a
/// writer paused before its epoch was fenced may wake and upload to its next place any
/// time later, and that place must stay taken, or the paused writer would acknowledge
/// writes in a place no open reads (behind the checkpoint). One fence per fenced epoch,
/// each [`wal::FENCE_LEN`] bytes, told from WAL objects by its size.
async fn behind_checkpoint(location: &Location, furthest: Place) -> Result<Vec<StorePath>> {
    let mut doomed = named_before(location, &["wal"], furthest, |parts, size| match parts {
        [epoch, seq] if size != wal::FENCE_LEN => Some((epoch.parse().ok()?, seq.parse().ok()?)),
        _ => None,
    })
    .await?;
    let checkpoints = named_before(
        location,
        &["checkpoints"],
        furthest,
        |parts, _| match parts {
            [name] => coverage::parse_name(name),
            _ => None,
        },
    );
    doomed.extend(checkpoints.await?);
    Ok(doomed)
}

/// A leftover's objects: its bucket's stream objects that end at or before its start
/// and its starts before it, or its KV checkpoint's runs off the furthest chain, or every
/// one of them.
async fn left_over(location: &Location, leftover: &Leftover) -> Result<Vec<StorePath>> {
    let key = &leftover.key;
    match &leftover.what {
        Left::Before(start) => before_start(location, key, *start).await,
        Left::OffChain => kv_runs::off_chain(location, key).await,
        Left::Everything => {
            let mut doomed = before_start(location, key, i64::MAX).await?;
            doomed.extend(kv_runs::every_run(location, key).await?);
            Ok(doomed)
        }
        Left::Objects(paths) => Ok(paths.clone()),
    }
}

/// The stream objects of bucket `key` that end at or before `start`, and its starts
/// before it.
async fn before_start(location: &Location, key: &str, start: i64) -> Result<Vec<StorePath>> {
    let key: Vec<&str> = key.split('/').collect();
    let streams = [&["streams"][..], &key].concat();
    let mut doomed = named_before(location, &streams, start, |parts, _| match parts {
        [name] => stream::parse_name(name).map(|(_, end)| end - 1),
        _ => None,
    })
    .await?;
    let starts = [&["starts"][..], &key].concat();
    let older = named_before(location, &starts, start, |parts, _| match parts {
        [name] => name.parse().ok(),
        _ => None,
    });
    doomed.extend(older.await?);
    Ok(doomed)
}

/// The objects under the path of `parts` whose names (the parts after them) `read`
/// reads, with their sizes, as a value before `before` (a place, an offset). Names it does
/// not read (a local store's unfinished uploads) stay.
async fn named_before<T: Ord>(
    location: &Location,
    parts: &[&str],
    before: T,
    read: impl Fn(&[String], u64) -> Option<T>,
) -> Result<Vec<StorePath>> {
    Ok(list_under(location, parts)
        .await?
        .into_iter()
        .filter(|(parts, object)| read(parts, object.size).is_some_and(|value| value < before))
        .map(|(_, object)| object.location)
        .collect())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use object_store::memory::InMemory;
    use object_store::{ObjectStoreExt as _, PutPayload};

    use super::*;

    async fn names(location: &Location, kind: &str) -> Vec<String> {
        let listed = list_under(location, &[kind]).await.unwrap();
        let mut names: Vec<String> = listed
            .into_iter()
            .map(|(parts, _)| parts.join("/"))
            .collect();
        names.sort();
        names
    }

    #[tokio::test(start_paused = true)]
    async fn what_is_before_a_recorded_start_and_a_dropped_bucket_go_after_the_grace() {
        let location = Location {
            store: Arc::new(InMemory::new()),
            root: StorePath::default(),
            node: None,
            local: None,
        };
        let objects = [
            format!("streams/t1/b0/{}", stream::name(0, 10)),
            format!("streams/t1/b0/{}", stream::name(10, 20)),
            format!("streams/t1/b0/{}", stream::name(20, 30)),
            format!("streams/t1/b1/{}", stream::name(0, 10)),
            format!("streams/t2/b0/{}", stream::name(0, 10)),
            format!("starts/t1/b0/{}", stream::offset_name(10)),
            format!("starts/t1/b0/{}", stream::offset_name(20)),
            format!("starts/t2/b0/{}", stream::offset_name(5)),
        ];
        for object in &objects {
            let path = StorePath::from(object.as_str());
            location
                .store
                .put(&path, PutPayload::from_static(b"x"))
                .await
                .unwrap();
        }
        let upkeep = Upkeep::start(location.clone(), 1, None);
        upkeep.start_recorded("t1/b0", 20);
        upkeep.forgotten("t2/b0");

        tokio::time::sleep(GRACE / 2).await;
        assert_eq!(
            names(&location, "streams").await.len(),
            5,
            "within the grace"
        );
        tokio::time::sleep(GRACE).await;
        assert_eq!(
            names(&location, "streams").await,
            [
                format!("t1/b0/{}", stream::name(20, 30)),
                format!("t1/b1/{}", stream::name(0, 10)),
            ]
        );
        assert_eq!(
            names(&location, "starts").await,
            [format!("t1/b0/{}", stream::offset_name(20))]
        );
    }
}
