//! Which snapshots a table keeps: Iceberg's retention properties, with mink's defaults.

use std::time::Duration;

use iceberg::spec::{TableMetadata, TableProperties};

use crate::error::{LakeError, Result};

/// mink's default `history.expire.max-snapshot-age-ms`: one hour. Iceberg's own default
/// (five days) suits tables committed a few times a day; a mink table commits every
/// `lake.freshness` (30 seconds by default), and five days of that is 14,400 snapshots in
/// every metadata file. mink writes the property on every lake table it creates, so other
/// engines see the same retention.
pub const DEFAULT_MAX_SNAPSHOT_AGE: Duration = Duration::from_secs(3600);

/// How long a snapshot stays readable after a newer one replaced it, whatever its age (up
/// to its table's `history.expire.max-snapshot-age-ms`): a read or a `table_changes`
/// cursor that planned on it just before a round keeps finding its files.
pub const READ_GRACE: Duration = Duration::from_secs(300);

/// What a table's expiry keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Snapshots older than this may expire (`history.expire.max-snapshot-age-ms`).
    pub max_snapshot_age: Duration,
    /// The newest this many snapshots of the main branch never expire
    /// (`history.expire.min-snapshots-to-keep`, at least 1).
    pub min_snapshots_to_keep: usize,
    /// Whether unreferenced files may be deleted (`gc.enabled`): a table whose files
    /// another table may share sets it to `false`, and then nothing is expired or removed.
    pub gc_enabled: bool,
}

impl Retention {
    /// The retention of a table's properties; absent ones take mink's defaults.
    ///
    /// # Errors
    /// [`LakeError::Layout`] for a property that is not a number (or a boolean).
    pub fn of(name: &str, metadata: &TableMetadata) -> Result<Self> {
        let properties = metadata.properties();
        let number = |key: &str| -> Result<Option<u64>> {
            properties
                .get(key)
                .map(|value| {
                    value.trim().parse::<u64>().map_err(|_| {
                        LakeError::layout(
                            name,
                            format!(
                                "table property {key} = '{value}' is not a non-negative integer"
                            ),
                        )
                    })
                })
                .transpose()
        };
        let gc_enabled = match properties.get(TableProperties::PROPERTY_GC_ENABLED) {
            None => TableProperties::PROPERTY_GC_ENABLED_DEFAULT,
            Some(value) => value.trim().to_ascii_lowercase().parse().map_err(|_| {
                LakeError::layout(
                    name,
                    format!("table property gc.enabled = '{value}' is not true or false"),
                )
            })?,
        };
        Ok(Self {
            max_snapshot_age: number(TableProperties::PROPERTY_MAX_SNAPSHOT_AGE_MS)?
                .map_or(DEFAULT_MAX_SNAPSHOT_AGE, Duration::from_millis),
            min_snapshots_to_keep: number(TableProperties::PROPERTY_MIN_SNAPSHOTS_TO_KEEP)?
                .map_or(
                    TableProperties::PROPERTY_MIN_SNAPSHOTS_TO_KEEP_DEFAULT,
                    |n| usize::try_from(n).unwrap_or(usize::MAX),
                )
                .max(1),
            gc_enabled,
        })
    }

    /// How long a replaced snapshot stays readable: [`READ_GRACE`], or the maximum age
    /// when that is shorter.
    pub fn read_grace(&self) -> Duration {
        READ_GRACE.min(self.max_snapshot_age)
    }
}
