//! Figures 3 and 4 of `mink-bench log-store`: append throughput, and reads from the log
//! cache by Scan and by Tail, of the store node at the default interval against the local
//! node (see the suite's documentation).

use std::time::Duration;

use mink_client::MinkClient;
use mink_core::protocol::BucketId;
use mink_core::table::TablePath;

use super::{LogNode, write_back};
use crate::data::{Data, ipc_len};
use crate::error::BenchError;
use crate::harness::{
    ROUNDS, Throughput, Timed, append_parts, check_logged, check_rows, create_table, measure,
    measure_with_cpu, median, ratio_of_rounds, report, report_cpu_per_row, report_rounds,
    scan_bucket, split,
};
use crate::log::{APPEND_BUCKETS, append_label, log_table};

/// `max_wait` of each Tail poll (the rows are all there: no poll waits).
const TAIL_WAIT: Duration = Duration::from_secs(1);

/// Prints figure 3: `data` appended to 1 and to 8 buckets of `local` and of `store`, in
/// [`ROUNDS`] rounds. The last round's 1-bucket tables stay, as `bench.log1`.
pub(super) async fn append_figure(
    local: &LogNode,
    store: &LogNode,
    data: &Data,
) -> Result<(), BenchError> {
    let bytes = ipc_len(&data.batches)?;
    let mut rounds: Vec<Vec<(Timed, Timed)>> = APPEND_BUCKETS.iter().map(|_| vec![]).collect();
    for round in 1..=ROUNDS {
        for (&buckets, of_buckets) in APPEND_BUCKETS.iter().zip(&mut rounds) {
            let baseline = append(local, data, buckets, round).await?;
            of_buckets.push((baseline, append(store, data, buckets, round).await?));
        }
    }
    println!("Append throughput, {ROUNDS} rounds:");
    for (&buckets, of_buckets) in APPEND_BUCKETS.iter().zip(&rounds) {
        let label = append_label(buckets);
        let of = |time: fn(&Timed) -> Duration| -> Vec<(Duration, Duration)> {
            (of_buckets.iter())
                .map(|(baseline, figure)| (time(baseline), time(figure)))
                .collect()
        };
        let labels = [
            format!("  {label}, local"),
            format!("  {label}, {}", store.label),
        ];
        report_rounds(
            [&labels[0], &labels[1]],
            "local",
            (data.rows, bytes),
            &of(|t| t.elapsed),
        );
        report_cpu_per_row(
            &format!("{}, CPU", labels[1]),
            "local",
            data.rows,
            &of(|t| t.cpu),
        );
    }
    Ok(())
}

/// Appends `data` to a fresh table of `buckets` buckets of `node`, dropped after but in
/// the last round.
async fn append(
    node: &LogNode,
    data: &Data,
    buckets: u32,
    round: usize,
) -> Result<Timed, BenchError> {
    let client = &node.running.client;
    let path = match round {
        ROUNDS => log_table(buckets),
        round => TablePath::new("bench", format!("log{buckets}_round{round}")),
    };
    let table = create_table(client, &path, buckets, &data.schema, &[]).await?;
    let parts = split(&data.batches, buckets);
    write_back().await?;
    let what = format!("{}, {}", append_label(buckets), node.label);
    let ((), timed) = measure_with_cpu(&what, append_parts(client, &path, parts)).await?;
    check_logged(client, &table, data.rows).await?;
    if round != ROUNDS {
        client.drop_table_instance(&table).await?;
    }
    Ok(timed)
}

/// Prints figure 4: the 1-bucket table of [`append_figure`] read from the log cache by
/// Scan and by Tail on `local` and on `store`, against the local node's Scan.
pub(super) async fn tail_figure(
    local: &LogNode,
    store: &LogNode,
    data: &Data,
) -> Result<(), BenchError> {
    let bucket = BucketId::new(&log_table(1), 0);
    let bytes = ipc_len(&data.batches)?;
    let reads = [
        (local, Read::Scan),
        (store, Read::Scan),
        (local, Read::Tail),
        (store, Read::Tail),
    ];
    let mut times: Vec<Vec<Duration>> = reads.iter().map(|_| vec![]).collect();
    for _ in 0..ROUNDS {
        for ((node, read), of_read) in reads.iter().zip(&mut times) {
            let what = format!("{read:?} from the log cache, {}", node.label);
            let client = &node.running.client;
            let (rows, elapsed) = match read {
                Read::Scan => measure(&what, scan_bucket(client, &bucket)).await?,
                Read::Tail => measure(&what, tail_bucket(client, &bucket, data.rows)).await?,
            };
            check_rows(&what, rows, data.rows)?;
            of_read.push(elapsed);
        }
    }
    println!("Reads of 1 bucket from the log cache, {ROUNDS} rounds:");
    let Some(baseline) = times.first() else {
        return Ok(());
    };
    for (index, ((node, read), of_read)) in reads.iter().zip(&times).enumerate() {
        let figure = Throughput::new(data.rows, bytes, median(of_read.clone()));
        let label = format!("  {read:?}, {}", node.label);
        if index == 0 {
            report(&label, figure, &[]);
            continue;
        }
        let rounds: Vec<_> = (baseline.iter().copied())
            .zip(of_read.iter().copied())
            .collect();
        report(&label, figure, &[ratio_of_rounds("local Scan", &rounds)]);
    }
    Ok(())
}

/// How a figure 4 reads a bucket.
#[derive(Debug, Clone, Copy)]
enum Read {
    Scan,
    Tail,
}

/// Reads a bucket from offset 0 to `rows` by the polls of one Tail session; the rows read.
async fn tail_bucket(
    client: &MinkClient,
    bucket: &BucketId,
    rows: usize,
) -> Result<usize, BenchError> {
    let mut tailer = client.tail(bucket, &[]).await?;
    let (mut offset, mut read) = (0, 0);
    while offset < rows as i64 {
        let answer = tailer.poll(offset, TAIL_WAIT, 0).await?;
        if answer.num_rows() == 0 {
            return Err(BenchError::Mismatch(format!(
                "the Tail of {bucket:?} answered nothing at offset {offset} of {rows}"
            )));
        }
        read += answer.num_rows();
        offset = answer.next_offset;
    }
    Ok(read)
}
