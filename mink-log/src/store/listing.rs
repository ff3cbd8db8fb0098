//! What the store's listing says of each bucket, before any object is read: where
//! retention recorded its start, the chain of stream objects its history is read from
//! (its own and entries of packs, [`stream::chain`]), its own objects that chain covers,
//! and the packs no chain reads from. An open reads the chains' objects; the upkeep
//! sweeps the packs nothing reads now and then (the `upkeep` module).

use std::collections::{HashMap, HashSet};

use object_store::path::Path as StorePath;
use object_store::{ObjectMeta, ObjectStore as _};
use tracing::warn;

use super::location::Location;
use super::open::store_error;
use super::pack;
use super::stream::{self, Placed};
use crate::error::Result;

/// A bucket's chain: each object with the offset it is read from and the offsets it holds.
pub(crate) type Chain = Vec<(i64, (i64, i64), Placed)>;

/// What [`Chains::list`] found.
pub(crate) struct Chains {
    /// Per bucket key, its chain after its recorded start.
    pub(crate) chains: HashMap<String, Chain>,
    /// Per bucket key, its own stream objects off its chain that the chain covers (those
    /// a merge replaced before a crash): garbage.
    pub(crate) covered: HashMap<String, Vec<StorePath>>,
    /// Packs no chain reads from, nor ever will (their entries merged into other objects,
    /// before their buckets' starts, or of buckets dropped): garbage.
    pub(crate) unread_packs: Vec<StorePath>,
}

/// The entries of the packs read so far, `(bucket key, offsets)` each: a pack never
/// changes, so a listing reads each pack's directory once.
#[derive(Debug, Default)]
pub(crate) struct PackDirectories(HashMap<StorePath, Vec<pack::Entry>>);

impl Chains {
    /// Lists the store's stream objects and packs (reading the directories of packs not
    /// in `directories`) and finds every bucket's chain after its start in `starts`; the
    /// buckets in `dropped` have none, and their pack entries are read by no one.
    pub(crate) async fn list(
        location: &Location,
        starts: &HashMap<String, i64>,
        directories: &mut PackDirectories,
        dropped: &HashSet<String>,
    ) -> Result<Self> {
        // Per bucket key, the stream objects that may be read: their offsets and places.
        type Candidates = Vec<((i64, i64), Placed)>;
        let mut by_key: HashMap<String, Candidates> = HashMap::new();
        let mut candidate = |key: &str, offsets: (i64, i64), placed: Placed| {
            let start = starts.get(key).copied().unwrap_or(i64::MIN);
            if offsets.1 > start && !dropped.contains(key) {
                by_key
                    .entry(key.to_string())
                    .or_default()
                    .push((offsets, placed));
            }
        };
        for object in list_bucket_objects(location, "streams").await? {
            let Some(offsets) = stream::parse_name(&object.name) else {
                warn!(object = %object.path, "not a stream object; left alone");
                continue;
            };
            let placed = Placed {
                path: object.path,
                object_len: object.size,
                at: 0,
                len: object.size,
            };
            candidate(&object.key, offsets, placed);
        }
        let packs = list_packs(location).await?;
        let listed: HashSet<&StorePath> = packs.iter().map(|pack| &pack.location).collect();
        directories.0.retain(|path, _| listed.contains(path));
        for ObjectMeta {
            location: path,
            size,
            ..
        } in &packs
        {
            if !directories.0.contains_key(path) {
                let entries = pack::directory(location.store.as_ref(), path, *size).await?;
                directories.0.insert(path.clone(), entries);
            }
            for entry in &directories.0[path] {
                let placed = Placed {
                    path: path.clone(),
                    object_len: *size,
                    at: entry.at,
                    len: entry.len,
                };
                candidate(&entry.key, entry.offsets, placed);
            }
        }
        let mut chains = HashMap::new();
        let mut covered = HashMap::new();
        for (key, objects) in by_key {
            let own: Vec<((i64, i64), StorePath)> = (objects.iter())
                .filter(|(_, placed)| placed.object_len == placed.len)
                .map(|(offsets, placed)| (*offsets, placed.path.clone()))
                .collect();
            let chain = stream::chain(objects);
            let end = chain.last().map_or(i64::MIN, |(_, (_, end), _)| *end);
            let off_chain: Vec<StorePath> = (own.into_iter())
                .filter(|((_, object_end), path)| {
                    *object_end <= end && !chain.iter().any(|(_, _, read)| read.path == *path)
                })
                .map(|(_, path)| path)
                .collect();
            if !off_chain.is_empty() {
                covered.insert(key.clone(), off_chain);
            }
            chains.insert(key, chain);
        }
        // A pack is unread when no chain reads from it and each of its entries ends
        // before its bucket's recorded start or at or before its bucket's chain's end (an
        // entry after a gap in the chain keeps its pack), or is a dropped bucket's.
        let read: HashSet<&StorePath> = (chains.values().flatten())
            .map(|(_, _, placed)| &placed.path)
            .collect();
        let dead = |entry: &pack::Entry| {
            let start = starts.get(&entry.key).copied().unwrap_or(i64::MIN);
            let chain_end = (chains.get(&entry.key))
                .and_then(|chain| chain.last())
                .map_or(i64::MIN, |(_, (_, end), _)| *end);
            let end = entry.offsets.1;
            dropped.contains(&entry.key) || end <= start || end <= chain_end
        };
        let unread_packs = (packs.iter())
            .map(|pack| &pack.location)
            .filter(|path| !read.contains(path) && directories.0[*path].iter().all(dead))
            .cloned()
            .collect();
        Ok(Self {
            chains,
            covered,
            unread_packs,
        })
    }
}

/// A bucket's object of one kind (`streams`, `starts`): its key, its name and where it is.
struct BucketObject {
    key: String,
    name: String,
    path: StorePath,
    size: u64,
}

/// Every object under the path of `parts`, with the parts of its name after them.
pub(super) async fn list_under(
    location: &Location,
    parts: &[&str],
) -> Result<Vec<(Vec<String>, ObjectMeta)>> {
    use futures::TryStreamExt as _;
    let prefix = location.path(parts.iter().copied());
    let listed: Vec<ObjectMeta> = location
        .store
        .list(Some(&prefix))
        .try_collect()
        .await
        .map_err(|e| store_error(&format!("listing {prefix} in the log store"), e))?;
    Ok(listed
        .into_iter()
        .filter_map(|object| {
            let parts = object.location.prefix_match(&prefix)?;
            let parts = parts.map(|part| part.as_ref().to_string()).collect();
            Some((parts, object))
        })
        .collect())
}

/// Every bucket's objects of one kind (`streams/<key>/<name>`).
async fn list_bucket_objects(location: &Location, kind: &str) -> Result<Vec<BucketObject>> {
    Ok(list_under(location, &[kind])
        .await?
        .into_iter()
        .filter_map(|(parts, object)| {
            let (name, key) = parts.split_last().filter(|(_, key)| !key.is_empty())?;
            Some(BucketObject {
                key: key.join("/"),
                name: name.clone(),
                path: object.location,
                size: object.size,
            })
        })
        .collect())
}

/// Where each bucket's log starts, as retention recorded it (`starts/<key>/<offset>`).
pub(crate) async fn find_starts(location: &Location) -> Result<HashMap<String, i64>> {
    let mut starts: HashMap<String, i64> = HashMap::new();
    for object in list_bucket_objects(location, "starts").await? {
        if let Ok(start) = object.name.parse::<i64>() {
            let known = starts.entry(object.key).or_insert(start);
            *known = (*known).max(start);
        }
    }
    Ok(starts)
}

/// Every pack in the store, with its size.
async fn list_packs(location: &Location) -> Result<Vec<ObjectMeta>> {
    let listed = list_under(location, &["packs"]).await?;
    Ok(listed.into_iter().map(|(_, object)| object).collect())
}
