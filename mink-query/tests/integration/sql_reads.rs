//! SQL over mink tables (DataFusion with mink-provider): random histories of upserts,
//! deletes, tiering rounds and compactions on a partitioned primary-key table with a lake,
//! checked after every step against a model with plain and filtered queries. Updates move
//! rows across the filter's boundary, so a tail index built from a filtered tail would let
//! the old lake version resurrect.

use std::sync::Arc;

use arrow::array::RecordBatch;
use datafusion::prelude::SessionContext;
use mink_client::MinkClient;
use mink_lake::storage::LakeStorage;
use object_store::local::LocalFileSystem;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::pk_support::{Cells, Key, State, lake_rows, lake_values, pk_keys, pk_lake_table};
use crate::support::{TestNode, seed};

const STEPS: usize = 40;

async fn session(client: &MinkClient) -> SessionContext {
    let storage = LakeStorage::new(Arc::new(LocalFileSystem::new()), "");
    mink_provider::session(client.clone(), storage)
        .await
        .expect("session")
}

async fn query(session: &SessionContext, sql: &str) -> Vec<RecordBatch> {
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
    for step in 0..STEPS {
        match rng.random_range(0..10) {
            0..=4 => {
                let upserts: Vec<(Key, Cells)> = (0..rng.random_range(1..8))
                    .map(|_| {
                        let dt = ["2024-01-01", "2024-01-02"][rng.random_range(0..2)];
                        let key = (
                            dt.to_string(),
                            rng.random_range(0..20),
                            rng.random_range(0..2),
                        );
                        (key, random_cells(&mut rng))
                    })
                    .collect();
                // The last write of a key in a batch wins, as in the model.
                client
                    .write(&table, &lake_rows(&table, &upserts))
                    .await
                    .expect("upsert");
                model.extend(upserts);
            }
            5 | 6 => {
                let keys: Vec<Key> = model
                    .keys()
                    .filter(|_| rng.random_ratio(1, 4))
                    .cloned()
                    .collect();
                if !keys.is_empty() {
                    client
                        .delete(&table, &pk_keys(&keys))
                        .await
                        .expect("delete");
                    for key in &keys {
                        model.remove(key);
                    }
                }
            }
            7 | 8 => {
                client.tier(&table.path).await.expect("tier");
            }
            _ => {
                client.compact(&table.path).await.expect("compact");
            }
        }
        let session = session(client).await;
        let all: Vec<(Key, Cells)> = model.clone().into_iter().collect();
        let context = format!("seed {seed} step {step}");
        assert_eq!(
            rows(&query(&session, "SELECT * FROM test.sql").await),
            all,
            "{context}: every row"
        );
        let low: Vec<_> = all
            .iter()
            .filter(|(_, (_, n))| n.is_some_and(|n| n < 50))
            .cloned()
            .collect();
        assert_eq!(
            rows(&query(&session, "SELECT * FROM test.sql WHERE n < 50").await),
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
                    &session,
                    "SELECT dt, id, seq, v, n FROM test.sql \
                     WHERE dt = '2024-01-02' AND v IS NOT NULL AND 50 <= n",
                )
                .await
            ),
            named,
            "{context}: a partition, a null check and a flipped comparison"
        );
        let counted = query(
            &session,
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_shows_the_splits_and_the_pushed_filters() {
    let node = TestNode::start().await;
    let client = &node.client;
    let table = client
        .create_table(&pk_lake_table("explained", 2), false)
        .await
        .expect("create");
    let rows: Vec<(Key, Cells)> = (0..10)
        .map(|id| {
            (
                ("2024-01-01".to_string(), id, 0),
                (Some("a".into()), Some(id)),
            )
        })
        .collect();
    client
        .write(&table, &lake_rows(&table, &rows))
        .await
        .expect("write");
    client.tier(&table.path).await.expect("tier");
    let session = session(client).await;
    let plan = query(
        &session,
        "EXPLAIN SELECT id FROM test.explained WHERE n > 3 AND length(v) = 1",
    )
    .await;
    let text = arrow::util::pretty::pretty_format_batches(&plan)
        .expect("format")
        .to_string();
    assert!(
        text.contains("MinkUnionExec: table=test.explained"),
        "{text}"
    );
    assert!(text.contains("filters=[n > 3]"), "{text}");
    assert!(text.contains("lake_files=1"), "{text}");
    assert!(
        text.contains("FilterExec"),
        "the other filter stays above the scan: {text}"
    );
    let unknown = session.sql("SELECT * FROM test.nope").await;
    assert!(
        unknown.is_err_and(|e| e.to_string().contains("nope")),
        "an unknown table is named"
    );
}
