//! Packs: small sealed segments of several buckets uploaded together as one object, so a
//! node with many quiet buckets does not make a small object per bucket and segment
//! (AutoMQ packs small streams' data the same way, and splits a stream out once it holds
//! ~8 MiB).
//!
//! ```text
//! packs/<epoch>-<n>:  entry | entry | ... | directory | directory_len u64 | "MINKPAK1"
//!   entry:      a stream object's bytes (the `stream` module)
//!   directory:  count u32, then per entry: key_len u16 | key | base i64 | end i64 | at u64 | len u64
//! ```
//!
//! A pack is named by its writer's epoch and a count of that writer's packs, and created
//! only if its name is free. Its entries hold the same bytes as stream objects of their
//! own would, so an open takes them as candidates of each bucket's chain beside those.

use bytes::{Buf, Bytes};
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt as _};

use super::{trailer, wal};
use crate::error::{LogError, Result};

const MAGIC: &[u8; 8] = b"MINKPAK1";
/// A sealed segment smaller than this is packed with others.
pub(crate) const PACK_BELOW: u64 = 8 << 20;
/// A pack is uploaded once it holds this much.
pub(crate) const PACK_MAX: u64 = 64 << 20;

/// A bucket's stream object inside a pack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    /// The bucket's key.
    pub(crate) key: String,
    /// The offsets it holds, `(base, end)`.
    pub(crate) offsets: (i64, i64),
    /// Where its bytes start in the pack.
    pub(crate) at: u64,
    /// How many bytes it has.
    pub(crate) len: u64,
}

/// The name of the `n`-th pack of epoch `epoch`'s writer.
pub(crate) fn name(epoch: u64, n: u64) -> String {
    format!("{epoch:020}-{n:020}")
}

/// A pack of stream objects, each `(key, offsets, bytes)`: its bytes and its entries.
///
/// # Errors
/// A key too long for the directory.
pub(crate) fn encode(objects: &[(String, (i64, i64), Bytes)]) -> Result<(Bytes, Vec<Entry>)> {
    let bytes: usize = objects.iter().map(|(.., bytes)| bytes.len()).sum();
    let mut out = Vec::with_capacity(bytes + 64 * objects.len());
    let mut entries = Vec::with_capacity(objects.len());
    for (key, offsets, bytes) in objects {
        entries.push(Entry {
            key: key.clone(),
            offsets: *offsets,
            at: out.len() as u64,
            len: bytes.len() as u64,
        });
        out.extend_from_slice(bytes);
    }
    let directory_start = out.len();
    out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    for entry in &entries {
        out.extend_from_slice(&wal::encode_key(&entry.key)?);
        out.extend_from_slice(&entry.offsets.0.to_le_bytes());
        out.extend_from_slice(&entry.offsets.1.to_le_bytes());
        out.extend_from_slice(&entry.at.to_le_bytes());
        out.extend_from_slice(&entry.len.to_le_bytes());
    }
    let directory_len = out.len() - directory_start;
    trailer::append(&mut out, directory_len, MAGIC);
    Ok((Bytes::from(out), entries))
}

/// The entries of the pack at `path`, `size` bytes long.
///
/// # Errors
/// The store failed, or the object is not a pack.
pub(crate) async fn directory(
    store: &dyn ObjectStore,
    path: &StorePath,
    size: u64,
) -> Result<Vec<Entry>> {
    let corrupt = || LogError::Corrupt(format!("pack {path}: not a pack"));
    let read = |range: std::ops::Range<u64>| store.get_range(path, range);
    let store_error = |e: object_store::Error| LogError::Store(format!("reading {path}: {e}"));
    let (directory_at, mut directory) = trailer::read_part(size, MAGIC, read)
        .await
        .map_err(store_error)?
        .ok_or_else(corrupt)?;
    let need = |n: usize, directory: &Bytes| {
        (directory.remaining() >= n)
            .then_some(())
            .ok_or_else(corrupt)
    };
    need(4, &directory)?;
    let count = directory.get_u32_le();
    let mut entries = Vec::new();
    for _ in 0..count {
        let key = wal::decode_key(&mut directory).ok_or_else(corrupt)?;
        need(32, &directory)?;
        let entry = Entry {
            key,
            offsets: (directory.get_i64_le(), directory.get_i64_le()),
            at: directory.get_u64_le(),
            len: directory.get_u64_le(),
        };
        if entry
            .at
            .checked_add(entry.len)
            .is_none_or(|end| end > directory_at)
        {
            return Err(corrupt());
        }
        entries.push(entry);
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use object_store::PutPayload;
    use object_store::memory::InMemory;

    use super::*;

    #[tokio::test]
    async fn a_pack_lists_its_entries_where_they_are() {
        let objects = vec![
            ("t1/b0".to_string(), (0, 10), Bytes::from_static(b"first")),
            (
                "t2/p3/b1".to_string(),
                (5, 7),
                Bytes::from_static(b"second!"),
            ),
        ];
        let (bytes, entries) = encode(&objects).unwrap();
        let store = InMemory::new();
        let path = StorePath::from(format!("packs/{}", name(3, 0)));
        store
            .put(&path, PutPayload::from(bytes.clone()))
            .await
            .unwrap();
        let listed = directory(&store, &path, bytes.len() as u64).await.unwrap();
        assert_eq!(listed, entries);
        for (entry, (key, offsets, object)) in listed.iter().zip(&objects) {
            assert_eq!((&entry.key, entry.offsets), (key, *offsets));
            let at = entry.at as usize;
            assert_eq!(&bytes[at..at + entry.len as usize], object.as_ref());
        }
        let damaged = bytes.slice(..bytes.len() - 1);
        store
            .put(&path, PutPayload::from(damaged.clone()))
            .await
            .unwrap();
        let error = directory(&store, &path, damaged.len() as u64)
            .await
            .unwrap_err();
        assert!(matches!(error, LogError::Corrupt(_)), "{error}");
    }
}
