//! The per-bucket log offsets a lake snapshot was tiered up to.
//!
//! Every tiering round's Iceberg snapshot carries, in its summary property
//! `mink.bucket-offsets`, a JSON object from bucket to the log offset tiered up to
//! (exclusive): `{"0": 1200, "1": 977}`, or for partitioned tables
//! `{"dt=2024-01-01/0": 300, ...}`. The map is complete (every bucket tiered so far), so
//! the latest snapshot alone says where each bucket's seam is, and recovery after a crash
//! between the Iceberg commit and mink's own record of it needs nothing else.

use std::collections::BTreeMap;

use mink_core::protocol::BucketId;

use crate::error::{LakeError, Result};

/// The snapshot summary property holding the offsets.
pub const BUCKET_OFFSETS_PROPERTY: &str = "mink.bucket-offsets";

/// Bucket -> log offset tiered up to (exclusive).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BucketOffsets(BTreeMap<String, i64>);

impl BucketOffsets {
    /// The key of a bucket in the map.
    pub fn key(bucket: &BucketId) -> String {
        match &bucket.partition {
            Some(partition) => format!("{partition}/{}", bucket.bucket),
            None => bucket.bucket.to_string(),
        }
    }

    /// The offset a bucket was tiered up to (0 when it never was).
    pub fn get(&self, bucket: &BucketId) -> i64 {
        self.0.get(&Self::key(bucket)).copied().unwrap_or(0)
    }

    /// Records that a bucket is tiered up to `offset`.
    pub fn set(&mut self, bucket: &BucketId, offset: i64) {
        self.0.insert(Self::key(bucket), offset);
    }

    /// Every `(bucket key, offset)`.
    pub fn iter(&self) -> impl Iterator<Item = (&str, i64)> {
        self.0.iter().map(|(k, v)| (k.as_str(), *v))
    }

    /// Every bucket's seam: `(partition, bucket, offset)`; keys that name no bucket are
    /// skipped.
    pub fn seams(&self) -> impl Iterator<Item = (Option<&str>, u32, i64)> {
        self.0.iter().filter_map(|(key, offset)| {
            let (partition, bucket) = match key.rsplit_once('/') {
                Some((partition, bucket)) => (Some(partition), bucket),
                None => (None, key.as_str()),
            };
            Some((partition, bucket.parse().ok()?, *offset))
        })
    }

    /// The JSON form stored in a snapshot summary.
    pub fn to_json(&self) -> String {
        serde_json::to_string(&self.0).expect("a map of strings to integers serializes")
    }

    /// Parses the JSON form.
    pub fn from_json(json: &str) -> Result<Self> {
        serde_json::from_str(json).map(Self).map_err(|e| {
            LakeError::Config(format!("malformed {BUCKET_OFFSETS_PROPERTY} '{json}': {e}"))
        })
    }
}

impl FromIterator<(String, i64)> for BucketOffsets {
    fn from_iter<T: IntoIterator<Item = (String, i64)>>(iter: T) -> Self {
        Self(iter.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use mink_core::table::TablePath;

    use super::*;

    #[test]
    fn seams_name_their_buckets() {
        let mut offsets = BucketOffsets::default();
        let table = mink_core::table::TablePath::new("db", "t");
        offsets.set(&BucketId::new(&table, 2), 7);
        let mut partitioned = BucketId::new(&table, 1);
        partitioned.partition = Some("dt=2024-01-01".into());
        offsets.set(&partitioned, 9);
        let seams: Vec<_> = offsets.seams().collect();
        assert_eq!(seams, vec![(None, 2, 7), (Some("dt=2024-01-01"), 1, 9)]);
    }

    #[test]
    fn round_trips_through_json() {
        let path = TablePath::new("db", "t");
        let mut offsets = BucketOffsets::default();
        offsets.set(&BucketId::new(&path, 0), 1200);
        let mut partitioned = BucketId::new(&path, 1);
        partitioned.partition = Some("dt=2024-01-01".into());
        offsets.set(&partitioned, 7);
        let json = offsets.to_json();
        assert_eq!(json, r#"{"0":1200,"dt=2024-01-01/1":7}"#);
        let parsed = BucketOffsets::from_json(&json).unwrap();
        assert_eq!(parsed, offsets);
        assert_eq!(parsed.get(&partitioned), 7);
        assert_eq!(parsed.get(&BucketId::new(&path, 5)), 0);
        assert!(BucketOffsets::from_json("[1]").is_err());
    }
}
