//! Which node leads each bucket: the controller's decision, a pure function of the
//! buckets, the live nodes and the assignment before.
//!
//! * **Balanced**: each live node leads `⌊n/m⌋` or `⌈n/m⌉` of the `n` buckets (`m`
//!   nodes); the nodes leading most already get the larger shares.
//! * **Few moves**: a bucket whose leader is live stays with it unless that node holds
//!   more than its share; only a dead node's buckets and a surplus move, each to the node
//!   with the most room (ties to the lowest node id, buckets in key order: the same
//!   inputs always give the same assignment).
//! * **Epochs**: a bucket's epoch grows by one with each move (from 1 for its first
//!   leader) and never otherwise, so a leader's epoch names its term: the stream it opens
//!   with it fences every earlier leader's.
//! * Without a live node nothing changes: the buckets wait, led by no one live, until a
//!   node joins.

use std::collections::{BTreeMap, BTreeSet};

/// A bucket's leader and its term.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    /// The node's id.
    pub node: String,
    /// Grows with each move of the bucket.
    pub epoch: u64,
}

impl Leader {
    /// The leader as etcd keeps it: `<epoch> <node>` (node ids have no spaces).
    pub fn to_value(&self) -> String {
        format!("{} {}", self.epoch, self.node)
    }

    /// A leader as etcd keeps it ([`Leader::to_value`]); `None` if it does not parse.
    pub fn parse(value: &str) -> Option<Self> {
        let (epoch, node) = value.split_once(' ')?;
        if node.is_empty() || node.contains(' ') {
            return None;
        }
        Some(Self {
            node: node.to_string(),
            epoch: epoch.parse().ok()?,
        })
    }
}

/// The next assignment of `buckets` (their keys) over the `live` nodes, from `current`
/// (see the module doc). Buckets not in `buckets` are left out.
pub fn assign(
    buckets: &BTreeSet<String>,
    live: &BTreeSet<String>,
    current: &BTreeMap<String, Leader>,
) -> BTreeMap<String, Leader> {
    if live.is_empty() {
        return (current.iter())
            .filter(|(bucket, _)| buckets.contains(*bucket))
            .map(|(bucket, leader)| (bucket.clone(), leader.clone()))
            .collect();
    }
    // The buckets each live node leads, and those no live node does.
    let mut led: BTreeMap<&str, Vec<&String>> =
        live.iter().map(|n| (n.as_str(), Vec::new())).collect();
    let mut unled = Vec::new();
    for bucket in buckets {
        match current
            .get(bucket)
            .and_then(|leader| led.get_mut(leader.node.as_str()))
        {
            Some(buckets) => buckets.push(bucket),
            None => unled.push(bucket),
        }
    }
    // Shares: the nodes leading most now take the larger ones.
    let (each, larger) = (buckets.len() / live.len(), buckets.len() % live.len());
    let mut by_load: Vec<&str> = led.keys().copied().collect();
    by_load.sort_by_key(|node| std::cmp::Reverse(led[node].len()));
    let share: BTreeMap<&str, usize> = (by_load.iter().enumerate())
        .map(|(rank, node)| (*node, each + usize::from(rank < larger)))
        .collect();
    for (node, buckets) in &mut led {
        let surplus = buckets.len().saturating_sub(share[node]);
        unled.extend(buckets.drain(buckets.len() - surplus..));
    }
    unled.sort();
    let mut next = BTreeMap::new();
    for bucket in led.values().flatten() {
        next.insert((*bucket).clone(), current[*bucket].clone());
    }
    for bucket in unled {
        let room = |node: &&str| share[node] - led[node].len();
        let node = (led.keys().copied())
            .filter(|node| room(node) > 0)
            .max_by_key(|node| (room(node), std::cmp::Reverse(*node)))
            .expect("the shares add up to the buckets");
        led.get_mut(node).expect("a live node").push(bucket);
        let epoch = current.get(bucket).map_or(0, |leader| leader.epoch) + 1;
        let leader = Leader {
            node: node.to_string(),
            epoch,
        };
        next.insert(bucket.clone(), leader);
    }
    next
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    fn set(items: impl IntoIterator<Item = impl ToString>) -> BTreeSet<String> {
        items.into_iter().map(|item| item.to_string()).collect()
    }

    fn loads(assignment: &BTreeMap<String, Leader>) -> BTreeMap<&str, usize> {
        let mut loads = BTreeMap::new();
        for leader in assignment.values() {
            *loads.entry(leader.node.as_str()).or_default() += 1;
        }
        loads
    }

    #[test]
    fn a_leader_reads_back_as_written() {
        let leader = Leader {
            node: "n1".into(),
            epoch: 7,
        };
        assert_eq!(Leader::parse(&leader.to_value()), Some(leader));
        for value in ["", "7", "x n1", "7 ", "7 n1 n2"] {
            assert_eq!(Leader::parse(value), None, "{value:?}");
        }
    }

    #[test]
    fn a_dead_nodes_buckets_spread_over_the_others_and_a_new_node_takes_a_share() {
        let buckets = set((0..6).map(|b| format!("t1/b{b}")));
        let first = assign(&buckets, &set(["a", "b", "c"]), &BTreeMap::new());
        assert_eq!(
            loads(&first),
            BTreeMap::from([("a", 2), ("b", 2), ("c", 2)])
        );
        assert!(first.values().all(|leader| leader.epoch == 1));

        let without_b = assign(&buckets, &set(["a", "c"]), &first);
        assert_eq!(loads(&without_b), BTreeMap::from([("a", 3), ("c", 3)]));
        for (bucket, leader) in &without_b {
            let before = &first[bucket];
            if before.node == "b" {
                assert_eq!(leader.epoch, 2, "{bucket} moved");
            } else {
                assert_eq!(leader, before, "{bucket} stayed");
            }
        }

        let with_d = assign(&buckets, &set(["a", "c", "d"]), &without_b);
        assert_eq!(
            loads(&with_d),
            BTreeMap::from([("a", 2), ("c", 2), ("d", 2)])
        );
        let moved = (with_d.iter()).filter(|(bucket, leader)| without_b[*bucket] != **leader);
        assert_eq!(moved.count(), 2, "d takes one bucket of a and one of c");

        let nobody = assign(&buckets, &BTreeSet::new(), &with_d);
        assert_eq!(nobody, with_d, "without a live node the buckets wait");
    }

    /// Random changes of buckets and nodes: every bucket has one live leader, the loads
    /// differ by one at most, only a dead node's buckets and a surplus move, and an
    /// epoch grows by one exactly when its bucket moves.
    #[test]
    fn random_changes_keep_the_assignment_balanced_with_few_moves() {
        for seed in 0..200 {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut current = BTreeMap::new();
            let (mut buckets, mut live) = (BTreeSet::new(), BTreeSet::new());
            for step in 0..40 {
                match rng.random_range(0..4) {
                    0 => live.insert(format!("n{}", rng.random_range(0..6))),
                    1 => live.remove(&format!("n{}", rng.random_range(0..6))),
                    2 => buckets.insert(format!(
                        "t{}/b{}",
                        rng.random_range(0..3),
                        rng.random_range(0..8)
                    )),
                    _ => buckets.remove(&format!(
                        "t{}/b{}",
                        rng.random_range(0..3),
                        rng.random_range(0..8)
                    )),
                };
                let next = assign(&buckets, &live, &current);
                let context = format!("seed {seed} step {step}");
                if live.is_empty() {
                    current = next;
                    continue;
                }
                assert_eq!(
                    next.keys().collect::<Vec<_>>(),
                    buckets.iter().collect::<Vec<_>>(),
                    "{context}"
                );
                assert!(
                    next.values().all(|leader| live.contains(&leader.node)),
                    "{context}"
                );
                let loads = loads(&next);
                let (most, least) = (
                    loads.values().max().copied().unwrap_or(0),
                    if loads.len() < live.len() {
                        0
                    } else {
                        loads.values().min().copied().unwrap_or(0)
                    },
                );
                assert!(most - least <= 1, "{context}: {loads:?}");
                let share = buckets.len().div_ceil(live.len());
                for (bucket, leader) in &next {
                    match current.get(bucket) {
                        Some(before) if before.node == leader.node => {
                            assert_eq!(before.epoch, leader.epoch, "{context}: {bucket} stayed");
                        }
                        Some(before) => {
                            assert_eq!(leader.epoch, before.epoch + 1, "{context}: {bucket} moved");
                            let before_load =
                                current.values().filter(|l| l.node == before.node).count();
                            assert!(
                                !live.contains(&before.node) || before_load > share - 1,
                                "{context}: {bucket} left {} without need",
                                before.node
                            );
                        }
                        None => assert_eq!(leader.epoch, 1, "{context}: {bucket} is new"),
                    }
                }
                current = next;
            }
        }
    }
}
