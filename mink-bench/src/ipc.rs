//! The baseline files of the suites that compare the log and its reads with Arrow IPC: an
//! IPC stream written (with the fsyncs a log does, or none), read from the file, and read
//! as it arrives through a loopback socket.

use std::fs::File;
use std::io::BufWriter;
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::time::Instant;

use arrow::array::RecordBatch;
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::StreamWriter;

use crate::error::BenchError;
use crate::harness::create_file_for;

/// When the baseline IPC writer calls `sync_data`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fsync {
    EachBatch,
    AtEnd,
    Never,
}

impl Fsync {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::EachBatch => "IPC+fsync-per-batch",
            Self::AtEnd => "IPC+one-fsync",
            Self::Never => "IPC no fsync",
        }
    }
}

/// What [`write_ipc`] did.
#[derive(Debug)]
pub(crate) struct IpcWritten {
    pub(crate) bytes: u64,
    /// Time of each batch (written, flushed and, per [`Fsync::EachBatch`], synced), in ms.
    pub(crate) batch_ms: Vec<f64>,
}

/// Writes `batches` as one Arrow IPC stream to `path`.
pub(crate) fn write_ipc(
    path: &Path,
    batches: &[RecordBatch],
    fsync: Fsync,
) -> Result<IpcWritten, BenchError> {
    let context = || format!("writing {}", path.display());
    let (schema, file) = create_file_for(path, batches)?;
    let mut writer = StreamWriter::try_new(BufWriter::new(file), &schema)?;
    let mut batch_ms = Vec::with_capacity(batches.len());
    for batch in batches {
        let start = Instant::now();
        writer.write(batch)?;
        if fsync == Fsync::EachBatch {
            writer.flush()?;
            writer
                .get_ref()
                .get_ref()
                .sync_data()
                .map_err(BenchError::io(context()))?;
        }
        batch_ms.push(start.elapsed().as_secs_f64() * 1e3);
    }
    writer.finish()?;
    writer.flush()?;
    let file = writer.get_ref().get_ref();
    if fsync != Fsync::Never {
        file.sync_data().map_err(BenchError::io(context()))?;
    }
    let bytes = file.metadata().map_err(BenchError::io(context()))?.len();
    Ok(IpcWritten { bytes, batch_ms })
}

/// Reads an Arrow IPC stream file; returns its rows.
pub(crate) fn read_ipc(path: &Path) -> Result<usize, BenchError> {
    let file = File::open(path).map_err(BenchError::io(format!("reading {}", path.display())))?;
    let mut rows = 0;
    for batch in StreamReader::try_new_buffered(file, None)? {
        rows += batch?.num_rows();
    }
    Ok(rows)
}

/// Reads the IPC file as it arrives through a loopback TCP connection, which a thread
/// feeds from the file as fast as the socket takes it; returns the rows. What any
/// protocol over a socket could reach on this machine: the bytes cross the kernel twice,
/// with no framing, no requests and no copies of its own.
pub(crate) fn read_ipc_through_loopback(path: &Path) -> Result<usize, BenchError> {
    let context = || format!("serving {} on a loopback socket", path.display());
    let listener = TcpListener::bind("127.0.0.1:0").map_err(BenchError::io(context()))?;
    let address = listener.local_addr().map_err(BenchError::io(context()))?;
    let served = path.to_path_buf();
    let server = std::thread::spawn(move || -> std::io::Result<u64> {
        let (mut socket, _) = listener.accept()?;
        std::io::copy(&mut File::open(served)?, &mut socket)
    });
    let socket = TcpStream::connect(address).map_err(BenchError::io(context()))?;
    let mut rows = 0;
    for batch in StreamReader::try_new_buffered(socket, None)? {
        rows += batch?.num_rows();
    }
    server
        .join()
        .map_err(|_| BenchError::Usage("the loopback server panicked".into()))?
        .map_err(BenchError::io(context()))?;
    Ok(rows)
}
