//! Tables made, changed and dropped through SQL, and the `CALL` procedures.

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Int64Type, UInt64Type};
use mink_core::table::TablePath;

use crate::sql_reads::{count, error, query, session};
use crate::support::TestNode;

pub(crate) fn column_u64(batches: &[RecordBatch], name: &str) -> u64 {
    batches[0]
        .column_by_name(name)
        .unwrap_or_else(|| panic!("no column {name}"))
        .as_primitive::<UInt64Type>()
        .value(0)
}

fn int64s(batches: &[RecordBatch], column: usize) -> Vec<i64> {
    batches
        .iter()
        .flat_map(|b| {
            b.column(column)
                .as_primitive::<Int64Type>()
                .values()
                .to_vec()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_lives_and_dies_through_sql() {
    let node = TestNode::start().await;
    let session = session(&node.client).await;
    query(
        &session,
        "CREATE TABLE shop.orders (day VARCHAR NOT NULL, id BIGINT NOT NULL, item VARCHAR, \
         qty INT, PRIMARY KEY (day, id)) PARTITIONED BY (day) \
         WITH ('bucket.num' = '3', 'bucket.key' = 'id', 'lake.enabled' = 'true', \
         'lake.freshness' = '1h', 'history.expire.max-snapshot-age-ms' = '1')",
    )
    .await;
    let table = node
        .client
        .describe_table(&TablePath::new("shop", "orders"))
        .await
        .expect("described");
    assert_eq!(table.primary_key, vec!["day", "id"]);
    assert_eq!(table.partition_keys, vec!["day"]);
    assert_eq!(table.bucket_num, 3);
    assert!(table.lake_enabled);
    assert_eq!(
        table.schema().field_with_name("item").unwrap().data_type(),
        &DataType::Utf8
    );
    assert!(!table.schema().field_with_name("id").unwrap().is_nullable());
    let listed = query(&session, "SHOW TABLES").await;
    let names: Vec<String> = listed
        .iter()
        .flat_map(|b| {
            let column = b
                .column_by_name("table_name")
                .expect("table_name")
                .as_string::<i32>();
            (0..b.num_rows()).map(move |i| column.value(i).to_string())
        })
        .collect();
    assert!(names.contains(&"orders".to_string()), "{names:?}");

    let inserted = query(
        &session,
        "INSERT INTO shop.orders VALUES ('mon', 1, 'tea', 2), ('mon', 2, 'jam', 1), \
         ('tue', 1, 'tea', 5)",
    )
    .await;
    assert_eq!(count(&inserted), 3);
    let tiered = query(&session, "CALL system.tier('shop.orders')").await;
    assert_eq!(column_u64(&tiered, "rows"), 3);
    query(
        &session,
        "UPDATE shop.orders SET qty = 9 WHERE item = 'tea'",
    )
    .await;
    let tiered = query(&session, "CALL system.tier('shop.orders')").await;
    assert_eq!(
        column_u64(&tiered, "deleted_rows"),
        2,
        "two tea rows replaced"
    );
    let compacted = query(&session, "CALL system.compact('shop.orders')").await;
    assert!(column_u64(&compacted, "files_removed") > 0);

    // Two rounds and a compaction, as the system tables show them.
    let snapshots = query(
        &session,
        "SELECT count(DISTINCT snapshot_id) AS n FROM system.lake_snapshots \
         WHERE table_name = 'shop.orders'",
    )
    .await;
    assert_eq!(int64s(&snapshots, 0), vec![3]);
    let buckets = query(
        &session,
        "SELECT sum(high_watermark) AS hw, sum(lake_log_end_offset) AS seam, \
         count(DISTINCT lake_snapshot_id) AS snapshots, count(*) AS buckets \
         FROM system.buckets WHERE table_name = 'shop.orders'",
    )
    .await;
    // 3 inserts, then 2 updates logged as -U/+U: everything is tiered.
    assert_eq!(int64s(&buckets, 0), vec![7]);
    assert_eq!(int64s(&buckets, 1), vec![7]);
    assert_eq!(int64s(&buckets, 2), vec![1]);
    assert_eq!(
        int64s(&buckets, 3),
        vec![6],
        "3 buckets in each of 2 partitions"
    );

    // Lake upkeep: a manifest rewrite, then an expiry of everything but the current
    // snapshot (the table keeps snapshots for 1 ms), as the system tables show them.
    let lake_table = "SELECT snapshots, manifests, data_files FROM system.lake_tables \
                      WHERE table_name = 'shop.orders'";
    let before = query(&session, lake_table).await;
    assert_eq!(column_u64(&before, "snapshots"), 3);
    let rewritten = query(&session, "CALL system.rewrite_manifests('shop.orders')").await;
    assert_eq!(int64s(&rewritten, 0).len(), 1, "a snapshot");
    let (merged, added) = (
        column_u64(&rewritten, "rewritten_manifests_count"),
        column_u64(&rewritten, "added_manifests_count"),
    );
    assert!(
        merged >= 2 * added,
        "{merged} manifests merged into {added}"
    );
    // Replaced 1 ms ago at least: the expiry's read grace is the table's maximum age.
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let expired = query(&session, "CALL system.expire_snapshots('shop.orders')").await;
    assert_eq!(column_u64(&expired, "expired_snapshots_count"), 3);
    assert!(
        column_u64(&expired, "deleted_data_files_count") > 0,
        "the compacted files"
    );
    let after = query(&session, lake_table).await;
    assert_eq!(column_u64(&after, "snapshots"), 1);
    assert_eq!(column_u64(&after, "manifests"), 1);
    assert_eq!(
        column_u64(&after, "data_files"),
        column_u64(&before, "data_files")
    );
    let snapshots = query(
        &session,
        "SELECT count(DISTINCT snapshot_id) AS n FROM system.lake_snapshots \
         WHERE table_name = 'shop.orders'",
    )
    .await;
    assert_eq!(
        int64s(&snapshots, 0),
        vec![1],
        "expired snapshots are forgotten"
    );
    // An orphan, as a writer that crashed before its commit leaves one: kept while it is
    // younger than the grace, removed once it is older. A grace under a day is refused:
    // a younger file may be another engine's commit in flight.
    let stray = node
        .dir
        .path()
        .join("lake/warehouse/shop/orders/data/stray.parquet");
    std::fs::write(&stray, b"never committed").expect("write a stray file");
    let orphans = query(&session, "CALL system.remove_orphan_files('shop.orders')").await;
    let removed: usize = orphans.iter().map(RecordBatch::num_rows).sum();
    assert_eq!(removed, 0, "nothing older than three days");
    assert!(stray.exists());
    let bad_age = error(
        &session,
        "CALL system.remove_orphan_files('shop.orders', 'soon')",
    )
    .await;
    assert!(
        bad_age.contains("how old an orphan file must be"),
        "{bad_age}"
    );
    let too_young = error(
        &session,
        "CALL system.remove_orphan_files('shop.orders', '0s')",
    )
    .await;
    assert!(too_young.contains("at least 24 hours"), "{too_young}");
    let two_days_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(2 * 86_400);
    let file = std::fs::File::options().write(true).open(&stray);
    file.and_then(|f| f.set_modified(two_days_ago))
        .expect("age the stray file");
    let orphans = query(
        &session,
        "CALL system.remove_orphan_files('shop.orders', '1d')",
    )
    .await;
    let removed: Vec<String> = orphans
        .iter()
        .flat_map(|batch| {
            let locations = batch.column(0).as_string::<i32>();
            locations
                .iter()
                .flatten()
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(removed.len(), 1, "{removed:?}");
    assert!(removed[0].ends_with("/data/stray.parquet"), "{removed:?}");
    assert!(!stray.exists());

    query(&session, "ALTER TABLE shop.orders ADD COLUMN note VARCHAR").await;
    query(
        &session,
        "INSERT INTO shop.orders VALUES ('wed', 7, 'oil', 1, 'late')",
    )
    .await;
    let rows = query(
        &session,
        "SELECT id, qty, note FROM shop.orders ORDER BY day, id",
    )
    .await;
    assert_eq!(int64s(&rows, 0), vec![1, 2, 1, 7]);
    let notes: Vec<Option<String>> = rows
        .iter()
        .flat_map(|b| {
            let column = b.column(2).as_string::<i32>();
            (0..b.num_rows()).map(move |i| column.is_valid(i).then(|| column.value(i).to_string()))
        })
        .collect();
    assert_eq!(notes, vec![None, None, None, Some("late".to_string())]);

    query(&session, "DROP TABLE shop.orders").await;
    let gone = error(&session, "SELECT * FROM shop.orders").await;
    assert!(
        gone.contains("not found"),
        "a dropped table is gone: {gone}"
    );
    query(&session, "DROP TABLE IF EXISTS shop.orders").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_ddl_and_calls_are_clear_errors() {
    let node = TestNode::start().await;
    let session = session(&node.client).await;
    let session = &session;
    let message = error(session, "CREATE TABLE t (a INT) WITH ('bucket.nmu' = '3')").await;
    assert!(message.contains("bucket.nmu"), "{message}");
    let message = error(session, "CREATE TABLE t (a INT) PARTITIONED BY (b)").await;
    assert!(message.contains('b'), "{message}");
    let message = error(session, "CREATE TABLE t (a INT, PRIMARY KEY (z))").await;
    assert!(message.contains('z'), "{message}");
    let message = error(session, "CREATE TABLE t AS SELECT 1").await;
    assert!(message.contains("INSERT INTO"), "{message}");
    let message = error(session, "DROP TABLE nope").await;
    assert!(message.contains("nope"), "{message}");
    let message = error(session, "CALL system.nope('t')").await;
    assert!(message.contains("system.tier"), "{message}");
    let message = error(session, "CALL system.tier()").await;
    assert!(message.contains("one table name"), "{message}");
    let message = error(session, "CALL system.tier('missing')").await;
    assert!(message.contains("missing"), "{message}");
    let message = error(session, "ALTER TABLE nope ADD COLUMN b INT").await;
    assert!(message.contains("nope"), "{message}");

    query(session, "CREATE TABLE t (a BIGINT NOT NULL)").await;
    query(session, "CREATE TABLE IF NOT EXISTS t (a BIGINT NOT NULL)").await;
    let message = error(session, "CREATE TABLE t (a BIGINT NOT NULL)").await;
    assert!(message.contains("exists"), "{message}");
    let message = error(session, "ALTER TABLE t DROP COLUMN a").await;
    assert!(message.contains("ADD COLUMN"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lake_and_changelog_views() {
    let node = TestNode::start().await;
    let session = session(&node.client).await;
    query(
        &session,
        "CREATE TABLE kv (id BIGINT NOT NULL, v VARCHAR, PRIMARY KEY (id)) \
         WITH ('bucket.num' = '2', 'lake.enabled' = 'true', 'lake.freshness' = '1h')",
    )
    .await;
    query(
        &session,
        "INSERT INTO kv VALUES (1, 'a'), (2, 'b'), (3, 'c')",
    )
    .await;
    query(&session, "CALL system.tier('kv')").await;
    query(&session, "UPDATE kv SET v = 'B' WHERE id = 2").await;
    query(&session, "DELETE FROM kv WHERE id = 3").await;

    // The lake is the last round's state; the table is now's.
    let lake = query(&session, "SELECT id, v FROM \"kv$lake\" ORDER BY id").await;
    assert_eq!(int64s(&lake, 0), vec![1, 2, 3]);
    let now = query(&session, "SELECT id, v FROM kv ORDER BY id").await;
    assert_eq!(int64s(&now, 0), vec![1, 2]);

    // The changelog: every change with its type, offset and commit time, per bucket.
    let changes = query(
        &session,
        "SELECT id, _change_type, v FROM \"kv$changelog\" ORDER BY id, _log_offset",
    )
    .await;
    let rows: Vec<(i64, String, Option<String>)> = changes
        .iter()
        .flat_map(|b| {
            let ids = b.column(0).as_primitive::<Int64Type>().clone();
            let types = b.column(1).as_string::<i32>().clone();
            let values = b.column(2).as_string::<i32>().clone();
            (0..b.num_rows()).map(move |i| {
                let value = values.is_valid(i).then(|| values.value(i).to_string());
                (ids.value(i), types.value(i).to_string(), value)
            })
        })
        .collect();
    let expected = [
        (1, "+I", "a"),
        (2, "+I", "b"),
        (2, "-U", "b"),
        (2, "+U", "B"),
        (3, "+I", "c"),
        (3, "-D", "c"),
    ];
    let expected: Vec<(i64, String, Option<String>)> = expected
        .iter()
        .map(|(id, change, v)| (*id, change.to_string(), Some(v.to_string())))
        .collect();
    assert_eq!(rows, expected);
    let stamped = query(
        &session,
        "SELECT count(*) FROM \"kv$changelog\" WHERE _commit_timestamp > TIMESTAMP '2020-01-01T00:00:00Z'",
    )
    .await;
    assert_eq!(int64s(&stamped, 0), vec![6]);

    for sql in [
        "INSERT INTO \"kv$lake\" VALUES (9, 'x')",
        "DELETE FROM \"kv$changelog\" WHERE id = 1",
    ] {
        let message = error(&session, sql).await;
        assert!(message.contains("read-only"), "{sql}: {message}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_sees_tables_other_clients_change() {
    let node = TestNode::start().await;
    let (mine, theirs) = (session(&node.client).await, session(&node.client).await);
    query(
        &theirs,
        "CREATE TABLE shared (id BIGINT NOT NULL, PRIMARY KEY (id))",
    )
    .await;
    query(&theirs, "INSERT INTO shared VALUES (1), (2)").await;
    assert_eq!(
        int64s(&query(&mine, "SELECT count(*) FROM shared").await, 0),
        [2]
    );
    query(&theirs, "ALTER TABLE shared ADD COLUMN note VARCHAR").await;
    query(&theirs, "INSERT INTO shared VALUES (3, 'new')").await;
    assert_eq!(
        int64s(
            &query(&mine, "SELECT id FROM shared WHERE note = 'new'").await,
            0
        ),
        [3]
    );
    query(&theirs, "DROP TABLE shared").await;
    let message = error(&mine, "SELECT * FROM shared").await;
    assert!(message.contains("shared"), "{message}");
}
