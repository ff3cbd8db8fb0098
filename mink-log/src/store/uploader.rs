//! The uploader: every segment a bucket seals becomes a stream object in the store; once
//! it is there, the bucket reads that part of its history from the store, and the local
//! segment goes after a grace period (a read that planned it a moment before still finds
//! it). Where retention moved a bucket's log start is recorded too
//! (`starts/<key>/<offset>`, created only; the furthest holds), so a restart does not
//! bring back what `log.ttl` removed.
//!
//! Uploads run one at a time, in the order segments are sealed. One that fails is retried,
//! with a growing pause, until it succeeds or its bucket is gone: meanwhile the segment is
//! read locally, and a restart reads its frames from the WAL objects.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use object_store::path::Path as StorePath;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{debug, warn};

use super::blocks::CachedObject;
use super::coverage::{self, Coverage};
use super::location::Location;
use super::open::{blocking, create};
use super::stream::{self, StreamObject};
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
        coverage: Arc<Mutex<Coverage>>,
        failpoint: Option<StoreCrash>,
    ) -> Self {
        let (jobs, queue) = mpsc::unbounded_channel();
        tokio::spawn(run(location, coverage, failpoint, queue));
        Self { jobs }
    }

    /// Queues a job.
    pub(crate) fn queue(&self, job: Job) {
        if self.jobs.send(job).is_err() {
            debug!("the log store's uploader has stopped; a job is dropped");
        }
    }
}

async fn run(
    location: Location,
    coverage: Arc<Mutex<Coverage>>,
    failpoint: Option<StoreCrash>,
    mut queue: mpsc::UnboundedReceiver<Job>,
) {
    let mut retired: VecDeque<(Instant, PathBuf, i64)> = VecDeque::new();
    loop {
        let job = tokio::select! {
            job = queue.recv() => match job {
                Some(job) => Some(job),
                None => return,
            },
            () = tokio::time::sleep(GRACE) => None,
        };
        remove_retired(&mut retired).await;
        match job {
            None => {}
            Some(Job::Seal(sealed)) => {
                if let Some(end) = seal(&location, &sealed).await {
                    StoreCrash::at(failpoint, StoreFailpoint::AbortAfterStreamUpload);
                    let object = Covered::StreamObject(sealed.base, end);
                    checkpoint(&location, &coverage, &sealed.key, object).await;
                    retired.push_back((Instant::now() + GRACE, sealed.dir, sealed.base));
                }
            }
            Some(Job::Trim { key, start }) => {
                let path = bucket_path(&location, "starts", &key, &stream::offset_name(start));
                // Only a start that is recorded lets a checkpoint pass the frames before.
                match create_in_dir(&location, &path).await {
                    Ok(_) => checkpoint(&location, &coverage, &key, Covered::Start(start)).await,
                    Err(error) => {
                        warn!(bucket = key, start, %error, "recording a log start failed")
                    }
                }
            }
        }
    }
}

/// Uploads a sealed segment, retrying until it is in the store or its bucket is gone, and
/// tells its tablet: the end of the stream object, if one was made.
async fn seal(location: &Location, sealed: &Sealed) -> Option<i64> {
    let mut backoff = Duration::from_millis(100);
    while sealed.tablet.strong_count() > 0 {
        match upload(location, sealed).await {
            Ok(Some(object)) => {
                let end = object.end;
                if let Some(tablet) = sealed.tablet.upgrade() {
                    tablet.streamed(sealed.base, Arc::new(object));
                }
                return Some(end);
            }
            // Retention removed the segment first: nothing to keep.
            Ok(None) => return None,
            Err(error) => {
                warn!(bucket = sealed.key, segment = sealed.base, %error, "uploading a stream object failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
    None
}

/// What a job put in the store for a bucket.
enum Covered {
    /// A stream object of these offsets.
    StreamObject(i64, i64),
    /// The log start retention moved to.
    Start(i64),
}

/// Records in `coverage` what a job put in the store for `key` and makes the checkpoint
/// that allows, if any. A checkpoint that fails to be made is only logged: the next one
/// goes further.
async fn checkpoint(location: &Location, coverage: &Mutex<Coverage>, key: &str, covered: Covered) {
    let place = {
        let mut coverage = coverage.lock().unwrap_or_else(|p| p.into_inner());
        match covered {
            Covered::StreamObject(base, end) => coverage.stream_object(key, (base, end)),
            Covered::Start(start) => coverage.trimmed(key, start),
        }
        coverage.checkpoint()
    };
    let Some(place) = place else {
        return;
    };
    let path = location.path(["checkpoints", &coverage::name(place)]);
    match create_in_dir(location, &path).await {
        Ok(_) => debug!(
            ?place,
            "log store checkpoint: earlier WAL objects are in stream objects"
        ),
        Err(error) => warn!(%error, "making a log store checkpoint failed"),
    }
}

/// Uploads a sealed segment as a stream object; `None` if the segment is gone.
async fn upload(location: &Location, sealed: &Sealed) -> Result<Option<StreamObject>> {
    let Some(last) = sealed.frames.last() else {
        return Ok(None);
    };
    let end = last.last_offset() + 1;
    let path = segment::segment_path(&sealed.dir, sealed.base);
    let bytes = match blocking(move || Ok(std::fs::read(path)?)).await {
        Ok(bytes) => bytes,
        Err(LogError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(error),
    };
    let segment_len = last.position + last.frame_len();
    if bytes.len() as u64 != segment_len {
        return Err(LogError::Corrupt(format!(
            "sealed segment {} of bucket {} holds {} bytes, its frames {segment_len}",
            sealed.base,
            sealed.key,
            bytes.len()
        )));
    }
    let object = bucket_path(
        location,
        "streams",
        &sealed.key,
        &stream::name(sealed.base, end),
    );
    make_parent(location, &object).await?;
    // A name taken holds the same bytes (the stream module's doc).
    create(location, &object, stream::encode(&bytes, &sealed.frames)).await?;
    Ok(Some(StreamObject {
        segment: CachedObject {
            path: object,
            len: segment_len,
        },
        base: sealed.base,
        end,
    }))
}

/// The path of `name` among a bucket's objects of one kind (`streams`, `starts`).
fn bucket_path(location: &Location, kind: &str, key: &str, name: &str) -> StorePath {
    location.path(std::iter::once(kind).chain(key.split('/')).chain([name]))
}

/// On a local store, makes the directory of `path` exist, durably (object_store would
/// create it without a sync).
async fn make_parent(location: &Location, path: &StorePath) -> Result<()> {
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
