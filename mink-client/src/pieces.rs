//! A batch too big for one gRPC message goes to the node in pieces, each acknowledged
//! on its own; the caller gets one acknowledgement per batch it wrote, the pieces' put
//! back together.
//!
//! Arrow Flight's encoder can cut batches itself, but it sizes a slice of a batch by the
//! whole buffers it points into (a slice of a large batch is cut into as many pieces as
//! the large batch), and it does not say into how many: the client cuts, by the bytes
//! the rows hold, and counts.

use arrow::array::{Array, RecordBatch};
use mink_core::protocol::AppendAck;

use crate::error::{ClientError, Result};

/// `batch` in runs of rows of at most about `max_bytes` each (at least one row each, so
/// a single row larger than that is one piece); the batch itself when it fits.
///
/// # Errors
/// A column whose size Arrow cannot compute (malformed offsets).
pub(crate) fn pieces(batch: RecordBatch, max_bytes: usize) -> Result<Vec<RecordBatch>> {
    let mut bytes = 0;
    for column in batch.columns() {
        bytes += column.to_data().get_slice_memory_size()?;
    }
    if bytes <= max_bytes || batch.num_rows() <= 1 {
        return Ok(vec![batch]);
    }
    let count = bytes.div_ceil(max_bytes.max(1));
    let rows = batch.num_rows().div_ceil(count);
    Ok((0..batch.num_rows())
        .step_by(rows)
        .map(|start| batch.slice(start, rows.min(batch.num_rows() - start)))
        .collect())
}

/// The acknowledgement of a batch sent as pieces acknowledged by `acks` (in order): from
/// the first row of the first piece that wrote anything to the last row of the last
/// (rows other writers appended in between fall in that range); an empty range when no
/// piece wrote anything. A duplicate when every piece was (an idempotent writer's retry),
/// its offsets those of the pieces whose earlier write the node named.
///
/// # Errors
/// No acknowledgement.
pub(crate) fn joined(acks: &[AppendAck]) -> Result<AppendAck> {
    let last = acks
        .last()
        .ok_or_else(|| ClientError::Protocol("a batch of no acknowledged piece".into()))?;
    let mut written =
        (acks.iter()).filter(|ack| ack.base_offset >= 0 && ack.last_offset >= ack.base_offset);
    let Some(first) = written.next() else {
        return Ok(last.clone());
    };
    let last_written = written.next_back().unwrap_or(first);
    Ok(AppendAck {
        base_offset: first.base_offset,
        last_offset: last_written.last_offset,
        high_watermark: last.high_watermark,
        duplicate: acks.iter().all(|ack| ack.duplicate),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, Int64Array, StringArray};

    use super::*;

    fn batch(rows: i64) -> RecordBatch {
        let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(0..rows));
        let names: ArrayRef = Arc::new(StringArray::from_iter_values(
            (0..rows).map(|i| format!("name-{i:08}")),
        ));
        RecordBatch::try_from_iter([("id", ids), ("name", names)]).unwrap()
    }

    #[test]
    fn a_slice_of_a_big_batch_is_sized_by_its_own_rows() {
        let big = batch(100_000);
        let slice = big.slice(500, 1000);
        // 1000 rows of ~8 + 4 + 13 bytes: one piece, though its buffers hold 100000 rows.
        assert_eq!(pieces(slice, 64 << 10).unwrap().len(), 1);
        let cut = pieces(big.clone(), 64 << 10).unwrap();
        assert!(cut.len() > 30, "{} pieces", cut.len());
        let rows: usize = cut.iter().map(RecordBatch::num_rows).sum();
        assert_eq!(rows, big.num_rows());
        assert_eq!(
            cut[0].column(0).as_ref(),
            big.slice(0, cut[0].num_rows()).column(0).as_ref()
        );
    }

    #[test]
    fn one_row_bigger_than_the_limit_is_one_piece() {
        assert_eq!(pieces(batch(1), 1).unwrap().len(), 1);
        assert_eq!(pieces(batch(3), 1).unwrap().len(), 3);
    }

    #[test]
    fn pieces_acknowledgements_join_into_the_batch_s() {
        let ack = |base, last, high_watermark| AppendAck {
            base_offset: base,
            last_offset: last,
            high_watermark,
            duplicate: false,
        };
        let joined_ack = joined(&[ack(10, 19, 20), ack(25, 34, 35)]).unwrap();
        assert_eq!(joined_ack, ack(10, 34, 35));
        // Deletes of keys that did not exist write nothing.
        assert_eq!(joined(&[ack(7, 6, 7), ack(7, 6, 7)]).unwrap(), ack(7, 6, 7));
        assert_eq!(joined(&[ack(7, 6, 7), ack(7, 8, 9)]).unwrap(), ack(7, 8, 9));
        assert!(joined(&[]).is_err());
        // A retried batch: pieces written before, one whose offsets the node forgot.
        let duplicate = |base, last| AppendAck {
            duplicate: true,
            ..ack(base, last, 40)
        };
        let retried = joined(&[duplicate(10, 19), duplicate(-1, -1)]).unwrap();
        assert_eq!(retried, duplicate(10, 19));
        assert!(
            !joined(&[duplicate(10, 19), ack(20, 29, 30)])
                .unwrap()
                .duplicate
        );
    }
}
