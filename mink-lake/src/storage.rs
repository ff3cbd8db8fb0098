//! Iceberg's FileIO over an `object_store` store, so one store serves Iceberg's metadata
//! and data files and mink's own Parquet reads (and, later, DataFusion's).
//!
//! Locations are URLs of the store: absolute paths (or `file://` URLs) for the local file
//! system, `s3://bucket/key` for S3.

use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use iceberg::io::{
    FileMetadata, FileRead, FileWrite, InputFile, OutputFile, Storage, StorageConfig,
    StorageFactory,
};
use iceberg::{Error, ErrorKind};
use mink_core::table::TablePath;
use object_store::buffered::BufWriter;
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;

use crate::layout::{check_table_file, table_location};

/// The lake's object store and how its locations map to store paths.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LakeStorage {
    /// `""` for the local file system (locations are absolute paths), else the location
    /// prefix of the store's root (`s3://bucket/`, or `/data/lake/warehouse/` for a local
    /// store rooted at its warehouse).
    url_prefix: String,
    /// The warehouse, when known: every lake file read is then checked to lie inside its
    /// table's location ([`LakeStorage::check_table_file`]).
    #[serde(default)]
    warehouse: Option<String>,
    #[serde(skip)]
    store: Option<Arc<dyn ObjectStore>>,
}

impl LakeStorage {
    /// Storage over `store`, whose root is the location `url_prefix` (empty: the local file
    /// system's root).
    pub fn new(store: Arc<dyn ObjectStore>, url_prefix: impl Into<String>) -> Self {
        Self {
            url_prefix: url_prefix.into(),
            warehouse: None,
            store: Some(store),
        }
    }

    /// Storage over a local warehouse directory (an absolute path, as the lake's catalog
    /// writes its locations), with a store rooted there: a location outside the
    /// warehouse has no store path at all, so nothing outside it is ever read.
    ///
    /// # Errors
    /// The warehouse is not an absolute path of an existing directory.
    pub fn local(warehouse: &str) -> iceberg::Result<Self> {
        let root = warehouse.trim_end_matches('/');
        if !root.starts_with('/') {
            return Err(Error::new(
                ErrorKind::DataInvalid,
                format!("lake warehouse {warehouse} is not an absolute path"),
            ));
        }
        let store = object_store::local::LocalFileSystem::new_with_prefix(root).map_err(|e| {
            Error::new(
                ErrorKind::DataInvalid,
                format!("lake warehouse {warehouse}: {e}"),
            )
            .with_source(e)
        })?;
        Ok(Self {
            url_prefix: format!("{root}/"),
            warehouse: Some(root.to_string()),
            store: Some(Arc::new(store)),
        })
    }

    /// This storage, knowing its warehouse (`s3://bucket/prefix`): lake files read are
    /// then checked to lie inside their table's location.
    pub fn with_warehouse(mut self, warehouse: impl Into<String>) -> Self {
        self.warehouse = Some(warehouse.into().trim_end_matches('/').to_string());
        self
    }

    /// The location prefix of the store's root: `""` for the whole local file system,
    /// `/path/to/warehouse/` for a local store rooted at its warehouse, `s3://bucket/`.
    pub fn url_prefix(&self) -> &str {
        &self.url_prefix
    }

    /// Checks that `file`, a lake file of `table`, lies inside the table's location in
    /// the warehouse (see [`crate::layout::check_table_file`]); without a known
    /// warehouse there is nothing to check against.
    ///
    /// # Errors
    /// [`crate::LakeError::Layout`] for a file outside the table's location.
    pub fn check_table_file(&self, table: &TablePath, file: &str) -> crate::Result<()> {
        match &self.warehouse {
            Some(warehouse) => check_table_file(table, &table_location(warehouse, table), file),
            None => Ok(()),
        }
    }

    /// The object store.
    pub fn store(&self) -> iceberg::Result<Arc<dyn ObjectStore>> {
        self.store
            .clone()
            .ok_or_else(|| Error::new(ErrorKind::Unexpected, "lake storage without a store"))
    }

    /// The store path of a location.
    pub fn path(&self, location: &str) -> iceberg::Result<StorePath> {
        let invalid = |e: &dyn std::fmt::Display| {
            Error::new(
                ErrorKind::DataInvalid,
                format!("location {location} is not in the lake's store: {e}"),
            )
        };
        let local = location
            .strip_prefix("file://")
            .or_else(|| location.strip_prefix("file:"))
            .unwrap_or(location);
        if self.url_prefix.is_empty() {
            StorePath::from_absolute_path(local).map_err(|e| invalid(&e))
        } else {
            // A local store rooted at its warehouse takes its locations with or without
            // `file:`; StorePath::parse refuses `.` and `..` steps.
            let location = match self.url_prefix.starts_with('/') {
                true => local,
                false => location,
            };
            let rest = location
                .strip_prefix(self.url_prefix.as_str())
                .ok_or_else(|| invalid(&format!("it does not start with {}", self.url_prefix)))?;
            StorePath::parse(rest).map_err(|e| invalid(&e))
        }
    }
}

fn store_error(error: object_store::Error) -> Error {
    Error::new(ErrorKind::Unexpected, format!("object store: {error}")).with_source(error)
}

struct StoreRead(Arc<dyn ObjectStore>, StorePath);

#[async_trait]
impl FileRead for StoreRead {
    async fn read(&self, range: Range<u64>) -> iceberg::Result<Bytes> {
        self.0.get_range(&self.1, range).await.map_err(store_error)
    }
}

struct StoreWrite(BufWriter);

#[async_trait]
impl FileWrite for StoreWrite {
    async fn write(&mut self, bytes: Bytes) -> iceberg::Result<()> {
        self.0.put(bytes).await.map_err(store_error)
    }

    async fn close(&mut self) -> iceberg::Result<()> {
        self.0
            .shutdown()
            .await
            .map_err(|e| Error::new(ErrorKind::Unexpected, "closing a lake file").with_source(e))
    }
}

#[async_trait]
#[typetag::serde]
impl Storage for LakeStorage {
    async fn exists(&self, path: &str) -> iceberg::Result<bool> {
        match self.store()?.head(&self.path(path)?).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(store_error(e)),
        }
    }

    async fn metadata(&self, path: &str) -> iceberg::Result<FileMetadata> {
        let meta = self
            .store()?
            .head(&self.path(path)?)
            .await
            .map_err(store_error)?;
        Ok(FileMetadata { size: meta.size })
    }

    async fn read(&self, path: &str) -> iceberg::Result<Bytes> {
        let got = self
            .store()?
            .get(&self.path(path)?)
            .await
            .map_err(store_error)?;
        got.bytes().await.map_err(store_error)
    }

    async fn reader(&self, path: &str) -> iceberg::Result<Box<dyn FileRead>> {
        Ok(Box::new(StoreRead(self.store()?, self.path(path)?)))
    }

    async fn write(&self, path: &str, bytes: Bytes) -> iceberg::Result<()> {
        self.store()?
            .put(&self.path(path)?, PutPayload::from(bytes))
            .await
            .map_err(store_error)?;
        Ok(())
    }

    async fn writer(&self, path: &str) -> iceberg::Result<Box<dyn FileWrite>> {
        Ok(Box::new(StoreWrite(BufWriter::new(
            self.store()?,
            self.path(path)?,
        ))))
    }

    async fn delete(&self, path: &str) -> iceberg::Result<()> {
        match self.store()?.delete(&self.path(path)?).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(store_error(e)),
        }
    }

    async fn delete_prefix(&self, path: &str) -> iceberg::Result<()> {
        let store = self.store()?;
        let locations = store
            .list(Some(&self.path(path)?))
            .map_ok(|meta| meta.location)
            .boxed();
        store
            .delete_stream(locations)
            .try_collect::<Vec<_>>()
            .await
            .map_err(store_error)?;
        Ok(())
    }

    async fn delete_stream(&self, paths: BoxStream<'static, String>) -> iceberg::Result<()> {
        let paths: Vec<String> = paths.collect().await;
        for path in paths {
            self.delete(&path).await?;
        }
        Ok(())
    }

    fn new_input(&self, path: &str) -> iceberg::Result<InputFile> {
        Ok(InputFile::new(Arc::new(self.clone()), path.to_string()))
    }

    fn new_output(&self, path: &str) -> iceberg::Result<OutputFile> {
        Ok(OutputFile::new(Arc::new(self.clone()), path.to_string()))
    }
}

/// Hands the catalog's FileIO the lake's storage.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LakeStorageFactory(pub LakeStorage);

#[typetag::serde]
impl StorageFactory for LakeStorageFactory {
    fn build(&self, _config: &StorageConfig) -> iceberg::Result<Arc<dyn Storage>> {
        Ok(Arc::new(self.0.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_local_store_rooted_at_its_warehouse_maps_only_locations_inside_it() {
        let dir = tempfile::tempdir().unwrap();
        let warehouse = dir.path().display().to_string();
        let storage = LakeStorage::local(&warehouse).unwrap();
        assert_eq!(storage.url_prefix(), format!("{warehouse}/"));
        let inside = format!("{warehouse}/db/t/data/a.parquet");
        assert_eq!(
            storage.path(&inside).unwrap().as_ref(),
            "db/t/data/a.parquet"
        );
        assert_eq!(
            storage.path(&format!("file://{inside}")).unwrap().as_ref(),
            "db/t/data/a.parquet"
        );
        for outside in [
            "/etc/passwd".to_string(),
            format!("{warehouse}/db/../../etc/passwd"),
            format!("{warehouse}x/db/t/a.parquet"),
        ] {
            assert!(storage.path(&outside).is_err(), "{outside}");
        }
        let t = TablePath::new("db", "t");
        assert!(storage.check_table_file(&t, &inside).is_ok());
        let other = format!("{warehouse}/db/u/data/a.parquet");
        assert!(storage.check_table_file(&t, &other).is_err());
        assert!(LakeStorage::local("relative/warehouse").is_err());
    }
}
