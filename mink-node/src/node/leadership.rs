//! Which buckets this node leads, and buckets moving to and from it.
//!
//! Each bucket of a partition is a [`Slot`]: led here (its tablets open), or led
//! elsewhere or moving, which every request addressed to it is answered
//! ([`NodeError::NotLeader`], with the leader's address and epoch as a typed detail). A
//! single node leads every bucket; in a cluster buckets move between nodes through the
//! log store: [`Node::hand_over_bucket`] on the old leader, [`Node::take_over_bucket`] on
//! the new one.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mink_client::MinkClient;
use mink_core::protocol::{BucketId, NodeInfo, NotLeader};
use mink_core::table::{TableDescriptor, TablePath};
use tracing::{info, warn};

use super::validate::check_bucket_address;
use super::{Bucket, Node, NodeConfig, TableState, bucket_key};
use crate::cluster::drain::Drainer;
use crate::cluster::{ClusterConfig, Membership};
use crate::error::{NodeError, Result};

/// How often a request naming a table this node does not know makes it look at the
/// cluster's metadata.
const MISSING_TABLE_LOOKS: Duration = Duration::from_millis(100);

/// A bucket of a partition, as this node holds it.
#[derive(Debug, Clone)]
pub(crate) enum Slot {
    /// This node leads it: its tablets.
    Led(Arc<Bucket>),
    /// Another node leads it, or it is moving: what requests for it are answered.
    Elsewhere(NotLeader),
}

impl Slot {
    /// Slots of a partition's buckets (`None`: of an unpartitioned table), each moving:
    /// a cluster's node holds them so until the assignment says who leads them.
    pub(super) fn moving(table: &TableDescriptor, partition: Option<&str>) -> Vec<Self> {
        (0..table.bucket_num)
            .map(|bucket| {
                let id = BucketId {
                    table: table.path.to_string(),
                    partition: partition.map(str::to_string),
                    bucket,
                };
                Self::Elsewhere(moving(&id, 0))
            })
            .collect()
    }

    /// Slots of buckets this node just opened.
    pub(super) fn led(buckets: Vec<Arc<Bucket>>) -> Vec<Self> {
        buckets.into_iter().map(Self::Led).collect()
    }

    /// The bucket's tablets, if this node leads it.
    pub(crate) fn tablets(&self) -> Option<&Arc<Bucket>> {
        match self {
            Self::Led(bucket) => Some(bucket),
            Self::Elsewhere(_) => None,
        }
    }

    /// The bucket's tablets.
    ///
    /// # Errors
    /// [`NodeError::NotLeader`] when this node does not lead it.
    pub(crate) fn led_tablets(&self) -> Result<Arc<Bucket>> {
        match self {
            Self::Led(bucket) => Ok(Arc::clone(bucket)),
            Self::Elsewhere(not_leader) => Err(NodeError::NotLeader(not_leader.clone())),
        }
    }
}

/// Joins the cluster of `cluster` as the node of `config`, which must keep its log in a
/// log store: buckets move between nodes through it.
pub(super) async fn join(cluster: &ClusterConfig, config: &NodeConfig) -> Result<Membership> {
    if config.log_store.is_none() {
        return Err(NodeError::InvalidArgument(
            "a node of a cluster needs a log store (--log-store): buckets move between nodes \
             through it"
                .into(),
        ));
    }
    Membership::join(cluster.clone()).await
}

/// What requests for `bucket` are answered while it moves (or its leader is unknown).
pub(super) fn moving(bucket: &BucketId, epoch: u64) -> NotLeader {
    NotLeader {
        bucket: Some(bucket.clone()),
        leader: None,
        epoch,
    }
}

impl Node {
    /// Hands a bucket this node leads over to the node `leader` (its address) leads it
    /// with from `epoch` on: requests for it are answered "moving" at once, its log
    /// refuses every write after those already queued, and once all its frames are in
    /// the log store (and a primary-key bucket's last KV checkpoint run) its tablets
    /// close and requests are sent to `leader`.
    ///
    /// # Errors
    /// A bucket this node does not lead, no log store, or a hand-over the log store did
    /// not complete: the bucket then stays led here, serving reads and refusing writes,
    /// until a hand-over succeeds (the caller retries) or the node restarts.
    pub async fn hand_over_bucket(
        &self,
        bucket: &BucketId,
        leader: &str,
        epoch: u64,
    ) -> Result<()> {
        self.storage.log_store()?;
        let tablets = self.take_led(bucket, moving(bucket, epoch))?;
        if let Err(error) = tablets.log.hand_over().await {
            self.set_slot(bucket, Slot::Led(tablets))?;
            return Err(error.into());
        }
        self.checkpoint_handed_over(tablets).await;
        let not_leader = NotLeader {
            bucket: Some(bucket.clone()),
            leader: Some(leader.to_string()),
            epoch,
        };
        self.set_slot(bucket, Slot::Elsewhere(not_leader))?;
        self.open_buckets.release(1);
        info!(%bucket, leader, epoch, "handed a bucket over");
        Ok(())
    }

    /// Takes a bucket over from the node that handed it over (or from a dead node's
    /// sequence read into the log store), to lead it in `epoch`: replaces what this node kept of it from an
    /// earlier time it led it, opens its log from the store (and its KV store from its
    /// checkpoint and the log after it), and serves it.
    ///
    /// # Errors
    /// A bucket this node leads already, no log store, or a store or tablet that fails
    /// to open: the bucket is then still not led here.
    pub async fn take_over_bucket(&self, bucket: &BucketId, epoch: u64) -> Result<()> {
        let state = self.table(&TablePath::parse(&bucket.table)?)?;
        let table = state.descriptor();
        check_bucket_address(&table, bucket)?;
        match self.slot(bucket) {
            Ok(Slot::Led(_)) => {
                return Err(NodeError::InvalidArgument(format!(
                    "bucket {bucket} is led by this node already"
                )));
            }
            // A partition new to this node.
            Ok(Slot::Elsewhere(_)) | Err(NodeError::BucketNotFound(_)) => {}
            Err(error) => return Err(error),
        }
        let partition = match &bucket.partition {
            Some(name) => Some(self.metadata.ensure_partition(table.table_id, name)?),
            None => None,
        };
        self.open_buckets.reserve(1, &format!("bucket {bucket}"))?;
        let opened =
            (self.storage).take_over_bucket(&table, partition.as_ref(), bucket.bucket, epoch);
        let tablets = match opened {
            Ok(tablets) => tablets,
            Err(error) => {
                self.open_buckets.release(1);
                return Err(error);
            }
        };
        self.set_slot(bucket, Slot::Led(tablets))?;
        info!(%bucket, epoch, "took a bucket over");
        Ok(())
    }

    /// In a cluster, the node's membership.
    pub fn membership(&self) -> Option<&Arc<Membership>> {
        self.membership.as_ref()
    }

    /// In a cluster, what the node's controller drains dead nodes with: the log store,
    /// and `<data-dir>/drain` to rebuild their logs in.
    pub(crate) fn drainer(&self) -> Option<Drainer> {
        self.membership.as_ref()?;
        let config = &self.storage.config;
        Some(Drainer {
            store: config.log_store.clone()?,
            root: config.data_dir.join("drain"),
            segment_bytes: config.log.segment_bytes,
        })
    }

    /// Brings the node's tables in line with the cluster's metadata (tables created or
    /// dropped on other nodes, partitions created, columns added), the buckets new here
    /// moving; every bucket of every table, by its key ([`bucket_key`]). One call at a
    /// time: two would each add a table new here, the second's in place of the first's.
    ///
    /// # Errors
    /// The metadata could not be read.
    pub(crate) fn follow_tables(&self) -> Result<BTreeMap<String, BucketId>> {
        let _following = self.following();
        self.follow_tables_now()
    }

    /// [`Node::follow_tables`] for a request naming a table this node does not know,
    /// at most once every [`MISSING_TABLE_LOOKS`] whatever clients ask for; whether it
    /// looked.
    pub(super) fn look_for_new_tables(&self) -> bool {
        let mut following = self.following();
        if following.is_some_and(|last| last.elapsed() < MISSING_TABLE_LOOKS) {
            return false;
        }
        *following = Some(Instant::now());
        match self.follow_tables_now() {
            Ok(_) => true,
            Err(error) => {
                warn!(%error, "looking for tables created through other nodes failed");
                false
            }
        }
    }

    fn following(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.following.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn follow_tables_now(&self) -> Result<BTreeMap<String, BucketId>> {
        let described = self.metadata.load_tables()?;
        let names: BTreeSet<&TablePath> = described.iter().map(|table| &table.path).collect();
        let gone: Vec<TablePath> = (self.tables_read().keys())
            .filter(|path| !names.contains(path))
            .cloned()
            .collect();
        for path in gone {
            self.forget_table(&path);
        }
        let mut buckets = BTreeMap::new();
        for table in described {
            let table = Arc::new(table);
            let records = match table.is_partitioned() {
                true => (self.metadata.partitions(table.table_id)?.into_iter())
                    .map(|record| (Some(record.partition_id), Some(record.name)))
                    .collect(),
                false => vec![(None, None)],
            };
            let state = self.followed_table(&table);
            let mut partitions = state.partitions();
            for (id, name) in records {
                for bucket in 0..table.bucket_num {
                    let key = bucket_key(table.table_id, id, bucket);
                    let bucket = BucketId {
                        table: table.path.to_string(),
                        partition: name.clone(),
                        bucket,
                    };
                    buckets.insert(key, bucket);
                }
                (partitions.entry(name.clone()))
                    .or_insert_with(|| Slot::moving(&table, name.as_deref()));
            }
        }
        Ok(buckets)
    }

    /// The state of a table the metadata holds, added if new here, its descriptor the
    /// metadata's (a table dropped and created again under its name replaces it).
    fn followed_table(&self, table: &Arc<TableDescriptor>) -> Arc<TableState> {
        let tables = self.tables_read();
        if let Some(state) = tables.get(&table.path) {
            let known = state.descriptor();
            if known.table_id == table.table_id {
                if known.current().schema_id != table.current().schema_id {
                    *state.descriptor.write().unwrap_or_else(|p| p.into_inner()) =
                        Arc::clone(table);
                }
                return Arc::clone(state);
            }
        }
        drop(tables);
        self.forget_table(&table.path);
        let state = Arc::new(TableState::new(Arc::clone(table), BTreeMap::new()));
        self.tables_write()
            .insert(table.path.clone(), Arc::clone(&state));
        state
    }

    /// Forgets a table dropped on another node: its buckets led here are removed.
    fn forget_table(&self, path: &TablePath) {
        let Some(state) = self.tables_write().remove(path) else {
            return;
        };
        let led: Vec<Arc<Bucket>> = std::mem::take(&mut *state.partitions())
            .into_values()
            .flatten()
            .filter_map(|slot| slot.tablets().cloned())
            .collect();
        self.open_buckets.release(led.len());
        self.storage.remove_buckets(&state.descriptor(), None, led);
        mink_metrics::forget_table(&path.to_string());
        info!(table = %path, "forgot a table dropped in the cluster");
    }

    /// The nodes of the node's cluster ([`crate::cluster::nodes`]); none on a single node.
    ///
    /// # Errors
    /// etcd could not be reached.
    pub async fn list_nodes(&self) -> Result<Vec<NodeInfo>> {
        match &self.membership {
            Some(membership) => crate::cluster::nodes(membership.config()).await,
            None => Ok(Vec::new()),
        }
    }

    /// In a cluster, a client of the other nodes: calls about a bucket go to its leader,
    /// following NotLeader ([`mink_client`]), with the cluster's
    /// [`peers`](ClusterConfig::peers) login. It calls this node's own advertised port
    /// first, connecting on first use. `None` on a single node.
    ///
    /// # Errors
    /// This node's port could not be reached, or refused the login.
    pub(crate) async fn peers(&self) -> Result<Option<&MinkClient>> {
        let Some(membership) = &self.membership else {
            return Ok(None);
        };
        let config = membership.config();
        let connect = || MinkClient::connect_with(&config.advertise, &config.peers);
        Ok(Some(self.peers.get_or_try_init(connect).await?))
    }

    /// Whether this node runs the tiering rounds of table `path`: a single node does; in
    /// a cluster the node leading the table's first bucket (of its first partition) does,
    /// so that one node at a time does. Two at once would still tier every row exactly
    /// once (the lake's catalog commits only one of two rounds planned on the same
    /// snapshot), but would write files for nothing.
    pub(crate) fn runs_rounds_of(&self, path: &TablePath) -> bool {
        if self.membership.is_none() {
            return true;
        }
        let Ok(state) = self.table(path) else {
            return false;
        };
        let partitions = state.partitions();
        let first = partitions.values().next().and_then(|slots| slots.first());
        matches!(first, Some(Slot::Led(_)))
    }

    /// Whether this node leads `bucket`.
    pub(crate) fn leads(&self, bucket: &BucketId) -> bool {
        matches!(self.slot(bucket), Ok(Slot::Led(_)))
    }

    /// Answers requests for a bucket this node does not lead with `not_leader`.
    pub(crate) fn point_elsewhere(&self, bucket: &BucketId, not_leader: NotLeader) -> Result<()> {
        if let Slot::Led(_) = self.slot(bucket)? {
            return Err(NodeError::InvalidArgument(format!(
                "bucket {bucket} is led here: it is handed over, not pointed elsewhere"
            )));
        }
        self.set_slot(bucket, Slot::Elsewhere(not_leader))?;
        Ok(())
    }

    /// The slot of an existing bucket.
    fn slot(&self, bucket: &BucketId) -> Result<Slot> {
        let state = self.table(&TablePath::parse(&bucket.table)?)?;
        let partitions = state.partitions();
        partitions
            .get(&bucket.partition)
            .and_then(|slots| slots.get(bucket.bucket as usize))
            .cloned()
            .ok_or_else(|| NodeError::BucketNotFound(bucket.to_string()))
    }

    /// Takes the tablets of a bucket this node leads, `moving` in their place.
    fn take_led(&self, bucket: &BucketId, moving: NotLeader) -> Result<Arc<Bucket>> {
        let state = self.table(&TablePath::parse(&bucket.table)?)?;
        check_bucket_address(&state.descriptor(), bucket)?;
        let mut partitions = state.partitions();
        let place = partitions
            .get_mut(&bucket.partition)
            .and_then(|slots| slots.get_mut(bucket.bucket as usize))
            .ok_or_else(|| NodeError::BucketNotFound(bucket.to_string()))?;
        let tablets = place.led_tablets()?;
        *place = Slot::Elsewhere(moving);
        Ok(tablets)
    }

    /// Puts `slot` in the place of a bucket (creating its partition's slots, each one
    /// "moving", if the partition is new here); the tablets it held, if it was led.
    fn set_slot(&self, bucket: &BucketId, slot: Slot) -> Result<Option<Arc<Bucket>>> {
        let state = self.table(&TablePath::parse(&bucket.table)?)?;
        let table = state.descriptor();
        let mut partitions = state.partitions();
        let slots = (partitions.entry(bucket.partition.clone()))
            .or_insert_with(|| Slot::moving(&table, bucket.partition.as_deref()));
        let place = slots
            .get_mut(bucket.bucket as usize)
            .ok_or_else(|| NodeError::BucketNotFound(bucket.to_string()))?;
        Ok(match std::mem::replace(place, slot) {
            Slot::Led(tablets) => Some(tablets),
            Slot::Elsewhere(_) => None,
        })
    }
}
