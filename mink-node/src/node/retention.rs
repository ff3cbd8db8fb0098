//! Log retention (`log.ttl`): a table's segments older than its ttl are removed, but
//! never what its KV stores would replay (from their local files, and with a log store
//! from their checkpoints there) nor, with a lake, what is not tiered yet.

use std::time::Duration;

use mink_core::table::TableDescriptor;
use mink_kv::KvTablet;
use tracing::warn;

use super::Node;
use crate::error::Result;

impl Node {
    /// Applies `log.ttl` retention to every table that has one; returns segments removed.
    /// A table that fails (dropped meanwhile, its metadata unreadable) is logged and
    /// skipped: the others are still trimmed.
    pub fn enforce_retention(&self) -> Result<usize> {
        let mut removed = 0;
        for state in self.table_states() {
            let table = state.descriptor();
            let Some(ttl) = table.log_ttl else {
                continue;
            };
            match self.enforce_table_retention(&table, ttl) {
                Ok(segments) => removed += segments,
                Err(error) => warn!(table = %table.path, %error, "log retention skipped"),
            }
        }
        Ok(removed)
    }

    /// Removes `table`'s segments older than `ttl`, keeping what its KV stores would replay
    /// and, with a lake, its log from the recorded seam on: rows not yet tiered (a round
    /// that keeps failing, say) are never removed before the lake holds them.
    fn enforce_table_retention(&self, table: &TableDescriptor, ttl: Duration) -> Result<usize> {
        let seams = match table.lake_enabled {
            true => Some(crate::tiering::recorded_offsets(self, table)?),
            false => None,
        };
        let (_, buckets, _) = self.led_buckets(&table.path)?;
        // A KV store replays the log from fjall's applied offset: every bucket's buffered
        // rows go to fjall first, then the offsets are made durable, with one sync of the
        // store for them all (a power cut must not take them back below the log's new
        // start), and no segment from a bucket's offset on is removed.
        let replay_from = (buckets.iter())
            .map(|(_, tablet)| tablet.kv.as_ref().map(flushed).transpose())
            .collect::<Result<Vec<_>, _>>()?;
        if replay_from.iter().any(Option::is_some) {
            self.storage.kv()?.sync_applied_offsets()?;
        }
        let store = self.storage.config.log.store.is_some();
        let mut removed = 0;
        for ((id, tablet), replay_from) in buckets.into_iter().zip(replay_from) {
            let untiered_from = seams.as_ref().map(|seams| seams.get(&id));
            // With a log store, a node that lost its disk restores the bucket's KV
            // checkpoint and replays the log from its end (from the start, before one).
            let restore_from = (tablet.kv.as_ref())
                .filter(|_| store)
                .map(|kv| kv.checkpoint_state().chain.map_or(0, |chain| chain.end()));
            let keep_from = (replay_from.into_iter())
                .chain(untiered_from)
                .chain(restore_from)
                .min();
            removed += tablet.log.enforce_retention(ttl, keep_from)?;
        }
        Ok(removed)
    }
}

/// Writes a tablet's buffered rows to fjall; the log offset they reach.
fn flushed(kv: &KvTablet) -> mink_kv::Result<i64> {
    kv.flush()?;
    kv.flushed_offset()
}
