//! Each node follows the assignment: it takes over the buckets the controller gives it
//! and hands over the ones it gives others, through the log store.
//!
//! On every change under the cluster's prefix in etcd, and every [`FOLLOW_EVERY`] at
//! least, the node brings its tables in line with the metadata, reads the assignment,
//! the members' addresses and the holds (`<prefix>/holders/<bucket key>`: the node whose
//! frames of the bucket may not all be in stream objects yet: its writer), and for each
//! bucket:
//!
//! * **assigned to it, not led here**: once no other node holds the bucket, it holds it
//!   (a put only if no one does) and takes it over, reading its log (and KV checkpoint)
//!   from the store. Never while another node holds it: that node's frames would be
//!   missing. A hold outlives its node's lease: a dead holder's go only once the
//!   controller drained its sequence (the `drain` module).
//! * **led here, assigned elsewhere**: it hands the bucket over (every frame into stream
//!   objects), then lets go of its hold, and points requests at the new leader.
//! * **otherwise**: requests are answered NotLeader, with the leader's address, or
//!   "moving" while the bucket has no live leader.
//!
//! A node that does not hold its lease takes nothing over.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};
use mink_core::protocol::{BucketId, NotLeader};
use tracing::{error, info, warn};

use super::assignment::Leader;
use super::controller::assignment;
use super::drain::holders;
use super::membership::{ClusterConfig, Membership, members};
use crate::Node;
use crate::error::Result;

/// How often a node looks at the assignment when etcd tells it of no change.
pub const FOLLOW_EVERY: Duration = Duration::from_secs(2);

/// Follows the assignment (see the module doc) until the node loses its lease: it then
/// may lead nothing, and its log store writer may be fenced by a drain, so the node
/// must start again.
pub async fn run(node: Arc<Node>) {
    let Some(membership) = node.membership().cloned() else {
        return;
    };
    let config = membership.config().clone();
    while membership.holds_joined_lease() {
        if let Err(error) = follow(&node, &membership, &config).await {
            warn!(%error, "following the cluster's assignment stopped; starting again");
        }
        tokio::time::sleep(FOLLOW_EVERY).await;
    }
    error!(node = %config.node_id, "the node lost its lease in the cluster");
}

/// Follows while etcd answers and the node holds its lease.
async fn follow(node: &Node, membership: &Membership, config: &ClusterConfig) -> Result<()> {
    let mut client = config.connect().await?;
    let mut changes = config.watch(&mut client).await?;
    while membership.holds_joined_lease() {
        follow_once(node, &mut client, config).await?;
        changes.next(FOLLOW_EVERY).await?;
    }
    Ok(())
}

/// One look at the assignment, each bucket's slot brought in line with it.
pub(crate) async fn follow_once(
    node: &Node,
    client: &mut Client,
    config: &ClusterConfig,
) -> Result<()> {
    let buckets = node.follow_tables()?;
    let assigned = assignment(client, config).await?;
    let addresses: BTreeMap<String, String> = (members(client, config).await?.into_iter())
        .map(|member| (member.id, member.address))
        .collect();
    let held = holders(client, config).await?;
    let me = &config.node_id;
    for (key, bucket) in &buckets {
        let Some(leader) = assigned.get(key) else {
            continue;
        };
        let led_here = node.leads(bucket);
        if &leader.node == me {
            let free = held.get(key).is_none_or(|holder| holder == me);
            let may_lead = node.membership().is_some_and(|m| m.holds_joined_lease());
            if !led_here && free && may_lead {
                take_over(node, client, config, key, bucket, leader.epoch).await?;
            }
            continue;
        }
        let address = addresses.get(&leader.node).cloned();
        if led_here {
            let Some(address) = address else {
                // Its next leader is gone too: it stays here until the next assignment.
                continue;
            };
            hand_over(node, client, config, key, bucket, &address, leader).await?;
        } else {
            let not_leader = NotLeader {
                bucket: Some(bucket.clone()),
                leader: address,
                epoch: leader.epoch,
            };
            node.point_elsewhere(bucket, not_leader)?;
        }
    }
    Ok(())
}

/// Holds `bucket` (unless another node got there first) and takes it over, to lead it
/// in `epoch`.
async fn take_over(
    node: &Node,
    client: &mut Client,
    config: &ClusterConfig,
    key: &str,
    bucket: &BucketId,
    epoch: u64,
) -> Result<()> {
    let hold = config.key(&["holders", key]);
    let me = config.node_id.clone();
    let txn = Txn::new()
        .when([Compare::version(hold.clone(), CompareOp::Equal, 0)])
        .and_then([TxnOp::put(hold.clone(), me.clone(), None)]);
    if !client.txn(txn).await?.succeeded() {
        let holder = client.get(hold, None).await?;
        let mine = holder
            .kvs()
            .first()
            .is_some_and(|kv| kv.value() == me.as_bytes());
        if !mine {
            return Ok(());
        }
    }
    match node.take_over_bucket(bucket, epoch).await {
        Ok(()) => Ok(()),
        // The hold stays: the next look tries again.
        Err(error) => {
            warn!(%bucket, %error, "taking a bucket over failed");
            Ok(())
        }
    }
}

/// Hands `bucket` over to the leader at `address`, then lets go of its hold.
async fn hand_over(
    node: &Node,
    client: &mut Client,
    config: &ClusterConfig,
    key: &str,
    bucket: &BucketId,
    address: &str,
    leader: &Leader,
) -> Result<()> {
    if let Err(error) = node.hand_over_bucket(bucket, address, leader.epoch).await {
        warn!(%bucket, %error, "handing a bucket over failed; trying again");
        return Ok(());
    }
    let hold = config.key(&["holders", key]);
    let mine = Compare::value(hold.clone(), CompareOp::Equal, config.node_id.as_str());
    let txn = Txn::new()
        .when([mine])
        .and_then([TxnOp::delete(hold, None)]);
    client.txn(txn).await?;
    info!(%bucket, to = %leader.node, epoch = leader.epoch, "released a bucket to its next leader");
    Ok(())
}
