//! Where a log store is: `file:///abs/path` on the local file system, or
//! `s3://bucket/prefix` (credentials, region and endpoint from the `AWS_*` environment
//! variables, as the lake's).

use std::path::PathBuf;
use std::sync::Arc;

use object_store::ObjectStore;
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::path::Path as StorePath;

use crate::error::{LogError, Result};

/// The kinds of objects that make a writer's own sequence (see [`Location::path`]).
const OWN_KINDS: [&str; 3] = ["epochs", "wal", "checkpoints"];

/// A log store's object store and where in it the log lives.
#[derive(Debug, Clone)]
pub(crate) struct Location {
    pub(crate) store: Arc<dyn ObjectStore>,
    /// The prefix every object of the log is under.
    pub(crate) root: StorePath,
    /// The node whose writer this is, in a cluster: its own sequence goes under
    /// `nodes/<node>/` ([`Location::path`]).
    pub(crate) node: Option<String>,
    /// The directory of a `file://` store, whose objects are synced by hand: object_store's
    /// local store writes without fsync.
    pub(crate) local: Option<PathBuf>,
}

/// A `--log-store` URL's parts, checked without touching anything.
enum StoreUrl<'a> {
    File(&'a str),
    S3 { bucket: &'a str, root: StorePath },
}

impl<'a> StoreUrl<'a> {
    fn parse(url: &'a str) -> Result<Self> {
        let invalid = |why: &str| {
            LogError::InvalidArgument(format!(
                "log store '{url}': {why} (expected file:///absolute/path or s3://bucket/prefix)"
            ))
        };
        if let Some(path) = url.strip_prefix("file://") {
            let path = path.trim_end_matches('/');
            return match path.starts_with('/') {
                true => Ok(Self::File(path)),
                false => Err(invalid("not an absolute path")),
            };
        }
        let Some(rest) = url.strip_prefix("s3://") else {
            return Err(invalid("unknown scheme"));
        };
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(invalid("no bucket"));
        }
        let root = StorePath::parse(prefix).map_err(|e| invalid(&e.to_string()))?;
        Ok(Self::S3 { bucket, root })
    }
}

/// Checks the form of a `--log-store` URL, creating nothing (so a command line can be
/// refused before a data directory is touched).
///
/// # Errors
/// [`LogError::InvalidArgument`] for a URL of another form.
pub fn check_store_url(url: &str) -> Result<String> {
    StoreUrl::parse(url).map(|_| url.to_string())
}

impl Location {
    /// The store a `--log-store` URL names; a local one's directory is created (durably)
    /// if needed.
    ///
    /// # Errors
    /// [`LogError::InvalidArgument`] for a URL of another form, or a store that cannot be
    /// set up.
    pub(crate) fn parse(url: &str) -> Result<Self> {
        let unusable = |why: String| LogError::InvalidArgument(format!("log store '{url}': {why}"));
        match StoreUrl::parse(url)? {
            StoreUrl::File(path) => {
                mink_durable::create_dir_all(std::path::Path::new(path))?;
                let store =
                    LocalFileSystem::new_with_prefix(path).map_err(|e| unusable(e.to_string()))?;
                Ok(Self {
                    store: Arc::new(store),
                    root: StorePath::default(),
                    node: None,
                    local: Some(PathBuf::from(path)),
                })
            }
            StoreUrl::S3 { bucket, root } => {
                let store = AmazonS3Builder::from_env()
                    .with_bucket_name(bucket)
                    .build()
                    .map_err(|e| unusable(e.to_string()))?;
                Ok(Self {
                    store: Arc::new(store),
                    root,
                    node: None,
                    local: None,
                })
            }
        }
    }

    /// The same store, for the writer of node `node` of a cluster.
    ///
    /// # Errors
    /// A node id that is not a single path segment of letters, digits, `-` and `_`.
    pub(crate) fn for_node(self, node: &str) -> Result<Self> {
        if !mink_core::table::is_plain_name(node) {
            return Err(LogError::InvalidArgument(format!(
                "node id '{node}' for the log store: letters, digits, '-' and '_' only"
            )));
        }
        Ok(Self {
            node: Some(node.to_string()),
            ..self
        })
    }

    /// The store path of `parts` under the root. In a cluster, a writer's own sequence
    /// (`epochs`, `wal`, `checkpoints`) is under `nodes/<node>/`: each node claims epochs,
    /// writes WAL objects and fences its own earlier lives apart from the others. What
    /// belongs to buckets (`streams`, `starts`, `kv`, `packs`) is shared: a bucket's
    /// history is read by whichever node leads it.
    pub(crate) fn path<'a>(&self, parts: impl IntoIterator<Item = &'a str>) -> StorePath {
        let mut parts = parts.into_iter().peekable();
        let mut path = self.root.clone();
        if let Some(node) = &self.node
            && parts.peek().is_some_and(|kind| OWN_KINDS.contains(kind))
        {
            path = path.join("nodes").join(node.as_str());
        }
        parts.fold(path, |path, part| path.join(part))
    }

    /// The path of the pack `name`: under `packs/<node>/` in a cluster, as epochs (which
    /// name packs) are a node's own.
    pub(crate) fn pack_path(&self, name: &str) -> StorePath {
        self.path(
            ["packs"]
                .into_iter()
                .chain(self.node.as_deref())
                .chain([name]),
        )
    }

    /// The local directory of `parts` (a `file://` store only).
    pub(crate) fn local_dir<'a>(
        &self,
        parts: impl IntoIterator<Item = &'a str>,
    ) -> Option<PathBuf> {
        self.local_file(&self.path(parts))
    }

    /// The path of `name` among bucket `key`'s objects of one kind (`streams`, `starts`,
    /// `kv`).
    pub(crate) fn bucket_path(&self, kind: &str, key: &str, name: &str) -> StorePath {
        self.path(std::iter::once(kind).chain(key.split('/')).chain([name]))
    }

    /// The local file of a store path (a `file://` store only).
    pub(crate) fn local_file(&self, path: &StorePath) -> Option<PathBuf> {
        self.local.as_ref().map(|dir| dir.join(path.as_ref()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_of_other_forms_are_refused_with_the_expected_forms() {
        for url in ["file://relative/dir", "http://x/y", "s3://", "/abs/path"] {
            let error = check_store_url(url).unwrap_err().to_string();
            assert!(error.contains("file:///absolute/path"), "{url}: {error}");
            assert!(Location::parse(url).is_err(), "{url}");
        }
    }

    #[test]
    fn a_local_store_is_created_and_paths_fall_under_its_root() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}/store/", dir.path().display());
        let location = Location::parse(&url).unwrap();
        assert!(dir.path().join("store").is_dir());
        let path = location.path(["wal", "00000000000000000001"]);
        assert_eq!(
            location.local_file(&path).unwrap(),
            dir.path().join("store/wal/00000000000000000001")
        );
    }

    #[test]
    fn a_nodes_own_sequence_is_apart_and_the_buckets_objects_shared() {
        let location = Location::parse("s3://bucket/log")
            .unwrap()
            .for_node("n1")
            .unwrap();
        let path = |parts: &[&str]| location.path(parts.iter().copied()).to_string();
        assert_eq!(path(&["wal", "1", "2"]), "log/nodes/n1/wal/1/2");
        assert_eq!(path(&["epochs", "3"]), "log/nodes/n1/epochs/3");
        assert_eq!(path(&["checkpoints"]), "log/nodes/n1/checkpoints");
        assert_eq!(path(&["streams", "t1", "b0"]), "log/streams/t1/b0");
        assert_eq!(location.pack_path("7").to_string(), "log/packs/n1/7");
        for id in ["", "a/b", "..", "n 1"] {
            let refused = Location::parse("s3://bucket/log").unwrap().for_node(id);
            assert!(refused.is_err(), "{id:?}");
        }
    }
}
