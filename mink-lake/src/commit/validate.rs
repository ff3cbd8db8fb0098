//! Checking a commit's added files against the table, before anything is written.
//!
//! iceberg's manifest writer trusts what it is given (and panics on a partition value
//! that does not fit its spec), so every added file is checked first: data files must be
//! data and delete files deletes (equality deletes with equality ids), every file must lie
//! inside the table's location (as every lake file read is checked to, see
//! [`check_table_file`](crate::layout::check_table_file)), no file may be added twice or
//! be both added and removed, and every partition value must fit the table's default
//! partition spec, the spec added files are taken to be of. A failed check is a
//! [`LakeError::Layout`](crate::LakeError::Layout) of the table.

use std::collections::HashSet;

use iceberg::spec::{DataContentType, Struct, StructType, TableMetadata};

use super::SnapshotChanges;
use crate::layout::check_inside;

/// Checks the added files against the table (iceberg's manifest writer panics on a
/// partition value that does not fit its spec).
pub(super) fn validate_added(
    metadata: &TableMetadata,
    changes: &SnapshotChanges,
) -> Result<(), String> {
    let mut paths = HashSet::new();
    for (file, data) in changes
        .added_data_files
        .iter()
        .map(|f| (f, true))
        .chain(changes.added_delete_files.iter().map(|f| (f, false)))
    {
        let path = file.file_path();
        match (data, file.content_type()) {
            (true, DataContentType::Data)
            | (false, DataContentType::PositionDeletes | DataContentType::EqualityDeletes) => {}
            (true, content) => {
                return Err(format!("added data file {path} has content {content:?}"));
            }
            (false, content) => {
                return Err(format!("added delete file {path} has content {content:?}"));
            }
        }
        if file.content_type() == DataContentType::EqualityDeletes
            && file.equality_ids().is_none_or(|ids| ids.is_empty())
        {
            return Err(format!("equality delete file {path} has no equality ids"));
        }
        check_inside(metadata.location(), path)?;
        if !paths.insert(path) {
            return Err(format!("file {path} is added twice"));
        }
        if changes.removed_files.contains(path) {
            return Err(format!("file {path} is both added and removed"));
        }
        let partition_type = metadata.default_partition_type();
        if !partition_fits(file.partition(), partition_type) {
            return Err(format!(
                "file {path} has partition {:?}, which does not fit the table's partition spec",
                file.partition()
            ));
        }
    }
    Ok(())
}

/// Whether every value of `partition` fits its field of `partition_type` (a null fits
/// any field).
fn partition_fits(partition: &Struct, partition_type: &StructType) -> bool {
    partition.fields().len() == partition_type.fields().len()
        && partition
            .iter()
            .zip(partition_type.fields())
            .all(|(value, field)| match value {
                None => true,
                Some(value) => match (
                    field.field_type.as_primitive_type(),
                    value.as_primitive_literal(),
                ) {
                    (Some(ty), Some(literal)) => ty.compatible(&literal),
                    _ => false,
                },
            })
}

#[cfg(test)]
mod tests {
    use iceberg::spec::{Literal, NestedField, PrimitiveType, Type};

    use super::*;

    #[test]
    fn partitions_must_fit_the_spec() {
        let int = StructType::new(vec![
            NestedField::optional(1000, "b", Type::Primitive(PrimitiveType::Int)).into(),
        ]);
        assert!(partition_fits(
            &Struct::from_iter([Some(Literal::int(1))]),
            &int
        ));
        assert!(partition_fits(&Struct::from_iter([None]), &int));
        assert!(!partition_fits(
            &Struct::from_iter([Some(Literal::long(1))]),
            &int
        ));
        assert!(!partition_fits(&Struct::empty(), &int));
    }
}
