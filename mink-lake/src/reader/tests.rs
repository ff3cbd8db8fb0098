//! The read path on real Parquet files in a temporary directory: data files, a
//! hand-written position-delete file and equality-delete files, a hand-built split.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, Int64Array, StringArray};
use arrow::datatypes::{DataType, Field, Int64Type, Schema};
use iceberg::spec::{NestedField, PrimitiveType, Type};
use object_store::local::LocalFileSystem;
use parquet::arrow::{ArrowWriter, PARQUET_FIELD_ID_META_KEY};
use parquet::file::properties::WriterProperties;

use super::delete_files::{FILE_PATH_FIELD_ID, POS_FIELD_ID};
use super::*;

fn with_id(field: Field, id: i32) -> Field {
    field.with_metadata(HashMap::from([(
        PARQUET_FIELD_ID_META_KEY.to_string(),
        id.to_string(),
    )]))
}

/// Writes `batch` to `path` in row groups of `group_rows`; returns the file's size.
fn write(path: &Path, batch: &RecordBatch, group_rows: usize) -> u64 {
    let properties = WriterProperties::builder()
        .set_max_row_group_row_count(Some(group_rows))
        .build();
    let file = std::fs::File::create(path).unwrap();
    let mut writer = ArrowWriter::try_new(file, batch.schema(), Some(properties)).unwrap();
    writer.write(batch).unwrap();
    writer.close().unwrap();
    std::fs::metadata(path).unwrap().len()
}

/// The name of row `id`: null for ids ending in 50.
fn name_of(id: i64) -> Option<String> {
    (id % 100 != 50).then(|| format!("n{id}"))
}

/// A data file of `ids` (id = first id + position) in row groups of 100.
fn data_file(dir: &Path, name: &str, ids: std::ops::Range<i64>) -> LakeFile {
    let schema = Arc::new(Schema::new(vec![
        with_id(Field::new("id", DataType::Int64, false), 1),
        with_id(Field::new("name", DataType::Utf8, true), 2),
    ]));
    let batch = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from_iter_values(ids.clone())),
            Arc::new(StringArray::from_iter(ids.map(name_of))),
        ],
    )
    .unwrap();
    let path = dir.join(name);
    let size = write(&path, &batch, 100);
    LakeFile {
        path: path.display().to_string(),
        size,
        record_count: Some(batch.num_rows() as u64),
        partition: None,
        deletes: Vec::new(),
        replaced_rows: Vec::new(),
    }
}

/// A position-delete file of (file_path, pos) rows, in the order given.
fn position_deletes(dir: &Path, name: &str, rows: &[(&str, i64)]) -> LakeDeleteFile {
    let schema = Arc::new(Schema::new(vec![
        with_id(
            Field::new("file_path", DataType::Utf8, false),
            FILE_PATH_FIELD_ID,
        ),
        with_id(Field::new("pos", DataType::Int64, false), POS_FIELD_ID),
    ]));
    let batch = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0))),
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
        ],
    )
    .unwrap();
    let path = dir.join(name);
    let size = write(&path, &batch, 4);
    LakeDeleteFile {
        path: path.display().to_string(),
        size,
        kind: DeleteKind::Positions,
    }
}

/// An equality-delete file of one column.
fn equality_deletes(dir: &Path, name: &str, column: Field, values: ArrayRef) -> LakeDeleteFile {
    let id = if column.name() == "id" { 1 } else { 2 };
    let columns = vec![column.name().clone()];
    let schema = Arc::new(Schema::new(vec![with_id(column, id)]));
    let batch = RecordBatch::try_new(schema, vec![values]).unwrap();
    let path = dir.join(name);
    let size = write(&path, &batch, 2);
    LakeDeleteFile {
        path: path.display().to_string(),
        size,
        kind: DeleteKind::Equality { columns },
    }
}

fn storage() -> LakeStorage {
    LakeStorage::new(Arc::new(LocalFileSystem::new()), "")
}

/// Two data files and their deletes:
/// - `a.parquet`: ids 0..1000 in 10 row groups; position deletes 0, 3, 99, 100..200 (a
///   whole row group), 999 (from two files, unsorted, with duplicates and positions out
///   of range); equality deletes id in (500, 501), name in ('n777', null).
/// - `b.parquet`: ids 1000..1300; position deletes 5, 299; equality delete id = 1200.
struct Fixture {
    _dir: tempfile::TempDir,
    split: LakeSplit,
    a: String,
    b: String,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let mut a = data_file(dir.path(), "a.parquet", 0..1000);
    let mut b = data_file(dir.path(), "b.parquet", 1000..1300);
    let mut rows: Vec<(&str, i64)> = vec![
        (&a.path, 999),
        (&b.path, 5),
        (&a.path, 0),
        (&a.path, 99),
        ("/elsewhere/c.parquet", 3),
    ];
    rows.extend((100..200).rev().map(|p| (a.path.as_str(), p)));
    rows.extend([
        (a.path.as_str(), 0),
        (a.path.as_str(), 5000),
        (a.path.as_str(), -1),
        (b.path.as_str(), 299),
    ]);
    let positions = position_deletes(dir.path(), "pos-1.parquet", &rows);
    let more_positions =
        position_deletes(dir.path(), "pos-2.parquet", &[(&a.path, 3), (&a.path, 99)]);
    let ids = equality_deletes(
        dir.path(),
        "eq-id.parquet",
        Field::new("id", DataType::Int64, false),
        Arc::new(Int64Array::from(vec![500, 501, 1200])),
    );
    let names = equality_deletes(
        dir.path(),
        "eq-name.parquet",
        Field::new("name", DataType::Utf8, true),
        Arc::new(StringArray::from(vec![Some("n777"), None])),
    );
    a.deletes = vec![positions.clone(), ids.clone(), more_positions, names];
    b.deletes = vec![positions, ids];
    let (a_path, b_path) = (a.path.clone(), b.path.clone());
    Fixture {
        _dir: dir,
        split: LakeSplit {
            snapshot_id: Some(1),
            files: vec![a, b],
        },
        a: a_path,
        b: b_path,
    }
}

/// The ids the fixture's split holds after its deletes.
fn live_ids() -> Vec<i64> {
    let a_deleted = |id: i64| {
        matches!(id, 0 | 3 | 99 | 100..200 | 999 | 500 | 501 | 777) || name_of(id).is_none()
    };
    let b_deleted = |id: i64| matches!(id, 1005 | 1299 | 1200);
    (0..1000)
        .filter(|&id| !a_deleted(id))
        .chain((1000..1300).filter(|&id| !b_deleted(id)))
        .collect()
}

fn full_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
    ]))
}

async fn read_positioned(split: &LakeSplit, schema: SchemaRef) -> Vec<PositionedBatch> {
    read_split_positioned(&storage(), split.clone(), schema)
        .try_collect()
        .await
        .unwrap()
}

/// (file, position) of every row, in stream order.
fn located(batches: &[PositionedBatch]) -> Vec<(String, u64)> {
    batches
        .iter()
        .flat_map(|b| {
            assert_eq!(b.positions.len(), b.batch.num_rows());
            assert!(b.batch.num_rows() > 0);
            b.positions
                .values()
                .iter()
                .map(|&p| (b.file.to_string(), p))
        })
        .collect()
}

impl Fixture {
    /// Where the row of `id` lives.
    fn location(&self, id: i64) -> (String, u64) {
        if id < 1000 {
            (self.a.clone(), id as u64)
        } else {
            (self.b.clone(), (id - 1000) as u64)
        }
    }
}

#[tokio::test]
async fn deletes_of_every_kind_are_applied_with_positions() {
    let fixture = fixture();
    let batches = read_positioned(&fixture.split, full_schema()).await;
    let expected = live_ids();
    assert_eq!(
        located(&batches),
        expected
            .iter()
            .map(|&id| fixture.location(id))
            .collect::<Vec<_>>()
    );
    for batch in &batches {
        assert_eq!(batch.batch.schema(), full_schema());
        let ids = batch.batch.column(0).as_primitive::<Int64Type>();
        let names = batch.batch.column(1).as_string::<i32>();
        for row in 0..batch.batch.num_rows() {
            let id = ids.value(row);
            assert_eq!(fixture.location(id).1, batch.positions.value(row));
            assert_eq!(
                names.is_valid(row).then(|| names.value(row).to_string()),
                name_of(id)
            );
        }
    }
    // read_split is the same stream without the positions.
    let plain: Vec<RecordBatch> = read_split(&storage(), fixture.split.clone(), full_schema())
        .try_collect()
        .await
        .unwrap();
    let ids: Vec<i64> = plain
        .iter()
        .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
        .collect();
    assert_eq!(ids, expected);
}

#[tokio::test]
async fn a_projection_without_the_equality_columns_still_applies_them() {
    let fixture = fixture();
    let names_only: SchemaRef =
        Arc::new(Schema::new(vec![Field::new("name", DataType::Utf8, true)]));
    let batches = read_positioned(&fixture.split, Arc::clone(&names_only)).await;
    assert_eq!(
        located(&batches),
        live_ids()
            .iter()
            .map(|&id| fixture.location(id))
            .collect::<Vec<_>>()
    );
    for batch in &batches {
        assert_eq!(batch.batch.schema(), names_only);
        let names = batch.batch.column(0).as_string::<i32>();
        let base = if *batch.file == *fixture.a { 0 } else { 1000 };
        for (row, position) in batch.positions.values().iter().enumerate() {
            let id = base + *position as i64;
            assert_eq!(
                names.is_valid(row).then(|| names.value(row).to_string()),
                name_of(id)
            );
        }
    }
    // No column at all: just the live rows.
    let empty = Arc::new(Schema::empty());
    let batches = read_positioned(&fixture.split, empty).await;
    assert_eq!(located(&batches).len(), live_ids().len());
}

#[tokio::test]
async fn a_file_without_deletes_reads_whole() {
    let fixture = fixture();
    let mut split = fixture.split.clone();
    for file in &mut split.files {
        file.deletes.clear();
    }
    let batches = read_positioned(&split, full_schema()).await;
    let expected: Vec<_> = (0..1300).map(|id| fixture.location(id)).collect();
    assert_eq!(located(&batches), expected);
}

#[tokio::test]
async fn each_delete_file_is_loaded_once() {
    let fixture = fixture();
    let deletes = SplitDeletes::new(storage(), &fixture.split.files);
    let [a, b] = &fixture.split.files[..] else {
        panic!("two files")
    };
    let a_deletes = deletes.for_file(a).await.unwrap();
    let mut expected: Vec<u64> = vec![0, 3, 99];
    expected.extend(100..200);
    expected.extend([999, 5000]);
    assert_eq!(a_deletes.positions, expected);
    assert_eq!(
        a_deletes.equality_columns().collect::<Vec<_>>(),
        vec!["id", "name"]
    );
    assert_eq!(deletes.loads(), 4);
    let b_deletes = deletes.for_file(b).await.unwrap();
    assert_eq!(b_deletes.positions, vec![5, 299]);
    assert_eq!(b_deletes.equality.len(), 1);
    deletes.for_file(a).await.unwrap();
    assert_eq!(deletes.loads(), 4);
    assert_eq!(fixture.split.delete_file_count(), 4);
}

#[tokio::test]
async fn replaced_rows_join_the_position_deletes() {
    let mut fixture = fixture();
    let dir = tempfile::tempdir().unwrap();
    let mut c = data_file(dir.path(), "c.parquet", 2000..2010);
    c.replaced_rows = vec![2];
    fixture.split.files[1].replaced_rows = vec![5, 7];
    fixture.split.files.push(c);
    let deleted = split_position_deletes(&storage(), &fixture.split)
        .await
        .unwrap();
    assert_eq!(deleted[&fixture.b], [5, 7, 299], "with its delete files'");
    assert_eq!(deleted[&fixture.split.files[2].path], [2], "alone");
    assert_eq!(deleted[&fixture.a][..3], [0, 3, 99], "untouched");
}

#[tokio::test]
async fn broken_delete_files_fail_the_read() {
    let fixture = fixture();
    // A delete file that is gone.
    let mut split = fixture.split.clone();
    split.files[1].deletes[0].path = format!("{}.gone", fixture.b);
    let result: Result<Vec<RecordBatch>> = read_split(&storage(), split, full_schema())
        .try_collect()
        .await;
    assert!(result.is_err());
    // A data file read as a position-delete file has no file_path and pos columns.
    let mut split = fixture.split.clone();
    split.files[1].deletes[0] = LakeDeleteFile {
        path: fixture.a.clone(),
        size: split.files[0].size,
        kind: DeleteKind::Positions,
    };
    let result: Result<Vec<RecordBatch>> = read_split(&storage(), split.clone(), full_schema())
        .try_collect()
        .await;
    let error = result.unwrap_err().to_string();
    assert!(error.contains("file_path and pos"), "{error}");
    // An equality column the delete file lacks.
    split.files[1].deletes[0].kind = DeleteKind::Equality {
        columns: vec!["nope".into()],
    };
    let result: Result<Vec<RecordBatch>> = read_split(&storage(), split, full_schema())
        .try_collect()
        .await;
    let error = result.unwrap_err().to_string();
    assert!(error.contains("no equality column nope"), "{error}");
}

fn planned_delete(file_type: DataContentType, ids: Option<Vec<i32>>) -> FileScanTaskDeleteFile {
    FileScanTaskDeleteFile::builder()
        .with_file_path("s3://lake/t/deletes.parquet".to_string())
        .with_file_size_in_bytes(123)
        .with_file_type(file_type)
        .with_partition_spec_id(0)
        .with_equality_ids(ids)
        .build()
}

#[test]
fn planned_delete_files_resolve_equality_ids_to_names() {
    let schema = iceberg::spec::Schema::builder()
        .with_fields(vec![
            NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)).into(),
            NestedField::optional(2, "name", Type::Primitive(PrimitiveType::String)).into(),
        ])
        .build()
        .unwrap();
    let resolve =
        |file_type, ids| lake_delete_file(&schema, planned_delete(file_type, ids), "db.t");
    assert_eq!(
        resolve(DataContentType::PositionDeletes, None).unwrap(),
        LakeDeleteFile {
            path: "s3://lake/t/deletes.parquet".into(),
            size: 123,
            kind: DeleteKind::Positions,
        }
    );
    assert_eq!(
        resolve(DataContentType::EqualityDeletes, Some(vec![2, 1]))
            .unwrap()
            .kind,
        DeleteKind::Equality {
            columns: vec!["name".into(), "id".into()]
        }
    );
    for (file_type, ids) in [
        (DataContentType::EqualityDeletes, Some(vec![1, 7])),
        (DataContentType::EqualityDeletes, Some(vec![])),
        (DataContentType::EqualityDeletes, None),
        (DataContentType::Data, None),
    ] {
        let error = resolve(file_type, ids).unwrap_err();
        assert!(matches!(error, LakeError::Layout { .. }), "{error}");
    }
}

#[test]
fn delete_files_are_counted_once_per_split() {
    let delete = |path: &str| LakeDeleteFile {
        path: path.into(),
        size: 1,
        kind: DeleteKind::Positions,
    };
    let file = |deletes: Vec<LakeDeleteFile>| LakeFile {
        path: "d".into(),
        size: 1,
        record_count: Some(10),
        partition: None,
        deletes,
        replaced_rows: Vec::new(),
    };
    let split = LakeSplit {
        snapshot_id: Some(1),
        files: vec![
            file(vec![delete("x"), delete("y")]),
            file(vec![delete("y")]),
            file(vec![]),
        ],
    };
    assert_eq!(split.delete_file_count(), 2);
    assert_eq!(split.record_count(), 30);
    assert_eq!(LakeSplit::default().delete_file_count(), 0);
}

#[test]
fn files_go_to_the_buckets_whose_directory_holds_them() {
    let id = |partition: Option<&str>, bucket| BucketId {
        table: "db.t".into(),
        partition: partition.map(str::to_string),
        bucket,
    };
    let buckets = [
        id(None, 1),
        id(Some("dt=2024-01-01"), 1),
        id(Some("dt=2024-01-01"), 12),
        id(None, 1),
    ];
    let dirs = BucketDirs::new("s3://wh/db/t", &buckets);
    let owners = |path: &str| dirs.owners(path).collect::<Vec<_>>();
    // What `plan_split` keeps for each bucket alone, by its directory as a prefix.
    let prefix_rule = |path: &str| {
        (0..buckets.len())
            .filter(|&i| path.starts_with(&format!("s3://wh/db/t/{}/", bucket_dir(&buckets[i]))))
            .collect::<Vec<_>>()
    };
    for (path, expected) in [
        ("s3://wh/db/t/data/bucket=1/a.parquet", vec![0, 3]),
        ("s3://wh/db/t/data/bucket=1/sub/a.parquet", vec![0, 3]),
        ("s3://wh/db/t/data/bucket=10/a.parquet", vec![]),
        ("s3://wh/db/t/data/bucket=2/a.parquet", vec![]),
        (
            "s3://wh/db/t/data/dt=2024-01-01/bucket=1/a.parquet",
            vec![1],
        ),
        (
            "s3://wh/db/t/data/dt=2024-01-01/bucket=12/a.parquet",
            vec![2],
        ),
        ("s3://wh/db/t/data/dt=2024-01-02/bucket=1/a.parquet", vec![]),
        ("s3://wh/db/other/data/bucket=1/a.parquet", vec![]),
        ("s3://wh/db/t/data/bucket=1", vec![]),
        ("", vec![]),
    ] {
        let mut found = owners(path);
        found.sort_unstable();
        assert_eq!(found, expected, "{path}");
        assert_eq!(found, prefix_rule(path), "{path}");
    }
    assert_eq!(
        BucketDirs::new("s3://wh/db/t", &[])
            .owners("s3://wh/db/t/data/bucket=1/a")
            .count(),
        0
    );
}
