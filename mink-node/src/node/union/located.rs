//! The lake rows a bucket's range replaces, kept from one plan to the next.
//!
//! A plan of a primary-key table's union read marks the lake rows its ranges replace
//! (`Node::locate_replaced_rows`): it reads the keys of each bucket's log range
//! `[log_from, log_to)` and looks each one up in the lake index, about 0.1 s per million
//! range rows. Between two tiering rounds the range only grows at its end, and a log
//! range never changes once written, so each bucket keeps what its last plan located
//! ([`LocatedRange`]): the next plan of the same lake snapshot and seam locates only the
//! rows written since. A plan of another snapshot or seam (a round, a retention that
//! moved the log start) locates its whole range again and replaces what was kept.
//!
//! What a bucket keeps is bounded by the log ranges a plan locates at all (the positions of at
//! most `MAX_LOCATED_RANGE_ROWS` rows per table, 8 bytes each), and is freed with the bucket.

use std::sync::{Arc, Mutex, PoisonError};

use crate::lake_index::LocatedRows;

/// What a bucket's last plan located (see the module docs).
#[derive(Debug, Default)]
pub struct LocatedRange {
    kept: Mutex<Option<Located>>,
}

/// The lake rows of snapshot `snapshot_id` that the log range `[from, to)` replaces.
#[derive(Debug, Clone)]
pub(crate) struct Located {
    pub(crate) snapshot_id: i64,
    pub(crate) from: i64,
    pub(crate) to: i64,
    /// By data file, positions ascending, each once.
    pub(crate) rows: Arc<LocatedRows>,
}

impl LocatedRange {
    /// What was located of the range `[from, to)` over `snapshot_id`: a prefix
    /// `[from, kept.to)` of it, if one was kept.
    pub(crate) fn prefix(&self, snapshot_id: i64, from: i64, to: i64) -> Option<Located> {
        let kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        kept.as_ref()
            .filter(|kept| kept.snapshot_id == snapshot_id && kept.from == from && kept.to <= to)
            .cloned()
    }

    /// Keeps `located`, unless what is kept already covers more of the same range.
    pub(crate) fn keep(&self, located: Located) {
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        let covers_more = kept.as_ref().is_some_and(|kept| {
            kept.snapshot_id == located.snapshot_id
                && kept.from == located.from
                && kept.to >= located.to
        });
        if !covers_more {
            *kept = Some(located);
        }
    }
}

impl Located {
    /// This range extended to `to` by the rows `more` its new part replaces.
    pub(crate) fn extended(self, to: i64, more: LocatedRows) -> Self {
        let rows = match more.is_empty() {
            true => self.rows,
            false => Arc::new(union(&self.rows, more)),
        };
        Self { to, rows, ..self }
    }
}

/// The rows of `a` and `b`, by file, positions ascending, each once.
fn union(a: &LocatedRows, mut b: LocatedRows) -> LocatedRows {
    let mut rows = a.clone();
    for (file, more) in b.drain() {
        let positions = rows.entry(file).or_default();
        positions.extend(more);
        positions.sort_unstable();
        positions.dedup();
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(files: &[(&str, &[u64])]) -> LocatedRows {
        files
            .iter()
            .map(|(file, positions)| (Arc::from(*file), positions.to_vec()))
            .collect()
    }

    fn located(snapshot_id: i64, from: i64, to: i64, files: &[(&str, &[u64])]) -> Located {
        Located {
            snapshot_id,
            from,
            to,
            rows: Arc::new(rows(files)),
        }
    }

    #[test]
    fn a_kept_range_is_a_prefix_of_the_same_snapshot_and_seam_only() {
        let range = LocatedRange::default();
        assert!(range.prefix(1, 10, 20).is_none());
        range.keep(located(1, 10, 15, &[("a", &[3])]));
        assert_eq!(range.prefix(1, 10, 20).map(|l| l.to), Some(15));
        assert_eq!(range.prefix(1, 10, 15).map(|l| l.to), Some(15));
        // A shorter range, another seam or another snapshot does not take it.
        assert!(range.prefix(1, 10, 14).is_none());
        assert!(range.prefix(1, 11, 20).is_none());
        assert!(range.prefix(2, 10, 20).is_none());
    }

    #[test]
    fn a_longer_range_replaces_a_shorter_one_and_another_snapshot_replaces_any() {
        let range = LocatedRange::default();
        range.keep(located(1, 10, 15, &[]));
        range.keep(located(1, 10, 12, &[]));
        assert_eq!(range.prefix(1, 10, 20).map(|l| l.to), Some(15));
        range.keep(located(1, 10, 18, &[]));
        assert_eq!(range.prefix(1, 10, 20).map(|l| l.to), Some(18));
        range.keep(located(2, 30, 31, &[]));
        assert!(range.prefix(1, 10, 20).is_none());
        assert_eq!(range.prefix(2, 30, 40).map(|l| l.to), Some(31));
    }

    #[test]
    fn extending_merges_the_positions_of_each_file() {
        let kept = located(1, 0, 5, &[("a", &[1, 7]), ("b", &[2])]);
        let extended = kept.extended(9, rows(&[("a", &[4, 7, 9]), ("c", &[0])]));
        assert_eq!(extended.to, 9);
        let mut files: Vec<_> = extended.rows.iter().collect();
        files.sort();
        let expected = rows(&[("a", &[1, 4, 7, 9]), ("b", &[2]), ("c", &[0])]);
        let mut expected: Vec<_> = expected.iter().collect();
        expected.sort();
        assert_eq!(files, expected);
    }
}
