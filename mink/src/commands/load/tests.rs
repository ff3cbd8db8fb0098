use arrow::array::AsArray;
use arrow::datatypes::{DataType, Field, TimeUnit, TimestampMicrosecondType};

use mink_client::ClientError;

use super::*;

fn table_schema() -> Schema {
    Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
        Field::new("score", DataType::Int64, true),
    ])
}

#[test]
fn format_comes_from_the_extension() {
    let cases = [
        ("a.csv", FileFormat::Csv),
        ("dir/A.CSV", FileFormat::Csv),
        ("a.parquet", FileFormat::Parquet),
        ("a.json", FileFormat::Json),
        ("a.jsonl", FileFormat::Json),
        ("a.NDJSON", FileFormat::Json),
    ];
    for (path, format) in cases {
        assert_eq!(
            FileFormat::from_path(Path::new(path)).unwrap(),
            format,
            "{path}"
        );
    }
}

#[test]
fn unknown_extension_asks_for_format() {
    for path in ["a.txt", "a", "a.csv.gz", "csv"] {
        let error = FileFormat::from_path(Path::new(path))
            .unwrap_err()
            .to_string();
        assert!(error.contains("--format"), "{path}: {error}");
        assert!(error.contains(path), "{path}: {error}");
    }
}

#[test]
fn columns_may_come_in_any_order_and_nullable_ones_may_be_missing() {
    assert!(check_columns(&["score", "id", "name"], &table_schema()).is_ok());
    assert!(check_columns(&["id"], &table_schema()).is_ok());
}

#[test]
fn extra_columns_are_named() {
    let error = check_columns(&["id", "extra", "name", "other"], &table_schema()).unwrap_err();
    assert!(error.contains("'extra', 'other'"), "{error}");
    assert!(error.contains("id, name, score"), "{error}");
}

#[test]
fn repeated_and_missing_required_columns_are_named() {
    let error = check_columns(&["id", "name", "name"], &table_schema()).unwrap_err();
    assert!(error.contains("'name' more than once"), "{error}");
    let error = check_columns(&["name"], &table_schema()).unwrap_err();
    assert!(
        error.contains("'id'") && error.contains("NOT NULL"),
        "{error}"
    );
}

#[test]
fn csv_schema_follows_the_header_with_table_types() {
    let schema = csv_schema(&["score", "id"], &table_schema()).unwrap();
    let fields: Vec<(&str, &DataType, bool)> = schema
        .fields()
        .iter()
        .map(|f| (f.name().as_str(), f.data_type(), f.is_nullable()))
        .collect();
    assert_eq!(
        fields,
        vec![
            ("score", &DataType::Int64, true),
            ("id", &DataType::Int64, true)
        ]
    );
    assert!(csv_schema(&["id", "nope"], &table_schema()).is_err());
}

#[test]
fn utc_timestamps_decode_as_the_table_types() {
    let utc = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
    let table = Arc::new(Schema::new(vec![Field::new("ts", utc, false)]));
    let schema = csv_schema(&["ts"], &table).unwrap();
    assert!(
        schema.field(0).is_nullable(),
        "NOT NULL is checked after decoding"
    );
    let csv = "ts\n2024-01-01T00:00:01Z\n2024-01-01T02:00:01+02:00\n";
    let mut reader = arrow::csv::ReaderBuilder::new(Arc::new(schema))
        .with_header(true)
        .build(csv.as_bytes())
        .unwrap();
    let decoded = reader.next().unwrap().unwrap();
    let conformed = normalize_batch(&decoded, &table).unwrap();
    assert_eq!(conformed.schema(), table);
    let values = conformed
        .column(0)
        .as_primitive::<TimestampMicrosecondType>();
    assert_eq!(
        values.values(),
        &[1_704_067_201_000_000, 1_704_067_201_000_000]
    );
}

#[test]
fn summary_line_reads_well() {
    let table = TablePath::new("db", "t");
    assert_eq!(
        summary_line(1000, &table, Duration::from_millis(500)),
        "loaded 1000 rows into db.t in 0.50s (2000 rows/s)"
    );
    assert_eq!(
        summary_line(0, &table, Duration::ZERO),
        "loaded 0 rows into db.t in 0.00s (0 rows/s)"
    );
}

#[test]
fn failures_say_what_was_loaded() {
    let input = Failure::Input(CliError::Usage("rows 11-20: bad".into()));
    assert_eq!(
        input.describe(10),
        "rows 11-20: bad; the first 10 rows of the file were loaded"
    );
    assert_eq!(input.describe(0), "rows 11-20: bad; nothing was loaded");
    let write = Failure::Write(WriteFailed {
        error: ClientError::Protocol("gone".into()),
        acknowledged_rows: 7,
        failed_rows: 5,
    });
    assert!(
        write
            .describe(7)
            .contains("7 rows were loaded before the failure")
    );
}

#[test]
fn bar_templates_parse() {
    for template in [BYTES_TEMPLATE, ROWS_TEMPLATE] {
        assert!(ProgressStyle::with_template(template).is_ok(), "{template}");
    }
}
