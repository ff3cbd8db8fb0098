//! `mink-bench planning`: what a trivial union read costs as a table's lake grows by
//! tiering rounds, for few and many buckets.
//!
//! ```text
//! cargo run --release -p mink-bench -- planning [--rounds 500] [--buckets 4,64]
//!     [--keys 500] [--dir DIR] [--no-sync]
//! ```
//!
//! One primary-key table (`id`) per bucket count, `--keys` rows loaded and tiered, then
//! `--rounds` tiering rounds of 2 upserted keys each (every round adds a snapshot, a
//! manifest and its files, as a table tiered every 30 seconds does). After the first
//! round, at checkpoints and after the last, `SELECT count(*)` through SQL is timed
//! (median of [`ROUNDS`](crate::harness::ROUNDS)): its work is planning (one
//! `plan_table_union` over every bucket and manifest; the position-delete files and the
//! footers of the files they apply to read for the lake scan) and a few rows read.
//! Baselines: the same query after the first round (the growth with rounds), and the same
//! round on the fewest buckets (the growth with buckets, which one planning of every
//! bucket at once keeps flat). Beside each figure, the node's `plan_table_union` alone.

use std::time::Duration;

use mink_sql::session::MinkSession;

use crate::data::Changes;
use crate::error::BenchError;
use crate::harness::{
    NodeArgs, Running, check_pk_table_args, create_pk_lake_table, prepare, report, tier,
    timed_rounds, write_batches,
};

/// Arguments of `mink-bench planning`.
#[derive(Debug, clap::Args)]
pub(crate) struct PlanningArgs {
    /// Tiering rounds after the load.
    #[arg(long, default_value_t = 500)]
    rounds: usize,
    /// Bucket counts to compare, one table each.
    #[arg(long, value_delimiter = ',', default_values_t = [4, 64])]
    buckets: Vec<u32>,
    /// Keys of each table.
    #[arg(long, default_value_t = 500)]
    keys: usize,
    #[command(flatten)]
    node: NodeArgs,
}

/// Keys upserted by each round.
const KEYS_PER_ROUND: usize = 2;

pub(crate) async fn run(args: PlanningArgs) -> Result<(), BenchError> {
    for &buckets in &args.buckets {
        check_pk_table_args(args.keys, buckets)?;
    }
    if args.rounds == 0 {
        return Err(BenchError::Usage("--rounds must be at least 1".into()));
    }
    let (scratch, data, config) = prepare(&args.node, args.keys)?;
    println!(
        "mink-bench planning: {} keys, {} rounds of {KEYS_PER_ROUND} upserts, buckets {:?}, {}",
        data.rows,
        args.rounds,
        args.buckets,
        args.node.describe(&config, &scratch)
    );
    let running = Running::start(config).await?;
    let checkpoints = checkpoints(args.rounds);
    // Per bucket count, at each checkpoint: the query's time, and the node's planning's.
    let mut times: Vec<Vec<(Duration, Duration)>> = Vec::new();
    for &buckets in &args.buckets {
        let name = format!("planning_{buckets}");
        let table = create_pk_lake_table(&running, &name, &data, buckets).await?;
        write_batches(&running.client, &table, &data.batches).await?;
        let storage = running.node.lake().await?.storage().clone();
        let session = MinkSession::connect(running.client.clone(), storage).await?;
        let sql = format!("SELECT count(*) FROM bench.{name}");
        let mut changes = Changes::new(args.keys);
        let mut changed = 0;
        let mut at = Vec::new();
        for round in 1..=args.rounds {
            if round > 1 {
                // Every key changes once before any changes again.
                if changed + KEYS_PER_ROUND > args.keys {
                    (changes, changed) = (Changes::new(args.keys), 0);
                }
                changed += KEYS_PER_ROUND;
                let upserts = changes.next(KEYS_PER_ROUND)?;
                write_batches(&running.client, &table, &upserts.batches).await?;
            }
            tier(&running, &table.path).await?;
            if checkpoints.contains(&round) {
                let what = format!("{buckets} buckets, round {round}");
                let (counted, elapsed) = timed_rounds(&what, || async {
                    let batches = session.sql(&sql).await?.collect().await?;
                    Ok(crate::harness::row_count(&batches))
                })
                .await?;
                if counted != 1 {
                    return Err(BenchError::Usage(format!("{sql} returned {counted} rows")));
                }
                let what = format!("{buckets} buckets, round {round}: plan_table_union");
                let (_, planned) = timed_rounds(&what, || async {
                    Ok(running.client.plan_table_union(&table.path, &[]).await?)
                })
                .await?;
                at.push((elapsed, planned));
            }
        }
        times.push(at);
    }
    for (b, &buckets) in args.buckets.iter().enumerate() {
        for (c, &round) in checkpoints.iter().enumerate() {
            let (elapsed, planned) = times[b][c];
            let mut ratios = vec![format!(
                "{:.2}x its time after round 1",
                elapsed.as_secs_f64() / times[b][0].0.as_secs_f64()
            )];
            if b > 0 {
                ratios.push(format!(
                    "{:.2}x {} buckets' at this round",
                    elapsed.as_secs_f64() / times[0][c].0.as_secs_f64(),
                    args.buckets[0]
                ));
            }
            ratios.push(format!(
                "of which plan_table_union {:.1} ms",
                planned.as_secs_f64() * 1e3
            ));
            let ms = elapsed.as_secs_f64() * 1e3;
            report(
                &format!("count(*), {buckets} buckets, round {round}"),
                format!("{ms:.1} ms"),
                &ratios,
            );
        }
    }
    running.stop().await?;
    Ok(())
}

/// The rounds after which the query is timed: the first, a tenth, half, and the last.
fn checkpoints(rounds: usize) -> Vec<usize> {
    let mut at = vec![1, rounds.div_ceil(10), rounds.div_ceil(2), rounds];
    at.dedup();
    at
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoints_start_at_one_and_end_at_the_last_round() {
        assert_eq!(checkpoints(500), [1, 50, 250, 500]);
        assert_eq!(checkpoints(1), [1]);
        assert_eq!(checkpoints(3), [1, 2, 3]);
    }
}
