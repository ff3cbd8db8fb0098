//! The uploader: every segment a bucket seals becomes a stream object in the store; once
//! it is there, the bucket reads that part of its history from the store, and the local
//! segment goes after a grace period (a read that planned it a moment before still finds
//! it). Where retention moved a bucket's log start is recorded too
//! (`starts/<key>/<offset>`, created only; the furthest holds), so a restart does not
//! bring back what `log.ttl` removed.
//!
//! Uploads run one at a time, in the order segments are sealed. Small segments sealed
//! together (quiet buckets sealing by age, a rebuilt log's segments at an open) go in one
//! pack (the `pack` module). An upload that fails is retried, with a growing pause, until
//! it succeeds or its buckets are gone: meanwhile the segments are read locally, and a
//! restart reads their frames from the WAL objects.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use object_store::path::Path as StorePath;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tracing::{debug, warn};

use super::blocks::CachedObject;
use super::compaction;
use super::coverage::{self, Coverage};
use super::location::Location;
use super::open::{blocking, create};
use super::pack;
use super::stream::{self, StreamObject};
use super::upkeep::Upkeep;
use super::{StoreCrash, StoreFailpoint};
use crate::Shared;
use crate::error::{LogError, Result};
use crate::segment::{self, FrameHeader};

/// How long a local segment stays after its stream object is in the store.
const GRACE: Duration = Duration::from_secs(60);
/// The longest pause between two attempts of a failing upload.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// A segment a bucket sealed, to upload.
#[derive(Debug)]
pub(crate) struct Sealed {
    /// The bucket's key in the store.
    pub(crate) key: String,
    /// The bucket's log directory.
    pub(crate) dir: PathBuf,
    /// The segment's base offset.
    pub(crate) base: i64,
    /// Its frames.
    pub(crate) frames: Vec<FrameHeader>,
    /// The bucket's tablet, told where the segment went.
    pub(crate) tablet: Weak<Shared>,
}

/// What the uploader is asked to do.
#[derive(Debug)]
pub(crate) enum Job {
    /// Upload a sealed segment.
    Seal(Sealed),
    /// Record that a bucket's log starts at `start`: retention removed what was before.
    Trim { key: String, start: i64 },
    /// Say so once every job queued before is done (stored, or given up with its bucket).
    Barrier(oneshot::Sender<()>),
}

/// A handle on the node's uploader.
#[derive(Debug)]
pub(crate) struct Uploader {
    jobs: mpsc::UnboundedSender<Job>,
}

impl Uploader {
    /// Starts the uploader on the current runtime, recording in `coverage` what each
    /// stream object covers and making the checkpoints that follows.
    pub(crate) fn start(
        location: Location,
        epoch: u64,
        coverage: Arc<Mutex<Coverage>>,
        upkeep: Upkeep,
        failpoint: Option<StoreCrash>,
    ) -> Self {
        let (jobs, queue) = mpsc::unbounded_channel();
        let task = Task {
            upkeep,
            location,
            epoch,
            packs: 0,
            coverage,
            failpoint,
            retired: VecDeque::new(),
            stored: HashMap::new(),
        };
        tokio::spawn(task.run(queue));
        Self { jobs }
    }

    /// Queues a job.
    pub(crate) fn queue(&self, job: Job) {
        if self.jobs.send(job).is_err() {
            debug!("the log store's uploader has stopped; a job is dropped");
        }
    }
}

/// The uploader's task.
struct Task {
    location: Location,
    epoch: u64,
    /// Packs made so far (the next one's number).
    packs: u64,
    coverage: Arc<Mutex<Coverage>>,
    /// Deletes what the checkpoints made leave behind.
    upkeep: Upkeep,
    failpoint: Option<StoreCrash>,
    /// Local segments in the store, with when their grace is over.
    retired: VecDeque<(Instant, PathBuf, i64)>,
    /// The buckets of the stream objects the last job stored, to compact.
    stored: HashMap<String, Weak<Shared>>,
}

/// A sealed segment read back, as the stream object it becomes.
struct Ready {
    sealed: Sealed,
    end: i64,
    bytes: Bytes,
}

impl Task {
    async fn run(mut self, mut queue: mpsc::UnboundedReceiver<Job>) {
        let mut later: VecDeque<Job> = VecDeque::new();
        loop {
            let job = match later.pop_front() {
                Some(job) => Some(job),
                None => tokio::select! {
                    job = queue.recv() => match job {
                        Some(job) => Some(job),
                        None => return,
                    },
                    () = tokio::time::sleep(GRACE) => None,
                },
            };
            remove_retired(&mut self.retired).await;
            match job {
                None => {}
                Some(Job::Seal(first)) => {
                    // Every segment sealed meanwhile goes up now, the small ones packed.
                    let mut sealed = vec![first];
                    while let Ok(job) = queue.try_recv() {
                        match job {
                            Job::Seal(more) => sealed.push(more),
                            other => later.push_back(other),
                        }
                    }
                    self.store(sealed).await;
                    self.compact().await;
                }
                Some(Job::Trim { key, start }) => self.trim(&key, start).await,
                Some(Job::Barrier(done)) => {
                    let _ = done.send(());
                }
            }
        }
    }

    /// Stores sealed segments: each large one as a stream object of its own, the small
    /// ones in packs.
    async fn store(&mut self, sealed: Vec<Sealed>) {
        let mut small: Vec<Ready> = Vec::new();
        let mut small_bytes = 0;
        for sealed in sealed {
            let Some(ready) = read_back(sealed).await else {
                continue;
            };
            if ready.bytes.len() as u64 >= pack::PACK_BELOW {
                self.store_alone(ready).await;
                continue;
            }
            small_bytes += ready.bytes.len() as u64;
            small.push(ready);
            if small_bytes >= pack::PACK_MAX {
                self.store_small(std::mem::take(&mut small)).await;
                small_bytes = 0;
            }
        }
        self.store_small(small).await;
    }

    /// Stores small segments: packed, unless there is only one.
    async fn store_small(&mut self, mut small: Vec<Ready>) {
        match small.len() {
            0 => {}
            1 => self.store_alone(small.remove(0)).await,
            _ => self.store_pack(small).await,
        }
    }

    /// Uploads a sealed segment as a stream object of its own, retrying until it is in the
    /// store or its bucket is gone.
    async fn store_alone(&mut self, ready: Ready) {
        let (sealed, end) = (&ready.sealed, ready.end);
        let path =
            self.location
                .bucket_path("streams", &sealed.key, &stream::name(sealed.base, end));
        let live = || sealed.tablet.strong_count() > 0;
        let location = &self.location;
        let stored = retrying(live, || async {
            make_parent(location, &path).await?;
            // A name taken holds the same bytes (the stream module's doc).
            create(location, &path, ready.bytes.clone()).await
        })
        .await;
        if stored.is_some() {
            let object = CachedObject {
                path: path.clone(),
                len: ready.bytes.len() as u64,
            };
            count_upload("stream", object.len);
            self.stored(ready.sealed, object, 0, end).await;
        }
    }

    /// Uploads small sealed segments of several buckets as one pack, retrying until it is
    /// in the store or all their buckets are gone.
    async fn store_pack(&mut self, small: Vec<Ready>) {
        let objects: Vec<(String, (i64, i64), Bytes)> = small
            .iter()
            .map(|ready| {
                (
                    ready.sealed.key.clone(),
                    (ready.sealed.base, ready.end),
                    ready.bytes.clone(),
                )
            })
            .collect();
        let (bytes, entries) = match pack::encode(&objects) {
            Ok(pack) => pack,
            Err(error) => {
                // The segments stay local; a restart reads their frames from the WAL.
                warn!(%error, "packing sealed segments failed");
                return;
            }
        };
        let live = || {
            small
                .iter()
                .any(|ready| ready.sealed.tablet.strong_count() > 0)
        };
        let location = &self.location;
        let (epoch, packs) = (self.epoch, &mut self.packs);
        let stored = retrying(live, || {
            // Each attempt takes a new name: a name is created once.
            let path = location.pack_path(&pack::name(epoch, *packs));
            *packs += 1;
            let bytes = bytes.clone();
            async move {
                make_parent(location, &path).await?;
                match create(location, &path, bytes).await? {
                    true => Ok(path),
                    false => Err(LogError::Store(format!("pack {path} exists already"))),
                }
            }
        })
        .await;
        let Some(path) = stored else {
            return;
        };
        let object = CachedObject {
            path,
            len: bytes.len() as u64,
        };
        count_upload("pack", object.len);
        for (ready, entry) in small.into_iter().zip(entries) {
            self.stored(ready.sealed, object.clone(), entry.at, ready.end)
                .await;
        }
    }

    /// Merges the small stream objects of the buckets the last job stored, where there
    /// are enough in a row (the `compaction` module). A merge that fails is logged and
    /// tried again after the bucket's next upload.
    async fn compact(&mut self) {
        for (key, tablet) in std::mem::take(&mut self.stored) {
            let Some(tablet) = tablet.upgrade() else {
                continue;
            };
            let Some(parts) = tablet.mergeable() else {
                continue;
            };
            let bucket = (key.as_str(), tablet.as_ref());
            let merged = compaction::merge(&self.location, bucket, parts, self.failpoint).await;
            let metrics = mink_metrics::metrics();
            (metrics
                .stream_merges
                .with_label_values(&[mink_metrics::outcome(&merged)]))
            .inc();
            match merged {
                Ok(replaced) => {
                    metrics.stream_objects_merged.inc_by(replaced.len() as u64);
                    debug!(
                        bucket = key,
                        objects = replaced.len(),
                        "merged small stream objects"
                    );
                    self.upkeep.unread(&key, replaced);
                }
                Err(error) => warn!(bucket = key, %error, "merging small stream objects failed"),
            }
        }
    }

    /// A sealed segment is in the store, `at` bytes into `object`: its tablet reads it
    /// from there, its frames count as covered, and its local copy goes after the grace.
    async fn stored(&mut self, sealed: Sealed, object: CachedObject, at: u64, end: i64) {
        StoreCrash::at(self.failpoint, StoreFailpoint::AbortAfterStreamUpload);
        (self.stored).insert(sealed.key.clone(), Weak::clone(&sealed.tablet));
        if let Some(tablet) = sealed.tablet.upgrade() {
            let object = StreamObject {
                object,
                at,
                base: sealed.base,
                end,
            };
            tablet.streamed(sealed.base, Arc::new(object));
        }
        let covered = Covered::StreamObject(sealed.base, end);
        self.checkpoint(&sealed.key, covered).await;
        self.retired
            .push_back((Instant::now() + GRACE, sealed.dir, sealed.base));
    }

    /// Records that `key`'s log starts at `start`; only a start that is recorded lets a
    /// checkpoint pass the frames before it.
    async fn trim(&self, key: &str, start: i64) {
        let path = (self.location).bucket_path("starts", key, &stream::offset_name(start));
        match create_in_dir(&self.location, &path).await {
            Ok(_) => {
                self.upkeep.start_recorded(key, start);
                self.checkpoint(key, Covered::Start(start)).await;
            }
            Err(error) => warn!(bucket = key, start, %error, "recording a log start failed"),
        }
    }

    /// Records in the coverage what a job put in the store for `key` and makes the
    /// checkpoint that allows, if any, for the upkeep to delete what is behind it. A
    /// checkpoint that fails to be made is only logged: the next one goes further.
    async fn checkpoint(&self, key: &str, covered: Covered) {
        let place = {
            let mut coverage = self.coverage.lock().unwrap_or_else(|p| p.into_inner());
            match covered {
                Covered::StreamObject(base, end) => coverage.stream_object(key, (base, end)),
                Covered::Start(start) => coverage.trimmed(key, start),
            }
            coverage.checkpoint()
        };
        let Some(place) = place else {
            return;
        };
        let path = self.location.path(["checkpoints", &coverage::name(place)]);
        match create_in_dir(&self.location, &path).await {
            Ok(_) => {
                debug!(
                    ?place,
                    "log store checkpoint: earlier WAL objects are in stream objects"
                );
                self.upkeep.checkpointed(place);
            }
            Err(error) => warn!(%error, "making a log store checkpoint failed"),
        }
    }
}

/// Counts an uploaded object of `kind` (`stream`: one segment, `pack`: several buckets'
/// small segments) of `bytes`.
fn count_upload(kind: &str, bytes: u64) {
    let metrics = mink_metrics::metrics();
    metrics.stream_uploads.with_label_values(&[kind]).inc();
    (metrics.stream_upload_bytes.with_label_values(&[kind])).inc_by(bytes);
}

/// Runs `attempt` until it succeeds, pausing longer after each failure; gives up (`None`)
/// once `live` says nothing waits for it any more.
async fn retrying<T, F: std::future::Future<Output = Result<T>>>(
    live: impl Fn() -> bool,
    mut attempt: impl FnMut() -> F,
) -> Option<T> {
    let mut backoff = Duration::from_millis(100);
    while live() {
        match attempt().await {
            Ok(done) => return Some(done),
            Err(error) => {
                warn!(%error, "uploading to the log store failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
    None
}

/// Reads a sealed segment back and encodes it as a stream object; `None` if it is gone
/// (retention removed it first) or cannot be read (it stays local, and a restart reads
/// its frames from the WAL).
async fn read_back(sealed: Sealed) -> Option<Ready> {
    let last = *sealed.frames.last()?;
    let path = segment::segment_path(&sealed.dir, sealed.base);
    let bytes = match blocking(move || Ok(std::fs::read(path)?)).await {
        Ok(bytes) => bytes,
        Err(LogError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(error) => {
            warn!(bucket = sealed.key, segment = sealed.base, %error, "reading a sealed segment for the log store failed");
            return None;
        }
    };
    let segment_len = last.position + last.frame_len();
    if bytes.len() as u64 != segment_len {
        warn!(
            bucket = sealed.key,
            segment = sealed.base,
            bytes = bytes.len(),
            segment_len,
            "a sealed segment is not as long as its frames; it stays local"
        );
        return None;
    }
    let bytes = stream::encode(&bytes, &sealed.frames);
    Some(Ready {
        end: last.last_offset() + 1,
        sealed,
        bytes,
    })
}

/// What a job put in the store for a bucket.
enum Covered {
    /// A stream object of these offsets.
    StreamObject(i64, i64),
    /// The log start retention moved to.
    Start(i64),
}

/// On a local store, makes the directory of `path` exist, durably (object_store would
/// create it without a sync).
pub(super) async fn make_parent(location: &Location, path: &StorePath) -> Result<()> {
    if let Some(dir) = location
        .local_file(path)
        .and_then(|file| Some(file.parent()?.to_path_buf()))
    {
        blocking(move || Ok(mink_durable::create_dir_all(&dir)?)).await?;
    }
    Ok(())
}

/// Creates the empty object `path` (its directory made first), if nothing is there.
async fn create_in_dir(location: &Location, path: &StorePath) -> Result<bool> {
    make_parent(location, path).await?;
    create(location, path, bytes::Bytes::new()).await
}

/// Removes the local segments whose grace is over.
async fn remove_retired(retired: &mut VecDeque<(Instant, PathBuf, i64)>) {
    let now = Instant::now();
    let mut due = Vec::new();
    while retired.front().is_some_and(|(at, ..)| *at <= now) {
        if let Some((_, dir, base)) = retired.pop_front() {
            due.push((dir, base));
        }
    }
    if due.is_empty() {
        return;
    }
    let removed = blocking(move || {
        for (dir, base) in due {
            for path in [
                segment::segment_path(&dir, base),
                segment::index_path(&dir, base),
            ] {
                match std::fs::remove_file(&path) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
                    _ => {}
                }
            }
        }
        Ok(())
    })
    .await;
    if let Err(error) = removed {
        warn!(%error, "removing a local segment already in the store failed");
    }
}
