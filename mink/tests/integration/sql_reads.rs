//! SQL over mink tables (DataFusion with mink-sql): random histories of upserts,
//! deletes, tiering rounds and compactions on a partitioned primary-key table with a lake,
//! checked after every step against a model with plain and filtered queries. Updates move
//! rows across the filter's boundary, so a tail index built from a filtered tail would let
//! the old lake version resurrect.

use std::sync::Arc;

use arrow::array::{AsArray, RecordBatch};
use mink_client::MinkClient;
use mink_lake::storage::LakeStorage;
use mink_sql::session::MinkSession;
use object_store::local::LocalFileSystem;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::pk_support::{
    Cells, Key, State, delete_some_keys, lake_rows, lake_values, pk_lake_table,
};
use crate::support::{TestNode, seed};
use crate::workers::TestWorkers;

const STEPS: usize = 40;

pub(crate) async fn session(client: &MinkClient) -> MinkSession {
    let storage = LakeStorage::new(Arc::new(LocalFileSystem::new()), "");
    MinkSession::connect(client.clone(), storage)
        .await
        .expect("session")
}

/// The message of a statement that must fail (planning or running).
pub(crate) async fn error(session: &MinkSession, sql: &str) -> String {
    let result = match session.sql(sql).await {
        Ok(frame) => frame.collect().await.map(|_| ()),
        Err(error) => Err(error),
    };
    result.expect_err(sql).to_string()
}

pub(crate) async fn query(session: &MinkSession, sql: &str) -> Vec<RecordBatch> {
    session
        .sql(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .collect()
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

fn rows(batches: &[RecordBatch]) -> Vec<(Key, Cells)> {
    let mut rows: Vec<_> = batches.iter().flat_map(lake_values).collect();
    rows.sort();
    rows
}

const DATES: [&str; 2] = ["2024-01-01", "2024-01-02"];

fn random_key(rng: &mut StdRng) -> Key {
    let dt = DATES[rng.random_range(0..2)];
    (
        dt.to_string(),
        rng.random_range(0..20),
        rng.random_range(0..2),
    )
}

/// A row as SQL `VALUES` text.
fn sql_row(((dt, id, seq), (v, n)): &(Key, Cells)) -> String {
    let v = v.as_ref().map_or("NULL".to_string(), |v| format!("'{v}'"));
    let n = n.map_or("NULL".to_string(), |n| n.to_string());
    format!("('{dt}', {id}, {seq}, {v}, {n})")
}

/// The count a DML statement answers.
pub(crate) fn count(batches: &[RecordBatch]) -> usize {
    let column = batches[0].column(0);
    let counts = column
        .as_any()
        .downcast_ref::<arrow::array::UInt64Array>()
        .unwrap_or_else(|| panic!("a count, not {:?}", column.data_type()));
    counts.value(0) as usize
}

fn random_cells(rng: &mut StdRng) -> Cells {
    let v = (!rng.random_ratio(1, 5)).then(|| format!("v{}", rng.random_range(0..10)));
    (v, Some(rng.random_range(0..100)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_histories_through_sql_match_the_model() {
    let seed = seed("random_histories_through_sql_match_the_model");
    let mut rng = StdRng::seed_from_u64(seed);
    let node = TestNode::start().await;
    let client = &node.client;
    let table = client
        .create_table(&pk_lake_table("sql", 2), false)
        .await
        .expect("create");
    let mut model = State::new();
    let session = session(client).await;
    // Every read is run on the server and again on three workers.
    let workers = TestWorkers::start(3, client).await;
    let distributed = workers.session(client, 1).await;
    for step in 0..STEPS {
        match rng.random_range(0..14) {
            0..=2 => {
                let upserts: Vec<(Key, Cells)> = (0..rng.random_range(1..8))
                    .map(|_| (random_key(&mut rng), random_cells(&mut rng)))
                    .collect();
                // The last write of a key in a batch wins, as in the model.
                client
                    .write(&table, &lake_rows(&table, &upserts))
                    .await
                    .expect("upsert");
                model.extend(upserts);
            }
            3 | 4 => {
                let upserts: Vec<(Key, Cells)> = (0..rng.random_range(1..5))
                    .map(|_| (random_key(&mut rng), random_cells(&mut rng)))
                    .collect();
                let values: Vec<String> = upserts.iter().map(sql_row).collect();
                let sql = format!("INSERT INTO test.sql VALUES {}", values.join(", "));
                assert_eq!(count(&query(&session, &sql).await), upserts.len());
                model.extend(upserts);
            }
            5 | 6 => {
                // Moves rows across the n < 50 boundary of the checks below.
                let (id, n) = (rng.random_range(0..20), rng.random_range(0..100));
                let sql = format!("UPDATE test.sql SET n = {n}, v = 'u' WHERE id = {id}");
                let changed = count(&query(&session, &sql).await);
                let mut expected = 0;
                for ((_, key_id, _), cells) in model.iter_mut() {
                    if *key_id == id {
                        *cells = (Some("u".into()), Some(n));
                        expected += 1;
                    }
                }
                assert_eq!(changed, expected, "seed {seed} step {step}: {sql}");
            }
            7 => {
                let (dt, n) = (DATES[rng.random_range(0..2)], rng.random_range(0..100));
                let sql = format!("DELETE FROM test.sql WHERE dt = '{dt}' AND n >= {n}");
                let deleted = count(&query(&session, &sql).await);
                let before = model.len();
                model.retain(|(key_dt, _, _), (_, key_n)| {
                    !(key_dt == dt && key_n.is_some_and(|k| k >= n))
                });
                assert_eq!(
                    deleted,
                    before - model.len(),
                    "seed {seed} step {step}: {sql}"
                );
            }
            8 if rng.random_bool(0.5) => {
                // The whole key: the rows to delete are found by lookup.
                let key = random_key(&mut rng);
                let (dt, id, seq) = &key;
                let sql =
                    format!("DELETE FROM test.sql WHERE dt = '{dt}' AND id = {id} AND seq = {seq}");
                let deleted = count(&query(&session, &sql).await);
                let expected = usize::from(model.remove(&key).is_some());
                assert_eq!(deleted, expected, "seed {seed} step {step}: {sql}");
            }
            8 => {
                delete_some_keys(client, &table, &mut model, &mut rng).await;
            }
            9..=11 => {
                client.tier(&table.path).await.expect("tier");
            }
            _ => {
                client.compact(&table.path).await.expect("compact");
            }
        }
        let key = random_key(&mut rng);
        let limit = rng.random_range(1..30);
        for (reader, on) in [(&session, "the server"), (&distributed, "3 workers")] {
            let context = format!("seed {seed} step {step} on {on}");
            check_reads(reader, &model, &key, limit, &context).await;
        }
    }
}

/// The reads of `model`'s rows through `session`: every row, filters pushed down and
/// left to DataFusion, a lookup of `key`, a `LIMIT limit`.
async fn check_reads(session: &MinkSession, model: &State, key: &Key, limit: usize, context: &str) {
    let all: Vec<(Key, Cells)> = model.clone().into_iter().collect();
    assert_eq!(
        rows(&query(session, "SELECT * FROM test.sql").await),
        all,
        "{context}: every row"
    );
    let low: Vec<_> = all
        .iter()
        .filter(|(_, (_, n))| n.is_some_and(|n| n < 50))
        .cloned()
        .collect();
    assert_eq!(
        rows(&query(session, "SELECT * FROM test.sql WHERE n < 50").await),
        low,
        "{context}: n < 50 (pushed down, exact)"
    );
    let named: Vec<_> = all
        .iter()
        .filter(|((dt, _, _), (v, n))| {
            dt == "2024-01-02" && v.is_some() && n.is_some_and(|n| n >= 50)
        })
        .cloned()
        .collect();
    assert_eq!(
        rows(
            &query(
                session,
                "SELECT dt, id, seq, v, n FROM test.sql \
                     WHERE dt = '2024-01-02' AND v IS NOT NULL AND 50 <= n",
            )
            .await
        ),
        named,
        "{context}: a partition, a null check and a flipped comparison"
    );
    let (dt, id, seq) = key;
    let point = model.get(key).map(|cells| (key.clone(), cells.clone()));
    let sql = format!("SELECT * FROM test.sql WHERE dt = '{dt}' AND id = {id} AND seq = {seq}");
    assert_eq!(
        rows(&query(session, &sql).await),
        Vec::from_iter(point),
        "{context}: {sql} (a lookup)"
    );
    let sql = format!("SELECT * FROM test.sql LIMIT {limit}");
    let limited = rows(&query(session, &sql).await);
    assert_eq!(limited.len(), all.len().min(limit), "{context}: {sql}");
    assert!(
        limited.iter().all(|row| all.contains(row)),
        "{context}: {sql} returned a row that is not current: {limited:?}"
    );
    let counted = query(
        session,
        "SELECT count(*) AS c FROM test.sql WHERE length(v) = 2 OR v IS NULL",
    )
    .await;
    let expected = all
        .iter()
        .filter(|(_, (v, _))| v.as_ref().is_none_or(|v| v.len() == 2))
        .count();
    let counted = counted[0]
        .column(0)
        .as_any()
        .downcast_ref::<arrow::array::Int64Array>()
        .expect("count")
        .value(0);
    assert_eq!(
        counted as usize, expected,
        "{context}: a filter left to DataFusion"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_shows_the_union_read_as_a_tree_with_its_counters() {
    let node = TestNode::start().await;
    let client = &node.client;
    let table = client
        .create_table(&pk_lake_table("explained", 2), false)
        .await
        .expect("create");
    let row = |id: i64, n: i64| {
        (
            ("2024-01-01".to_string(), id, 0),
            (Some("a".into()), Some(n)),
        )
    };
    let lake: Vec<(Key, Cells)> = (0..10).map(|id| row(id, id)).collect();
    client
        .write(&table, &lake_rows(&table, &lake))
        .await
        .expect("write");
    client.tier(&table.path).await.expect("tier");
    // After the round, keys 1 and 2 change (-U and +U each): their lake rows are dropped
    // by the merge.
    let tail = [row(1, 100), row(2, 200)];
    client
        .write(&table, &lake_rows(&table, &tail))
        .await
        .expect("write the tail");
    let session = session(client).await;
    let sql = "SELECT id FROM test.explained WHERE n > 3 AND length(v) = 1";
    let text = plan_text(&session, &format!("EXPLAIN {sql}")).await;
    for part in [
        // The node's lake index (from the round) located the changed keys' lake rows.
        "KeyMergeExec: key=[dt, id, seq], lake_merge=positions",
        "DataSourceExec: file_groups={2 groups",
        "file_type=parquet",
        "pruning_predicate=n_null_count",
        "LogRangeExec: buckets=",
        // The leaders fold the 4 changes to their live rows.
        "log_rows=4, rows=live",
        "FilterExec",
    ] {
        assert!(text.contains(part), "EXPLAIN shows {part}: {text}");
    }
    let analyzed = plan_text(&session, &format!("EXPLAIN ANALYZE {sql}")).await;
    for part in [
        // Keys 1 and 2, as the leader folded them.
        "log_rows=2",
        // The scan left out the changed keys' 2 lake rows: the merge drops none.
        "lake_rows=8",
        "row_groups_pruned_statistics",
    ] {
        assert!(
            analyzed.contains(part),
            "EXPLAIN ANALYZE shows {part}: {analyzed}"
        );
    }
    let mut ids = ids_of(&query(&session, sql).await);
    ids.sort_unstable();
    assert_eq!(ids, [1, 2, 4, 5, 6, 7, 8, 9], "the merged rows");
    let unknown = session.sql("SELECT * FROM test.nope").await;
    assert!(
        unknown.is_err_and(|e| e.to_string().contains("nope")),
        "an unknown table is named"
    );
}

/// A plan as text.
async fn plan_text(session: &MinkSession, sql: &str) -> String {
    let plan = query(session, sql).await;
    arrow::util::pretty::pretty_format_batches(&plan)
        .expect("format")
        .to_string()
}

/// The `id` column of every row.
fn ids_of(batches: &[RecordBatch]) -> Vec<i64> {
    batches
        .iter()
        .flat_map(|b| {
            b.column_by_name("id")
                .expect("id")
                .as_primitive::<arrow::datatypes::Int64Type>()
                .values()
                .to_vec()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_writes_through_sql_are_clear_errors() {
    let node = TestNode::start().await;
    let client = &node.client;
    client
        .create_table(&pk_lake_table("guarded", 1), false)
        .await
        .expect("create");
    let log = crate::support::events_table("appended", 1, Default::default());
    client.create_table(&log, false).await.expect("create");
    let session = session(client).await;
    let session = &session;
    let message = error(session, "UPDATE test.guarded SET id = 3 WHERE n = 1").await;
    assert!(message.contains("primary key"), "{message}");
    let message = error(session, "DELETE FROM test.appended WHERE id = 1").await;
    assert!(message.contains("log table"), "{message}");
    let message = error(session, "UPDATE test.appended SET name = 'x'").await;
    assert!(message.contains("log table"), "{message}");
    let message = error(
        session,
        "INSERT INTO test.guarded VALUES ('d', 'not a number', 0, 'v', 1)",
    )
    .await;
    assert!(message.to_lowercase().contains("cast"), "{message}");
    let message = error(
        session,
        "INSERT INTO test.guarded VALUES (NULL, 1, 0, 'v', 1)",
    )
    .await;
    assert!(
        message.contains("null") || message.contains("NULL"),
        "{message}"
    );
    let message = error(session, "SELEC 1").await;
    assert!(message.contains("SELEC"), "{message}");

    // Appending to the log table works, and the rows read back.
    let inserted = query(
        session,
        "INSERT INTO test.appended VALUES (1, 'a'), (2, NULL)",
    )
    .await;
    assert_eq!(count(&inserted), 2);
    let read = query(
        session,
        "SELECT count(*) FROM test.appended WHERE name IS NULL",
    )
    .await;
    let nulls = read[0]
        .column(0)
        .as_any()
        .downcast_ref::<arrow::array::Int64Array>()
        .expect("count")
        .value(0);
    assert_eq!(nulls, 1);
}
