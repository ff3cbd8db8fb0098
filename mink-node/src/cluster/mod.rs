//! Several nodes over one etcd: membership, the elected controller, and which node leads
//! each bucket.
//!
//! * **Membership** ([`membership`]): each node holds an etcd lease and, under it, its
//!   member record (`<prefix>/nodes/<id>`: the address clients and other nodes reach it
//!   at). A node whose lease ends (its process died or paused past the lease) leaves the
//!   membership by itself: etcd deletes its record.
//! * **The controller** ([`controller`]): one node at a time, elected through etcd's
//!   election API under its lease, assigns the buckets to the live nodes ([`assignment`])
//!   and writes the assignment (`<prefix>/buckets/<bucket key>`: leader and epoch) in
//!   transactions that hold only while it is still the elected one.
//! * **Epochs**: each move of a bucket bumps its epoch, the term of its leader.
//!
//! Not built yet: nodes opening and closing buckets as the assignment moves (the new
//! leader fencing the earlier ones' streams with its epoch), NotLeader answers, and
//! `mink server --cluster`, which starts none of this so far.

pub mod assignment;
pub mod controller;
pub mod drain;
pub mod membership;

pub use membership::{ClusterConfig, Member, Membership};

#[cfg(test)]
mod tests;
