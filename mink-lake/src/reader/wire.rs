//! Splits on the wire: the node plans a bucket's split (it holds the catalog) and an
//! engine reading the lake itself gets the files to read in a `plan_union` answer (or
//! each bucket's in a `plan_table_union` answer).

use mink_core::protocol::{LakeDeleteRef, LakeFileRef};

use super::{DeleteKind, LakeDeleteFile, LakeFile, LakeSplit};

impl From<&LakeFile> for LakeFileRef {
    fn from(file: &LakeFile) -> Self {
        Self {
            path: file.path.clone(),
            size: file.size,
            record_count: file.record_count,
            deletes: file.deletes.iter().map(LakeDeleteRef::from).collect(),
            replaced_rows: file.replaced_rows.clone(),
        }
    }
}

impl From<&LakeDeleteFile> for LakeDeleteRef {
    fn from(delete: &LakeDeleteFile) -> Self {
        Self {
            path: delete.path.clone(),
            size: delete.size,
            equality_columns: match &delete.kind {
                DeleteKind::Positions => Vec::new(),
                DeleteKind::Equality { columns } => columns.clone(),
            },
        }
    }
}

impl From<LakeFileRef> for LakeFile {
    fn from(file: LakeFileRef) -> Self {
        Self {
            path: file.path,
            size: file.size,
            record_count: file.record_count,
            // Only planning needs it; a split read from the wire is only read.
            partition: None,
            deletes: file.deletes.into_iter().map(LakeDeleteFile::from).collect(),
            replaced_rows: file.replaced_rows,
        }
    }
}

impl From<LakeDeleteRef> for LakeDeleteFile {
    fn from(delete: LakeDeleteRef) -> Self {
        Self {
            path: delete.path,
            size: delete.size,
            kind: match delete.equality_columns.is_empty() {
                true => DeleteKind::Positions,
                false => DeleteKind::Equality {
                    columns: delete.equality_columns,
                },
            },
        }
    }
}

impl LakeSplit {
    /// The split of a `plan_union` answer (or of an entry of `plan_table_union`'s).
    pub fn from_wire(snapshot_id: Option<i64>, files: Vec<LakeFileRef>) -> Self {
        Self {
            snapshot_id,
            files: files.into_iter().map(LakeFile::from).collect(),
        }
    }

    /// The files of the split, for a `plan_union` answer (or a `plan_table_union` entry).
    pub fn to_wire(&self) -> Vec<LakeFileRef> {
        self.files.iter().map(LakeFileRef::from).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_round_trip_through_the_wire() {
        let split = LakeSplit {
            snapshot_id: Some(3),
            files: vec![LakeFile {
                path: "/w/t/data/bucket=1/a.parquet".into(),
                size: 100,
                record_count: Some(9),
                partition: None,
                deletes: vec![
                    LakeDeleteFile {
                        path: "/w/t/data/bucket=1/p.parquet".into(),
                        size: 10,
                        kind: DeleteKind::Positions,
                    },
                    LakeDeleteFile {
                        path: "/w/t/data/bucket=1/e.parquet".into(),
                        size: 11,
                        kind: DeleteKind::Equality {
                            columns: vec!["id".into(), "dt".into()],
                        },
                    },
                ],
                replaced_rows: vec![2, 5],
            }],
        };
        assert_eq!(LakeSplit::from_wire(Some(3), split.to_wire()), split);
    }
}
