//! TPC-H over mink: the eight tables at a small scale factor, loaded into a real node with
//! every kind of read in play, and the 22 queries checked against plain DataFusion over
//! the same final rows written as plain Parquet.
//!
//! # Setup
//!
//! The rows come from `mink_tpch` (`tpchgen`, dbgen's algorithm) at [`SCALE_FACTOR`] and are written
//! through the real client; tables are created, tiered, updated and deleted from through
//! SQL (tiering only by `CALL system.tier`: the tiering service's interval is an hour),
//! so each query reads a different mix:
//!
//! | table      | kind                      | lake | read from                                    |
//! |------------|---------------------------|------|----------------------------------------------|
//! | `lineitem` | log, partitioned by flag  | yes  | 60% tiered, 40% only in the log              |
//! | `orders`   | PK, partitioned by status | yes  | tiered, edited, tiered again, edited again   |
//! | `customer` | PK                        | yes  | tiered, then updates across filters, deletes |
//! | `part`     | PK                        | yes  | tiered, then updates into Q2's size, deletes |
//! | `partsupp` | PK on two columns         | yes  | tiered, then updates                         |
//! | `supplier` | PK                        | yes  | all tiered: the lake only                    |
//! | `nation`   | log                       | no   | the log                                      |
//! | `region`   | PK                        | no   | the KV snapshots                             |
//!
//! The expected side ([`expected`]) applies the same writes and edits to plain Arrow
//! batches with DataFusion, writes the final rows as Parquet and runs the same queries in
//! a plain `SessionContext`.
//!
//! # Comparison
//!
//! Money is `DECIMAL(15, 2)` end to end (written, tiered to Iceberg, read back), so every
//! sum and average is exact and independent of summation order: results must be
//! identical, value for value. (Q14 and Q17 end in a `DOUBLE`, but only from one division
//! of exact sums, so those are identical too.) Each result must have the same column
//! names and types; rows are compared as sorted lists (ordering is DataFusion's work
//! above the scans, and several queries' ORDER BY leaves ties). The queries
//! (`mink-tpch/queries/qN.sql`) use the specification's validation parameters; Q15's view is a
//! CTE.
//!
//! Every query runs on the server alone and again on two in-process workers
//! (`mink_sql::distributed`), each table's read cut into a task per bucket; both must
//! match, and every query that does not read `region` (read from its KV stores, which
//! only the server reads) must have run distributed.
//!
//! Every UPDATE and DELETE must answer the count of rows its filter matches in the
//! expected rows, and each tiered table's `t$lake` the rows its last tiering round saw.

mod expected;

use std::sync::Arc;

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::Int64Type;
use datafusion::prelude::SessionContext;
use mink_client::MinkClient;
use mink_core::table::{TableDescriptor, TablePath};
use mink_sql::session::MinkSession;

use crate::sql_reads::{count, query, session};
use crate::support::TestNode;
use crate::workers::TestWorkers;
use expected::Expected;
use mink_tpch::{
    CUSTOMER, LINEITEM, NATION, ORDERS, PART, PARTSUPP, REGION, SUPPLIER, TpchTable, sorted_rows,
};

/// About 300,000 line items: every query answers rows (Q18 needs an order of over 300
/// items).
const SCALE_FACTOR: f64 = 0.05;

/// Rows per client write.
const WRITE_ROWS: usize = 8192;

/// Queries not run, with the reason.
const SKIPPED: &[(usize, &str)] = &[];

/// One step of a table's history, applied to mink and to the expected rows alike.
enum Step {
    /// Writes the generated rows from `from` to `to` percent through the client.
    Write { from: usize, to: usize },
    /// `CALL system.tier(t)`: a tiering round now.
    Tier,
    /// `UPDATE t SET column = value WHERE filter`.
    Update {
        column: &'static str,
        value: &'static str,
        filter: &'static str,
    },
    /// `DELETE FROM t WHERE filter`.
    Delete { filter: &'static str },
}

use Step::{Delete, Tier, Update, Write};

const ALL: Step = Write { from: 0, to: 100 };

/// A table, how it is created and its history.
struct Setup {
    table: TpchTable,
    /// None: a log table.
    primary_key: Option<&'static str>,
    partitioned_by: Option<&'static str>,
    /// Tiered into the lake.
    lake: bool,
    steps: &'static [Step],
}

const SETUPS: [Setup; 8] = [
    Setup {
        table: REGION,
        primary_key: Some("r_regionkey"),
        partitioned_by: None,
        lake: false,
        steps: &[ALL],
    },
    Setup {
        table: NATION,
        primary_key: None,
        partitioned_by: None,
        lake: false,
        steps: &[ALL],
    },
    Setup {
        table: SUPPLIER,
        primary_key: Some("s_suppkey"),
        partitioned_by: None,
        lake: true,
        steps: &[ALL, Tier],
    },
    Setup {
        table: CUSTOMER,
        primary_key: Some("c_custkey"),
        partitioned_by: None,
        lake: true,
        steps: &[
            ALL,
            Tier,
            // Q22 keeps positive balances: moves customers across that boundary.
            Update {
                column: "c_acctbal",
                value: "c_acctbal - 500.00",
                filter: "c_custkey % 13 = 0",
            },
            // Q3 reads the BUILDING segment.
            Update {
                column: "c_mktsegment",
                value: "'BUILDING'",
                filter: "c_custkey % 17 = 1",
            },
            Delete {
                filter: "c_custkey % 101 = 0",
            },
        ],
    },
    Setup {
        table: PART,
        primary_key: Some("p_partkey"),
        partitioned_by: None,
        lake: true,
        steps: &[
            ALL,
            Tier,
            // Q2 reads size 15; Q16 and Q19 read sizes too.
            Update {
                column: "p_size",
                value: "15",
                filter: "p_partkey % 11 = 0",
            },
            Update {
                column: "p_retailprice",
                value: "p_retailprice + 1.25",
                filter: "p_size < 10",
            },
            Delete {
                filter: "p_partkey % 97 = 0",
            },
        ],
    },
    Setup {
        table: PARTSUPP,
        primary_key: Some("ps_partkey, ps_suppkey"),
        partitioned_by: None,
        lake: true,
        steps: &[
            ALL,
            Tier,
            // Q2 looks for the minimum cost, Q20 compares the available quantity.
            Update {
                column: "ps_supplycost",
                value: "ps_supplycost - 0.50",
                filter: "ps_partkey % 7 = 0 AND ps_supplycost > 1.00",
            },
            Update {
                column: "ps_availqty",
                value: "ps_availqty / 10",
                filter: "ps_suppkey % 5 = 2",
            },
        ],
    },
    Setup {
        table: ORDERS,
        primary_key: Some("o_orderkey, o_orderstatus"),
        partitioned_by: Some("o_orderstatus"),
        lake: true,
        steps: &[
            ALL,
            Tier,
            // Q4 and Q12 count by priority.
            Update {
                column: "o_orderpriority",
                value: "'1-URGENT'",
                filter: "o_orderkey % 9 = 0",
            },
            Delete {
                filter: "o_orderkey % 31 = 0",
            },
            Tier,
            // Dates move orders in and out of most queries' date ranges.
            Update {
                column: "o_orderdate",
                value: "o_orderdate + INTERVAL '45 days'",
                filter: "o_orderkey % 10 = 3",
            },
            Delete {
                filter: "o_custkey % 23 = 0",
            },
        ],
    },
    Setup {
        table: LINEITEM,
        primary_key: None,
        partitioned_by: Some("l_returnflag"),
        lake: true,
        steps: &[Write { from: 0, to: 60 }, Tier, Write { from: 60, to: 100 }],
    },
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tpch_queries_over_mink_match_plain_parquet() {
    let node = TestNode::start().await;
    let session = session(&node.client).await;
    let mut expected = Expected::new();
    for setup in &SETUPS {
        load(&node.client, &session, &mut expected, setup).await;
    }
    let parquet_dir = tempfile::tempdir().expect("temp dir");
    let plain = expected.into_parquet(parquet_dir.path()).await;
    // The same statements on two workers, every read worth a task per bucket.
    let workers = TestWorkers::start(2, &node.client).await;
    let distributed = workers.session(&node.client, 1).await;

    let mut failures = Vec::new();
    let mut ran_distributed = Vec::new();
    for number in 1..=22 {
        if let Some((_, reason)) = SKIPPED.iter().find(|(n, _)| *n == number) {
            eprintln!("Q{number} skipped: {reason}");
            continue;
        }
        if let Err(failure) = check_query(&session, &plain, number).await {
            failures.push(format!("Q{number}: {failure}"));
        }
        if let Err(failure) = check_query(&distributed, &plain, number).await {
            failures.push(format!("Q{number} on two workers: {failure}"));
        }
        if runs_distributed(&distributed, number).await {
            ran_distributed.push(number);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    eprintln!("distributed over two workers: {ran_distributed:?}");
    // Only the queries that read `region` (a primary-key table nothing was tiered from:
    // KV snapshots, which only the server reads) stay on the server.
    let local: Vec<usize> = (1..=22).filter(|q| !ran_distributed.contains(q)).collect();
    assert_eq!(local, [2, 5, 8], "queries that did not run distributed");
}

/// Whether query `number`'s plan in `session` runs on workers.
async fn runs_distributed(session: &MinkSession, number: usize) -> bool {
    let sql = mink_tpch::query(number);
    let plan = query(session, &format!("EXPLAIN {sql}")).await;
    let plan = arrow::util::pretty::pretty_format_batches(&plan)
        .expect("plan")
        .to_string();
    plan.contains("DistributedExec")
}

/// Creates a table through SQL and plays its history on mink and on the expected rows;
/// checks that its lake holds what the last tiering round saw.
async fn load(client: &MinkClient, session: &MinkSession, expected: &mut Expected, setup: &Setup) {
    let name = setup.table.name;
    let table = create_table(client, session, setup).await;
    let rows = RecordBatch::try_new(
        Arc::clone(table.schema()),
        (setup.table.generate)(SCALE_FACTOR),
    )
    .expect("generated rows fit the table's schema");
    let mut tiered_rows = None;
    for step in setup.steps {
        match *step {
            Write { from, to } => {
                let start = rows.num_rows() * from / 100;
                let end = rows.num_rows() * to / 100;
                let slice = rows.slice(start, end - start);
                write(client, &table, &slice).await;
                expected.write(name, slice);
            }
            Tier => {
                query(session, &format!("CALL system.tier('{name}')")).await;
                tiered_rows = Some(expected.matching(name, "true").await);
            }
            Update {
                column,
                value,
                filter,
            } => {
                let sql = format!("UPDATE {name} SET {column} = {value} WHERE {filter}");
                let changed = count(&query(session, &sql).await);
                assert_eq!(changed, expected.matching(name, filter).await, "{sql}");
                expected.update(name, column, value, filter).await;
            }
            Delete { filter } => {
                let sql = format!("DELETE FROM {name} WHERE {filter}");
                let deleted = count(&query(session, &sql).await);
                assert_eq!(deleted, expected.matching(name, filter).await, "{sql}");
                expected.delete(name, filter).await;
            }
        }
    }
    if let Some(tiered) = tiered_rows {
        let lake = query(session, &format!("SELECT count(*) FROM \"{name}$lake\"")).await;
        let lake = lake[0].column(0).as_primitive::<Int64Type>().value(0);
        assert_eq!(usize::try_from(lake), Ok(tiered), "{name}$lake");
    }
}

/// `CREATE TABLE` through SQL; answers the table as the node describes it.
async fn create_table(
    client: &MinkClient,
    session: &MinkSession,
    setup: &Setup,
) -> TableDescriptor {
    let TpchTable { name, columns, .. } = setup.table;
    let key = setup
        .primary_key
        .map_or_else(String::new, |key| format!(", PRIMARY KEY ({key})"));
    let partitioned = setup
        .partitioned_by
        .map_or_else(String::new, |columns| format!("PARTITIONED BY ({columns})"));
    let lake = if setup.lake {
        ", 'lake.enabled' = 'true', 'lake.freshness' = '1h'"
    } else {
        ""
    };
    let sql = format!(
        "CREATE TABLE {name} ({columns}{key}) {partitioned} WITH ('bucket.num' = '2'{lake})"
    );
    query(session, &sql).await;
    client
        .describe_table(&TablePath::new("default", name))
        .await
        .expect("created table")
}

/// Writes rows through the client, a few thousand at a time.
async fn write(client: &MinkClient, table: &TableDescriptor, rows: &RecordBatch) {
    for start in (0..rows.num_rows()).step_by(WRITE_ROWS) {
        let length = WRITE_ROWS.min(rows.num_rows() - start);
        client
            .write(table, &rows.slice(start, length))
            .await
            .expect("write");
    }
}

/// Runs query `number` on mink and on plain Parquet; an error says how they differ.
async fn check_query(
    session: &MinkSession,
    plain: &SessionContext,
    number: usize,
) -> Result<(), String> {
    let sql = mink_tpch::query(number);
    let actual = match session.sql(sql).await {
        Ok(frame) => frame.collect().await,
        Err(error) => Err(error),
    }
    .map_err(|e| format!("mink failed: {e}"))?;
    let wanted = plain
        .sql(sql)
        .await
        .expect("plain DataFusion plans")
        .collect()
        .await
        .expect("plain DataFusion runs");
    if columns(&actual) != columns(&wanted) {
        return Err(format!(
            "columns differ:\n  mink:  {:?}\n  plain: {:?}",
            columns(&actual),
            columns(&wanted)
        ));
    }
    let (actual, wanted) = (
        sorted_rows(&actual).expect("format"),
        sorted_rows(&wanted).expect("format"),
    );
    if actual != wanted {
        return Err(row_difference(&actual, &wanted));
    }
    eprintln!("Q{number}: {} rows match", actual.len());
    Ok(())
}

/// The result's column names and types (nullability may differ between plans).
fn columns(batches: &[RecordBatch]) -> Vec<String> {
    batches.first().map_or_else(Vec::new, |batch| {
        batch
            .schema()
            .fields()
            .iter()
            .map(|f| format!("{}: {}", f.name(), f.data_type()))
            .collect()
    })
}

/// The rows only one side has (a few of each).
fn row_difference(actual: &[String], wanted: &[String]) -> String {
    let only = |these: &[String], those: &[String]| -> Vec<String> {
        these
            .iter()
            .filter(|row| !those.contains(row))
            .take(5)
            .cloned()
            .collect()
    };
    format!(
        "{} rows from mink, {} from plain Parquet\n  only mink:  {:#?}\n  only plain: {:#?}",
        actual.len(),
        wanted.len(),
        only(actual, wanted),
        only(wanted, actual),
    )
}
