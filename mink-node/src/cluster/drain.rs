//! The controller drains dead nodes: their buckets' frames still only in their WAL
//! objects go to stream objects ([`mink_log::drain`]), and the buckets are free for
//! their next leaders.
//!
//! Every life of a node marks its sequence as one that may hold frames
//! (`<prefix>/incarnations/<id>`, put when it joins). Once that node is no live member,
//! the controller claims the drain (`<prefix>/draining/<id>`, under its lease, only while
//! the node is still no member: a node never joins while it is drained, nor is drained
//! while a member), drains, and removes the node's holds on buckets
//! (`<prefix>/holders/<bucket key>`, see the `follower` module), then the mark. A
//! controller that dies part way leaves the mark: the next one drains again, which reads
//! the same WAL objects.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use etcd_client::{Client, Compare, CompareOp, LeaderKey, PutOptions, Txn, TxnOp};
use mink_log::LogStoreConfig;
use tracing::{info, warn};

use super::membership::ClusterConfig;
use crate::error::Result;

/// Operations in one etcd transaction at most (etcd's `--max-txn-ops` is 128).
pub(crate) const OPS_PER_TXN: usize = 127;

/// What a controller needs to drain a node: the cluster's log store and a directory of
/// its own to rebuild the dead node's logs in.
#[derive(Debug, Clone)]
pub struct Drainer {
    /// The log store every node writes (without a node id: the drain names the dead one).
    pub store: LogStoreConfig,
    /// Where the dead nodes' logs are rebuilt, one directory each (emptied after).
    pub root: PathBuf,
    /// The segment size of the rebuilt logs.
    pub segment_bytes: u64,
}

/// The nodes whose sequences may hold frames and that are no live member.
pub(crate) async fn dead_incarnations(
    client: &mut Client,
    config: &ClusterConfig,
    live: &BTreeSet<String>,
) -> Result<Vec<String>> {
    Ok((config.list(client, "incarnations").await?.into_iter())
        .map(|(node, _)| node)
        .filter(|node| !live.contains(node))
        .collect())
}

/// Drains node `dead` and removes its holds on buckets; `false` if this controller is no
/// longer the elected one.
pub(crate) async fn drain_node(
    client: &mut Client,
    config: &ClusterConfig,
    elected: &LeaderKey,
    drainer: &Drainer,
    dead: &str,
) -> Result<bool> {
    let member = config.key(&["nodes", dead]);
    let draining = config.key(&["draining", dead]);
    let still_elected = || Compare::create_revision(elected.key(), CompareOp::Equal, elected.rev());
    let claim = Txn::new()
        .when([
            Compare::version(member.clone(), CompareOp::Equal, 0),
            still_elected(),
        ])
        .and_then([TxnOp::put(
            draining.clone(),
            config.node_id.clone(),
            Some(PutOptions::new().with_lease(elected.lease())),
        )]);
    if !client.txn(claim).await?.succeeded() {
        // Either the node joined again meanwhile, or this controller was replaced.
        return Ok(!client.get(member, None).await?.kvs().is_empty());
    }
    info!(
        node = dead,
        "draining a dead node's buckets from the log store"
    );
    let store = LogStoreConfig {
        node: Some(dead.to_string()),
        must_be_empty: false,
        ..drainer.store.clone()
    };
    let root = drainer.root.join(dead);
    let drained = mink_log::drain(store, &root, drainer.segment_bytes).await?;
    if let Err(error) = mink_durable::remove_dir_all(&root) {
        warn!(%error, dir = %root.display(), "could not remove a drained node's rebuilt logs");
    }
    if !release_holds(client, config, dead, Some(still_elected())).await? {
        return Ok(false);
    }
    let done = Txn::new().when([still_elected()]).and_then([
        TxnOp::delete(config.key(&["incarnations", dead]), None),
        TxnOp::delete(draining, None),
    ]);
    let succeeded = client.txn(done).await?.succeeded();
    info!(node = dead, buckets = drained.len(), "drained a dead node");
    Ok(succeeded)
}

/// Removes `node`'s holds on buckets (every frame of it in stream objects now), in
/// transactions that hold only `when` it holds; `false` if one did not.
///
/// # Errors
/// etcd could not be reached.
pub async fn release_holds(
    client: &mut Client,
    config: &ClusterConfig,
    node: &str,
    when: Option<Compare>,
) -> Result<bool> {
    let holds: Vec<TxnOp> = (holders(client, config).await?.into_iter())
        .filter(|(_, holder)| holder == node)
        .map(|(bucket, _)| TxnOp::delete(config.key(&["holders", &bucket]), None))
        .collect();
    for ops in holds.chunks(OPS_PER_TXN) {
        let txn = Txn::new()
            .when(Vec::from_iter(when.clone()))
            .and_then(ops.to_vec());
        if !client.txn(txn).await?.succeeded() {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The node holding each held bucket's frames not yet in stream objects (its writer,
/// until it hands the bucket over or is drained).
///
/// # Errors
/// etcd could not be reached.
pub async fn holders(
    client: &mut Client,
    config: &ClusterConfig,
) -> Result<BTreeMap<String, String>> {
    Ok(config.list(client, "holders").await?.into_iter().collect())
}
