//! What the sessions of one process share: DataFusion's runtime, with one memory pool
//! and the lake's object store only.
//!
//! A server runs many sessions (Flight SQL makes one per call), and they all draw on one
//! [`FairSpillPool`] of `--sql-memory-limit` bytes (default: half the machine's memory),
//! [`memory_pool`]; `mink server` hands the same pool to its node, whose union reads hold
//! their log ranges in it. A query that needs more than the pool can give fails alone,
//! with DataFusion's `ResourcesExhausted` error; the node and the other sessions go on.
//!
//! Why a fair pool rather than a greedy one: with [`GreedyMemoryPool`] the first big
//! consumer may take the whole pool, and then a small sort in another session fails.
//! The fair pool caps every operator that can spill (sorts, grouped aggregates, sort-merge
//! joins) at an equal share of what the unspillable ones leave, so those spill instead of
//! starving each other; what cannot spill (a hash join's build side, a single-group
//! aggregate's state) is granted first come, first served, and fails when the pool is
//! full. The pool is wrapped in a [`TrackConsumersPool`], so the error names the largest
//! consumers.
//!
//! [`GreedyMemoryPool`]: datafusion::execution::memory_pool::GreedyMemoryPool
//!
//! The object-store registry holds the lake's store and nothing else: DataFusion's
//! default registry would map `file://` to the whole local file system. mink reads lake
//! files through [`LakeStorage`] itself; the registry is there for DataFusion, and a
//! local lake's store there is rooted at the warehouse. A local `mink sql` session keeps
//! DataFusion's registry, over its user's own files ([`FileAccess::Local`]).

use std::num::NonZeroUsize;
use std::sync::Arc;

use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::{FairSpillPool, MemoryPool, TrackConsumersPool};
use datafusion::execution::object_store::{
    DefaultObjectStoreRegistry, ObjectStoreRegistry, ObjectStoreUrl,
};
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use mink_lake::storage::LakeStorage;

use super::guard::FileAccess;
use crate::distributed::Distribution;

/// The memory limit when none is given and the machine's memory is unknown: 4 GiB.
const FALLBACK_MEMORY_LIMIT: usize = 4 << 30;

/// The runtime the sessions of one process share (see the module docs). Clones share
/// the pool.
#[derive(Debug, Clone)]
pub struct SqlRuntime {
    runtime: Arc<RuntimeEnv>,
    files: FileAccess,
    distribution: Option<Distribution>,
    target_partitions: Option<usize>,
}

impl SqlRuntime {
    /// The runtime of a server's sessions: every statement in `pool` (a
    /// [`memory_pool`]), the store of `storage` as the only object store, statements
    /// that touch files refused.
    ///
    /// # Errors
    /// DataFusion could not build the runtime.
    pub fn server(pool: Arc<dyn MemoryPool>, storage: &LakeStorage) -> Result<Self> {
        let registry = DefaultObjectStoreRegistry::new();
        let file = ObjectStoreUrl::local_filesystem();
        // The whole file system DataFusion registers by default.
        registry.deregister_store(file.as_ref())?;
        if let Some(url) = store_url(storage.url_prefix())? {
            let store = storage
                .store()
                .map_err(|e| DataFusionError::External(Box::new(e)))?;
            registry.register_store(url.as_ref(), store);
        }
        let runtime = RuntimeEnvBuilder::new()
            .with_memory_pool(pool)
            .with_object_store_registry(Arc::new(registry))
            .build_arc()?;
        Ok(Self {
            runtime,
            files: FileAccess::Refused,
            distribution: None,
            target_partitions: None,
        })
    }

    /// The runtime of a local `mink sql`: one pool of `memory_limit` bytes, and
    /// DataFusion's statements over this machine's files (`COPY`, `CREATE EXTERNAL
    /// TABLE`) allowed, as its user's own.
    ///
    /// # Errors
    /// DataFusion could not build the runtime.
    pub fn local(memory_limit: usize) -> Result<Self> {
        let runtime = RuntimeEnvBuilder::new().with_memory_pool(memory_pool(memory_limit));
        Ok(Self {
            runtime: runtime.build_arc()?,
            files: FileAccess::Local,
            distribution: None,
            target_partitions: None,
        })
    }

    /// The same runtime, its sessions' statements run on `distribution`'s workers when
    /// they are worth it ([`crate::distributed`]).
    #[must_use]
    pub fn with_distribution(mut self, distribution: Distribution) -> Self {
        self.distribution = Some(distribution);
        self
    }

    /// The same runtime, its sessions planning `partitions` partitions per scan and
    /// exchange instead of one per core: a plan the same on every machine (the
    /// sqllogictest files assert plans).
    #[must_use]
    pub fn with_target_partitions(mut self, partitions: usize) -> Self {
        self.target_partitions = Some(partitions.max(1));
        self
    }

    /// The partitions a session plans, when not one per core.
    pub fn target_partitions(&self) -> Option<usize> {
        self.target_partitions
    }

    /// The workers the sessions' statements run on, if any.
    pub fn distribution(&self) -> Option<&Distribution> {
        self.distribution.as_ref()
    }

    /// DataFusion's runtime.
    pub fn runtime_env(&self) -> &Arc<RuntimeEnv> {
        &self.runtime
    }

    /// Whether the sessions' SQL may touch this machine's files.
    pub fn file_access(&self) -> FileAccess {
        self.files
    }
}

/// The memory pool of a process's SQL (see the module docs): `memory_limit` bytes, fair
/// between spilling operators, its errors naming the five largest consumers.
pub fn memory_pool(memory_limit: usize) -> Arc<dyn MemoryPool> {
    let top = NonZeroUsize::new(5).unwrap_or(NonZeroUsize::MIN);
    Arc::new(TrackConsumersPool::new(
        FairSpillPool::new(memory_limit),
        top,
    ))
}

/// The URL DataFusion would look the lake's store up by: `file:///` for a local store
/// rooted at its warehouse, `s3://bucket/` for S3; none for a store over the whole local
/// file system, which is not registered.
fn store_url(url_prefix: &str) -> Result<Option<ObjectStoreUrl>> {
    if url_prefix.is_empty() {
        return Ok(None);
    }
    if url_prefix.starts_with('/') {
        return Ok(Some(ObjectStoreUrl::local_filesystem()));
    }
    let authority = url_prefix
        .split_once("://")
        .map(|(scheme, rest)| (scheme, rest.split('/').next().unwrap_or_default()));
    match authority {
        Some((scheme, host)) if !host.is_empty() => {
            ObjectStoreUrl::parse(format!("{scheme}://{host}")).map(Some)
        }
        _ => Err(DataFusionError::Configuration(format!(
            "the lake's store prefix {url_prefix} is not a URL"
        ))),
    }
}

/// The default `--sql-memory-limit`: half the machine's memory (from `/proc/meminfo`),
/// else 4 GiB.
pub fn default_memory_limit() -> usize {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|meminfo| mem_total(&meminfo))
        .map_or(FALLBACK_MEMORY_LIMIT, |total| total / 2)
}

/// `MemTotal` of a `/proc/meminfo`, in bytes.
fn mem_total(meminfo: &str) -> Option<usize> {
    let line = meminfo.lines().find(|line| line.starts_with("MemTotal:"))?;
    let mut words = line["MemTotal:".len()..].split_whitespace();
    let number: usize = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => number.checked_mul(1024),
        None => Some(number),
        Some(_) => None,
    }
}

/// A size as given on the command line: bytes (`1073741824`), or a number with a unit,
/// binary (`KiB`, `MiB`, `GiB`, `TiB`; `K`, `M`, `G`, `T` alike) or decimal (`KB`, `MB`,
/// `GB`, `TB`), case-insensitive, fractions allowed (`1.5GiB`).
///
/// # Errors
/// A message saying what is wrong, for the command line's usage error.
pub fn parse_size(text: &str) -> Result<usize, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let usage = || {
        format!(
            "'{text}' is not a size: give bytes (1073741824) or a number and a unit (512MiB, 2GiB)"
        )
    };
    let number: f64 = number.parse().map_err(|_| usage())?;
    let multiplier: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024.0 * 1024.0,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => return Err(usage()),
    };
    let bytes = (number * multiplier).round();
    if !(1.0..usize::MAX as f64).contains(&bytes) {
        return Err(format!("'{text}' is not a size of at least one byte"));
    }
    Ok(bytes as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_bytes_and_units() {
        for (text, bytes) in [
            ("1073741824", 1 << 30),
            ("512MiB", 512 << 20),
            ("512mib", 512 << 20),
            ("2GiB", 2 << 30),
            ("2G", 2 << 30),
            ("16M", 16 << 20),
            ("1.5GiB", 3 << 29),
            ("64KiB", 64 << 10),
            ("1TiB", 1 << 40),
            ("1GB", 1_000_000_000),
            ("100 MB", 100_000_000),
            ("10b", 10),
        ] {
            assert_eq!(parse_size(text), Ok(bytes), "{text}");
        }
        for text in ["", "MiB", "-1GiB", "0", "1.2.3G", "12 parsecs", "0.1"] {
            assert!(parse_size(text).is_err(), "{text}");
        }
    }

    #[test]
    fn the_default_is_half_the_memory_total() {
        let meminfo = "MemTotal:       16318412 kB\nMemFree:         1000 kB\n";
        assert_eq!(mem_total(meminfo), Some(16318412 * 1024));
        assert_eq!(mem_total("MemFree: 1 kB\n"), None);
        assert_eq!(mem_total("MemTotal: lots\n"), None);
        assert!(default_memory_limit() > 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_query_over_the_pool_fails_alone() {
        use datafusion::prelude::{SessionConfig, SessionContext};

        let runtime = SqlRuntime::local(16 << 20).unwrap();
        let session = || {
            SessionContext::new_with_config_rt(
                SessionConfig::new(),
                Arc::clone(runtime.runtime_env()),
            )
        };
        let big = session()
            .sql("SELECT array_length(array_agg(i)) FROM generate_series(1, 20000000) t(i)")
            .await
            .unwrap();
        let small = session()
            .sql("SELECT count(*) FROM generate_series(1, 1000) t(i)")
            .await
            .unwrap();
        let (big, small) = tokio::join!(big.collect(), small.collect());
        let error = big.expect_err("over the pool");
        assert!(
            matches!(error.find_root(), DataFusionError::ResourcesExhausted(_)),
            "{error}"
        );
        assert_eq!(small.unwrap()[0].num_rows(), 1);
        // The pool is whole again for the next query.
        let after = session().sql("SELECT 1").await.unwrap().collect().await;
        assert_eq!(after.unwrap()[0].num_rows(), 1);
    }

    #[test]
    fn the_registry_holds_the_lake_s_store_only() {
        assert_eq!(store_url("").unwrap(), None);
        assert_eq!(
            store_url("/data/lake/warehouse/")
                .unwrap()
                .unwrap()
                .as_str(),
            "file:///"
        );
        assert_eq!(
            store_url("s3://bucket/").unwrap().unwrap().as_str(),
            "s3://bucket/"
        );
        assert!(store_url("bucket").is_err());

        let whole = LakeStorage::new(Arc::new(object_store::local::LocalFileSystem::new()), "");
        let runtime = SqlRuntime::server(memory_pool(1 << 20), &whole).unwrap();
        let file = ObjectStoreUrl::local_filesystem();
        assert!(runtime.runtime_env().object_store(&file).is_err());
        assert_eq!(runtime.file_access(), FileAccess::Refused);

        let dir = tempfile::tempdir().unwrap();
        let rooted = LakeStorage::local(&dir.path().display().to_string()).unwrap();
        let runtime = SqlRuntime::server(memory_pool(1 << 20), &rooted).unwrap();
        assert!(runtime.runtime_env().object_store(&file).is_ok());
        assert!(matches!(
            runtime.runtime_env().memory_pool.memory_limit(),
            datafusion::execution::memory_pool::MemoryLimit::Finite(limit) if limit == 1 << 20
        ));
        assert_eq!(
            SqlRuntime::local(1 << 20).unwrap().file_access(),
            FileAccess::Local
        );
    }
}
