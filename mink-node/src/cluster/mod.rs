//! Several nodes over one etcd and one log store: membership, the elected controller,
//! which node leads each bucket, and buckets moving between nodes.
//!
//! * **Membership** ([`membership`]): each node holds an etcd lease and, under it, its
//!   member record (`<prefix>/nodes/<id>`: the address clients and other nodes reach it
//!   at). A node whose lease ends (its process died or paused past the lease) leaves the
//!   membership by itself: etcd deletes its record.
//! * **The controller** ([`controller`]): one node at a time, elected through etcd's
//!   election API under its lease, drains the nodes that died ([`drain`]: their buckets'
//!   frames into stream objects) and assigns the buckets to the live nodes
//!   ([`assignment`]), writing the assignment (`<prefix>/buckets/<bucket key>`: leader
//!   and epoch) in transactions that hold only while it is still the elected one.
//! * **Following** ([`follower`]): every node takes over the buckets assigned to it
//!   once no other node holds frames of them, hands over those assigned elsewhere, and
//!   answers requests for the others NotLeader, with their leader's address.
//! * **Epochs**: each move of a bucket bumps its epoch, the term of its leader.
//!
//! ```text
//!   <prefix>/nodes/<id>            address, under the node's lease: the live members
//!   <prefix>/incarnations/<id>     the node's log store sequence may hold frames
//!   <prefix>/draining/<id>         the controller drains that sequence (under its lease)
//!   <prefix>/controller/...        the controller's election
//!   <prefix>/buckets/<bucket key>  "<epoch> <node>": the assignment
//!   <prefix>/holders/<bucket key>  the node whose frames of the bucket may not all be in
//!                                  stream objects yet (its writer)
//!   <prefix>/tables/..., names/..., partitions/..., lake/...   the metadata (`EtcdMetadata`)
//! ```

pub mod assignment;
pub mod controller;
pub mod drain;
pub mod follower;
pub mod membership;

use std::collections::BTreeMap;
use std::sync::Arc;

use mink_core::protocol::NodeInfo;
use tokio::task::JoinHandle;

pub use membership::{ClusterConfig, Member, Membership};

use crate::Node;
use crate::error::Result;

#[cfg(test)]
mod tests;

/// The cluster's live members and every node a bucket is assigned to, by id: its
/// address (a live member's), whether it is live, how many buckets it is assigned and the
/// highest epoch among them.
///
/// # Errors
/// etcd could not be reached, or holds an assignment that does not parse.
pub async fn nodes(config: &ClusterConfig) -> Result<Vec<NodeInfo>> {
    let mut client = config.connect().await?;
    let mut nodes: BTreeMap<String, NodeInfo> = BTreeMap::new();
    for member in membership::members(&mut client, config).await? {
        let node = NodeInfo {
            node_id: member.id.clone(),
            address: Some(member.address),
            live: true,
            ..NodeInfo::default()
        };
        nodes.insert(member.id, node);
    }
    for leader in controller::assignment(&mut client, config)
        .await?
        .into_values()
    {
        let node = nodes
            .entry(leader.node.clone())
            .or_insert_with(|| NodeInfo {
                node_id: leader.node,
                ..NodeInfo::default()
            });
        node.buckets += 1;
        node.max_epoch = node.max_epoch.max(leader.epoch);
    }
    Ok(nodes.into_values().collect())
}

/// A node's part in its cluster, running: it follows the assignment and campaigns to be
/// the controller. Both stop when dropped.
#[derive(Debug)]
pub struct ClusterTasks {
    follower: JoinHandle<()>,
    controller: JoinHandle<()>,
}

impl ClusterTasks {
    /// Starts the cluster's tasks of `node`; `None` for a single node.
    pub fn start(node: &Arc<Node>) -> Option<Self> {
        let membership = Arc::clone(node.membership()?);
        let drainer = node.drainer()?;
        let metadata = Arc::clone(&node.metadata);
        Some(Self {
            follower: tokio::spawn(follower::run(Arc::clone(node))),
            controller: tokio::spawn(controller::run(membership, metadata, drainer)),
        })
    }

    /// Resolves once the node lost its lease: it may lead nothing any more, and its log
    /// store writer may be fenced by the drain of its buckets, so it must start again.
    pub async fn lease_lost(&mut self) {
        let _ = (&mut self.follower).await;
    }
}

impl Drop for ClusterTasks {
    fn drop(&mut self) {
        self.follower.abort();
        self.controller.abort();
    }
}
