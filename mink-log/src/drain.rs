//! Draining a dead node's sequence into stream objects, so its buckets move on.
//!
//! A cluster's node writes its buckets' frames to WAL objects of its own sequence
//! (`nodes/<id>/` in the log store). When it dies, the frames of its buckets not yet in
//! stream objects are only there. Another node drains it: it opens a writer over that
//! sequence, which claims the dead node's next epoch (so the dead writer, should it only
//! be paused, is fenced and acknowledges nothing more) and rebuilds its buckets' logs from
//! the WAL objects, then hands every such bucket over. Their whole logs are then in
//! stream objects, and their new leaders take them over from there.

use std::path::Path;
use std::sync::Arc;

use crate::error::Result;
use crate::{LogConfig, LogStore, LogStoreConfig, LogTablet};

/// Drains the sequence of the node `config` names ([`LogStoreConfig::node`]), rebuilding
/// its buckets' logs under `root` (emptied first) with segments of `segment_bytes`; the
/// keys of the buckets it handed over (those with frames in no stream object before).
///
/// # Errors
/// A store that cannot be opened or read, or a bucket whose hand-over failed: draining
/// again later reads the same WAL objects (the frames uploaded so far are not lost).
pub async fn drain(config: LogStoreConfig, root: &Path, segment_bytes: u64) -> Result<Vec<String>> {
    let store = LogStore::open(config, root, segment_bytes).await?;
    let keys = store.buckets_in_wal();
    for key in &keys {
        let log_config = LogConfig {
            segment_bytes,
            store: Some(Arc::clone(&store)),
            ..LogConfig::default()
        };
        let tablet = LogTablet::open(key.clone(), &root.join(key), log_config, None)?;
        tablet.hand_over().await?;
    }
    Ok(keys)
}
