//! The lake of log tables: random histories of appends, tiering rounds and restarts
//! checked against a model after every step (union = every row once; lake = the rows below
//! each bucket's seam); crashes at both sides of the Iceberg commit; a point-in-time union
//! read under writers; bad input.

use std::collections::BTreeMap;

use mink_client::MinkClient;
use mink_core::options::TableOptions;
use mink_core::protocol::BucketId;
use mink_core::table::{TableDescriptor, TablePath};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tonic::Code;

use crate::process::ServerProcess;
use crate::support::{TestNode, events, events_table, first_column_ids, lake_options, seed};

fn ids(batches: &[arrow::array::RecordBatch]) -> Vec<i64> {
    let mut ids = first_column_ids(batches);
    ids.sort_unstable();
    ids
}

/// Checks every bucket's union read against the written ids, and the lake against the
/// rows below each bucket's seam.
async fn check(
    client: &MinkClient,
    table: &TableDescriptor,
    written: &BTreeMap<u32, Vec<(i64, i64)>>,
    step: usize,
) {
    let mut lake_expected = Vec::new();
    for bucket in 0..table.bucket_num {
        let rows = written.get(&bucket).cloned().unwrap_or_default();
        let answer = client
            .union(&BucketId::new(&table.path, bucket), &[0], &[])
            .await
            .expect("union");
        let mut expected: Vec<i64> = rows.iter().map(|(_, id)| *id).collect();
        expected.sort_unstable();
        assert_eq!(
            ids(&answer.batches),
            expected,
            "step {step} bucket {bucket}: union = every row once"
        );
        let plan = &answer.plan;
        assert_eq!(
            plan.log_to,
            rows.len() as i64,
            "step {step} bucket {bucket}: log_to is the high watermark"
        );
        assert_eq!(
            plan.log_from, plan.lake_log_end_offset,
            "step {step}: log_from is the seam (no retention here)"
        );
        lake_expected.extend(
            rows.iter()
                .filter(|(offset, _)| *offset < plan.lake_log_end_offset)
                .map(|(_, id)| *id),
        );
    }
    lake_expected.sort_unstable();
    let lake = client
        .lake(&table.path, None, None, &[0], &[])
        .await
        .expect("lake");
    assert_eq!(
        ids(&lake),
        lake_expected,
        "step {step}: the lake alone = the rows of the last round"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_histories_with_tiering_match_the_model() {
    let seed = seed("random_histories_with_tiering_match_the_model");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().expect("temp dir");
    let mut server = ServerProcess::start(dir.path());
    let mut client = MinkClient::connect(&server.addr).await.expect("connect");
    let mut table = events_table("tiered", 3, lake_options());
    table.bucket_key.clear(); // round robin: the test picks each batch's bucket
    let table = client.create_table(&table, false).await.expect("create");
    // bucket -> (offset, id) of every acknowledged row.
    let mut written: BTreeMap<u32, Vec<(i64, i64)>> = BTreeMap::new();
    let mut next_id = 0;
    for step in 0..25 {
        // Every history crashes at least once on each side of the lake commit.
        let action = match step {
            8 => 90,
            16 => 95,
            _ => rng.random_range(0..100),
        };
        match action {
            0..55 => {
                let bucket = rng.random_range(0..table.bucket_num);
                let n = rng.random_range(1..200);
                let batch_ids: Vec<i64> = (next_id..next_id + n).collect();
                next_id += n;
                let acks = client
                    .append(
                        &BucketId::new(&table.path, bucket),
                        vec![events(&table, &batch_ids)],
                    )
                    .await
                    .expect("append");
                let rows = written.entry(bucket).or_default();
                rows.extend(
                    batch_ids
                        .iter()
                        .enumerate()
                        .map(|(i, id)| (acks[0].base_offset + i as i64, *id)),
                );
            }
            55..80 => {
                client.tier(&table.path).await.expect("tier");
            }
            80..88 => {
                // kill -9 and restart.
                server.kill();
                server = ServerProcess::start(dir.path());
                client = MinkClient::connect(&server.addr).await.expect("reconnect");
            }
            _ => {
                // A tiering round that crashes before or after its Iceberg commit.
                let failpoint = if action < 94 {
                    "abort-before-lake-commit"
                } else {
                    "abort-after-lake-commit"
                };
                server.kill();
                let crashing =
                    ServerProcess::start_with_env(dir.path(), &[("MINK_FAILPOINT", failpoint)]);
                let crashing_client = MinkClient::connect(&crashing.addr).await.expect("connect");
                // With nothing new to tier, the round commits nothing and does not crash.
                if crashing_client.tier(&table.path).await.is_err() {
                    crashing.wait_for_exit();
                } else {
                    crashing.kill();
                }
                server = ServerProcess::start(dir.path());
                client = MinkClient::connect(&server.addr).await.expect("reconnect");
            }
        }
        check(&client, &table, &written, step).await;
    }
    // One last round: the lake then holds everything and the tails are empty.
    client.tier(&table.path).await.expect("tier");
    check(&client, &table, &written, 99).await;
    for bucket in 0..table.bucket_num {
        let plan = client
            .union(&BucketId::new(&table.path, bucket), &[], &[])
            .await
            .expect("union")
            .plan;
        assert_eq!(
            plan.log_from, plan.log_to,
            "bucket {bucket} is fully tiered"
        );
    }
    server.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_on_either_side_of_the_lake_commit_tiers_nothing_twice() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data_files = |dir: &std::path::Path| -> usize {
        fn count(path: &std::path::Path) -> usize {
            std::fs::read_dir(path).map_or(0, |entries| {
                entries
                    .flatten()
                    .map(|e| {
                        let p = e.path();
                        if p.is_dir() {
                            count(&p)
                        } else {
                            usize::from(p.extension().is_some_and(|x| x == "parquet"))
                        }
                    })
                    .sum()
            })
        }
        count(&dir.join("lake/warehouse"))
    };
    let mut table = events_table("crashy", 2, lake_options());
    table.bucket_key.clear();
    let mut all: Vec<i64> = Vec::new();
    let mut next = 0i64;
    for (round, failpoint) in ["abort-before-lake-commit", "abort-after-lake-commit"]
        .into_iter()
        .enumerate()
    {
        let server = ServerProcess::start_with_env(dir.path(), &[("MINK_FAILPOINT", failpoint)]);
        let client = MinkClient::connect(&server.addr).await.expect("connect");
        if round == 0 {
            table = client.create_table(&table, false).await.expect("create");
        }
        for bucket in 0..2 {
            let batch: Vec<i64> = (next..next + 50).collect();
            next += 50;
            client
                .append(
                    &BucketId::new(&table.path, bucket),
                    vec![events(&table, &batch)],
                )
                .await
                .expect("append");
            all.extend(batch);
        }
        let files_before = data_files(dir.path());
        let err = client
            .tier(&table.path)
            .await
            .expect_err("the server aborts mid-round");
        assert!(
            err.code().is_some_and(|c| c == Code::Unavailable
                || c == Code::Unknown
                || c == Code::Internal),
            "{err}"
        );
        server.wait_for_exit();
        assert!(
            data_files(dir.path()) > files_before,
            "{failpoint}: the round wrote its files"
        );

        let server = ServerProcess::start(dir.path());
        let client = MinkClient::connect(&server.addr).await.expect("reconnect");
        let report = client
            .tier(&table.path)
            .await
            .expect("tier after the crash");
        // After the commit, the crashed round is recorded, not tiered again; before it,
        // the round is tiered anew.
        let after_commit = failpoint == "abort-after-lake-commit";
        assert_eq!(report.repaired, after_commit, "{failpoint}: {report:?}");
        assert_eq!(
            report.rows,
            if after_commit { 0 } else { 100 },
            "{failpoint}: {report:?}"
        );
        let mut union = Vec::new();
        for bucket in 0..2 {
            let answer = client
                .union(&BucketId::new(&table.path, bucket), &[0], &[])
                .await
                .expect("union");
            assert_eq!(
                answer.plan.log_from, answer.plan.log_to,
                "{failpoint}: everything is tiered"
            );
            union.extend(answer.batches);
        }
        all.sort_unstable();
        assert_eq!(ids(&union), all, "{failpoint}: union = every row once");
        let lake = client
            .lake(&table.path, None, None, &[0], &[])
            .await
            .expect("lake");
        assert_eq!(ids(&lake), all, "{failpoint}: the lake = every row once");
        if failpoint == "abort-before-lake-commit" {
            // The orphaned files of the aborted round are gone; only the committed round's remain.
            let lake_files: u64 = client
                .union(&BucketId::new(&table.path, 0), &[], &[])
                .await
                .expect("union")
                .plan
                .lake_files
                + client
                    .union(&BucketId::new(&table.path, 1), &[], &[])
                    .await
                    .expect("union")
                    .plan
                    .lake_files;
            assert_eq!(
                data_files(dir.path()) as u64,
                lake_files,
                "orphan files are cleaned"
            );
        }
        server.kill();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_union_read_is_a_point_in_time_result_under_writers() {
    let node = TestNode::start().await;
    let table = node
        .client
        .create_table(&events_table("busy", 1, lake_options()), false)
        .await
        .expect("create");
    let bucket = BucketId::new(&table.path, 0);
    node.client
        .append(
            &bucket,
            vec![events(&table, &(0..1000).collect::<Vec<_>>())],
        )
        .await
        .expect("append");
    node.client.tier(&table.path).await.expect("tier");
    let writer = {
        let (client, table, bucket) = (node.client.clone(), table.clone(), bucket.clone());
        tokio::spawn(async move {
            for round in 1..40i64 {
                let batch: Vec<i64> = (round * 1000..round * 1000 + 100).collect();
                client
                    .append(&bucket, vec![events(&table, &batch)])
                    .await
                    .expect("append");
            }
        })
    };
    for _ in 0..10 {
        let answer = node.client.union(&bucket, &[0], &[]).await.expect("union");
        let got = ids(&answer.batches);
        assert_eq!(
            got.len() as i64,
            answer.plan.log_to,
            "exactly the rows below log_to"
        );
        let mut unique = got.clone();
        unique.dedup();
        assert_eq!(unique.len(), got.len(), "no row twice");
        assert_eq!(answer.plan.lake_log_end_offset, 1000);
    }
    writer.await.expect("writer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_lake_requests_are_named() {
    let node = TestNode::start().await;
    let plain = node
        .client
        .create_table(&events_table("plain", 1, TableOptions::default()), false)
        .await
        .expect("create");
    let err = node
        .client
        .lake(&plain.path, None, None, &[], &[])
        .await
        .expect_err("no lake");
    assert_eq!(err.code(), Some(Code::FailedPrecondition), "{err}");
    assert!(err.to_string().contains("has no lake"), "{err}");
    let err = node.client.tier(&plain.path).await.expect_err("no lake");
    assert_eq!(err.code(), Some(Code::FailedPrecondition), "{err}");
    let err = node.client.compact(&plain.path).await.expect_err("no lake");
    assert_eq!(err.code(), Some(Code::FailedPrecondition), "{err}");
    assert!(err.to_string().contains("has no lake"), "{err}");

    let tiered = node
        .client
        .create_table(&events_table("tiered_bad", 1, lake_options()), false)
        .await
        .expect("create");
    node.client
        .append(
            &BucketId::new(&tiered.path, 0),
            vec![events(&tiered, &[1, 2])],
        )
        .await
        .expect("append");
    node.client.tier(&tiered.path).await.expect("tier");
    let err = node
        .client
        .lake(&tiered.path, None, Some(12345), &[], &[])
        .await
        .expect_err("no such snapshot");
    assert_eq!(err.code(), Some(Code::NotFound), "{err}");
    assert!(err.to_string().contains("12345"), "{err}");
    let err = node
        .client
        .lake(&TablePath::new("test", "nope"), None, None, &[], &[])
        .await
        .expect_err("no table");
    assert_eq!(err.code(), Some(Code::NotFound), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_catalog_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = mink_node::NodeConfig::new(dir.path());
    let mut lake = mink_lake::LakeConfig::embedded(dir.path()).expect("lake config");
    lake.catalog_uri = "sqlite:/nonexistent/dir/catalog.db?mode=rwc".into();
    config.lake = Some(lake);
    let node = mink_node::Node::open(config).await.expect("open");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let handle = mink_node::server::serve(node, listener)
        .await
        .expect("serve");
    let client = MinkClient::connect(&handle.addr().to_string())
        .await
        .expect("connect");
    let err = client
        .create_table(&events_table("unreachable", 1, lake_options()), false)
        .await
        .expect_err("catalog");
    assert_eq!(err.code(), Some(Code::Unavailable), "{err}");
    assert!(err.to_string().contains("lake"), "{err}");
    // The node itself keeps serving.
    client
        .create_table(&events_table("fine", 1, TableOptions::default()), false)
        .await
        .expect("plain table");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_prune_lake_files_and_apply_to_every_row() {
    use mink_core::filter::{ColumnFilter, FilterOp};
    let node = TestNode::start().await;
    // Bucketed by id: the lake is partitioned by bucket[3](id).
    let table = node
        .client
        .create_table(&events_table("filtered", 3, lake_options()), false)
        .await
        .expect("create");
    node.client
        .write(&table, &events(&table, &(0..300).collect::<Vec<_>>()))
        .await
        .expect("write");
    node.client.tier(&table.path).await.expect("tier");
    node.client
        .write(&table, &events(&table, &(300..330).collect::<Vec<_>>()))
        .await
        .expect("write");

    // A range on id, filtering on a column the read does not return.
    let range = [
        ColumnFilter::new("id", FilterOp::GtEq, Some("100")),
        ColumnFilter::new("id", FilterOp::Lt, Some("310")),
    ];
    let lake = node
        .client
        .lake(&table.path, None, None, &[1], &range)
        .await
        .expect("lake");
    assert_eq!(
        lake.iter().map(|b| b.num_rows()).sum::<usize>(),
        200,
        "lake rows 100..300"
    );
    assert!(lake.iter().all(|b| b.num_columns() == 1));
    let mut union = Vec::new();
    for bucket in 0..3 {
        union.extend(
            node.client
                .union(&BucketId::new(&table.path, bucket), &[0], &range)
                .await
                .expect("union")
                .batches,
        );
    }
    assert_eq!(
        ids(&union),
        (100..310).collect::<Vec<i64>>(),
        "lake and log rows are filtered alike"
    );

    // An equality on the bucket key prunes every other bucket's lake files.
    let one = [ColumnFilter::new("id", FilterOp::Eq, Some("5"))];
    let mut found = Vec::new();
    let mut files = Vec::new();
    for bucket in 0..3 {
        let answer = node
            .client
            .union(&BucketId::new(&table.path, bucket), &[0], &one)
            .await
            .expect("union");
        files.push(answer.plan.lake_files);
        found.extend(answer.batches);
    }
    assert_eq!(ids(&found), vec![5]);
    assert_eq!(
        files.iter().filter(|f| **f > 0).count(),
        1,
        "only the bucket of id 5 reads lake files: {files:?}"
    );

    let bad = [ColumnFilter::new("nope", FilterOp::Eq, Some("1"))];
    let err = node
        .client
        .lake(&table.path, None, None, &[], &bad)
        .await
        .expect_err("unknown column");
    assert_eq!(err.code(), Some(Code::InvalidArgument), "{err}");
    let bad = [ColumnFilter::new("id", FilterOp::Eq, Some("five"))];
    let err = node
        .client
        .union(&BucketId::new(&table.path, 0), &[], &bad)
        .await
        .expect_err("bad value");
    assert!(err.to_string().contains("'five'"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_merges_a_log_tables_small_files() {
    let node = TestNode::start().await;
    let client = &node.client;
    let table = client
        .create_table(&events_table("compacted", 2, lake_options()), false)
        .await
        .expect("create");
    for round in 0..3 {
        let ids: Vec<i64> = (round * 100..round * 100 + 100).collect();
        client
            .write(&table, &events(&table, &ids))
            .await
            .expect("write");
        client.tier(&table.path).await.expect("tier");
    }
    client
        .write(&table, &events(&table, &(300..320).collect::<Vec<_>>()))
        .await
        .expect("write");
    let union_ids = || async {
        let mut all = Vec::new();
        let mut files = Vec::new();
        for bucket in 0..2 {
            let answer = client
                .union(&BucketId::new(&table.path, bucket), &[0], &[])
                .await
                .expect("union");
            all.extend(answer.batches);
            files.push(answer.plan.lake_files);
        }
        (ids(&all), files)
    };
    let (before, files) = union_ids().await;
    assert_eq!(before, (0..320).collect::<Vec<i64>>());
    assert_eq!(files, vec![3, 3], "one file per bucket and round");
    let old = client.tier(&table.path).await.expect("tier").snapshot_id;
    assert!(old.is_some(), "the tail was tiered");

    let reply = client.compact(&table.path).await.expect("compact");
    assert_eq!(
        (reply.buckets, reply.files_removed, reply.files_written),
        (2, 8, 2)
    );
    assert_eq!(reply.rows, 320);
    let (after, files) = union_ids().await;
    assert_eq!(after, before, "compaction changes no row");
    assert_eq!(files, vec![1, 1]);
    let at_old = client
        .lake(&table.path, None, old, &[0], &[])
        .await
        .expect("the older snapshot still reads");
    assert_eq!(ids(&at_old), before);
    let again = client.compact(&table.path).await.expect("compact");
    assert_eq!(again.snapshot_id, None, "nothing left to compact");
}
