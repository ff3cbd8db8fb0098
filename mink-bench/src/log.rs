//! `mink-bench log`: the log, against Arrow IPC files on the same disk.
//!
//! ```text
//! cargo run --release -p mink-bench -- log [--rows 2000000] [--dir DIR] [--no-sync]
//! ```
//!
//! An embedded node is served on a loopback port and driven through [`MinkClient`], so every
//! figure includes the Flight protocol. The data is `--rows` rows (default 2 000 000) of
//! `id i64, event_time timestamp(µs, UTC), name utf8 (20 chars), price f64, quantity i32`,
//! generated deterministically in batches of 10 000 rows. Byte rates count the data's size
//! as an Arrow IPC stream (the baseline file's length); 1 MB is 10^6 bytes. A throughput
//! ratio above 1 means mink is faster than its baseline; a latency ratio is mink's latency
//! over the baseline's, above 1 when mink is slower.
//!
//! 1. **Append throughput**, 1 bucket and 8 buckets. Each bucket has one writer task that
//!    sends its share of the batches (batch `i` goes to bucket `i % n`) four per
//!    [`MinkClient::append`] call; a call returns once its batches are durable. Baselines:
//!    the same batches written by one `arrow::ipc::writer::StreamWriter` to a file in the
//!    same directory, with `sync_data` after each batch (mink acknowledges only after an
//!    fsync, one per group commit), and with one `sync_data` at the end. With `--no-sync`
//!    mink does not fsync and the single baseline never does either. Three rounds, each
//!    writing the baselines then appending to fresh tables (`bench.log1_round1`, ...,
//!    dropped once written; the last round's are `bench.log1` and `bench.log8`): each
//!    figure is the median of its rounds, each ratio the median of the rounds' ratios,
//!    printed with each round's (this machine's write rates, the baselines' too, move
//!    2x-3x between runs). Each append also prints the CPU time per row the process used
//!    (all threads, the client's included) against the first baseline's.
//! 2. **Scan throughput** of the 1-bucket table from offset 0 to the high watermark, with
//!    the server's default answer size: first from the log cache (sized to hold the
//!    table), then from cold segments after a restart (the server is shut down, the node
//!    dropped and reopened on the same directory, so its cache is empty; the operating
//!    system's page cache is not dropped). Baselines: reading the baseline IPC file with
//!    `arrow::ipc::reader::StreamReader`, and reading it the same way as it arrives
//!    through a loopback TCP socket that a thread feeds from the file (the ceiling of any
//!    protocol over a socket on the machine: no framing, no requests).
//! 3. **Tail latency**: 500 appends of one 100-row batch (after 10 uncounted warm-up
//!    appends) while one tail reader on another task long-polls with `max_wait` 1 s. The
//!    writer waits for the reader to have each batch before it sends the next. Two
//!    latencies, p50 and p99: *ack -> tailer*, from the moment `append` returns the
//!    acknowledgement to the moment the reader's poll returns the batch (negative when the
//!    reader has it first: the node wakes readers and acknowledges writers at the same
//!    time), and *write -> tailer*, from just before `append` is called. Baseline for the
//!    latter: writing each of the same batches to an IPC file followed by `sync_data`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use mink_client::{ClientError, MinkClient};
use mink_core::protocol::BucketId;
use mink_core::table::TablePath;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::data::{BATCH_ROWS, Data, make_batch, seeded};
use crate::error::BenchError;
use crate::harness::{
    Latency, NodeArgs, ROUNDS, Running, Throughput, Timed, append_parts, blocking, check_rows,
    create_table, measure, measure_with_cpu, median, prepare, ratio_of_rounds, report,
    report_cpu_per_row, scan_bucket, split,
};
use crate::ipc::{Fsync, read_ipc, read_ipc_through_loopback, write_ipc};

/// Arguments of `mink-bench log`.
#[derive(Debug, clap::Args)]
pub(crate) struct LogArgs {
    /// Rows to write, in batches of 10 000.
    #[arg(long, default_value_t = 2_000_000)]
    rows: usize,
    #[command(flatten)]
    node: NodeArgs,
}

/// Bucket counts of the append figure.
pub(crate) const APPEND_BUCKETS: [u32; 2] = [1, 8];
/// Appends measured by the tail figure, after the uncounted warm-up ones.
const TAIL_BATCHES: usize = 500;
const TAIL_WARMUP: usize = 10;
const TAIL_ROWS: usize = 100;
/// `max_wait` of each tail poll.
const TAIL_WAIT: Duration = Duration::from_secs(1);
/// How long the writer waits for the tail reader to have its batch before giving up.
const TAIL_TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) async fn run(args: LogArgs) -> Result<(), BenchError> {
    if args.rows == 0 {
        return Err(BenchError::Usage("--rows must be at least 1".into()));
    }
    let sync = args.node.sync();
    // The cache holds the whole 1-bucket table, so its first scan is served from it.
    let (scratch, data, config) = prepare(&args.node, args.rows)?;
    println!(
        "mink-bench log: {} rows ({} MB in memory) in batches of {BATCH_ROWS}, {}",
        data.rows,
        data.memory_bytes() / 1_000_000,
        args.node.describe(&config, &scratch)
    );
    let running = Running::start(config).await?;
    let ipc = append_figure(&running, &data, &scratch.path, sync).await?;
    let running = scan_figure(running, &data, &ipc).await?;
    tail_figure(&running, &data.schema, &scratch.path, sync).await?;
    running.stop().await?;
    Ok(())
}

/// The baseline IPC file of the append figure, read back by the scan figure.
#[derive(Debug)]
struct IpcFile {
    path: PathBuf,
    bytes: u64,
}

/// Figure 1: append throughput to 1 and to 8 buckets, against IPC file writes, in
/// [`ROUNDS`] rounds (see the module's documentation).
async fn append_figure(
    running: &Running,
    data: &Data,
    dir: &Path,
    sync: bool,
) -> Result<IpcFile, BenchError> {
    let modes = if sync {
        vec![Fsync::EachBatch, Fsync::AtEnd]
    } else {
        vec![Fsync::Never]
    };
    let mut rounds = Vec::with_capacity(ROUNDS);
    let mut file = None;
    for round in 1..=ROUNDS {
        let (times, written) = append_round(running, data, dir, &modes, round).await?;
        rounds.push(times);
        file.get_or_insert(written);
    }
    let file = file.ok_or_else(|| BenchError::Usage("no rounds".into()))?;
    let throughput = |times: Vec<Duration>| Throughput::new(data.rows, file.bytes, median(times));
    for (index, mode) in modes.iter().enumerate() {
        let times = rounds.iter().map(|round| round.baselines[index].elapsed);
        let label = format!("baseline {}", mode.label());
        report(&label, throughput(times.collect()), &[]);
    }
    for (index, &buckets) in APPEND_BUCKETS.iter().enumerate() {
        let paired = |mode: usize, of: fn(&Timed) -> Duration| -> Vec<(Duration, Duration)> {
            (rounds.iter())
                .map(|round| (of(&round.baselines[mode]), of(&round.appends[index])))
                .collect()
        };
        let ratios: Vec<String> = (modes.iter().enumerate())
            .map(|(mode, name)| ratio_of_rounds(name.label(), &paired(mode, |t| t.elapsed)))
            .collect();
        let times = rounds.iter().map(|round| round.appends[index].elapsed);
        let label = append_label(buckets);
        report(&label, throughput(times.collect()), &ratios);
        let cpu_label = format!("{label}, CPU");
        let cpu = paired(0, |t| t.cpu);
        report_cpu_per_row(&cpu_label, modes[0].label(), data.rows, &cpu);
    }
    Ok(file)
}

/// Round `round` of [`append_figure`]: the IPC file written in each of `modes`, then the
/// batches appended to a fresh table of each bucket count (dropped after, but in the last
/// round). Returns the times and the first mode's file.
async fn append_round(
    running: &Running,
    data: &Data,
    dir: &Path,
    modes: &[Fsync],
    round: usize,
) -> Result<(AppendRound, IpcFile), BenchError> {
    let mut baselines = Vec::with_capacity(modes.len());
    let mut file = None;
    for &mode in modes {
        let path = dir.join(format!("baseline-{mode:?}.arrows"));
        let (batches, written_to) = (data.batches.clone(), path.clone());
        let write = blocking(move || write_ipc(&written_to, &batches, mode));
        let (written, timed) = measure_with_cpu(mode.label(), write).await?;
        baselines.push(timed);
        file.get_or_insert(IpcFile {
            path,
            bytes: written.bytes,
        });
    }
    let file = file.ok_or_else(|| BenchError::Usage("no baseline was written".into()))?;
    let mut appends = Vec::with_capacity(APPEND_BUCKETS.len());
    for buckets in APPEND_BUCKETS {
        // The last round's tables stay: the scan figure reads the 1-bucket one.
        let path = match round {
            ROUNDS => log_table(buckets),
            round => TablePath::new("bench", format!("log{buckets}_round{round}")),
        };
        let table = create_table(&running.client, &path, buckets, &data.schema, &[]).await?;
        let parts = split(&data.batches, buckets);
        let append = append_parts(&running.client, &path, parts);
        let ((), timed) = measure_with_cpu(&append_label(buckets), append).await?;
        appends.push(timed);
        if round != ROUNDS {
            running.client.drop_table_instance(&table).await?;
        }
    }
    Ok((AppendRound { baselines, appends }, file))
}

/// A round of [`append_figure`]: per baseline mode and per bucket count, its times.
struct AppendRound {
    baselines: Vec<Timed>,
    appends: Vec<Timed>,
}

pub(crate) fn append_label(buckets: u32) -> String {
    format!(
        "append {buckets} bucket{}",
        if buckets == 1 { "" } else { "s" }
    )
}

/// Figure 2: scan throughput from the log cache and from cold segments, against reading
/// the IPC file. Restarts the node; returns the restarted one.
async fn scan_figure(running: Running, data: &Data, ipc: &IpcFile) -> Result<Running, BenchError> {
    let bucket = BucketId::new(&log_table(1), 0);
    let path = ipc.path.clone();
    let (rows, elapsed) = measure("read the IPC file", blocking(move || read_ipc(&path))).await?;
    check_rows("the IPC file", rows, data.rows)?;
    let baseline = Throughput::new(rows, ipc.bytes, elapsed);
    report("baseline IPC read", baseline, &[]);
    let path = ipc.path.clone();
    let (rows, elapsed) = measure(
        "read the IPC file through a loopback socket",
        blocking(move || read_ipc_through_loopback(&path)),
    )
    .await?;
    check_rows("the IPC file through a socket", rows, data.rows)?;
    let socket = Throughput::new(rows, ipc.bytes, elapsed);
    let ratio = format!("vs IPC read {:.2}", socket.ratio_to(&baseline));
    report("baseline IPC through a socket", socket, &[ratio]);
    let ratios = |figure: &Throughput| {
        [
            format!("vs IPC read {:.2}", figure.ratio_to(&baseline)),
            format!("vs IPC through a socket {:.2}", figure.ratio_to(&socket)),
        ]
    };
    let (rows, elapsed) = measure(
        "scan from the log cache",
        scan_bucket(&running.client, &bucket),
    )
    .await?;
    check_rows("the cached scan", rows, data.rows)?;
    let figure = Throughput::new(rows, ipc.bytes, elapsed);
    report("scan log cache", figure, &ratios(&figure));
    let (running, _) = measure("restart the node", running.restart()).await?;
    let (rows, elapsed) =
        measure("scan cold segments", scan_bucket(&running.client, &bucket)).await?;
    check_rows("the cold scan", rows, data.rows)?;
    let figure = Throughput::new(rows, ipc.bytes, elapsed);
    report("scan cold segments", figure, &ratios(&figure));
    Ok(running)
}

/// Figure 3: latency from a write (its start, its acknowledgement) to a tail reader
/// having the batch.
async fn tail_figure(
    running: &Running,
    schema: &SchemaRef,
    dir: &Path,
    sync: bool,
) -> Result<(), BenchError> {
    let table = create_table(
        &running.client,
        &TablePath::new("bench", "tail"),
        1,
        schema,
        &[],
    )
    .await?;
    let bucket = BucketId::new(&table.path, 0);
    let mut rng = seeded(0x7a11);
    let batches = (0..TAIL_WARMUP + TAIL_BATCHES)
        .map(|i| make_batch(schema, (i * TAIL_ROWS) as i64, TAIL_ROWS, &mut rng))
        .collect::<Result<Vec<_>, _>>()?;
    let end = (batches.len() * TAIL_ROWS) as i64;
    let mut tailer = running.client.tail(&bucket, &[]).await?;
    let (received, mut receipts) = mpsc::unbounded_channel();
    let mut reader = JoinSet::new();
    reader.spawn(async move {
        let mut offset = 0;
        while offset < end {
            let answer = tailer.poll(offset, TAIL_WAIT, 0).await?;
            let now = Instant::now();
            for batch in &answer.batches {
                // The writer stops listening only when it has failed.
                let _ = received.send((batch.metadata.base_offset, now));
            }
            offset = answer.next_offset;
        }
        Ok::<(), BenchError>(())
    });
    eprintln!("bench: tail latency, {TAIL_BATCHES} appends of {TAIL_ROWS} rows");
    let samples =
        match write_and_wait(&running.client, &bucket, batches.clone(), &mut receipts).await {
            Ok(samples) => samples,
            Err(error) => {
                // Report the reader's own failure when that is why the writer gave up.
                reader.abort_all();
                return match reader.join_next().await {
                    Some(Ok(Err(reader_error))) => Err(reader_error),
                    _ => Err(error),
                };
            }
        };
    if let Some(done) = reader.join_next().await {
        done??;
    }
    let (ack_to_tail, write_to_tail): (Vec<f64>, Vec<f64>) =
        samples.into_iter().skip(TAIL_WARMUP).unzip();
    let mode = if sync { Fsync::EachBatch } else { Fsync::Never };
    let path = dir.join("baseline-tail.arrows");
    let written = blocking(move || write_ipc(&path, &batches, mode)).await?;
    let baseline = Latency::new(written.batch_ms.into_iter().skip(TAIL_WARMUP).collect());
    let write_to_tail = Latency::new(write_to_tail);
    let name = if sync { "IPC write+fsync" } else { "IPC write" };
    report(
        &format!("baseline {name}"),
        format!("{baseline}   (one {TAIL_ROWS}-row batch)"),
        &[],
    );
    report("tail ack -> tailer", Latency::new(ack_to_tail), &[]);
    let ratio = format!("vs {name} {}", write_to_tail.ratio_to(&baseline));
    report("tail write -> tailer", write_to_tail, &[ratio]);
    Ok(())
}

/// Appends each batch alone and waits for the tail reader to report it; returns, per
/// batch, (ack -> tailer, write start -> tailer) in milliseconds.
async fn write_and_wait(
    client: &MinkClient,
    bucket: &BucketId,
    batches: Vec<RecordBatch>,
    receipts: &mut mpsc::UnboundedReceiver<(i64, Instant)>,
) -> Result<Vec<(f64, f64)>, BenchError> {
    let mut samples = Vec::with_capacity(batches.len());
    for batch in batches {
        let start = Instant::now();
        let acks = client.append(bucket, vec![batch]).await?;
        let acked = Instant::now();
        let [ack] = acks.as_slice() else {
            return Err(ClientError::Protocol(format!(
                "one batch sent, {} acknowledged",
                acks.len()
            ))
            .into());
        };
        let received = loop {
            match tokio::time::timeout(TAIL_TIMEOUT, receipts.recv()).await {
                Ok(Some((offset, at))) if offset == ack.base_offset => break at,
                Ok(Some(_earlier)) => {}
                Ok(None) => {
                    return Err(
                        ClientError::Protocol("the tail reader stopped early".into()).into(),
                    );
                }
                Err(_elapsed) => {
                    return Err(ClientError::Protocol(format!(
                        "the tail reader did not get offset {} within {TAIL_TIMEOUT:?}",
                        ack.base_offset
                    ))
                    .into());
                }
            }
        };
        samples.push((signed_ms(acked, received), signed_ms(start, received)));
    }
    Ok(samples)
}

/// `bench.log<buckets>`: the table of the append figure with that many buckets.
pub(crate) fn log_table(buckets: u32) -> TablePath {
    TablePath::new("bench", format!("log{buckets}"))
}

/// `to - from` in milliseconds, negative when `to` comes first.
fn signed_ms(from: Instant, to: Instant) -> f64 {
    match to.checked_duration_since(from) {
        Some(after) => after.as_secs_f64() * 1e3,
        None => -(from - to).as_secs_f64() * 1e3,
    }
}
