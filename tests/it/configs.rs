//! Topic configs through librdkafka's admin client against the real binary: DescribeConfigs shows
//! values, sources and read-only broker configs; AlterConfigs changes a topic's configs on every
//! core at once (a smaller `max.message.bytes` refuses a batch that was accepted before), keeps
//! them across a restart, and refuses unknown keys, bad values, views and broker configs.

use crate::common;

use common::{create_topics, Shoal};
use rdkafka::admin::{
    AdminClient, AdminOptions, AlterConfig, AlterConfigsResult, ResourceSpecifier,
};
use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::types::RDKafkaErrorCode;
use std::sync::Mutex;
use std::time::Duration;

const TOPIC: &str = "tuned";

fn admin(bootstrap: &str) -> AdminClient<DefaultClientContext> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("admin client")
}

fn opts() -> AdminOptions {
    AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)))
}

/// (value, source, read-only) of `name` in `resource`'s configs.
fn describe(
    admin: &AdminClient<DefaultClientContext>,
    resource: ResourceSpecifier<'_>,
    name: &str,
) -> (Option<String>, String, bool) {
    let results = futures_lite::future::block_on(admin.describe_configs([&resource], &opts()))
        .expect("DescribeConfigs answered");
    let r = results.into_iter().next().unwrap().expect("described");
    let e = r
        .entries
        .iter()
        .find(|e| e.name == name)
        .unwrap_or_else(|| panic!("no {name}"));
    (e.value.clone(), format!("{:?}", e.source), e.is_read_only)
}

/// Every config of `resource`: (name, value, source), in the order described.
fn describe_all(
    admin: &AdminClient<DefaultClientContext>,
    resource: ResourceSpecifier<'_>,
) -> Vec<(String, Option<String>, String)> {
    let results = futures_lite::future::block_on(admin.describe_configs([&resource], &opts()))
        .expect("DescribeConfigs answered");
    let r = results.into_iter().next().unwrap().expect("described");
    r.entries
        .iter()
        .map(|e| (e.name.clone(), e.value.clone(), format!("{:?}", e.source)))
        .collect()
}

const TOPIC_RESOURCE: i8 = 2;
const BROKER_RESOURCE: i8 = 4;
const INVALID_REQUEST: i16 = 42;
const INVALID_CONFIG: i16 = 40;

/// AlterConfigs (v2) of one resource to `key=value`, sent as wire bytes: the resource's error
/// code and message.
fn alter_on_the_wire(
    port: u16,
    resource_type: i8,
    name: &str,
    key: &str,
    value: &str,
) -> (i16, Option<String>) {
    use kafka_protocol::messages::alter_configs_request::{AlterConfigsResource, AlterableConfig};
    use kafka_protocol::messages::{AlterConfigsRequest, AlterConfigsResponse, ApiKey};
    use kafka_protocol::protocol::StrBytes;
    let request =
        AlterConfigsRequest::default().with_resources(vec![AlterConfigsResource::default()
            .with_resource_type(resource_type)
            .with_resource_name(StrBytes::from_string(name.into()))
            .with_configs(vec![AlterableConfig::default()
                .with_name(StrBytes::from_string(key.into()))
                .with_value(Some(StrBytes::from_string(value.into())))])]);
    let mut s = common::wire::connect(port);
    let r: AlterConfigsResponse = common::wire::call(&mut s, ApiKey::AlterConfigs, 2, 1, &request);
    assert_eq!(r.responses.len(), 1, "one answer per resource");
    let r = &r.responses[0];
    (
        r.error_code,
        r.error_message.as_ref().map(|m| m.to_string()),
    )
}

fn alter(admin: &AdminClient<DefaultClientContext>, change: AlterConfig<'_>) -> AlterConfigsResult {
    futures_lite::future::block_on(admin.alter_configs([&change], &opts()))
        .expect("AlterConfigs answered")
        .pop()
        .unwrap()
}

/// Delivery reports of a producer.
#[derive(Default)]
struct Reports(Mutex<Vec<Result<(), RDKafkaErrorCode>>>);

impl ClientContext for Reports {}

impl ProducerContext for Reports {
    type DeliveryOpaque = ();
    fn delivery(&self, r: &DeliveryResult<'_>, _: ()) {
        let outcome = match r {
            Ok(_) => Ok(()),
            Err((e, _)) => Err(e.rdkafka_error_code().unwrap_or(RDKafkaErrorCode::Unknown)),
        };
        self.0.lock().unwrap().push(outcome);
    }
}

/// Produces one record of `bytes` bytes to `partition`; the error code if the broker refuses it.
fn produce(bootstrap: &str, partition: i32, bytes: usize) -> Result<(), RDKafkaErrorCode> {
    let p: BaseProducer<Reports> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("message.timeout.ms", "10000")
        .set("retries", "0")
        .create_with_context(Reports::default())
        .expect("producer");
    let value = vec![7u8; bytes];
    p.send(
        BaseRecord::<(), [u8]>::to(TOPIC)
            .partition(partition)
            .payload(&value[..]),
    )
    .expect("queued");
    for _ in 0..150 {
        p.poll(Duration::from_millis(100));
        if let Some(outcome) = p.client().context().0.lock().unwrap().pop() {
            return outcome;
        }
    }
    panic!("no delivery report");
}

#[test]
fn topic_configs_are_described_changed_everywhere_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 2, &[]);
    let bootstrap = shoal.bootstrap();
    create_topics(&bootstrap, &[(TOPIC, 2)]);
    let admin = admin(&bootstrap);
    let topic = ResourceSpecifier::Topic(TOPIC);

    assert_eq!(
        describe(&admin, ResourceSpecifier::Topic(TOPIC), "max.message.bytes"),
        (Some("1048588".into()), "Default".into(), false)
    );
    let (value, source, read_only) =
        describe(&admin, ResourceSpecifier::Broker(1), "log.segment.bytes");
    assert_eq!(
        (value.as_deref(), source.as_str(), read_only),
        (Some("268435456"), "Default", true)
    );

    // Refused, with their error codes, changing nothing. (The `rdkafka` crate reports every
    // AlterConfigs resource as a success, whatever its error code: these go on the wire.)
    let view = "tuned.shard-0-of-2";
    let before = [
        describe_all(&admin, ResourceSpecifier::Topic(TOPIC)),
        describe_all(&admin, ResourceSpecifier::Broker(0)),
        describe_all(&admin, ResourceSpecifier::Topic(view)),
    ];
    for (resource_type, name, key, value, code) in [
        (
            TOPIC_RESOURCE,
            TOPIC,
            "max.message.bytes",
            "soon",
            INVALID_CONFIG,
        ),
        (
            TOPIC_RESOURCE,
            TOPIC,
            "compression.type",
            "brotli",
            INVALID_CONFIG,
        ),
        (
            TOPIC_RESOURCE,
            TOPIC,
            "cleanup.policy",
            "compact,archive",
            INVALID_CONFIG,
        ),
        (
            BROKER_RESOURCE,
            "0",
            "log.segment.bytes",
            "1",
            INVALID_REQUEST,
        ),
        (TOPIC_RESOURCE, view, "retention.ms", "1", INVALID_REQUEST),
    ] {
        let (error, message) = alter_on_the_wire(shoal.ports[0], resource_type, name, key, value);
        assert_eq!(error, code, "{name}: {key}={value}: {message:?}");
    }
    let after = [
        describe_all(&admin, ResourceSpecifier::Topic(TOPIC)),
        describe_all(&admin, ResourceSpecifier::Broker(0)),
        describe_all(&admin, ResourceSpecifier::Topic(view)),
    ];
    assert_eq!(before, after, "the refused changes changed nothing");
    assert_eq!(
        describe(&admin, ResourceSpecifier::Topic(TOPIC), "max.message.bytes"),
        (Some("1048588".into()), "Default".into(), false)
    );

    // A 100 KB record goes in; after max.message.bytes=32768 it does not, on either partition: the
    // two live on different cores (round robin over the 2 cores), and both apply the change.
    for partition in [0, 1] {
        produce(&bootstrap, partition, 100_000).expect("accepted before the change");
    }
    alter(
        &admin,
        AlterConfig::new(topic).set("max.message.bytes", "32768"),
    )
    .expect("altered");
    assert_eq!(
        describe(&admin, ResourceSpecifier::Topic(TOPIC), "max.message.bytes"),
        (Some("32768".into()), "DynamicTopic".into(), false)
    );
    for partition in [0, 1] {
        assert_eq!(
            produce(&bootstrap, partition, 100_000),
            Err(RDKafkaErrorCode::MessageSizeTooLarge),
            "partition {partition}"
        );
    }

    shoal.stop();
    let shoal = Shoal::start(dir.path(), 2, &[]);
    let bootstrap = shoal.bootstrap();
    let admin = self::admin(&bootstrap);
    assert_eq!(
        describe(&admin, ResourceSpecifier::Topic(TOPIC), "max.message.bytes")
            .0
            .as_deref(),
        Some("32768"),
        "kept across a restart"
    );
    for partition in [0, 1] {
        assert_eq!(
            produce(&bootstrap, partition, 100_000),
            Err(RDKafkaErrorCode::MessageSizeTooLarge),
            "partition {partition} after a restart"
        );
    }
    shoal.stop();
}

/// The codec of every batch of partition 0 of `topic` as a Fetch (v12, by name) returns them.
fn fetched_codecs(port: u16, topic: &str) -> Vec<u8> {
    use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
    use kafka_protocol::messages::{ApiKey, FetchRequest, FetchResponse};
    let req = FetchRequest::default()
        .with_max_wait_ms(100)
        .with_max_bytes(1 << 20)
        .with_topics(vec![FetchTopic::default()
            .with_topic(common::wire::topic_name(topic))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(0)
                .with_partition_max_bytes(1 << 20)])]);
    let mut s = common::wire::connect(port);
    let r: FetchResponse = common::wire::call(&mut s, ApiKey::Fetch, 12, 1, &req);
    let p = &r.responses[0].partitions[0];
    assert_eq!(p.error_code, 0, "fetch of {topic}");
    let mut rest = p.records.clone().unwrap_or_default();
    let mut codecs = Vec::new();
    while !rest.is_empty() {
        let h = shards::batch::BatchHeader::parse(&rest).expect("a whole batch");
        codecs.push(h.compression());
        rest = rest.split_off(h.total_len());
    }
    codecs
}

/// `compression.type` as Kafka means it: `zstd` on a topic written uncompressed stores (and
/// serves) zstd batches that decode to the same records, `uncompressed` undoes a producer's
/// gzip, and `producer` (the default) keeps what the producer sent.
#[test]
fn compression_type_recompresses_batches_on_append() {
    use rdkafka::admin::{NewTopic, TopicReplication};
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 1, &[]);
    let bootstrap = shoal.bootstrap();
    let admin = admin(&bootstrap);
    let topics = [
        ("to-zstd", Some("zstd"), "none", 4),
        ("to-plain", Some("uncompressed"), "gzip", 0),
        ("as-sent", None, "gzip", 1),
    ];
    let new: Vec<NewTopic> = topics
        .iter()
        .map(|(name, codec, _, _)| {
            let t = NewTopic::new(name, 1, TopicReplication::Fixed(1));
            match codec {
                Some(c) => t.set("compression.type", c),
                None => t,
            }
        })
        .collect();
    for r in futures_lite::future::block_on(admin.create_topics(&new, &opts())).unwrap() {
        r.expect("topic created");
    }
    let sent: Vec<String> = (0..200).map(|i| format!("record {i} ").repeat(8)).collect();
    for (name, _, producer_codec, _) in topics {
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("compression.codec", producer_codec)
            .set("linger.ms", "20")
            .create()
            .unwrap();
        for v in &sent {
            producer
                .send(BaseRecord::<(), _>::to(name).partition(0).payload(v))
                .unwrap();
        }
        producer.flush(Duration::from_secs(10)).unwrap();
    }
    for (name, _, _, stored) in topics {
        let codecs = fetched_codecs(shoal.ports[0], name);
        assert!(!codecs.is_empty(), "{name}: batches");
        assert!(
            codecs.iter().all(|&c| c == stored),
            "{name}: every batch in codec {stored}: {codecs:?}"
        );
    }
    // librdkafka (confluent-kafka's, built with zstd) reads the zstd batches.
    let read =
        common::python::run_script("librdkafka_read.py", &[&bootstrap, "to-zstd", "200", "{}"]);
    let read: serde_json::Value = serde_json::from_str(read.trim()).expect("one JSON line");
    assert_eq!(read["ok"], true, "{read}");
    let got: Vec<&str> = read["records"]
        .as_array()
        .expect("records")
        .iter()
        .map(|r| r["value"].as_str().expect("a value"))
        .collect();
    assert_eq!(got, sent, "the zstd batches decode to the records sent");
    let (value, source, _) = describe(
        &admin,
        ResourceSpecifier::Topic("to-zstd"),
        "compression.type",
    );
    assert_eq!(
        (value.as_deref(), source.as_str()),
        (Some("zstd"), "DynamicTopic")
    );
    shoal.stop();
}

/// DeleteRecords through librdkafka's admin client: a topic of `cleanup.policy=delete` moves its
/// start; a compacted one refuses (POLICY_VIOLATION, as Kafka refuses it) and keeps every record.
#[test]
fn delete_records_moves_a_deleting_topic_and_is_refused_for_a_compacted_one() {
    use rdkafka::admin::{NewTopic, TopicReplication};
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::{Offset, TopicPartitionList};
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 1, &[]);
    let bootstrap = shoal.bootstrap();
    let admin = admin(&bootstrap);
    let topics = [
        NewTopic::new("deleting", 1, TopicReplication::Fixed(1)),
        NewTopic::new("compacted", 1, TopicReplication::Fixed(1)).set("cleanup.policy", "compact"),
    ];
    for r in futures_lite::future::block_on(admin.create_topics(&topics, &opts())).unwrap() {
        r.expect("topic created");
    }
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .unwrap();
    for topic in ["deleting", "compacted"] {
        for i in 0..10 {
            let k = format!("k{i}");
            producer
                .send(BaseRecord::to(topic).partition(0).key(&k).payload("v"))
                .unwrap();
        }
    }
    producer.flush(Duration::from_secs(10)).unwrap();
    let mut asked = TopicPartitionList::new();
    asked
        .add_partition_offset("deleting", 0, Offset::Offset(4))
        .unwrap();
    asked
        .add_partition_offset("compacted", 0, Offset::Offset(4))
        .unwrap();
    let done = futures_lite::future::block_on(admin.delete_records(&asked, &opts())).unwrap();
    let deleting = done.find_partition("deleting", 0).unwrap();
    assert_eq!(
        (deleting.offset(), deleting.error()),
        (Offset::Offset(4), Ok(()))
    );
    let compacted = done.find_partition("compacted", 0).unwrap();
    assert_eq!(
        compacted.error().unwrap_err().rdkafka_error_code(),
        Some(RDKafkaErrorCode::PolicyViolation)
    );
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .unwrap();
    let marks = |t: &str| {
        consumer
            .fetch_watermarks(t, 0, Duration::from_secs(10))
            .unwrap()
    };
    assert_eq!(marks("deleting"), (4, 10));
    assert_eq!(marks("compacted"), (0, 10));
    shoal.stop();
}
