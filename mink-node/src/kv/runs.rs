//! Sorted runs of rows, and reading several of them together with fjall.
//!
//! A [`Run`] is the rows of committed groups that the store holds in memory until it
//! writes them to fjall ([`super::buffer`]): sorted by key, each key once, a deleted key
//! kept as `None` so that it hides the row an older source still has. [`Merged`] reads
//! fjall and a tablet's runs as one: key order, each key as its newest source has it,
//! deleted keys left out.

use std::cmp::Ordering;
use std::iter::Peekable;
use std::ops::Bound;
use std::sync::Arc;

use fastbloom::BloomFilter;
use fjall::{UserKey, UserValue};

use super::kv_error;
use crate::error::Result;

/// A key and its row; `None`: the key was deleted.
pub(crate) type Entry = (Vec<u8>, Option<Vec<u8>>);

/// Bytes a run holds per entry besides its key and row (the entry and the two vectors'
/// allocations, roughly).
const ENTRY_OVERHEAD: usize = 64;

/// The share of keys a run lacks that its filter lets through to a search.
const FILTER_FALSE_POSITIVES: f64 = 0.01;

/// Rows sorted by key, each key once.
#[derive(Debug, Clone)]
pub(crate) struct Run {
    entries: Vec<Entry>,
    /// The run's keys: a lookup of a key the run lacks (most lookups: a tablet holds a
    /// few runs, and most of its rows are in fjall) skips the search, whose every step
    /// is a cache miss.
    keys: BloomFilter<ahash::RandomState>,
    bytes: usize,
}

impl Run {
    /// A run of `entries`, which are sorted by key, each key once.
    pub(crate) fn from_sorted(entries: Vec<Entry>) -> Self {
        debug_assert!(entries.windows(2).all(|pair| pair[0].0 < pair[1].0));
        let keys = BloomFilter::with_false_pos(FILTER_FALSE_POSITIVES)
            .hasher(ahash::RandomState::new())
            .items(entries.iter().map(|(key, _)| key));
        let bytes = entries
            .iter()
            .map(|(key, row)| key.len() + row.as_ref().map_or(0, Vec::len) + ENTRY_OVERHEAD)
            .sum::<usize>()
            + keys.num_bits() / 8;
        Self {
            entries,
            keys,
            bytes,
        }
    }

    /// One run of `older`'s and `newer`'s entries; a key in both keeps `newer`'s row.
    pub(crate) fn merge(older: Self, newer: Self) -> Self {
        Self::from_sorted(merge_entries(older.entries, newer.entries))
    }

    /// The row of `key` (`Some(None)`: deleted), if the run has the key.
    pub(crate) fn get(&self, key: &[u8]) -> Option<Option<&[u8]>> {
        if !self.keys.contains(key) {
            return None;
        }
        let at = (self.entries)
            .binary_search_by(|(entry, _)| entry.as_slice().cmp(key))
            .ok()?;
        Some(self.entries[at].1.as_deref())
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// About the memory the run holds.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    pub(crate) fn last_key(&self) -> Option<&[u8]> {
        self.entries.last().map(|(key, _)| key.as_slice())
    }

    /// The entries from `start` on.
    fn from(&self, start: Bound<&[u8]>) -> std::slice::Iter<'_, Entry> {
        let at = match start {
            Bound::Unbounded => 0,
            Bound::Included(key) => self.entries.partition_point(|(k, _)| k.as_slice() < key),
            Bound::Excluded(key) => self.entries.partition_point(|(k, _)| k.as_slice() <= key),
        };
        self.entries[at..].iter()
    }
}

/// `older`'s and `newer`'s entries (each sorted by key, each key once) as one such list;
/// a key in both keeps `newer`'s row.
pub(crate) fn merge_entries(mut older: Vec<Entry>, newer: Vec<Entry>) -> Vec<Entry> {
    let disjoint = match (older.last(), newer.first()) {
        (Some(last), Some(first)) => last.0 < first.0,
        _ => true,
    };
    if disjoint {
        // An ascending load: every newer key is above the older ones.
        older.extend(newer);
        return older;
    }
    let mut entries = Vec::with_capacity(older.len() + newer.len());
    let mut older = older.into_iter().peekable();
    let mut newer = newer.into_iter().peekable();
    loop {
        let order = match (older.peek(), newer.peek()) {
            (None, None) => break,
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (Some(old), Some(new)) => old.0.cmp(&new.0),
        };
        let next = match order {
            Ordering::Less => older.next(),
            Ordering::Greater => newer.next(),
            Ordering::Equal => {
                older.next();
                newer.next()
            }
        };
        entries.extend(next);
    }
    entries
}

/// Rows of fjall and of runs, read as one, from a start key on: in key order, each key as
/// its newest source has it (the newest run, then older runs, then fjall), a deleted key
/// as `None` ([`Merged::rows`] leaves them out).
pub(crate) struct Merged<'a, S: Iterator> {
    store: Peekable<S>,
    /// Oldest first, as the tablet keeps them.
    runs: Vec<Peekable<std::slice::Iter<'a, Entry>>>,
}

impl<'a, S> Merged<'a, S>
where
    S: Iterator<Item = fjall::Result<(UserKey, UserValue)>>,
{
    /// `store` must start at `start` too.
    pub(crate) fn new(store: S, runs: &'a [Arc<Run>], start: Bound<&[u8]>) -> Self {
        Self {
            store: store.peekable(),
            runs: runs.iter().map(|run| run.from(start).peekable()).collect(),
        }
    }

    /// The rows alone: deleted keys left out.
    pub(crate) fn rows(self) -> impl Iterator<Item = Result<(UserKey, UserValue)>> + use<'a, S> {
        self.filter_map(|entry| match entry {
            Ok((key, row)) => row.map(|row| Ok((key, row))),
            Err(error) => Some(Err(error)),
        })
    }

    /// The newest source of the smallest key left: `None` for fjall, `Some(i)` for run
    /// `i`; `Err` for fjall's error; `Ok(None)` past the end of every source.
    fn smallest(&mut self) -> Result<Option<Option<usize>>> {
        let mut best: Option<(Option<usize>, &[u8])> = match self.store.peek() {
            None => None,
            Some(Ok((key, _))) => Some((None, key)),
            Some(Err(_)) => {
                let error = self.store.next().and_then(Result::err).expect("peeked");
                return Err(kv_error(error));
            }
        };
        for (index, run) in self.runs.iter_mut().enumerate() {
            let Some((key, _)) = run.peek() else {
                continue;
            };
            // Later runs are newer: on an equal key they win.
            if best.is_none_or(|(_, smallest)| key.as_slice() <= smallest) {
                best = Some((Some(index), key));
            }
        }
        Ok(best.map(|(source, _)| source))
    }

    /// Moves every source past `key`.
    fn skip(&mut self, key: &[u8]) {
        if let Some(Ok((head, _))) = self.store.peek()
            && head.as_ref() == key
        {
            self.store.next();
        }
        for run in &mut self.runs {
            run.next_if(|(head, _)| head.as_slice() == key);
        }
    }
}

impl<S> Iterator for Merged<'_, S>
where
    S: Iterator<Item = fjall::Result<(UserKey, UserValue)>>,
{
    type Item = Result<(UserKey, Option<UserValue>)>;

    fn next(&mut self) -> Option<Self::Item> {
        let source = match self.smallest() {
            Err(error) => return Some(Err(error)),
            Ok(source) => source?,
        };
        let (key, row) = match source {
            None => match self.store.next() {
                Some(Ok((key, row))) => (key, Some(row)),
                _ => unreachable!("fjall's next row was peeked"),
            },
            Some(index) => {
                let (key, row) = self.runs[index].next()?;
                (
                    UserKey::from(key.as_slice()),
                    row.as_deref().map(UserValue::from),
                )
            }
        };
        self.skip(&key);
        Some(Ok((key, row)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(entries: &[(u8, Option<u8>)]) -> Run {
        Run::from_sorted(
            (entries.iter())
                .map(|&(key, row)| (vec![key], row.map(|row| vec![row])))
                .collect(),
        )
    }

    fn keys_and_rows(run: &Run) -> Vec<(u8, Option<u8>)> {
        (run.entries.iter())
            .map(|(key, row)| (key[0], row.as_ref().map(|row| row[0])))
            .collect()
    }

    #[test]
    fn a_merge_keeps_the_newer_row_of_a_key_in_both() {
        let older = run(&[(1, Some(10)), (3, Some(30)), (5, Some(50))]);
        let newer = run(&[(2, Some(21)), (3, None), (6, Some(61))]);
        let merged = Run::merge(older, newer);
        assert_eq!(
            keys_and_rows(&merged),
            [
                (1, Some(10)),
                (2, Some(21)),
                (3, None),
                (5, Some(50)),
                (6, Some(61))
            ]
        );
        assert_eq!(merged.get(&[3]), Some(None));
        assert_eq!(merged.get(&[4]), None);
        assert_eq!(merged.get(&[6]), Some(Some(&[61][..])));
    }

    #[test]
    fn a_merge_of_ascending_runs_appends() {
        let merged = Run::merge(run(&[(1, Some(1))]), run(&[(2, Some(2))]));
        assert_eq!(keys_and_rows(&merged), [(1, Some(1)), (2, Some(2))]);
        assert_eq!(
            merged.bytes(),
            2 * (2 + ENTRY_OVERHEAD) + merged.keys.num_bits() / 8
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
}
