//! Other engines read mink's lake: pyiceberg, through the same SQLite catalog, sees
//! exactly the rows of the last tiering round (for a primary-key table, with the round's
//! position deletes applied).

use std::path::PathBuf;
use std::process::Command;

use mink_core::protocol::BucketId;

use crate::pk_support::{Cells, Key, State, lake_rows, lake_values, pk_keys, pk_lake_table};
use crate::support::{TestNode, events, events_table, lake_options};

/// The Python with pyiceberg: `MINK_PYTHON`, else the `.venv` that `scripts/test.sh`
/// creates at the workspace root.
pub(crate) fn python() -> PathBuf {
    if let Ok(python) = std::env::var("MINK_PYTHON") {
        return PathBuf::from(python);
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    assert!(
        venv.exists(),
        "no Python with pyiceberg: run scripts/test.sh (it installs one into .venv) or set MINK_PYTHON"
    );
    venv
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pyiceberg_reads_exactly_the_last_round() {
    let node = TestNode::start().await;
    let options = lake_options();
    let table = node
        .client
        .create_table(&events_table("pylake", 3, options), false)
        .await
        .expect("create");
    let tiered: Vec<i64> = (0..500).collect();
    node.client
        .write(&table, &events(&table, &tiered))
        .await
        .expect("write");
    let report = node.client.tier(&table.path).await.expect("tier");
    assert_eq!(report.rows, 500);
    // Rows after the round are in the log only.
    node.client
        .write(&table, &events(&table, &(500..600).collect::<Vec<_>>()))
        .await
        .expect("write");

    let output = Command::new(python())
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/python/read_lake.py"
        ))
        .arg(node.dir.path())
        .args(["test", "pylake"])
        .output()
        .expect("run python");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "pyiceberg failed: {stderr}");
    let answer = String::from_utf8_lossy(&output.stdout);
    let expected_ids = format!("\"ids\": {}", serde_like_list(&tiered));
    assert!(answer.contains("\"rows\": 500"), "{answer}");
    assert!(answer.contains(&expected_ids), "{answer}");
    assert!(
        answer.contains(
            "\"columns\": [\"id\", \"name\", \"__bucket\", \"__offset\", \"__timestamp\"]"
        ),
        "{answer}"
    );
    // The union read, unlike the lake, has the newer rows too.
    let mut union_rows = 0;
    for bucket in 0..3 {
        union_rows += node
            .client
            .union(&BucketId::new(&table.path, bucket), &[0], &[])
            .await
            .expect("union")
            .num_rows();
    }
    assert_eq!(union_rows, 600);
}

/// `[0, 1, 2]` as Python's json prints a list of integers.
fn serde_like_list(values: &[i64]) -> String {
    let items: Vec<String> = values.iter().map(ToString::to_string).collect();
    format!("[{}]", items.join(", "))
}

/// A row of a `pk_lake_table` as Python's json prints `[dt, id, seq, v, n]`.
fn json_row((key, (v, n)): (&Key, &Cells)) -> String {
    let v = v
        .as_ref()
        .map_or("null".to_string(), |v| format!("\"{v}\""));
    let n = n.map_or("null".to_string(), |n| n.to_string());
    format!("[\"{}\", {}, {}, {v}, {n}]", key.0, key.1, key.2)
}

/// pyiceberg's current snapshot of `test.NAME` and its rows as [`json_row`] prints them,
/// sorted.
fn pyiceberg_rows(node: &TestNode, name: &str) -> (i64, Vec<String>) {
    let output = Command::new(python())
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/python/read_lake_rows.py"
        ))
        .arg(node.dir.path())
        .args(["test", name])
        .output()
        .expect("run python");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "pyiceberg failed: {stderr}");
    let answer = String::from_utf8_lossy(&output.stdout);
    let mut lines = answer.lines();
    let snapshot = lines
        .next()
        .and_then(|line| line.strip_prefix("snapshot "))
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("no current snapshot: {answer}"));
    assert_eq!(
        lines.next(),
        Some("columns [\"dt\", \"id\", \"seq\", \"v\", \"n\"]"),
        "{answer}"
    );
    (snapshot, lines.map(str::to_string).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pyiceberg_reads_a_primary_key_lake_as_of_the_last_round() {
    let node = TestNode::start().await;
    let client = &node.client;
    // Snapshots are kept 1 ms, so an expiry leaves the current one only.
    let mut table = pk_lake_table("pypk", 3);
    table
        .lake_properties
        .insert("history.expire.max-snapshot-age-ms".into(), "1".into());
    let table = client.create_table(&table, false).await.expect("create");
    let key = |id: i64| -> Key {
        let dt = ["2024-01-01", "2024-01-02"][id as usize % 2];
        (dt.to_string(), id, (id / 2 % 2) as i32)
    };
    let mut state = State::new();
    let t = &table;
    let upsert = |rows: Vec<(Key, Cells)>| {
        let batch = lake_rows(t, &rows);
        async move { client.write(t, &batch).await.expect("upsert") }
    };
    let delete = |keys: Vec<Key>| {
        let batch = pk_keys(&keys);
        async move { client.delete(t, &batch).await.expect("delete") }
    };

    // Round 1: 40 keys over two partitions.
    let rows: Vec<(Key, Cells)> = (0..40)
        .map(|id| (key(id), (Some(format!("a{id}")), Some(id))))
        .collect();
    upsert(rows.clone()).await;
    state.extend(rows);
    let first = client.tier(&table.path).await.expect("tier");
    assert_eq!((first.rows, first.deleted_rows), (40, 0), "{first:?}");

    // Round 2: updates (one to nulls), deletes, new keys, and a key inserted and deleted
    // within the round.
    let mut rows: Vec<(Key, Cells)> = (0..10)
        .map(|id| (key(id), (Some(format!("b{id}")), Some(100 + id))))
        .collect();
    rows.push((key(3), (None, None)));
    rows.extend((50..55).map(|id| (key(id), (Some(format!("new{id}")), None))));
    rows.push((key(60), (Some("fleeting".into()), Some(60))));
    upsert(rows.clone()).await;
    state.extend(rows);
    let gone: Vec<Key> = (30..36).map(key).chain([key(60)]).collect();
    delete(gone.clone()).await;
    for k in &gone {
        state.remove(k);
    }
    let second = client.tier(&table.path).await.expect("tier");
    assert_eq!(
        (second.rows, second.deleted_rows),
        (15, 16),
        "10 updated and 5 new keys written; 10 updated and 6 deleted lake rows deleted: {second:?}"
    );
    assert!(second.delete_files > 0, "{second:?}");
    let snapshot_id = second.snapshot_id.expect("round 2 committed");
    let tiered = state.clone();

    // After the round, in the log only: updates, deletes (of an older and of a round-2
    // key), new keys.
    let rows: Vec<(Key, Cells)> = (10..15)
        .map(|id| (key(id), (Some(format!("c{id}")), Some(200 + id))))
        .chain((70..75).map(|id| (key(id), (Some(format!("late{id}")), Some(id)))))
        .collect();
    upsert(rows.clone()).await;
    state.extend(rows);
    let gone: Vec<Key> = (15..20).map(key).chain([key(50), key(0)]).collect();
    delete(gone.clone()).await;
    for k in &gone {
        state.remove(k);
    }

    let mut expected: Vec<String> = tiered.iter().map(json_row).collect();
    expected.sort();
    let (snapshot, rows) = pyiceberg_rows(&node, "pypk");
    assert_eq!(
        snapshot, snapshot_id,
        "pyiceberg reads the last round's snapshot"
    );
    assert_eq!(
        rows, expected,
        "pyiceberg sees the table as of round 2: updated values, deleted keys gone, \
         later changes absent"
    );

    // A compaction folds the deletes into new files: pyiceberg reads its `replace`
    // snapshot, with the same rows.
    let compacted = client.compact(&table.path).await.expect("compact");
    let compacted_id = compacted.snapshot_id.expect("a compaction snapshot");
    let (snapshot, rows) = pyiceberg_rows(&node, "pypk");
    assert_eq!(snapshot, compacted_id, "{compacted:?}");
    assert_eq!(rows, expected, "the compaction changes no row");

    // Lake upkeep: merged manifests, then every snapshot but that one expired and the
    // files only they read deleted. pyiceberg reads the same rows.
    let rewritten = client
        .rewrite_manifests(&table.path)
        .await
        .expect("rewrite");
    let rewritten_id = rewritten.snapshot_id.expect("a rewrite snapshot");
    let expired = client.expire_snapshots(&table.path).await.expect("expire");
    assert_eq!(expired.expired_snapshots.len(), 3, "{expired:?}");
    assert!(expired.data_files_deleted > 0, "{expired:?}");
    let (snapshot, rows) = pyiceberg_rows(&node, "pypk");
    assert_eq!(snapshot, rewritten_id, "{rewritten:?}");
    assert_eq!(rows, expected, "upkeep changes no row");

    // The union read, unlike the lake, has the later changes too.
    let mut union = Vec::new();
    for status in client.list_buckets(&table.path).await.expect("buckets") {
        let bucket = status.bucket.expect("bucket id");
        union.extend(
            client
                .union(&bucket, &[], &[])
                .await
                .expect("union")
                .batches
                .iter()
                .flat_map(lake_values),
        );
    }
    union.sort();
    let now: Vec<(Key, Cells)> = state.into_iter().collect();
    assert_eq!(union, now);
}
