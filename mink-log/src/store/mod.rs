//! The log on object storage (`mink server --log-store URL`): the store is the durable
//! home of every bucket's log, written as WAL objects, fenced by an epoch, its history
//! kept as stream objects read through a block cache.
//!
//! ```text
//!   appenders ──group──▶ active segment (no fsync) ──▶ WAL writer ──PUT──▶ wal/<epoch>/<seq>
//!                              │ sealed                                     │ durable
//!                              ▼                                            ▼
//!                          uploader ──PUT──▶ streams/<key>/<base>-<end>   HW moves, ack
//!
//!   tailers ◀── log cache;   recent history ◀── local segments;
//!   older history ◀── stream objects, ranged GETs through the block cache (readahead)
//! ```
//!
//! * **Writes.** A bucket's appender writes its group to its active segment as without a
//!   store, but makes it durable by handing it to the node's WAL writer instead of an
//!   fsync: the writer gathers every bucket's groups and uploads them as one WAL object
//!   (the `writer` module). Only then does the high watermark move and the writes get
//!   their acknowledgement. Local segments are a copy of the store, never fsynced.
//! * **Stream objects.** A segment the bucket seals is uploaded whole with its index as a
//!   stream object (the `uploader` and `stream` modules; small ones sealed together share
//!   a pack, the `pack` module); from then on that part of the
//!   history is read from the store, through the node's block cache with its readahead
//!   (the `blocks` module), and the local segment goes. The local disk holds the active
//!   segment and the sealed ones not yet uploaded: history is bounded by the store.
//! * **Epochs.** Each start of a node over a store claims the next epoch
//!   (`epochs/<epoch>`, created only if absent) and writes its objects as
//!   `wal/<epoch>/<seq>`, `seq` counting from 0, each created only if absent.
//! * **Fencing.** Before reading the store back, a new writer closes every older epoch's
//!   sequence: it reads that epoch's objects in order and, in the first free place,
//!   creates a fence. An older writer still running finds its next place taken and
//!   acknowledges nothing more ([`LogError::Fenced`]); every object it completed before
//!   is read back by the new one. A fence is never raced: a place is created once, so
//!   either the old writer's object or the fence is there, and the new writer reads on
//!   until it has placed its fence. Stream objects need no fence: their bytes follow
//!   from their offsets, so a fenced writer's late upload is one the new writer would
//!   make too.
//! * **Nodes of a cluster.** With a node id ([`LogStoreConfig::node`]) a writer's own
//!   sequence (epochs, WAL objects, checkpoints) is under `nodes/<id>/`: each node fences
//!   only its own earlier lives. A bucket moves between nodes through the store, once all
//!   its frames are in stream objects: its leader hands it over
//!   ([`LogTablet::hand_over`]: seal, upload, release), or a writer over a dead leader's
//!   sequence (claiming its next epoch: the dead one is fenced) rebuilds its buckets and
//!   hands them over; the new leader takes it over ([`LogStore::take_over`]) from its
//!   stream objects' end.
//! * **Opening.** Every bucket's stream objects are found (their indexes read), the
//!   node's `log/` is emptied, and each bucket's log after its stream objects is rebuilt
//!   from the WAL objects of every earlier epoch, in order (the `open` and `rebuild`
//!   modules), before any tablet opens: a node that lost its disk, or a power cut that
//!   took unsynced segments, loses nothing acknowledged. A primary-key bucket's KV store
//!   then catches up from the log as after any crash (its changelog replay).
//! * **Its own runtime.** Every request to the store runs on the store's two threads
//!   (`mink-log-store`), so the log's blocking paths (a group commit, a read of planned
//!   batches, a tablet's recovery) wait on them without holding a runtime of their own.
//!
//! * **Checkpoints.** Once every frame of the WAL objects before a place is in stream
//!   objects (or removed by retention), `checkpoints/<epoch>-<seq>` says so, and an open
//!   reads the WAL from the furthest checkpoint (the `coverage` module). A bucket that
//!   stops writing seals its segment after the segment's age limit, so it holds no
//!   checkpoint back; a dropped one is forgotten.
//! * **Retention.** When `log.ttl` moves a bucket's log start, `starts/<key>/<offset>`
//!   records it, and an open leaves out what is before.
//!
//! * **Upkeep.** Once a checkpoint is made, the WAL objects behind it (not the fences: a
//!   paused writer may wake any time later) and the earlier checkpoints are deleted, and a minute after a start is recorded or a bucket
//!   dropped, the bucket's stream objects before it, or all of them (the `upkeep`
//!   module); an open that finds a place of the WAL empty behind a checkpoint reads the
//!   store again rather than fence it.
//!
//! * **Compaction.** A bucket's small stream objects in a row are merged into one (the
//!   `compaction` module), so its object count stays bounded; a pack no bucket reads
//!   from any more is deleted once an open, or the upkeep's sweep, finds it so (the
//!   `upkeep` module), and so are the claims of epochs an open no longer reads.
//!
//! Not here: packs form only from segments sealed at about the same time.

mod blocks;
mod compaction;
mod coverage;
mod kv_run_entries;
mod kv_runs;
mod listing;
mod location;
mod open;
mod pack;
mod rebuild;
mod stream;
mod trailer;
mod upkeep;
mod uploader;
mod wal;
mod writer;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tracing::info;

use self::blocks::BlockCache;
use self::coverage::Coverage;
pub use self::kv_run_entries::KvRunEntries;
pub use self::kv_runs::{KvChain, KvRun, KvRunWriter};
use self::listing::PackDirectories;
use self::location::Location;
pub use self::location::check_store_url;
use self::open::Streamed;
pub(crate) use self::stream::StreamObject;
use self::upkeep::Upkeep;
pub(crate) use self::uploader::Sealed;
use self::uploader::{Job, Uploader};
use self::writer::{Pacing, WalWriter};
#[cfg(doc)]
use crate::LogTablet;
use crate::error::{LogError, Result};

/// Where and how a node's log is kept in an object store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogStoreConfig {
    /// `file:///absolute/path` or `s3://bucket/prefix`.
    pub url: String,
    /// The least time between two WAL uploads: what a node's PUTs per second are bounded
    /// by. Writes arriving meanwhile wait and go in the next upload.
    pub interval: Duration,
    /// An upload starts before its interval is over once this many bytes wait.
    pub batch_bytes: u64,
    /// On a `file://` store, fsync each WAL object and its directory before the writes in
    /// it are acknowledged (off: a process crash loses nothing acknowledged, a power cut
    /// can). Objects in S3 are durable once uploaded either way.
    pub sync: bool,
    /// Bytes of stream objects the block cache keeps for history reads.
    pub cache_bytes: u64,
    /// A deliberate crash, for crash tests.
    pub failpoint: Option<StoreCrash>,
    /// Refuse a store that holds a log already (any epoch claimed): a new data directory's
    /// tables would take another's buckets for theirs.
    pub must_be_empty: bool,
    /// In a cluster, the node this writer is: its epochs, WAL objects and checkpoints go
    /// under `nodes/<node>/`, apart from the other nodes', while the buckets' objects are
    /// shared, so a bucket moves between nodes through the store ([`LogTablet::hand_over`],
    /// [`LogStore::take_over`]). `None`: the one writer of the store.
    pub node: Option<String>,
}

/// A deliberate crash of a node with a log store: at `point`, once the process has passed
/// it `skip` times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreCrash {
    /// Where.
    pub point: StoreFailpoint,
    /// How many times the process passes the point before it crashes there.
    pub skip: u64,
}

impl StoreCrash {
    /// Aborts the process at `point` if `crash` is one there and its passes are used up.
    pub(crate) fn at(crash: Option<Self>, point: StoreFailpoint) {
        static PASSED: AtomicU64 = AtomicU64::new(0);
        if let Some(crash) = crash.filter(|crash| crash.point == point)
            && PASSED.fetch_add(1, Ordering::Relaxed) >= crash.skip
        {
            tracing::warn!(failpoint = ?point, passed = crash.skip, "failpoint: aborting the process");
            std::process::abort();
        }
    }
}

/// Where a node with a log store deliberately crashes, so tests can check what a restart
/// makes of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreFailpoint {
    /// Abort once a WAL object is in the store, before it is synced (on `file://`) or
    /// anyone is told: mid-upload.
    AbortMidWalUpload,
    /// Abort once a WAL object is durable, before its writes are acknowledged.
    AbortAfterWalUpload,
    /// Abort once a stream object is in the store, before its bucket, the checkpoints or
    /// the local segment's removal know of it.
    AbortAfterStreamUpload,
    /// Abort once a run of a KV checkpoint is in the store, before its tablet records it
    /// or the upkeep learns of it.
    AbortAfterKvRunUpload,
    /// Abort once a restore ingested the first run of a KV checkpoint, before the rest.
    AbortMidKvRestore,
    /// Abort once a pass of the upkeep deleted some of its objects, before the rest.
    AbortMidUpkeepDeletion,
    /// Abort once a merged stream object is in the store, before its bucket reads it or
    /// the objects it replaced are left to the upkeep.
    AbortAfterMergedUpload,
}

impl LogStoreConfig {
    /// A store at `url` with the defaults of its scheme ([`default_interval`]).
    pub fn new(url: impl Into<String>) -> Self {
        let url = url.into();
        Self {
            interval: default_interval(&url),
            batch_bytes: DEFAULT_BATCH_BYTES,
            sync: true,
            cache_bytes: DEFAULT_CACHE_BYTES,
            failpoint: None,
            must_be_empty: false,
            node: None,
            url,
        }
    }
}

/// The default [`LogStoreConfig::batch_bytes`].
pub const DEFAULT_BATCH_BYTES: u64 = 8 << 20;
/// The default [`LogStoreConfig::cache_bytes`].
pub const DEFAULT_CACHE_BYTES: u64 = 256 << 20;

/// The default interval between WAL uploads to the store at `url`: none on the local file
/// system (an upload is a write and two fsyncs: what gathers meanwhile goes in the next
/// one), 250 ms on S3, where each PUT is paid for (AutoMQ's choice: at most 4 PUTs per
/// second and node).
pub fn default_interval(url: &str) -> Duration {
    match url.starts_with("s3://") {
        true => Duration::from_millis(250),
        false => Duration::ZERO,
    }
}

/// A node's log store: its epoch, its WAL writer, its uploader and its block cache, on a
/// runtime of its own.
#[derive(Debug)]
pub struct LogStore {
    url: String,
    epoch: u64,
    location: Location,
    /// Whether a `file://` store's new objects are synced ([`LogStoreConfig::sync`]).
    sync: bool,
    /// A deliberate crash, for crash tests.
    failpoint: Option<StoreCrash>,
    log_root: PathBuf,
    writer: WalWriter,
    uploader: Uploader,
    /// Deletes what no open needs (shared with the uploader).
    upkeep: Upkeep,
    blocks: Arc<BlockCache>,
    /// Per bucket key, the stream objects opening found, until the bucket's tablet opens.
    found: Mutex<HashMap<String, Streamed>>,
    /// The directories of the packs take-overs listed (a pack never changes: each is
    /// read once, not at every take-over).
    pack_directories: Arc<tokio::sync::Mutex<PackDirectories>>,
    /// The buckets whose tablets opened.
    opened: Mutex<HashSet<String>>,
    /// What the stream objects cover of the WAL objects.
    coverage: Arc<Mutex<Coverage>>,
    /// `None` once dropped.
    runtime: Option<tokio::runtime::Runtime>,
}

impl LogStore {
    /// Opens the store of `config`: claims the next epoch, fences every older writer,
    /// finds every bucket's stream objects, rebuilds the rest of every bucket's log under
    /// `log_root` (the node's `log/`, emptied first; segments roll at `segment_bytes`)
    /// and starts the WAL writer and the uploader.
    ///
    /// # Errors
    /// A URL that is not a store, a store that cannot be reached, or objects in it that
    /// are damaged.
    pub async fn open(
        config: LogStoreConfig,
        log_root: &Path,
        segment_bytes: u64,
    ) -> Result<Arc<Self>> {
        let mut location = Location::parse(&config.url)?;
        if let Some(node) = &config.node {
            location = location.for_node(node)?;
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("mink-log-store")
            .enable_all()
            .build()?;
        let opening = {
            let (location, url, root) =
                (location.clone(), config.url.clone(), log_root.to_path_buf());
            let must_be_empty = config.must_be_empty;
            runtime.spawn(async move {
                open::open(&location, &url, &root, segment_bytes, must_be_empty).await
            })
        };
        let opened = opening
            .await
            .map_err(|e| LogError::Io(std::io::Error::other(e)))
            .and_then(|opened| opened);
        let opened = match opened {
            Ok(opened) => opened,
            Err(error) => {
                // A runtime may not be dropped where a task could block on it.
                runtime.shutdown_background();
                return Err(error);
            }
        };
        let pacing = Pacing {
            interval: config.interval,
            batch_bytes: config.batch_bytes,
            sync: config.sync,
            failpoint: config.failpoint,
        };
        let coverage = Arc::new(Mutex::new(opened.coverage));
        let entered = runtime.enter();
        let writer = WalWriter::start(
            location.clone(),
            opened.epoch,
            pacing,
            Arc::clone(&coverage),
        );
        let upkeep = Upkeep::start(location.clone(), opened.epoch, config.failpoint);
        for (key, paths) in opened.covered {
            upkeep.unread(&key, paths);
        }
        upkeep.unread("packs", opened.unread_packs);
        upkeep.unread("epochs", opened.stale_claims);
        let uploader = Uploader::start(
            location.clone(),
            opened.epoch,
            Arc::clone(&coverage),
            upkeep.clone(),
            config.failpoint,
        );
        drop(entered);
        Ok(Arc::new(Self {
            url: config.url,
            epoch: opened.epoch,
            location: location.clone(),
            sync: config.sync,
            failpoint: config.failpoint,
            log_root: log_root.to_path_buf(),
            writer,
            uploader,
            upkeep,
            blocks: Arc::new(BlockCache::new(
                Arc::clone(&location.store),
                config.cache_bytes,
            )),
            found: Mutex::new(opened.streamed),
            pack_directories: Arc::default(),
            opened: Mutex::default(),
            coverage,
            runtime: Some(runtime),
        }))
    }

    /// Aborts the process if the store's failpoint is `point` and its passes are used up
    /// (for crash tests of what the KV store does with the log store).
    pub fn crash_at(&self, point: StoreFailpoint) {
        StoreCrash::at(self.failpoint, point);
    }

    /// The store's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// This writer's epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The key of the bucket whose log is in `dir`: its path under the node's `log/`.
    pub(crate) fn key_of(&self, dir: &Path) -> Result<String> {
        dir.strip_prefix(&self.log_root)
            .ok()
            .and_then(Path::to_str)
            .filter(|key| !key.is_empty())
            .map(str::to_string)
            .ok_or_else(|| {
                LogError::InvalidArgument(format!(
                    "log {} is not under the log store's {}",
                    dir.display(),
                    self.log_root.display()
                ))
            })
    }

    /// Makes a bucket's group, ending before offset `end`, durable in the store (see the
    /// `writer` module). Blocks.
    pub(crate) fn persist(&self, key: &str, frames: Vec<Bytes>, end: i64) -> Result<()> {
        self.writer.persist(key, frames, end)
    }

    /// The bucket `key` is gone (its table or partition dropped): no restart needs its
    /// frames, so they hold no WAL object back from a checkpoint, and its stream objects
    /// go after a grace.
    pub(crate) fn forget(&self, key: &str) {
        let mut coverage = self.coverage.lock().unwrap_or_else(|p| p.into_inner());
        coverage.forget(key);
        self.upkeep.forgotten(key);
    }

    /// Queues a sealed segment for upload as a stream object.
    pub(crate) fn upload(&self, sealed: Sealed) {
        self.uploader.queue(Job::Seal(sealed));
    }

    /// Records, in the background, that bucket `key`'s log starts at `start`: retention
    /// removed what was before, and a restart must not bring it back.
    pub(crate) fn trim(&self, key: &str, start: i64) {
        self.uploader.queue(Job::Trim {
            key: key.to_string(),
            start,
        });
    }

    /// The buckets with frames in the WAL objects the open read that are in no stream
    /// object yet, sorted: those a drain hands over.
    pub(crate) fn buckets_in_wal(&self) -> Vec<String> {
        let coverage = self.coverage.lock().unwrap_or_else(|p| p.into_inner());
        let mut keys: Vec<String> = coverage.pending_keys().into_iter().collect();
        keys.sort();
        keys
    }

    /// Resolves once every upload queued so far is done: in the store, or given up with
    /// its bucket.
    pub(crate) async fn uploads_done(&self) -> Result<()> {
        let (done, waiting) = tokio::sync::oneshot::channel();
        self.uploader.queue(Job::Barrier(done));
        waiting.await.map_err(|_| closed())
    }

    /// The bucket `key` was handed over to another node, every frame of it in stream
    /// objects: its frames hold no WAL object of this node back from a checkpoint. Its
    /// objects stay: the other node reads them.
    pub(crate) fn release(&self, key: &str) {
        let mut coverage = self.coverage.lock().unwrap_or_else(|p| p.into_inner());
        coverage.forget(key);
    }

    /// Takes over the bucket whose log is in `dir` from the node that handed it over
    /// ([`LogTablet::hand_over`]), or from a dead node's writer whose WAL objects were
    /// read into stream objects: finds its stream objects in the store as they are now,
    /// for its tablet to read its history from when it opens, and gives it an empty local
    /// log from where they end (what `dir` held before, from an earlier time this node
    /// led the bucket, is stale). Blocks.
    ///
    /// # Errors
    /// A store that cannot be listed or read, damaged stream objects, or a local log that
    /// cannot be replaced.
    pub fn take_over(&self, dir: &Path) -> Result<()> {
        let key = self.key_of(dir)?;
        let (location, directories) = (self.location.clone(), Arc::clone(&self.pack_directories));
        let (streamed, start) = {
            let key = key.clone();
            self.wait_for(async move {
                let mut directories = directories.lock().await;
                open::find_bucket(&location, &key, &mut directories).await
            })?
        };
        match mink_durable::remove_dir_all(dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
            _ => {}
        }
        mink_durable::create_dir_all(dir)?;
        std::fs::File::create(crate::segment::segment_path(dir, start))?;
        let mut coverage = self.coverage.lock().unwrap_or_else(|p| p.into_inner());
        coverage.taken_over(&key, start);
        drop(coverage);
        let mut found = self.found.lock().unwrap_or_else(|p| p.into_inner());
        found.insert(key, streamed);
        Ok(())
    }

    /// The stream objects opening found for the bucket `key`, in order, with their
    /// frames (taken: a tablet asks once, when it opens).
    pub(crate) fn take_streamed(&self, key: &str) -> Streamed {
        let mut opened = self.opened.lock().unwrap_or_else(|p| p.into_inner());
        opened.insert(key.to_string());
        let mut found = self.found.lock().unwrap_or_else(|p| p.into_inner());
        found.remove(key).unwrap_or_default()
    }

    /// The node opened the tablet of every bucket it holds: a bucket of the store whose
    /// tablet did not open is gone (its table or partition dropped before the restart).
    /// Its frames hold no WAL object back from a checkpoint any more, and the log the open
    /// rebuilt for it under `log/` is removed; its stream objects go after a grace (the
    /// `upkeep` module).
    ///
    /// Not in a cluster ([`LogStoreConfig::node`]): there, a bucket this node did not
    /// open may be another node's, and nothing is forgotten.
    ///
    /// # Errors
    /// Removing a rebuilt log failed.
    pub fn forget_unopened(&self) -> Result<()> {
        if self.location.node.is_some() {
            return Ok(());
        }
        let mut gone = {
            let coverage = self.coverage.lock().unwrap_or_else(|p| p.into_inner());
            coverage.pending_keys()
        };
        let mut found = self.found.lock().unwrap_or_else(|p| p.into_inner());
        gone.extend(found.drain().map(|(key, _)| key));
        let opened = self.opened.lock().unwrap_or_else(|p| p.into_inner());
        gone.retain(|key| !opened.contains(key));
        for key in &gone {
            self.forget(key);
            let dir = self.log_root.join(key);
            match mink_durable::remove_dir_all(&dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
                _ => {}
            }
            // Its parents too, once empty (a dropped table's directory).
            let mut parent = dir.parent();
            while let Some(dir) = parent.filter(|dir| *dir != self.log_root) {
                if std::fs::remove_dir(dir).is_err() {
                    break;
                }
                mink_durable::sync_parent(dir)?;
                parent = dir.parent();
            }
        }
        if !gone.is_empty() {
            info!(
                buckets = gone.len(),
                "forgot the log store's buckets that no table holds"
            );
        }
        Ok(())
    }

    /// The bytes `range` of a stream object's segment, through the block cache. Blocks
    /// the calling thread (the log's blocking paths: a read of planned batches, a
    /// tablet's recovery) while the store's runtime reads.
    pub(crate) fn read_stream(
        &self,
        object: &StreamObject,
        range: std::ops::Range<u64>,
    ) -> Result<Bytes> {
        let (stored, blocks) = (object.object.clone(), Arc::clone(&self.blocks));
        let range = object.at + range.start..object.at + range.end;
        self.wait_for(async move { blocks.read(&stored, range).await })
    }

    /// Runs `work` on the store's runtime and waits for its outcome on this thread.
    fn wait_for<T: Send + 'static>(
        &self,
        work: impl Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        let (outcome, waiting) = std::sync::mpsc::sync_channel(1);
        self.runtime()?.spawn(async move {
            let _ = outcome.send(work.await);
        });
        waiting.recv().map_err(|_| closed())?
    }

    /// The store's runtime, while it runs.
    fn runtime(&self) -> Result<&tokio::runtime::Runtime> {
        self.runtime.as_ref().ok_or_else(closed)
    }
}

fn closed() -> LogError {
    LogError::ShuttingDown("the log store".into())
}

impl Drop for LogStore {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

#[cfg(test)]
mod moves_tests;
#[cfg(test)]
mod tests;
