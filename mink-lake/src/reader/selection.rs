//! Which rows of a data file a read returns, and the position of each: pure logic.
//!
//! A file's rows are numbered by their position, 0.. across its row groups in order.
//! Statistics keep some row groups; position deletes name positions that are gone. The
//! Parquet reader takes a [`RowSelection`] over the rows of the row groups it reads,
//! *concatenated*: pruned row groups have no entry at all. So the selection is built group
//! by group, each kept group contributing its select/skip runs, and the live positions
//! are kept alongside so every row the reader returns can be given its position.
//!
//! ```text
//!  positions     0 ............ 99 | 100 .......... 199 | 200 .......... 299
//!  row groups    [     rg 0       ] [  rg 1 (pruned)   ] [      rg 2       ]
//!  deleted       3, 99               150                  200, 201, 900
//!  selection     select 3, skip 1,                        skip 2, select 98
//!                select 95, skip 1     (no entry)
//!  live          0..3, 4..99                              202..300
//! ```
//!
//! Deleted positions outside the kept row groups (in a pruned group, past the end of the
//! file, negative in the delete file) name no row the read returns and are ignored: a
//! position delete only ever removes rows, it never makes a read fail.
//!
//! The other way round, [`pick_rows`] selects only the rows at some positions (the rows
//! a position-delete file removes, read back by an incremental read): the row groups
//! holding none of them are not read at all.

use std::collections::VecDeque;
use std::ops::Range;

use arrow::array::UInt64Array;
use parquet::arrow::arrow_reader::{RowSelection, RowSelector};

/// A row group that is read: the position of its first row and its row count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RowGroupSpan {
    pub(super) start: u64,
    pub(super) rows: u64,
}

/// The spans of the row groups `kept` (indexes, ascending) of a file whose row groups
/// have `row_counts` rows.
pub(super) fn row_group_spans(row_counts: &[u64], kept: &[usize]) -> Vec<RowGroupSpan> {
    let mut starts = Vec::with_capacity(row_counts.len());
    let mut next = 0;
    for rows in row_counts {
        starts.push(next);
        next += rows;
    }
    kept.iter()
        .filter_map(|&i| {
            Some(RowGroupSpan {
                start: *starts.get(i)?,
                rows: row_counts[i],
            })
        })
        .collect()
}

/// What to read of one row group, given the positions deleted from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupRows {
    /// Every row: none is deleted.
    All,
    /// No row: every one is deleted.
    None,
    /// The rows the selection (over the group's own rows) selects.
    Some(RowSelection),
}

/// What to read of each row group of a file whose row groups have `row_counts` rows,
/// `deleted` (ascending; duplicates allowed) left out: the same selection as a read of
/// the whole file, one row group at a time (a scan that takes a selection per row group,
/// such as DataFusion's access plans).
pub fn rows_per_group(row_counts: &[u64], deleted: &[u64]) -> Vec<GroupRows> {
    let every_group: Vec<usize> = (0..row_counts.len()).collect();
    row_group_spans(row_counts, &every_group)
        .into_iter()
        .map(|span| {
            let selected = select_rows(&[span], deleted);
            match (selected.live.is_empty(), selected.selection) {
                (true, _) => GroupRows::None,
                (false, None) => GroupRows::All,
                (false, Some(selection)) => GroupRows::Some(selection),
            }
        })
        .collect()
}

/// The rows of a file to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct FileSelection {
    /// The selection over the kept row groups' rows, or `None` when every one of them is
    /// read.
    pub(super) selection: Option<RowSelection>,
    /// The positions read, ascending, adjacent ranges merged.
    pub(super) live: Vec<Range<u64>>,
}

impl FileSelection {
    /// How many rows are read.
    pub(super) fn row_count(&self) -> u64 {
        self.live.iter().map(|r| r.end - r.start).sum()
    }
}

/// Selects the rows of the `kept` row groups (ascending) that `deleted` (ascending;
/// duplicates allowed) does not name.
pub(super) fn select_rows(kept: &[RowGroupSpan], deleted: &[u64]) -> FileSelection {
    let mut selectors = Vec::new();
    let mut live: Vec<Range<u64>> = Vec::new();
    let mut any_deleted = false;
    let mut push_live = |range: Range<u64>| match live.last_mut() {
        Some(last) if last.end == range.start => last.end = range.end,
        _ => live.push(range),
    };
    for group in kept {
        let end = group.start + group.rows;
        let from = deleted.partition_point(|&p| p < group.start);
        let to = deleted.partition_point(|&p| p < end);
        let mut cursor = group.start;
        for &position in &deleted[from..to] {
            if position < cursor {
                continue; // a duplicate
            }
            if position > cursor {
                selectors.push(RowSelector::select(run(position - cursor)));
                push_live(cursor..position);
            }
            selectors.push(RowSelector::skip(1));
            any_deleted = true;
            cursor = position + 1;
        }
        if cursor < end {
            selectors.push(RowSelector::select(run(end - cursor)));
            push_live(cursor..end);
        }
    }
    FileSelection {
        selection: any_deleted.then(|| RowSelection::from(selectors)),
        live,
    }
}

fn run(rows: u64) -> usize {
    usize::try_from(rows).unwrap_or(usize::MAX)
}

/// The rows at some positions of a file: the row groups to read and the selection over
/// their rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PickedRows {
    /// The row groups holding a wanted position, ascending.
    pub(crate) row_groups: Vec<usize>,
    /// The selection over those row groups' rows, concatenated.
    pub(crate) selection: RowSelection,
    /// The positions selected, ascending: the wanted ones the file has.
    pub(crate) positions: Vec<u64>,
}

/// Selects the rows at `wanted` (ascending; duplicates allowed) of a file whose row
/// groups have `row_counts` rows. Positions past the end of the file are ignored.
pub(crate) fn pick_rows(row_counts: &[u64], wanted: &[u64]) -> PickedRows {
    let (mut row_groups, mut positions, mut selectors) = (Vec::new(), Vec::new(), Vec::new());
    let mut start = 0;
    for (index, &rows) in row_counts.iter().enumerate() {
        let end = start + rows;
        let from = wanted.partition_point(|&p| p < start);
        let to = wanted.partition_point(|&p| p < end);
        if from < to {
            row_groups.push(index);
            let mut cursor = start;
            for &position in &wanted[from..to] {
                if position < cursor {
                    continue; // a duplicate
                }
                if position > cursor {
                    selectors.push(RowSelector::skip(run(position - cursor)));
                }
                selectors.push(RowSelector::select(1));
                positions.push(position);
                cursor = position + 1;
            }
            if cursor < end {
                selectors.push(RowSelector::skip(run(end - cursor)));
            }
        }
        start = end;
    }
    PickedRows {
        row_groups,
        selection: RowSelection::from(selectors),
        positions,
    }
}

/// Hands out the live positions of a file in order, as the reader returns its rows.
#[derive(Debug)]
pub(super) struct LivePositions {
    ranges: VecDeque<Range<u64>>,
}

impl LivePositions {
    pub(super) fn new(live: Vec<Range<u64>>) -> Self {
        Self {
            ranges: live.into(),
        }
    }

    /// The positions of the next `rows` rows, or `None` when fewer are left.
    pub(super) fn take(&mut self, rows: usize) -> Option<UInt64Array> {
        let mut positions = Vec::with_capacity(rows);
        while positions.len() < rows {
            let range = self.ranges.front_mut()?;
            let wanted = (rows - positions.len()) as u64;
            let end = range.end.min(range.start + wanted);
            positions.extend(range.start..end);
            range.start = end;
            if range.is_empty() {
                self.ranges.pop_front();
            }
        }
        Some(UInt64Array::from(positions))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Row groups of `rows` rows each, all kept but `pruned`.
    fn spans(groups: &[u64], pruned: &[usize]) -> Vec<RowGroupSpan> {
        let kept: Vec<usize> = (0..groups.len()).filter(|i| !pruned.contains(i)).collect();
        row_group_spans(groups, &kept)
    }

    /// The selection as (skip, rows) runs.
    fn runs(selection: &FileSelection) -> Option<Vec<(bool, usize)>> {
        selection
            .selection
            .as_ref()
            .map(|s| s.iter().map(|s| (s.skip, s.row_count)).collect())
    }

    #[test]
    fn spans_follow_row_counts() {
        assert_eq!(
            row_group_spans(&[10, 20, 5], &[0, 2]),
            vec![
                RowGroupSpan { start: 0, rows: 10 },
                RowGroupSpan { start: 30, rows: 5 }
            ]
        );
        assert_eq!(row_group_spans(&[10, 20], &[]), vec![]);
        // An index the file does not have is no row group.
        assert_eq!(row_group_spans(&[10], &[0, 3]).len(), 1);
    }

    #[test]
    fn no_deletes_reads_every_kept_row_without_a_selection() {
        let s = select_rows(&spans(&[100, 100, 100], &[]), &[]);
        assert_eq!(s.selection, None);
        assert_eq!(s.live, vec![0..300]);
        let s = select_rows(&spans(&[100, 100, 100], &[1]), &[]);
        assert_eq!(s.selection, None);
        assert_eq!(s.live, vec![0..100, 200..300]);
        assert_eq!(s.row_count(), 200);
    }

    #[test]
    fn the_diagram() {
        let s = select_rows(&spans(&[100, 100, 100], &[1]), &[3, 99, 150, 200, 201, 900]);
        assert_eq!(
            runs(&s).unwrap(),
            vec![(false, 3), (true, 1), (false, 95), (true, 3), (false, 98)]
        );
        assert_eq!(s.live, vec![0..3, 4..99, 202..300]);
        // The selection covers exactly the rows of the kept groups.
        assert_eq!(s.selection.unwrap().row_count() + 4, 200);
    }

    #[test]
    fn first_and_last_rows_of_a_group() {
        let s = select_rows(&spans(&[10, 10], &[]), &[0, 9, 10, 19]);
        assert_eq!(
            runs(&s).unwrap(),
            vec![(true, 1), (false, 8), (true, 2), (false, 8), (true, 1)]
        );
        assert_eq!(s.live, vec![1..9, 11..19]);
    }

    #[test]
    fn a_whole_group_deleted() {
        let deleted: Vec<u64> = (10..20).collect();
        let s = select_rows(&spans(&[10, 10, 10], &[]), &deleted);
        assert_eq!(
            runs(&s).unwrap(),
            vec![(false, 10), (true, 10), (false, 10)]
        );
        assert_eq!(s.live, vec![0..10, 20..30]);
        // Everything deleted: a selection that skips every row, nothing live.
        let all: Vec<u64> = (0..30).collect();
        let s = select_rows(&spans(&[10, 10, 10], &[]), &all);
        assert_eq!(runs(&s).unwrap(), vec![(true, 30)]);
        assert!(s.live.is_empty());
        assert_eq!(s.row_count(), 0);
    }

    #[test]
    fn deletes_in_pruned_groups_or_out_of_range_are_ignored() {
        let s = select_rows(&spans(&[10, 10, 10], &[1]), &[12, 15, 30, 31, 1_000_000]);
        assert_eq!(s.selection, None);
        assert_eq!(s.live, vec![0..10, 20..30]);
        // Across a pruned group the runs of two kept groups meet.
        let s = select_rows(&spans(&[10, 10, 10], &[1]), &[9, 20]);
        assert_eq!(runs(&s).unwrap(), vec![(false, 9), (true, 2), (false, 9)]);
    }

    #[test]
    fn duplicates_count_once() {
        let s = select_rows(&spans(&[10], &[]), &[2, 2, 2, 5, 5]);
        assert_eq!(
            runs(&s).unwrap(),
            vec![(false, 2), (true, 1), (false, 2), (true, 1), (false, 4)]
        );
        assert_eq!(s.row_count(), 8);
    }

    #[test]
    fn rows_per_group_select_each_group_on_its_own() {
        // Groups of 3, 2 and 4 rows: positions 0-2, 3-4, 5-8; 1 is listed twice, 9 is
        // past the end of the file.
        let groups = rows_per_group(&[3, 2, 4], &[1, 1, 3, 4, 8, 9]);
        let runs = |rows: &GroupRows| match rows {
            GroupRows::Some(selection) => Some(
                selection
                    .iter()
                    .map(|s| (s.skip, s.row_count))
                    .collect::<Vec<_>>(),
            ),
            _ => None,
        };
        assert_eq!(
            runs(&groups[0]),
            Some(vec![(false, 1), (true, 1), (false, 1)])
        );
        assert_eq!(groups[1], GroupRows::None);
        assert_eq!(runs(&groups[2]), Some(vec![(false, 3), (true, 1)]));
        assert_eq!(
            rows_per_group(&[2, 2], &[]),
            [GroupRows::All, GroupRows::All]
        );
    }

    #[test]
    fn no_row_groups_kept() {
        let s = select_rows(&[], &[1, 2, 3]);
        assert_eq!(s.selection, None);
        assert!(s.live.is_empty());
    }

    #[test]
    fn picking_reads_only_the_groups_of_the_wanted_rows() {
        let picked = pick_rows(&[10, 10, 10], &[3, 3, 4, 25, 29, 30, 99]);
        assert_eq!(picked.row_groups, vec![0, 2]);
        assert_eq!(picked.positions, vec![3, 4, 25, 29]);
        let runs: Vec<(bool, usize)> = picked
            .selection
            .iter()
            .map(|s| (s.skip, s.row_count))
            .collect();
        // Group 0: skip 3, take 3 and 4, skip 5 to its end; group 2 (from 20): skip 5
        // (merged with the run before), take 25, skip 3, take 29.
        assert_eq!(
            runs,
            vec![
                (true, 3),
                (false, 2),
                (true, 10),
                (false, 1),
                (true, 3),
                (false, 1)
            ]
        );
        assert_eq!(picked.selection.row_count(), 4);
        let none = pick_rows(&[10], &[10, 11]);
        assert!(none.row_groups.is_empty() && none.positions.is_empty());
    }

    #[test]
    fn positions_are_handed_out_across_ranges() {
        let mut positions = LivePositions::new(vec![0..3, 10..12, 20..25]);
        assert_eq!(positions.take(2).unwrap().values().to_vec(), vec![0, 1]);
        assert_eq!(
            positions.take(4).unwrap().values().to_vec(),
            vec![2, 10, 11, 20]
        );
        assert_eq!(positions.take(0).unwrap().len(), 0);
        assert_eq!(
            positions.take(4).unwrap().values().to_vec(),
            vec![21, 22, 23, 24]
        );
        assert_eq!(positions.take(1), None);
        let mut positions = LivePositions::new(vec![0..1, 1..2]);
        assert_eq!(positions.take(3), None);
    }
}
