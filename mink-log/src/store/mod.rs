//! The log on object storage (`mink server --log-store URL`): the store is the durable
//! home of every bucket's log, written as WAL objects, fenced by an epoch.
//!
//! ```text
//!   appenders ──group──▶ local segment (no fsync) ──▶ WAL writer ──PUT──▶ wal/<epoch>/<seq>
//!                                                                            │ durable
//!   readers ◀── log cache, local segments ◀── HW moves, acknowledged ◀───────┘
//! ```
//!
//! * **Writes.** A bucket's appender writes its group to its local segment as without a
//!   store, but makes it durable by handing it to the node's WAL writer instead of an
//!   fsync: the writer gathers every bucket's groups and uploads them as one WAL object
//!   (the `writer` module). Only then does the high watermark move and the writes get
//!   their acknowledgement. The local segments are a copy of the store, never fsynced.
//! * **Epochs.** Each start of a node over a store claims the next epoch
//!   (`epochs/<epoch>`, created only if absent) and writes its objects as
//!   `wal/<epoch>/<seq>`, `seq` counting from 0, each created only if absent.
//! * **Fencing.** Before reading the store back, a new writer closes every older epoch's
//!   sequence: it reads that epoch's objects in order and, in the first free place,
//!   creates a fence. An older writer still running finds its next place taken and
//!   acknowledges nothing more ([`LogError::Fenced`]); every object it completed before
//!   is read back by the new one. A fence is never raced: a place is created once, so
//!   either the old writer's object or the fence is there, and the new writer reads on
//!   until it has placed its fence.
//! * **Opening.** The node's `log/` is emptied and every bucket's log rebuilt from the
//!   objects of every earlier epoch, in order (the `rebuild` module), before any tablet
//!   opens: a node that lost its disk, or a power cut that took unsynced segments, loses
//!   nothing acknowledged. A primary-key bucket's KV store then catches up from the
//!   rebuilt log as after any crash (its changelog replay).
//!
//! Not yet here (the issue on the log on object storage goes on): stream objects (a
//! bucket's history rewritten out of the WAL objects, read with readahead), so today a
//! restart reads every WAL object, and history is read from the local copy; retention
//! (`log.ttl`) removes local segments only, so after a restart the log starts where the
//! store's does until the next retention pass.

mod blocks;
mod location;
mod rebuild;
mod wal;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use object_store::path::Path as StorePath;
use object_store::{ObjectStore as _, ObjectStoreExt as _, PutMode, PutOptions, PutPayload};
use tracing::{info, warn};

use self::location::Location;
use self::rebuild::Rebuild;
use self::wal::WalObject;
use self::writer::{Pacing, WalWriter};
use crate::error::{LogError, Result};

/// Most epochs tried when another process claims the same ones at the same time.
const CLAIM_ATTEMPTS: u64 = 64;

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
}

impl LogStoreConfig {
    /// A store at `url` with the defaults of its scheme ([`default_interval`]).
    pub fn new(url: impl Into<String>) -> Self {
        let url = url.into();
        Self {
            interval: default_interval(&url),
            batch_bytes: DEFAULT_BATCH_BYTES,
            sync: true,
            url,
        }
    }
}

/// The default [`LogStoreConfig::batch_bytes`].
pub const DEFAULT_BATCH_BYTES: u64 = 8 << 20;

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

/// A node's log store: its epoch and its WAL writer.
#[derive(Debug)]
pub struct LogStore {
    url: String,
    epoch: u64,
    log_root: PathBuf,
    writer: WalWriter,
}

impl LogStore {
    /// Opens the store of `config`: claims the next epoch, fences every older writer,
    /// rebuilds every bucket's log under `log_root` (the node's `log/`, emptied first;
    /// segments roll at `segment_bytes`) and starts the WAL writer on the current runtime.
    ///
    /// # Errors
    /// A URL that is not a store, a store that cannot be reached, or objects in it that
    /// are damaged.
    pub async fn open(
        config: LogStoreConfig,
        log_root: &Path,
        segment_bytes: u64,
    ) -> Result<Arc<Self>> {
        let location = Location::parse(&config.url)?;
        let epoch = claim_epoch(&location).await?;
        if let Some(dir) = &location.local {
            mink_durable::create_dir_all(&dir.join("wal").join(wal::number(epoch)))?;
        }
        let root = log_root.to_path_buf();
        let mut rebuild =
            blocking(move || Rebuild::start(&root, segment_bytes.max(1))).await?;
        let mut objects = 0;
        for older in list_numbers(&location, "epochs").await? {
            if older < epoch {
                (rebuild, objects) = read_epoch(&location, older, epoch, rebuild, objects).await?;
            }
        }
        info!(store = %config.url, epoch, objects, buckets = rebuild.buckets(), "log store opened: logs rebuilt from it");
        let pacing = Pacing {
            interval: config.interval,
            batch_bytes: config.batch_bytes,
            sync: config.sync,
        };
        Ok(Arc::new(Self {
            url: config.url,
            epoch,
            log_root: log_root.to_path_buf(),
            writer: WalWriter::start(location, epoch, 0, pacing),
        }))
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

    /// Makes a bucket's group durable in the store (see the `writer` module). Blocks.
    pub(crate) fn persist(&self, key: &str, frames: Bytes) -> Result<()> {
        self.writer.persist(key, frames)
    }
}

/// Runs `work` on a blocking thread.
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| LogError::Io(std::io::Error::other(e)))?
}

fn store_error(what: &str, error: object_store::Error) -> LogError {
    LogError::Store(format!("{what}: {error}"))
}

/// The numbers named under `dir` (`epochs`), ascending.
async fn list_numbers(location: &Location, dir: &str) -> Result<Vec<u64>> {
    let listed = location
        .store
        .list_with_delimiter(Some(&location.path([dir])))
        .await
        .map_err(|e| store_error("listing the log store's epochs", e))?;
    let mut numbers: Vec<u64> = listed
        .objects
        .iter()
        .filter_map(|object| object.location.filename()?.parse().ok())
        .collect();
    numbers.sort_unstable();
    Ok(numbers)
}

/// Creates `path` with `bytes` if nothing is there; `Ok(false)` if something is. On a
/// local store the new object and its directory are made durable.
async fn create(location: &Location, path: &StorePath, bytes: Bytes) -> Result<bool> {
    let create = PutOptions {
        mode: PutMode::Create,
        ..PutOptions::default()
    };
    match location
        .store
        .put_opts(path, PutPayload::from(bytes), create)
        .await
    {
        Ok(_) => {}
        Err(object_store::Error::AlreadyExists { .. }) => return Ok(false),
        Err(e) => return Err(store_error(&format!("creating {path}"), e)),
    }
    if let Some(file) = location.local_file(path) {
        blocking(move || {
            std::fs::File::open(&file)?.sync_all()?;
            Ok(mink_durable::sync_parent(&file)?)
        })
        .await?;
    }
    Ok(true)
}

/// Claims the epoch after every claimed one.
async fn claim_epoch(location: &Location) -> Result<u64> {
    if let Some(dir) = &location.local {
        mink_durable::create_dir_all(&dir.join("epochs"))?;
    }
    let mut epoch = list_numbers(location, "epochs").await?.last().map_or(1, |e| e + 1);
    for _ in 0..CLAIM_ATTEMPTS {
        let claim = location.path(["epochs", &wal::number(epoch)]);
        if create(location, &claim, Bytes::new()).await? {
            return Ok(epoch);
        }
        epoch += 1;
    }
    Err(LogError::Store(format!(
        "could not claim an epoch in {CLAIM_ATTEMPTS} attempts: other nodes keep claiming them"
    )))
}

/// Reads epoch `older`'s objects into `rebuild`, in order, and closes its sequence with a
/// fence of epoch `by` if nothing has.
async fn read_epoch(
    location: &Location,
    older: u64,
    by: u64,
    mut rebuild: Rebuild,
    mut objects: usize,
) -> Result<(Rebuild, usize)> {
    let mut seq = 0;
    loop {
        let path = location.path(["wal", &wal::number(older), &wal::number(seq)]);
        let got = match location.store.get(&path).await {
            Ok(got) => got
                .bytes()
                .await
                .map_err(|e| store_error(&format!("reading {path}"), e))?,
            Err(object_store::Error::NotFound { .. }) => {
                match create(location, &path, wal::encode_fence(by)).await? {
                    true => return Ok((rebuild, objects)),
                    // The older writer's object landed first: read it, fence after it.
                    false => continue,
                }
            }
            Err(e) => return Err(store_error(&format!("reading {path}"), e)),
        };
        let sections = match wal::decode(path.as_ref(), older, seq, &got) {
            Ok(WalObject::Fence { .. }) => return Ok((rebuild, objects)),
            Ok(WalObject::Writes(sections)) => sections,
            Err(error) if is_torn_last(location, older, seq).await? => {
                // A local store's last object, its name durable before its bytes: its
                // upload never completed, so nothing in it was acknowledged.
                warn!(%error, "skipping the torn last WAL object of an earlier epoch");
                seq += 1;
                continue;
            }
            Err(error) => return Err(error),
        };
        rebuild = blocking(move || {
            for section in &sections {
                rebuild.append(&section.key, &section.frames)?;
            }
            Ok(rebuild)
        })
        .await?;
        objects += 1;
        seq += 1;
    }
}

/// Whether epoch `epoch`'s `seq`-th object, which does not decode, is one a power cut tore:
/// on a local store only, and only the last of its sequence.
async fn is_torn_last(location: &Location, epoch: u64, seq: u64) -> Result<bool> {
    if location.local.is_none() {
        return Ok(false);
    }
    let next = location.path(["wal", &wal::number(epoch), &wal::number(seq + 1)]);
    match location.store.head(&next).await {
        Ok(_) => Ok(false),
        Err(object_store::Error::NotFound { .. }) => Ok(true),
        Err(e) => Err(store_error(&format!("reading {next}"), e)),
    }
}

#[cfg(test)]
mod tests;
