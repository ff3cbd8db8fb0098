//! KV checkpoints: a primary-key bucket's current rows in the store, as a chain of sorted
//! runs, so a node without its local KV files restores them and replays only the log
//! after them (which `log.ttl` may have removed the start of).
//!
//! * **A run** `kv/<key>/<from>-<to>` holds, in key order, what the log's changes in
//!   `[from, to)` made of every key they touched: its row at `to`, or its deletion. A run
//!   from 0 is a **base**: every row of the bucket at `to`.
//! * **A chain** is a base and the runs after it, each starting where the one before
//!   ends: ingested in that order (a later run's entry replaces an earlier one's), they
//!   are the bucket's rows at the chain's end. Of the chains in the store the one reaching
//!   furthest is restored; every run off it is garbage, deleted after the upkeep's grace
//!   once a new base is in the store ([`LogStore::kv_checkpointed`]).
//! * **Which run is written** is the KV store's choice (mink-kv): what its flushes wrote
//!   since the last run, or a base now and then. A run's content follows from its offsets
//!   alone (the rows the log's changes fold to), so whichever writer wrote it, a fenced
//!   one included, it is right; a name taken is written again with the same rows.
//! * **Format**: entries `key_len u32 | key | row_len u32 | row` (`row_len` [`DELETED`]:
//!   the key is deleted, no row follows), then the trailer `entries u64 | from i64 | to
//!   i64 | crc32 u32 | magic`, the CRC-32 covering every byte before it. A large run goes
//!   up in parts ([`PART_BYTES`]): a writer's memory is a part, not the bucket.

use std::collections::HashMap;

use bytes::Bytes;
use object_store::path::Path as StorePath;
use object_store::{ObjectStoreExt as _, PutPayload, WriteMultipart};
use tokio::sync::{mpsc, oneshot};

use super::kv_run_entries::KvRunEntries;
use super::listing::list_under;
use super::location::Location;
use super::open::{blocking, store_error};
use super::stream;
use super::uploader::make_parent;
use super::{LogStore, StoreCrash, StoreFailpoint, stream::parse_name};
use crate::error::{LogError, Result};

/// The kind of object (the first part of its path) a KV checkpoint's runs are.
pub(crate) const KIND: &str = "kv";

/// A run's `row_len` for a deleted key.
pub(super) const DELETED: u32 = u32::MAX;

/// The bytes a run's writer gathers before it hands them to the upload: the part size of
/// a multipart upload (S3 takes parts of 5 MiB and more). A run smaller than this goes up
/// in one PUT.
const PART_BYTES: usize = 8 << 20;

/// Parts of one upload in flight at once.
const PARTS_IN_FLIGHT: usize = 2;

pub(super) const MAGIC: &[u8; 8] = b"MINKKVR1";

/// Bytes of a run's trailer.
pub(super) const TRAILER_LEN: usize = 8 + 8 + 8 + 4 + MAGIC.len();

/// One run of a KV checkpoint in the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvRun {
    /// The first log offset whose changes it holds (0: a base).
    pub from: i64,
    /// The offset its rows are at.
    pub to: i64,
    /// Its size in the store.
    pub bytes: u64,
}

impl KvRun {
    /// A base: every row of its bucket.
    pub fn is_base(&self) -> bool {
        self.from == 0
    }
}

/// A base and the runs after it, in order: a bucket's rows at [`KvChain::end`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvChain {
    /// The base first.
    pub runs: Vec<KvRun>,
}

impl KvChain {
    /// The log offset the chain's rows are at.
    pub fn end(&self) -> i64 {
        self.runs.last().map_or(0, |run| run.to)
    }

    /// The bytes of its base.
    pub fn base_bytes(&self) -> u64 {
        self.runs.first().map_or(0, |run| run.bytes)
    }

    /// The bytes of every run after its base.
    pub fn increment_bytes(&self) -> u64 {
        self.runs.iter().skip(1).map(|run| run.bytes).sum()
    }

    /// Its bytes in the store.
    pub fn bytes(&self) -> u64 {
        self.runs.iter().map(|run| run.bytes).sum()
    }

    /// The chain reaching furthest among `runs` (of the same reach, the one of the newest
    /// base), if any base is there: from each base, the path of runs, each starting where
    /// the one before ends, that reaches furthest.
    fn furthest(runs: &[KvRun]) -> Option<Self> {
        let mut from: HashMap<i64, Vec<KvRun>> = HashMap::new();
        for run in runs.iter().filter(|run| !run.is_base()) {
            from.entry(run.from).or_default().push(*run);
        }
        let mut longest = HashMap::new();
        (runs.iter())
            .filter(|run| run.is_base())
            .map(|base| {
                let mut chain = vec![*base];
                chain.extend(longest_from(base.to, &from, &mut longest));
                Self { runs: chain }
            })
            .max_by_key(|chain| (chain.end(), chain.runs[0].to))
    }
}

/// The runs reaching furthest from `offset` on, each starting where the one before ends
/// (`from`: the runs by their first offset; `longest`: the answers found so far).
fn longest_from(
    offset: i64,
    from: &HashMap<i64, Vec<KvRun>>,
    longest: &mut HashMap<i64, Vec<KvRun>>,
) -> Vec<KvRun> {
    if let Some(known) = longest.get(&offset) {
        return known.clone();
    }
    let reach = |path: &[KvRun]| path.last().map_or(offset, |run| run.to);
    let mut best: Vec<KvRun> = Vec::new();
    for run in from.get(&offset).into_iter().flatten() {
        let mut path = vec![*run];
        path.extend(longest_from(run.to, from, longest));
        if reach(&path) > reach(&best) {
            best = path;
        }
    }
    longest.insert(offset, best.clone());
    best
}

/// The path of bucket `key`'s run of `[from, to)`.
fn run_path(location: &Location, key: &str, from: i64, to: i64) -> StorePath {
    location.bucket_path(KIND, key, &stream::name(from, to))
}

/// Every run of bucket `key` in the store, with its path.
async fn list_runs(location: &Location, key: &str) -> Result<Vec<(KvRun, StorePath)>> {
    let parts: Vec<&str> = std::iter::once(KIND).chain(key.split('/')).collect();
    Ok(list_under(location, &parts)
        .await?
        .into_iter()
        .filter_map(|(name, object)| {
            let [name] = name.as_slice() else {
                return None;
            };
            let (from, to) = parse_name(name)?;
            let run = KvRun {
                from,
                to,
                bytes: object.size,
            };
            Some((run, object.location))
        })
        .collect())
}

/// The furthest chain of bucket `key`'s runs, if it has any.
pub(crate) async fn furthest_chain(location: &Location, key: &str) -> Result<Option<KvChain>> {
    let runs: Vec<KvRun> = (list_runs(location, key).await?.into_iter())
        .map(|(run, _)| run)
        .collect();
    Ok(KvChain::furthest(&runs))
}

/// Bucket `key`'s runs off its furthest chain: garbage.
pub(crate) async fn off_chain(location: &Location, key: &str) -> Result<Vec<StorePath>> {
    let runs = list_runs(location, key).await?;
    let listed: Vec<KvRun> = runs.iter().map(|(run, _)| *run).collect();
    let kept = KvChain::furthest(&listed)
        .map(|chain| chain.runs)
        .unwrap_or_default();
    Ok(runs
        .into_iter()
        .filter(|(run, _)| !kept.contains(run))
        .map(|(_, path)| path)
        .collect())
}

/// Every run of bucket `key` (it was dropped).
pub(crate) async fn every_run(location: &Location, key: &str) -> Result<Vec<StorePath>> {
    Ok((list_runs(location, key).await?.into_iter())
        .map(|(_, path)| path)
        .collect())
}

/// What a run's writer hands its upload.
enum Part {
    Bytes(Bytes),
    /// Every part is handed over: the run is complete.
    End,
}

/// Writes one run to the store from a blocking thread (the KV store's): entries go in
/// key order, gathered into parts that an upload on the store's runtime sends as they
/// fill. Dropped before [`KvRunWriter::finish`], it uploads nothing.
#[derive(Debug)]
pub struct KvRunWriter {
    run: KvRun,
    part: Vec<u8>,
    crc: crc32fast::Hasher,
    entries: u64,
    parts: mpsc::Sender<Part>,
    uploaded: oneshot::Receiver<Result<()>>,
}

impl std::fmt::Debug for Part {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Bytes(bytes) => write!(f, "Part({} bytes)", bytes.len()),
            Self::End => f.write_str("End"),
        }
    }
}

impl KvRunWriter {
    /// Adds an entry: `key`'s row, or its deletion (`None`). Keys come in ascending order.
    /// Blocks while the upload is [`PARTS_IN_FLIGHT`] parts behind.
    ///
    /// # Errors
    /// A key or row longer than a run holds, or the upload failed.
    pub fn push(&mut self, key: &[u8], row: Option<&[u8]>) -> Result<()> {
        let len = |bytes: &[u8], what: &str| {
            u32::try_from(bytes.len())
                .ok()
                .filter(|&len| len != DELETED)
                .ok_or_else(|| {
                    LogError::InvalidArgument(format!(
                        "a {what} of {} bytes does not fit a KV checkpoint",
                        bytes.len()
                    ))
                })
        };
        self.write(&len(key, "key")?.to_le_bytes())?;
        self.write(key)?;
        match row {
            None => self.write(&DELETED.to_le_bytes())?,
            Some(row) => {
                self.write(&len(row, "row")?.to_le_bytes())?;
                self.write(row)?;
            }
        }
        self.entries += 1;
        Ok(())
    }

    /// Ends the run with its trailer and waits until it is in the store (durable, on a
    /// `file://` store).
    ///
    /// # Errors
    /// The upload failed.
    pub fn finish(mut self) -> Result<KvRun> {
        let mut trailer = Vec::with_capacity(TRAILER_LEN);
        trailer.extend_from_slice(&self.entries.to_le_bytes());
        trailer.extend_from_slice(&self.run.from.to_le_bytes());
        trailer.extend_from_slice(&self.run.to.to_le_bytes());
        self.write(&trailer)?;
        let crc = std::mem::take(&mut self.crc).finalize();
        self.part.extend_from_slice(&crc.to_le_bytes());
        self.part.extend_from_slice(MAGIC);
        self.run.bytes += (4 + MAGIC.len()) as u64;
        self.hand_over()?;
        self.send(Part::End)?;
        self.uploaded
            .blocking_recv()
            .unwrap_or_else(|_| Err(upload_stopped()))?;
        Ok(self.run)
    }

    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        self.crc.update(bytes);
        self.part.extend_from_slice(bytes);
        self.run.bytes += bytes.len() as u64;
        if self.part.len() >= PART_BYTES {
            self.hand_over()?;
        }
        Ok(())
    }

    fn hand_over(&mut self) -> Result<()> {
        let part = std::mem::replace(&mut self.part, Vec::with_capacity(PART_BYTES));
        self.send(Part::Bytes(part.into()))
    }

    fn send(&mut self, part: Part) -> Result<()> {
        if self.parts.blocking_send(part).is_ok() {
            return Ok(());
        }
        // The upload stopped: its error says why.
        match self.uploaded.try_recv() {
            Ok(Err(error)) => Err(error),
            _ => Err(upload_stopped()),
        }
    }
}

fn upload_stopped() -> LogError {
    LogError::ShuttingDown("the upload of a KV checkpoint".into())
}

/// Uploads the parts a [`KvRunWriter`] hands over to `path`: in one PUT if they are one
/// part, else as a multipart upload; nothing if the writer stops before its end.
async fn upload(
    location: Location,
    path: StorePath,
    mut parts: mpsc::Receiver<Part>,
    (sync, failpoint): (bool, Option<StoreCrash>),
) -> Result<()> {
    let failed = |e| store_error(&format!("uploading KV checkpoint {path}"), e);
    make_parent(&location, &path).await?;
    let Some(Part::Bytes(first)) = parts.recv().await else {
        return Err(upload_stopped());
    };
    match parts.recv().await {
        Some(Part::End) => {
            let put = location.store.put(&path, PutPayload::from(first));
            put.await.map_err(failed)?;
        }
        Some(Part::Bytes(second)) => {
            let started = location.store.put_multipart(&path).await.map_err(failed)?;
            let mut upload = WriteMultipart::new_with_chunk_size(started, PART_BYTES);
            upload.put(first);
            upload.put(second);
            loop {
                match parts.recv().await {
                    Some(Part::Bytes(part)) => {
                        if let Err(error) = upload.wait_for_capacity(PARTS_IN_FLIGHT).await {
                            let _ = upload.abort().await;
                            return Err(failed(error));
                        }
                        upload.put(part);
                    }
                    Some(Part::End) => break,
                    None => {
                        let _ = upload.abort().await;
                        return Err(upload_stopped());
                    }
                }
            }
            upload.finish().await.map_err(failed)?;
        }
        None => return Err(upload_stopped()),
    }
    if let Some(file) = location.local_file(&path).filter(|_| sync) {
        blocking(move || {
            std::fs::File::open(&file)?.sync_all()?;
            Ok(mink_durable::sync_parent(&file)?)
        })
        .await?;
    }
    StoreCrash::at(failpoint, StoreFailpoint::AbortAfterKvRunUpload);
    Ok(())
}

/// Reads the object at `path`, of `size` bytes, in ranges of [`PART_BYTES`] and hands
/// them over in order, a few ahead of their reader; stops at the first failure.
async fn download(
    location: Location,
    path: StorePath,
    size: u64,
    chunks: mpsc::Sender<Result<Bytes>>,
) {
    let mut at = 0;
    while at < size {
        let end = size.min(at + PART_BYTES as u64);
        let read = location.store.get_range(&path, at..end).await;
        let read = read.map_err(|e| store_error(&format!("reading {path}"), e));
        let failed = read.is_err();
        if chunks.send(read).await.is_err() || failed {
            return;
        }
        at = end;
    }
}

impl LogStore {
    /// The furthest KV checkpoint of the bucket whose log is in `dir`, if it has one.
    ///
    /// # Errors
    /// The store could not be listed.
    pub fn kv_chain(&self, dir: &std::path::Path) -> Result<Option<KvChain>> {
        let (location, key) = (self.location.clone(), self.key_of(dir)?);
        self.wait_for(async move { furthest_chain(&location, &key).await })
    }

    /// A writer of the run of `[from, to)` for the bucket whose log is in `dir`. To be
    /// used from a blocking thread.
    ///
    /// # Errors
    /// `dir` is not a bucket of the store, or the store is shutting down.
    pub fn write_kv_run(&self, dir: &std::path::Path, from: i64, to: i64) -> Result<KvRunWriter> {
        let path = run_path(&self.location, &self.key_of(dir)?, from, to);
        let (parts, handed) = mpsc::channel(PARTS_IN_FLIGHT);
        let (done, uploaded) = oneshot::channel();
        let runtime = self.runtime()?;
        let (location, how) = (self.location.clone(), (self.sync, self.failpoint));
        runtime.spawn(async move {
            let _ = done.send(upload(location, path, handed, how).await);
        });
        Ok(KvRunWriter {
            run: KvRun { from, to, bytes: 0 },
            part: Vec::new(),
            crc: crc32fast::Hasher::new(),
            entries: 0,
            parts,
            uploaded,
        })
    }

    /// The entries of `run` of the bucket whose log is in `dir`, read as they stream in
    /// (see [`KvRunEntries`]). The run's size is the one it was listed (or written) with:
    /// an object of another size is refused as damaged.
    ///
    /// # Errors
    /// The store is closed (a run that cannot be read fails its reader).
    pub fn read_kv_run(&self, dir: &std::path::Path, run: &KvRun) -> Result<KvRunEntries> {
        let path = run_path(&self.location, &self.key_of(dir)?, run.from, run.to);
        let (chunks, mut received) = mpsc::channel(PARTS_IN_FLIGHT);
        let location = self.location.clone();
        self.runtime()?
            .spawn(download(location, path, run.bytes, chunks));
        // Not `blocking_recv`: a bucket's open restores it from within the node's runtime.
        let chunks = std::iter::from_fn(move || futures::executor::block_on(received.recv()));
        Ok(KvRunEntries::new(*run, run.bytes, Box::new(chunks)))
    }

    /// A new base of the bucket whose log is in `dir` is in the store: the runs off its
    /// furthest chain (the chain before, and any run a crash left off it) go after the
    /// upkeep's grace (a restore that listed the store before may still read them).
    pub fn kv_checkpointed(&self, dir: &std::path::Path) {
        if let Ok(key) = self.key_of(dir) {
            self.upkeep.kv_checkpointed(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(from: i64, to: i64) -> KvRun {
        KvRun { from, to, bytes: 1 }
    }

    #[test]
    fn the_chain_reaching_furthest_is_restored_and_the_rest_is_off_it() {
        assert_eq!(KvChain::furthest(&[run(5, 9)]), None);
        let runs = [
            run(0, 10),
            run(10, 20),
            run(20, 25),
            run(20, 30), // a writer crashed after [20, 25) and wrote on from 20
            run(30, 40),
            run(0, 35), // a newer base, behind the older chain's end
            run(50, 60),
        ];
        let chain = KvChain::furthest(&runs).unwrap();
        assert_eq!(
            chain.runs,
            [run(0, 10), run(10, 20), run(20, 30), run(30, 40)]
        );
        assert_eq!(
            (chain.end(), chain.base_bytes(), chain.increment_bytes()),
            (40, 1, 3)
        );
        let newer = [&runs[..], &[run(0, 40)]].concat();
        assert_eq!(KvChain::furthest(&newer).unwrap().runs, [run(0, 40)]);
        // The path reaching furthest, not the longest first step: from 20, [20, 25) leads
        // on to 50, and on to 60.
        let longer = [&runs[..], &[run(25, 50)]].concat();
        let chain = KvChain::furthest(&longer).unwrap();
        assert_eq!(chain.runs[2..], [run(20, 25), run(25, 50), run(50, 60)]);
    }
}
