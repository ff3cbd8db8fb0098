//! The commit of a catalog whose tables' metadata locations mink swaps itself (the SQL
//! catalog's database, etcd): mink writes a table's next metadata as a file beside the
//! current one, and the catalog swaps the table's location to it only if it still names
//! the one the commit was built on.

use std::str::FromStr;

use iceberg::spec::TableMetadata;
use iceberg::table::Table;
use iceberg::{MetadataLocation, TableIdent};

use super::Swap;
use crate::error::{LakeError, Result};
use crate::writer::delete_files;

/// A catalog whose tables' metadata locations mink swaps itself: the commit of a table's
/// next metadata, which mink wrote as a file beside the current one.
#[async_trait::async_trait]
pub(crate) trait MetadataSwap: std::fmt::Debug + Send + Sync {
    /// Swaps a table's metadata location from `expected` to `new`; false when it was no
    /// longer `expected`. Durable once it returns.
    ///
    /// # Errors
    /// The catalog failed: the swap may have happened or not (see
    /// [`MetadataSwap::metadata_location`]).
    async fn swap(&self, table: &TableIdent, expected: &str, new: &str) -> Result<bool>;

    /// A table's metadata location (None: no such table).
    ///
    /// # Errors
    /// The catalog failed.
    async fn metadata_location(&self, table: &TableIdent) -> Result<Option<String>>;
}

/// Publishes `next` as the metadata of `current`'s table through `swaps`: writes it as
/// the next metadata file beside the current one and swaps the location in. A lost swap
/// deletes the file again.
pub(super) async fn publish_by_swap(
    swaps: &dyn MetadataSwap,
    current: &Table,
    next: TableMetadata,
) -> Swap {
    let written = async {
        let current_location = current.metadata_location_result()?;
        let location = MetadataLocation::from_str(current_location)?
            .with_next_version()
            .with_new_metadata(&next);
        next.write_to(current.file_io(), &location).await?;
        Ok::<_, LakeError>((current_location.to_string(), location.to_string()))
    };
    let (expected, new_location) = match written.await {
        Ok(locations) => locations,
        Err(error) => return Swap::Lost(error),
    };
    let ident = current.identifier();
    let swap = match swaps.swap(ident, &expected, &new_location).await {
        Ok(true) => Swap::Committed(Box::new(next), new_location.clone()),
        Ok(false) => Swap::Lost(LakeError::CommitConflict {
            table: ident.to_string(),
            message: "another commit replaced the table's metadata first".into(),
        }),
        Err(error) => match swaps.metadata_location(ident).await {
            // The swap went through after all.
            Ok(Some(location)) if location == new_location => {
                Swap::Committed(Box::new(next), new_location.clone())
            }
            Ok(_) => Swap::Lost(error),
            Err(_) => Swap::Unknown(error),
        },
    };
    if matches!(swap, Swap::Lost(_)) {
        // Best effort (failures are logged): the error to report is the swap's.
        let _ = delete_files(current, std::slice::from_ref(&new_location)).await;
    }
    swap
}
