//! `plan_table_union` plans every bucket of a table at once (issue 15, part 5): over a real
//! node with a lake, after tiering rounds with writes between them (some buckets written,
//! some not), each bucket's entry is exactly what `plan_union` answers for it (plan,
//! files, deletes), all from one recorded snapshot, in the order of `list_buckets`.

use arrow::array::RecordBatch;
use mink_client::MinkClient;
use mink_core::filter::{ColumnFilter, FilterOp};
use mink_core::protocol::UnionSplit;
use mink_core::routing::split_by_bucket;
use mink_core::table::TableDescriptor;

use crate::pk_support::{Key, lake_rows, pk_keys, pk_lake_table};
use crate::support::{TestNode, events, events_table, lake_options};

/// Checks that `plan_table_union` answers, for every bucket `list_buckets` lists and in
/// its order, what `plan_union` answers (with and without `filters`); returns the
/// entries planned without filters.
async fn check_plans(
    client: &MinkClient,
    table: &TableDescriptor,
    filters: &[ColumnFilter],
    step: &str,
) -> Vec<UnionSplit> {
    let buckets: Vec<_> = client
        .list_buckets(&table.path)
        .await
        .expect("list buckets")
        .into_iter()
        .map(|status| status.bucket.expect("a bucket id"))
        .collect();
    let mut unfiltered = Vec::new();
    for filters in [&[][..], filters] {
        let planned = client
            .plan_table_union(&table.path, filters)
            .await
            .expect("plan_table_union");
        let planned_buckets: Vec<_> = planned.iter().map(|s| s.bucket.clone()).collect();
        assert_eq!(
            planned_buckets,
            buckets.iter().cloned().map(Some).collect::<Vec<_>>(),
            "{step}: the buckets planned"
        );
        let snapshots: Vec<_> = planned
            .iter()
            .map(|s| s.plan.as_ref().expect("a plan").snapshot_id)
            .collect();
        assert!(
            snapshots.windows(2).all(|w| w[0] == w[1]),
            "{step}: one snapshot for every bucket: {snapshots:?}"
        );
        for (bucket, entry) in buckets.iter().zip(&planned) {
            let alone = client
                .plan_union(bucket, filters)
                .await
                .expect("plan_union");
            assert_eq!(*entry, alone, "{step}: {bucket} with filters {filters:?}");
        }
        if filters.is_empty() {
            unfiltered = planned;
        }
    }
    unfiltered
}

/// Checks the plans, runs tiering round `round`, checks them again.
async fn tier_between_checks(
    client: &MinkClient,
    table: &TableDescriptor,
    filters: &[ColumnFilter],
    round: usize,
) {
    check_plans(
        client,
        table,
        filters,
        &format!("round {round}, before tiering"),
    )
    .await;
    client.tier(&table.path).await.expect("tier");
    check_plans(client, table, filters, &format!("round {round}, tiered")).await;
}

/// The lake files planned for each entry.
fn lake_files(planned: &[UnionSplit]) -> Vec<u64> {
    planned
        .iter()
        .map(|s| s.plan.as_ref().expect("a plan").lake_files)
        .collect()
}

/// The parts of `batch` that go to the buckets `keep` names, each appended to its bucket.
async fn write_to(client: &MinkClient, table: &TableDescriptor, batch: &RecordBatch, keep: &[u32]) {
    for (bucket, part) in split_by_bucket(table, batch, 0).expect("route") {
        if keep.contains(&bucket.bucket) {
            client.append(&bucket, vec![part]).await.expect("append");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_tables_plan_is_each_buckets_plan() {
    let node = TestNode::start().await;
    let client = &node.client;
    // Tiered only by the test.
    let options = lake_options();
    let table = client
        .create_table(&events_table("planned", 4, options), false)
        .await
        .expect("create");
    let filters = [ColumnFilter::new("id", FilterOp::GtEq, Some("150"))];

    // Before any write or round: no snapshot, nothing to read.
    let planned = check_plans(client, &table, &filters, "empty").await;
    assert_eq!(planned.len(), 4);
    assert!(
        planned
            .iter()
            .all(|s| s.plan.as_ref().unwrap().snapshot_id.is_none())
    );

    // Bucket 3 is never written; the others in turns, some rounds tiering nothing new.
    let writes: [&[u32]; 6] = [&[0, 1], &[1, 2], &[], &[0], &[0, 1, 2], &[2]];
    for (round, keep) in writes.iter().enumerate() {
        let base = round as i64 * 100;
        let ids: Vec<i64> = (base..base + 100).collect();
        write_to(client, &table, &events(&table, &ids), keep).await;
        tier_between_checks(client, &table, &filters, round).await;
    }
    // A tail after the last round.
    write_to(
        client,
        &table,
        &events(&table, &(1000..1040).collect::<Vec<_>>()),
        &[0, 1, 2, 3],
    )
    .await;
    let planned = check_plans(client, &table, &filters, "tail").await;
    let files = lake_files(&planned);
    assert_eq!(files[3], 0, "bucket 3 has no lake files: {files:?}");
    assert!(
        files[..3].iter().all(|&n| n >= 3),
        "one file per round written: {files:?}"
    );
    assert!(
        planned
            .iter()
            .all(|s| s.plan.as_ref().unwrap().log_to > s.plan.as_ref().unwrap().log_from),
        "every bucket has a tail: {planned:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_primary_key_tables_plan_is_each_buckets_plan() {
    let node = TestNode::start().await;
    let client = &node.client;
    let table = client
        .create_table(&pk_lake_table("planned_pk", 4), false)
        .await
        .expect("create");
    let filters = [ColumnFilter::new("id", FilterOp::Lt, Some("40"))];
    let key = |dt: &str, id: i64| -> Key { (dt.to_string(), id, 0) };
    let rows = |dt: &str, ids: std::ops::Range<i64>, round: i64| {
        let rows: Vec<_> = ids
            .map(|id| (key(dt, id), (Some(format!("r{round}")), Some(id * round))))
            .collect();
        lake_rows(&table, &rows)
    };

    // Partition `a` in buckets 0 and 1, then all; partition `b` in bucket 2 only; keys
    // upserted again and deleted, so later rounds write deletes.
    let rounds: [(&str, &[u32]); 5] = [
        ("a", &[0, 1]),
        ("b", &[2]),
        ("a", &[0, 1, 2, 3]),
        ("a", &[1]),
        ("b", &[2, 3]),
    ];
    for (round, (dt, keep)) in rounds.iter().enumerate() {
        write_to(client, &table, &rows(dt, 0..80, round as i64), keep).await;
        if round >= 2 {
            let deleted: Vec<Key> = (round as i64 * 5..round as i64 * 5 + 10)
                .map(|id| key(dt, id))
                .collect();
            client
                .delete(&table, &pk_keys(&deleted))
                .await
                .expect("delete");
        }
        tier_between_checks(client, &table, &filters, round).await;
    }
    let planned = check_plans(client, &table, &filters, "after the rounds").await;
    let partitions: Vec<_> = planned
        .iter()
        .map(|s| s.bucket.as_ref().unwrap().partition.clone())
        .collect();
    assert!(
        partitions.contains(&Some("dt=a".into())) && partitions.contains(&Some("dt=b".into())),
        "both partitions planned: {partitions:?}"
    );
    assert!(
        planned
            .iter()
            .any(|s| s.files.iter().any(|f| !f.deletes.is_empty())),
        "some lake file has deletes: {planned:?}"
    );
    client.compact(&table.path).await.expect("compact");
    check_plans(client, &table, &filters, "compacted").await;
}
