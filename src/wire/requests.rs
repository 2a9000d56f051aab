//! Requests that more than one client of shoal builds (the edge's upstream client, the operator
//! tools, the load generator), with the fields Kafka expects of a consumer.

use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::{BrokerId, ListOffsetsRequest, TopicName};
use kafka_protocol::protocol::StrBytes;

/// A ListOffsets request for some partitions of one topic: (partition, timestamp).
pub fn list_offsets_request(topic: &str, partitions: &[(i32, i64)]) -> ListOffsetsRequest {
    ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_topics(vec![ListOffsetsTopic::default()
            .with_name(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partitions(
                partitions
                    .iter()
                    .map(|&(p, ts)| {
                        ListOffsetsPartition::default()
                            .with_partition_index(p)
                            .with_current_leader_epoch(-1)
                            .with_timestamp(ts)
                    })
                    .collect(),
            )])
}
