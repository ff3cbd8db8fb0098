//! `mink-bench sql`: SQL over a primary-key table with a lake and a changed log range.
//!
//! ```text
//! cargo run --release -p mink-bench -- sql [--keys 2000000] [--buckets 4]
//!     [--lookups 200] [--rounds 9] [--explain] [--log-table] [--profile-rounds N]
//!     [--dir DIR] [--no-sync]
//! ```
//!
//! With `--log-table` the table has no primary key: the 1% are appended as new rows, the
//! union read is the lake's rows followed by the log ranges (no merge), and the naive plan and
//! the point queries (which need a key) are left out.
//!
//! One primary-key table (`id`) of `--keys` rows of the `log` suite's schema with a lake:
//! every key loaded and tiered, then 1% of the keys (distinct, at random) upserted with
//! new values, so they are in the log range only. Every engine answers the same
//! [`QUERIES`] (every column read; a count and a sum; a grouped aggregate; a filter), each
//! returning one row; the answers must agree.
//!
//! 1. **Union read through SQL**: each query on the table in a [`MinkSession`] (the lake's
//!    Parquet read from the object store, the log ranges over Flight, merged by key),
//!    planning included. Baselines, each the median of [`ROUNDS`] unless said otherwise:
//!    - *DataFusion over Parquet*: the same final rows (read once through mink) written as
//!      `--buckets` Parquet files, queried by a plain DataFusion `SessionContext`: with
//!      its defaults, which read strings as `Utf8View` (no copy of the string bytes), and
//!      with strings read as `Utf8`, as mink's tables type them. The union read and
//!      these two run in turn, round after round, `--rounds` times, and each figure is
//!      the median of its rounds: statements of tens of milliseconds vary by up to 2x
//!      between runs on a small VM, and turns keep such drift out of their ratios;
//!    - *the naive plan*: what a user would write without mink's merge, in the same
//!      session: the lake (`t$lake`) anti-joined with the live range, union the live range.
//!      The log range is handed to it as a memory table for free (a user would have to read
//!      it from `t$changelog` first), so the naive plan is timed at its best;
//!    - *DuckDB* over the same Parquet files, through the Python package (`MINK_PYTHON`,
//!      else `python3`, with `duckdb` installed: `pip install duckdb`); skipped with a
//!      note when there is none. DuckDB's time is measured inside its process.
//!
//!    The same union reads are also timed *through Flight SQL with the ADBC driver*, the
//!    way an analyst's tool runs them: the endpoint served on a loopback port, the
//!    queries sent from Python (`MINK_PYTHON`, with `adbc-driver-flightsql` and `pyarrow`
//!    installed; skipped with a note when it cannot run), timed in that process, rows
//!    fetched as Arrow; reported against DuckDB and DataFusion over the plain Parquet.
//!
//!    Beside each union read, the time of planning it alone (`EXPLAIN`), and of the
//!    leader's part of it (`plan_table_union`, no filter). With
//!    `--explain`, the `EXPLAIN ANALYZE` of each union read is printed (the plan's
//!    counters and times: where a slow figure comes from). With `--profile-rounds N`,
//!    each union read and then DataFusion's read of the plain Parquet run `N` more
//!    rounds, unmeasured, between `bench: profile ... start` and `... end` lines on
//!    stderr: phases long enough for a profiler to attach to and sample apart.
//! 2. **Pruning**: the `EXPLAIN ANALYZE` counters of the lake scan (row groups and page
//!    rows pruned, bytes read) for `id IN` 10 random keys of `t$lake` and a union read of
//!    `id BETWEEN` a range of 1% of the keys.
//! 3. **Point query**: `SELECT * FROM t WHERE id = k` for `--lookups` random keys (after
//!    [`CALL_WARMUP`] uncounted ones), p50 and p99 through SQL, planning included: the
//!    whole primary key is fixed, so it is a KV lookup. Baseline: the same query written
//!    `id + 0 = k`, which no scan can take, so it is a full union read filtered above
//!    (median of [`ROUNDS`]).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use arrow::util::display::array_value_to_string;
use datafusion::catalog::{CatalogProvider, MemoryCatalogProvider, MemorySchemaProvider};
use datafusion::datasource::MemTable;
use mink_core::table::TablePath;

use mink_sql::session::MinkSession;
use rand::Rng;

use crate::data::{Changes, ipc_len, seeded};
use crate::error::BenchError;
use crate::harness::{
    CALL_WARMUP, NodeArgs, ON_DEMAND_FRESHNESS, ROUNDS, Running, Throughput, blocking,
    check_pk_table_args, create_table_with, lake_options, latency, measure, median,
    parquet_session, prepare, python, report, row_count, split, tier, timed_rounds, write_batches,
    write_parquet,
};

/// Arguments of `mink-bench sql`.
#[derive(Debug, clap::Args)]
pub(crate) struct SqlArgs {
    /// Keys of the table, loaded in batches of 10 000.
    #[arg(long, default_value_t = 2_000_000)]
    keys: usize,
    /// Buckets of the table (and Parquet files of the baselines).
    #[arg(long, default_value_t = 4)]
    buckets: u32,
    /// Point queries measured.
    #[arg(long, default_value_t = 200)]
    lookups: usize,
    /// Rounds of the union read and of DataFusion's reads, in turn (medians).
    #[arg(long, default_value_t = 9)]
    rounds: usize,
    /// Print the `EXPLAIN ANALYZE` of each union read.
    #[arg(long)]
    explain: bool,
    /// A log table (no primary key) instead of a primary-key table.
    #[arg(long)]
    log_table: bool,
    /// Unmeasured rounds of each union read and of DataFusion's plain read, for a
    /// profiler.
    #[arg(long, default_value_t = 0)]
    profile_rounds: usize,
    #[command(flatten)]
    node: NodeArgs,
}

/// The queries every engine answers over a table `{t}`, each returning one row: what
/// each is, and its SQL.
const QUERIES: [(&str, &str); 4] = [
    (
        "every column",
        "SELECT count(*) AS row_count, sum(quantity) AS quantity, max(name) AS name, \
         max(event_time) AS last_event, sum(price) AS price FROM {t}",
    ),
    (
        "count and sum",
        "SELECT count(*) AS row_count, sum(price) AS price FROM {t}",
    ),
    (
        "group by",
        "SELECT count(*) AS groups, sum(total) AS total, max(total) AS most FROM \
         (SELECT quantity, sum(price) AS total FROM {t} GROUP BY quantity)",
    ),
    (
        "filter",
        "SELECT count(*) AS row_count, sum(price) AS price FROM {t} WHERE quantity > 900",
    ),
];

/// The columns of the table, in order.
const COLUMNS: &str = "id, event_time, name, price, quantity";

/// The DuckDB side: runs a query `rounds` times, prints each time in seconds and then
/// the answer's first row, one value per line.
const DUCKDB_SCRIPT: &str = r#"
import sys, time, duckdb
query, rounds = sys.argv[1], int(sys.argv[2])
connection = duckdb.connect()
for _ in range(rounds):
    start = time.perf_counter()
    row = connection.execute(query).fetchone()
    print(time.perf_counter() - start)
for value in row:
    print(value)
"#;

/// The ADBC side: runs a query `rounds` times through the Flight SQL driver at `uri`,
/// prints each time in seconds (the statement and the fetch of its rows as Arrow), then
/// the answer's first row, one value per line.
const ADBC_SCRIPT: &str = r#"
import sys, time
import adbc_driver_flightsql.dbapi as flight_sql
uri, query, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
with flight_sql.connect(uri) as connection:
    cursor = connection.cursor()
    for _ in range(rounds):
        start = time.perf_counter()
        cursor.execute(query)
        table = cursor.fetch_arrow_table()
        print(time.perf_counter() - start)
    for value in table.to_pylist()[0].values():
        print(value)
"#;

pub(crate) async fn run(args: SqlArgs) -> Result<(), BenchError> {
    check_pk_table_args(args.keys, args.buckets)?;
    if args.lookups == 0 || args.rounds == 0 {
        return Err(BenchError::Usage(
            "--lookups and --rounds must be at least 1".into(),
        ));
    }
    let (scratch, data, config) = prepare(&args.node, args.keys)?;
    let keyed = !args.log_table;
    println!(
        "mink-bench sql: {} keys, {} bucket{}, {}, {}",
        data.rows,
        args.buckets,
        if args.buckets == 1 { "" } else { "s" },
        match keyed {
            true => "primary key id, 1% of the keys changed in the log range",
            false => "a log table, 1% more rows in the log range",
        },
        args.node.describe(&config, &scratch)
    );
    let running = Running::start(config).await?;
    let path = TablePath::new("bench", "sql");
    let key: &[&str] = if keyed { &["id"] } else { &[] };
    let options = lake_options(args.buckets, ON_DEMAND_FRESHNESS);
    let table = create_table_with(&running.client, &path, &data.schema, key, options).await?;
    measure(
        "write the rows",
        write_batches(&running.client, &table, &data.batches),
    )
    .await?;
    measure("tier the load", tier(&running, &path)).await?;
    let tail = Changes::new(args.keys).next(args.keys / 100)?;
    measure(
        "write 1% of the keys again",
        write_batches(&running.client, &table, &tail.batches),
    )
    .await?;

    let storage = running.node.lake().await?.storage().clone();
    let endpoint = running.serve_flight_sql(storage.clone()).await?;
    let adbc_uri = format!("grpc://{}", endpoint.addr());
    let session = MinkSession::connect(running.client.clone(), storage).await?;
    let union = TableName(&path).to_string();
    let final_rows = collect(&session, &format!("SELECT * FROM {union}")).await?;
    let bytes = ipc_len(&final_rows)?;
    let figure = |elapsed| Throughput::new(row_count(&final_rows), bytes, elapsed);
    let parquet_dir = scratch.path.join("baseline-parquet");
    write_files(&parquet_dir, &final_rows, args.buckets).await?;
    if keyed {
        register_log_range(&session, Arc::clone(&tail.schema), tail.batches.clone())?;
    }
    let engines = Engines::open(&parquet_dir).await?;

    for (what, sql) in QUERIES {
        let union_query = sql.replace("{t}", &union);
        let turns = engines
            .in_turn_with(what, sql, args.rounds, || query(&session, &union_query))
            .await?;
        let rows = turns.union_rows;
        // Planning alone (the leader's `plan_table_union`, the lake scan's deletes and
        // footers, DataFusion's planner): the time of `EXPLAIN`, which builds the plan.
        let explain = format!("EXPLAIN {union_query}");
        let (_, planning) =
            timed_rounds(&format!("{what}: planning"), || collect(&session, &explain)).await?;
        let (_, leader) = timed_rounds(&format!("{what}: plan_table_union"), || async {
            Ok(running.client.plan_table_union(&path, &[]).await?)
        })
        .await?;
        report(
            &format!("{what}: union read, planning alone"),
            format!(
                "{:.1} ms, of which the leader's plan_table_union {:.1} ms",
                planning.as_secs_f64() * 1e3,
                leader.as_secs_f64() * 1e3
            ),
            &[],
        );
        if args.explain {
            let plan = collect(&session, &format!("EXPLAIN ANALYZE {union_query}")).await?;
            println!("{}", arrow::util::pretty::pretty_format_batches(&plan)?);
        }
        if args.profile_rounds > 0 {
            profile(&format!("{what}: union read"), args.profile_rounds, || {
                query(&session, &union_query)
            })
            .await?;
            let plain = sql.replace("{t}", "t");
            profile(&format!("{what}: DataFusion"), args.profile_rounds, || {
                engines.query(&plain)
            })
            .await?;
        }
        let (views_time, utf8_time) = (turns.views, turns.utf8);
        let union_figure = figure(turns.union);
        let mut ratios = vec![
            format!(
                "vs DataFusion {:.2}",
                union_figure.ratio_to(&figure(views_time))
            ),
            format!("Utf8 {:.2}", union_figure.ratio_to(&figure(utf8_time))),
        ];
        if keyed {
            let naive = sql.replace("{t}", &naive_source(&path));
            let (naive_rows, naive_time) = timed_rounds(&format!("{what}: the naive plan"), || {
                query(&session, &naive)
            })
            .await?;
            same_answer("the naive plan", &naive_rows, &rows)?;
            report(&format!("{what}: naive plan"), figure(naive_time), &[]);
            ratios.push(format!(
                "naive plan {:.2}",
                union_figure.ratio_to(&figure(naive_time))
            ));
        }
        let duck_time = match duckdb(&parquet_dir, sql) {
            Ok((duck_rows, duck_time)) => {
                same_answer("DuckDB", &duck_rows, &rows)?;
                ratios.push(format!(
                    "DuckDB {:.2}",
                    union_figure.ratio_to(&figure(duck_time))
                ));
                report(&format!("{what}: DuckDB"), figure(duck_time), &[]);
                Some(duck_time)
            }
            Err(why) => {
                report(&format!("{what}: DuckDB"), format!("skipped: {why}"), &[]);
                None
            }
        };
        report(
            &format!("{what}: DataFusion over Parquet"),
            figure(views_time),
            &[],
        );
        report(&format!("{what}: DataFusion, Utf8"), figure(utf8_time), &[]);
        match adbc(&adbc_uri, &union_query) {
            Ok((adbc_rows, adbc_time)) => {
                // Python prints values its own way: the counts must agree.
                same_answer("ADBC", &adbc_rows[..1], &rows[..1])?;
                let adbc_figure = figure(adbc_time);
                let mut adbc_ratios = vec![format!(
                    "vs DataFusion {:.2}",
                    adbc_figure.ratio_to(&figure(views_time))
                )];
                if let Some(duck_time) = duck_time {
                    adbc_ratios.push(format!(
                        "DuckDB {:.2}",
                        adbc_figure.ratio_to(&figure(duck_time))
                    ));
                }
                report(
                    &format!("{what}: union read through ADBC"),
                    adbc_figure,
                    &adbc_ratios,
                );
            }
            Err(why) => report(
                &format!("{what}: union read through ADBC"),
                format!("skipped: {why}"),
                &[],
            ),
        }
        report(
            &format!("{what}: union read, {} changes in the log range", tail.rows),
            union_figure,
            &ratios,
        );
    }

    pruning_figure(&session, &path, data.rows).await?;
    if keyed {
        point_figure(&session, &path, data.rows, args.lookups).await?;
    }
    running.stop().await?;
    Ok(())
}

/// DataFusion over the baseline's Parquet files: with its default configuration
/// (strings read as `Utf8View`), and with strings read as `Utf8`, the type mink's tables
/// give them.
struct Engines {
    views: datafusion::prelude::SessionContext,
    utf8: datafusion::prelude::SessionContext,
}

impl Engines {
    async fn open(dir: &Path) -> Result<Self, BenchError> {
        Ok(Self {
            views: parquet_session(dir, true).await?,
            utf8: parquet_session(dir, false).await?,
        })
    }

    /// The first row of `sql` over the files (`t`), strings read as views.
    async fn query(&self, sql: &str) -> Result<Vec<String>, BenchError> {
        first_row(&self.views.sql(sql).await?.collect().await?)
    }

    /// `union` (a union read of query `sql`), then `sql` over the files (`t`) in both
    /// configurations, in turn for `rounds` rounds; the answers must agree.
    async fn in_turn_with<F>(
        &self,
        what: &str,
        sql: &str,
        rounds: usize,
        mut union: impl FnMut() -> F,
    ) -> Result<Turns, BenchError>
    where
        F: Future<Output = Result<Vec<String>, BenchError>>,
    {
        let sql = sql.replace("{t}", "t");
        let configs = [
            (&self.views, format!("{what}: DataFusion")),
            (&self.utf8, format!("{what}: DataFusion, Utf8")),
        ];
        let mut times: [Vec<Duration>; 3] = Default::default();
        let mut union_rows = Vec::new();
        for _ in 0..rounds {
            let (rows, elapsed) = measure(&format!("{what}: union read"), union()).await?;
            times[0].push(elapsed);
            for ((context, label), times) in configs.iter().zip(&mut times[1..]) {
                let read = async { first_row(&context.sql(&sql).await?.collect().await?) };
                let (answer, elapsed) = measure(label, read).await?;
                same_answer(label, &answer, &rows)?;
                times.push(elapsed);
            }
            union_rows = rows;
        }
        let [union, views, utf8] = times.map(median);
        Ok(Turns {
            union_rows,
            union,
            views,
            utf8,
        })
    }
}

/// The median times of a union read and of DataFusion's reads of the same query, run in
/// turn ([`Engines::in_turn_with`]), and the union read's answer.
struct Turns {
    union_rows: Vec<String>,
    union: Duration,
    views: Duration,
    utf8: Duration,
}

/// Runs `round` `rounds` times between two stderr lines a profiler can wait for.
async fn profile<F>(
    what: &str,
    rounds: usize,
    mut round: impl FnMut() -> F,
) -> Result<(), BenchError>
where
    F: Future<Output = Result<Vec<String>, BenchError>>,
{
    eprintln!("bench: profile {what}: {rounds} rounds start");
    for _ in 0..rounds {
        round().await?;
    }
    eprintln!("bench: profile {what}: end");
    Ok(())
}

/// What the lake scan skipped for two selective reads, from their `EXPLAIN ANALYZE`: 10
/// random keys of the lake (`t$lake`, so no lookup takes them), and a union read of 1% of
/// the keys by range.
async fn pruning_figure(
    session: &MinkSession,
    path: &TablePath,
    keys: usize,
) -> Result<(), BenchError> {
    let table = TableName(path);
    let lake = format!("{}.\"{}$lake\"", path.database, path.name);
    let mut rng = seeded(0x7e57);
    let listed: Vec<String> = (0..10)
        .map(|_| rng.random_range(0..keys as u64).to_string())
        .collect();
    let from = keys / 2;
    let reads = [
        (
            "pruning, 10 keys of the lake",
            format!(
                "SELECT count(*) FROM {lake} WHERE id IN ({})",
                listed.join(", ")
            ),
        ),
        (
            "pruning, 1% of the keys by range",
            format!(
                "SELECT count(*) FROM {table} WHERE id BETWEEN {from} AND {}",
                from + keys / 100 - 1
            ),
        ),
    ];
    for (what, sql) in reads {
        let plan = collect(session, &format!("EXPLAIN ANALYZE {sql}")).await?;
        let text = arrow::util::pretty::pretty_format_batches(&plan)?.to_string();
        let scanned = [
            "row_groups_pruned_statistics",
            "row_groups_pruned_bloom_filter",
            "page_index_rows_pruned",
            "bytes_scanned",
        ]
        .map(|metric| scan_metric(&text, metric).unwrap_or_else(|| format!("no {metric}")));
        report(what, scanned.join(", "), &[]);
    }
    Ok(())
}

/// `name=value` of the Parquet scan's metrics in an `EXPLAIN ANALYZE` text.
fn scan_metric(plan: &str, name: &str) -> Option<String> {
    let line = plan.lines().find(|line| line.contains("DataSourceExec"))?;
    let metrics = line.split_once("metrics=[")?.1;
    metrics
        .split(", ")
        .find(|metric| metric.starts_with(&format!("{name}=")))
        .map(|metric| metric.trim_end_matches([']', ' ', '|']).to_string())
}

/// Figure 3: point queries by lookup against the same query as a full scan.
async fn point_figure(
    session: &MinkSession,
    path: &TablePath,
    keys: usize,
    lookups: usize,
) -> Result<(), BenchError> {
    let table = TableName(path);
    let mut rng = seeded(0x9017);
    let point = |_: usize| {
        let key = rng.random_range(0..keys as u64);
        let sql = format!("SELECT * FROM {table} WHERE id = {key}");
        async move { Ok(row_count(&collect(session, &sql).await?)) }
    };
    let lookup = latency("point queries", CALL_WARMUP, lookups, 1, point).await?;
    let key = keys / 2;
    let sql = format!("SELECT * FROM {table} WHERE id + 0 = {key}");
    let (_, scan_time) = timed_rounds("a point query as a full scan", || async {
        let found = collect(session, &sql).await?;
        check_one_row(&sql, &found)
    })
    .await?;
    let scan_ms = scan_time.as_secs_f64() * 1e3;
    report("point query, full scan", format!("{scan_ms:.3} ms"), &[]);
    report(
        "point query, lookup",
        lookup,
        &[format!(
            "p50 {:.4}, p99 {:.4} of the full scan",
            lookup.p50 / scan_ms,
            lookup.p99 / scan_ms
        )],
    );
    Ok(())
}

/// `bench.sql` as SQL names it.
struct TableName<'a>(&'a TablePath);

impl std::fmt::Display for TableName<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.0.database, self.0.name)
    }
}

/// The lake anti-joined with the log range, union the log range: what a query reads in place of
/// the table in the naive plan.
fn naive_source(path: &TablePath) -> String {
    let lake = format!("{}.\"{}$lake\"", path.database, path.name);
    format!(
        "(SELECT {COLUMNS} FROM {lake} AS l \
           WHERE NOT EXISTS (SELECT 1 FROM scratch.public.log_range AS t WHERE t.id = l.id) \
         UNION ALL SELECT {COLUMNS} FROM scratch.public.log_range)"
    )
}

fn register_log_range(
    session: &MinkSession,
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
) -> Result<(), BenchError> {
    let catalog = Arc::new(MemoryCatalogProvider::new());
    let schema_provider = Arc::new(MemorySchemaProvider::new());
    catalog.register_schema("public", schema_provider)?;
    session.context().register_catalog("scratch", catalog);
    let tail = MemTable::try_new(schema, vec![batches])?;
    session
        .context()
        .register_table("scratch.public.log_range", Arc::new(tail))?;
    Ok(())
}

async fn collect(session: &MinkSession, sql: &str) -> Result<Vec<RecordBatch>, BenchError> {
    Ok(session.sql(sql).await?.collect().await?)
}

/// The first row of a query's answer, as text.
async fn query(session: &MinkSession, sql: &str) -> Result<Vec<String>, BenchError> {
    first_row(&collect(session, sql).await?)
}

fn first_row(batches: &[RecordBatch]) -> Result<Vec<String>, BenchError> {
    let batch = batches
        .iter()
        .find(|b| b.num_rows() > 0)
        .ok_or_else(|| BenchError::Usage("the query returned no row".into()))?;
    batch
        .columns()
        .iter()
        .map(|column| Ok(array_value_to_string(column, 0)?))
        .collect()
}

fn check_one_row(sql: &str, batches: &[RecordBatch]) -> Result<(), BenchError> {
    let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
    match rows {
        1 => Ok(()),
        rows => Err(BenchError::Usage(format!("{sql} returned {rows} rows"))),
    }
}

/// Checks an engine's answer against mink's: every value the same text, or both numbers
/// within a relative 1e-9 (engines add floating-point sums in different orders).
fn same_answer(engine: &str, got: &[String], expected: &[String]) -> Result<(), BenchError> {
    let same = |(got, expected): (&String, &String)| {
        got == expected || relative_difference(got, expected).is_some_and(|d| d < 1e-9)
    };
    if got.len() == expected.len() && got.iter().zip(expected).all(same) {
        return Ok(());
    }
    Err(BenchError::Usage(format!(
        "{engine} answered {got:?}, mink {expected:?}"
    )))
}

fn relative_difference(a: &str, b: &str) -> Option<f64> {
    let (a, b): (f64, f64) = (a.parse().ok()?, b.parse().ok()?);
    Some((a - b).abs() / a.abs().max(b.abs()).max(f64::MIN_POSITIVE))
}

/// Writes the rows as `files` Parquet files in `dir`, batches dealt round robin.
async fn write_files(dir: &Path, batches: &[RecordBatch], files: u32) -> Result<(), BenchError> {
    std::fs::create_dir_all(dir).map_err(BenchError::io(format!("creating {}", dir.display())))?;
    for (file, part) in split(batches, files).into_iter().enumerate() {
        if part.is_empty() {
            continue;
        }
        let path = dir.join(format!("part-{file}.parquet"));
        blocking(move || write_parquet(&path, &part)).await?;
    }
    Ok(())
}

/// DuckDB's answer to `sql` (a [`QUERIES`] entry) over the Parquet files in `dir` and its
/// median time, or why it could not run.
/// The median time of `sql` through the ADBC Flight SQL driver at `uri`, and the
/// answer's first row.
fn adbc(uri: &str, sql: &str) -> Result<(Vec<String>, Duration), String> {
    let args = [uri.to_string(), sql.to_string(), ROUNDS.to_string()];
    let stdout = python(ADBC_SCRIPT, &args, "adbc-driver-flightsql pyarrow")?;
    timed_lines("ADBC", &stdout)
}

fn duckdb(dir: &Path, sql: &str) -> Result<(Vec<String>, Duration), String> {
    let files = format!("read_parquet('{}/*.parquet')", dir.display());
    // DuckDB prints timestamps without a zone: normalize in SQL so the answers compare as
    // text.
    let sql = sql.replace("{t}", &files).replace(
        "max(event_time) AS last_event",
        "strftime(max(event_time), '%Y-%m-%dT%H:%M:%S.%fZ') AS last_event",
    );
    let stdout = python(DUCKDB_SCRIPT, &[sql, ROUNDS.to_string()], "duckdb")?;
    timed_lines("DuckDB", &stdout)
}

/// What a timing script printed: [`ROUNDS`] times in seconds (their median), then the
/// answer's values.
fn timed_lines(engine: &str, stdout: &str) -> Result<(Vec<String>, Duration), String> {
    let lines: Vec<&str> = stdout.lines().collect();
    let (times, row) = lines.split_at(ROUNDS.min(lines.len()));
    let times = times
        .iter()
        .map(|t| t.parse::<f64>().map(Duration::from_secs_f64))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{engine}'s output: {e}"))?;
    if row.is_empty() {
        return Err(format!("{engine} printed no answer"));
    }
    Ok((row.iter().map(|v| v.to_string()).collect(), median(times)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_agree_exactly_except_floating_point_sums() {
        let mink: Vec<String> = ["10", "55", "z", "t", "1.0000000001"]
            .map(String::from)
            .to_vec();
        let close: Vec<String> = ["10", "55", "z", "t", "1.0000000002"]
            .map(String::from)
            .to_vec();
        assert!(same_answer("x", &close, &mink).is_ok());
        let off: Vec<String> = ["10", "56", "z", "t", "1.0000000001"]
            .map(String::from)
            .to_vec();
        assert!(same_answer("x", &off, &mink).is_err());
    }
}
