//! WAL objects: the writes of a node, every bucket's together, one object per upload; and
//! the fence a newer writer puts in the next place of an older writer's sequence.
//!
//! Names (`Location::path`): `epochs/<epoch>` claims an epoch, `wal/<epoch>/<seq>` is the
//! `seq`-th object of that epoch's writer, both numbers 20 digits so names sort as numbers.
//!
//! ```text
//! WAL object:  "MINKWAL1" | epoch u64 | seq u64 | sections u32 | section... | crc u32
//!   section:   key_len u16 | key (the bucket's log directory under log/) | len u32 | frames
//! fence:       "MINKFNC1" | epoch u64 (the newer writer's)                 | crc u32
//! ```
//!
//! A section's frames are the bucket's frames exactly as a segment file holds them, so a
//! bucket's log is rebuilt by appending them. Integers are little endian; the CRC-32 covers
//! everything before it.

use bytes::{Buf, Bytes};
use object_store::PutPayload;

use crate::error::{LogError, Result};

const WAL_MAGIC: &[u8; 8] = b"MINKWAL1";
const FENCE_MAGIC: &[u8; 8] = b"MINKFNC1";

/// The name of an epoch's claim, or a WAL object's sequence number, in the store.
pub(crate) fn number(n: u64) -> String {
    format!("{n:020}")
}

/// One bucket's frames in a WAL object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Section {
    /// The bucket's log directory, relative to the node's `log/`.
    pub(crate) key: String,
    /// Its frames, as a segment file holds them.
    pub(crate) frames: Bytes,
}

/// What an object of a writer's sequence is.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum WalObject {
    /// Writes, in the order they were acknowledged.
    Writes(Vec<Section>),
    /// The end of the sequence: the writer of this epoch was fenced by epoch `by`.
    Fence { by: u64 },
}

/// Encodes a WAL object of `epoch`'s writer, the `seq`-th: its frames are not copied, the
/// payload is a list of chunks.
pub(crate) fn encode_writes(epoch: u64, seq: u64, sections: &[Section]) -> Result<PutPayload> {
    let mut head = Vec::with_capacity(28);
    head.extend_from_slice(WAL_MAGIC);
    head.extend_from_slice(&epoch.to_le_bytes());
    head.extend_from_slice(&seq.to_le_bytes());
    let count = u32::try_from(sections.len())
        .map_err(|_| LogError::InvalidArgument("too many writes for one WAL object".into()))?;
    head.extend_from_slice(&count.to_le_bytes());
    let mut chunks = Vec::with_capacity(2 * sections.len() + 2);
    chunks.push(Bytes::from(head));
    for section in sections {
        let key_len = u16::try_from(section.key.len())
            .map_err(|_| LogError::InvalidArgument(format!("bucket key {}", section.key)))?;
        let frames_len = u32::try_from(section.frames.len())
            .map_err(|_| LogError::InvalidArgument("a write larger than 4 GiB".into()))?;
        let mut head = Vec::with_capacity(6 + section.key.len());
        head.extend_from_slice(&key_len.to_le_bytes());
        head.extend_from_slice(section.key.as_bytes());
        head.extend_from_slice(&frames_len.to_le_bytes());
        chunks.push(Bytes::from(head));
        chunks.push(section.frames.clone());
    }
    let mut crc = crc32fast::Hasher::new();
    chunks.iter().for_each(|chunk| crc.update(chunk));
    chunks.push(Bytes::copy_from_slice(&crc.finalize().to_le_bytes()));
    Ok(PutPayload::from_iter(chunks))
}

/// Encodes the fence that epoch `by`'s writer puts after an older writer's last object.
pub(crate) fn encode_fence(by: u64) -> Bytes {
    let mut out = Vec::with_capacity(20);
    out.extend_from_slice(FENCE_MAGIC);
    out.extend_from_slice(&by.to_le_bytes());
    sealed(out)
}

fn sealed(mut out: Vec<u8>) -> Bytes {
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    Bytes::from(out)
}

/// Decodes the object named `name`, checking its checksum and, for WAL objects, that it
/// is the one its name says (`epoch`, `seq`).
///
/// # Errors
/// [`LogError::Corrupt`] for anything else.
pub(crate) fn decode(name: &str, epoch: u64, seq: u64, object: &Bytes) -> Result<WalObject> {
    let corrupt = |what: &str| LogError::Corrupt(format!("log store object {name}: {what}"));
    let (body, crc) = object
        .split_last_chunk::<4>()
        .ok_or_else(|| corrupt("too short"))?;
    if crc32fast::hash(body) != u32::from_le_bytes(*crc) {
        return Err(corrupt("fails its checksum"));
    }
    let mut body = object.slice(..body.len());
    let magic = body.split_to(8.min(body.len()));
    let need = |n: usize, body: &Bytes| match body.remaining() >= n {
        true => Ok(()),
        false => Err(corrupt("cut short")),
    };
    if magic.as_ref() == FENCE_MAGIC {
        need(8, &body)?;
        return Ok(WalObject::Fence {
            by: body.get_u64_le(),
        });
    }
    if magic.as_ref() != WAL_MAGIC {
        return Err(corrupt("not a WAL object"));
    }
    need(20, &body)?;
    if (body.get_u64_le(), body.get_u64_le()) != (epoch, seq) {
        return Err(corrupt("its epoch and sequence number are not its name's"));
    }
    let count = body.get_u32_le();
    let mut sections = Vec::new();
    for _ in 0..count {
        need(2, &body)?;
        let key_len = usize::from(body.get_u16_le());
        need(key_len + 4, &body)?;
        let key = String::from_utf8(body.split_to(key_len).to_vec())
            .map_err(|_| corrupt("a bucket key that is not UTF-8"))?;
        let frames_len = body.get_u32_le() as usize;
        need(frames_len, &body)?;
        sections.push(Section {
            key,
            frames: body.split_to(frames_len),
        });
    }
    if body.has_remaining() {
        return Err(corrupt("bytes after its last section"));
    }
    Ok(WalObject::Writes(sections))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(key: &str, frames: &[u8]) -> Section {
        Section {
            key: key.into(),
            frames: Bytes::copy_from_slice(frames),
        }
    }

    #[test]
    fn objects_decode_to_what_was_encoded() {
        let sections = vec![section("t1/b0", b"abc"), section("t2/p3/b1", b"")];
        let object = Bytes::from(encode_writes(4, 9, &sections).unwrap());
        assert_eq!(
            decode("o", 4, 9, &object).unwrap(),
            WalObject::Writes(sections)
        );
        let fence = encode_fence(5);
        assert_eq!(
            decode("f", 4, 0, &fence).unwrap(),
            WalObject::Fence { by: 5 }
        );
    }

    #[test]
    fn damaged_or_misnamed_objects_are_corrupt() {
        let object = Bytes::from(encode_writes(4, 9, &[section("t1/b0", b"abc")]).unwrap());
        let mut flipped = object.to_vec();
        flipped[30] ^= 1;
        let misnamed = decode("o", 4, 10, &object).unwrap_err().to_string();
        assert!(misnamed.contains("not its name's"), "{misnamed}");
        for bad in [
            Bytes::from(flipped),
            object.slice(..object.len() - 1),
            Bytes::from_static(b"xx"),
            sealed(b"MINKWAL1".to_vec()),
        ] {
            assert!(matches!(decode("o", 4, 9, &bad), Err(LogError::Corrupt(_))));
        }
    }
}
