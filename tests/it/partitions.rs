//! CreatePartitions with librdkafka's admin client against the real binary: a topic grows, the new
//! partitions are placed on the cores, answer produce and fetch, survive a restart, and a consumer
//! group subscribed to the topic rebalances onto them; growing the wrong way is refused with
//! Kafka's error codes and changes nothing.

use crate::common;

use common::{create_topics, Shoal};
use rdkafka::admin::{AdminClient, AdminOptions, NewPartitions};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};
use std::time::{Duration, Instant};

const TOPIC: &str = "growing";

fn admin(bootstrap: &str) -> AdminClient<DefaultClientContext> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("admin client")
}

/// Asks for `count` partitions of `topic`; the per-topic result.
fn grow(
    admin: &AdminClient<DefaultClientContext>,
    topic: &str,
    count: usize,
    validate_only: bool,
) -> Result<String, (String, RDKafkaErrorCode)> {
    let opts = AdminOptions::new()
        .operation_timeout(Some(Duration::from_secs(10)))
        .validate_only(validate_only);
    let mut results = futures_lite::future::block_on(
        admin.create_partitions(&[NewPartitions::new(topic, count)], &opts),
    )
    .expect("CreatePartitions answered");
    assert_eq!(results.len(), 1);
    results.pop().unwrap()
}

/// The topic's partitions and their leaders, from Metadata.
fn partitions(bootstrap: &str, topic: &str) -> Vec<(i32, i32)> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("consumer");
    let md = c
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .expect("Metadata answered");
    let t = &md.topics()[0];
    assert!(t.error().is_none(), "{:?}", t.error());
    let mut p: Vec<(i32, i32)> = t
        .partitions()
        .iter()
        .map(|p| (p.id(), p.leader()))
        .collect();
    p.sort();
    p
}

fn produce(bootstrap: &str, partition: i32, value: &str) {
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("acks", "all")
        .create()
        .expect("producer");
    p.send(
        BaseRecord::<(), str>::to(TOPIC)
            .partition(partition)
            .payload(value),
    )
    .expect("queued");
    p.flush(Duration::from_secs(10)).expect("acknowledged");
}

fn read_one(bootstrap: &str, partition: i32) -> String {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "reader")
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(TOPIC, partition, Offset::Beginning)
        .unwrap();
    c.assign(&tpl).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        assert!(
            Instant::now() < deadline,
            "nothing read from partition {partition}"
        );
        if let Some(m) = c.poll(Duration::from_millis(200)) {
            let m = m.expect("read");
            return String::from_utf8(m.payload().unwrap().to_vec()).unwrap();
        }
    }
}

#[test]
fn a_topic_grows_and_keeps_its_new_partitions_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 2, &[]);
    let bootstrap = shoal.bootstrap();
    create_topics(&bootstrap, &[(TOPIC, 2)]);
    let admin = admin(&bootstrap);

    // Refused, changing nothing: fewer or as many partitions, an unknown topic, a view.
    let refused = [
        (TOPIC, 1, RDKafkaErrorCode::InvalidPartitions),
        (TOPIC, 2, RDKafkaErrorCode::InvalidPartitions),
        (
            "no-such-topic",
            4,
            RDKafkaErrorCode::UnknownTopicOrPartition,
        ),
        (
            "growing.shard-0-of-2",
            4,
            RDKafkaErrorCode::UnknownTopicOrPartition,
        ),
        (TOPIC, 20_000, RDKafkaErrorCode::InvalidPartitions),
    ];
    for (topic, count, code) in refused {
        let r = grow(&admin, topic, count, false);
        assert!(
            matches!(&r, Err((_, c)) if *c == code),
            "{topic} to {count}: {r:?}"
        );
    }
    // Validate only: accepted, nothing changes.
    grow(&admin, TOPIC, 7, true).expect("valid");
    assert_eq!(partitions(&bootstrap, TOPIC).len(), 2);

    grow(&admin, TOPIC, 5, false).expect("grown");
    let grown = partitions(&bootstrap, TOPIC);
    assert_eq!(
        grown.iter().map(|p| p.0).collect::<Vec<_>>(),
        vec![0, 1, 2, 3, 4]
    );
    // Spread over both cores like the first ones: leaders alternate.
    for w in grown.windows(2) {
        assert_ne!(w[0].1, w[1].1, "{grown:?}");
    }
    produce(&bootstrap, 4, "in a new partition");
    assert_eq!(read_one(&bootstrap, 4), "in a new partition");

    shoal.stop();
    let shoal = Shoal::start(dir.path(), 2, &[]);
    let bootstrap = shoal.bootstrap();
    assert_eq!(partitions(&bootstrap, TOPIC), grown, "persisted");
    assert_eq!(read_one(&bootstrap, 4), "in a new partition");
    shoal.stop();
}

#[test]
fn a_subscribed_group_rebalances_onto_new_partitions() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 2, &[]);
    let bootstrap = shoal.bootstrap();
    create_topics(&bootstrap, &[(TOPIC, 1)]);
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", "growers")
        .set("auto.offset.reset", "earliest")
        .set("topic.metadata.refresh.interval.ms", "500")
        .create()
        .expect("consumer");
    consumer.subscribe(&[TOPIC]).unwrap();
    // Joined, with the one partition.
    let deadline = Instant::now() + Duration::from_secs(30);
    while consumer.assignment().map_or(0, |a| a.count()) != 1 {
        assert!(Instant::now() < deadline, "never assigned");
        consumer.poll(Duration::from_millis(100));
    }
    grow(&admin(&bootstrap), TOPIC, 3, false).expect("grown");
    produce(&bootstrap, 2, "for the group");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert!(
            Instant::now() < deadline,
            "the group never read the new partition (assignment {:?})",
            consumer.assignment().map(|a| a.count())
        );
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            assert_eq!(m.partition(), 2);
            assert_eq!(m.payload(), Some(&b"for the group"[..]));
            break;
        }
    }
    assert_eq!(consumer.assignment().unwrap().count(), 3);
    drop(consumer);
    shoal.stop();
}
