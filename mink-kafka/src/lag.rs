//! Consumer group lag, read when a scrape asks (`mink_kafka_consumer_group_lag`): for
//! each partition a group committed an offset in, the rows after it.
//!
//! Group ids are chosen by clients, so the series are bounded: the first
//! [`MAX_LAG_GROUPS`] groups by id among those with members at this node (the groups it
//! coordinates and that are being read now), and only the partitions this node leads
//! (whose high watermark it knows). In a cluster, a group's partitions led by other
//! nodes are not exported.

use mink_metrics::Gauges;
use mink_metrics::prometheus::proto::MetricFamily;

use crate::broker::Broker;
use crate::topics::Topic;

/// The most groups whose lag one node exports.
pub(crate) const MAX_LAG_GROUPS: usize = 20;

/// The lag of the groups with members here, as a metric family.
pub(crate) async fn group_lag(broker: &Broker) -> MetricFamily {
    let mut lag = Gauges::new(
        "mink_kafka_consumer_group_lag",
        "Rows of a partition after a consumer group's committed offset (at most 20 groups \
         with members at this coordinator, partitions this node leads).",
        &["group", "topic", "partition"],
    );
    let mut groups = broker.groups.with_members();
    groups.sort();
    groups.truncate(MAX_LAG_GROUPS);
    for group in groups {
        let Ok(committed) = broker.state.committed_offsets(&group).await else {
            continue;
        };
        for offset in committed {
            let led = Topic::find(&broker.node, &offset.topic)
                .and_then(|topic| topic.bucket(offset.partition))
                .and_then(|bucket| broker.node.bucket(&bucket).ok());
            let Some((_, tablets)) = led else { continue };
            let (_, high_watermark) = tablets.log.offsets();
            let partition = offset.partition.to_string();
            let rows = (high_watermark - offset.offset).max(0);
            lag.set(&[group.as_str(), &offset.topic, &partition], rows as f64);
        }
    }
    lag.family()
}
