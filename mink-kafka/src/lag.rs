//! Consumer group lag, read when a scrape asks (`mink_kafka_consumer_group_lag`): for
//! each partition a group committed an offset in, the rows after it.
//!
//! Group ids are chosen by clients, so the series are bounded: the first
//! [`MAX_LAG_GROUPS`] groups by id among those with members at this node (the groups it
//! coordinates and that are being read now), and only the partitions this node leads (a
//! partition's lag is the high watermark its leader knows; each leader exports its own).

use mink_metrics::prometheus::core::Collector;
use mink_metrics::prometheus::proto::MetricFamily;
use mink_metrics::prometheus::{IntGaugeVec, Opts};

use crate::broker::Broker;
use crate::topics::Topic;

/// The most groups whose lag one node exports.
pub(crate) const MAX_LAG_GROUPS: usize = 20;

/// The lag of the groups with members here, as a metric family.
pub(crate) async fn group_lag(broker: &Broker) -> Vec<MetricFamily> {
    let lag = IntGaugeVec::new(
        Opts::new(
            "mink_kafka_consumer_group_lag",
            "Rows of a partition after a consumer group's committed offset (at most 20 \
             groups with members, partitions led by this node).",
        ),
        &["group", "topic", "partition"],
    )
    .expect("a valid gauge");
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
            (lag.with_label_values(&[group.as_str(), &offset.topic, &partition]))
                .set((high_watermark - offset.offset).max(0));
        }
    }
    lag.collect()
}
