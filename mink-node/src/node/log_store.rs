//! The log store a data directory keeps its log in (`mink server --log-store`), which it
//! remembers in `<data-dir>/log-store` (the URL, one line): every later process on the
//! directory (a restart, `mink sql --data-dir`, `mink load --data-dir`) opens the same
//! store, and another one is refused. A store is only given to a data directory without a
//! local log (its rows are in no store, and opening one rebuilds `log/` from it), and only
//! if it holds no log yet (the directory's tables would take its buckets for theirs).

use std::path::Path;
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use mink_core::protocol::BucketStore;
use mink_log::{LogStore, LogStoreConfig};

use super::{Bucket, Failpoint, NodeConfig};
use crate::error::{NodeError, Result};

/// The file a data directory remembers its log store's URL in.
const REMEMBERED: &str = "log-store";

/// Opens the log store `config` names, or the one its data directory remembers; `None`
/// for a node whose log is local. Called with the data directory locked: opening a store
/// empties and rebuilds `log/`.
///
/// # Errors
/// A store other than the remembered one, a store given to a data directory with a local
/// log, or a store that does not open.
pub(super) async fn open(config: &NodeConfig) -> Result<Option<Arc<LogStore>>> {
    let data_dir = &config.data_dir;
    let remembered_at = data_dir.join(REMEMBERED);
    let remembered = match std::fs::read_to_string(&remembered_at) {
        Ok(url) => Some(url.trim().to_string()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e.into()),
    };
    let mut chosen = match (&config.log_store, &remembered) {
        (Some(given), Some(url)) if &given.url != url => {
            return Err(NodeError::InvalidArgument(format!(
                "data directory {} keeps its log in {url}, not in {}",
                data_dir.display(),
                given.url
            )));
        }
        (Some(given), _) => given.clone(),
        (None, Some(url)) => LogStoreConfig {
            sync: config.log.sync,
            ..LogStoreConfig::new(url.clone())
        },
        (None, None) => return Ok(None),
    };
    let log_root = data_dir.join("log");
    if remembered.is_none() && holds_rows(&log_root)? {
        return Err(NodeError::InvalidArgument(format!(
            "data directory {} holds a local log, which no log store has: a log store is \
             given to a new data directory",
            data_dir.display()
        )));
    }
    if let Some(Failpoint::Store(failpoint)) = config.failpoint {
        chosen.failpoint = Some(failpoint);
    }
    let url = chosen.url.clone();
    let store = match &config.cluster {
        None => {
            chosen.must_be_empty = remembered.is_none();
            LogStore::open(chosen, &log_root, config.log.segment_bytes).await?
        }
        Some(cluster) => {
            // The node's sequence is its own, whatever its earlier lives left there: what
            // they wrote goes to stream objects first (whoever leads those buckets now
            // reads it there), then this life writes on.
            chosen.node = Some(cluster.node_id.clone());
            let drained = mink_log::drain(chosen.clone(), &log_root, config.log.segment_bytes);
            drained.await?;
            LogStore::open(chosen, &log_root, config.log.segment_bytes).await?
        }
    };
    if remembered.is_none() {
        mink_durable::write_atomically(&remembered_at, format!("{url}\n").as_bytes())?;
    }
    Ok(Some(store))
}

/// Where `bucket` is in the node's log store, for `list_buckets`; `None` without one.
pub(super) fn usage(bucket: &Bucket) -> Option<BucketStore> {
    let log = bucket.log.store_usage()?;
    let checkpoint = bucket.kv.as_ref().map(|kv| kv.checkpoint_state());
    let checkpoint = checkpoint.as_ref();
    let chain = checkpoint.and_then(|checkpoint| checkpoint.chain.as_ref());
    let written_at = checkpoint.and_then(|checkpoint| checkpoint.written_at);
    Some(BucketStore {
        stream_objects: log.stream_objects,
        stream_bytes: log.stream_bytes,
        wal_bytes: log.wal_bytes,
        kv_checkpoint_offset: chain.map(|chain| chain.end()),
        kv_checkpoint_runs: chain.map_or(0, |chain| chain.runs.len() as u64),
        kv_checkpoint_bytes: chain.map_or(0, |chain| chain.bytes()),
        kv_checkpoint_written_at_ms: written_at
            .and_then(|at| at.duration_since(UNIX_EPOCH).ok())
            .map(|since| since.as_millis() as i64),
        kv_pending_bytes: checkpoint.map_or(0, |checkpoint| checkpoint.pending_bytes as u64),
    })
}

/// Whether a segment file under `dir` holds anything.
fn holds_rows(dir: &Path) -> Result<bool> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        let holds = match entry.file_type()?.is_dir() {
            true => holds_rows(&path)?,
            false => path.extension().is_some_and(|e| e == "log") && entry.metadata()?.len() > 0,
        };
        if holds {
            return Ok(true);
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(data_dir: &Path, store: Option<&Path>) -> NodeConfig {
        let mut config = NodeConfig::new(data_dir);
        config.log_store =
            store.map(|store| LogStoreConfig::new(format!("file://{}", store.display())));
        config
    }

    #[tokio::test]
    async fn a_data_dir_remembers_its_store_and_refuses_another() {
        let (data, store, other) = (
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
        );
        std::fs::create_dir_all(data.path().join("log")).unwrap();
        let opened = open(&config(data.path(), Some(store.path())))
            .await
            .unwrap();
        assert_eq!(opened.unwrap().epoch(), 1);
        let remembered = open(&config(data.path(), None)).await.unwrap().unwrap();
        assert_eq!(
            remembered.url(),
            format!("file://{}", store.path().display())
        );
        assert_eq!(remembered.epoch(), 2);
        let error = open(&config(data.path(), Some(other.path())))
            .await
            .unwrap_err()
            .to_string();
        assert!(error.contains("keeps its log in"), "{error}");
    }

    #[tokio::test]
    async fn a_store_is_refused_to_a_data_dir_with_a_local_log() {
        let (data, store) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let bucket = data.path().join("log/t1/b0");
        std::fs::create_dir_all(&bucket).unwrap();
        std::fs::write(bucket.join("00000000000000000000.log"), b"").unwrap();
        assert!(open(&config(data.path(), None)).await.unwrap().is_none());
        open(&config(data.path(), Some(store.path())))
            .await
            .unwrap();

        let (data, store) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let bucket = data.path().join("log/t1/b0");
        std::fs::create_dir_all(&bucket).unwrap();
        std::fs::write(bucket.join("00000000000000000000.log"), b"rows").unwrap();
        let error = open(&config(data.path(), Some(store.path())))
            .await
            .unwrap_err()
            .to_string();
        assert!(error.contains("holds a local log"), "{error}");
        assert!(bucket.join("00000000000000000000.log").exists());
    }
}
