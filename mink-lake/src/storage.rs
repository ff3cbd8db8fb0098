//! Iceberg's FileIO over an `object_store` store, so one store serves Iceberg's metadata
//! and data files and mink's own Parquet reads (and, later, DataFusion's).
//!
//! Locations are URLs of the store: absolute paths (or `file://` URLs) for the local file
//! system, `s3://bucket/key` for S3.
//!
//! # Durability
//!
//! On the local file system every file written is fsynced, and so is every directory from
//! its parent up to the warehouse, before the write counts as done (`LocalSync`): neither
//! object_store's `LocalFileSystem` nor iceberg's FileIO syncs, and a commit's
//! compare-and-swap in the catalog must never point at files a crash can still lose. Every
//! file of the lake goes through here: mink's data and delete files, manifests and manifest
//! lists, and the metadata files, whether mink writes them (the SQL catalog's swap) or
//! iceberg does (creating a table, `Transaction::commit`: the catalog's FileIO is this
//! storage, [`LakeStorageFactory`]). `LocalFileSystem` writes a file under a temporary
//! name (`<name>#<n>`) and renames it into place: the rename is in the same directory, so
//! the directory's fsync makes it durable too. Files another engine writes and commits
//! through mink's REST catalog are synced before the commit
//! ([`LakeStorage::sync_files`]). The warehouse's own entry in its parent is made durable
//! when the lake opens (`LakeConfig::create_local_warehouse`). An object store (S3) is
//! durable once a put returns.
//!
//! Deletes are not followed by a directory fsync: a file deleted again after a power cut
//! is one no snapshot, metadata file or pending round of the catalog names any more (a lost
//! round's files, an expired snapshot's, a lost swap's metadata file, a dropped table's,
//! a lapsed lease), so nothing reads it, and orphan removal deletes it again (its
//! modification time is as old as it was: [`crate::upkeep::remove_orphan_files`]). A lease
//! that comes back holds its snapshot only until its own expiry. The one leftover nothing
//! removes is the temporary file of a write cut short (`<name>#<n>`, which
//! `LocalFileSystem` does not list), never referenced either.

use std::collections::HashSet;
use std::io::ErrorKind as ErrorKindIo;
use std::ops::Range;
use std::path::{Path, PathBuf};
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

use crate::layout::{check_table_file, table_location, without_file_scheme};
use crate::reader::PositionDeleteCache;

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
    /// How written files are made durable: `Some` for a local store.
    #[serde(skip)]
    local: Option<LocalSync>,
    /// Position-delete files already read, shared by every clone.
    #[serde(skip)]
    position_deletes: Arc<PositionDeleteCache>,
}

impl LakeStorage {
    /// Storage over `store`, whose root is the location `url_prefix` (empty: the local file
    /// system's root).
    pub fn new(store: Arc<dyn ObjectStore>, url_prefix: impl Into<String>) -> Self {
        let url_prefix = url_prefix.into();
        Self {
            local: LocalSync::of(&url_prefix, None),
            url_prefix,
            warehouse: None,
            store: Some(store),
            position_deletes: Arc::default(),
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
        Ok(Self::new(Arc::new(store), format!("{root}/")).with_warehouse(root))
    }

    /// This storage, knowing its warehouse (`s3://bucket/prefix`, or an absolute path on
    /// the local file system): lake files read are then checked to lie inside their
    /// table's location, and on the local file system the directories synced after a
    /// write reach up to it.
    pub fn with_warehouse(mut self, warehouse: impl Into<String>) -> Self {
        let warehouse = warehouse.into().trim_end_matches('/').to_string();
        self.local = LocalSync::of(&self.url_prefix, Some(&warehouse));
        self.warehouse = Some(warehouse);
        self
    }

    /// The position-delete files this storage's reads loaded (see [`PositionDeleteCache`]).
    pub(crate) fn position_deletes(&self) -> &PositionDeleteCache {
        &self.position_deletes
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

    /// Makes files another process wrote durable as this storage's own writes are (each
    /// file, then its directories up to the warehouse, fsynced): the files of a commit
    /// another engine sends mink's REST catalog, before the catalog names them. A file
    /// that does not exist is skipped (nothing of it can be lost); nothing to do for a
    /// store that is not on the local file system.
    ///
    /// # Errors
    /// A location that is not in the store, or a file or directory that cannot be synced.
    pub(crate) async fn sync_files(&self, locations: &[&str]) -> iceberg::Result<()> {
        let Some(local) = &self.local else {
            return Ok(());
        };
        let files = locations
            .iter()
            .map(|location| self.path(location))
            .collect::<iceberg::Result<Vec<_>>>()?;
        local.sync(&files, Missing::Skipped).await
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
        let local = without_file_scheme(location);
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

/// Makes the files of a local store durable: after a file is written, the file and every
/// directory from its parent up to the warehouse (inclusive) are fsynced, so the file's
/// bytes and its entry in every directory the store may have created for it survive a
/// crash.
#[derive(Clone, Debug)]
struct LocalSync {
    /// The directory of the store's root (`/` for the whole file system).
    base: PathBuf,
    /// The last directory synced above a file; `None` (or a file outside it): the
    /// file's parent only.
    root: Option<PathBuf>,
}

/// What a sync does with a file that does not exist.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Missing {
    /// Fails: the store just wrote it.
    Fails,
    /// Skips it: another engine's commit names it, and there is nothing of it to lose.
    Skipped,
}

impl LocalSync {
    /// The sync of a store whose root is the location `url_prefix`, with the warehouse
    /// `warehouse`; `None` for a store that is not on the local file system.
    fn of(url_prefix: &str, warehouse: Option<&str>) -> Option<Self> {
        let (base, root) = match url_prefix {
            "" => ("/", warehouse.map(without_file_scheme)),
            rooted if rooted.starts_with('/') => (rooted, Some(rooted.trim_end_matches('/'))),
            _ => return None,
        };
        Some(Self {
            base: PathBuf::from(base),
            root: root.filter(|root| root.starts_with('/')).map(PathBuf::from),
        })
    }

    /// What is synced after `files` are written, in order and each once: the files, then
    /// their directories, each file's from its parent up.
    fn paths(&self, files: &[StorePath]) -> Vec<PathBuf> {
        let files: Vec<PathBuf> = files.iter().map(|path| self.file(path)).collect();
        let directories = files
            .iter()
            .filter_map(|file| file.parent())
            .flat_map(|parent| {
                let up_to_root = self.root.as_deref().filter(|root| parent.starts_with(root));
                let count = match up_to_root {
                    Some(root) => parent
                        .ancestors()
                        .take_while(|dir| dir.starts_with(root))
                        .count(),
                    None => 1,
                };
                parent.ancestors().take(count).map(Path::to_path_buf)
            });
        let mut seen = HashSet::new();
        let directories: Vec<PathBuf> =
            directories.filter(|dir| seen.insert(dir.clone())).collect();
        files.into_iter().chain(directories).collect()
    }

    /// The file a store path names: LocalFileSystem puts a store path's (encoded) parts
    /// under its root as they are.
    fn file(&self, path: &StorePath) -> PathBuf {
        self.base.join(path.as_ref())
    }

    /// Fsyncs what [`LocalSync::paths`] names for `files`, on a blocking thread.
    ///
    /// # Errors
    /// The first path that cannot be opened or synced, named in the error (a missing one
    /// only when `missing` says it fails).
    async fn sync(&self, files: &[StorePath], missing: Missing) -> iceberg::Result<()> {
        let paths = self.paths(files);
        let first = paths.first().cloned().unwrap_or_default();
        tokio::task::spawn_blocking(move || {
            paths.iter().try_for_each(|path| {
                match std::fs::File::open(path).and_then(|file| file.sync_all()) {
                    Err(e) if e.kind() == ErrorKindIo::NotFound && missing == Missing::Skipped => {
                        Ok(())
                    }
                    synced => synced.map_err(|e| {
                        Error::new(
                            ErrorKind::Unexpected,
                            format!("syncing lake file {}: {e}", path.display()),
                        )
                        .with_source(e)
                    }),
                }
            })
        })
        .await
        .map_err(|e| {
            Error::new(
                ErrorKind::Unexpected,
                format!("syncing lake file {}: {e}", first.display()),
            )
            .with_source(e)
        })?
    }
}

struct StoreRead(Arc<dyn ObjectStore>, StorePath);

#[async_trait]
impl FileRead for StoreRead {
    async fn read(&self, range: Range<u64>) -> iceberg::Result<Bytes> {
        self.0.get_range(&self.1, range).await.map_err(store_error)
    }
}

/// A lake file being written; closing it completes the upload and, on a local store,
/// syncs the file.
struct StoreWrite {
    writer: BufWriter,
    path: StorePath,
    local: Option<LocalSync>,
}

#[async_trait]
impl FileWrite for StoreWrite {
    async fn write(&mut self, bytes: Bytes) -> iceberg::Result<()> {
        self.writer.put(bytes).await.map_err(store_error)
    }

    async fn close(&mut self) -> iceberg::Result<()> {
        self.writer
            .shutdown()
            .await
            .map_err(|e| Error::new(ErrorKind::Unexpected, "closing a lake file").with_source(e))?;
        match &self.local {
            Some(local) => {
                local
                    .sync(std::slice::from_ref(&self.path), Missing::Fails)
                    .await
            }
            None => Ok(()),
        }
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
        let path = self.path(path)?;
        self.store()?
            .put(&path, PutPayload::from(bytes))
            .await
            .map_err(store_error)?;
        match &self.local {
            Some(local) => local.sync(&[path], Missing::Fails).await,
            None => Ok(()),
        }
    }

    async fn writer(&self, path: &str) -> iceberg::Result<Box<dyn FileWrite>> {
        let path = self.path(path)?;
        Ok(Box::new(StoreWrite {
            writer: BufWriter::new(self.store()?, path.clone()),
            path,
            local: self.local.clone(),
        }))
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
    use object_store::local::LocalFileSystem;
    use object_store::memory::InMemory;

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

    /// What a write of `location` through `storage` syncs.
    fn synced(storage: &LakeStorage, location: &str) -> Vec<PathBuf> {
        storage
            .local
            .as_ref()
            .map(|local| local.paths(&[storage.path(location).unwrap()]))
            .unwrap_or_default()
    }

    fn paths(paths: &[&str]) -> Vec<PathBuf> {
        paths.iter().map(PathBuf::from).collect()
    }

    #[test]
    fn a_local_write_syncs_the_file_and_its_directories_up_to_the_warehouse() {
        let dir = tempfile::tempdir().unwrap();
        let w = dir.path().display().to_string();
        let file = format!("{w}/db/t/data/bucket=0/a.parquet");
        let up_to_warehouse = paths(&[
            &file,
            &format!("{w}/db/t/data/bucket=0"),
            &format!("{w}/db/t/data"),
            &format!("{w}/db/t"),
            &format!("{w}/db"),
            &w,
        ]);
        let rooted = LakeStorage::local(&w).unwrap();
        assert_eq!(synced(&rooted, &file), up_to_warehouse);
        assert_eq!(synced(&rooted, &format!("file://{file}")), up_to_warehouse);

        let whole = || LakeStorage::new(Arc::new(LocalFileSystem::new()), "");
        let knowing = whole().with_warehouse(format!("{w}/"));
        assert_eq!(synced(&knowing, &file), up_to_warehouse);
        // The embedded lake (every commit test's) knows its warehouse.
        let embedded = crate::LakeConfig::embedded(dir.path()).unwrap();
        let lake_file = format!("{}/db/t/data/a.parquet", embedded.warehouse);
        let lake_synced = synced(&embedded.storage, &lake_file);
        assert_eq!(
            lake_synced.last(),
            Some(&PathBuf::from(&embedded.warehouse))
        );
        assert_eq!(lake_synced.len(), 5);
        // Outside the warehouse, or with no warehouse known: the parent only.
        let parent_only = paths(&[&file, &format!("{w}/db/t/data/bucket=0")]);
        assert_eq!(synced(&whole(), &file), parent_only);
        let elsewhere = whole().with_warehouse(format!("{w}/other"));
        assert_eq!(synced(&elsewhere, &file), parent_only);

        let s3 = LakeStorage::new(Arc::new(InMemory::new()), "s3://bucket/")
            .with_warehouse("s3://bucket/w");
        assert!(synced(&s3, "s3://bucket/w/db/t/data/a.parquet").is_empty());
    }

    #[tokio::test]
    async fn writes_through_a_local_storage_are_synced_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let w = dir.path().display().to_string();
        let whole = LakeStorage::new(Arc::new(LocalFileSystem::new()), "").with_warehouse(&w);
        for storage in [LakeStorage::local(&w).unwrap(), whole] {
            assert!(storage.local.is_some());
            // `~` is stored percent-encoded: the synced path is the one the store wrote.
            let put = format!("{w}/db/t/metadata/v~1.json");
            Storage::write(&storage, &put, Bytes::from_static(b"{}"))
                .await
                .unwrap();
            assert_eq!(Storage::read(&storage, &put).await.unwrap(), "{}");

            let streamed = format!("{w}/db/t/data/bucket=0/a.parquet");
            let mut writer = storage.writer(&streamed).await.unwrap();
            writer.write(Bytes::from_static(b"PAR1")).await.unwrap();
            writer.close().await.unwrap();
            assert_eq!(Storage::read(&storage, &streamed).await.unwrap(), "PAR1");
            storage.delete_prefix(&format!("{w}/db")).await.unwrap();
        }
    }

    #[tokio::test]
    async fn a_sync_of_a_missing_file_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let storage = LakeStorage::local(&dir.path().display().to_string()).unwrap();
        let local = storage.local.as_ref().unwrap();
        let missing = StorePath::from("db/t/data/gone.parquet");
        let error = local
            .sync(std::slice::from_ref(&missing), Missing::Fails)
            .await
            .unwrap_err();
        let path = dir.path().join("db/t/data/gone.parquet");
        assert!(
            error
                .to_string()
                .contains(&format!("syncing lake file {}", path.display())),
            "{error}"
        );
        // Another engine's commit may name a file that is not there: nothing to sync.
        let location = path.display().to_string();
        storage.sync_files(&[location.as_str()]).await.unwrap();
    }

    #[tokio::test]
    async fn files_synced_together_sync_each_directory_once() {
        let dir = tempfile::tempdir().unwrap();
        let w = dir.path().display().to_string();
        let storage = LakeStorage::local(&w).unwrap();
        let files = [
            format!("{w}/db/t/data/bucket=0/a.parquet"),
            format!("{w}/db/t/data/bucket=1/b.parquet"),
            format!("{w}/db/t/metadata/snap-1.avro"),
        ];
        let store_paths: Vec<StorePath> = files.iter().map(|f| storage.path(f).unwrap()).collect();
        let synced = storage.local.as_ref().unwrap().paths(&store_paths);
        let expected = paths(&[
            &files[0],
            &files[1],
            &files[2],
            &format!("{w}/db/t/data/bucket=0"),
            &format!("{w}/db/t/data"),
            &format!("{w}/db/t"),
            &format!("{w}/db"),
            &w,
            &format!("{w}/db/t/data/bucket=1"),
            &format!("{w}/db/t/metadata"),
        ]);
        assert_eq!(synced, expected);
        for file in &files {
            Storage::write(&storage, file, Bytes::from_static(b"x"))
                .await
                .unwrap();
        }
        let locations: Vec<&str> = files.iter().map(String::as_str).collect();
        storage.sync_files(&locations).await.unwrap();
        let s3 = LakeStorage::new(Arc::new(InMemory::new()), "s3://bucket/");
        s3.sync_files(&["s3://bucket/w/a.parquet"]).await.unwrap();
    }
}
