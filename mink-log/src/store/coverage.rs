//! Which WAL objects a restart still needs: those holding frames that are in no stream
//! object yet. Once every frame of the WAL objects before a place is in stream objects,
//! a checkpoint named by that place (`checkpoints/<epoch>-<seq>`, created only) tells
//! later opens to start reading the WAL there.
//!
//! A checkpoint states a fact about objects that never change, so any writer may make
//! one, a fenced writer's late one included: an open starts at the furthest.

use std::collections::{BTreeMap, HashMap, HashSet};

/// A place in the WAL: an epoch and a sequence number in it.
pub(crate) type Place = (u64, u64);

/// What the stream objects cover of the WAL objects written or read so far.
#[derive(Debug, Default)]
pub(crate) struct Coverage {
    /// WAL objects with frames in no stream object yet: per bucket key, the offset after
    /// its last frame there.
    pending: BTreeMap<Place, HashMap<String, i64>>,
    /// Per bucket key, the offset up to which its log is in stream objects without a gap
    /// (or removed by retention); a key not here starts at 0.
    streamed: HashMap<String, i64>,
    /// Per bucket key, stream objects past a gap, `(base, end)`: a segment retention
    /// removed before it was uploaded, until the new log start is recorded.
    ahead: HashMap<String, Vec<(i64, i64)>>,
    /// Buckets dropped: their frames are needed by nobody.
    forgotten: HashSet<String>,
    /// The place after the last WAL object recorded.
    next: Place,
    /// The place of the last checkpoint made.
    checkpointed: Place,
}

impl Coverage {
    /// Coverage of a store whose buckets' stream objects reach `streamed`, opened at the
    /// checkpoint `from`.
    pub(crate) fn new(streamed: HashMap<String, i64>, from: Place) -> Self {
        Self {
            streamed,
            next: from,
            checkpointed: from,
            ..Self::default()
        }
    }

    /// The WAL object at `place` holds frames of each key up to its offset in `ends`.
    pub(crate) fn wal_object(&mut self, place: Place, mut ends: HashMap<String, i64>) {
        ends.retain(|key, end| !self.covers(key, *end));
        if !ends.is_empty() {
            self.pending.insert(place, ends);
        }
        self.next = self.next.max((place.0, place.1 + 1));
    }

    /// `key`'s stream object of `base..end` is in the store. Its frames are no longer
    /// needed from the WAL once every frame before it is covered too: an open reads a
    /// bucket's stream objects only up to their first gap.
    pub(crate) fn stream_object(&mut self, key: &str, (base, end): (i64, i64)) {
        self.ahead
            .entry(key.to_string())
            .or_default()
            .push((base, end));
        self.extend(key);
    }

    /// Retention removed `key`'s frames before `start`, and the new start is recorded.
    pub(crate) fn trimmed(&mut self, key: &str, start: i64) {
        let reach = self.streamed.entry(key.to_string()).or_default();
        *reach = (*reach).max(start);
        self.extend(key);
    }

    /// Moves `key`'s reach over the objects ahead that now join it, and releases what it
    /// covers.
    fn extend(&mut self, key: &str) {
        let reach = self.streamed.entry(key.to_string()).or_default();
        if let Some(ahead) = self.ahead.get_mut(key) {
            ahead.sort_unstable();
            ahead.retain(|&(base, end)| {
                if base <= *reach {
                    *reach = (*reach).max(end);
                }
                end > *reach
            });
        }
        let reach = *reach;
        self.release(key, |needed| needed <= reach);
    }

    /// This writer took `key`'s bucket over with its log before `start` in the store: its
    /// frames before are covered, and those after it writes are needed until streamed.
    pub(crate) fn taken_over(&mut self, key: &str, start: i64) {
        self.forgotten.remove(key);
        self.trimmed(key, start);
    }

    /// `key`'s bucket is gone (or handed over, its frames in stream objects): none of its
    /// frames is needed.
    pub(crate) fn forget(&mut self, key: &str) {
        self.forgotten.insert(key.to_string());
        self.release(key, |_| true);
    }

    /// The buckets whose frames some WAL object still needed holds.
    pub(crate) fn pending_keys(&self) -> HashSet<String> {
        (self.pending.values())
            .flat_map(|ends| ends.keys().cloned())
            .collect()
    }

    /// The place of a new checkpoint: the first WAL object still needed (or the place
    /// after the last recorded), when it is past the last checkpoint.
    pub(crate) fn checkpoint(&mut self) -> Option<Place> {
        let place = self.pending.keys().next().copied().unwrap_or(self.next);
        (place > self.checkpointed).then(|| {
            self.checkpointed = place;
            place
        })
    }

    fn covers(&self, key: &str, end: i64) -> bool {
        self.forgotten.contains(key) || self.streamed.get(key).is_some_and(|reach| end <= *reach)
    }

    /// Drops `key` from every pending object where `released` says its frames are no
    /// longer needed, and the objects left needing nothing.
    fn release(&mut self, key: &str, released: impl Fn(i64) -> bool) {
        self.pending.retain(|_, ends| {
            if ends.get(key).is_some_and(|end| released(*end)) {
                ends.remove(key);
            }
            !ends.is_empty()
        });
    }
}

/// The name of a checkpoint at `place`.
pub(crate) fn name((epoch, seq): Place) -> String {
    format!("{epoch:020}-{seq:020}")
}

/// The place a checkpoint's name holds.
pub(crate) fn parse_name(name: &str) -> Option<Place> {
    let (epoch, seq) = name.split_once('-')?;
    Some((epoch.parse().ok()?, seq.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ends(pairs: &[(&str, i64)]) -> HashMap<String, i64> {
        pairs.iter().map(|(k, e)| (k.to_string(), *e)).collect()
    }

    #[test]
    fn the_checkpoint_moves_to_the_first_object_still_needed() {
        let mut coverage = Coverage::new(HashMap::new(), (1, 0));
        coverage.wal_object((1, 0), ends(&[("a", 10), ("b", 5)]));
        coverage.wal_object((1, 1), ends(&[("a", 20)]));
        coverage.wal_object((2, 0), ends(&[("b", 8)]));
        assert_eq!(coverage.checkpoint(), None, "(1, 0) is still needed");
        coverage.stream_object("a", (0, 20));
        assert_eq!(
            coverage.checkpoint(),
            None,
            "b's frames of (1, 0) are not streamed"
        );
        coverage.stream_object("b", (0, 5));
        assert_eq!(coverage.checkpoint(), Some((2, 0)));
        assert_eq!(coverage.checkpoint(), None, "made once");
        coverage.forget("b");
        assert_eq!(
            coverage.checkpoint(),
            Some((2, 1)),
            "past every object recorded"
        );
    }

    #[test]
    fn frames_already_streamed_or_forgotten_need_nothing() {
        let mut coverage = Coverage::new(ends(&[("a", 10)]), (3, 4));
        coverage.forget("gone");
        coverage.wal_object((3, 4), ends(&[("a", 10), ("gone", 3)]));
        assert_eq!(coverage.checkpoint(), Some((3, 5)));
    }

    #[test]
    fn objects_past_a_gap_cover_nothing_until_the_gap_is_closed() {
        let mut coverage = Coverage::new(HashMap::new(), (1, 0));
        coverage.wal_object((1, 0), ends(&[("a", 10)]));
        coverage.wal_object((1, 1), ends(&[("a", 30)]));
        // 10..20 was removed by retention before its upload; 20..30 is uploaded.
        coverage.stream_object("a", (20, 30));
        coverage.stream_object("a", (0, 10));
        assert_eq!(coverage.checkpoint(), Some((1, 1)), "only up to the gap");
        coverage.trimmed("a", 20);
        assert_eq!(coverage.checkpoint(), Some((1, 2)));
    }

    #[test]
    fn names_hold_their_place() {
        assert_eq!(parse_name(&name((7, 42))), Some((7, 42)));
        assert!(name((2, 0)) > name((1, 99)), "names sort as places");
        assert_eq!(parse_name("7"), None);
    }
}
