//! The bounds the node protocol itself sets, shared by every port that speaks gRPC or
//! answers a log read: the node port, the Flight SQL port and the Kafka listener. The
//! node's own bounds (lookups, table definitions, open buckets) and the table of all of
//! them are in `mink_node::flight::limits`.
//!
//! A Scan or Tail answers at most [`MAX_ANSWER_BYTES`] and waits at most
//! [`MAX_TAIL_WAIT`]: larger requests are clamped, as the read protocol lets a server
//! answer less than asked (the client continues from the answer's next offset).

use std::time::Duration;

/// Bytes a Scan or Tail answers when the request says 0.
pub const DEFAULT_MAX_BYTES: u64 = 8 << 20;
/// The most log bytes one Scan or Tail answer holds (the batch at the requested offset is
/// always sent whole, so an answer can exceed this by one batch). Larger `max_bytes` are
/// clamped: the client continues from the answer's next offset.
pub const MAX_ANSWER_BYTES: u64 = 32 << 20;
/// The longest wait a Tail may ask for; longer ones are clamped (the answer after the
/// wait may be empty, a normal result).
pub const MAX_TAIL_WAIT: Duration = Duration::from_secs(60);
/// Largest gRPC message accepted or sent (one Arrow batch, one ticket, one action).
pub const MAX_MESSAGE_BYTES: usize = 256 << 20;
/// HTTP/2 streams (calls) one client connection may have open at once. The server
/// announces it in its SETTINGS; a client's further calls wait for a stream to end.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 256;
/// Calls of one connection the service works on at once; further ones queue.
pub const MAX_REQUESTS_PER_CONNECTION: usize = 256;
/// The largest header list (metadata) of one call.
pub const MAX_HEADER_LIST_BYTES: u32 = 64 << 10;
/// The largest HTTP/2 frame a server takes (its `SETTINGS_MAX_FRAME_SIZE`; HTTP/2's
/// default is 16 KiB): a client sends a DoPut batch of half a MiB in one frame rather than
/// thirty-two, which took a fifth of the CPU per row off a 1-bucket append and made it
/// 1.2x as fast (docs/benchmarks.md). What a client may have in flight is still bounded
/// by the receive windows (1 MiB per stream and per connection), not by this.
pub const MAX_FRAME_BYTES: u32 = 1 << 20;

// A default never exceeds its limit.
const _: () = assert!(DEFAULT_MAX_BYTES <= MAX_ANSWER_BYTES);

/// The bytes a Scan or Tail answers for a requested `max_bytes`: 0 means
/// [`DEFAULT_MAX_BYTES`], anything above [`MAX_ANSWER_BYTES`] is clamped to it.
pub fn answer_bytes(requested: u64) -> u64 {
    match requested {
        0 => DEFAULT_MAX_BYTES,
        n => n.min(MAX_ANSWER_BYTES),
    }
}

/// A Tail's wait, clamped to [`MAX_TAIL_WAIT`].
pub fn tail_wait(requested_ms: u64) -> Duration {
    Duration::from_millis(requested_ms).min(MAX_TAIL_WAIT)
}

/// A Tail's `min_bytes`, clamped to the bytes its answer may hold: waiting for more than
/// can be sent would only hold the poll until its deadline.
pub fn min_bytes(requested: u64, answer_bytes: u64) -> u64 {
    requested.min(answer_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_bytes_zero_is_the_default_and_large_ones_are_clamped() {
        assert_eq!(answer_bytes(0), DEFAULT_MAX_BYTES);
        assert_eq!(answer_bytes(1), 1);
        assert_eq!(answer_bytes(MAX_ANSWER_BYTES), MAX_ANSWER_BYTES);
        assert_eq!(answer_bytes(MAX_ANSWER_BYTES + 1), MAX_ANSWER_BYTES);
        assert_eq!(answer_bytes(u64::MAX), MAX_ANSWER_BYTES);
    }

    #[test]
    fn tail_waits_and_min_bytes_are_clamped() {
        assert_eq!(tail_wait(0), Duration::ZERO);
        assert_eq!(tail_wait(1500), Duration::from_millis(1500));
        assert_eq!(tail_wait(u64::MAX), MAX_TAIL_WAIT);
        assert_eq!(min_bytes(0, 100), 0);
        assert_eq!(min_bytes(50, 100), 50);
        assert_eq!(
            min_bytes(u64::MAX, answer_bytes(u64::MAX)),
            MAX_ANSWER_BYTES
        );
    }
}
