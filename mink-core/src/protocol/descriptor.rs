//! Table descriptors on the wire: [`TableDescriptorProto`] to and from
//! [`TableDescriptor`], and the field an [`AddColumn`] carries.

use std::sync::Arc;
use std::time::Duration;

use arrow::datatypes::{Field, Schema};

use super::{
    AddColumn, LakeProperty, SchemaVersionProto, TableDescriptorProto, decode_schema, encode_schema,
};
use crate::table::{SchemaVersion, TableDescriptor, TablePath};
use crate::{CoreError, Result};

impl From<&TableDescriptor> for TableDescriptorProto {
    fn from(table: &TableDescriptor) -> Self {
        Self {
            table_id: table.table_id,
            database: table.path.database.clone(),
            name: table.path.name.clone(),
            schemas: table
                .schemas
                .iter()
                .map(|v| SchemaVersionProto {
                    schema_id: v.schema_id,
                    arrow_schema: encode_schema(&v.schema),
                })
                .collect(),
            primary_key: table.primary_key.clone(),
            partition_keys: table.partition_keys.clone(),
            bucket_key: table.bucket_key.clone(),
            bucket_num: table.bucket_num,
            log_ttl_ms: table.log_ttl.map(|d| d.as_millis() as u64),
            lake_enabled: table.lake_enabled,
            lake_freshness_ms: table.lake_freshness.as_millis() as u64,
            lake_properties: table
                .lake_properties
                .iter()
                .map(|(key, value)| LakeProperty {
                    key: key.clone(),
                    value: value.clone(),
                })
                .collect(),
        }
    }
}

impl TryFrom<TableDescriptorProto> for TableDescriptor {
    type Error = CoreError;

    fn try_from(proto: TableDescriptorProto) -> Result<Self> {
        let schemas = proto
            .schemas
            .iter()
            .map(|v| {
                Ok(SchemaVersion {
                    schema_id: v.schema_id,
                    schema: Arc::new(decode_schema(&v.arrow_schema)?),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        if schemas.is_empty() {
            return Err(CoreError::InvalidRequest(
                "a table descriptor needs at least one schema version".into(),
            ));
        }
        Ok(Self {
            table_id: proto.table_id,
            path: TablePath::new(proto.database, proto.name),
            schemas,
            primary_key: proto.primary_key,
            partition_keys: proto.partition_keys,
            bucket_key: proto.bucket_key,
            bucket_num: proto.bucket_num.max(1),
            log_ttl: proto.log_ttl_ms.map(Duration::from_millis),
            lake_enabled: proto.lake_enabled,
            lake_freshness: Duration::from_millis(proto.lake_freshness_ms),
            lake_properties: proto
                .lake_properties
                .into_iter()
                .map(|property| (property.key, property.value))
                .collect(),
        })
    }
}

impl AddColumn {
    /// The request for adding `field` to `table`.
    pub fn new(table: &TablePath, field: Field) -> Self {
        Self {
            table: table.to_string(),
            field: encode_schema(&Schema::new(vec![field])),
        }
    }

    /// The field to add.
    pub fn field(&self) -> Result<Field> {
        let schema = decode_schema(&self.field)?;
        match schema.fields().as_ref() {
            [field] => Ok(field.as_ref().clone()),
            _ => Err(CoreError::InvalidRequest(
                "add_column carries exactly one field".into(),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use arrow::datatypes::DataType;
    use prost::Message;

    use super::*;
    use crate::options::TableOptions;
    use crate::protocol::decode;

    #[test]
    fn descriptor_round_trips_through_proto() {
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new(
                "ts",
                DataType::Timestamp(arrow::datatypes::TimeUnit::Microsecond, Some("UTC".into())),
                true,
            ),
        ]);
        let options = TableOptions {
            bucket_num: 8,
            log_ttl: Some(Duration::from_secs(3600)),
            ..TableOptions::default()
        };
        let table = TableDescriptor::new(
            TablePath::new("db", "t"),
            schema,
            vec!["id".into()],
            vec![],
            options,
        )
        .unwrap()
        .with_added_column(Field::new("v", DataType::Utf8, true))
        .unwrap();
        let proto = TableDescriptorProto::from(&table);
        assert_eq!(
            decode::<TableDescriptorProto>("test", &proto.encode_to_vec()).unwrap(),
            proto
        );
        assert_eq!(TableDescriptor::try_from(proto).unwrap(), table);
    }

    #[test]
    fn add_column_carries_one_field() {
        let request = AddColumn::new(
            &TablePath::new("db", "t"),
            Field::new("x", DataType::Int32, true),
        );
        assert_eq!(request.field().unwrap().name(), "x");
        let bad = AddColumn {
            table: "db.t".into(),
            field: vec![1, 2, 3],
        };
        assert!(bad.field().is_err());
    }
}
