//! `mink-bench planning`: what a trivial union read costs as a table's lake grows by
//! tiering rounds, with lake upkeep off and on, for few and many buckets.
//!
//! ```text
//! cargo run --release -p mink-bench -- planning [--rounds 1000] [--buckets 4[,64]]
//!     [--upkeep off,on] [--keys 500] [--retention-ms MS] [--dir DIR] [--no-sync]
//! ```
//!
//! One primary-key table (`id`) per bucket count and upkeep, `--keys` rows loaded and
//! tiered, then `--rounds` tiering rounds of 2 upserted keys each (every round adds a
//! snapshot, manifests and files, as a table tiered every 30 seconds does):
//!
//! - upkeep `off`: rounds alone (`CALL system.tier`), on a table whose commits do not
//!   merge manifests (`commit.manifest-merge.enabled = false`): how the lake grew before
//!   lake upkeep;
//! - upkeep `on`: what the tiering service does for a due table
//!   ([`mink_node::tiering::service_round`]): the round, the compaction due, the scheduled
//!   expiry and orphan removal, with the table's default properties (commits merge
//!   manifests).
//!
//! After the first round, at checkpoints and after the last, `SELECT count(*)` through
//! SQL is timed: its first run after the round (which loads the table's new metadata)
//! and the median of [`ROUNDS`](crate::harness::ROUNDS); its work is planning and a few
//! rows read. Beside it the node's `plan_table_union` alone. Baselines: the same query
//! after the first round (the growth with rounds), upkeep off at the same round, and the
//! fewest buckets at the same round. After the last round: what the lake holds
//! (`system.lake_tables`' counts) and the files and bytes under the table's location.

use std::path::Path;
use std::time::Duration;

use mink_core::table::TablePath;
use mink_node::NodeError;
use mink_node::tiering::{UpkeepIntervals, UpkeepSchedule, service_round};
use mink_sql::session::MinkSession;

use crate::data::Changes;
use crate::error::BenchError;
use crate::harness::{
    NodeArgs, ON_DEMAND_FRESHNESS, Running, check_pk_table_args, create_table_with, lake_options,
    measure, prepare, report, tier, timed_rounds, write_batches,
};

/// Lake upkeep while the rounds run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Upkeep {
    /// Rounds alone; commits do not merge manifests.
    Off,
    /// The tiering service's rounds: compaction, expiry, orphan removal, merged manifests.
    On,
}

impl Upkeep {
    fn name(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::On => "on",
        }
    }
}

/// Arguments of `mink-bench planning`.
#[derive(Debug, clap::Args)]
pub(crate) struct PlanningArgs {
    /// Tiering rounds after the load.
    #[arg(long, default_value_t = 1000)]
    rounds: usize,
    /// Bucket counts to compare, one table each.
    #[arg(long, value_delimiter = ',', default_values_t = [4])]
    buckets: Vec<u32>,
    /// Lake upkeep to compare, one table each.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Upkeep::Off, Upkeep::On])]
    upkeep: Vec<Upkeep>,
    /// Keys of each table.
    #[arg(long, default_value_t = 500)]
    keys: usize,
    /// Compress hours of rounds into the run: the `on` table keeps snapshots this many
    /// milliseconds (`history.expire.max-snapshot-age-ms`), and its upkeep expires after
    /// every round and removes orphans as old as that, as often. Default: the table's and
    /// the service's defaults (1 h, every 5 min; orphans of 3 days, every hour).
    #[arg(long, value_name = "MS")]
    retention_ms: Option<u64>,
    #[command(flatten)]
    node: NodeArgs,
}

/// Keys upserted by each round.
const KEYS_PER_ROUND: usize = 2;

/// One table's figures at a checkpoint: the first query after the round, the median, and
/// the node's planning alone.
#[derive(Debug, Clone, Copy)]
struct Timed {
    first: Duration,
    median: Duration,
    planned: Duration,
}

pub(crate) async fn run(args: PlanningArgs) -> Result<(), BenchError> {
    for &buckets in &args.buckets {
        check_pk_table_args(args.keys, buckets)?;
    }
    if args.rounds == 0 || args.upkeep.is_empty() {
        return Err(BenchError::Usage(
            "--rounds must be at least 1 and --upkeep name off, on or both".into(),
        ));
    }
    let (scratch, data, config) = prepare(&args.node, args.keys)?;
    println!(
        "mink-bench planning: {} keys, {} rounds of {KEYS_PER_ROUND} upserts, buckets {:?}, upkeep {:?}, retention {}, {}",
        data.rows,
        args.rounds,
        args.buckets,
        args.upkeep,
        args.retention_ms
            .map_or_else(|| "default".to_string(), |ms| format!("{ms} ms")),
        args.node.describe(&config, &scratch)
    );
    let running = Running::start(config).await?;
    let checkpoints = checkpoints(args.rounds);
    // Per (bucket count, upkeep), at each checkpoint.
    let mut times: Vec<((u32, Upkeep), Vec<Timed>)> = Vec::new();
    for &buckets in &args.buckets {
        for &upkeep in &args.upkeep {
            let name = format!("planning_{buckets}_upkeep_{}", upkeep.name());
            let mut options = lake_options(buckets, ON_DEMAND_FRESHNESS);
            let mut schedule = UpkeepSchedule::default();
            match (upkeep, args.retention_ms) {
                (Upkeep::Off, _) => {
                    let merge = ("commit.manifest-merge.enabled".into(), "false".into());
                    options.lake_properties.extend([merge]);
                }
                (Upkeep::On, Some(ms)) => {
                    let age = ("history.expire.max-snapshot-age-ms".into(), ms.to_string());
                    options.lake_properties.extend([age]);
                    schedule = UpkeepSchedule::new(UpkeepIntervals {
                        expire_every: Duration::ZERO,
                        remove_orphans_every: Duration::from_millis(ms),
                        orphan_grace: Duration::from_millis(ms),
                    });
                }
                (Upkeep::On, None) => {}
            }
            let path = TablePath::new("bench", &name);
            let table =
                create_table_with(&running.client, &path, &data.schema, &["id"], options).await?;
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
                match upkeep {
                    Upkeep::Off => {
                        tier(&running, &path).await?;
                    }
                    Upkeep::On => {
                        service_round(&running.node, &path, &mut schedule).await?;
                    }
                }
                if checkpoints.contains(&round) {
                    let what = format!("{name}, round {round}");
                    let count = || async {
                        let batches = session.sql(&sql).await?.collect().await?;
                        match crate::harness::row_count(&batches) {
                            1 => Ok(()),
                            n => Err(BenchError::Usage(format!("{sql} returned {n} rows"))),
                        }
                    };
                    let (_, first) = measure(&format!("{what}: first count(*)"), count()).await?;
                    let (_, median) = timed_rounds(&what, count).await?;
                    let what = format!("{what}: plan_table_union");
                    let (_, planned) = timed_rounds(&what, || async {
                        Ok(running.client.plan_table_union(&path, &[]).await?)
                    })
                    .await?;
                    at.push(Timed {
                        first,
                        median,
                        planned,
                    });
                }
            }
            report_lake(
                &running,
                &path,
                &format!("{buckets} buckets, upkeep {}", upkeep.name()),
            )
            .await?;
            times.push(((buckets, upkeep), at));
        }
    }
    report_times(&times, &checkpoints);
    running.stop().await?;
    Ok(())
}

/// Prints each table's figures at each checkpoint, with their ratios to its first round,
/// to upkeep off at the same round and to the fewest buckets at the same round.
fn report_times(times: &[((u32, Upkeep), Vec<Timed>)], checkpoints: &[usize]) {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let find = |key: (u32, Upkeep)| times.iter().find(|(k, _)| *k == key).map(|(_, t)| t);
    let fewest = times.iter().map(|((b, _), _)| *b).min().unwrap_or_default();
    for ((buckets, upkeep), at) in times {
        for (c, &round) in checkpoints.iter().enumerate() {
            let timed = at[c];
            let mut ratios = vec![format!(
                "{:.2}x its time after round 1",
                ms(timed.median) / ms(at[0].median)
            )];
            if *upkeep == Upkeep::On
                && let Some(off) = find((*buckets, Upkeep::Off))
            {
                ratios.push(format!(
                    "{:.2}x upkeep off's",
                    ms(timed.median) / ms(off[c].median)
                ));
            }
            if *buckets != fewest
                && let Some(few) = find((fewest, *upkeep))
            {
                ratios.push(format!(
                    "{:.2}x {fewest} buckets'",
                    ms(timed.median) / ms(few[c].median)
                ));
            }
            ratios.push(format!(
                "first after the round {:.1} ms, plan_table_union {:.1} ms",
                ms(timed.first),
                ms(timed.planned)
            ));
            report(
                &format!(
                    "count(*), {buckets} b, upkeep {}, round {round}",
                    upkeep.name()
                ),
                format!("{:.1} ms", ms(timed.median)),
                &ratios,
            );
        }
    }
}

/// Prints what a table's lake holds and the files and bytes under its location.
async fn report_lake(running: &Running, path: &TablePath, label: &str) -> Result<(), BenchError> {
    let stats = running.client.lake_table_stats(path).await?;
    let lake_table = running.node.lake().await?.load(path).await;
    let location = lake_table
        .map_err(NodeError::from)?
        .metadata()
        .location()
        .to_string();
    let (files, bytes) = files_under(Path::new(&location));
    report(
        &format!("lake, {label}"),
        format!(
            "{} snapshots, {} manifests, {} data files, {} delete files",
            stats.snapshots, stats.manifests, stats.data_files, stats.delete_files
        ),
        &[format!(
            "under the table's location: {} metadata, {} manifest and manifest-list, {} Parquet files, {:.1} MB in all",
            files.metadata,
            files.avro,
            files.parquet,
            bytes as f64 / 1e6
        )],
    );
    Ok(())
}

/// Files under a local directory, by kind.
#[derive(Debug, Default)]
struct Files {
    metadata: usize,
    avro: usize,
    parquet: usize,
}

/// The files under a local directory by kind, and their bytes (nothing for a location
/// that is not local).
fn files_under(dir: &Path) -> (Files, u64) {
    let mut files = Files::default();
    let mut bytes = 0;
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                dirs.push(path);
                continue;
            }
            bytes += meta.len();
            let name = path.to_string_lossy();
            if name.ends_with(".metadata.json") {
                files.metadata += 1;
            } else if name.ends_with(".avro") {
                files.avro += 1;
            } else if name.ends_with(".parquet") {
                files.parquet += 1;
            }
        }
    }
    (files, bytes)
}

/// The rounds after which the query is timed: the first, a tenth, two fifths (round 400
/// of 1000, the lake-upkeep issue's figure), half, and the last.
fn checkpoints(rounds: usize) -> Vec<usize> {
    let mut at = vec![
        1,
        rounds.div_ceil(10),
        (rounds * 2).div_ceil(5),
        rounds.div_ceil(2),
        rounds,
    ];
    at.dedup();
    at
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoints_start_at_one_and_end_at_the_last_round() {
        assert_eq!(checkpoints(1000), [1, 100, 400, 500, 1000]);
        assert_eq!(checkpoints(500), [1, 50, 200, 250, 500]);
        assert_eq!(checkpoints(1), [1]);
        assert_eq!(checkpoints(3), [1, 2, 3]);
    }
}
