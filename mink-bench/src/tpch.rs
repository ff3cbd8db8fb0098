//! `mink-bench tpch`: the 22 TPC-H queries over mink tables, run by the server alone and
//! with 1, 2 and 4 workers (`mink_sql::distributed`): each query's time and the overhead
//! of distribution against the single-node run in the same process. With one worker
//! nothing is distributed (every stage has one task, which datafusion-distributed keeps
//! on the server): that run measures the per-bucket plan of a session with workers.
//!
//! The eight tables are loaded at `--scale` through the client into tables of
//! `--buckets` buckets with a lake (`lineitem`, `nation` and `region` log tables, the
//! others keyed by their primary keys), tiered, and then 1% of the orders and customers
//! updated, so the union reads merge a tail. The workers run in this process on loopback
//! ports, on the same cores as the coordinator: no speed-up is possible here, the figure
//! is what distribution costs (plans shipped, rows through Flight between stages). Every
//! distributed answer is checked against the single-node one.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use mink_client::MinkClient;
use mink_core::table::TablePath;
use mink_lake::storage::LakeStorage;
use mink_sql::distributed::Distribution;
use mink_sql::distributed::worker::{WorkerConfig, serve};
use mink_sql::session::{MinkSession, SqlRuntime, default_memory_limit, memory_pool};
use mink_tpch::TpchTable;
use tokio::net::TcpListener;

use crate::error::BenchError;
use crate::harness::{NodeArgs, Running, Scratch, measure, median};

/// Arguments of `mink-bench tpch`.
#[derive(Debug, clap::Args)]
pub(crate) struct TpchArgs {
    /// TPC-H scale factor (1: 6M line items).
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
    /// Worker counts to run the queries on, besides the server alone.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    workers: Vec<usize>,
    /// Buckets of every table.
    #[arg(long, default_value_t = 4)]
    buckets: u32,
    /// Runs of each query per setting (medians).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    #[command(flatten)]
    node: NodeArgs,
}

/// Each table, and its primary key (none: a log table).
const TABLES: [(TpchTable, Option<&str>); 8] = [
    (mink_tpch::REGION, None),
    (mink_tpch::NATION, None),
    (mink_tpch::SUPPLIER, Some("s_suppkey")),
    (mink_tpch::CUSTOMER, Some("c_custkey")),
    (mink_tpch::PART, Some("p_partkey")),
    (mink_tpch::PARTSUPP, Some("ps_partkey, ps_suppkey")),
    (mink_tpch::ORDERS, Some("o_orderkey")),
    (mink_tpch::LINEITEM, None),
];

/// The changes after the tiering round: 1% of the orders and of the customers.
const CHANGES: [&str; 2] = [
    "UPDATE orders SET o_comment = 'changed' WHERE o_orderkey % 100 = 7",
    "UPDATE customer SET c_acctbal = c_acctbal + 1.00 WHERE c_custkey % 100 = 7",
];

/// Rows per client write.
const WRITE_ROWS: usize = 65_536;

pub(crate) async fn run(args: TpchArgs) -> Result<(), BenchError> {
    let scratch = Scratch::new(args.node.dir.clone())?;
    let config = args.node.config(&scratch, 256 << 20);
    println!(
        "TPC-H at scale factor {}, {} buckets per table, workers in this process ({})",
        args.scale,
        args.buckets,
        args.node.describe(&config, &scratch)
    );
    let running = Running::start(config).await?;
    let storage = running.node.lake().await?.storage().clone();
    let session = MinkSession::connect(running.client.clone(), storage.clone()).await?;
    for (table, key) in TABLES {
        load(
            &running.client,
            &session,
            table,
            key,
            args.buckets,
            args.scale,
        )
        .await?;
    }
    for change in CHANGES {
        measure(change, collect(&session, change)).await?;
    }

    let most = args.workers.iter().copied().max().unwrap_or(0);
    let mut addrs = Vec::with_capacity(most);
    for _ in 0..most {
        addrs.push(start_worker(&running.client, &storage).await?);
    }
    let mut settings = Vec::new();
    for &count in &args.workers {
        settings.push((
            count,
            distributed(&running.client, &storage, &addrs[..count]).await?,
        ));
    }

    let mut header = String::from("query | server alone");
    for (count, _) in &settings {
        header.push_str(&format!(
            " | {count} worker{}",
            if *count == 1 { "" } else { "s" }
        ));
    }
    println!("{header}");
    let mut totals = vec![Duration::ZERO; settings.len() + 1];
    let mut overheads: Vec<Vec<f64>> = vec![Vec::new(); settings.len()];
    for number in 1..=22 {
        let sql = mink_tpch::query(number);
        let (local, answer) = timed(&session, sql, args.rounds).await?;
        totals[0] += local;
        let mut line = format!("Q{number} | {:.1} ms", millis(local));
        for (i, (count, distributed)) in settings.iter().enumerate() {
            let (time, distributed_answer) = timed(distributed, sql, args.rounds).await?;
            if distributed_answer != answer {
                return Err(BenchError::Mismatch(format!(
                    "Q{number} on {count} workers answered differently"
                )));
            }
            totals[i + 1] += time;
            let ratio = time.as_secs_f64() / local.as_secs_f64();
            overheads[i].push(ratio);
            line.push_str(&format!(" | {:.1} ms ({ratio:.2}x)", millis(time)));
        }
        println!("{line}");
    }
    let mut summary = format!("all 22 | {:.0} ms", millis(totals[0]));
    for (i, (count, _)) in settings.iter().enumerate() {
        let ratios = &overheads[i];
        let geometric = (ratios.iter().map(|r| r.ln()).sum::<f64>() / ratios.len() as f64).exp();
        summary.push_str(&format!(
            " | {:.0} ms ({:.2}x the server alone; geometric mean of the queries' ratios {geometric:.2}x, {count} workers)",
            millis(totals[i + 1]),
            totals[i + 1].as_secs_f64() / totals[0].as_secs_f64()
        ));
    }
    println!("{summary}");
    Ok(())
}

/// Creates `table` (keyed by `key`, or a log table), writes its rows at `scale` through
/// the client and tiers it.
async fn load(
    client: &MinkClient,
    session: &MinkSession,
    table: TpchTable,
    key: Option<&str>,
    buckets: u32,
    scale: f64,
) -> Result<(), BenchError> {
    let name = table.name;
    let key = key.map_or_else(String::new, |key| format!(", PRIMARY KEY ({key})"));
    let create = format!(
        "CREATE TABLE {name} ({}{key}) WITH ('bucket.num' = '{buckets}', \
         'lake.enabled' = 'true', 'lake.freshness' = '1h')",
        table.columns
    );
    collect(session, &create).await?;
    let descriptor = client
        .describe_table(&TablePath::new("default", name))
        .await?;
    let rows = RecordBatch::try_new(Arc::clone(descriptor.schema()), (table.generate)(scale))?;
    let write = async {
        for start in (0..rows.num_rows()).step_by(WRITE_ROWS) {
            let length = WRITE_ROWS.min(rows.num_rows() - start);
            client
                .write(&descriptor, &rows.slice(start, length))
                .await?;
        }
        Ok::<_, BenchError>(())
    };
    measure(&format!("write {name} ({} rows)", rows.num_rows()), write).await?;
    let tier = format!("CALL system.tier('{name}')");
    measure(&format!("tier {name}"), collect(session, &tier)).await?;
    Ok(())
}

/// A worker in this process on a loopback port, reading the node `client` reaches and
/// the lake through `storage`: its address.
async fn start_worker(client: &MinkClient, storage: &LakeStorage) -> Result<String, BenchError> {
    let config = WorkerConfig {
        runtime: SqlRuntime::server(memory_pool(default_memory_limit()), storage)?,
        storage: storage.clone(),
        node: client.clone(),
        credentials: None,
        tls: None,
    };
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(BenchError::io("binding a loopback port"))?;
    let addr = listener
        .local_addr()
        .map_err(BenchError::io("binding a loopback port"))?;
    let serving = serve(config, listener, 1024, std::future::pending())?;
    tokio::spawn(serving);
    Ok(addr.to_string())
}

/// A session whose every table read runs on `workers` (a task per bucket, at most one
/// per worker), once they all answer.
async fn distributed(
    client: &MinkClient,
    storage: &LakeStorage,
    workers: &[String],
) -> Result<MinkSession, BenchError> {
    let distribution = Distribution::new(workers, None, None, 1)?;
    let runtime = SqlRuntime::server(memory_pool(default_memory_limit()), storage)?
        .with_distribution(distribution.clone());
    let deadline = Instant::now() + Duration::from_secs(30);
    while distribution.workers().live().len() < workers.len() {
        if Instant::now() > deadline {
            return Err(BenchError::Mismatch(format!(
                "workers {workers:?} never answered"
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(MinkSession::connect_in(client.clone(), storage.clone(), &runtime).await?)
}

/// The median time of `rounds` runs of `sql`, and its answer as sorted rows.
async fn timed(
    session: &MinkSession,
    sql: &str,
    rounds: usize,
) -> Result<(Duration, Vec<String>), BenchError> {
    let mut times = Vec::with_capacity(rounds);
    let mut answer = Vec::new();
    for _ in 0..rounds.max(1) {
        let start = Instant::now();
        let batches = collect(session, sql).await?;
        times.push(start.elapsed());
        answer = mink_tpch::sorted_rows(&batches)?;
    }
    Ok((median(times), answer))
}

async fn collect(session: &MinkSession, sql: &str) -> Result<Vec<RecordBatch>, BenchError> {
    Ok(session.sql(sql).await?.collect().await?)
}

fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}
