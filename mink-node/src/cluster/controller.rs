//! The controller: one node at a time, elected through etcd under its lease, assigns
//! every bucket of every table to the live members ([`assignment`](super::assignment)).
//!
//! On every change under the cluster's prefix in etcd (a member joining or its lease
//! ending, a table or partition created or dropped), and every [`ASSIGN_EVERY`] at least,
//! the elected node reads the members, the tables and their partitions, and the
//! assignment (`<prefix>/buckets/<bucket key>`: `<epoch> <node>`), and writes what
//! changed in transactions that hold only while its election key is still the one it won
//! with: a controller that lost its lease (paused, cut off) and was replaced writes
//! nothing. Its lease ending ends its election; the next candidate, campaigning
//! meanwhile, takes over. Before it assigns, it drains the nodes that died (the `drain`
//! module), so their buckets' frames are all in the log store.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, LeaderKey, Txn, TxnOp};
use tracing::{info, warn};

use super::assignment::{Leader, assign};
use super::drain::{Drainer, OPS_PER_TXN, dead_incarnations, drain_node};
use super::membership::{ClusterConfig, Membership, members};
use crate::error::{NodeError, Result};
use crate::metadata::MetadataStore;
use crate::node::bucket_key;

/// How often the elected controller looks at the members and tables when etcd tells it
/// of no change.
pub const ASSIGN_EVERY: Duration = Duration::from_secs(2);

/// Campaigns for the controller's election and, once elected, assigns the buckets until
/// the election is lost; then campaigns again. Runs until the task is dropped.
pub async fn run(membership: Arc<Membership>, metadata: Arc<dyn MetadataStore>, drainer: Drainer) {
    let config = membership.config().clone();
    loop {
        match lead(&config, &membership, &metadata, &drainer).await {
            Ok(()) => info!(node = %config.node_id, "no longer the cluster's controller"),
            Err(error) => warn!(%error, "the cluster's controller stopped"),
        }
        tokio::time::sleep(ASSIGN_EVERY).await;
    }
}

/// One term: campaigns, then assigns while elected.
async fn lead(
    config: &ClusterConfig,
    membership: &Membership,
    metadata: &Arc<dyn MetadataStore>,
    drainer: &Drainer,
) -> Result<()> {
    let mut client = config.connect().await?;
    let election = config.key(&["controller"]);
    let won = client
        .campaign(election, config.node_id.clone(), membership.lease())
        .await?;
    let elected = won
        .leader()
        .cloned()
        .ok_or_else(|| NodeError::ClusterMetadata("etcd elected no key".into()))?;
    info!(node = %config.node_id, "elected the cluster's controller");
    let mut changes = config.watch(&mut client).await?;
    loop {
        if !membership.holds_lease()
            || !assign_once(&mut client, config, &elected, metadata, drainer).await?
        {
            return Ok(());
        }
        // Its own writes wake it once more, to find nothing to change.
        changes.next(ASSIGN_EVERY).await?;
    }
}

/// Drains the nodes that died and writes the next assignment; `false` if this node is
/// no longer the elected one.
pub(crate) async fn assign_once(
    client: &mut Client,
    config: &ClusterConfig,
    elected: &LeaderKey,
    metadata: &Arc<dyn MetadataStore>,
    drainer: &Drainer,
) -> Result<bool> {
    let live: BTreeSet<String> = (members(client, config).await?.into_iter())
        .map(|member| member.id)
        .collect();
    for dead in dead_incarnations(client, config, &live).await? {
        if !drain_node(client, config, elected, drainer, &dead).await? {
            return Ok(false);
        }
    }
    let metadata = Arc::clone(metadata);
    let buckets = tokio::task::spawn_blocking(move || every_bucket(metadata.as_ref()))
        .await
        .map_err(|e| NodeError::ClusterMetadata(format!("listing the buckets: {e}")))??;
    let current = assignment(client, config).await?;
    let next = assign(&buckets, &live, &current);
    let mut changes: Vec<TxnOp> = (next.iter())
        .filter(|(bucket, leader)| current.get(*bucket) != Some(leader))
        .map(|(bucket, leader)| {
            TxnOp::put(config.key(&["buckets", bucket]), leader.to_value(), None)
        })
        .collect();
    changes.extend(
        (current.keys())
            .filter(|bucket| !next.contains_key(*bucket))
            .map(|bucket| TxnOp::delete(config.key(&["buckets", bucket]), None)),
    );
    for ops in changes.chunks(OPS_PER_TXN) {
        let still_elected =
            Compare::create_revision(elected.key(), CompareOp::Equal, elected.rev());
        let txn = Txn::new().when([still_elected]).and_then(ops.to_vec());
        if !client.txn(txn).await?.succeeded() {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The keys of every bucket of every table.
fn every_bucket(metadata: &dyn MetadataStore) -> Result<BTreeSet<String>> {
    let mut buckets = BTreeSet::new();
    for table in metadata.load_tables()? {
        let partitions: Vec<Option<i64>> = if table.is_partitioned() {
            (metadata.partitions(table.table_id)?.into_iter())
                .map(|partition| Some(partition.partition_id))
                .collect()
        } else {
            vec![None]
        };
        for partition in partitions {
            for bucket in 0..table.bucket_num {
                buckets.insert(bucket_key(table.table_id, partition, bucket));
            }
        }
    }
    Ok(buckets)
}

/// The assignment in etcd, by bucket key.
///
/// # Errors
/// etcd could not be reached, or holds an assignment that does not parse.
pub async fn assignment(
    client: &mut Client,
    config: &ClusterConfig,
) -> Result<BTreeMap<String, Leader>> {
    (config.list(client, "buckets").await?.into_iter())
        .map(|(bucket, value)| {
            let leader = Leader::parse(&value).ok_or_else(|| {
                NodeError::Corrupt(format!("bucket {bucket}'s assignment in etcd: {value}"))
            })?;
            Ok((bucket, leader))
        })
        .collect()
}
