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
use object_store::{PutPayload, PutPayloadMut};

use crate::error::{LogError, Result};

const WAL_MAGIC: &[u8; 8] = b"MINKWAL1";
const FENCE_MAGIC: &[u8; 8] = b"MINKFNC1";
/// The size of a fence: its magic, an epoch and a CRC (a WAL object is longer: its header
/// alone is 32 bytes).
pub(crate) const FENCE_LEN: u64 = 20;

/// The name of an epoch's claim, or a WAL object's sequence number, in the store.
pub(crate) fn number(n: u64) -> String {
    format!("{n:020}")
}

/// One bucket's frames in a WAL object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Section {
    /// The bucket's log directory, relative to the node's `log/`.
    pub(crate) key: String,
    /// Its frames, as a segment file holds them, in pieces of whole frames (a group's
    /// frames as written; a decoded section's as one piece).
    pub(crate) frames: Vec<Bytes>,
}

/// What an object of a writer's sequence is.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum WalObject {
    /// Writes, in the order they were acknowledged.
    Writes(Vec<Section>),
    /// The end of the sequence: the writer of this epoch was fenced by epoch `by`.
    Fence { by: u64 },
}

/// Pieces of frames shorter than this are copied together into the object's blocks (one
/// write each, not one per frame); longer ones go in as they are, uncopied.
const COPY_BELOW: usize = 64 << 10;

/// Encodes a WAL object of `epoch`'s writer, the `seq`-th.
pub(crate) fn encode_writes(epoch: u64, seq: u64, sections: &[Section]) -> Result<PutPayload> {
    let mut object = Checksummed::new();
    object.copy(WAL_MAGIC);
    object.copy(&epoch.to_le_bytes());
    object.copy(&seq.to_le_bytes());
    let count = u32::try_from(sections.len())
        .map_err(|_| LogError::InvalidArgument("too many writes for one WAL object".into()))?;
    object.copy(&count.to_le_bytes());
    for section in sections {
        let frames_len: usize = section.frames.iter().map(Bytes::len).sum();
        let frames_len = u32::try_from(frames_len)
            .map_err(|_| LogError::InvalidArgument("a write larger than 4 GiB".into()))?;
        object.copy(&encode_key(&section.key)?);
        object.copy(&frames_len.to_le_bytes());
        section.frames.iter().for_each(|piece| object.piece(piece));
    }
    Ok(object.seal())
}

/// A payload being built, with the CRC-32 of what it holds so far.
struct Checksummed {
    payload: PutPayloadMut,
    crc: crc32fast::Hasher,
}

impl Checksummed {
    fn new() -> Self {
        Self {
            payload: PutPayloadMut::new().with_block_size(COPY_BELOW),
            crc: crc32fast::Hasher::new(),
        }
    }

    fn copy(&mut self, bytes: &[u8]) {
        self.crc.update(bytes);
        self.payload.extend_from_slice(bytes);
    }

    fn piece(&mut self, piece: &Bytes) {
        match piece.len() < COPY_BELOW {
            true => self.copy(piece),
            false => {
                self.crc.update(piece);
                self.payload.push(piece.clone());
            }
        }
    }

    /// The payload, ended by its CRC-32.
    fn seal(mut self) -> PutPayload {
        let crc = self.crc.finalize();
        self.payload.extend_from_slice(&crc.to_le_bytes());
        self.payload.freeze()
    }
}

/// Encodes the fence that epoch `by`'s writer puts after an older writer's last object.
pub(crate) fn encode_fence(by: u64) -> Bytes {
    let mut object = Checksummed::new();
    object.copy(FENCE_MAGIC);
    object.copy(&by.to_le_bytes());
    Bytes::from(object.seal())
}

/// A bucket key as the store's objects hold it (WAL sections, pack entries): `key_len u16
/// | key`.
///
/// # Errors
/// [`LogError::InvalidArgument`] for a key longer than a `u16` counts.
pub(crate) fn encode_key(key: &str) -> Result<Vec<u8>> {
    let len = u16::try_from(key.len())
        .map_err(|_| LogError::InvalidArgument(format!("bucket key {key} is too long")))?;
    Ok([&len.to_le_bytes()[..], key.as_bytes()].concat())
}

/// Takes a bucket key [`encode_key`] wrote from the front of `bytes`; `None` if it is cut
/// short or not UTF-8.
pub(crate) fn decode_key(bytes: &mut Bytes) -> Option<String> {
    if bytes.remaining() < 2 {
        return None;
    }
    let len = usize::from(bytes.get_u16_le());
    let key = bytes.get(..len)?.to_vec();
    bytes.advance(len);
    String::from_utf8(key).ok()
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
        let key =
            decode_key(&mut body).ok_or_else(|| corrupt("a bucket key cut short or not UTF-8"))?;
        need(4, &body)?;
        let frames_len = body.get_u32_le() as usize;
        need(frames_len, &body)?;
        sections.push(Section {
            key,
            frames: vec![body.split_to(frames_len)],
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
            frames: vec![Bytes::copy_from_slice(frames)],
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
        assert_eq!(fence.len() as u64, FENCE_LEN);
        assert_eq!(
            decode("f", 4, 0, &fence).unwrap(),
            WalObject::Fence { by: 5 }
        );
    }

    #[test]
    fn pieces_small_and_large_decode_as_one() {
        let small = Bytes::from_static(b"frame");
        let large = Bytes::from(vec![7u8; COPY_BELOW + 1]);
        let pieces = vec![small.clone(), large.clone(), small.clone()];
        let written = Section {
            key: "t1/b0".into(),
            frames: pieces,
        };
        let payload = encode_writes(4, 9, &[written]).unwrap();
        assert!(
            payload.iter().any(|chunk| chunk.as_ptr() == large.as_ptr()),
            "a large piece is not copied"
        );
        let joined = [&small[..], &large[..], &small[..]].concat();
        assert_eq!(
            decode("o", 4, 9, &Bytes::from(payload)).unwrap(),
            WalObject::Writes(vec![Section {
                key: "t1/b0".into(),
                frames: vec![Bytes::from(joined)],
            }])
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
            {
                let mut object = Checksummed::new();
                object.copy(b"MINKWAL1");
                Bytes::from(object.seal())
            },
        ] {
            assert!(matches!(decode("o", 4, 9, &bad), Err(LogError::Corrupt(_))));
        }
    }
}
