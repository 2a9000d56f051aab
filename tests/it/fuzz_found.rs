//! What the request-path fuzzer (`tests/it/fuzz.rs`) found, each as a raw-wire regression test against
//! the real binary: the request is answered (not its connection closed), with the error code Kafka
//! would give, and the broker's log tells of no panic.

use crate::common;

use common::wire::{call, connect, create_topic_request, produce_request};
use common::Shoal;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::{
    ApiKey, BrokerId, CreateTopicsResponse, ListOffsetsRequest, ListOffsetsResponse,
    ProduceResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use shards::batch::{BatchBuilder, BatchHeader};
use std::sync::{Arc, Mutex};

fn name(s: &str) -> TopicName {
    TopicName(StrBytes::from_string(s.to_string()))
}

/// A one-core broker whose log lines are kept, for [`no_panic`].
fn start(dir: &std::path::Path) -> (Shoal, Arc<Mutex<Vec<String>>>) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let lines = log.clone();
    let shoal = Shoal::start_watching_log(dir, 1, &[], move |l| {
        lines.lock().unwrap().push(l.to_string())
    });
    (shoal, log)
}

fn no_panic(log: &Mutex<Vec<String>>) {
    let log = log.lock().unwrap();
    let panics: Vec<&String> = log.iter().filter(|l| l.contains("panicked")).collect();
    assert!(panics.is_empty(), "the broker panicked: {panics:#?}");
}

fn create_topic(port: u16, topic: &str) {
    let r: CreateTopicsResponse = call(
        &mut connect(port),
        ApiKey::CreateTopics,
        7,
        1,
        &create_topic_request(topic, 1),
    );
    assert_eq!(r.topics[0].error_code, 0);
}

fn produce(port: u16, topic: &str, batch: Vec<u8>) -> (i16, i64) {
    let r: ProduceResponse = call(
        &mut connect(port),
        ApiKey::Produce,
        9,
        1,
        &produce_request(topic, 0, batch, -1),
    );
    let p = &r.responses[0].partition_responses[0];
    (p.error_code, p.base_offset)
}

/// A record's timestamp is its batch's base timestamp plus its delta; a batch with base 100 and a
/// delta of `i64::MAX` (CRC right) was accepted, and a ListOffsets by timestamp that reached it
/// overflowed i64 while decoding its records: a panic. Such a batch is now refused at produce
/// (`INVALID_RECORD`); one already in a log (written before that check) is put there by hand, and
/// the lookup answers from its header (offset 0, its max timestamp) without a panic.
#[test]
fn list_offsets_by_timestamp_over_a_record_timestamp_beyond_i64() {
    let dir = tempfile::tempdir().unwrap();
    let (shoal, log) = start(dir.path());
    let port = shoal.ports[0];
    create_topic(port, "t");
    let mut b = BatchBuilder::new(0);
    b.push(i64::MAX, None, Some(b"edge"), &[]);
    let mut batch = b.finish(0);
    let mut h = BatchHeader::parse(&batch).unwrap();
    h.base_timestamp = 100;
    shards::batch::write_header(&mut batch, &h);
    const INVALID_RECORD: i16 = 87;
    assert_eq!(produce(port, "t", batch.clone()).0, INVALID_RECORD);
    assert_eq!(list_offsets_at(port, 1000), [(0, -1, -1), (0, -1, -1)]);
    no_panic(&log);
    shoal.stop();

    // The same batch already in the log, as an older shoal would have written it.
    let segment = dir.path().join("topics/t/0").join(format!("{:020}.log", 0));
    let mut bytes = std::fs::read(&segment).unwrap();
    assert!(bytes.is_empty(), "the refused batch left nothing behind");
    bytes.extend_from_slice(&batch);
    std::fs::write(&segment, bytes).unwrap();
    let (shoal, log) = start(dir.path());
    let port = shoal.ports[0];
    assert_eq!(
        list_offsets_at(port, 1000),
        [(0, 0, i64::MAX), (0, 0, i64::MAX)],
        "v1 and v7 answer from the batch header"
    );
    no_panic(&log);
    shoal.stop();
}

/// (error code, offset, timestamp) of ListOffsets v1 and v7 for `timestamp` on t-0.
fn list_offsets_at(port: u16, timestamp: i64) -> Vec<(i16, i64, i64)> {
    [1, 7]
        .into_iter()
        .map(|v| {
            let r: ListOffsetsResponse = call(
                &mut connect(port),
                ApiKey::ListOffsets,
                v,
                2,
                &ListOffsetsRequest::default()
                    .with_replica_id(BrokerId(-1))
                    .with_topics(vec![ListOffsetsTopic::default()
                        .with_name(name("t"))
                        .with_partitions(vec![ListOffsetsPartition::default()
                            .with_partition_index(0)
                            .with_timestamp(timestamp)])]),
            );
            let p = &r.topics[0].partitions[0];
            (p.error_code, p.offset, p.timestamp)
        })
        .collect()
}

/// The transaction coordinator's ticker aborts timed-out transactions by asking the partitions'
/// owner cores for markers over the mesh. At SIGTERM, an owner core that stopped before answering
/// left the coordinator core waiting for the answer (up to a minute), and the broker did not stop
/// in time; a stopping core now gives the exchange up (the transaction, durable in its Prepare
/// state, is completed at the next start). Here core 0 coordinates transactions (1 ms timeouts)
/// on a partition core 1 owns, so its ticker (every 10 ms) is always asking core 1 when the broker
/// is told to stop.
#[test]
fn a_broker_stops_while_its_transaction_ticker_waits_for_another_core() {
    use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
    use kafka_protocol::messages::{
        AddPartitionsToTxnRequest, AddPartitionsToTxnResponse, InitProducerIdRequest,
        InitProducerIdResponse, ProducerId, TransactionalId,
    };
    for round in 0..3 {
        let dir = tempfile::tempdir().unwrap();
        let shoal = Shoal::start(
            dir.path(),
            2,
            &["--transaction-timeout-check-interval-ms", "10"],
        );
        let r: CreateTopicsResponse = call(
            &mut connect(shoal.ports[0]),
            ApiKey::CreateTopics,
            7,
            1,
            &create_topic_request("t", 2),
        );
        assert_eq!(r.topics[0].error_code, 0);
        // Partitions are spread round robin: t-1 is core 1's.
        let ids: Vec<String> = (0..)
            .map(|i| format!("tx-stop-{round}-{i}"))
            .filter(|id| shoal::transactions::coordinator_core(id, 2) == 0)
            .take(400)
            .collect();
        let mut s = connect(shoal.ports[0]);
        let started = std::time::Instant::now();
        for (n, id) in ids.iter().enumerate() {
            if started.elapsed() > std::time::Duration::from_millis(1500) {
                break;
            }
            let init: InitProducerIdResponse = call(
                &mut s,
                ApiKey::InitProducerId,
                1,
                n as i32,
                &InitProducerIdRequest::default()
                    .with_transactional_id(Some(TransactionalId(StrBytes::from_string(id.clone()))))
                    .with_transaction_timeout_ms(1),
            );
            assert_eq!(init.error_code, 0);
            let _: AddPartitionsToTxnResponse = call(
                &mut s,
                ApiKey::AddPartitionsToTxn,
                1,
                n as i32,
                &AddPartitionsToTxnRequest::default()
                    .with_v3_and_below_transactional_id(TransactionalId(StrBytes::from_string(
                        id.clone(),
                    )))
                    .with_v3_and_below_producer_id(ProducerId(init.producer_id.0))
                    .with_v3_and_below_producer_epoch(init.producer_epoch)
                    .with_v3_and_below_topics(vec![AddPartitionsToTxnTopic::default()
                        .with_name(name("t"))
                        .with_partitions(vec![1])]),
            );
        }
        drop(s);
        let stopping = std::time::Instant::now();
        shoal.stop();
        eprintln!("round {round}: stopped in {:?}", stopping.elapsed());
    }
}
