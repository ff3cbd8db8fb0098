//! Table options, as written in `CREATE TABLE ... WITH ('bucket.num' = '4', ...)`.
//!
//! | option          | meaning                                             | default          |
//! |-----------------|-----------------------------------------------------|------------------|
//! | `bucket.num`    | number of buckets                                   | `1`              |
//! | `bucket.key`    | comma-separated bucket-key columns                  | PK minus partition keys |
//! | `log.ttl`       | how long log batches are kept (`7d`, `12h`, `30m`)  | kept forever     |
//! | `lake.enabled`  | tier the table into the Iceberg lake                | `false`          |
//! | `lake.freshness`| how often the tiering service runs for the table (at least `1s`) | `30s` |
//!
//! The Iceberg table properties of [`LAKE_PROPERTIES`] are accepted too, and given to the
//! table's lake table when it is created (where every engine sees them):
//!
//! | property                                | meaning                                   | mink's default |
//! |-----------------------------------------|-------------------------------------------|----------------|
//! | `history.expire.max-snapshot-age-ms`    | lake snapshots older than this expire     | `3600000` (1 h)|
//! | `history.expire.min-snapshots-to-keep`  | the newest snapshots never expire         | `1`            |
//! | `commit.manifest.min-count-to-merge`    | a commit merges manifests from this many  | `8`            |
//! | `commit.manifest-merge.enabled`         | whether commits merge manifests           | `true`         |

use std::collections::BTreeMap;
use std::time::Duration;

use crate::{CoreError, Result};

/// The parsed options of a table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableOptions {
    /// Number of buckets, at least 1.
    pub bucket_num: u32,
    /// Explicit bucket key, if given.
    pub bucket_key: Option<Vec<String>>,
    /// Retention of the log; `None` keeps everything.
    pub log_ttl: Option<Duration>,
    /// Whether the table is tiered into the lake.
    pub lake_enabled: bool,
    /// How often a tiering round runs.
    pub lake_freshness: Duration,
    /// Iceberg table properties of the lake table ([`LAKE_PROPERTIES`]).
    pub lake_properties: BTreeMap<String, String>,
}

/// The Iceberg table properties a `WITH` may set, and whether each is a number (else a
/// boolean).
pub const LAKE_PROPERTIES: [(&str, bool); 4] = [
    ("history.expire.max-snapshot-age-ms", true),
    ("history.expire.min-snapshots-to-keep", true),
    ("commit.manifest.min-count-to-merge", true),
    ("commit.manifest-merge.enabled", false),
];

impl Default for TableOptions {
    fn default() -> Self {
        Self {
            bucket_num: 1,
            bucket_key: None,
            log_ttl: None,
            lake_enabled: false,
            lake_freshness: Duration::from_secs(30),
            lake_properties: BTreeMap::new(),
        }
    }
}

impl TableOptions {
    /// Parses the `WITH (...)` map; unknown keys are an error, so a typo is never ignored.
    pub fn from_map(map: &BTreeMap<String, String>) -> Result<Self> {
        let mut options = Self::default();
        for (key, value) in map {
            match key.as_str() {
                "bucket.num" => {
                    options.bucket_num = value
                        .trim()
                        .parse()
                        .ok()
                        .filter(|n| *n >= 1)
                        .ok_or_else(|| invalid(key, value, "a positive integer"))?;
                }
                "bucket.key" => {
                    let columns: Vec<String> = value
                        .split(',')
                        .map(|c| c.trim().to_string())
                        .filter(|c| !c.is_empty())
                        .collect();
                    if columns.is_empty() {
                        return Err(invalid(key, value, "one or more column names"));
                    }
                    options.bucket_key = Some(columns);
                }
                "log.ttl" => {
                    options.log_ttl = Some(
                        parse_duration(value).ok_or_else(|| invalid(key, value, "a duration"))?,
                    );
                }
                "lake.enabled" => {
                    options.lake_enabled = value
                        .trim()
                        .to_ascii_lowercase()
                        .parse()
                        .map_err(|_| invalid(key, value, "true or false"))?;
                }
                "lake.freshness" => {
                    let freshness =
                        parse_duration(value).ok_or_else(|| invalid(key, value, "a duration"))?;
                    options.lake_freshness = check_lake_freshness(freshness)?;
                }
                other => {
                    let value = lake_property(other, value)?;
                    options.lake_properties.insert(other.to_string(), value);
                }
            }
        }
        Ok(options)
    }

    /// Checks options that did not come from a `WITH` map (a descriptor a client sent the
    /// node) as [`TableOptions::from_map`] checks a map: only the Iceberg properties of
    /// [`LAKE_PROPERTIES`], with valid values (returned in their normal form), and a
    /// `lake.freshness` of at least [`MIN_LAKE_FRESHNESS`].
    ///
    /// # Errors
    /// [`CoreError::InvalidTable`] naming the first option that is not accepted.
    pub fn checked(mut self) -> Result<Self> {
        self.lake_freshness = check_lake_freshness(self.lake_freshness)?;
        self.lake_properties = self
            .lake_properties
            .iter()
            .map(|(key, value)| Ok((key.clone(), lake_property(key, value)?)))
            .collect::<Result<_>>()?;
        Ok(self)
    }

    /// The options as a `WITH` map, the inverse of [`TableOptions::from_map`].
    pub fn to_map(&self) -> BTreeMap<String, String> {
        let mut map = BTreeMap::new();
        map.insert("bucket.num".into(), self.bucket_num.to_string());
        if let Some(key) = &self.bucket_key {
            map.insert("bucket.key".into(), key.join(","));
        }
        if let Some(ttl) = self.log_ttl {
            map.insert("log.ttl".into(), format_duration(ttl));
        }
        map.insert("lake.enabled".into(), self.lake_enabled.to_string());
        map.insert(
            "lake.freshness".into(),
            format_duration(self.lake_freshness),
        );
        map.extend(self.lake_properties.clone());
        map
    }
}

/// The shortest `lake.freshness`: every tiering round commits a lake snapshot.
pub const MIN_LAKE_FRESHNESS: Duration = Duration::from_secs(1);

fn check_lake_freshness(freshness: Duration) -> Result<Duration> {
    if freshness < MIN_LAKE_FRESHNESS {
        let value = format_duration(freshness);
        let expected = format!("at least {}", format_duration(MIN_LAKE_FRESHNESS));
        return Err(invalid("lake.freshness", &value, &expected));
    }
    Ok(freshness)
}

/// The value of the Iceberg property `key` in its normal form (a number without leading
/// zeros, `true` or `false`).
///
/// # Errors
/// [`CoreError::InvalidTable`] for a key not in [`LAKE_PROPERTIES`] or a value not of its
/// type.
fn lake_property(key: &str, value: &str) -> Result<String> {
    let Some(&(_, numeric)) = LAKE_PROPERTIES.iter().find(|(k, _)| *k == key) else {
        let properties: Vec<&str> = LAKE_PROPERTIES.iter().map(|(k, _)| *k).collect();
        return Err(CoreError::InvalidTable(format!(
            "unknown table option '{key}' (known: bucket.num, bucket.key, log.ttl, lake.enabled, lake.freshness, {})",
            properties.join(", ")
        )));
    };
    let value = value.trim().to_ascii_lowercase();
    let normal = match numeric {
        true => value.parse::<u64>().map(|n| n.to_string()).ok(),
        false => value.parse::<bool>().map(|b| b.to_string()).ok(),
    };
    normal.ok_or_else(|| {
        let expected = if numeric {
            "a non-negative integer"
        } else {
            "true or false"
        };
        invalid(key, &value, expected)
    })
}

fn invalid(key: &str, value: &str, expected: &str) -> CoreError {
    CoreError::InvalidTable(format!("option '{key}' = '{value}': expected {expected}"))
}

/// Parses `500ms`, `30s`, `5m`, `12h`, `7d` (a bare number is seconds).
pub fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().ok()?;
    let millis_per_unit: u64 = match unit.trim() {
        "ms" => 1,
        "" | "s" => 1_000,
        "m" | "min" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    number
        .checked_mul(millis_per_unit)
        .map(Duration::from_millis)
}

/// Formats a duration in the largest unit that divides it exactly.
pub fn format_duration(duration: Duration) -> String {
    let millis = duration.as_millis();
    for (unit, size) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if millis != 0 && millis.is_multiple_of(size) {
            return format!("{}{unit}", millis / size);
        }
    }
    format!("{millis}ms")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s"), Some(Duration::from_secs(30)));
        assert_eq!(parse_duration("7d"), Some(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("15"), Some(Duration::from_secs(15)));
        assert_eq!(parse_duration("5 m"), Some(Duration::from_secs(300)));
        assert_eq!(parse_duration("x"), None);
        assert_eq!(parse_duration("3w"), None);
        assert_eq!(format_duration(Duration::from_secs(7 * 86_400)), "7d");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1500ms");
    }

    #[test]
    fn options_round_trip() {
        let parsed = TableOptions::from_map(&map(&[
            ("bucket.num", "4"),
            ("bucket.key", "a, b"),
            ("log.ttl", "7d"),
            ("lake.enabled", "TRUE"),
            ("lake.freshness", "10s"),
            ("history.expire.max-snapshot-age-ms", "60000"),
            ("commit.manifest-merge.enabled", "False"),
        ]))
        .unwrap();
        assert_eq!(
            parsed.lake_properties,
            map(&[
                ("commit.manifest-merge.enabled", "false"),
                ("history.expire.max-snapshot-age-ms", "60000"),
            ])
        );
        assert_eq!(parsed.bucket_num, 4);
        assert_eq!(parsed.bucket_key, Some(vec!["a".into(), "b".into()]));
        assert!(parsed.lake_enabled);
        assert_eq!(TableOptions::from_map(&parsed.to_map()).unwrap(), parsed);
    }

    #[test]
    fn bad_options_are_named() {
        let err = TableOptions::from_map(&map(&[("bucket.num", "0")])).unwrap_err();
        assert!(err.to_string().contains("bucket.num"), "{err}");
        let err = TableOptions::from_map(&map(&[("bucket.nmu", "2")])).unwrap_err();
        assert!(
            err.to_string()
                .contains("unknown table option 'bucket.nmu'"),
            "{err}"
        );
        assert!(TableOptions::from_map(&map(&[("lake.enabled", "yes")])).is_err());
        assert!(TableOptions::from_map(&map(&[("lake.freshness", "0s")])).is_err());
        let err = TableOptions::from_map(&map(&[("history.expire.min-snapshots-to-keep", "-1")]))
            .unwrap_err();
        assert!(err.to_string().contains("a non-negative integer"), "{err}");
        assert!(TableOptions::from_map(&map(&[("commit.manifest-merge.enabled", "1")])).is_err());
        let err = TableOptions::from_map(&map(&[("lake.freshness", "999ms")])).unwrap_err();
        assert!(err.to_string().contains("at least 1s"), "{err}");
    }

    #[test]
    fn options_from_elsewhere_are_checked_as_a_map_is() {
        let mut options = TableOptions::default();
        options.lake_properties.insert(
            "history.expire.min-snapshots-to-keep".into(),
            " 0007".into(),
        );
        let checked = options.clone().checked().unwrap();
        assert_eq!(
            checked.lake_properties["history.expire.min-snapshots-to-keep"],
            "7"
        );
        options
            .lake_properties
            .insert("mink.table-id".into(), "42".into());
        let err = options.checked().unwrap_err();
        assert!(
            err.to_string()
                .contains("unknown table option 'mink.table-id'"),
            "{err}"
        );
        let instant = TableOptions {
            lake_freshness: Duration::ZERO,
            ..TableOptions::default()
        };
        let err = instant.checked().unwrap_err();
        assert!(
            err.to_string().contains("'lake.freshness' = '0ms'"),
            "{err}"
        );
    }
}
