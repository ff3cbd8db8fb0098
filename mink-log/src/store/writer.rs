//! The WAL writer: one task per node gathers the groups every bucket's appender commits
//! and uploads them together, one WAL object at a time, each created only if its name is
//! free (so a fence in its place stops the writer).
//!
//! ```text
//!   appenders ──persist(key, frames)──▶ gather for `interval` (or `batch_bytes`) ──▶ PUT
//!                   ▲                                                                │
//!                   └──────── durable (the appender moves the HW, acknowledges) ◀────┘
//! ```
//!
//! At most one upload starts per `interval`: a node's PUTs per second are bounded by it,
//! not by its buckets or writers; with an interval of zero, what gathers while an upload
//! runs goes in the next (group commit). On a local store the object and its directory are
//! fsynced before anyone is told it is durable (unless `sync` is off).
//!
//! # When an upload fails
//!
//! * **Its name is taken**: a newer writer fenced this one (the WAL's module doc). Every
//!   write waiting and every later one fails with [`LogError::Fenced`].
//! * **A local store's write failed** (a full disk): nothing was created, the same place is
//!   used again, the writes fail and the writer goes on.
//! * **An S3 request failed** after object_store's own retries: whether the object landed
//!   is unknown. The writes fail, saying so, and the writer takes no more: were it to use
//!   the next place, a restart could find the failed writes after all, at offsets their
//!   buckets gave to later writes. A restart reads the store back and goes on.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use object_store::{ObjectStore as _, PutMode, PutOptions, PutPayload};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tracing::error;

use super::coverage::Coverage;
use super::location::Location;
use super::wal::{self, Section};
use super::{StoreCrash, StoreFailpoint};
use crate::error::{LogError, Result};

/// Most groups waiting for the writer before appenders wait to hand theirs over.
const QUEUE: usize = 4096;

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
    pub(crate) fn persist(&self, key: &str, frames: Bytes, end: i64) -> Result<()> {
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
    seq: u64,
    pacing: Pacing,
    coverage: Arc<Mutex<Coverage>>,
    /// Why the writer takes no more writes (fenced, or an upload of unknown outcome).
    stopped: Option<LogError>,
}

impl Task {
    async fn run(mut self, mut queue: mpsc::Receiver<Group>) {
        let mut last_upload = Instant::now() - self.pacing.interval;
        while let Some(first) = queue.recv().await {
            let mut bytes = first.section.frames.len() as u64;
            let mut groups = vec![first];
            let start = last_upload + self.pacing.interval;
            while bytes < self.pacing.batch_bytes {
                tokio::select! {
                    biased;
                    next = queue.recv() => match next {
                        Some(group) => {
                            bytes += group.section.frames.len() as u64;
                            groups.push(group);
                        }
                        None => break,
                    },
                    () = tokio::time::sleep_until(start) => break,
                }
            }
            last_upload = Instant::now();
            let mut ends = HashMap::new();
            let mut sections = Vec::with_capacity(groups.len());
            let mut waiters = Vec::with_capacity(groups.len());
            for group in groups {
                ends.insert(group.section.key.clone(), group.end);
                sections.push(group.section);
                waiters.push(group.durable);
            }
            let place = (self.epoch, self.seq);
            let outcome = self.upload(&sections).await;
            if outcome.is_ok() {
                let mut coverage = self.coverage.lock().unwrap_or_else(|p| p.into_inner());
                coverage.wal_object(place, ends);
            }
            for waiter in waiters {
                let _ = waiter.send(match &outcome {
                    Ok(()) => Ok(()),
                    Err(error) => Err(error.for_another_waiter()),
                });
            }
        }
    }

    /// Uploads one WAL object of `sections` in the writer's next place.
    async fn upload(&mut self, sections: &[Section]) -> Result<()> {
        if let Some(stopped) = &self.stopped {
            return Err(stopped.for_another_waiter());
        }
        let object = wal::encode_writes(self.epoch, self.seq, sections)?;
        let path = self
            .location
            .path(["wal", &wal::number(self.epoch), &wal::number(self.seq)]);
        let create = PutOptions {
            mode: PutMode::Create,
            ..PutOptions::default()
        };
        let put = self
            .location
            .store
            .put_opts(&path, PutPayload::from(object), create)
            .await;
        if put.is_ok() {
            StoreCrash::at(self.pacing.failpoint, StoreFailpoint::AbortMidWalUpload);
        }
        let local = self.location.local_file(&path);
        let outcome = match (put, local) {
            (Ok(_), None) => Ok(()),
            (Ok(_), Some(file)) => self.sync(file).await,
            (Err(object_store::Error::AlreadyExists { .. }), _) => {
                Err(LogError::Fenced { epoch: self.epoch })
            }
            // Nothing was created: the place is free for the next upload.
            (Err(error), Some(_)) => return Err(LogError::Store(error.to_string())),
            (Err(error), None) => Err(LogError::Store(format!(
                "uploading WAL object {path} failed, and whether it landed is unknown: this \
                 node acknowledges no more writes until a restart reads the store back ({error})"
            ))),
        };
        match &outcome {
            Ok(()) => {
                StoreCrash::at(self.pacing.failpoint, StoreFailpoint::AbortAfterWalUpload);
                self.seq += 1;
            }
            Err(error) => {
                error!(%error, "the log store's writer stops");
                self.stopped = Some(error.for_another_waiter());
            }
        }
        outcome
    }

    /// Makes a local store's new object durable: the file, then its directory (created
    /// durably when the writer's epoch was claimed).
    async fn sync(&self, file: PathBuf) -> Result<()> {
        if !self.pacing.sync {
            return Ok(());
        }
        let synced = tokio::task::spawn_blocking(move || {
            std::fs::File::open(&file)?.sync_all()?;
            mink_durable::sync_parent(&file)
        })
        .await
        .map_err(std::io::Error::other);
        match synced.and_then(|synced| synced) {
            Ok(()) => Ok(()),
            Err(error) => Err(LogError::Store(format!(
                "syncing a WAL object failed, so whether it survives a power cut is unknown: \
                 this node acknowledges no more writes until a restart ({error})"
            ))),
        }
    }
}
