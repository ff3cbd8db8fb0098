//! The rows the suites write: random, but the same in every run.
//!
//! Every suite but `flight-sql` writes rows of one schema,
//! `id i64, event_time timestamp(µs, UTC), name utf8 (20 chars), price f64, quantity i32`,
//! in batches of [`BATCH_ROWS`]: the ids are given (from 0, or the keys a suite changes),
//! the other columns drawn from a [`StdRng`] seeded with a constant of the suite
//! ([`seeded`]), so two runs of a benchmark write the same bytes. [`Changes`] hands out
//! distinct keys in a random order, the keys a primary-key suite gives new values.
//! [`ipc_len`] is the byte count of every MB/s figure: the rows' size as one Arrow IPC
//! stream.

use std::io;
use std::sync::Arc;

use arrow::array::{
    Float64Array, Int32Array, Int64Array, RecordBatch, StringBuilder, TimestampMicrosecondArray,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use arrow::ipc::writer::StreamWriter;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::error::BenchError;

/// Rows per batch of the throughput figures.
pub(crate) const BATCH_ROWS: usize = 10_000;
/// Length of every `name` value.
const NAME_LEN: usize = 20;

/// The deterministic random numbers of a suite's rows, from `seed`.
pub(crate) fn seeded(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// The seed of [`Data::generate`]'s columns other than the id.
pub(crate) const GENERATED_SEED: u64 = 0x5eed;

/// The rows of the throughput figures.
#[derive(Debug)]
pub(crate) struct Data {
    pub(crate) schema: SchemaRef,
    pub(crate) batches: Vec<RecordBatch>,
    pub(crate) rows: usize,
}

impl Data {
    /// `rows` rows with ids from 0.
    pub(crate) fn generate(rows: usize) -> Result<Self, BenchError> {
        let ids: Vec<i64> = (0..rows as i64).collect();
        Self::with_ids(&ids, GENERATED_SEED)
    }

    /// Rows with these ids, the other columns drawn from `seed`.
    pub(crate) fn with_ids(ids: &[i64], seed: u64) -> Result<Self, BenchError> {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new(
                "event_time",
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                false,
            ),
            Field::new("name", DataType::Utf8, false),
            Field::new("price", DataType::Float64, false),
            Field::new("quantity", DataType::Int32, false),
        ]));
        let mut rng = seeded(seed);
        let batches = ids
            .chunks(BATCH_ROWS)
            .map(|chunk| make_rows(&schema, Int64Array::from(chunk.to_vec()), &mut rng))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            schema,
            batches,
            rows: ids.len(),
        })
    }

    /// Bytes the batches take in memory.
    pub(crate) fn memory_bytes(&self) -> u64 {
        self.batches
            .iter()
            .map(|b| b.get_array_memory_size() as u64)
            .sum()
    }
}

/// `rows` rows with ids from `first_id`.
pub(crate) fn make_batch(
    schema: &SchemaRef,
    first_id: i64,
    rows: usize,
    rng: &mut StdRng,
) -> Result<RecordBatch, BenchError> {
    let ids = Int64Array::from_iter_values(first_id..first_id + rows as i64);
    make_rows(schema, ids, rng)
}

/// Rows with these ids, the other columns drawn from `rng`.
fn make_rows(
    schema: &SchemaRef,
    ids: Int64Array,
    rng: &mut StdRng,
) -> Result<RecordBatch, BenchError> {
    /// 2025-01-01T00:00:00Z.
    const START_US: i64 = 1_735_689_600_000_000;
    let rows = ids.len();
    let times = TimestampMicrosecondArray::from_iter_values(
        ids.values()
            .iter()
            .map(|id| START_US + id * 1_000 + rng.random_range(0..1_000)),
    )
    .with_timezone("UTC");
    let mut names = StringBuilder::with_capacity(rows, rows * NAME_LEN);
    let mut name = String::with_capacity(NAME_LEN);
    for _ in 0..rows {
        name.clear();
        name.push_str("user_");
        while name.len() < NAME_LEN {
            name.push(char::from(rng.random_range(b'a'..=b'z')));
        }
        names.append_value(&name);
    }
    let prices = Float64Array::from_iter_values(
        (0..rows).map(|_| f64::from(rng.random_range(0..1_000_000u32)) / 100.0),
    );
    let quantities = Int32Array::from_iter_values((0..rows).map(|_| rng.random_range(0..1_000)));
    Ok(RecordBatch::try_new(
        Arc::clone(schema),
        vec![
            Arc::new(ids),
            Arc::new(times),
            Arc::new(names.finish()),
            Arc::new(prices),
            Arc::new(quantities),
        ],
    )?)
}

/// Distinct keys in a random order, handed out a share at a time.
#[derive(Debug)]
pub(crate) struct Changes {
    keys: Vec<i64>,
    next: usize,
    rng: StdRng,
}

impl Changes {
    pub(crate) fn new(keys: usize) -> Self {
        let mut rng = seeded(0xc4a9);
        let mut ids: Vec<i64> = (0..keys as i64).collect();
        ids.shuffle(&mut rng);
        Self {
            keys: ids,
            next: 0,
            rng,
        }
    }

    /// New values for the next `count` keys.
    pub(crate) fn next(&mut self, count: usize) -> Result<Data, BenchError> {
        let ids = &self.keys[self.next..self.next + count];
        self.next += count;
        Data::with_ids(ids, self.rng.random())
    }
}

/// Size of `batches` as one Arrow IPC stream, the byte count of the MB/s figures.
pub(crate) fn ipc_len<'a>(
    batches: impl IntoIterator<Item = &'a RecordBatch>,
) -> Result<u64, BenchError> {
    let mut batches = batches.into_iter().peekable();
    let Some(first) = batches.peek() else {
        return Ok(0);
    };
    let mut writer = StreamWriter::try_new(ByteCount(0), &first.schema())?;
    for batch in batches {
        writer.write(batch)?;
    }
    writer.finish()?;
    Ok(writer.get_ref().0)
}

/// A writer that only counts the bytes written to it.
#[derive(Debug)]
struct ByteCount(u64);

impl io::Write for ByteCount {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_rows() {
        let ids: Vec<i64> = (0..100).collect();
        let (a, b) = (
            Data::with_ids(&ids, 7).unwrap(),
            Data::with_ids(&ids, 7).unwrap(),
        );
        assert_eq!(a.batches, b.batches);
        let c = Data::with_ids(&ids, 8).unwrap();
        assert_ne!(a.batches, c.batches);
    }

    #[test]
    fn changes_are_distinct_keys() {
        let mut changes = Changes::new(1_000);
        let mut seen: Vec<i64> = (0..4)
            .flat_map(|_| {
                let data = changes.next(250).unwrap();
                let ids = data.batches[0].column(0).as_any();
                ids.downcast_ref::<Int64Array>().unwrap().values().to_vec()
            })
            .collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..1_000).collect::<Vec<_>>());
    }
}
