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

/// A log store's object store and where in it the log lives.
#[derive(Debug, Clone)]
pub(crate) struct Location {
    pub(crate) store: Arc<dyn ObjectStore>,
    /// The prefix every object of the log is under.
    pub(crate) root: StorePath,
    /// The directory of a `file://` store, whose objects are synced by hand: object_store's
    /// local store writes without fsync.
    pub(crate) local: Option<PathBuf>,
}

impl Location {
    /// The store a `--log-store` URL names; a local one's directory is created (durably)
    /// if needed.
    ///
    /// # Errors
    /// [`LogError::InvalidArgument`] for a URL of another form, or a store that cannot be
    /// set up.
    pub(crate) fn parse(url: &str) -> Result<Self> {
        let invalid = |why: String| {
            LogError::InvalidArgument(format!(
                "log store '{url}': {why} (expected file:///absolute/path or s3://bucket/prefix)"
            ))
        };
        if let Some(path) = url.strip_prefix("file://") {
            let path = path.trim_end_matches('/');
            if !path.starts_with('/') {
                return Err(invalid("not an absolute path".into()));
            }
            mink_durable::create_dir_all(std::path::Path::new(path))?;
            let store =
                LocalFileSystem::new_with_prefix(path).map_err(|e| invalid(e.to_string()))?;
            return Ok(Self {
                store: Arc::new(store),
                root: StorePath::default(),
                local: Some(PathBuf::from(path)),
            });
        }
        let Some(rest) = url.strip_prefix("s3://") else {
            return Err(invalid("unknown scheme".into()));
        };
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(invalid("no bucket".into()));
        }
        let root = StorePath::parse(prefix).map_err(|e| invalid(e.to_string()))?;
        let store = AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            .build()
            .map_err(|e| invalid(e.to_string()))?;
        Ok(Self {
            store: Arc::new(store),
            root,
            local: None,
        })
    }

    /// The store path of `parts` under the root.
    pub(crate) fn path<'a>(&self, parts: impl IntoIterator<Item = &'a str>) -> StorePath {
        parts
            .into_iter()
            .fold(self.root.clone(), |path, part| path.join(part))
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
            let error = Location::parse(url).unwrap_err().to_string();
            assert!(error.contains("file:///absolute/path"), "{url}: {error}");
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
}
