//! Reading a KV checkpoint run as it streams in (its format is the `kv_runs` module's):
//! a restore holds a few parts of a run at a time, not the run, whatever the bucket's size.

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use super::kv_runs::{DELETED, KvRun, MAGIC, TRAILER_LEN};
use super::stream;
use crate::error::{LogError, Result};

/// The parts of a run's object, in order.
pub(super) type Chunks = Box<dyn Iterator<Item = Result<Bytes>> + Send>;

/// A run's entries in order, read from its parts as they arrive. Each entry is checked
/// as it comes (it stays within the run, its key above the one before: fjall's ingestion
/// takes keys in ascending order only), and the run as a whole at its end (the trailer's
/// CRC-32, offsets and count). So an entry handed out is not yet known good: only the
/// `None` that ends the entries vouches for them all, and a reader that met an error
/// throws away what it did with the entries before.
pub struct KvRunEntries {
    run: KvRun,
    chunks: Chunks,
    /// What is left of the part being read.
    current: Bytes,
    /// Bytes of the object.
    size: u64,
    /// Bytes of it received so far.
    received: u64,
    /// Bytes of it read so far.
    taken: u64,
    /// Over the bytes received, up to the trailer's CRC.
    crc: crc32fast::Hasher,
    entries: u64,
    last_key: Option<Bytes>,
    /// Time spent waiting for parts.
    waited: Duration,
    /// The trailer was read and checked: the entries are all there are.
    checked: bool,
}

impl std::fmt::Debug for KvRunEntries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvRunEntries")
            .field("run", &self.run)
            .field("taken", &self.taken)
            .finish_non_exhaustive()
    }
}

impl KvRunEntries {
    /// The entries of `run`, an object of `size` bytes whose parts `chunks` yields.
    pub(super) fn new(run: KvRun, size: u64, chunks: Chunks) -> Self {
        Self {
            run,
            chunks,
            current: Bytes::new(),
            size,
            received: 0,
            taken: 0,
            crc: crc32fast::Hasher::new(),
            entries: 0,
            last_key: None,
            waited: Duration::ZERO,
            checked: false,
        }
    }

    /// The next entry: a key and its row (`None`: deleted); `None` once every entry was
    /// read and the run found whole.
    ///
    /// # Errors
    /// The run could not be read, or is damaged (see the type's doc).
    pub fn next_entry(&mut self) -> Result<Option<(Bytes, Option<Bytes>)>> {
        if self.checked {
            return Ok(None);
        }
        let entries_end = (self.size.checked_sub(TRAILER_LEN as u64))
            .ok_or_else(|| self.corrupt("no trailer"))?;
        if self.taken == entries_end {
            self.check_trailer()?;
            return Ok(None);
        }
        let key_len = self.take_len(entries_end)?;
        let key = self.take_within(key_len as usize, entries_end)?;
        if self.last_key.as_ref().is_some_and(|last| key <= *last) {
            return Err(self.corrupt("its keys are out of order"));
        }
        let row = match self.take_len(entries_end)? {
            DELETED => None,
            len => Some(self.take_within(len as usize, entries_end)?),
        };
        self.entries += 1;
        self.last_key = Some(key.clone());
        Ok(Some((key, row)))
    }

    /// The time spent waiting for the run's parts to arrive.
    pub fn waited(&self) -> Duration {
        self.waited
    }

    fn corrupt(&self, why: &str) -> LogError {
        LogError::Corrupt(format!(
            "KV checkpoint run {}: {why}",
            stream::name(self.run.from, self.run.to)
        ))
    }

    fn check_trailer(&mut self) -> Result<()> {
        let trailer = self.take(TRAILER_LEN)?;
        if self.received != self.size || !trailer.ends_with(MAGIC) {
            return Err(self.corrupt("no trailer"));
        }
        let word = |at: usize| -> [u8; 8] { trailer[at..at + 8].try_into().expect("8 bytes") };
        let stored_crc = u32::from_le_bytes(trailer[24..28].try_into().expect("4 bytes"));
        if std::mem::take(&mut self.crc).finalize() != stored_crc {
            return Err(self.corrupt("checksum mismatch"));
        }
        let (entries, from, to) = (
            u64::from_le_bytes(word(0)),
            i64::from_le_bytes(word(8)),
            i64::from_le_bytes(word(16)),
        );
        if (from, to) != (self.run.from, self.run.to) {
            return Err(self.corrupt(&format!("it says it holds [{from}, {to})")));
        }
        if entries != self.entries {
            return Err(self.corrupt(&format!(
                "it says it holds {entries} entries, not {}",
                self.entries
            )));
        }
        self.checked = true;
        Ok(())
    }

    fn take_len(&mut self, entries_end: u64) -> Result<u32> {
        let bytes = self.take_within(4, entries_end)?;
        Ok(u32::from_le_bytes(bytes[..].try_into().expect("4 bytes")))
    }

    /// The next `len` bytes of the entries, which end at `entries_end`.
    fn take_within(&mut self, len: usize, entries_end: u64) -> Result<Bytes> {
        if self.taken + len as u64 > entries_end {
            return Err(self.corrupt("an entry overruns the run"));
        }
        self.take(len)
    }

    /// The next `len` bytes: a slice of the current part when it holds them, else copied
    /// from the parts they span.
    fn take(&mut self, len: usize) -> Result<Bytes> {
        self.taken += len as u64;
        if self.current.len() >= len {
            return Ok(self.current.split_to(len));
        }
        let mut spanning = BytesMut::with_capacity(len);
        while spanning.len() < len {
            if self.current.is_empty() {
                self.current = self.receive()?;
            }
            let part = self.current.len().min(len - spanning.len());
            spanning.extend_from_slice(&self.current.split_to(part));
        }
        Ok(spanning.freeze())
    }

    /// The next part, hashed up to the trailer's CRC.
    fn receive(&mut self) -> Result<Bytes> {
        let started = Instant::now();
        let part = self.chunks.next().transpose()?;
        self.waited += started.elapsed();
        let part = part
            .filter(|part| !part.is_empty())
            .ok_or_else(|| self.corrupt("it ends early"))?;
        let hashed_end = self.size - (4 + MAGIC.len()) as u64;
        let hashed = hashed_end
            .saturating_sub(self.received)
            .min(part.len() as u64);
        self.crc.update(&part[..hashed as usize]);
        self.received += part.len() as u64;
        if self.received > self.size {
            return Err(self.corrupt("it is longer than its size"));
        }
        Ok(part)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Entry = (Vec<u8>, Option<Vec<u8>>);

    fn run(from: i64, to: i64) -> KvRun {
        KvRun { from, to, bytes: 1 }
    }

    fn written(entries: &[Entry], from: i64, to: i64) -> Vec<u8> {
        written_counted(entries, entries.len() as u64, from, to)
    }

    /// A run of `entries` whose trailer says it holds `count` of them.
    fn written_counted(entries: &[Entry], count: u64, from: i64, to: i64) -> Vec<u8> {
        let mut bytes = Vec::new();
        for (key, row) in entries {
            bytes.extend_from_slice(&(key.len() as u32).to_le_bytes());
            bytes.extend_from_slice(key);
            match row {
                None => bytes.extend_from_slice(&DELETED.to_le_bytes()),
                Some(row) => {
                    bytes.extend_from_slice(&(row.len() as u32).to_le_bytes());
                    bytes.extend_from_slice(row);
                }
            }
        }
        bytes.extend_from_slice(&count.to_le_bytes());
        bytes.extend_from_slice(&from.to_le_bytes());
        bytes.extend_from_slice(&to.to_le_bytes());
        let crc = crc32fast::hash(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        bytes.extend_from_slice(MAGIC);
        bytes
    }

    /// Reads `bytes` as `run`, in parts of `part` bytes.
    fn read(run: KvRun, bytes: &[u8], part: usize) -> Result<Vec<Entry>> {
        let parts: Vec<Result<Bytes>> = (bytes.chunks(part))
            .map(|part| Ok(Bytes::copy_from_slice(part)))
            .collect();
        let mut read = KvRunEntries::new(run, bytes.len() as u64, Box::new(parts.into_iter()));
        let mut entries = Vec::new();
        while let Some((key, row)) = read.next_entry()? {
            entries.push((key.to_vec(), row.map(|row| row.to_vec())));
        }
        Ok(entries)
    }

    fn corruption(outcome: Result<Vec<Entry>>) -> String {
        match outcome {
            Err(LogError::Corrupt(why)) => why,
            other => panic!("not refused as damaged: {other:?}"),
        }
    }

    #[test]
    fn a_run_reads_back_its_entries_whatever_its_parts() {
        let entries: Vec<Entry> = vec![
            (b"a".to_vec(), Some(b"row a".to_vec())),
            (b"b".to_vec(), None),
            (b"c".to_vec(), Some(Vec::new())),
            (b"d".to_vec(), Some(vec![7; 300])),
        ];
        let bytes = written(&entries, 10, 20);
        for part in [1, 3, 7, 64, bytes.len()] {
            assert_eq!(read(run(10, 20), &bytes, part).unwrap(), entries, "{part}");
        }
        assert_eq!(read(run(0, 0), &written(&[], 0, 0), 5).unwrap(), []);
    }

    #[test]
    fn a_damaged_run_is_refused_before_its_end_is_reported() {
        let entries: Vec<Entry> = (0..50_u32)
            .map(|key| (key.to_be_bytes().to_vec(), Some(vec![key as u8; 20])))
            .collect();
        let bytes = written(&entries, 10, 20);
        let why = corruption(read(run(0, 20), &bytes, 16));
        assert!(why.contains("holds [10, 20)"), "{why}");
        // A flipped bit in a row, in a key (out of order), in a length.
        for at in [20, 5, 1] {
            let mut flipped = bytes.clone();
            flipped[at] ^= 0x10;
            corruption(read(run(10, 20), &flipped, 16));
        }
        corruption(read(run(10, 20), &bytes[1..], 16));
        corruption(read(run(10, 20), &bytes[..bytes.len() - 1], 16));
        corruption(read(run(10, 20), &bytes[..TRAILER_LEN - 1], 16));
        let unordered = written(&[entries[1].clone(), entries[0].clone()], 10, 20);
        let why = corruption(read(run(10, 20), &unordered, 16));
        assert!(why.contains("out of order"), "{why}");
        let miscounted = written_counted(&entries[..2], 3, 10, 20);
        let why = corruption(read(run(10, 20), &miscounted, 16));
        assert!(why.contains("holds 3 entries, not 2"), "{why}");
    }

    #[test]
    fn a_run_whose_parts_fail_reports_the_failure() {
        let bytes = written(&[(b"k".to_vec(), Some(b"row".to_vec()))], 0, 5);
        let parts = vec![
            Ok(Bytes::copy_from_slice(&bytes[..6])),
            Err(LogError::Store("the store went away".into())),
        ];
        let mut read =
            KvRunEntries::new(run(0, 5), bytes.len() as u64, Box::new(parts.into_iter()));
        let error = read.next_entry().unwrap_err();
        assert!(matches!(error, LogError::Store(_)), "{error}");
    }
}
