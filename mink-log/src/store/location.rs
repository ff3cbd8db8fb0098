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
                    local: None,
                })
            }
        }
    }

    /// The store path of `parts` under the root.
    pub(crate) fn path<'a>(&self, parts: impl IntoIterator<Item = &'a str>) -> StorePath {
        parts
            .into_iter()
            .fold(self.root.clone(), |path, part| path.join(part))
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
}
