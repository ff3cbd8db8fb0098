//! The lake scan's fetched bytes, counted in the query's memory pool.
//!
//! A partition of a Parquet scan fetches the column chunks of a whole row group (one
//! `get_byte_ranges` call), decodes them, then fetches the next row group's: what it
//! holds between fetches is about one row group's projected chunks, tens of megabytes
//! for wide rows. DataFusion's scan does not count these bytes, and a lake scan runs
//! several partitions per core, so a union read could hold hundreds of megabytes that
//! `--sql-memory-limit` never sees. [`ReservedReaderFactory`] wraps a reader factory so
//! that each reader keeps a reservation the size of its last fetch: it grows (or fails
//! the query with `ResourcesExhausted`) before the bytes are fetched, shrinks to the
//! next fetch, and is released when the scan is done with the file. Footers are not
//! counted here: they live in the runtime's file-metadata cache, which has its own limit.
//!
//! DataFusion hands a reader factory no task context, so the pool is the one of the
//! context the plan was built (or decoded) in, which is the one it runs in.
//!
//! The factory also holds the leases of the snapshots the scan reads
//! ([`mink_lake::upkeep::leases`]): the plan and every stream of it hold the factory, so
//! the leases last exactly as long as something may still open one of the files.

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use datafusion_common::Result;
use datafusion_datasource::PartitionedFile;
use datafusion_datasource_parquet::ParquetFileReaderFactory;
use datafusion_execution::memory_pool::{MemoryConsumer, MemoryPool, MemoryReservation};
use datafusion_physical_plan::metrics::ExecutionPlanMetricsSet;
use futures::future::{BoxFuture, FutureExt as _};
use mink_lake::upkeep::leases::Lease;
use parquet::arrow::arrow_reader::ArrowReaderOptions;
use parquet::arrow::async_reader::AsyncFileReader;
use parquet::errors::ParquetError;
use parquet::file::metadata::ParquetMetaData;

/// Readers whose fetches are reserved in `pool`, of files `leases` keep (see the module
/// docs).
#[derive(Debug)]
pub struct ReservedReaderFactory {
    inner: Arc<dyn ParquetFileReaderFactory>,
    pool: Arc<dyn MemoryPool>,
    _leases: Vec<Lease>,
}

impl ReservedReaderFactory {
    pub fn new(
        inner: Arc<dyn ParquetFileReaderFactory>,
        pool: Arc<dyn MemoryPool>,
        leases: Vec<Lease>,
    ) -> Self {
        Self {
            inner,
            pool,
            _leases: leases,
        }
    }
}

impl ParquetFileReaderFactory for ReservedReaderFactory {
    fn create_reader(
        &self,
        partition_index: usize,
        partitioned_file: PartitionedFile,
        metadata_size_hint: Option<usize>,
        metrics: &ExecutionPlanMetricsSet,
    ) -> Result<Box<dyn AsyncFileReader + Send>> {
        let inner = self.inner.create_reader(
            partition_index,
            partitioned_file,
            metadata_size_hint,
            metrics,
        )?;
        let reservation =
            MemoryConsumer::new(format!("LakeScan[{partition_index}] fetched row groups"))
                .register(&self.pool);
        Ok(Box::new(ReservedReader { inner, reservation }))
    }
}

/// A reader whose reservation is the size of its last fetch.
struct ReservedReader {
    inner: Box<dyn AsyncFileReader + Send>,
    reservation: MemoryReservation,
}

impl ReservedReader {
    /// Resizes the reservation to `ranges`' bytes, before they are fetched.
    fn reserve(&mut self, ranges: &[Range<u64>]) -> parquet::errors::Result<()> {
        let bytes: u64 = ranges.iter().map(|range| range.end - range.start).sum();
        let bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
        self.reservation
            .try_resize(bytes)
            .map_err(|error| ParquetError::External(Box::new(error)))
    }
}

impl AsyncFileReader for ReservedReader {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        match self.reserve(std::slice::from_ref(&range)) {
            Ok(()) => self.inner.get_bytes(range),
            Err(error) => futures::future::ready(Err(error)).boxed(),
        }
    }

    fn get_byte_ranges(
        &mut self,
        ranges: Vec<Range<u64>>,
    ) -> BoxFuture<'_, parquet::errors::Result<Vec<Bytes>>> {
        match self.reserve(&ranges) {
            Ok(()) => self.inner.get_byte_ranges(ranges),
            Err(error) => futures::future::ready(Err(error)).boxed(),
        }
    }

    fn get_metadata<'a>(
        &'a mut self,
        options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        self.inner.get_metadata(options)
    }
}

#[cfg(test)]
mod tests {
    use datafusion_execution::memory_pool::GreedyMemoryPool;

    use super::*;

    /// Answers every range with zeroes of its length.
    struct Zeroes;

    impl AsyncFileReader for Zeroes {
        fn get_bytes(
            &mut self,
            range: Range<u64>,
        ) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
            let bytes = Bytes::from(vec![0; (range.end - range.start) as usize]);
            futures::future::ready(Ok(bytes)).boxed()
        }

        fn get_metadata<'a>(
            &'a mut self,
            _options: Option<&'a ArrowReaderOptions>,
        ) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
            let error = ParquetError::General("no metadata".into());
            futures::future::ready(Err(error)).boxed()
        }
    }

    #[tokio::test]
    async fn a_reader_holds_its_last_fetch_and_fails_a_fetch_over_the_pool() {
        let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(1000));
        let mut reader = ReservedReader {
            inner: Box::new(Zeroes),
            reservation: MemoryConsumer::new("test").register(&pool),
        };
        let fetched = reader
            .get_byte_ranges(vec![0..300, 500..700])
            .await
            .unwrap();
        assert_eq!(fetched.iter().map(Bytes::len).sum::<usize>(), 500);
        assert_eq!(pool.reserved(), 500);
        reader.get_bytes(0..100).await.unwrap();
        assert_eq!(pool.reserved(), 100, "the next fetch replaces the last");

        let error = reader
            .get_byte_ranges(vec![0..1000, 1000..2000])
            .await
            .unwrap_err();
        assert!(error.to_string().contains("Resources exhausted"), "{error}");
        drop(reader);
        assert_eq!(pool.reserved(), 0, "released with the reader");
    }
}
