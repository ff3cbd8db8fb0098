//! Opening a log store: claiming an epoch, fencing the older writers, finding every
//! bucket's stream objects, and rebuilding the logs' tails from the WAL objects.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use object_store::path::Path as StorePath;
use object_store::{ObjectStore as _, ObjectStoreExt as _, PutMode, PutOptions, PutPayload};
use tracing::{info, warn};

use super::coverage::{self, Coverage, Place};
use super::listing::{Chain, Chains, PackDirectories, find_starts};
use super::location::Location;
use super::rebuild::Rebuild;
use super::stream::{self, StreamObject};
use super::wal::{self, WalObject};
use super::writer::UPLOADS_IN_FLIGHT;
use crate::error::{LogError, Result};
use crate::segment::FrameHeader;

/// Most epochs tried when another process claims the same ones at the same time.
const CLAIM_ATTEMPTS: u64 = 64;
/// Most times an open reads the store back while a running writer's upkeep deletes what
/// it reads.
const READ_ATTEMPTS: usize = 8;

/// A bucket's stream objects, in order, each with its frames.
pub(crate) type Streamed = Vec<(Arc<StreamObject>, Vec<FrameHeader>)>;

/// What opening a store found.
pub(crate) struct Opened {
    pub(crate) epoch: u64,
    /// Per bucket key, its history in stream objects.
    pub(crate) streamed: HashMap<String, Streamed>,
    /// Per bucket key, its own stream objects that others cover (those a merge replaced
    /// before a crash): garbage.
    pub(crate) covered: HashMap<String, Vec<StorePath>>,
    /// Packs no bucket reads from any more (their entries merged into other objects, or
    /// before their buckets' starts): garbage.
    pub(crate) unread_packs: Vec<StorePath>,
    /// The claims of epochs before the furthest checkpoint's, which no open reads: only
    /// the last claim counts for fencing.
    pub(crate) stale_claims: Vec<StorePath>,
    /// What those cover of the WAL objects read.
    pub(crate) coverage: Coverage,
}

/// Claims the next epoch, fences every older writer, finds every bucket's stream objects
/// and rebuilds, under `log_root` (emptied first), the part of each bucket's log after
/// them from the WAL objects of every earlier epoch, from the furthest checkpoint on
/// (the objects before it hold only frames of stream objects, and their epochs were
/// fenced by the writer that made it, or before).
pub(crate) async fn open(
    location: &Location,
    url: &str,
    log_root: &Path,
    segment_bytes: u64,
    must_be_empty: bool,
) -> Result<Opened> {
    let last_claimed = list_numbers(location, "epochs").await?.last().copied();
    if must_be_empty && let Some(last) = last_claimed {
        return Err(LogError::InvalidArgument(format!(
            "log store {url} holds a log already (written by {last} starts): a new data \
             directory is given an empty store, or its tables would take that log's \
             buckets for theirs"
        )));
    }
    let epoch = claim_epoch(location, last_claimed).await?;
    if let Some(dir) = location.local_dir(["wal", &wal::number(epoch)]) {
        mink_durable::create_dir_all(&dir)?;
    }
    for _ in 0..READ_ATTEMPTS {
        match read_back(location, url, log_root, segment_bytes, epoch).await? {
            Some(opened) => return Ok(opened),
            None => info!(
                "the log store's upkeep deleted WAL objects this open was reading: reading the store again"
            ),
        }
    }
    Err(LogError::Store(format!(
        "reading the log store back failed {READ_ATTEMPTS} times: a checkpoint kept passing \
         what it read"
    )))
}

/// Reads the store back for the writer of `epoch`, as [`open`] says; `None` if the upkeep
/// of a running writer deleted what it was reading (behind a checkpoint made meanwhile:
/// the stream objects it found may no longer be all there are).
async fn read_back(
    location: &Location,
    url: &str,
    log_root: &Path,
    segment_bytes: u64,
    epoch: u64,
) -> Result<Option<Opened>> {
    let mut starts = find_starts(location).await?;
    let Found {
        streamed,
        covered,
        unread_packs,
    } = find_streams(location, &starts).await?;
    // Each bucket's local log starts where its stream objects end, or where retention
    // left it.
    for (key, objects) in &streamed {
        if let Some((last, _)) = objects.last() {
            starts.insert(key.clone(), last.end);
        }
    }
    let from = last_checkpoint(location).await?;
    let mut coverage = Coverage::new(starts.clone(), from);
    let root = log_root.to_path_buf();
    let mut rebuild = blocking(move || Rebuild::start(&root, segment_bytes.max(1), starts)).await?;
    let mut objects = 0;
    let claims = list_numbers(location, "epochs").await?;
    for &older in &claims {
        if (from.0..epoch).contains(&older) {
            let reading = Reading {
                epoch: older,
                first: if older == from.0 { from.1 } else { 0 },
                by: epoch,
            };
            match reading
                .read(location, rebuild, objects, &mut coverage)
                .await?
            {
                Some(read) => (rebuild, objects) = read,
                None => return Ok(None),
            }
        }
    }
    let rebuilt = rebuild.buckets();
    blocking(move || rebuild.finish()).await?;
    info!(store = %url, epoch, ?from, wal_objects = objects, streamed_buckets = streamed.len(), rebuilt, "log store opened");
    Ok(Some(Opened {
        epoch,
        streamed,
        covered,
        unread_packs,
        stale_claims: (claims.into_iter())
            .filter(|&claim| claim < from.0)
            .map(|claim| location.path(["epochs", &wal::number(claim)]))
            .collect(),
        coverage,
    }))
}

/// The furthest checkpoint in the store: where reading the WAL starts.
async fn last_checkpoint(location: &Location) -> Result<Place> {
    let listed = location
        .store
        .list_with_delimiter(Some(&location.path(["checkpoints"])))
        .await
        .map_err(|e| store_error("listing the log store's checkpoints", e))?;
    Ok(listed
        .objects
        .iter()
        .filter_map(|object| coverage::parse_name(object.location.filename()?))
        .max()
        .unwrap_or_default())
}

/// Runs `work` on a blocking thread.
pub(crate) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| LogError::Io(std::io::Error::other(e)))?
}

pub(crate) fn store_error(what: &str, error: object_store::Error) -> LogError {
    LogError::Store(format!("{what}: {error}"))
}

/// Every bucket's chain of stream objects after its recorded start ([`Chains::list`]),
/// opened, with their frames; its own objects off the chain that the chain covers; and
/// the packs no chain reads.
async fn find_streams(location: &Location, starts: &HashMap<String, i64>) -> Result<Found> {
    let mut directories = PackDirectories::default();
    let listed = Chains::list(location, starts, &mut directories, &HashSet::new()).await?;
    let mut streamed = HashMap::new();
    for (key, chain) in listed.chains {
        streamed.insert(key, open_chain(location, chain).await?);
    }
    Ok(Found {
        streamed,
        covered: listed.covered,
        unread_packs: listed.unread_packs,
    })
}

/// Opens the objects of a bucket's chain, with their frames from where the chain reads
/// each.
async fn open_chain(location: &Location, chain: Chain) -> Result<Streamed> {
    let mut opened = Vec::with_capacity(chain.len());
    for (from, offsets, placed) in chain {
        let (object, mut frames) = stream::open(location.store.as_ref(), placed, offsets).await?;
        frames.retain(|frame| frame.base_offset >= from);
        if frames.first().map(|frame| frame.base_offset) != Some(from) {
            return Err(LogError::Corrupt(format!(
                "stream object {} at {} has no batch starting at offset {from}",
                object.object.path, object.at
            )));
        }
        opened.push((Arc::new(object), frames));
    }
    Ok(opened)
}

/// Bucket `key`'s chain of stream objects as the store holds it now, opened, and where
/// its log goes on after them (where the chain ends, or where retention recorded its
/// start; 0 for a bucket the store holds nothing of). For a bucket taken over from
/// another node, whose every frame is in stream objects. `directories`: the packs'
/// directories read before, kept for the next.
pub(crate) async fn find_bucket(
    location: &Location,
    key: &str,
    directories: &mut PackDirectories,
) -> Result<(Streamed, i64)> {
    let starts = find_starts(location).await?;
    let mut listed = Chains::list(location, &starts, directories, &HashSet::new()).await?;
    let chain = listed.chains.remove(key).unwrap_or_default();
    let end = chain.last().map(|(_, (_, end), _)| *end);
    let streamed = open_chain(location, chain).await?;
    let start = end.or_else(|| starts.get(key).copied()).unwrap_or(0);
    Ok((streamed, start))
}

/// What [`find_streams`] found.
struct Found {
    streamed: HashMap<String, Streamed>,
    /// Per bucket, its own stream objects its chain covers.
    covered: HashMap<String, Vec<StorePath>>,
    /// The packs no chain reads from, nor ever will.
    unread_packs: Vec<StorePath>,
}

/// The numbers named under `dir` (`epochs`), ascending.
pub(super) async fn list_numbers(location: &Location, dir: &str) -> Result<Vec<u64>> {
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
pub(crate) async fn create(location: &Location, path: &StorePath, bytes: Bytes) -> Result<bool> {
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

/// Claims the epoch after `last_claimed`, or the next free one after it.
async fn claim_epoch(location: &Location, last_claimed: Option<u64>) -> Result<u64> {
    if let Some(dir) = location.local_dir(["epochs"]) {
        mink_durable::create_dir_all(&dir)?;
    }
    let first = last_claimed.map_or(1, |e| e + 1);
    for epoch in first..first + CLAIM_ATTEMPTS {
        let claim = location.path(["epochs", &wal::number(epoch)]);
        if create(location, &claim, Bytes::new()).await? {
            return Ok(epoch);
        }
    }
    Err(LogError::Store(format!(
        "could not claim an epoch in {CLAIM_ATTEMPTS} attempts: other nodes keep claiming them"
    )))
}

/// The reading of an older epoch's WAL objects.
pub(super) struct Reading {
    pub(super) epoch: u64,
    /// The first object to read.
    pub(super) first: u64,
    /// The epoch of the writer reading, which fences the older.
    pub(super) by: u64,
}

impl Reading {
    /// Reads the epoch's objects from the first into `rebuild`, in order, recording what
    /// each holds in `coverage`, and closes its sequence with a fence if nothing has.
    /// `None` if a place it finds empty is behind a checkpoint: the upkeep deleted it.
    pub(super) async fn read(
        &self,
        location: &Location,
        mut rebuild: Rebuild,
        mut objects: usize,
        coverage: &mut Coverage,
    ) -> Result<Option<(Rebuild, usize)>> {
        let (older, by) = (self.epoch, self.by);
        let mut seq = self.first;
        loop {
            let path = location.path(["wal", &wal::number(older), &wal::number(seq)]);
            let got = match location.store.get(&path).await {
                Ok(got) => got
                    .bytes()
                    .await
                    .map_err(|e| store_error(&format!("reading {path}"), e))?,
                Err(object_store::Error::NotFound { .. }) => {
                    if last_checkpoint(location).await? > (older, seq) {
                        return Ok(None);
                    }
                    match create(location, &path, wal::encode_fence(by)).await? {
                        true => return Ok(Some((rebuild, objects))),
                        // The older writer's object landed first: read it, fence after it.
                        false => continue,
                    }
                }
                Err(e) => return Err(store_error(&format!("reading {path}"), e)),
            };
            let sections = match wal::decode(path.as_ref(), older, seq, &got) {
                Ok(WalObject::Fence { .. }) => return Ok(Some((rebuild, objects))),
                Ok(WalObject::Writes(sections)) => sections,
                Err(error) if is_torn(location, older, seq).await? => {
                    // A local store's object in flight at a power cut, its name durable
                    // before its bytes: neither it nor any after it was acknowledged. They
                    // go, and the fence takes its place: objects after a fence would make
                    // the next start take this one for damage.
                    warn!(%error, "removing the torn WAL objects an earlier epoch had in flight");
                    remove_from(location, older, seq).await?;
                    continue;
                }
                Err(error) => return Err(error),
            };
            let ends;
            (rebuild, ends) = blocking(move || {
                let mut ends = HashMap::new();
                for section in &sections {
                    for frames in &section.frames {
                        if let Some(end) = rebuild.append(&section.key, frames)? {
                            ends.insert(section.key.clone(), end);
                        }
                    }
                }
                Ok((rebuild, ends))
            })
            .await?;
            coverage.wal_object((older, seq), ends);
            objects += 1;
            seq += 1;
        }
    }
}

/// Removes, durably, a local store's objects of epoch `epoch` from the `seq`-th on, the
/// last first (so a crash part way leaves a sequence that still ends in a torn object).
async fn remove_from(location: &Location, epoch: u64, seq: u64) -> Result<()> {
    let Some(dir) = location.local_dir(["wal", &wal::number(epoch)]) else {
        return Ok(());
    };
    blocking(move || {
        for at in (seq..seq + UPLOADS_IN_FLIGHT as u64).rev() {
            let file = dir.join(wal::number(at));
            if file.exists() {
                mink_durable::remove_file(&file)?;
            }
        }
        Ok(())
    })
    .await
}

/// Whether epoch `epoch`'s `seq`-th object, which does not decode, is one a power cut tore:
/// on a local store only, and only one of the last [`UPLOADS_IN_FLIGHT`] of its sequence
/// (those its writer had in flight).
async fn is_torn(location: &Location, epoch: u64, seq: u64) -> Result<bool> {
    if location.local.is_none() {
        return Ok(false);
    }
    let past = seq + UPLOADS_IN_FLIGHT as u64;
    let past = location.path(["wal", &wal::number(epoch), &wal::number(past)]);
    match location.store.head(&past).await {
        Ok(_) => Ok(false),
        Err(object_store::Error::NotFound { .. }) => Ok(true),
        Err(e) => Err(store_error(&format!("reading {past}"), e)),
    }
}
