//! Idempotent writers: a writer that sends a write again after its answer was lost (the
//! node died once the write was durable, the connection broke) gets it written once.
//!
//! A writer (mink-client's `TableWriter`) picks a random producer id and numbers its
//! batches in each bucket; each batch's [`WriterTag`] (producer id and number) is stored
//! in its frame. A tablet keeps each recent writer's last batch, and its appender checks
//! every write of such a writer ([`Writer::Checked`]) in the order it writes them:
//!
//! ```text
//!   the writer's last batch n,  a write numbered  > n   -> written
//!                                                 <= n  -> not written: answered with the
//!                                                          earlier write (a retry, or a late
//!                                                          attempt whose retry came first)
//! ```
//!
//! A number may be missing from the log: a delete of keys that do not exist writes
//! nothing (the appender remembers its number all the same, but a new leader cannot find
//! it). So a number past the next is written too.
//!
//! Within a group commit a write is checked against the earlier ones of the group too,
//! and what the group wrote joins the tablet's record only once the group is durable: a
//! failed group leaves the record as it was.
//!
//! A tablet that does not know the writer (its node leads the bucket only since the
//! writer's last batch, or forgot the writer) looks for the writer's batches in its log
//! before it queues the write ([`LogTablet::recall_writer`](crate::LogTablet::recall_writer)),
//! from an offset the writer names: one at or below every earlier attempt of what it
//! sends (the high watermark before its first write to the bucket, then the end of its
//! last acknowledged batch). Only [`MAX_RECALL_BYTES`] are read for that: a writer that
//! names an older offset is refused rather than answered wrongly.
//!
//! A tablet remembers at most [`MAX_WRITERS`] writers, the least recently written
//! forgotten first; a forgotten writer is found in the log again at its next retry.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use crate::write::{Writer, WriterTag};

/// Writers a tablet remembers.
pub const MAX_WRITERS: usize = 1024;
/// Log bytes a tablet reads, at most, looking for a writer it does not know.
pub const MAX_RECALL_BYTES: u64 = 256 << 20;

/// One batch of a writer in the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriterBatch {
    /// Its writer and numbers.
    pub tag: WriterTag,
    /// Offset of its first row.
    pub base_offset: i64,
    /// Offset of its last row.
    pub last_offset: i64,
}

/// What the appender does with a write of a checked writer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Check {
    /// A batch after the writer's last one: written.
    Write,
    /// Written before: answered with that write, when it is the last one known.
    Written(Option<WriterBatch>),
}

/// Checks `tag` against the writer's last batch known.
pub(crate) fn check(last: Option<WriterBatch>, tag: WriterTag) -> Check {
    match last {
        Some(last) if tag.first_sequence <= last.tag.last_sequence => {
            let same = tag.last_sequence == last.tag.last_sequence;
            Check::Written(same.then_some(last))
        }
        _ => Check::Write,
    }
}

/// The last batch of each writer a tablet remembers, least recently written forgotten
/// first past [`MAX_WRITERS`].
#[derive(Debug, Default)]
pub(crate) struct Writers(Mutex<Remembered>);

#[derive(Debug, Default)]
struct Remembered {
    /// Each writer's last batch and when it was recorded (by `clock`).
    last: HashMap<i64, (WriterBatch, u64)>,
    clock: u64,
}

impl Writers {
    /// The last batch of `producer_id` remembered.
    pub(crate) fn last(&self, producer_id: i64) -> Option<WriterBatch> {
        let remembered = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        remembered.last.get(&producer_id).map(|(batch, _)| *batch)
    }

    /// Records written batches; a batch numbered below the one remembered for its writer
    /// is ignored (it was found in the log after a later one was written).
    pub(crate) fn record(&self, batches: impl IntoIterator<Item = WriterBatch>) {
        let mut remembered = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        for batch in batches {
            remembered.clock += 1;
            let clock = remembered.clock;
            let id = batch.tag.producer_id;
            match remembered.last.get_mut(&id) {
                Some((last, _)) if last.tag.last_sequence > batch.tag.last_sequence => {}
                Some(known) => *known = (batch, clock),
                None => {
                    if remembered.last.len() >= MAX_WRITERS {
                        remembered.forget_least_recent();
                    }
                    remembered.last.insert(id, (batch, clock));
                }
            }
        }
    }
}

impl Remembered {
    fn forget_least_recent(&mut self) {
        let oldest = (self.last.iter()).min_by_key(|(_, (_, recorded))| *recorded);
        if let Some((&id, _)) = oldest {
            self.last.remove(&id);
        }
    }
}

impl Writer {
    /// The tag stored with the batch.
    pub fn tag(self) -> WriterTag {
        match self {
            Self::Checked(tag) | Self::Unchecked(tag) => tag,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag(producer_id: i64, first: i32, last: i32) -> WriterTag {
        WriterTag {
            producer_id,
            epoch: 0,
            first_sequence: first,
            last_sequence: last,
        }
    }

    fn batch(producer_id: i64, sequence: i32, base_offset: i64) -> WriterBatch {
        WriterBatch {
            tag: tag(producer_id, sequence, sequence),
            base_offset,
            last_offset: base_offset + 9,
        }
    }

    #[test]
    fn a_writer_s_batches_are_written_once() {
        assert_eq!(check(None, tag(1, 0, 0)), Check::Write);
        let last = Some(batch(1, 4, 100));
        assert_eq!(check(last, tag(1, 5, 5)), Check::Write);
        assert_eq!(check(last, tag(1, 4, 4)), Check::Written(last));
        assert_eq!(check(last, tag(1, 2, 2)), Check::Written(None));
        assert_eq!(
            check(last, tag(1, 7, 7)),
            Check::Write,
            "past a number not logged"
        );
        let at_the_end = Some(batch(1, i32::MAX, 0));
        assert_eq!(
            check(at_the_end, tag(1, i32::MIN, i32::MIN)),
            Check::Written(None),
            "numbers do not wrap"
        );
    }

    #[test]
    fn a_tablet_remembers_the_last_batch_of_its_most_recent_writers() {
        let writers = Writers::default();
        writers.record([batch(1, 3, 30), batch(1, 4, 40)]);
        // Found in the log after a later batch was written: ignored.
        writers.record([batch(1, 2, 20)]);
        assert_eq!(writers.last(1), Some(batch(1, 4, 40)));
        writers.record((2..=MAX_WRITERS as i64).map(|id| batch(id, 0, id)));
        writers.record([batch(1, 5, 50)]);
        writers.record([batch(-1, 0, 0)]);
        assert_eq!(
            writers.last(2),
            None,
            "the least recently written is forgotten"
        );
        assert_eq!(writers.last(1), Some(batch(1, 5, 50)));
        assert_eq!(writers.last(-1), Some(batch(-1, 0, 0)));
    }
}
