//! Sorted runs of rows, and reading several of them together with fjall.
//!
//! A [`Run`] is the rows of committed groups that the store holds in memory until it
//! writes them to fjall ([`super::buffer`]): sorted by key, each key once, a deleted key
//! kept as `None` so that it hides the row an older source still has. [`Merged`] reads
//! fjall and a tablet's runs as one: key order, each key as its newest source has it,
//! deleted keys left out.

use std::iter::Peekable;
use std::ops::{Bound, Range};
use std::sync::Arc;

use fastbloom::BloomFilter;
use fjall::{UserKey, UserValue};

use super::kv_error;
use crate::error::Result;

/// A key and its row, as a run holds them; `None`: the key was deleted.
pub(crate) type Entry<'a> = (&'a [u8], Option<&'a [u8]>);

/// The share of keys a run lacks that its filter lets through to a search.
const FILTER_FALSE_POSITIVES: f64 = 0.01;

/// Entries sorted by key, each key once, their bytes back to back in one buffer: building,
/// merging and dropping them costs no allocation per entry, and joining entries whose
/// keys do not interleave (an ascending load) is a copy of their buffers.
#[derive(Debug, Default)]
pub(crate) struct Entries {
    /// Each entry's key, then its row if it has one.
    data: Vec<u8>,
    /// Where each entry is in `data`, in key order.
    spans: Vec<Span>,
}

/// Where an entry is in its [`Entries`]' `data`.
#[derive(Debug, Clone, Copy)]
struct Span {
    start: usize,
    key_len: usize,
    /// `None`: the key was deleted.
    row_len: Option<usize>,
}

impl Span {
    /// Where the entry's bytes end.
    fn end(self) -> usize {
        self.start + self.key_len + self.row_len.unwrap_or(0)
    }

    /// The span of the entry once the bytes at `from` are moved to `to`.
    fn moved(self, from: usize, to: usize) -> Self {
        Self {
            start: self.start - from + to,
            ..self
        }
    }
}

impl Entries {
    /// Room for `entries` entries of `data_bytes` bytes of keys and rows.
    pub(crate) fn with_capacity(entries: usize, data_bytes: usize) -> Self {
        Self {
            data: Vec::with_capacity(data_bytes),
            spans: Vec::with_capacity(entries),
        }
    }

    /// Adds the entry of `key`, which is above every key so far.
    pub(crate) fn push(&mut self, (key, row): Entry<'_>) {
        debug_assert!(self.last_key().is_none_or(|last| last < key));
        self.spans.push(Span {
            start: self.data.len(),
            key_len: key.len(),
            row_len: row.map(<[u8]>::len),
        });
        self.data.extend_from_slice(key);
        self.data.extend_from_slice(row.unwrap_or_default());
    }

    /// Adds `later`'s entries, whose keys are above every key so far.
    pub(crate) fn append(&mut self, later: &Entries) {
        self.copy_from(later, 0..later.len());
    }

    /// Adds the entries at `range` of `other`, whose keys are above every key so far: one
    /// copy of their bytes, which lie back to back.
    fn copy_from(&mut self, other: &Entries, range: Range<usize>) {
        let spans = &other.spans[range];
        let (Some(&first), Some(&last)) = (spans.first(), spans.last()) else {
            return;
        };
        debug_assert!(self.last_key() < Some(other.entry(first).0));
        let to = self.data.len();
        self.data
            .extend_from_slice(&other.data[first.start..last.end()]);
        (self.spans).extend(spans.iter().map(|span| span.moved(first.start, to)));
    }

    /// The entries of `sources`, oldest first, as one: in key order, a key in several
    /// keeps the newest source's row. Where one source's keys run below every other
    /// source's next key (runs that do not interleave, as an ascending load's), they are
    /// copied as one block; entries are compared one by one only where sources meet.
    pub(crate) fn merge(sources: &[&Entries]) -> Self {
        let mut merged = Self::with_capacity(
            sources.iter().map(|source| source.len()).sum(),
            sources.iter().map(|source| source.data_bytes()).sum(),
        );
        let mut next = vec![0; sources.len()];
        let key_at = |source: usize, at: usize| {
            let entries = sources[source];
            (entries.spans.get(at)).map(|&span| entries.entry(span).0)
        };
        while let Some(head) = next_source((0..sources.len()).map(|i| (i, key_at(i, next[i])))) {
            let (source, entries) = (head.source, sources[head.source]);
            if head.tied {
                merged.push(entries.entry(entries.spans[next[source]]));
                for (i, at) in next.iter_mut().enumerate() {
                    *at += usize::from(key_at(i, *at) == Some(head.key));
                }
                continue;
            }
            let end = match head.above {
                None => entries.len(),
                Some((_, bound)) => entries.first_at_or_above(next[source], bound),
            };
            merged.copy_from(entries, next[source]..end);
            next[source] = end;
        }
        merged
    }

    /// The first entry from `start` on whose key is `bound` or above; the entry at
    /// `start` is below it. Searched from `start` in steps that double, so a short streak
    /// costs a comparison or two.
    fn first_at_or_above(&self, start: usize, bound: &[u8]) -> usize {
        let spans = &self.spans[start..];
        let below = |span: &Span| self.entry(*span).0 < bound;
        let mut step = 1;
        while step < spans.len() && below(&spans[step]) {
            step *= 2;
        }
        let from = step / 2;
        start + from + spans[from..step.min(spans.len())].partition_point(below)
    }

    /// The entries of `entries`, which are sorted by key, each key once.
    pub(crate) fn from_sorted(entries: &[Entry<'_>]) -> Self {
        let data_bytes = (entries.iter())
            .map(|(key, row)| key.len() + row.map_or(0, <[u8]>::len))
            .sum();
        let mut built = Self::with_capacity(entries.len(), data_bytes);
        entries.iter().for_each(|&entry| built.push(entry));
        built
    }

    /// The row of `key` (`Some(None)`: deleted), if there is an entry of the key.
    pub(crate) fn get(&self, key: &[u8]) -> Option<Option<&[u8]>> {
        match self.spans_across(key, key) {
            true => self.search(key),
            false => None,
        }
    }

    /// [`Entries::get`] without its first test of the key against the entries' range.
    fn search(&self, key: &[u8]) -> Option<Option<&[u8]>> {
        let at = (self.spans)
            .binary_search_by(|&span| self.entry(span).0.cmp(key))
            .ok()?;
        Some(self.entry(self.spans[at]).1)
    }

    /// Whether there is an entry (deleted or not) of a key from `first` to `last`.
    pub(crate) fn holds_key_in(&self, first: &[u8], last: &[u8]) -> bool {
        self.spans_across(first, last)
            && (self.from(Bound::Included(first)).next()).is_some_and(|(key, _)| key <= last)
    }

    /// Whether the keys from `first` to `last` meet the range from the first entry's key
    /// to the last's: a cheap test before a search.
    fn spans_across(&self, first: &[u8], last: &[u8]) -> bool {
        match (self.first_key(), self.last_key()) {
            (Some(lowest), Some(highest)) => lowest <= last && first <= highest,
            _ => false,
        }
    }

    fn len(&self) -> usize {
        self.spans.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// The bytes of the entries' keys and rows.
    pub(crate) fn data_bytes(&self) -> usize {
        self.data.len()
    }

    /// About the memory the entries hold.
    fn bytes(&self) -> usize {
        self.data_bytes() + self.spans.len() * size_of::<Span>()
    }

    pub(crate) fn last_key(&self) -> Option<&[u8]> {
        (self.spans.last()).map(|&span| self.entry(span).0)
    }

    pub(crate) fn first_key(&self) -> Option<&[u8]> {
        (self.spans.first()).map(|&span| self.entry(span).0)
    }

    /// The entries, in key order.
    pub(crate) fn iter(&self) -> EntriesIter<'_> {
        self.from(Bound::Unbounded)
    }

    /// The entries from `start` on.
    fn from(&self, start: Bound<&[u8]>) -> EntriesIter<'_> {
        let key_of = |span: &Span| self.entry(*span).0;
        let at = match start {
            Bound::Unbounded => 0,
            Bound::Included(key) => self.spans.partition_point(|span| key_of(span) < key),
            Bound::Excluded(key) => self.spans.partition_point(|span| key_of(span) <= key),
        };
        EntriesIter {
            data: &self.data,
            spans: self.spans[at..].iter(),
        }
    }

    /// The key and row of the entry at `span`.
    fn entry(&self, span: Span) -> Entry<'_> {
        entry(&self.data, span)
    }
}

/// Rows sorted by key, each key once, a deleted key as `None`: [`Entries`] and the filter
/// of their keys.
#[derive(Debug)]
pub(crate) struct Run {
    entries: Entries,
    /// The run's keys: a lookup of a key the run lacks (most lookups: a tablet holds a
    /// few runs, and most of its rows are in fjall) skips the search, whose every step
    /// is a cache miss.
    keys: BloomFilter<ahash::RandomState>,
}

impl Run {
    /// A run of owned `(key, row)` pairs, sorted by key, each key once.
    #[cfg(test)]
    pub(crate) fn from_owned(entries: &[(Vec<u8>, Option<Vec<u8>>)]) -> Self {
        let entries: Vec<Entry<'_>> = (entries.iter())
            .map(|(key, row)| (key.as_slice(), row.as_deref()))
            .collect();
        Self::new(Entries::from_sorted(&entries))
    }

    /// The run of `sources`' entries, oldest first ([`Entries::merge`]).
    pub(crate) fn from_merged(sources: &[&Entries]) -> Self {
        Self::new(Entries::merge(sources))
    }

    /// One run of the entries of `runs`, oldest first; a key in several keeps the newest
    /// run's row. Each entry is copied once, however many runs there are.
    pub(crate) fn merge(runs: &[Arc<Run>]) -> Self {
        let sources: Vec<&Entries> = runs.iter().map(|run| &run.entries).collect();
        Self::from_merged(&sources)
    }

    /// Up to `parts - 1` keys, ascending, that split the entries of `runs` into `parts`
    /// of about as many entries each: quantiles of keys sampled from each run in
    /// proportion to its length.
    pub(crate) fn split_keys(runs: &[Arc<Run>], parts: usize) -> Vec<&[u8]> {
        /// Samples per part: enough for parts within a few percent of each other.
        const SAMPLES_PER_PART: usize = 32;
        let entries: usize = runs.iter().map(|run| run.len()).sum();
        if parts < 2 || entries == 0 {
            return Vec::new();
        }
        let mut samples: Vec<&[u8]> = (runs.iter())
            .flat_map(|run| {
                let samples = (SAMPLES_PER_PART * parts * run.len()).div_ceil(entries);
                let spans = &run.entries.spans;
                (0..samples).map(move |i| run.entries.entry(spans[i * spans.len() / samples]).0)
            })
            .collect();
        samples.sort_unstable();
        let mut keys: Vec<&[u8]> = (1..parts)
            .map(|part| samples[part * samples.len() / parts])
            .collect();
        keys.dedup();
        keys
    }

    /// Whether the run has an entry (deleted or not) of a key from `first` to `last`.
    pub(crate) fn holds_key_in(&self, first: &[u8], last: &[u8]) -> bool {
        self.entries.holds_key_in(first, last)
    }

    /// The run of `entries`, with the filter of their keys.
    fn new(entries: Entries) -> Self {
        let mut keys = BloomFilter::with_false_pos(FILTER_FALSE_POSITIVES)
            .hasher(ahash::RandomState::new())
            .expected_items(entries.len());
        for (key, _) in entries.iter() {
            keys.insert(key);
        }
        Self { entries, keys }
    }

    /// The row of `key` (`Some(None)`: deleted), if the run has the key. The run's key
    /// range is tested before its filter, which hashes the key: of the runs an ascending
    /// load leaves apart, all but one end below the key or start above it.
    pub(crate) fn get(&self, key: &[u8]) -> Option<Option<&[u8]>> {
        match self.entries.spans_across(key, key) && self.keys.contains(key) {
            true => self.entries.search(key),
            false => None,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// About the memory the run holds.
    pub(crate) fn bytes(&self) -> usize {
        self.entries.bytes() + self.keys.num_bits() / 8
    }

    pub(crate) fn first_key(&self) -> Option<&[u8]> {
        self.entries.first_key()
    }

    pub(crate) fn last_key(&self) -> Option<&[u8]> {
        self.entries.last_key()
    }
}

/// The source a merge of sorted sources takes from next ([`next_source`]).
#[derive(Debug, Clone, Copy)]
struct Head<'k, S> {
    /// The newest source of the smallest next key.
    source: S,
    key: &'k [u8],
    /// Whether an older source's next key is that key too.
    tied: bool,
    /// The least next key above it, and its source (`None`: no other source has one).
    above: Option<(S, &'k [u8])>,
}

/// Where a merge of sorted sources goes on, from each source's next key (oldest source
/// first; `None`: it has no key left); `None` when no source has a key left.
fn next_source<'k, S: Copy>(
    heads: impl IntoIterator<Item = (S, Option<&'k [u8]>)>,
) -> Option<Head<'k, S>> {
    let mut next: Option<Head<'k, S>> = None;
    for (source, key) in heads {
        let Some(key) = key else {
            continue;
        };
        match &mut next {
            Some(head) if key > head.key => {
                if head.above.is_none_or(|(_, above)| key < above) {
                    head.above = Some((source, key));
                }
            }
            // Later sources are newer: on an equal key they win.
            Some(head) if key == head.key => {
                head.source = source;
                head.tied = true;
            }
            _ => {
                next = Some(Head {
                    source,
                    key,
                    tied: false,
                    above: next.map(|head| (head.source, head.key)),
                });
            }
        }
    }
    next
}

/// The key and row of the entry at `span` of `data`.
fn entry(data: &[u8], span: Span) -> Entry<'_> {
    let key_end = span.start + span.key_len;
    let row = (span.row_len).map(|len| &data[key_end..key_end + len]);
    (&data[span.start..key_end], row)
}

/// Entries in key order.
pub(crate) struct EntriesIter<'a> {
    data: &'a [u8],
    spans: std::slice::Iter<'a, Span>,
}

impl<'a> EntriesIter<'a> {
    /// The next entry, left in place.
    fn peek(&self) -> Option<Entry<'a>> {
        self.spans
            .as_slice()
            .first()
            .map(|&span| entry(self.data, span))
    }
}

impl<'a> Iterator for EntriesIter<'a> {
    type Item = Entry<'a>;

    fn next(&mut self) -> Option<Self::Item> {
        self.spans.next().map(|&span| entry(self.data, span))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.spans.size_hint()
    }
}

/// Rows of fjall and of runs, read as one, from a start key on: in key order, each key as
/// its newest source has it (the newest run, then older runs, then fjall), a deleted key
/// as `None` ([`Merged::rows`] leaves them out).
///
/// Where one source's keys run below every other's (runs that do not interleave, as an
/// ascending load's, or a stretch of fjall between two runs' keys), its rows are taken
/// one after the other, each compared with the head of one other source only.
pub(crate) struct Merged<'a, S: Iterator> {
    store: Peekable<S>,
    /// Oldest first, as the tablet keeps them.
    runs: Vec<EntriesIter<'a>>,
    /// A source whose head is below every other source's head, and the source of the
    /// smallest of those (`None`: no other source has rows left): rows are taken from the
    /// first while they stay below that head.
    streak: Option<(Source, Option<Source>)>,
}

/// One of the sources of a [`Merged`] read.
#[derive(Debug, Clone, Copy)]
enum Source {
    Store,
    /// Run `i`, oldest first.
    Run(usize),
}

impl<'a, S> Merged<'a, S>
where
    S: Iterator<Item = fjall::Result<(UserKey, UserValue)>>,
{
    /// `store` must start at `start` too.
    pub(crate) fn new(store: S, runs: &'a [Arc<Run>], start: Bound<&[u8]>) -> Self {
        Self {
            store: store.peekable(),
            runs: runs.iter().map(|run| run.entries.from(start)).collect(),
            streak: None,
        }
    }

    /// The rows alone: deleted keys left out.
    pub(crate) fn rows(self) -> impl Iterator<Item = Result<(UserKey, UserValue)>> + use<'a, S> {
        self.filter_map(|entry| match entry {
            Ok((key, row)) => row.map(|row| Ok((key, row))),
            Err(error) => Some(Err(error)),
        })
    }

    /// Whether the head of `ahead` is below that of `bound` (`None`: no other source has
    /// rows left), as the streak needs to go on; `false` on fjall's error, which the next
    /// full step returns.
    fn stays_below(&mut self, ahead: Source, bound: Option<Source>) -> bool {
        let store_head = match self.store.peek() {
            Some(Ok((key, _))) => Some(key.as_ref()),
            _ => None,
        };
        let head = |source| match source {
            Source::Store => store_head,
            Source::Run(index) => self.runs[index].peek().map(|(key, _)| key),
        };
        match (head(ahead), bound.map(head)) {
            (Some(_), None) => true,
            (Some(key), Some(Some(bound))) => key < bound,
            _ => false,
        }
    }

    /// Takes the next row of every source's, by comparing all their heads: returns the
    /// smallest key's newest row, moves past the key in every source, and starts a streak
    /// when no other source has the key.
    fn step(&mut self) -> Option<Result<(UserKey, Option<UserValue>)>> {
        let store_head = match self.store.peek() {
            None => None,
            Some(Ok((key, _))) => Some(key.as_ref()),
            Some(Err(_)) => {
                let error = self.store.next().and_then(Result::err).expect("peeked");
                return Some(Err(kv_error(error)));
            }
        };
        let run_heads = (self.runs.iter().enumerate())
            .map(|(index, run)| (Source::Run(index), run.peek().map(|(key, _)| key)));
        let head = next_source([(Source::Store, store_head)].into_iter().chain(run_heads))?;
        let (source, tied) = (head.source, head.tied);
        self.streak = (!tied).then_some((source, head.above.map(|(source, _)| source)));
        let row = self.take(source);
        if tied {
            self.skip(&row.0);
        }
        Some(Ok(row))
    }

    /// The head of `source`, which has one.
    fn take(&mut self, source: Source) -> (UserKey, Option<UserValue>) {
        match source {
            Source::Store => match self.store.next() {
                Some(Ok((key, row))) => (key, Some(row)),
                _ => unreachable!("fjall's next row was peeked"),
            },
            Source::Run(index) => {
                let (key, row) = self.runs[index].next().expect("the run's head was peeked");
                (UserKey::from(key), row.map(UserValue::from))
            }
        }
    }

    /// Moves every source past `key`.
    fn skip(&mut self, key: &[u8]) {
        if let Some(Ok((head, _))) = self.store.peek()
            && head.as_ref() == key
        {
            self.store.next();
        }
        for run in &mut self.runs {
            if run.peek().is_some_and(|(head, _)| head == key) {
                run.next();
            }
        }
    }
}

impl<S> Iterator for Merged<'_, S>
where
    S: Iterator<Item = fjall::Result<(UserKey, UserValue)>>,
{
    type Item = Result<(UserKey, Option<UserValue>)>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some((ahead, bound)) = self.streak {
            if self.stays_below(ahead, bound) {
                return Some(Ok(self.take(ahead)));
            }
            self.streak = None;
        }
        self.step()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(entries: &[(u8, Option<u8>)]) -> Run {
        let entries: Vec<_> = (entries.iter())
            .map(|&(key, row)| (vec![key], row.map(|row| vec![row])))
            .collect();
        Run::from_owned(&entries)
    }

    fn keys_and_rows(run: &Run) -> Vec<(u8, Option<u8>)> {
        (run.entries.iter())
            .map(|(key, row)| (key[0], row.map(|row| row[0])))
            .collect()
    }

    #[test]
    fn split_keys_cut_the_runs_into_parts_of_about_as_many_entries() {
        let keys = |keys: &mut dyn Iterator<Item = u32>| {
            let entries: Vec<_> = keys.map(|key| (key.to_be_bytes().to_vec(), None)).collect();
            Arc::new(Run::from_owned(&entries))
        };
        // A large run, and smaller ones above it, interleaved with it and each other.
        let runs = [
            keys(&mut (0..60_000).step_by(2)),
            keys(&mut (40_001..80_000).step_by(2)),
            keys(&mut (50_000..90_000).step_by(7)),
        ];
        let entries: Vec<u32> = (runs.iter())
            .flat_map(|run| {
                run.entries
                    .iter()
                    .map(|(key, _)| u32::from_be_bytes(key.try_into().unwrap()))
            })
            .collect();
        assert!(Run::split_keys(&runs, 1).is_empty());
        for parts in 2..6 {
            let splits: Vec<u32> = (Run::split_keys(&runs, parts).iter())
                .map(|key| u32::from_be_bytes((*key).try_into().unwrap()))
                .collect();
            assert_eq!(splits.len(), parts - 1);
            assert!(splits.is_sorted_by(|a, b| a < b), "{splits:?}");
            let bounds: Vec<u32> = [0].into_iter().chain(splits).chain([u32::MAX]).collect();
            for part in bounds.windows(2) {
                let in_part = entries
                    .iter()
                    .filter(|&&key| (part[0]..part[1]).contains(&key))
                    .count();
                let even = entries.len() / parts;
                assert!(
                    in_part.abs_diff(even) < even / 5,
                    "{parts} parts: {in_part} of {}",
                    entries.len()
                );
            }
        }
    }

    #[test]
    fn a_merge_keeps_the_newest_row_of_a_key_in_several() {
        let oldest = run(&[(1, Some(10)), (3, Some(30)), (5, Some(50))]);
        let older = run(&[(2, Some(21)), (3, None), (6, Some(61))]);
        let newest = run(&[(3, Some(32)), (6, Some(62)), (7, None)]);
        let merged = Run::merge(&[Arc::new(oldest), Arc::new(older), Arc::new(newest)]);
        assert_eq!(
            keys_and_rows(&merged),
            [
                (1, Some(10)),
                (2, Some(21)),
                (3, Some(32)),
                (5, Some(50)),
                (6, Some(62)),
                (7, None)
            ]
        );
        assert_eq!(merged.get(&[7]), Some(None));
        assert_eq!(merged.get(&[4]), None);
        assert_eq!(merged.get(&[3]), Some(Some(&[32][..])));
    }

    #[test]
    fn a_merge_of_ascending_runs_appends() {
        let merged = Run::merge(&[
            Arc::new(run(&[(1, Some(1))])),
            Arc::new(run(&[])),
            Arc::new(run(&[(2, Some(2)), (3, None)])),
        ]);
        assert_eq!(
            keys_and_rows(&merged),
            [(1, Some(1)), (2, Some(2)), (3, None)]
        );
        assert_eq!(merged.get(&[3]), Some(None));
        assert_eq!(merged.get(&[2]), Some(Some(&[2][..])));
        assert_eq!(
            merged.bytes(),
            5 + 3 * size_of::<Span>() + merged.keys.num_bits() / 8
        );
    }

    #[test]
    fn merged_reads_take_the_newest_source_and_leave_deleted_keys_out() {
        let store: Vec<(u8, u8)> = vec![(1, 100), (2, 100), (3, 100), (7, 100)];
        let runs = [
            Arc::new(run(&[(2, Some(1)), (4, Some(1)), (7, None)])),
            Arc::new(run(&[(2, Some(2)), (3, None), (5, Some(2))])),
        ];
        let read = |start: Bound<&[u8]>| -> Vec<(u8, u8)> {
            let store = (store.iter())
                .filter(|(key, _)| match start {
                    Bound::Unbounded => true,
                    Bound::Included(s) => [*key].as_slice() >= s,
                    Bound::Excluded(s) => [*key].as_slice() > s,
                })
                .map(|&(key, row)| Ok((UserKey::from([key]), UserValue::from([row]))));
            Merged::new(store, &runs, start)
                .rows()
                .map(|read| {
                    let (key, row) = read.unwrap();
                    (key[0], row[0])
                })
                .collect()
        };
        assert_eq!(read(Bound::Unbounded), [(1, 100), (2, 2), (4, 1), (5, 2)]);
        assert_eq!(read(Bound::Excluded(&[2])), [(4, 1), (5, 2)]);
        assert_eq!(read(Bound::Included(&[5])), [(5, 2)]);
    }

    /// Random runs over fjall's rows, interleaving or not, with deletions: a merged read
    /// from any start is what applying the sources oldest first gives.
    #[test]
    fn merged_reads_of_random_sources_match_applying_them_in_turn() {
        use rand::{Rng, SeedableRng, rngs::StdRng};
        for seed in 0..200 {
            let mut rng = StdRng::seed_from_u64(seed);
            // Keys of a source: random ones, or a stretch of consecutive ones.
            let keys = |rng: &mut StdRng| -> Vec<u8> {
                let mut keys: Vec<u8> = match rng.random_bool(0.5) {
                    true => (0..rng.random_range(0..40)).map(|_| rng.random()).collect(),
                    false => {
                        let start = rng.random_range(0..200);
                        (start..start + rng.random_range(0..50)).collect()
                    }
                };
                keys.sort_unstable();
                keys.dedup();
                keys
            };
            let store: Vec<(u8, u8)> = keys(&mut rng).into_iter().map(|key| (key, 0)).collect();
            let mut model: std::collections::BTreeMap<u8, u8> = store.iter().copied().collect();
            let runs: Vec<Arc<Run>> = (1..=rng.random_range(0..6))
                .map(|version| {
                    let entries: Vec<(u8, Option<u8>)> = (keys(&mut rng).into_iter())
                        .map(|key| (key, rng.random_bool(0.8).then_some(version)))
                        .collect();
                    for &(key, row) in &entries {
                        match row {
                            Some(row) => model.insert(key, row),
                            None => model.remove(&key),
                        };
                    }
                    Arc::new(run(&entries))
                })
                .collect();
            let start = rng.random::<u8>();
            let stored = (store.iter())
                .filter(|(key, _)| *key >= start)
                .map(|&(key, row)| Ok((UserKey::from([key]), UserValue::from([row]))));
            let read: Vec<(u8, u8)> = Merged::new(stored, &runs, Bound::Included(&[start]))
                .rows()
                .map(|row| row.map(|(key, row)| (key[0], row[0])).unwrap())
                .collect();
            let expected: Vec<(u8, u8)> = model.range(start..).map(|(&k, &r)| (k, r)).collect();
            assert_eq!(read, expected, "seed {seed}");
        }
    }

    /// Random runs, interleaving or not, with deletions: their merge holds each key as
    /// the newest run has it, deletions included, whichever stretches it copied whole.
    #[test]
    fn merges_of_random_runs_match_applying_them_in_turn() {
        use rand::{Rng, SeedableRng, rngs::StdRng};
        for seed in 0..300 {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut model = std::collections::BTreeMap::new();
            let runs: Vec<Arc<Run>> = (1..=rng.random_range(0..7))
                .map(|version| {
                    let start = rng.random_range(0..200);
                    let mut keys: Vec<u8> = match rng.random_bool(0.5) {
                        true => (0..rng.random_range(0..60)).map(|_| rng.random()).collect(),
                        false => (start..start + rng.random_range(0..55)).collect(),
                    };
                    keys.sort_unstable();
                    keys.dedup();
                    let entries: Vec<(u8, Option<u8>)> = (keys.into_iter())
                        .map(|key| (key, rng.random_bool(0.8).then_some(version)))
                        .collect();
                    model.extend(entries.iter().copied());
                    Arc::new(run(&entries))
                })
                .collect();
            let merged = Run::merge(&runs);
            let expected: Vec<(u8, Option<u8>)> = model.into_iter().collect();
            assert_eq!(keys_and_rows(&merged), expected, "seed {seed}");
            for &(key, row) in &expected {
                let found = merged.get(&[key]).map(|row| row.map(|row| row[0]));
                assert_eq!(found, Some(row), "seed {seed}, key {key}");
            }
        }
    }

    #[test]
    fn a_merged_read_returns_fjalls_error_in_key_order() {
        let runs = [Arc::new(run(&[(1, Some(1)), (2, Some(1))]))];
        let store = [
            Ok((UserKey::from([0]), UserValue::from([0]))),
            Err(fjall::Error::Poisoned),
        ];
        let mut read = Merged::new(store.into_iter(), &runs, Bound::Unbounded);
        assert_eq!(read.next().unwrap().unwrap().0.as_ref(), [0]);
        assert!(
            read.next().unwrap().is_err(),
            "fjall's error before the run's keys"
        );
    }
}
