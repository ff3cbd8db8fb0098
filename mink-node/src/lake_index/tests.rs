//! The lake index: locating keys' live rows, keeping the index in line with what each
//! round and compaction commits, and refusing a lake it cannot describe.

use mink_lake::reader::{LakeFile, LakeSplit};

use super::*;
use crate::tiering::tests::{bucket, indexed, key, keys, table, users};

/// An index of bucket files `(path, ids of its rows in order)`.
fn index_of(files: &[(&str, &[i64])]) -> BucketIndex {
    let t = table();
    let mut index = BucketIndex::default();
    for (path, ids) in files {
        index
            .add(vec![indexed(path, ids.len() as u64)], keys(&t, ids))
            .unwrap();
    }
    index
}

/// `(path, rows, live)` of every file.
fn counts(index: &BucketIndex) -> Vec<(String, u64, u64)> {
    let files = index.files().iter();
    files
        .map(|f| (f.path.to_string(), f.rows, f.live))
        .collect()
}

fn remove(index: &mut BucketIndex, id: i64) -> Option<(String, i64)> {
    let (file, row) = index.remove(&key(&table(), id))?;
    Some((file.to_string(), row))
}

fn at(path: &str, row: i64) -> Option<(String, i64)> {
    Some((path.to_string(), row))
}

#[test]
fn every_row_is_found_at_its_file_and_position() {
    let mut index = index_of(&[("f0", &[10, 11, 12]), ("f1", &[20, 21])]);
    assert_eq!(remove(&mut index, 12), at("f0", 2));
    assert_eq!(remove(&mut index, 20), at("f1", 0));
    assert_eq!(remove(&mut index, 10), at("f0", 0));
    assert_eq!(remove(&mut index, 21), at("f1", 1));
    assert_eq!(remove(&mut index, 11), at("f0", 1));
    assert!(index.locations().is_empty());
}

#[test]
fn files_added_together_number_their_rows_file_by_file() {
    let t = table();
    let mut index = BucketIndex::default();
    index
        .add(
            vec![indexed("f0", 2), indexed("f1", 1)],
            keys(&t, &[1, 2, 3]),
        )
        .unwrap();
    assert_eq!(remove(&mut index, 2), at("f0", 1));
    assert_eq!(remove(&mut index, 3), at("f1", 0));
}

#[test]
fn a_removed_key_is_forgotten_and_its_file_loses_a_live_row() {
    let mut index = index_of(&[("f0", &[1, 2])]);
    assert_eq!(remove(&mut index, 1), at("f0", 0));
    assert_eq!(remove(&mut index, 1), None);
    assert_eq!(counts(&index), [("f0".into(), 2, 1)]);
}

#[test]
fn a_key_not_in_the_lake_has_nothing_to_remove() {
    let mut index = index_of(&[("f0", &[1])]);
    assert_eq!(remove(&mut index, 7), None);
    assert_eq!(counts(&index), [("f0".into(), 1, 1)]);
}

#[test]
fn keys_are_located_by_file_in_position_order() {
    let t = table();
    let index = index_of(&[("f0", &[10, 11, 12]), ("f1", &[20, 21])]);
    let wanted = keys(&t, &[21, 12, 99, 10, 12]);
    let located = index.locate(wanted.iter().map(AsRef::as_ref)).unwrap();
    let mut located: Vec<(String, Vec<u64>)> = located
        .into_iter()
        .map(|(path, rows)| (path.to_string(), rows))
        .collect();
    located.sort();
    assert_eq!(
        located,
        [("f0".to_string(), vec![0, 2]), ("f1".to_string(), vec![1])]
    );
}

#[test]
fn buckets_locate_alike_on_one_thread_and_on_several() {
    let t = table();
    let codec = KeyCodec::new(&t).unwrap();
    let mut index = LakeIndex::default();
    let buckets: Vec<BucketId> = (0..3).map(|b| bucket(&t, b)).collect();
    for (b, id) in buckets.iter().enumerate() {
        let ids: Vec<i64> = (0..100).map(|i| i * 3 + b as i64).collect();
        let file = format!("f{b}");
        let added = index
            .bucket_mut(id)
            .add(vec![indexed(&file, 100)], keys(&t, &ids));
        added.unwrap();
    }
    let encoded = |ids: &[i64]| {
        let rows: Vec<(i64, &str)> = ids.iter().map(|id| (*id, "")).collect();
        vec![codec.encode(&users(&t, &rows)).unwrap()]
    };
    // Bucket b holds ids b, b + 3, .., b + 297 in file fb, in that order.
    let wanted = [encoded(&[6, 0, 1000]), encoded(&[4]), encoded(&[299, 2])];
    let asked: Vec<(&BucketId, &[Rows])> = buckets
        .iter()
        .zip(&wanted)
        .map(|(id, rows)| (id, rows.as_slice()))
        .collect();
    let sorted = |located: Vec<LocatedRows>| -> Vec<Vec<(String, Vec<u64>)>> {
        located
            .into_iter()
            .map(|by_file| {
                let mut files: Vec<_> = by_file
                    .into_iter()
                    .map(|(path, rows)| (path.to_string(), rows))
                    .collect();
                files.sort();
                files
            })
            .collect()
    };
    let one = sorted(index.locate_on(&asked, 1).unwrap());
    assert_eq!(
        one,
        [
            vec![("f0".to_string(), vec![0, 2])],
            vec![("f1".to_string(), vec![1])],
            vec![("f2".to_string(), vec![0, 99])],
        ]
    );
    assert_eq!(sorted(index.locate_on(&asked, 2).unwrap()), one);
    assert_eq!(sorted(index.locate_on(&asked, 8).unwrap()), one);
}

#[test]
fn a_lake_holding_a_key_twice_locates_nothing() {
    let t = table();
    let index = index_of(&[("f0", &[1, 2]), ("f1", &[2])]);
    assert!(
        index
            .locate(keys(&t, &[1]).iter().map(AsRef::as_ref))
            .is_none()
    );
}

#[test]
fn a_replaced_key_points_at_its_new_file() {
    // What a round does: remove the changed key, then add the file of its new version.
    let mut index = index_of(&[("f0", &[1, 2])]);
    assert_eq!(remove(&mut index, 1), at("f0", 0));
    index
        .add(vec![indexed("f1", 1)], keys(&table(), &[1]))
        .unwrap();
    assert_eq!(counts(&index), [("f0".into(), 2, 1), ("f1".into(), 1, 1)]);
    assert_eq!(remove(&mut index, 1), at("f1", 0));
    assert_eq!(remove(&mut index, 2), at("f0", 1));
}

#[test]
fn a_key_indexed_twice_keeps_its_last_row_and_honest_live_counts() {
    // Only a lake holding a key twice does this: the later row wins, the earlier one
    // stops counting as live.
    let mut index = index_of(&[("f0", &[1, 2]), ("f1", &[1])]);
    assert_eq!(counts(&index), [("f0".into(), 2, 1), ("f1".into(), 1, 1)]);
    assert_eq!(remove(&mut index, 1), at("f1", 0));
    assert_eq!(counts(&index), [("f0".into(), 2, 1), ("f1".into(), 1, 0)]);
}

#[test]
fn more_rows_than_keys_is_corrupt() {
    let mut index = BucketIndex::default();
    let error = index
        .add(vec![indexed("f0", 3)], keys(&table(), &[1, 2]))
        .unwrap_err();
    assert!(
        matches!(&error, NodeError::Corrupt(m) if m == "a lake file holds more rows than were written"),
        "{error}"
    );
}

#[test]
fn more_keys_than_rows_is_corrupt() {
    let mut index = BucketIndex::default();
    let error = index
        .add(vec![indexed("f0", 1)], keys(&table(), &[1, 2]))
        .unwrap_err();
    assert!(
        matches!(&error, NodeError::Corrupt(m) if m == "rows were written that no lake file holds"),
        "{error}"
    );
}

#[test]
fn the_partition_is_known_once_the_bucket_has_a_file() {
    let mut index = BucketIndex::default();
    assert!(index.partition().is_none());
    index.add(vec![indexed("f0", 0)], Vec::new()).unwrap();
    assert_eq!(index.partition(), Some(&Struct::empty()));
}

#[test]
fn an_index_knows_only_the_buckets_asked_for() {
    let t = table();
    let mut index = LakeIndex::default();
    index
        .bucket_mut(&bucket(&t, 2))
        .add(vec![indexed("f0", 1)], keys(&t, &[1]))
        .unwrap();
    assert_eq!(index.bucket_mut(&bucket(&t, 2)).locations().len(), 1);
    assert!(index.bucket_mut(&bucket(&t, 3)).locations().is_empty());
    assert_eq!(index.buckets.len(), 2);
}

fn lake_file(path: &str) -> LakeFile {
    LakeFile {
        path: path.into(),
        size: 100,
        record_count: Some(1),
        partition: None,
        deletes: Vec::new(),
        replaced_rows: Vec::new(),
    }
}

fn split_of(paths: &[&str]) -> LakeSplit {
    LakeSplit {
        snapshot_id: Some(7),
        files: paths.iter().map(|p| lake_file(p)).collect(),
    }
}

fn partitioned(partition: &str, number: u32) -> BucketId {
    BucketId {
        partition: Some(partition.into()),
        ..bucket(&table(), number)
    }
}

#[test]
fn files_are_grouped_by_their_bucket_directory() {
    /// The file names of `bucket`'s split.
    fn names(by_bucket: &HashMap<BucketId, LakeSplit>, bucket: &BucketId) -> Vec<String> {
        let split = &by_bucket[bucket];
        assert_eq!(split.snapshot_id, Some(7));
        let names = split
            .files
            .iter()
            .map(|f| f.path.rsplit('/').next().unwrap());
        names.map(str::to_string).collect()
    }
    let t = table();
    let split = split_of(&[
        "s3://wh/db/users/data/bucket=0/a.parquet",
        "s3://wh/db/users/data/bucket=1/b.parquet",
        "s3://wh/db/users/data/bucket=0/c.parquet",
    ]);
    let by_bucket = split_by_bucket_dir("s3://wh/db/users", split, &t).unwrap();
    assert_eq!(by_bucket.len(), 2);
    assert_eq!(
        names(&by_bucket, &bucket(&t, 0)),
        ["a.parquet", "c.parquet"]
    );
    assert_eq!(names(&by_bucket, &bucket(&t, 1)), ["b.parquet"]);

    let mut t = table();
    t.partition_keys = vec!["dt".into()];
    let split = split_of(&[
        "s3://wh/db/users/data/dt=2024-01-01/bucket=0/d.parquet",
        "s3://wh/db/users/data/dt=2024-01-01/region=eu/bucket=4/e.parquet",
    ]);
    let by_bucket = split_by_bucket_dir("s3://wh/db/users", split, &t).unwrap();
    assert_eq!(by_bucket.len(), 2);
    assert_eq!(
        names(&by_bucket, &partitioned("dt=2024-01-01", 0)),
        ["d.parquet"]
    );
    assert_eq!(
        names(&by_bucket, &partitioned("dt=2024-01-01/region=eu", 4)),
        ["e.parquet"]
    );
    // An unpartitioned table's files are never in a partition directory, and a
    // partitioned table's always are.
    let split = split_of(&["s3://wh/db/users/data/bucket=0/a.parquet"]);
    assert!(split_by_bucket_dir("s3://wh/db/users", split, &t).is_err());
}

#[test]
fn a_location_with_a_trailing_slash_groups_the_same() {
    let split = split_of(&["/wh/db/users/data/bucket=5/a.parquet"]);
    let t = table();
    let by_bucket = split_by_bucket_dir("/wh/db/users/", split, &t).unwrap();
    assert_eq!(by_bucket.keys().collect::<Vec<_>>(), [&bucket(&t, 5)]);
}

#[test]
fn a_file_outside_every_bucket_directory_is_corrupt() {
    for path in [
        "/wh/db/users/data/a.parquet",
        "/wh/db/users/other/bucket=0/a.parquet",
        "/wh/db/users/data/bucket=x/a.parquet",
        "/wh/db/users/data/bucket=01/a.parquet",
        "/wh/db/users/data/bucket=-1/a.parquet",
        "/wh/db/users2/data/bucket=0/a.parquet",
        "/wh/db/usersdata/data/bucket=0/a.parquet",
        "/wh/db/users/data/nopart/bucket=0/a.parquet",
        "/elsewhere/data/bucket=0/a.parquet",
        "a.parquet",
    ] {
        let split = split_of(&["/wh/db/users/data/bucket=0/ok.parquet", path]);
        let error = split_by_bucket_dir("/wh/db/users", split, &table()).unwrap_err();
        assert!(
            matches!(&error, NodeError::Corrupt(m) if m.contains(path)),
            "{path}: {error}"
        );
    }
}

#[test]
fn an_empty_split_has_no_buckets() {
    let by_bucket = split_by_bucket_dir("/wh", split_of(&[]), &table()).unwrap();
    assert!(by_bucket.is_empty());
}

#[test]
fn row_numbers_beyond_u32_are_corrupt() {
    assert_eq!(row_number(u64::from(u32::MAX)).unwrap(), u32::MAX);
    assert!(matches!(
        row_number(u64::from(u32::MAX) + 1),
        Err(NodeError::Corrupt(_))
    ));
}
