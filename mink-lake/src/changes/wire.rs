//! Change plans on the wire: the node plans the changes of a table's lake (it holds the
//! catalog) and an engine reading the changed rows itself gets them in a
//! `plan_table_changes` answer.

use iceberg::spec::Operation;
use mink_core::CoreError;
use mink_core::protocol::{LakeDeleteRef, LakeFileRef, LakeSnapshotChanges, TableChangesPlan};

use super::{AddedFile, ChangedSnapshot, ChangesPlan};
use crate::error::Result;
use crate::reader::LakeDeleteFile;

impl ChangesPlan {
    /// The plan as a `plan_table_changes` answer.
    pub fn to_wire(&self) -> TableChangesPlan {
        TableChangesPlan {
            from_snapshot_id: self.from_snapshot_id,
            to_snapshot_id: self.to_snapshot_id,
            snapshots: self
                .snapshots
                .iter()
                .map(|snapshot| LakeSnapshotChanges {
                    snapshot_id: snapshot.snapshot_id,
                    operation: snapshot.operation.as_str().to_string(),
                    data_files: snapshot
                        .added_files
                        .iter()
                        .map(|file| LakeFileRef {
                            path: file.path.clone(),
                            size: file.size,
                            record_count: Some(file.record_count),
                            deletes: Vec::new(),
                            replaced_rows: Vec::new(),
                        })
                        .collect(),
                    delete_files: snapshot
                        .delete_files
                        .iter()
                        .map(LakeDeleteRef::from)
                        .collect(),
                    removed_files: snapshot.removed_files,
                    sequence_number: snapshot.sequence_number,
                })
                .collect(),
        }
    }

    /// The plan of a `plan_table_changes` answer.
    ///
    /// # Errors
    /// [`crate::LakeError::Core`] for an operation Iceberg does not have.
    pub fn from_wire(plan: TableChangesPlan) -> Result<Self> {
        let snapshots = plan
            .snapshots
            .into_iter()
            .map(|snapshot| {
                Ok(ChangedSnapshot {
                    snapshot_id: snapshot.snapshot_id,
                    sequence_number: snapshot.sequence_number,
                    operation: operation(&snapshot.operation)?,
                    added_files: snapshot
                        .data_files
                        .into_iter()
                        .map(|file| AddedFile {
                            path: file.path,
                            size: file.size,
                            record_count: file.record_count.unwrap_or_default(),
                        })
                        .collect(),
                    delete_files: snapshot
                        .delete_files
                        .into_iter()
                        .map(LakeDeleteFile::from)
                        .collect(),
                    removed_files: snapshot.removed_files,
                })
            })
            .collect::<Result<_>>()?;
        Ok(Self {
            from_snapshot_id: plan.from_snapshot_id,
            to_snapshot_id: plan.to_snapshot_id,
            snapshots,
        })
    }
}

fn operation(name: &str) -> Result<Operation> {
    Ok(match name {
        "append" => Operation::Append,
        "overwrite" => Operation::Overwrite,
        "delete" => Operation::Delete,
        "replace" => Operation::Replace,
        other => {
            return Err(CoreError::InvalidRequest(format!(
                "unknown snapshot operation '{other}' in a table changes plan"
            ))
            .into());
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reader::DeleteKind;

    #[test]
    fn plans_round_trip_through_the_wire() {
        let plan = ChangesPlan {
            from_snapshot_id: 1,
            to_snapshot_id: 3,
            snapshots: vec![
                ChangedSnapshot {
                    snapshot_id: 2,
                    sequence_number: 2,
                    operation: Operation::Overwrite,
                    added_files: vec![AddedFile {
                        path: "/w/t/data/bucket=0/a.parquet".into(),
                        size: 100,
                        record_count: 4,
                    }],
                    delete_files: vec![
                        LakeDeleteFile {
                            path: "/w/t/data/bucket=0/p.parquet".into(),
                            size: 10,
                            kind: DeleteKind::Positions,
                        },
                        LakeDeleteFile {
                            path: "/w/t/data/e.parquet".into(),
                            size: 11,
                            kind: DeleteKind::Equality {
                                columns: vec!["id".into()],
                            },
                        },
                    ],
                    removed_files: 0,
                },
                ChangedSnapshot {
                    snapshot_id: 3,
                    sequence_number: 3,
                    operation: Operation::Replace,
                    added_files: vec![],
                    delete_files: vec![],
                    removed_files: 0,
                },
            ],
        };
        assert_eq!(ChangesPlan::from_wire(plan.to_wire()).unwrap(), plan);
        let mut bad = plan.to_wire();
        bad.snapshots[0].operation = "merge".into();
        let err = ChangesPlan::from_wire(bad).unwrap_err();
        assert!(err.to_string().contains("'merge'"), "{err}");
    }
}
