//! The trailer that ends stream objects and packs: `part_len u64 | magic`, the part being
//! the `part_len` bytes before it (a stream object's index, a pack's directory), which a
//! reader reads first to find the rest.

use std::ops::Range;

use bytes::Bytes;

/// Bytes of a trailer.
pub(crate) const LEN: u64 = 16;

/// Ends `out` with the trailer of a part of `part_len` bytes, the last `out` holds.
pub(crate) fn append(out: &mut Vec<u8>, part_len: usize, magic: &[u8; 8]) {
    out.extend_from_slice(&(part_len as u64).to_le_bytes());
    out.extend_from_slice(magic);
}

/// The part of an object of `len` bytes that `read` reads (ranges within the object):
/// where it starts, and its bytes. `None` if the object does not end in a trailer of
/// `magic` naming a part inside it.
///
/// # Errors
/// A read failed.
pub(crate) async fn read_part<F>(
    len: u64,
    magic: &[u8; 8],
    read: impl Fn(Range<u64>) -> F,
) -> object_store::Result<Option<(u64, Bytes)>>
where
    F: Future<Output = object_store::Result<Bytes>>,
{
    let Some(trailer_at) = len.checked_sub(LEN) else {
        return Ok(None);
    };
    let trailer = read(trailer_at..len).await?;
    let (part_len, found) = trailer.split_at(8);
    let part_len = u64::from_le_bytes(part_len.try_into().expect("8 bytes"));
    match trailer_at.checked_sub(part_len).filter(|_| found == magic) {
        Some(part_at) => Ok(Some((part_at, read(part_at..trailer_at).await?))),
        None => Ok(None),
    }
}
