//! The WAL writer: one task per node gathers the groups every bucket's appender commits
//! and uploads them together as WAL objects, each created only if its name is free (so a
//! fence in its place stops the writer).
//!
//! ```text
//!   appenders ──persist(key, frames)──▶ gather for `interval` (or `batch_bytes`) ──▶ PUT ─┐
//!                   ▲                                          up to 4 PUTs in flight ... │
//!                   └──── durable, in the order of the places (the appender moves the ◀──┘
//!                         HW and acknowledges)
//! ```
//!
//! At most one upload starts per `interval`: a node's PUTs per second are bounded by it,
//! not by its buckets or writers; with an interval of zero, what gathers while uploads run
//! goes in the next (group commit). Up to [`UPLOADS_IN_FLIGHT`] uploads run at once, so a
//! bucket whose group arrives while others upload waits for its own upload, not for theirs
//! too (an S3 PUT takes tens of milliseconds, an fsync milliseconds). Their outcomes are
//! taken in the order of their places: an upload is acknowledged only once every earlier
//! one is, since a restart reads a sequence up to its first free place. On a local store
//! the object and its directory are fsynced before anyone is told it is durable (unless
//! `sync` is off), and a power cut can tear only objects in flight: none acknowledged.
//!
//! # When an upload fails
//!
//! The writer takes no more writes: the failed upload's writes and those of every later
//! upload fail (even if their objects landed, they follow a place a restart finds free),
//! and so does every later write, until a restart reads the store back.
//!
//! * **Its name is taken**: a newer writer fenced this one (the WAL's module doc): every
//!   write fails with [`LogError::Fenced`].
//! * **An S3 request failed** after object_store's own retries: whether the object landed
//!   is unknown. Were the writer to use the next place, a restart could find the failed
//!   writes after all, at offsets their buckets gave to later writes.
//! * **A local store's write or fsync failed** (a full disk): as the uploads after it may
//!   have landed, the writer stops too.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt as _;
use futures::stream::FuturesOrdered;
use object_store::{ObjectStore as _, PutMode, PutOptions, PutPayload};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tracing::error;

use super::coverage::{Coverage, Place};
use super::location::Location;
use super::wal::{self, Section};
use super::{StoreCrash, StoreFailpoint};
use crate::error::{LogError, Result};

/// Most groups waiting for the writer before appenders wait to hand theirs over.
const QUEUE: usize = 4096;

/// Most uploads under way at once. A power cut on a local store can tear only these (the
/// last objects of a sequence), which an open removes.
pub(crate) const UPLOADS_IN_FLIGHT: usize = 4;

/// A handle on a node's WAL writer.
#[derive(Debug)]
pub(crate) struct WalWriter {
    groups: mpsc::Sender<Group>,
}

/// One appender's group commit, waiting to be durable.
#[derive(Debug)]
struct Group {
    section: Section,
    /// The offset after its last frame.
    end: i64,
    durable: oneshot::Sender<Result<()>>,
}

/// How the writer gathers and uploads.
#[derive(Debug, Clone)]
pub(crate) struct Pacing {
    pub(crate) interval: Duration,
    pub(crate) batch_bytes: u64,
    pub(crate) sync: bool,
    pub(crate) failpoint: Option<StoreCrash>,
}

impl WalWriter {
    /// Starts the writer of `epoch` on the current runtime, recording in `coverage` what
    /// each object it uploads holds.
    pub(crate) fn start(
        location: Location,
        epoch: u64,
        pacing: Pacing,
        coverage: Arc<Mutex<Coverage>>,
    ) -> Self {
        let (groups, queue) = mpsc::channel(QUEUE);
        let task = Task {
            location,
            epoch,
            seq: 0,
            pacing,
            coverage,
            stopped: None,
        };
        tokio::spawn(task.run(queue));
        Self { groups }
    }

    /// Hands `frames`, a bucket's group commit ending before offset `end`, to the writer
    /// and waits until they are durable in the store. Blocks the calling thread: the
    /// appender commits on a blocking thread.
    pub(crate) fn persist(&self, key: &str, frames: Vec<Bytes>, end: i64) -> Result<()> {
        let (durable, done) = oneshot::channel();
        let group = Group {
            section: Section {
                key: key.to_string(),
                frames,
            },
            end,
            durable,
        };
        let closed = || LogError::ShuttingDown("the log store's writer".into());
        self.groups.blocking_send(group).map_err(|_| closed())?;
        done.blocking_recv().map_err(|_| closed())?
    }
}

#[derive(Debug)]
struct Task {
    location: Location,
    epoch: u64,
    /// The place of the next upload in the epoch's sequence.
    seq: u64,
    pacing: Pacing,
    coverage: Arc<Mutex<Coverage>>,
    /// Why the writer takes no more writes (fenced, or an upload that failed).
    stopped: Option<LogError>,
}

/// The groups gathered for the next upload.
#[derive(Debug, Default)]
struct Gathered {
    groups: Vec<Group>,
    bytes: u64,
}

/// An upload under way: what its object records, and who waits for it.
#[derive(Debug)]
struct Started {
    place: Place,
    ends: HashMap<String, i64>,
    waiters: Vec<oneshot::Sender<Result<()>>>,
}

impl Task {
    /// Gathers groups and uploads them, up to [`UPLOADS_IN_FLIGHT`] at once, until every
    /// appender is gone and every upload is done.
    async fn run(mut self, mut queue: mpsc::Receiver<Group>) {
        let mut uploads = FuturesOrdered::new();
        let mut gathered = Gathered::default();
        let mut next_start = Instant::now();
        let mut open = true;
        while open || !gathered.groups.is_empty() || !uploads.is_empty() {
            let room = uploads.len() < UPLOADS_IN_FLIGHT;
            let full = gathered.bytes >= self.pacing.batch_bytes;
            let due = match full || !open {
                true => Instant::now(),
                false => next_start,
            };
            // Biased: outcomes first (acknowledgements wait for nothing), then every group
            // already queued, and only then the upload of what gathered.
            tokio::select! {
                biased;
                Some((started, outcome)) = uploads.next(), if !uploads.is_empty() => {
                    self.finish(started, outcome);
                }
                group = queue.recv(), if open && !full => match group {
                    Some(group) => {
                        let bytes: usize = group.section.frames.iter().map(Bytes::len).sum();
                        gathered.bytes += bytes as u64;
                        gathered.groups.push(group);
                    }
                    None => open = false,
                },
                () = tokio::time::sleep_until(due), if room && !gathered.groups.is_empty() => {
                    next_start = Instant::now() + self.pacing.interval;
                    uploads.push_back(self.start(std::mem::take(&mut gathered)));
                }
            }
        }
    }

    /// Starts uploading `gathered` in the writer's next place.
    fn start(&mut self, gathered: Gathered) -> impl Future<Output = (Started, Result<()>)> + use<> {
        let place = (self.epoch, self.seq);
        self.seq += 1;
        let mut started = Started {
            place,
            ends: HashMap::new(),
            waiters: Vec::with_capacity(gathered.groups.len()),
        };
        let mut sections = Vec::with_capacity(gathered.groups.len());
        for group in gathered.groups {
            started.ends.insert(group.section.key.clone(), group.end);
            sections.push(group.section);
            started.waiters.push(group.durable);
        }
        let stopped = self.stopped.as_ref().map(LogError::for_another_waiter);
        let (location, pacing) = (self.location.clone(), self.pacing.clone());
        async move {
            let outcome = match stopped {
                Some(stopped) => Err(stopped),
                None => upload(&location, place, &pacing, &sections).await,
            };
            (started, outcome)
        }
    }

    /// Takes the outcome of the oldest upload: records and acknowledges its writes, or
    /// stops the writer. The uploads after a failed one fail too, landed or not: a restart
    /// reads the sequence only up to the failed one's place.
    fn finish(&mut self, started: Started, outcome: Result<()>) {
        let outcome = match &self.stopped {
            Some(stopped) => Err(stopped.for_another_waiter()),
            None => outcome,
        };
        match &outcome {
            Ok(()) => {
                let mut coverage = self.coverage.lock().unwrap_or_else(|p| p.into_inner());
                coverage.wal_object(started.place, started.ends);
            }
            Err(error) if self.stopped.is_none() => {
                error!(%error, "the log store's writer stops");
                self.stopped = Some(error.for_another_waiter());
            }
            Err(_) => {}
        }
        for waiter in started.waiters {
            let _ = waiter.send(match &outcome {
                Ok(()) => Ok(()),
                Err(error) => Err(error.for_another_waiter()),
            });
        }
    }
}

/// Uploads one WAL object of `sections` in `place`, created only if the name is free.
async fn upload(
    location: &Location,
    (epoch, seq): Place,
    pacing: &Pacing,
    sections: &[Section],
) -> Result<()> {
    let object = wal::encode_writes(epoch, seq, sections)?;
    let bytes = object.content_length() as u64;
    let started = Instant::now();
    let uploaded = put_wal_object(location, (epoch, seq), pacing, object).await;
    let metrics = mink_metrics::metrics();
    (metrics
        .wal_puts
        .with_label_values(&[mink_metrics::outcome(&uploaded)]))
    .inc();
    if uploaded.is_ok() {
        metrics.wal_put_bytes.inc_by(bytes);
        metrics
            .wal_put_seconds
            .observe(started.elapsed().as_secs_f64());
    }
    uploaded
}

/// Puts the WAL object `object` in `place` ([`upload`] without its metrics).
async fn put_wal_object(
    location: &Location,
    (epoch, seq): Place,
    pacing: &Pacing,
    object: PutPayload,
) -> Result<()> {
    let path = location.path(["wal", &wal::number(epoch), &wal::number(seq)]);
    let create = PutOptions {
        mode: PutMode::Create,
        ..PutOptions::default()
    };
    match location.store.put_opts(&path, object, create).await {
        Ok(_) => StoreCrash::at(pacing.failpoint, StoreFailpoint::AbortMidWalUpload),
        Err(object_store::Error::AlreadyExists { .. }) => return Err(LogError::Fenced { epoch }),
        Err(error) if location.local.is_some() => {
            return Err(LogError::Store(format!(
                "writing WAL object {path} failed: this node acknowledges no more writes \
                 until a restart ({error})"
            )));
        }
        Err(error) => {
            return Err(LogError::Store(format!(
                "uploading WAL object {path} failed, and whether it landed is unknown: this \
                 node acknowledges no more writes until a restart reads the store back ({error})"
            )));
        }
    }
    if let Some(file) = location.local_file(&path)
        && pacing.sync
    {
        sync(file).await?;
    }
    StoreCrash::at(pacing.failpoint, StoreFailpoint::AbortAfterWalUpload);
    Ok(())
}

/// Makes a local store's new object durable: the file, then its directory (created
/// durably when the writer's epoch was claimed). Its pages then leave the page cache: only
/// a restart reads the object again, and the memory serves the log's segments better (on
/// a VM, memory the host has not backed yet costs several times a copy to touch first).
async fn sync(file: PathBuf) -> Result<()> {
    let synced = tokio::task::spawn_blocking(move || {
        let object = std::fs::File::open(&file)?;
        object.sync_all()?;
        rustix::fs::fadvise(&object, 0, None, rustix::fs::Advice::DontNeed)?;
        mink_durable::sync_parent(&file)
    })
    .await
    .map_err(std::io::Error::other);
    synced.and_then(|synced| synced).map_err(|error| {
        LogError::Store(format!(
            "syncing a WAL object failed, so whether it survives a power cut is unknown: \
             this node acknowledges no more writes until a restart ({error})"
        ))
    })
}
