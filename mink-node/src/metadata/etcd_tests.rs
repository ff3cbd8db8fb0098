//! The etcd metadata store against a real etcd (Debian's `etcd-server`, which the test
//! command installs), checked against the SQLite store as its model.

use arrow::datatypes::{DataType, Field, Schema};
use mink_core::options::TableOptions;
use mink_core::table::{TableDescriptor, TablePath};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::error::NodeError;
use crate::testing::Etcd;

fn metadata(etcd: &Etcd, prefix: &str) -> EtcdMetadata {
    EtcdMetadata::connect(std::slice::from_ref(&etcd.endpoint), prefix, "n1").unwrap()
}

fn table(database: &str, name: &str, columns: usize) -> TableDescriptor {
    let fields: Vec<Field> = (0..columns)
        .map(|c| Field::new(format!("c{c}"), DataType::Int32, true))
        .collect();
    TableDescriptor::new(
        TablePath::new(database, name),
        Schema::new(fields),
        vec![],
        vec![],
        TableOptions::default(),
    )
    .unwrap()
}

/// Everything a store holds, as its reads return it, but partition ids (each store
/// numbers partitions its own way: an id is only never used twice).
fn contents(store: &dyn MetadataStore) -> String {
    let mut out = String::new();
    for table in store.load_tables().unwrap() {
        let id = table.table_id;
        out += &format!("{table:?}\n");
        let partitions = store.partitions(id).unwrap();
        let names: Vec<String> = partitions.into_iter().map(|p| p.name).collect();
        out += &format!("  partitions {names:?}\n");
        out += &format!("  snapshots {:?}\n", store.lake_snapshots(id).unwrap());
        out += &format!("  latest {:?}\n", store.latest_lake_snapshot(id).unwrap());
        out += &format!("  pending {:?}\n", store.pending_round(id).unwrap());
    }
    out
}

/// The outcome of a change, errors by kind.
fn outcome<T: std::fmt::Debug>(result: Result<T>) -> String {
    match result {
        Ok(value) => format!("{value:?}"),
        Err(NodeError::TableExists(path)) => format!("exists {path}"),
        Err(NodeError::TableNotFound(path)) => format!("not found {path}"),
        Err(other) => panic!("unexpected error: {other}"),
    }
}

/// Random histories of table, partition and lake changes give the same outcomes and the
/// same contents in etcd as in SQLite. `MINK_ETCD_METADATA_SEEDS` sets how many.
#[test]
fn random_histories_match_the_sqlite_store() {
    let seeds: u64 = std::env::var("MINK_ETCD_METADATA_SEEDS")
        .ok()
        .and_then(|seeds| seeds.parse().ok())
        .unwrap_or(3);
    let etcd = Etcd::start();
    for seed in 0..seeds {
        let dir = tempfile::tempdir().unwrap();
        let model = Metadata::open(&dir.path().join("meta.db")).unwrap();
        let store = metadata(&etcd, &format!("/seed{seed}"));
        let mut rng = StdRng::seed_from_u64(seed);
        let mut partition_ids = std::collections::HashMap::new();
        for step in 0..120 {
            let names = ["a", "b", "c"];
            let path = TablePath::new("db", names[rng.random_range(0..names.len())]);
            let tables = model.load_tables().unwrap();
            let some_table =
                (!tables.is_empty()).then(|| tables[rng.random_range(0..tables.len())].clone());
            let (what, expected, got) = match (rng.random_range(0..9), some_table) {
                (0 | 1, _) | (_, None) => {
                    let new = table(&path.database, &path.name, rng.random_range(1..4));
                    let what = format!("create {path}");
                    (
                        what,
                        outcome(model.create_table(&new)),
                        outcome(store.create_table(&new)),
                    )
                }
                (2, Some(table)) => {
                    let evolved = table
                        .with_added_column(Field::new(format!("x{step}"), DataType::Utf8, true))
                        .unwrap();
                    let what = format!("update {}", table.path);
                    let expected = outcome(model.update_table(&evolved));
                    (what, expected, outcome(store.update_table(&evolved)))
                }
                (3, Some(_)) => {
                    let what = format!("drop {path}");
                    (
                        what,
                        outcome(model.drop_table(&path)),
                        outcome(store.drop_table(&path)),
                    )
                }
                (4, Some(table)) => {
                    let id = table.table_id;
                    let what = format!("delete {id}");
                    (
                        what,
                        outcome(model.delete_table(id)),
                        outcome(store.delete_table(id)),
                    )
                }
                (5, Some(table)) => {
                    let (id, name) = (table.table_id, format!("p={}", rng.random_range(0..3)));
                    let what = format!("ensure partition {id} {name}");
                    let expected = outcome(model.ensure_partition(id, &name).map(|p| p.name));
                    let got = store.ensure_partition(id, &name);
                    if let Ok(partition) = &got {
                        // An id names one partition only, ever.
                        let named = partition_ids.entry(partition.partition_id);
                        assert_eq!(*named.or_insert((id, name.clone())), (id, name.clone()));
                    }
                    (what, expected, outcome(got.map(|p| p.name)))
                }
                (6, Some(table)) => {
                    let id = table.table_id;
                    let first = |store: &dyn MetadataStore| {
                        let partitions = store.partitions(id).unwrap();
                        partitions.first().map_or(-1, |p| p.partition_id)
                    };
                    let what = format!("delete the first partition of {id}");
                    let expected = outcome(model.delete_partition(first(&model)));
                    (
                        what,
                        expected,
                        outcome(store.delete_partition(first(&store))),
                    )
                }
                (7, Some(table)) => {
                    let record = LakeSnapshotRecord {
                        snapshot_id: rng.random_range(0..6),
                        offsets: format!("{{\"0\": {step}}}"),
                        committed_at: step,
                    };
                    let id = table.table_id;
                    let what = format!("record {id} {record:?}");
                    let expected = outcome(model.record_lake_snapshot(id, &record));
                    (
                        what,
                        expected,
                        outcome(store.record_lake_snapshot(id, &record)),
                    )
                }
                (_, Some(table)) => {
                    let id = table.table_id;
                    let forgotten: Vec<i64> = (0..6).filter(|_| rng.random_bool(0.3)).collect();
                    let round = PendingRound {
                        parent_snapshot: rng.random_bool(0.5).then_some(step),
                        files: (0..rng.random_range(0..3))
                            .map(|f| format!("f{step}-{f}"))
                            .collect(),
                    };
                    let what = format!("forget {id} {forgotten:?}, pending {round:?}");
                    let expected = [
                        outcome(model.forget_lake_snapshots(id, &forgotten)),
                        outcome(model.set_pending_round(id, &round)),
                    ];
                    let got = [
                        outcome(store.forget_lake_snapshots(id, &forgotten)),
                        outcome(store.set_pending_round(id, &round)),
                    ];
                    if rng.random_bool(0.3) {
                        model.clear_pending_round(id).unwrap();
                        store.clear_pending_round(id).unwrap();
                    }
                    (what, expected.join(", "), got.join(", "))
                }
            };
            assert_eq!(got, expected, "seed {seed} step {step}: {what}");
            assert_eq!(
                contents(&store),
                contents(&model),
                "seed {seed} step {step}: {what}"
            );
        }
    }
}

/// Nodes creating tables at once get distinct ids, and each path one table.
#[test]
fn concurrent_creates_take_distinct_ids_and_paths() {
    let etcd = Etcd::start();
    let stores: Vec<EtcdMetadata> = (0..4).map(|_| metadata(&etcd, "/race")).collect();
    let created: Vec<Vec<String>> = std::thread::scope(|scope| {
        let creating: Vec<_> = (stores.iter().enumerate())
            .map(|(node, store)| {
                scope.spawn(move || {
                    (0..10)
                        .map(|t| {
                            let shared = table("db", &format!("shared{t}"), 1);
                            let own = table("db", &format!("n{node}t{t}"), 1);
                            outcome(store.create_table(&shared).map(|t| t.table_id));
                            outcome(store.create_table(&own).map(|t| t.table_id))
                        })
                        .collect()
                })
            })
            .collect();
        creating.into_iter().map(|c| c.join().unwrap()).collect()
    });
    let tables = stores[0].load_tables().unwrap();
    assert_eq!(tables.len(), 10 + 4 * 10, "{created:?}");
    let mut ids: Vec<u64> = tables.iter().map(|t| t.table_id).collect();
    ids.dedup();
    assert_eq!(ids.len(), tables.len());
}

/// Each node has its own pending tiering round of a table: a round's reconcile never sees
/// (and deletes the files of) a round another node is still writing. Dropping the table
/// forgets them all.
#[test]
fn pending_rounds_are_each_nodes_own() {
    let etcd = Etcd::start();
    let connect = |node: &str| {
        EtcdMetadata::connect(std::slice::from_ref(&etcd.endpoint), "/pending", node).unwrap()
    };
    let (n1, n2) = (connect("n1"), connect("n2"));
    let created = n1.create_table(&table("db", "t", 1)).unwrap();
    let round = |file: &str| PendingRound {
        parent_snapshot: Some(7),
        files: vec![file.to_string()],
    };
    n1.set_pending_round(created.table_id, &round("a")).unwrap();
    assert_eq!(n2.pending_round(created.table_id).unwrap(), None);
    n2.set_pending_round(created.table_id, &round("b")).unwrap();
    n2.clear_pending_round(created.table_id).unwrap();
    assert_eq!(
        n1.pending_round(created.table_id).unwrap(),
        Some(round("a"))
    );
    n2.drop_table(&created.path).unwrap();
    assert_eq!(n1.pending_round(created.table_id).unwrap(), None);
}

/// A value etcd would refuse is refused with its size; an unreachable etcd is an error
/// that says so.
#[test]
fn oversized_values_and_an_unreachable_etcd_are_clear_errors() {
    let etcd = Etcd::start();
    let store = metadata(&etcd, "/limits");
    let created = store.create_table(&table("db", "t", 1)).unwrap();
    let round = PendingRound {
        parent_snapshot: None,
        files: vec!["x".repeat(1 << 16); 20],
    };
    let error = store
        .set_pending_round(created.table_id, &round)
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("more than the cluster metadata keeps"),
        "{error}"
    );
    drop(etcd);
    let error = store.load_tables().unwrap_err();
    assert!(matches!(error, NodeError::ClusterMetadata(_)), "{error}");
}
