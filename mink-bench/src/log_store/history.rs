//! Figure 5 of `mink-bench log-store`: the catch-up read of a bucket's history from cold
//! segments, and the open that rebuilds them from the store, against a node with a local
//! log (see the suite's documentation).

use std::path::Path;
use std::time::{Duration, Instant};

use mink_core::protocol::BucketId;
use mink_core::table::TablePath;

use super::{LogNode, NodeSetup, files_under, wal_objects, write_back};
use crate::data::{Data, ipc_len};
use crate::error::BenchError;
use crate::harness::{
    NodeArgs, ROUNDS, Running, Scratch, Throughput, append_parts, blocking, check_rows,
    create_table, measure, median, megabytes, ratio_of_rounds, report, scan_bucket, split,
};

/// The log cache of the history nodes, per bucket: the read is from segments either way.
const CACHE_BYTES: u64 = 64 << 20;
/// The longest wait for the history's sealed segments to be uploaded.
const UPLOAD_TIMEOUT: Duration = Duration::from_secs(300);

/// One round's times: `[open, read]` of the local node, and `[open with log/ deleted,
/// read, open with log/ intact]` of the store node.
#[derive(Debug)]
struct Round {
    local: [Duration; 2],
    store: [Duration; 3],
}

/// Prints figure 5 with `rows` rows of history, nodes as `args` say, in `scratch`.
pub(super) async fn figure(
    args: &NodeArgs,
    scratch: &Scratch,
    rows: usize,
) -> Result<(), BenchError> {
    let local = NodeSetup::new(args, scratch, "history-local", None, CACHE_BYTES)?;
    let default = Some(mink_log::default_interval("file:///"));
    let store = NodeSetup::new(args, scratch, "history-store", default, CACHE_BYTES)?;
    let bytes = write_history(&[&local, &store], rows).await?;
    let held = match &store.store {
        Some(dir) => held(dir).await?,
        None => String::new(),
    };
    let (mut cold, mut rounds) = (true, Vec::with_capacity(ROUNDS));
    for _ in 0..ROUNDS {
        let (round, dropped) = round(&local, &store, rows).await?;
        cold &= dropped;
        rounds.push(round);
    }
    let cache = match cold {
        true => "the page cache dropped before each step",
        false => "the page cache NOT dropped (writing /proc/sys/vm/drop_caches failed: not root?)",
    };
    println!(
        "History: {rows} rows ({} MB) in 1 bucket, {ROUNDS} rounds, {cache}; the store holds {held}:",
        bytes / 1_000_000
    );
    let reads: Vec<(Duration, Duration)> = (rounds.iter())
        .map(|round| (round.local[1], round.store[1]))
        .collect();
    let read = |times: Vec<Duration>| Throughput::new(rows, bytes, median(times));
    report(
        "  catch-up read, local",
        read(reads.iter().map(|r| r.0).collect()),
        &[],
    );
    let label = format!("  catch-up read, {}", store.label);
    let ratio = ratio_of_rounds("local", &reads);
    report(&label, read(reads.iter().map(|r| r.1).collect()), &[ratio]);
    let seconds = |time: Duration| format!("{:>9.3} s", time.as_secs_f64());
    let local_open = median(rounds.iter().map(|round| round.local[0]).collect());
    report("  open, local, log/ intact", seconds(local_open), &[]);
    for (label, index) in [("deleted", 0), ("intact", 2)] {
        let open = median(rounds.iter().map(|round| round.store[index]).collect());
        // A time's ratio: the store's over the local log's.
        let opens: Vec<(Duration, Duration)> = (rounds.iter())
            .map(|round| (round.store[index], round.local[0]))
            .collect();
        report(
            &format!("  open, store, log/ {label}"),
            seconds(open),
            &[ratio_of_rounds("local", &opens)],
        );
    }
    Ok(())
}

/// What the store at `dir` holds: its stream objects and WAL objects, and their sizes.
async fn held(dir: &Path) -> Result<String, BenchError> {
    let streams = files_under(dir.join("streams")).await?;
    let stream_bytes: u64 = streams.iter().map(|file| file.1).sum();
    let wal = wal_objects(dir).await?;
    let wal_bytes: u64 = wal.iter().map(|object| object.1).sum();
    Ok(format!(
        "{} stream objects ({}) and {} WAL objects ({})",
        streams.len(),
        megabytes(stream_bytes),
        wal.len(),
        megabytes(wal_bytes)
    ))
}

/// Opens each node of `setups` on a fresh directory, appends `rows` rows to a table of one
/// bucket and stops it; the rows' bytes as an IPC stream.
async fn write_history(setups: &[&NodeSetup], rows: usize) -> Result<u64, BenchError> {
    eprintln!("bench: generating {rows} rows of history");
    let data = Data::generate(rows)?;
    for setup in setups {
        let node = LogNode::open((*setup).clone()).await?;
        let client = &node.running.client;
        create_table(client, &history_table(), 1, &data.schema, &[]).await?;
        let what = format!("append the history, {}", node.label);
        let parts = split(&data.batches, 1);
        measure(&what, append_parts(client, &history_table(), parts)).await?;
        if let Some(store) = &node.store {
            let data_dir = &node.running.config().data_dir;
            let what = "the sealed segments uploaded as stream objects";
            measure(what, await_stream_objects(data_dir, store)).await?;
        }
        node.running.stop().await?;
    }
    ipc_len(&data.batches)
}

/// One round of figure 5; whether the page cache was dropped before each step.
async fn round(
    local: &NodeSetup,
    store: &NodeSetup,
    rows: usize,
) -> Result<(Round, bool), BenchError> {
    let mut cold = drop_page_cache().await?;
    let (local_open, local_read) =
        open_and_read(local, "local, log/ intact", rows, &mut cold).await?;
    let log = store.config.data_dir.join("log");
    blocking(move || {
        std::fs::remove_dir_all(&log).map_err(BenchError::io(format!("removing {}", log.display())))
    })
    .await?;
    cold &= drop_page_cache().await?;
    let (rebuild, store_read) =
        open_and_read(store, "store, log/ deleted", rows, &mut cold).await?;
    cold &= drop_page_cache().await?;
    let what = "open, store, log/ intact";
    let (running, reopen) = measure(what, Running::start(store.config.clone())).await?;
    running.stop().await?;
    let round = Round {
        local: [local_open, local_read],
        store: [rebuild, store_read, reopen],
    };
    Ok((round, cold))
}

/// Opens the node of `setup` (`how`: its state), drops the page cache, reads its history
/// and stops it: how long the open and the read took.
async fn open_and_read(
    setup: &NodeSetup,
    how: &str,
    rows: usize,
    cold: &mut bool,
) -> Result<(Duration, Duration), BenchError> {
    let (running, open) = measure(
        &format!("open, {how}"),
        Running::start(setup.config.clone()),
    )
    .await?;
    *cold &= drop_page_cache().await?;
    let bucket = BucketId::new(&history_table(), 0);
    let what = format!("catch-up read from cold segments, {}", setup.label);
    let (read_rows, read) = measure(&what, scan_bucket(&running.client, &bucket)).await?;
    check_rows(&what, read_rows, rows)?;
    running.stop().await?;
    Ok((open, read))
}

/// Waits until the store at `store` holds every segment the node of `data_dir` sealed as a
/// stream object: until the furthest one ends at the base of the newest local segment
/// (the node's one table has one bucket).
async fn await_stream_objects(data_dir: &Path, store: &Path) -> Result<(), BenchError> {
    let deadline = Instant::now() + UPLOAD_TIMEOUT;
    loop {
        let segments = files_under(data_dir.join("log")).await?;
        let active = (segments.iter())
            .filter(|(path, _)| path.extension().is_some_and(|e| e == "log"))
            .filter_map(|(path, _)| path.file_stem()?.to_str()?.parse::<i64>().ok())
            .max()
            .unwrap_or(0);
        let objects = files_under(store.join("streams")).await?;
        let uploaded = (objects.iter())
            .filter_map(|(path, _)| stream_end(path))
            .max()
            .unwrap_or(0);
        if uploaded >= active {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(BenchError::Mismatch(format!(
                "the stream objects in {} reach offset {uploaded}, not the newest segment's \
                 base {active}, after {UPLOAD_TIMEOUT:?}",
                store.display()
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The end offset a stream object's name (`<base>-<end>`) says it holds.
fn stream_end(path: &Path) -> Option<i64> {
    path.file_name()?.to_str()?.split_once('-')?.1.parse().ok()
}

/// `bench.history`, the table of figure 5.
fn history_table() -> TablePath {
    TablePath::new("bench", "history")
}

/// Writes every dirty page back and drops the page cache; `false` when it could not be
/// dropped (only root may).
async fn drop_page_cache() -> Result<bool, BenchError> {
    write_back().await?;
    blocking(|| Ok(std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok())).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_objects_name_holds_its_end() {
        let name = "store/streams/t1/b0/00000000000000000000-00000000000000001234";
        assert_eq!(stream_end(Path::new(name)), Some(1234));
        assert_eq!(stream_end(Path::new("store/streams/t1/b0/notes")), None);
    }
}
