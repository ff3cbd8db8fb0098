//! The node's open buckets, counted against a node-wide bound
//! ([`NodeConfig::max_open_buckets`](super::NodeConfig::max_open_buckets)).
//!
//! Every bucket of every table and partition holds files for as long as the node runs
//! ([`FILES_PER_BUCKET`](crate::flight::limits::FILES_PER_BUCKET)): `bucket.num` and the
//! partitions of one table are bounded, but a client creating tables, or writing rows of
//! new partition values, could open buckets until the process ran out of file
//! descriptors, every port's accept failed, and the next start failed opening them. So
//! the buckets of the whole node are counted here: a create reserves its buckets before
//! opening them and gives them back if it fails, a drop gives them back. A start counts
//! what it opened without a bound, so a node over it (its file limit lowered since, or
//! its ports given more connections) still starts, and takes new buckets again once it
//! is under the bound.
//!
//! The bound follows the process's open-file limit, which [`raise_open_file_limit`]
//! raises to the hard limit at start.

use std::sync::atomic::{AtomicUsize, Ordering};

use nix::sys::resource::{Resource, getrlimit, setrlimit};
use tracing::{info, warn};

use crate::error::{NodeError, Result};

/// The buckets a node holds open, and the most it may.
#[derive(Debug)]
pub(super) struct OpenBuckets {
    open: AtomicUsize,
    max: Option<usize>,
}

impl OpenBuckets {
    /// No bucket open yet; `None`: no bound.
    pub(super) fn new(max: Option<usize>) -> Self {
        Self {
            open: AtomicUsize::new(0),
            max,
        }
    }

    /// Counts the buckets a start opened, over the bound or not (said in the log).
    pub(super) fn opened_at_start(&self, buckets: usize) {
        let open = self.open.fetch_add(buckets, Ordering::Relaxed) + buckets;
        if let Some(max) = self.max
            && open > max
        {
            warn!(
                open,
                max,
                "the node holds more buckets than its open-file limit allows: new tables and \
                 partitions are refused until it is raised (ulimit -n) or tables are dropped"
            );
        }
    }

    /// Reserves `buckets` for `what` (a table or partition about to be created).
    ///
    /// # Errors
    /// [`NodeError::InvalidArgument`] when they would take the node past its bound; nothing
    /// is reserved then.
    pub(super) fn reserve(&self, buckets: usize, what: &str) -> Result<()> {
        let Some(max) = self.max else {
            self.open.fetch_add(buckets, Ordering::Relaxed);
            return Ok(());
        };
        self.open
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |open| {
                open.checked_add(buckets).filter(|total| *total <= max)
            })
            .map(drop)
            .map_err(|open| {
                NodeError::InvalidArgument(format!(
                    "{what} would open {buckets} buckets and the node holds {open} of the \
                     {max} it may hold open (the bound follows the process's open-file \
                     limit, as every bucket keeps files open): raise the limit (ulimit -n) \
                     and restart the server, or drop tables"
                ))
            })
    }

    /// Gives back buckets that were closed (dropped) or never opened (a failed create).
    pub(super) fn release(&self, buckets: usize) {
        self.open.fetch_sub(buckets, Ordering::Relaxed);
    }
}

/// Raises the process's soft open-file limit (`ulimit -n`) to its hard limit, and returns
/// the soft limit now in force; `None` when it cannot be read.
///
/// Many systems start processes with a soft limit of 1024 under a hard limit hundreds of
/// times higher: the node's buckets and every port's connections would share 1024 files.
pub fn raise_open_file_limit() -> Option<u64> {
    let (soft, hard) = match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok(limits) => limits,
        Err(error) => {
            warn!(%error, "cannot read the open-file limit: open buckets are not bounded");
            return None;
        }
    };
    if soft >= hard {
        return Some(soft);
    }
    match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
        Ok(()) => {
            info!(from = soft, to = hard, "raised the open-file limit");
            Some(hard)
        }
        Err(error) => {
            warn!(%error, soft, hard, "cannot raise the open-file limit");
            Some(soft)
        }
    }
}
