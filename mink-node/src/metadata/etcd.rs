//! The tables and lake records of a cluster in etcd, which every node reads and changes.
//!
//! Layout under the cluster's prefix (ids in 20 digits, so keys sort as numbers):
//!
//! ```text
//! <prefix>/ids/table                        the last table id given
//! <prefix>/ids/partition                    the last partition id given
//! <prefix>/tables/<table_id>                a table's descriptor (TableDescriptorProto)
//! <prefix>/names/<database>/<name>          the id of the table at that path
//! <prefix>/partitions/<table_id>/<name>     a partition's id
//! <prefix>/lake/<table_id>/snapshots/<id>   a recorded lake snapshot (in order of creation)
//! <prefix>/lake/<table_id>/pending/<node>   the tiering round that node has pending
//! ```
//!
//! Every change is one etcd transaction whose compares say what it was decided on: an
//! id is given by moving its counter from the value read (a transaction that finds the
//! counter moved reads it again), a table is created only if its path is free, and
//! changed or dropped only if it is still the table read. So two nodes creating tables
//! at once get distinct ids, and a table never holds half of a change.
//!
//! **Pending rounds are each node's own.** Any node may run a table's tiering round (one
//! at a time leads them, see `Node::runs_rounds_of`, but a move of that role can overlap
//! a round), and a round's reconcile deletes the files of the pending round it finds
//! uncommitted: it must only ever find its own node's, never a round another node is
//! still writing, which would then commit a snapshot of deleted files. The files of
//! another node's round that never committed are left to orphan removal (past its grace
//! period).
//!
//! etcd refuses a request over 1.5 MiB (`--max-request-bytes`); a value over
//! [`MAX_VALUE_BYTES`] is refused here, with its size, before it is sent.

use std::future::Future;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, DeleteOptions, GetOptions, KvClient, SortOrder,
    SortTarget, Txn, TxnOp,
};
use mink_core::protocol::{TableDescriptorProto, decode};
use mink_core::table::{TableDescriptor, TablePath};
use prost::Message as _;

use super::{LakeMetadata, LakeSnapshotRecord, PartitionRecord, PendingRound, TableMetadata};
use crate::error::{NodeError, Result};

/// The largest value written: etcd's default request limit is 1.5 MiB, for the whole
/// transaction.
const MAX_VALUE_BYTES: usize = 1 << 20;

/// How long connecting to etcd may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Most times a change is tried again after another node's change moved what it read.
const ATTEMPTS: usize = 64;

/// The metadata store of a cluster, in etcd.
pub struct EtcdMetadata {
    kv: KvClient,
    prefix: String,
    /// The node this store serves: its pending tiering rounds are its own.
    node_id: String,
    /// Where requests run: callers block on them (the node's metadata calls are
    /// synchronous, as SQLite's are).
    runtime: Option<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for EtcdMetadata {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdMetadata")
            .field("prefix", &self.prefix)
            .field("node_id", &self.node_id)
            .finish_non_exhaustive()
    }
}

/// A counter of ids, and the revision it was read at (0: never written).
struct Counter {
    last: i64,
    mod_revision: i64,
}

impl EtcdMetadata {
    /// Connects to etcd at `endpoints` (`host:port` each) and keeps the metadata under
    /// `prefix` (`/mink`, say: several clusters may share one etcd), for node `node_id`.
    ///
    /// # Errors
    /// etcd could not be reached.
    pub fn connect(endpoints: &[String], prefix: &str, node_id: &str) -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("mink-etcd")
            .enable_all()
            .build()?;
        let options = ConnectOptions::new()
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_timeout(REQUEST_TIMEOUT);
        let endpoints = endpoints.to_vec();
        let mut kv = wait(&runtime, async move {
            Ok(Client::connect(endpoints, Some(options)).await?.kv_client())
        })?;
        let metadata = Self {
            kv: kv.clone(),
            prefix: prefix.trim_end_matches('/').to_string(),
            node_id: node_id.to_string(),
            runtime: Some(runtime),
        };
        // The client connects lazily: a first read says whether etcd answers.
        let key = metadata.key(&["ids", "table"]);
        metadata.run(async move { kv.get(key, None).await })?;
        Ok(metadata)
    }

    fn key(&self, parts: &[&str]) -> String {
        let mut key = self.prefix.clone();
        for part in parts {
            key.push('/');
            key.push_str(part);
        }
        key
    }

    fn table_key(&self, table_id: u64) -> String {
        self.key(&["tables", &id_name(table_id as i64)])
    }

    fn name_key(&self, path: &TablePath) -> String {
        self.key(&["names", &path.database, &path.name])
    }

    /// The prefix of a table's partitions, or of its lake records.
    fn table_prefix(&self, kind: &str, table_id: u64) -> String {
        self.key(&[kind, &id_name(table_id as i64), ""])
    }

    fn snapshot_key(&self, table_id: u64, snapshot_id: i64) -> String {
        let snapshots = self.table_prefix("lake", table_id) + "snapshots/";
        format!("{snapshots}{snapshot_id}")
    }

    fn pending_key(&self, table_id: u64) -> String {
        self.table_prefix("lake", table_id) + "pending/" + &self.node_id
    }

    /// Runs `request` on the store's runtime and waits for it.
    fn run<T: Send + 'static>(
        &self,
        request: impl Future<Output = Result<T, etcd_client::Error>> + Send + 'static,
    ) -> Result<T> {
        let runtime = self
            .runtime
            .as_ref()
            .ok_or_else(|| NodeError::ShuttingDown("the cluster metadata".into()))?;
        wait(runtime, async move { Ok(request.await?) })
    }

    fn get(&self, key: String, options: Option<GetOptions>) -> Result<Vec<(String, Vec<u8>)>> {
        let mut kv = self.kv.clone();
        let response = self.run(async move { kv.get(key, options).await })?;
        Ok((response.kvs().iter())
            .map(|kv| {
                let key = String::from_utf8_lossy(kv.key()).into_owned();
                (key, kv.value().to_vec())
            })
            .collect())
    }

    fn get_one(&self, key: String) -> Result<Option<Vec<u8>>> {
        Ok(self
            .get(key, None)?
            .into_iter()
            .next()
            .map(|(_, value)| value))
    }

    /// Runs `txn`; whether its compares held.
    fn txn(&self, txn: Txn) -> Result<bool> {
        let mut kv = self.kv.clone();
        Ok(self.run(async move { kv.txn(txn).await })?.succeeded())
    }

    fn counter(&self, kind: &str) -> Result<Counter> {
        let key = self.key(&["ids", kind]);
        let mut kv = self.kv.clone();
        let response = self.run(async move { kv.get(key, None).await })?;
        match response.kvs().first() {
            None => Ok(Counter {
                last: 0,
                mod_revision: 0,
            }),
            Some(kv) => Ok(Counter {
                last: parse_id(kv.value())?,
                mod_revision: kv.mod_revision(),
            }),
        }
    }

    /// The compare that `counter` is still as read, and the put that moves it to `id`.
    fn take_id(&self, kind: &str, counter: &Counter, id: i64) -> (Compare, TxnOp) {
        let key = self.key(&["ids", kind]);
        let unchanged = Compare::mod_revision(key.clone(), CompareOp::Equal, counter.mod_revision);
        (unchanged, TxnOp::put(key, id.to_string(), None))
    }
}

impl Drop for EtcdMetadata {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Runs `work` on `runtime` and blocks until it ends (from any thread, a runtime's
/// included: the wait is not tokio's).
fn wait<T: Send + 'static>(
    runtime: &tokio::runtime::Runtime,
    work: impl Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    let (outcome, waiting) = std::sync::mpsc::sync_channel(1);
    runtime.spawn(async move {
        let _ = outcome.send(work.await);
    });
    waiting
        .recv()
        .map_err(|_| NodeError::ShuttingDown("the cluster metadata".into()))?
}

impl From<etcd_client::Error> for NodeError {
    fn from(error: etcd_client::Error) -> Self {
        Self::ClusterMetadata(error.to_string())
    }
}

fn id_name(id: i64) -> String {
    format!("{id:020}")
}

fn parse_id(bytes: &[u8]) -> Result<i64> {
    (std::str::from_utf8(bytes).ok())
        .and_then(|id| id.trim().parse().ok())
        .ok_or_else(|| NodeError::Corrupt("an id in the cluster metadata is not a number".into()))
}

/// `value`, if etcd takes it.
fn sized(what: &str, value: Vec<u8>) -> Result<Vec<u8>> {
    if value.len() > MAX_VALUE_BYTES {
        return Err(NodeError::InvalidArgument(format!(
            "{what} takes {} bytes, more than the cluster metadata keeps in one value \
             ({MAX_VALUE_BYTES} bytes)",
            value.len()
        )));
    }
    Ok(value)
}

fn decode_table(table_id: i64, bytes: &[u8]) -> Result<TableDescriptor> {
    let proto = decode::<TableDescriptorProto>("stored table descriptor", bytes)?;
    let mut table = TableDescriptor::try_from(proto)?;
    table.table_id = table_id as u64;
    Ok(table)
}

fn encode_snapshot(record: &LakeSnapshotRecord) -> Vec<u8> {
    let mut bytes = record.committed_at.to_le_bytes().to_vec();
    bytes.extend_from_slice(&record.snapshot_id.to_le_bytes());
    bytes.extend_from_slice(record.offsets.as_bytes());
    bytes
}

fn decode_snapshot(bytes: &[u8]) -> Result<LakeSnapshotRecord> {
    let corrupt = || NodeError::Corrupt("a lake snapshot record in etcd does not decode".into());
    let word = |at: usize| -> Result<i64> {
        let bytes = bytes.get(at..at + 8).ok_or_else(corrupt)?;
        Ok(i64::from_le_bytes(bytes.try_into().expect("8 bytes")))
    };
    let offsets = std::str::from_utf8(&bytes[16.min(bytes.len())..]).map_err(|_| corrupt())?;
    Ok(LakeSnapshotRecord {
        committed_at: word(0)?,
        snapshot_id: word(8)?,
        offsets: offsets.to_string(),
    })
}

fn encode_round(round: &PendingRound) -> Vec<u8> {
    let parent = round
        .parent_snapshot
        .map_or_else(|| "-".to_string(), |id| id.to_string());
    std::iter::once(parent.as_str())
        .chain(round.files.iter().map(String::as_str))
        .collect::<Vec<_>>()
        .join("\n")
        .into_bytes()
}

fn decode_round(bytes: &[u8]) -> Result<PendingRound> {
    let corrupt = || NodeError::Corrupt("a pending tiering round in etcd does not decode".into());
    let text = std::str::from_utf8(bytes).map_err(|_| corrupt())?;
    let mut lines = text.lines();
    let parent_snapshot = match lines.next().ok_or_else(corrupt)? {
        "-" => None,
        id => Some(id.parse().map_err(|_| corrupt())?),
    };
    Ok(PendingRound {
        parent_snapshot,
        files: lines.map(str::to_string).collect(),
    })
}

impl TableMetadata for EtcdMetadata {
    fn load_tables(&self) -> Result<Vec<TableDescriptor>> {
        let tables = self.get(
            self.key(&["tables", ""]),
            Some(GetOptions::new().with_prefix()),
        )?;
        tables
            .iter()
            .map(|(key, bytes)| {
                let id = key.rsplit('/').next().unwrap_or_default();
                decode_table(parse_id(id.as_bytes())?, bytes)
            })
            .collect()
    }

    fn create_table(&self, table: &TableDescriptor) -> Result<TableDescriptor> {
        let name = self.name_key(&table.path);
        for _ in 0..ATTEMPTS {
            let counter = self.counter("table")?;
            let mut created = table.clone();
            created.table_id = (counter.last + 1) as u64;
            let descriptor = TableDescriptorProto::from(&created).encode_to_vec();
            let descriptor = sized("a table's descriptor", descriptor)?;
            let (unchanged, take) = self.take_id("table", &counter, counter.last + 1);
            let free = Compare::version(name.clone(), CompareOp::Equal, 0);
            let txn = Txn::new().when([unchanged, free]).and_then([
                take,
                TxnOp::put(self.table_key(created.table_id), descriptor, None),
                TxnOp::put(name.clone(), id_name(created.table_id as i64), None),
            ]);
            if self.txn(txn)? {
                return Ok(created);
            }
            if self.get_one(name.clone())?.is_some() {
                return Err(NodeError::TableExists(table.path.to_string()));
            }
        }
        Err(contended("creating a table"))
    }

    fn delete_table(&self, table_id: u64) -> Result<()> {
        let Some(bytes) = self.get_one(self.table_key(table_id))? else {
            return Ok(());
        };
        let table = decode_table(table_id as i64, &bytes)?;
        self.remove(&table)
    }

    fn update_table(&self, table: &TableDescriptor) -> Result<()> {
        let key = self.table_key(table.table_id);
        let descriptor = TableDescriptorProto::from(table).encode_to_vec();
        let descriptor = sized("a table's descriptor", descriptor)?;
        let txn = Txn::new()
            .when([Compare::version(key.clone(), CompareOp::Greater, 0)])
            .and_then([TxnOp::put(key, descriptor, None)]);
        if !self.txn(txn)? {
            return Err(NodeError::TableNotFound(table.path.to_string()));
        }
        Ok(())
    }

    fn drop_table(&self, path: &TablePath) -> Result<()> {
        let not_found = || NodeError::TableNotFound(path.to_string());
        let id = self.get_one(self.name_key(path))?.ok_or_else(not_found)?;
        let table_id = parse_id(&id)? as u64;
        let bytes = self
            .get_one(self.table_key(table_id))?
            .ok_or_else(not_found)?;
        self.remove(&decode_table(table_id as i64, &bytes)?)
    }

    fn partitions(&self, table_id: u64) -> Result<Vec<PartitionRecord>> {
        let prefix = self.table_prefix("partitions", table_id);
        let listed = self.get(prefix.clone(), Some(GetOptions::new().with_prefix()))?;
        listed
            .into_iter()
            .map(|(key, id)| {
                Ok(PartitionRecord {
                    partition_id: parse_id(&id)?,
                    name: key[prefix.len()..].to_string(),
                })
            })
            .collect()
    }

    fn ensure_partition(&self, table_id: u64, name: &str) -> Result<PartitionRecord> {
        let key = self.table_prefix("partitions", table_id) + name;
        for _ in 0..ATTEMPTS {
            if let Some(id) = self.get_one(key.clone())? {
                return Ok(PartitionRecord {
                    partition_id: parse_id(&id)?,
                    name: name.to_string(),
                });
            }
            let counter = self.counter("partition")?;
            let partition_id = counter.last + 1;
            let (unchanged, take) = self.take_id("partition", &counter, partition_id);
            let table = self.table_key(table_id);
            let txn = Txn::new()
                .when([
                    unchanged,
                    Compare::version(table, CompareOp::Greater, 0),
                    Compare::version(key.clone(), CompareOp::Equal, 0),
                ])
                .and_then([take, TxnOp::put(key.clone(), id_name(partition_id), None)]);
            if self.txn(txn)? {
                return Ok(PartitionRecord {
                    partition_id,
                    name: name.to_string(),
                });
            }
            if self.get_one(self.table_key(table_id))?.is_none() {
                return Err(NodeError::TableNotFound(format!("table id {table_id}")));
            }
        }
        Err(contended("creating a partition"))
    }

    fn delete_partition(&self, partition_id: i64) -> Result<()> {
        let every = self.get(
            self.key(&["partitions", ""]),
            Some(GetOptions::new().with_prefix()),
        )?;
        for (key, id) in every {
            if parse_id(&id)? == partition_id {
                let unchanged = Compare::value(key.clone(), CompareOp::Equal, id);
                self.txn(
                    Txn::new()
                        .when([unchanged])
                        .and_then([TxnOp::delete(key, None)]),
                )?;
            }
        }
        Ok(())
    }
}

impl LakeMetadata for EtcdMetadata {
    fn record_lake_snapshot(&self, table_id: u64, record: &LakeSnapshotRecord) -> Result<()> {
        let key = self.snapshot_key(table_id, record.snapshot_id);
        let value = sized("a lake snapshot's offsets", encode_snapshot(record))?;
        let txn = Txn::new()
            .when([Compare::version(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key, value, None)]);
        self.txn(txn)?;
        Ok(())
    }

    fn latest_lake_snapshot(&self, table_id: u64) -> Result<Option<LakeSnapshotRecord>> {
        let newest = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(1);
        let key = self.table_prefix("lake", table_id) + "snapshots/";
        let latest = self.get(key, Some(newest))?.into_iter().next();
        latest.map(|(_, bytes)| decode_snapshot(&bytes)).transpose()
    }

    fn lake_snapshots(&self, table_id: u64) -> Result<Vec<LakeSnapshotRecord>> {
        let oldest_first = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend);
        let key = self.table_prefix("lake", table_id) + "snapshots/";
        let records = self.get(key, Some(oldest_first))?;
        records
            .iter()
            .map(|(_, bytes)| decode_snapshot(bytes))
            .collect()
    }

    fn forget_lake_snapshots(&self, table_id: u64, snapshot_ids: &[i64]) -> Result<()> {
        let Some(latest) = self.latest_lake_snapshot(table_id)? else {
            return Ok(());
        };
        let forgotten: Vec<TxnOp> = (snapshot_ids.iter())
            .filter(|&&id| id != latest.snapshot_id)
            .map(|&id| TxnOp::delete(self.snapshot_key(table_id, id), None))
            .collect();
        // One transaction holds at most etcd's `--max-txn-ops` (128 by default).
        for ops in forgotten.chunks(128) {
            self.txn(Txn::new().and_then(ops.to_vec()))?;
        }
        Ok(())
    }

    fn set_pending_round(&self, table_id: u64, round: &PendingRound) -> Result<()> {
        let value = sized("a tiering round's file list", encode_round(round))?;
        let txn = Txn::new().and_then([TxnOp::put(self.pending_key(table_id), value, None)]);
        self.txn(txn)?;
        Ok(())
    }

    fn pending_round(&self, table_id: u64) -> Result<Option<PendingRound>> {
        let pending = self.get_one(self.pending_key(table_id))?;
        pending.map(|bytes| decode_round(&bytes)).transpose()
    }

    fn clear_pending_round(&self, table_id: u64) -> Result<()> {
        let txn = Txn::new().and_then([TxnOp::delete(self.pending_key(table_id), None)]);
        self.txn(txn)?;
        Ok(())
    }
}

impl EtcdMetadata {
    /// Removes `table` (as read), its name if it still names it, its partitions and its
    /// lake records, in one transaction.
    fn remove(&self, table: &TableDescriptor) -> Result<()> {
        let name = self.name_key(&table.path);
        let prefixed = || Some(DeleteOptions::new().with_prefix());
        let records = [
            TxnOp::delete(self.table_key(table.table_id), None),
            TxnOp::delete(self.table_prefix("partitions", table.table_id), prefixed()),
            TxnOp::delete(self.table_prefix("lake", table.table_id), prefixed()),
        ];
        let named = Compare::value(
            name.clone(),
            CompareOp::Equal,
            id_name(table.table_id as i64),
        );
        let with_name = [&records[..], &[TxnOp::delete(name, None)]].concat();
        let txn = Txn::new()
            .when([named])
            .and_then(with_name)
            .or_else(records.to_vec());
        self.txn(txn)?;
        Ok(())
    }
}

fn contended(what: &str) -> NodeError {
    NodeError::ClusterMetadata(format!(
        "{what}: other nodes kept changing the cluster metadata ({ATTEMPTS} attempts)"
    ))
}
