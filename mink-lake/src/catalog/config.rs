//! Where a lake lives: its catalog (a SQL catalog's database, or an Iceberg REST catalog)
//! and its warehouse (a local directory, or S3), and how a data directory remembers them.
//!
//! A server started with `--lake-catalog` or `--lake-warehouse` writes its choice to
//! `<data-dir>/lake/catalog.json`; every later process on that data directory (a restart
//! without the flags, `mink sql --data-dir`, `mink load --data-dir`) opens the same lake.
//! A different choice for a data directory that remembers one is refused: the tables'
//! tiered offsets live in the remembered catalog, and a silent switch would tier everything
//! again into another.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use object_store::ObjectStore;
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use serde::{Deserialize, Serialize};

use crate::error::{LakeError, Result};
use crate::storage::LakeStorage;

/// The prefix of a REST catalog's `--lake-catalog` (`rest:https://host/path`).
pub const REST_CATALOG_PREFIX: &str = "rest:";

/// The environment variable holding a REST catalog's `client_id:secret` (its OAuth2 client
/// credentials), never written to the data directory.
pub const CATALOG_CREDENTIAL_ENV: &str = "MINK_LAKE_CATALOG_CREDENTIAL";

/// The environment variable naming a PEM file of certificate authorities to trust for an
/// `https://` REST catalog, beside the machine's own roots (a catalog whose certificate a
/// private authority signed, such as another mink's `--sql-tls-cert`).
pub const CATALOG_CA_ENV: &str = "MINK_LAKE_CATALOG_CA";

/// The file of a data directory remembering its lake.
const REMEMBERED: &str = "catalog.json";

/// Where the lake lives.
#[derive(Debug, Clone)]
pub struct LakeConfig {
    /// The catalog: a SQL catalog's database URL (`sqlite:PATH?mode=rwc`), or
    /// `rest:URL` for an Iceberg REST catalog.
    pub catalog_uri: String,
    /// The warehouse location (an absolute path, or a URL of the store).
    pub warehouse: String,
    /// The store holding the warehouse.
    pub storage: LakeStorage,
}

/// A data directory's lake as `<data-dir>/lake/catalog.json` remembers it.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Remembered {
    catalog: String,
    warehouse: String,
}

impl LakeConfig {
    /// The embedded lake of a data directory: `<data-dir>/lake/{catalog.db,warehouse}`.
    /// The directories are created durably (each parent that gained one fsynced): the
    /// catalog and every file of the warehouse are found in them after a power cut.
    pub fn embedded(data_dir: &Path) -> Result<Self> {
        let lake_dir = lake_dir(data_dir)?;
        let warehouse = lake_dir.join("warehouse");
        mink_durable::create_dir_all(&warehouse).map_err(|e| LakeError::Config(e.to_string()))?;
        Self::local(
            &warehouse.display().to_string(),
            format!("sqlite:{}?mode=rwc", lake_dir.join("catalog.db").display()),
        )
    }

    /// A warehouse in a local directory (an absolute path, as the catalog's locations are
    /// written) with the catalog at `catalog_uri`.
    ///
    /// # Errors
    /// [`LakeError::Config`] for a relative path.
    pub fn local(warehouse: &str, catalog_uri: String) -> Result<Self> {
        if !warehouse.starts_with('/') {
            return Err(LakeError::Config(format!(
                "warehouse '{warehouse}' is neither an absolute path nor an s3://bucket/... URL"
            )));
        }
        let warehouse = warehouse.trim_end_matches('/').to_string();
        let store: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new());
        Ok(Self {
            catalog_uri,
            // Knowing its warehouse, the storage syncs every directory up to it after a write.
            storage: LakeStorage::new(store, "").with_warehouse(warehouse.clone()),
            warehouse,
        })
    }

    /// The lake of a data directory: the one it remembers, else the embedded one.
    ///
    /// # Errors
    /// [`LakeError::Config`] when the remembered file cannot be read or names a lake that
    /// cannot be configured.
    pub fn of_data_dir(data_dir: &Path) -> Result<Self> {
        match remembered(data_dir)? {
            Some(lake) => Self::named(lake.catalog, &lake.warehouse),
            None => Self::embedded(data_dir),
        }
    }

    /// The lake `catalog` and `warehouse` name (each `None`: the embedded default), for a
    /// server on `data_dir`: with neither, the lake the data directory remembers (or the
    /// embedded one); with either, that lake, which the server remembers once it opened it
    /// ([`LakeConfig::remember`]).
    ///
    /// # Errors
    /// [`LakeError::Config`] for a lake that cannot be configured (a REST catalog without a
    /// warehouse, a warehouse that is neither an absolute path nor `s3://bucket/...`), or
    /// one other than the lake the data directory remembers.
    pub fn chosen(
        data_dir: &Path,
        catalog: Option<String>,
        warehouse: Option<String>,
    ) -> Result<Self> {
        if catalog.is_none() && warehouse.is_none() {
            return Self::of_data_dir(data_dir);
        }
        // The embedded defaults (creating the embedded warehouse) only for what is not given.
        let catalog = match catalog {
            Some(catalog) => catalog,
            None => Self::embedded(data_dir)?.catalog_uri,
        };
        let warehouse = match warehouse {
            Some(warehouse) => warehouse,
            None if catalog.starts_with(REST_CATALOG_PREFIX) => {
                return Err(LakeError::Config(format!(
                    "the REST catalog {catalog} needs --lake-warehouse: where its tables' \
                     files are, as this machine reaches them (s3://bucket/prefix, or a local \
                     path)"
                )));
            }
            None => Self::embedded(data_dir)?.warehouse,
        };
        let config = Self::named(catalog, &warehouse)?;
        match remembered(data_dir)? {
            Some(earlier) if earlier != config.remembered() => Err(LakeError::Config(format!(
                "this data directory's lake is the catalog {} with the warehouse {} \
                 (remembered in {}): its tiered offsets live there, so it is not switched to \
                 {} with {}; move that file away to start a new lake",
                earlier.catalog,
                earlier.warehouse,
                remembered_path(data_dir)?.display(),
                config.catalog_uri,
                config.warehouse
            ))),
            _ => Ok(config),
        }
    }

    /// The lake of a cluster's node on `data_dir`: every node commits to one catalog and
    /// reads every table's files, so the catalog is `catalog`, else the one the data
    /// directory remembers, else the cluster's (`cluster_catalog`, in its etcd), and the
    /// warehouse `warehouse` or the remembered one, which every node reaches. Checked
    /// against the remembered lake as [`LakeConfig::chosen`] checks.
    ///
    /// # Errors
    /// [`LakeError::Config`] without a warehouse, for a SQLite catalog (one node's), or as
    /// [`LakeConfig::chosen`].
    pub fn of_cluster_node(
        data_dir: &Path,
        catalog: Option<String>,
        warehouse: Option<String>,
        cluster_catalog: String,
    ) -> Result<Self> {
        let earlier = remembered(data_dir)?;
        let catalog = (catalog.or_else(|| earlier.as_ref().map(|lake| lake.catalog.clone())))
            .unwrap_or(cluster_catalog);
        if catalog.starts_with("sqlite:") {
            return Err(LakeError::Config(format!(
                "the lake catalog {catalog} is one node's file: a cluster's nodes share one                  catalog, in etcd (the default) or an Iceberg REST catalog (rest:URL)"
            )));
        }
        let warehouse = warehouse
            .or_else(|| earlier.map(|lake| lake.warehouse))
            .ok_or_else(|| {
                LakeError::Config(
                    "a cluster's lake needs --lake-warehouse: where its tables' files are,                      which every node reaches (s3://bucket/prefix, or a path every node                      mounts)"
                        .into(),
                )
            })?;
        Self::chosen(data_dir, Some(catalog), Some(warehouse))
    }

    /// Makes `data_dir` remember this lake, unless it remembers one already (see
    /// [`LakeConfig::chosen`]), so later processes on it open the same lake.
    ///
    /// # Errors
    /// [`LakeError::Config`] when the file cannot be written.
    pub fn remember(&self, data_dir: &Path) -> Result<()> {
        match remembered(data_dir)? {
            Some(_) => Ok(()),
            None => remember(data_dir, &self.remembered()),
        }
    }

    fn remembered(&self) -> Remembered {
        Remembered {
            catalog: self.catalog_uri.clone(),
            warehouse: self.warehouse.clone(),
        }
    }

    /// The lake of `catalog` with `warehouse` (`s3://...` or an absolute path).
    fn named(catalog: String, warehouse: &str) -> Result<Self> {
        match warehouse.starts_with("s3://") {
            true => Self::s3(warehouse, catalog, S3Options::default()),
            false => Self::local(warehouse, catalog),
        }
    }

    /// The REST catalog's URL, for a `rest:` catalog.
    pub(crate) fn rest_uri(&self) -> Option<&str> {
        self.catalog_uri.strip_prefix(REST_CATALOG_PREFIX)
    }

    /// Creates a warehouse on the local file system if it is missing, durably (each parent
    /// that gained a directory fsynced): the lake's storage syncs the directories from a
    /// file it writes up to the warehouse, not the warehouse's own entry in its parent.
    /// Nothing to do for a warehouse on S3.
    ///
    /// # Errors
    /// [`LakeError::Config`] when a directory cannot be created or synced.
    pub(crate) fn create_local_warehouse(&self) -> Result<()> {
        match self.warehouse.starts_with('/') {
            true => mink_durable::create_dir_all(Path::new(&self.warehouse))
                .map_err(|e| LakeError::Config(format!("the lake warehouse: {e}"))),
            false => Ok(()),
        }
    }
}

fn lake_dir(data_dir: &Path) -> Result<PathBuf> {
    std::path::absolute(data_dir.join("lake"))
        .map_err(|e| LakeError::Config(format!("data directory {}: {e}", data_dir.display())))
}

fn remembered_path(data_dir: &Path) -> Result<PathBuf> {
    Ok(lake_dir(data_dir)?.join(REMEMBERED))
}

/// The lake `data_dir` remembers, if any.
fn remembered(data_dir: &Path) -> Result<Option<Remembered>> {
    let path = remembered_path(data_dir)?;
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(LakeError::Config(format!(
                "reading {}: {e}",
                path.display()
            )));
        }
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| LakeError::Config(format!("{}: {e}", path.display())))
}

/// Writes `lake` to `data_dir`'s remembered file, durably
/// ([`mink_durable::write_atomically`], its directory created durably first).
fn remember(data_dir: &Path, lake: &Remembered) -> Result<()> {
    let path = remembered_path(data_dir)?;
    let write = || -> std::io::Result<()> {
        mink_durable::create_dir_all(path.parent().unwrap_or(Path::new("/")))?;
        let bytes = serde_json::to_vec_pretty(lake).map_err(std::io::Error::other)?;
        mink_durable::write_atomically(&path, &bytes)
    };
    write().map_err(|e| LakeError::Config(format!("writing {}: {e}", path.display())))
}

/// How to reach an S3 (or S3-compatible) warehouse. Unset fields come from the
/// environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`,
/// `AWS_ENDPOINT_URL`, `AWS_ALLOW_HTTP`, ...), as the AWS tools read them.
#[derive(Debug, Clone, Default)]
pub struct S3Options {
    /// The endpoint of an S3-compatible server (`http://127.0.0.1:9000`).
    pub endpoint: Option<String>,
    /// The region.
    pub region: Option<String>,
    /// The access key id.
    pub access_key_id: Option<String>,
    /// The secret access key.
    pub secret_access_key: Option<String>,
}

impl LakeConfig {
    /// A warehouse on S3 (`s3://bucket/prefix`) with the catalog at `catalog_uri`.
    ///
    /// # Errors
    /// [`LakeError::Config`] for a warehouse that is not an `s3://bucket/...` URL.
    pub fn s3(warehouse: &str, catalog_uri: String, options: S3Options) -> Result<Self> {
        let bucket = warehouse
            .strip_prefix("s3://")
            .and_then(|rest| rest.split('/').next())
            .filter(|bucket| !bucket.is_empty())
            .ok_or_else(|| {
                LakeError::Config(format!(
                    "warehouse '{warehouse}' is not an s3://bucket/... URL"
                ))
            })?;
        let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
        if let Some(endpoint) = options.endpoint {
            builder = builder
                .with_allow_http(endpoint.starts_with("http://"))
                .with_endpoint(endpoint);
        }
        if let Some(region) = options.region {
            builder = builder.with_region(region);
        }
        if let Some(key) = options.access_key_id {
            builder = builder.with_access_key_id(key);
        }
        if let Some(secret) = options.secret_access_key {
            builder = builder.with_secret_access_key(secret);
        }
        let store: Arc<dyn ObjectStore> = Arc::new(builder.build()?);
        Ok(Self {
            catalog_uri,
            warehouse: warehouse.trim_end_matches('/').to_string(),
            storage: LakeStorage::new(store, format!("s3://{bucket}/")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_data_dir_remembers_its_lake_and_refuses_another() {
        let dir = tempfile::tempdir().unwrap();
        let other = tempfile::tempdir().unwrap();
        let other_warehouse = other.path().display().to_string();
        let embedded = LakeConfig::of_data_dir(dir.path()).unwrap();
        assert!(embedded.catalog_uri.starts_with("sqlite:"));

        let rest = "rest:http://127.0.0.1:1".to_string();
        let error = LakeConfig::chosen(dir.path(), Some(rest.clone()), None).unwrap_err();
        assert!(
            error.to_string().contains("needs --lake-warehouse"),
            "{error}"
        );

        let chosen = LakeConfig::chosen(
            dir.path(),
            Some(rest.clone()),
            Some(other_warehouse.clone()),
        )
        .unwrap();
        assert_eq!(chosen.rest_uri(), Some("http://127.0.0.1:1"));
        // Chosen is not remembered until the server opened it.
        assert!(
            LakeConfig::of_data_dir(dir.path())
                .unwrap()
                .rest_uri()
                .is_none()
        );
        chosen.remember(dir.path()).unwrap();
        // Later processes on the data directory open the same lake without the flags.
        let later = LakeConfig::of_data_dir(dir.path()).unwrap();
        assert_eq!(
            (later.catalog_uri.as_str(), later.warehouse.as_str()),
            (rest.as_str(), other_warehouse.as_str())
        );
        let again = LakeConfig::chosen(dir.path(), None, None).unwrap();
        assert_eq!(again.catalog_uri, rest);

        let error =
            LakeConfig::chosen(dir.path(), None, Some("s3://bucket/lake".into())).unwrap_err();
        assert!(error.to_string().contains("remembered in"), "{error}");
        let error =
            LakeConfig::chosen(dir.path(), Some(rest), Some("relative/path".into())).unwrap_err();
        assert!(error.to_string().contains("absolute path"), "{error}");
    }
}
