//! `table_changes('t', from, to)` over a real node: random histories of upserts,
//! deletes, tiering rounds and compactions on a partitioned primary-key table with a
//! lake, the table as of every recorded lake snapshot kept by the test. For random pairs
//! of snapshots listed by `system.lake_snapshots`, the changed rows applied in the order
//! they come (deletes by key, each carrying the row it removes; inserts of absent keys)
//! to the table as of `from` give the table as of `to`. Then the function's errors.

use std::collections::BTreeMap;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{Int32Type, Int64Type};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::pk_support::{
    Cells, Key, State, delete_some_keys, lake_rows, lake_values, pk_lake_table,
};
use mink_sql::session::MinkSession;

use crate::sql_reads::{error, query, session};
use crate::support::{TestNode, seed};

const STEPS: usize = 40;

/// Pairs of snapshots checked after the history.
const PAIRS: usize = 25;

fn random_key(rng: &mut StdRng) -> Key {
    let dt = ["2024-01-01", "2024-01-02"][rng.random_range(0..2)];
    (
        dt.to_string(),
        rng.random_range(0..15),
        rng.random_range(0..2),
    )
}

fn random_cells(rng: &mut StdRng) -> Cells {
    let v = (!rng.random_ratio(1, 5)).then(|| format!("v{}", rng.random_range(0..10)));
    (v, Some(rng.random_range(0..100)))
}

/// A changed row: its change type, snapshot, key and other columns.
type Change = (String, i64, Key, Cells);

fn changes(batches: &[RecordBatch]) -> Vec<Change> {
    batches
        .iter()
        .flat_map(|batch| {
            let kinds = batch
                .column_by_name("_change_type")
                .expect("_change_type")
                .as_string::<i32>()
                .clone();
            let snapshots = batch
                .column_by_name("_snapshot_id")
                .expect("_snapshot_id")
                .as_primitive::<Int64Type>()
                .clone();
            lake_values(batch)
                .into_iter()
                .enumerate()
                .map(move |(i, (key, cells))| {
                    (kinds.value(i).to_string(), snapshots.value(i), key, cells)
                })
        })
        .collect()
}

/// `changes` applied to `from` by key; panics on a delete of a row that is not there or
/// an insert of a key that is.
fn apply(from: &State, changes: &[Change], context: &str) -> State {
    let mut state = from.clone();
    for (kind, snapshot, key, cells) in changes {
        match kind.as_str() {
            "delete" => assert_eq!(
                state.remove(key).as_ref(),
                Some(cells),
                "{context}: snapshot {snapshot} deletes {key:?} as it was"
            ),
            "insert" => assert_eq!(
                state.insert(key.clone(), cells.clone()),
                None,
                "{context}: snapshot {snapshot} inserts {key:?}, absent"
            ),
            other => panic!("{context}: change type {other}"),
        }
    }
    state
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_between_snapshots_take_the_table_from_one_to_the_other() {
    let seed = seed("changes_between_snapshots_take_the_table_from_one_to_the_other");
    let mut rng = StdRng::seed_from_u64(seed);
    let node = TestNode::start().await;
    let client = &node.client;
    let table = client
        .create_table(&pk_lake_table("changes", 2), false)
        .await
        .expect("create");
    let mut now = State::new();
    // Every recorded lake snapshot, oldest first, and the table as of it.
    let mut snapshots: Vec<(i64, State)> = Vec::new();
    for _ in 0..STEPS {
        match rng.random_range(0..10) {
            0..=3 => {
                let upserts: Vec<(Key, Cells)> = (0..rng.random_range(1..8))
                    .map(|_| (random_key(&mut rng), random_cells(&mut rng)))
                    .collect();
                client
                    .write(&table, &lake_rows(&table, &upserts))
                    .await
                    .expect("upsert");
                now.extend(upserts);
            }
            4 | 5 => {
                delete_some_keys(client, &table, &mut now, &mut rng).await;
            }
            6..=8 => {
                let report = client.tier(&table.path).await.expect("tier");
                if let Some(id) = report.snapshot_id {
                    snapshots.push((id, now.clone()));
                }
            }
            _ => {
                let report = client.compact(&table.path).await.expect("compact");
                if let Some(id) = report.snapshot_id {
                    // Same rows, other files.
                    let lake = snapshots.last().expect("compacted a lake").1.clone();
                    snapshots.push((id, lake));
                }
            }
        }
    }
    let report = client.tier(&table.path).await.expect("tier");
    if let Some(id) = report.snapshot_id {
        snapshots.push((id, now.clone()));
    }

    let session = session(client).await;
    let listed = query(
        &session,
        "SELECT DISTINCT snapshot_id FROM system.lake_snapshots \
         WHERE table_name = 'test.changes'",
    )
    .await;
    let mut listed: Vec<i64> = listed
        .iter()
        .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
        .collect();
    listed.sort_unstable();
    let mut known: Vec<i64> = snapshots.iter().map(|(id, _)| *id).collect();
    known.sort_unstable();
    assert_eq!(listed, known, "seed {seed}: system.lake_snapshots");

    let states: BTreeMap<i64, &State> = snapshots.iter().map(|(id, s)| (*id, s)).collect();
    let mut pairs: Vec<(usize, usize)> = (1..snapshots.len()).map(|i| (i - 1, i)).collect();
    for _ in 0..PAIRS {
        let from = rng.random_range(0..snapshots.len());
        pairs.push((from, rng.random_range(from..snapshots.len())));
    }
    for (from, to) in pairs {
        let (from, to) = (snapshots[from].0, snapshots[to].0);
        let context = format!("seed {seed}: table_changes from {from} to {to}");
        let sql = format!("SELECT * FROM table_changes('test.changes', {from}, {to})");
        let changed = changes(&query(&session, &sql).await);
        assert_eq!(
            apply(states[&from], &changed, &context),
            *states[&to],
            "{context}"
        );
        if from != to {
            let message = error(
                &session,
                &format!("SELECT * FROM table_changes('test.changes', {to}, {from})"),
            )
            .await;
            assert!(message.contains("not an ancestor"), "{context}: {message}");
        }
    }
    // A projection of a few columns, in another order.
    if let [(from, _), .., (to, _)] = snapshots.as_slice() {
        let sql = format!(
            "SELECT _snapshot_id, id, _change_type FROM table_changes('test.changes', {from}, {to})"
        );
        let projected = query(&session, &sql).await;
        let all = query(
            &session,
            &format!("SELECT * FROM table_changes('test.changes', {from}, {to})"),
        )
        .await;
        let rows = |batches: &[RecordBatch]| batches.iter().map(|b| b.num_rows()).sum::<usize>();
        assert_eq!(rows(&projected), rows(&all), "seed {seed}: {sql}");
        if let Some(batch) = projected.first() {
            let schema = batch.schema();
            let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
            assert_eq!(names, ["_snapshot_id", "id", "_change_type"]);
        }
    }
}

/// `users (id, name)`: a primary-key table with a lake, in two buckets.
const CREATE_USERS: &str = "CREATE TABLE users (id BIGINT NOT NULL, name STRING, PRIMARY KEY (id)) \
    WITH ('bucket.num' = '2', 'lake.enabled' = 'true', 'lake.freshness' = '1h')";

async fn tier(session: &MinkSession, table: &str) -> i64 {
    let reply = query(session, &format!("CALL system.tier('{table}')")).await;
    reply[0].column(0).as_primitive::<Int64Type>().value(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_changes_in_sql_and_its_errors() {
    let node = TestNode::start().await;
    let session = session(&node.client).await;
    let session = &session;
    for sql in [
        CREATE_USERS,
        "CREATE TABLE plain (id BIGINT NOT NULL, PRIMARY KEY (id))",
        "INSERT INTO users VALUES (1, 'ann'), (2, 'bob'), (3, 'cy')",
    ] {
        query(session, sql).await;
    }
    let first = tier(session, "users").await;
    query(session, "UPDATE users SET name = 'bo' WHERE id = 2").await;
    query(session, "DELETE FROM users WHERE id = 3").await;
    query(session, "INSERT INTO users VALUES (4, 'dee')").await;
    let second = tier(session, "users").await;

    // Of the one snapshot in between: the old rows deleted, then the new ones inserted;
    // the table is found in the default database.
    let batches = query(
        session,
        &format!(
            "SELECT id, name, _change_type, _snapshot_id \
             FROM table_changes('users', {first}, {second})"
        ),
    )
    .await;
    let mut changed = Vec::new();
    for batch in &batches {
        let ids = batch.column(0).as_primitive::<Int64Type>();
        let names = batch.column(1).as_string::<i32>();
        let kinds = batch.column(2).as_string::<i32>();
        let snapshots = batch.column(3).as_primitive::<Int64Type>();
        for row in 0..batch.num_rows() {
            assert_eq!(snapshots.value(row), second);
            changed.push((
                kinds.value(row).to_string(),
                ids.value(row),
                names.value(row).to_string(),
            ));
        }
    }
    // Within a kind, rows come bucket by bucket.
    let kinds: Vec<&str> = changed.iter().map(|(kind, ..)| kind.as_str()).collect();
    assert_eq!(kinds, ["delete", "delete", "insert", "insert"]);
    changed.sort();
    let expected = [
        ("delete", 2, "bob"),
        ("delete", 3, "cy"),
        ("insert", 2, "bo"),
        ("insert", 4, "dee"),
    ]
    .map(|(kind, id, name)| (kind.to_string(), id, name.to_string()));
    assert_eq!(changed, expected);
    let caught_up = query(
        session,
        &format!("SELECT * FROM table_changes('default.users', {second}, {second})"),
    )
    .await;
    assert_eq!(caught_up.iter().map(|b| b.num_rows()).sum::<usize>(), 0);
    // The statement is parsed as DataFusion parses it (EXPLAIN FORMAT is its own).
    let explained = query(
        session,
        &format!("EXPLAIN FORMAT indent SELECT * FROM table_changes('users', {first}, {second})"),
    )
    .await;
    assert!(!explained.is_empty());
    // A statement finds only the tables looked up for it, never those of one before.
    query(session, "SELECT 1").await;
    let unprepared = format!("SELECT * FROM table_changes('users', {first}, {second})");
    let message = match session.context().sql(&unprepared).await {
        Ok(frame) => frame.collect().await.map(|_| ()),
        Err(error) => Err(error),
    }
    .expect_err(&unprepared)
    .to_string();
    assert!(
        message.contains("not looked up for this statement"),
        "{message}"
    );

    for (sql, wanted) in [
        (
            format!("SELECT * FROM table_changes('nope', {first}, {second})"),
            "default.nope",
        ),
        (
            "SELECT * FROM table_changes('users', 1)".to_string(),
            "takes 3 arguments",
        ),
        (
            format!("SELECT * FROM table_changes('users', 'x', {second})"),
            "from_snapshot_id is an integer snapshot id",
        ),
        (
            format!("SELECT * FROM table_changes('users', {first}, 1.5)"),
            "to_snapshot_id is an integer snapshot id",
        ),
        (
            format!("SELECT * FROM table_changes(users, {first}, {second})"),
            "string literal",
        ),
        (
            format!("SELECT * FROM table_changes('users', 42, {second})"),
            "no snapshot 42",
        ),
        (
            format!("SELECT * FROM table_changes('users', {second}, {first})"),
            "not an ancestor",
        ),
        (
            "SELECT * FROM table_changes('plain', 1, 2)".to_string(),
            "has no lake",
        ),
    ] {
        let message = error(session, &sql).await;
        assert!(message.contains(wanted), "{sql}: {message}");
    }
}

/// Rows of `id BIGINT, name STRING` by id.
type Rows = BTreeMap<i64, String>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_by_sequence_number_restores_the_apply_order() {
    let node = TestNode::start().await;
    let session = session(&node.client).await;
    let session = &session;
    // More than one partition, so that a filter can run in parallel and reorder rows.
    let partitions = session.context().state().config().target_partitions();
    assert!(partitions > 1, "target_partitions {partitions}");
    query(session, CREATE_USERS).await;
    let mut now: Rows = (1..=40).map(|id| (id, format!("a{id}"))).collect();
    let values = |rows: &Rows| {
        rows.iter()
            .map(|(id, name)| format!("({id}, '{name}')"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    query(
        session,
        &format!("INSERT INTO users VALUES {}", values(&now)),
    )
    .await;
    // Every round changes keys of the one before: applied out of order, the rows would
    // delete versions not there yet.
    let mut snapshots = vec![(tier(session, "users").await, now.clone())];
    for round in 1..=4 {
        let upserts: Rows = (round * 5..round * 5 + 20)
            .map(|id| (id, format!("r{round}")))
            .collect();
        query(
            session,
            &format!("INSERT INTO users VALUES {}", values(&upserts)),
        )
        .await;
        now.extend(upserts);
        query(session, &format!("DELETE FROM users WHERE id = {round}")).await;
        now.remove(&round);
        snapshots.push((tier(session, "users").await, now.clone()));
    }
    let (from, first) = &snapshots[0];
    let (to, last) = &snapshots[snapshots.len() - 1];

    let ordered = format!(
        "SELECT id, name, _change_type, _snapshot_id, _sequence_number \
         FROM table_changes('users', {from}, {to}) WHERE id > 0 \
         ORDER BY _sequence_number, _change_type"
    );
    let batches = query(session, &ordered).await;
    let mut state = first.clone();
    let mut order = Vec::new();
    for batch in &batches {
        let ids = batch.column(0).as_primitive::<Int64Type>();
        let names = batch.column(1).as_string::<i32>();
        let kinds = batch.column(2).as_string::<i32>();
        let snapshot_ids = batch.column(3).as_primitive::<Int64Type>();
        let numbers = batch.column(4).as_primitive::<Int64Type>();
        for row in 0..batch.num_rows() {
            let (id, name) = (ids.value(row), names.value(row).to_string());
            match kinds.value(row) {
                "delete" => assert_eq!(state.remove(&id), Some(name), "delete of {id}"),
                "insert" => assert_eq!(state.insert(id, name), None, "insert of {id}"),
                other => panic!("change type {other}"),
            }
            let step = (numbers.value(row), snapshot_ids.value(row));
            if order.last() != Some(&step) {
                order.push(step);
            }
        }
    }
    assert_eq!(&state, last, "{ordered}");
    // Sequence numbers grow with commit order; snapshot ids do not have to.
    assert!(order.is_sorted(), "{order:?}");
    let committed: Vec<i64> = snapshots[1..].iter().map(|(id, _)| *id).collect();
    assert_eq!(
        order.iter().map(|(_, id)| *id).collect::<Vec<_>>(),
        committed
    );

    // The scan declares the order: the filter runs in parallel keeping it, and ORDER BY
    // merges the partitions instead of sorting.
    let plan = query(session, &format!("EXPLAIN {ordered}")).await;
    let plan = arrow::util::pretty::pretty_format_batches(&plan)
        .unwrap()
        .to_string();
    assert!(plan.contains("SortPreservingMergeExec"), "{plan}");
    assert!(!plan.contains("SortExec:"), "{plan}");

    // No column at all: only the rows are counted.
    let count = query(
        session,
        &format!("SELECT count(*) FROM table_changes('users', {from}, {to})"),
    )
    .await;
    let all = query(
        session,
        &format!("SELECT * FROM table_changes('users', {from}, {to})"),
    )
    .await;
    let rows: usize = all.iter().map(|b| b.num_rows()).sum();
    assert!(rows > 0);
    assert_eq!(
        count[0].column(0).as_primitive::<Int64Type>().value(0),
        i64::try_from(rows).unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_column_added_between_snapshots_reads_null_in_older_files() {
    let node = TestNode::start().await;
    let session = session(&node.client).await;
    let session = &session;
    query(session, CREATE_USERS).await;
    query(session, "INSERT INTO users VALUES (1, 'ann'), (2, 'bob')").await;
    let first = tier(session, "users").await;
    query(session, "INSERT INTO users VALUES (3, 'cy')").await;
    let second = tier(session, "users").await;
    query(session, "ALTER TABLE users ADD COLUMN age INT").await;
    query(session, "INSERT INTO users VALUES (4, 'dee', 40)").await;
    query(session, "UPDATE users SET age = 10 WHERE id = 1").await;
    let third = tier(session, "users").await;

    let batches = query(
        session,
        &format!(
            "SELECT id, name, age, _change_type, _snapshot_id \
             FROM table_changes('users', {first}, {third}) \
             ORDER BY _sequence_number, _change_type, id"
        ),
    )
    .await;
    let mut changed = Vec::new();
    for batch in &batches {
        let ids = batch.column(0).as_primitive::<Int64Type>();
        let names = batch.column(1).as_string::<i32>();
        let ages = batch.column(2).as_primitive::<Int32Type>();
        let kinds = batch.column(3).as_string::<i32>();
        let snapshots = batch.column(4).as_primitive::<Int64Type>();
        for row in 0..batch.num_rows() {
            changed.push((
                snapshots.value(row),
                kinds.value(row).to_string(),
                ids.value(row),
                names.value(row).to_string(),
                ages.is_valid(row).then(|| ages.value(row)),
            ));
        }
    }
    let expected = [
        (second, "insert", 3, "cy", None),
        // The old version, from a file written before the column was added.
        (third, "delete", 1, "ann", None),
        (third, "insert", 1, "ann", Some(10)),
        (third, "insert", 4, "dee", Some(40)),
    ]
    .map(|(snapshot, kind, id, name, age)| (snapshot, kind.to_string(), id, name.to_string(), age));
    assert_eq!(changed, expected);
}
