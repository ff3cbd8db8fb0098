//! Decompressing produced record batches, bounded: a batch that inflates past
//! [`MAX_DECOMPRESSED_BYTES`] is refused before it is held in memory, so a small
//! "compression bomb" cannot take the server's memory.
//!
//! gzip, snappy (Kafka's xerial framing, or a raw block), lz4 (frame format) and zstd
//! are read, as Kafka brokers do.

use std::io::Read;

use anyhow::{Context, bail};
use bytes::Bytes;
use kafka_protocol::records::Compression;

use crate::limits::MAX_DECOMPRESSED_BYTES;

/// The xerial snappy stream header Kafka's clients write before snappy blocks.
const XERIAL_HEADER: &[u8] = b"\x82SNAPPY\x00";
/// The header's length: its magic, a version and a compatible version.
const XERIAL_HEADER_LEN: usize = 16;

/// Inflates `compressed` (the records of one batch), refusing more than
/// [`MAX_DECOMPRESSED_BYTES`].
pub(crate) fn decompress(
    compressed: &mut Bytes,
    compression: Compression,
) -> anyhow::Result<Bytes> {
    let input = std::mem::take(compressed);
    let out = match compression {
        Compression::None => return Ok(input),
        Compression::Gzip => read_bounded(flate2::read::GzDecoder::new(&input[..]))?,
        Compression::Lz4 => read_bounded(lz4_flex::frame::FrameDecoder::new(&input[..]))?,
        Compression::Zstd => read_bounded(zstd::stream::read::Decoder::new(&input[..])?)?,
        Compression::Snappy => snappy(&input)?,
    };
    Ok(Bytes::from(out))
}

fn read_bounded(reader: impl Read) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    reader
        .take(MAX_DECOMPRESSED_BYTES as u64 + 1)
        .read_to_end(&mut out)
        .context("a compressed batch that does not decompress")?;
    check_size(out.len())?;
    Ok(out)
}

fn check_size(size: usize) -> anyhow::Result<()> {
    if size > MAX_DECOMPRESSED_BYTES {
        bail!("a batch that decompresses to more than {MAX_DECOMPRESSED_BYTES} bytes");
    }
    Ok(())
}

fn snappy(input: &[u8]) -> anyhow::Result<Vec<u8>> {
    if !input.starts_with(XERIAL_HEADER) {
        return snappy_block(input, 0);
    }
    let mut blocks = input
        .get(XERIAL_HEADER_LEN..)
        .context("a truncated snappy header")?;
    let mut out = Vec::new();
    while !blocks.is_empty() {
        let (size, rest) = blocks
            .split_at_checked(4)
            .context("a truncated snappy block")?;
        let size = u32::from_be_bytes(size.try_into()?) as usize;
        let (block, rest) = rest
            .split_at_checked(size)
            .context("a truncated snappy block")?;
        let inflated = snappy_block(block, out.len())?;
        out.extend_from_slice(&inflated);
        blocks = rest;
    }
    Ok(out)
}

/// One raw snappy block, refused when it would take the output past the bound.
fn snappy_block(block: &[u8], already: usize) -> anyhow::Result<Vec<u8>> {
    let size = snap::raw::decompress_len(block)?;
    check_size(already.saturating_add(size))?;
    Ok(snap::raw::Decoder::new().decompress_vec(block)?)
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn a_compression_bomb_is_refused_and_small_batches_inflate() {
        let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        gzip.write_all(&vec![0u8; MAX_DECOMPRESSED_BYTES + 1])
            .unwrap();
        let bomb = gzip.finish().unwrap();
        assert!(bomb.len() < 1 << 20, "{} compressed bytes", bomb.len());
        let error = decompress(&mut Bytes::from(bomb), Compression::Gzip).unwrap_err();
        assert!(error.to_string().contains("more than"), "{error}");

        let text = b"mink mink mink mink".repeat(100);
        let zstd = zstd::encode_all(&text[..], 3).unwrap();
        assert_eq!(
            decompress(&mut Bytes::from(zstd), Compression::Zstd).unwrap(),
            &text[..]
        );
        let lz4 = {
            let mut encoder = lz4_flex::frame::FrameEncoder::new(Vec::new());
            encoder.write_all(&text).unwrap();
            encoder.finish().unwrap()
        };
        assert_eq!(
            decompress(&mut Bytes::from(lz4), Compression::Lz4).unwrap(),
            &text[..]
        );
        let block = snap::raw::Encoder::new().compress_vec(&text).unwrap();
        let mut xerial = XERIAL_HEADER.to_vec();
        xerial.resize(XERIAL_HEADER_LEN, 1);
        xerial.extend_from_slice(&(block.len() as u32).to_be_bytes());
        xerial.extend_from_slice(&block);
        assert_eq!(
            decompress(&mut Bytes::from(xerial), Compression::Snappy).unwrap(),
            &text[..]
        );
    }
}
