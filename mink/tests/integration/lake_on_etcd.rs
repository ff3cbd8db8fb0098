//! Two nodes' lakes over one lake catalog in a real etcd (a cluster's, `etcd://...`): a
//! table one creates, the other finds; of two commits planned on the same snapshot
//! through both at once, exactly one lands each time and the other is a clean conflict
//! whose files are deleted.

use mink_lake::commit::{SnapshotChanges, commit_snapshot};
use mink_lake::{Lake, LakeConfig, LakeError, Operation};
use mink_node::testing::Etcd;

use crate::support::{events_table, lake_options};

/// Commits raced through the two lakes.
const RACES: usize = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_through_two_nodes_on_one_snapshot_land_exactly_once() {
    let etcd = Etcd::start();
    let warehouse = tempfile::tempdir().expect("warehouse");
    let warehouse = warehouse.path().display().to_string();
    let uri = format!("etcd://{}/test/lake-catalog", etcd.endpoint);
    let open = || async {
        let config = LakeConfig::local(&warehouse, uri.clone()).expect("config");
        Lake::open(config).await.expect("open the lake")
    };
    let (first, second) = (open().await, open().await);
    let table = events_table("raced", 2, lake_options());
    first.create_table(&table).await.expect("create");
    assert!(second.exists(&table.path).await.expect("exists"));

    let mut winners = Vec::new();
    for race in 0..RACES {
        let (a, b) = (first.load(&table.path), second.load(&table.path));
        let (a, b) = tokio::join!(a, b);
        let (a, b) = (a.expect("load"), b.expect("load"));
        let parent = a.metadata().current_snapshot_id();
        assert_eq!(parent, b.metadata().current_snapshot_id(), "race {race}");
        let commit = |lake, table| {
            commit_snapshot(
                lake,
                table,
                parent,
                Operation::Append,
                SnapshotChanges::default(),
            )
        };
        let (a, b) = tokio::join!(commit(&first, &a), commit(&second, &b));
        let winner = match (a, b) {
            (Ok(won), Err(LakeError::CommitConflict { .. }))
            | (Err(LakeError::CommitConflict { .. }), Ok(won)) => won,
            other => panic!("race {race}: one commit lands, the other conflicts: {other:?}"),
        };
        winners.push(winner.metadata().current_snapshot_id().expect("a snapshot"));
    }

    // The table holds the winners, each on the one before.
    let committed = second.load(&table.path).await.expect("load");
    let mut chain = Vec::new();
    let mut snapshot = committed.metadata().current_snapshot();
    while let Some(current) = snapshot {
        chain.push(current.snapshot_id());
        snapshot = current
            .parent_snapshot_id()
            .and_then(|parent| committed.metadata().snapshot_by_id(parent));
    }
    chain.reverse();
    assert_eq!(chain, winners);
    // The losers' files are gone: a metadata file per commit (and the creation's), a
    // manifest list per snapshot.
    let metadata = std::path::Path::new(committed.metadata().location()).join("metadata");
    let names: Vec<String> = std::fs::read_dir(&metadata)
        .expect("metadata dir")
        .map(|entry| {
            entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    let count = |suffix: &str| names.iter().filter(|name| name.ends_with(suffix)).count();
    assert_eq!(count(".metadata.json"), RACES + 1, "{names:?}");
    assert_eq!(
        names
            .iter()
            .filter(|name| name.starts_with("snap-"))
            .count(),
        RACES,
        "{names:?}"
    );
}
