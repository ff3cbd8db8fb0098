//! The snapshot summary: what a snapshot adds and removes, and the table's totals after it.
//!
//! Every Iceberg snapshot carries a summary of string properties. Java's Iceberg
//! (`SnapshotSummary`) fills in two kinds, and mink's commits do the same, so that a tool
//! reading the summary sees the numbers it expects:
//!
//! - counts of this snapshot (`added-data-files`, `deleted-records`,
//!   `removed-position-deletes`, `changed-partition-count`, ...), present where positive;
//! - totals of the table (`total-records`, `total-delete-files`, ...): the parent's
//!   totals (0 where absent) plus what this snapshot adds, minus what it removes.
//!
//! [`Metrics`] counts the files while the manifests are written; [`summarize`] turns the
//! counts into the summary. Both are pure.

use std::collections::{HashMap, HashSet};

use iceberg::spec::{DataContentType, DataFile, Operation, Struct, Summary};
use tracing::warn;

/// What a snapshot adds and removes, counted as Iceberg's summary counts it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Metrics {
    added: Counts,
    removed: Counts,
    changed_partitions: HashSet<Struct>,
}

/// The files a snapshot adds (or removes), with their rows and bytes.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Counts {
    files_size: u64,
    data_files: u64,
    records: u64,
    position_delete_files: u64,
    equality_delete_files: u64,
    position_deletes: u64,
    equality_deletes: u64,
}

impl Metrics {
    /// Counts a file the snapshot adds.
    pub(super) fn add(&mut self, file: &DataFile) {
        self.added.count(file);
        self.touch(file);
    }

    /// Counts a live file the snapshot removes.
    pub(super) fn remove(&mut self, file: &DataFile) {
        self.removed.count(file);
        self.touch(file);
    }

    fn touch(&mut self, file: &DataFile) {
        if !file.partition().fields().is_empty() {
            self.changed_partitions.insert(file.partition().clone());
        }
    }
}

impl Counts {
    fn count(&mut self, file: &DataFile) {
        self.files_size += file.file_size_in_bytes();
        let (files, rows) = match file.content_type() {
            DataContentType::Data => (&mut self.data_files, &mut self.records),
            DataContentType::PositionDeletes => {
                (&mut self.position_delete_files, &mut self.position_deletes)
            }
            DataContentType::EqualityDeletes => {
                (&mut self.equality_delete_files, &mut self.equality_deletes)
            }
        };
        *files += 1;
        *rows += file.record_count();
    }

    fn delete_files(&self) -> u64 {
        self.position_delete_files + self.equality_delete_files
    }
}

/// The snapshot summary: `properties`, then this snapshot's counts (where positive) and
/// the table's totals (the parent's totals, 0 where absent, plus or minus the counts).
pub(super) fn summarize(
    operation: Operation,
    properties: HashMap<String, String>,
    metrics: &Metrics,
    parent: Option<&Summary>,
) -> Summary {
    let mut summary = properties;
    let (added, removed) = (&metrics.added, &metrics.removed);
    let counts = [
        ("added-files-size", added.files_size),
        ("removed-files-size", removed.files_size),
        ("added-data-files", added.data_files),
        ("deleted-data-files", removed.data_files),
        ("added-records", added.records),
        ("deleted-records", removed.records),
        ("added-delete-files", added.delete_files()),
        ("removed-delete-files", removed.delete_files()),
        ("added-position-delete-files", added.position_delete_files),
        (
            "removed-position-delete-files",
            removed.position_delete_files,
        ),
        ("added-equality-delete-files", added.equality_delete_files),
        (
            "removed-equality-delete-files",
            removed.equality_delete_files,
        ),
        ("added-position-deletes", added.position_deletes),
        ("removed-position-deletes", removed.position_deletes),
        ("added-equality-deletes", added.equality_deletes),
        ("removed-equality-deletes", removed.equality_deletes),
        (
            "changed-partition-count",
            metrics.changed_partitions.len() as u64,
        ),
    ];
    for (key, value) in counts {
        if value > 0 {
            summary.insert(key.to_string(), value.to_string());
        } else {
            summary.remove(key);
        }
    }
    let totals = [
        ("total-data-files", added.data_files, removed.data_files),
        (
            "total-delete-files",
            added.delete_files(),
            removed.delete_files(),
        ),
        ("total-records", added.records, removed.records),
        ("total-files-size", added.files_size, removed.files_size),
        (
            "total-position-deletes",
            added.position_deletes,
            removed.position_deletes,
        ),
        (
            "total-equality-deletes",
            added.equality_deletes,
            removed.equality_deletes,
        ),
    ];
    for (key, added, removed) in totals {
        let previous = parent.and_then(|s| s.additional_properties.get(key));
        let previous = match previous.map(|v| v.parse::<u64>()) {
            None => 0,
            Some(Ok(total)) => total,
            Some(Err(_)) => {
                warn!(property = key, value = ?previous, "malformed total in the parent snapshot's summary; left out");
                summary.remove(key);
                continue;
            }
        };
        // A total another engine's summary set near u64::MAX stays there, never wraps.
        let total = previous
            .saturating_add(added)
            .checked_sub(removed)
            .unwrap_or_else(|| {
                warn!(
                    property = key,
                    previous, added, removed, "total below zero; the parent's summary undercounts"
                );
                0
            });
        summary.insert(key.to_string(), total.to_string());
    }
    Summary {
        operation,
        additional_properties: summary,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use iceberg::spec::{DataFileBuilder, DataFileFormat, Literal};

    use super::*;

    fn file(content: DataContentType, path: &str, rows: u64, size: u64, bucket: i32) -> DataFile {
        let mut builder = DataFileBuilder::default();
        builder
            .content(content)
            .file_path(path.to_string())
            .file_format(DataFileFormat::Parquet)
            .partition(Struct::from_iter([Some(Literal::int(bucket))]))
            .record_count(rows)
            .file_size_in_bytes(size);
        if content == DataContentType::EqualityDeletes {
            builder.equality_ids(Some(vec![1]));
        }
        builder.build().unwrap()
    }

    fn props(summary: &Summary) -> BTreeMap<&str, &str> {
        summary
            .additional_properties
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    }

    #[test]
    fn first_append_counts_from_zero() {
        let mut metrics = Metrics::default();
        metrics.add(&file(DataContentType::Data, "a", 10, 100, 0));
        metrics.add(&file(DataContentType::Data, "b", 5, 50, 1));
        let summary = summarize(
            Operation::Append,
            HashMap::from([("mink.bucket-offsets".into(), "{}".into())]),
            &metrics,
            None,
        );
        assert_eq!(summary.operation, Operation::Append);
        assert_eq!(
            props(&summary),
            BTreeMap::from([
                ("added-data-files", "2"),
                ("added-files-size", "150"),
                ("added-records", "15"),
                ("changed-partition-count", "2"),
                ("mink.bucket-offsets", "{}"),
                ("total-data-files", "2"),
                ("total-delete-files", "0"),
                ("total-equality-deletes", "0"),
                ("total-files-size", "150"),
                ("total-position-deletes", "0"),
                ("total-records", "15"),
            ])
        );
    }

    #[test]
    fn a_total_near_the_top_stays_there() {
        let mut metrics = Metrics::default();
        metrics.add(&file(DataContentType::Data, "a", 10, 100, 0));
        let parent = Summary {
            operation: Operation::Append,
            additional_properties: HashMap::from([(
                "total-records".to_string(),
                u64::MAX.to_string(),
            )]),
        };
        let summary = summarize(Operation::Append, HashMap::new(), &metrics, Some(&parent));
        assert_eq!(props(&summary)["total-records"], u64::MAX.to_string());
    }

    #[test]
    fn deletes_and_removals_move_the_parent_totals() {
        let parent = Summary {
            operation: Operation::Append,
            additional_properties: HashMap::from([
                ("total-data-files".into(), "4".into()),
                ("total-delete-files".into(), "1".into()),
                ("total-records".into(), "100".into()),
                ("total-files-size".into(), "1000".into()),
                ("total-position-deletes".into(), "3".into()),
                ("added-data-files".into(), "4".into()),
            ]),
        };
        let mut metrics = Metrics::default();
        metrics.add(&file(DataContentType::Data, "new", 20, 200, 0));
        metrics.add(&file(DataContentType::PositionDeletes, "pd", 2, 10, 0));
        metrics.add(&file(DataContentType::EqualityDeletes, "ed", 4, 20, 1));
        metrics.remove(&file(DataContentType::Data, "old", 25, 300, 0));
        metrics.remove(&file(DataContentType::PositionDeletes, "old-pd", 3, 30, 0));
        let summary = summarize(Operation::Replace, HashMap::new(), &metrics, Some(&parent));
        let p = props(&summary);
        assert_eq!(p["added-data-files"], "1");
        assert_eq!(p["deleted-data-files"], "1");
        assert_eq!(p["deleted-records"], "25");
        assert_eq!(p["added-delete-files"], "2");
        assert_eq!(p["removed-delete-files"], "1");
        assert_eq!(p["added-position-deletes"], "2");
        assert_eq!(p["removed-position-deletes"], "3");
        assert_eq!(p["added-equality-deletes"], "4");
        assert_eq!(p["changed-partition-count"], "2");
        assert_eq!(p["total-data-files"], "4");
        assert_eq!(p["total-delete-files"], "2");
        assert_eq!(p["total-records"], "95");
        assert_eq!(p["total-files-size"], "900");
        assert_eq!(p["total-position-deletes"], "2");
        assert_eq!(p["total-equality-deletes"], "4");
    }

    #[test]
    fn computed_counts_override_properties_and_bad_totals_are_left_out() {
        let parent = Summary {
            operation: Operation::Append,
            additional_properties: HashMap::from([("total-records".into(), "many".into())]),
        };
        let mut metrics = Metrics::default();
        metrics.add(&file(DataContentType::Data, "a", 1, 1, 0));
        let summary = summarize(
            Operation::Append,
            HashMap::from([
                ("added-records".into(), "999".into()),
                ("deleted-records".into(), "7".into()),
                ("total-records".into(), "5".into()),
            ]),
            &metrics,
            Some(&parent),
        );
        let p = props(&summary);
        assert_eq!(p["added-records"], "1");
        assert!(!p.contains_key("deleted-records"));
        assert!(!p.contains_key("total-records"));
        assert_eq!(p["total-data-files"], "1");
    }
}
