//! Table descriptors and schema versions.
//!
//! A table is addressed by a [`TablePath`] (`database.name`). Its schema evolves by adding
//! columns: every change creates a new [`SchemaVersion`] with the next `schema_id`, and
//! batches in the log keep the `schema_id` they were written with. Readers normalize older
//! batches to the current schema (see [`crate::schema`]).
//!
//! A table with a primary key is a *primary-key table* (upserts and deletes, a KV store per
//! bucket); one without is a *log table* (append only). Rows are spread over `bucket.num`
//! buckets by the bucket key (see [`crate::bucket`]); a log table without a bucket key is
//! written round robin.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use arrow::datatypes::{Field, Schema, SchemaRef};

use crate::options::TableOptions;
use crate::{CoreError, Result};

/// The database a table lives in when none is named.
pub const DEFAULT_DATABASE: &str = "default";

/// `database.name`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TablePath {
    /// The database (namespace).
    pub database: String,
    /// The table name within the database.
    pub name: String,
}

/// Whether `name` is a name mink accepts where it becomes part of paths and keys
/// (databases, tables, a cluster's node ids): not empty, letters, digits, `_` and `-`.
pub fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

impl TablePath {
    /// A path from its two parts.
    pub fn new(database: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            database: database.into(),
            name: name.into(),
        }
    }

    /// Parses `t` (in the default database) or `db.t`.
    pub fn parse(text: &str) -> Result<Self> {
        let parts: Vec<&str> = text.split('.').collect();
        let path = match parts.as_slice() {
            [name] => Self::new(DEFAULT_DATABASE, *name),
            [database, name] => Self::new(*database, *name),
            _ => {
                return Err(CoreError::InvalidRequest(format!(
                    "table name '{text}' must be 'table' or 'database.table'"
                )));
            }
        };
        path.validate()?;
        Ok(path)
    }

    /// `database.name`, checked to be valid names (letters, digits, `_` and `-`).
    pub fn checked(database: &str, name: &str) -> Result<Self> {
        let path = Self::new(database, name);
        path.validate()?;
        Ok(path)
    }

    fn validate(&self) -> Result<()> {
        for part in [&self.database, &self.name] {
            if !is_plain_name(part) {
                return Err(CoreError::InvalidRequest(format!(
                    "'{part}' is not a valid database or table name (letters, digits, '_' and '-')"
                )));
            }
        }
        Ok(())
    }
}

impl fmt::Display for TablePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.database, self.name)
    }
}

/// One version of a table's schema.
#[derive(Debug, Clone, PartialEq)]
pub struct SchemaVersion {
    /// Increases by one with every schema change, starting at 0.
    pub schema_id: u32,
    /// The columns of this version.
    pub schema: SchemaRef,
}

/// Everything the node and its clients know about a table.
#[derive(Debug, Clone, PartialEq)]
pub struct TableDescriptor {
    /// Assigned by the node at creation; distinguishes a re-created table from its
    /// predecessor of the same name.
    pub table_id: u64,
    /// `database.name`.
    pub path: TablePath,
    /// Every schema version, oldest first; the last one is current.
    pub schemas: Vec<SchemaVersion>,
    /// Primary-key columns; empty for a log table.
    pub primary_key: Vec<String>,
    /// Partition-key columns; each distinct value combination is one partition.
    pub partition_keys: Vec<String>,
    /// Bucket-key columns; empty means round robin (log tables only).
    pub bucket_key: Vec<String>,
    /// Number of buckets per partition.
    pub bucket_num: u32,
    /// Retention of the log.
    pub log_ttl: Option<Duration>,
    /// Whether the table is tiered into the lake.
    pub lake_enabled: bool,
    /// How often a tiering round runs.
    pub lake_freshness: Duration,
    /// Iceberg table properties the lake table is created with
    /// ([`crate::options::LAKE_PROPERTIES`]).
    pub lake_properties: BTreeMap<String, String>,
}

impl TableDescriptor {
    /// Validates a new table definition and derives its defaults: primary-key columns
    /// become NOT NULL; the bucket key defaults to the primary key minus the partition
    /// keys. The returned descriptor has `table_id` 0 and schema version 0.
    pub fn new(
        path: TablePath,
        schema: Schema,
        primary_key: Vec<String>,
        partition_keys: Vec<String>,
        options: TableOptions,
    ) -> Result<Self> {
        path.validate()?;
        check_unique_columns(&schema)?;
        if schema.fields().is_empty() {
            return Err(CoreError::InvalidTable(
                "a table needs at least one column".into(),
            ));
        }
        for (what, columns) in [
            ("primary key", &primary_key),
            ("partition key", &partition_keys),
        ] {
            check_columns_exist(&schema, what, columns)?;
        }
        if let Some(missing) = partition_keys
            .iter()
            .find(|c| !primary_key.is_empty() && !primary_key.contains(c))
        {
            return Err(CoreError::InvalidTable(format!(
                "partition key '{missing}' must be part of the primary key"
            )));
        }
        let bucket_key = match options.bucket_key {
            Some(key) => key,
            None => primary_key
                .iter()
                .filter(|c| !partition_keys.contains(c))
                .cloned()
                .collect(),
        };
        check_columns_exist(&schema, "bucket key", &bucket_key)?;
        if !primary_key.is_empty() {
            if bucket_key.is_empty() {
                return Err(CoreError::InvalidTable(
                    "a primary-key table needs a primary key beyond its partition keys".into(),
                ));
            }
            if let Some(outside) = bucket_key
                .iter()
                .find(|c| !primary_key.contains(c) || partition_keys.contains(c))
            {
                return Err(CoreError::InvalidTable(format!(
                    "bucket key '{outside}' must be a primary-key column that is not a partition key"
                )));
            }
        }
        let fields: Vec<Field> = schema
            .fields()
            .iter()
            .map(|f| {
                let in_key = primary_key.contains(f.name());
                f.as_ref().clone().with_nullable(f.is_nullable() && !in_key)
            })
            .collect();
        let schema = Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()));
        Ok(Self {
            table_id: 0,
            path,
            schemas: vec![SchemaVersion {
                schema_id: 0,
                schema,
            }],
            primary_key,
            partition_keys,
            bucket_key,
            bucket_num: options.bucket_num,
            log_ttl: options.log_ttl,
            lake_enabled: options.lake_enabled,
            lake_freshness: options.lake_freshness,
            lake_properties: options.lake_properties,
        })
    }

    /// The current schema version.
    pub fn current(&self) -> &SchemaVersion {
        self.schemas
            .last()
            .expect("a descriptor always has at least one schema version")
    }

    /// The current schema.
    pub fn schema(&self) -> &SchemaRef {
        &self.current().schema
    }

    /// The schema version with the given id.
    pub fn schema_version(&self, schema_id: u32) -> Result<&SchemaVersion> {
        self.schemas
            .iter()
            .find(|v| v.schema_id == schema_id)
            .ok_or_else(|| {
                CoreError::InvalidRequest(format!(
                    "table {} has no schema version {schema_id}",
                    self.path
                ))
            })
    }

    /// Whether the table has a primary key.
    pub fn has_primary_key(&self) -> bool {
        !self.primary_key.is_empty()
    }

    /// Whether the table is partitioned.
    pub fn is_partitioned(&self) -> bool {
        !self.partition_keys.is_empty()
    }

    /// The options this descriptor was created with, as a `WITH` map would state them.
    pub fn options(&self) -> TableOptions {
        TableOptions {
            bucket_num: self.bucket_num,
            bucket_key: (!self.bucket_key.is_empty()).then(|| self.bucket_key.clone()),
            log_ttl: self.log_ttl,
            lake_enabled: self.lake_enabled,
            lake_freshness: self.lake_freshness,
            lake_properties: self.lake_properties.clone(),
        }
    }

    /// Indexes of the given columns in the current schema.
    pub fn column_indices(&self, columns: &[String]) -> Result<Vec<usize>> {
        columns
            .iter()
            .map(|c| {
                self.schema().index_of(c).map_err(|_| {
                    CoreError::InvalidRequest(format!("table {} has no column '{c}'", self.path))
                })
            })
            .collect()
    }

    /// A copy with one more schema version holding `field` as its last column.
    /// Added columns must be nullable: older rows have no value for them.
    pub fn with_added_column(&self, field: Field) -> Result<Self> {
        if self.schema().field_with_name(field.name()).is_ok() {
            return Err(CoreError::InvalidTable(format!(
                "table {} already has a column '{}'",
                self.path,
                field.name()
            )));
        }
        if !field.is_nullable() {
            return Err(CoreError::InvalidTable(format!(
                "added column '{}' must be nullable: existing rows have no value for it",
                field.name()
            )));
        }
        let current = self.current();
        let mut fields: Vec<Field> = current
            .schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        fields.push(field);
        let mut evolved = self.clone();
        evolved.schemas.push(SchemaVersion {
            schema_id: current.schema_id + 1,
            schema: Arc::new(Schema::new_with_metadata(
                fields,
                current.schema.metadata().clone(),
            )),
        });
        Ok(evolved)
    }
}

fn check_unique_columns(schema: &Schema) -> Result<()> {
    let mut seen = std::collections::HashSet::new();
    for field in schema.fields() {
        if !seen.insert(field.name().as_str()) {
            return Err(CoreError::InvalidTable(format!(
                "column '{}' is defined twice",
                field.name()
            )));
        }
    }
    Ok(())
}

fn check_columns_exist(schema: &Schema, what: &str, columns: &[String]) -> Result<()> {
    let mut seen = std::collections::HashSet::new();
    for column in columns {
        if schema.field_with_name(column).is_err() {
            return Err(CoreError::InvalidTable(format!(
                "{what} column '{column}' is not a column of the table"
            )));
        }
        if !seen.insert(column) {
            return Err(CoreError::InvalidTable(format!(
                "{what} names column '{column}' twice"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use arrow::datatypes::DataType;

    use super::*;

    fn schema() -> Schema {
        Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("dt", DataType::Utf8, true),
            Field::new("v", DataType::Float64, true),
        ])
    }

    fn path() -> TablePath {
        TablePath::parse("t").unwrap()
    }

    #[test]
    fn paths() {
        assert_eq!(TablePath::parse("t").unwrap().to_string(), "default.t");
        assert_eq!(TablePath::parse("db.t").unwrap(), TablePath::new("db", "t"));
        assert!(TablePath::parse("a.b.c").is_err());
        assert!(TablePath::parse("").is_err());
        assert!(TablePath::parse("x/y").is_err());
    }

    #[test]
    fn primary_key_defaults() {
        let t = TableDescriptor::new(
            path(),
            schema(),
            vec!["id".into(), "dt".into()],
            vec!["dt".into()],
            TableOptions::default(),
        )
        .unwrap();
        assert_eq!(t.bucket_key, vec!["id".to_string()]);
        assert!(!t.schema().field(0).is_nullable());
        assert!(!t.schema().field(1).is_nullable());
        assert!(t.schema().field(2).is_nullable());
        assert!(t.has_primary_key() && t.is_partitioned());
    }

    #[test]
    fn log_table_has_no_bucket_key_by_default() {
        let t = TableDescriptor::new(path(), schema(), vec![], vec![], TableOptions::default())
            .unwrap();
        assert!(t.bucket_key.is_empty());
        assert_eq!(t.column_indices(&["v".into()]).unwrap(), vec![2]);
        assert!(t.column_indices(&["nope".into()]).is_err());
    }

    #[test]
    fn bad_definitions_are_named() {
        let err = |pk: &[&str], parts: &[&str], options: TableOptions| {
            TableDescriptor::new(
                path(),
                schema(),
                pk.iter().map(|s| s.to_string()).collect(),
                parts.iter().map(|s| s.to_string()).collect(),
                options,
            )
            .unwrap_err()
            .to_string()
        };
        assert!(err(&["nope"], &[], TableOptions::default()).contains("'nope'"));
        assert!(err(&["id"], &["dt"], TableOptions::default()).contains("part of the primary key"));
        assert!(err(&["dt"], &["dt"], TableOptions::default()).contains("beyond its partition"));
        let options = TableOptions {
            bucket_key: Some(vec!["v".into()]),
            ..TableOptions::default()
        };
        assert!(err(&["id"], &[], options).contains("bucket key 'v'"));
        let dup = Schema::new(vec![
            Field::new("a", DataType::Int32, true),
            Field::new("a", DataType::Int32, true),
        ]);
        assert!(
            TableDescriptor::new(path(), dup, vec![], vec![], TableOptions::default()).is_err()
        );
    }

    #[test]
    fn add_column_creates_a_version() {
        let t = TableDescriptor::new(path(), schema(), vec![], vec![], TableOptions::default())
            .unwrap();
        let t2 = t
            .with_added_column(Field::new("w", DataType::Utf8, true))
            .unwrap();
        assert_eq!(t2.current().schema_id, 1);
        assert_eq!(t2.schema().fields().len(), 4);
        assert_eq!(t2.schema_version(0).unwrap().schema.fields().len(), 3);
        assert!(
            t2.with_added_column(Field::new("w", DataType::Utf8, true))
                .is_err()
        );
        assert!(
            t2.with_added_column(Field::new("x", DataType::Utf8, false))
                .is_err()
        );
    }
}
