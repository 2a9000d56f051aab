//! Transactional offset commits as raw wire bytes against the real binary: TxnOffsetCommit writes
//! pending offsets that OffsetFetch does not show (and, with `require_stable`, reports as
//! `UNSTABLE_OFFSET_COMMIT`), its KIP-447 member and generation checks, the wrong coordinator,
//! bad partitions and metadata, and pending offsets surviving a crash of the broker. Ending the
//! transaction (EndTxn through the transaction coordinator) is covered by the groups' unit tests.

use crate::common;

use common::wire::{self, connect};
use common::{create_topics, Shoal};
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::{
    OffsetFetchRequestGroup, OffsetFetchRequestTopic, OffsetFetchRequestTopics,
};
use kafka_protocol::messages::txn_offset_commit_request::{
    TxnOffsetCommitRequestPartition, TxnOffsetCommitRequestTopic,
};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use shoal::groups::coordinator_core;
use std::net::TcpStream;

const NONE: i16 = 0;
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
const OFFSET_METADATA_TOO_LARGE: i16 = 12;
const NOT_COORDINATOR: i16 = 16;
const ILLEGAL_GENERATION: i16 = 22;
const UNKNOWN_MEMBER_ID: i16 = 25;
const INVALID_PRODUCER_EPOCH: i16 = 47;
const UNSTABLE_OFFSET_COMMIT: i16 = 88;

/// The fake producer whose transaction commits the offsets (no transaction coordinator is asked).
const PRODUCER: i64 = 4242;

fn call<Req: Encodable, Resp: Decodable>(
    s: &mut TcpStream,
    key: ApiKey,
    version: i16,
    body: &Req,
) -> Resp {
    wire::call(s, key, version, 7, body)
}

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// A group name whose coordinator is `core` of `cores`.
fn group_on(core: usize, cores: usize) -> String {
    (0..)
        .map(|i| format!("txg-{i}"))
        .find(|g| coordinator_core(g, cores) == core)
        .unwrap()
}

/// A TxnOffsetCommit of `offset` for partition `partition` of "t".
fn txn_commit_req(
    group: &str,
    epoch: i16,
    generation: i32,
    member: &str,
    partition: i32,
    offset: i64,
) -> TxnOffsetCommitRequest {
    TxnOffsetCommitRequest::default()
        .with_transactional_id(TransactionalId(s("tx-1")))
        .with_group_id(GroupId(s(group)))
        .with_producer_id(ProducerId(PRODUCER))
        .with_producer_epoch(epoch)
        .with_generation_id(generation)
        .with_member_id(s(member))
        .with_topics(vec![TxnOffsetCommitRequestTopic::default()
            .with_name(TopicName(s("t")))
            .with_partitions(vec![TxnOffsetCommitRequestPartition::default()
                .with_partition_index(partition)
                .with_committed_offset(offset)
                .with_committed_metadata(Some(s("tx")))])])
}

/// The error of the first partition of a TxnOffsetCommit at `version`.
fn txn_commit(c: &mut TcpStream, version: i16, req: &TxnOffsetCommitRequest) -> i16 {
    let r: TxnOffsetCommitResponse = call(c, ApiKey::TxnOffsetCommit, version, req);
    assert_eq!(r.topics.len(), 1, "{r:?}");
    r.topics[0].partitions[0].error_code
}

/// (offset, error) of partition 0 of "t" for `group`, with OffsetFetch v7.
fn fetch(c: &mut TcpStream, group: &str, require_stable: bool) -> (i64, i16) {
    let r: OffsetFetchResponse = call(
        c,
        ApiKey::OffsetFetch,
        7,
        &OffsetFetchRequest::default()
            .with_group_id(GroupId(s(group)))
            .with_require_stable(require_stable)
            .with_topics(Some(vec![OffsetFetchRequestTopic::default()
                .with_name(TopicName(s("t")))
                .with_partition_indexes(vec![0])])),
    );
    assert_eq!(r.error_code, NONE);
    let p = &r.topics[0].partitions[0];
    (p.committed_offset, p.error_code)
}

/// (offset, error) of partition 0 of "t" for `group`, with OffsetFetch v8 (the groups array).
fn fetch_v8(c: &mut TcpStream, group: &str, require_stable: bool) -> (i64, i16) {
    let r: OffsetFetchResponse = call(
        c,
        ApiKey::OffsetFetch,
        8,
        &OffsetFetchRequest::default()
            .with_require_stable(require_stable)
            .with_groups(vec![OffsetFetchRequestGroup::default()
                .with_group_id(GroupId(s(group)))
                .with_topics(Some(vec![OffsetFetchRequestTopics::default()
                    .with_name(TopicName(s("t")))
                    .with_partition_indexes(vec![0])]))]),
    );
    let g = &r.groups[0];
    assert_eq!(g.error_code, NONE);
    let p = &g.topics[0].partitions[0];
    (p.committed_offset, p.error_code)
}

/// A plain (non-transactional) commit of `offset` for partition 0 of "t".
fn simple_commit(c: &mut TcpStream, group: &str, offset: i64) {
    let r: OffsetCommitResponse = call(
        c,
        ApiKey::OffsetCommit,
        8,
        &OffsetCommitRequest::default()
            .with_group_id(GroupId(s(group)))
            .with_generation_id_or_member_epoch(-1)
            .with_topics(vec![OffsetCommitRequestTopic::default()
                .with_name(TopicName(s("t")))
                .with_partitions(vec![OffsetCommitRequestPartition::default()
                    .with_partition_index(0)
                    .with_committed_offset(offset)])]),
    );
    assert_eq!(r.topics[0].partitions[0].error_code, NONE);
}

/// Joins `group` as its only member (JoinGroup v3: no member id round trip); (generation,
/// member id).
fn join(c: &mut TcpStream, group: &str) -> (i32, String) {
    let r: JoinGroupResponse = call(
        c,
        ApiKey::JoinGroup,
        3,
        &JoinGroupRequest::default()
            .with_group_id(GroupId(s(group)))
            .with_session_timeout_ms(30_000)
            .with_rebalance_timeout_ms(10_000)
            .with_protocol_type(s("consumer"))
            .with_protocols(vec![JoinGroupRequestProtocol::default()
                .with_name(s("range"))
                .with_metadata(Default::default())]),
    );
    assert_eq!(r.error_code, NONE, "{r:?}");
    (r.generation_id, r.member_id.to_string())
}

#[test]
fn pending_transactional_offsets_are_unstable_until_the_transaction_ends_and_survive_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let flags = ["--group-initial-rebalance-delay-ms", "0"];
    let shoal = Shoal::start(dir.path(), 2, &flags);
    create_topics(&shoal.bootstrap(), &[("t", 2)]);
    let g = group_on(1, 2);
    let mut c = connect(shoal.ports[1]);
    let mut other = connect(shoal.ports[0]);

    simple_commit(&mut c, &g, 10);
    // Old clients (and v3 clients outside a group) send generation -1 and no member id.
    assert_eq!(
        txn_commit(&mut c, 3, &txn_commit_req(&g, 1, -1, "", 0, 20)),
        NONE
    );
    assert_eq!(fetch(&mut c, &g, true), (-1, UNSTABLE_OFFSET_COMMIT));
    assert_eq!(
        fetch(&mut c, &g, false),
        (10, NONE),
        "the pending offset is not shown"
    );
    assert_eq!(fetch_v8(&mut c, &g, true), (-1, UNSTABLE_OFFSET_COMMIT));
    assert_eq!(fetch_v8(&mut c, &g, false), (10, NONE));
    // A later TxnOffsetCommit of the producer replaces its pending offset; a zombie of an older
    // epoch may not.
    assert_eq!(
        txn_commit(&mut c, 0, &txn_commit_req(&g, 1, -1, "", 0, 21)),
        NONE
    );
    assert_eq!(
        txn_commit(&mut c, 3, &txn_commit_req(&g, 0, -1, "", 0, 5)),
        INVALID_PRODUCER_EPOCH
    );

    // The wrong core, unknown partitions and oversized metadata.
    assert_eq!(
        txn_commit(&mut other, 3, &txn_commit_req(&g, 1, -1, "", 0, 22)),
        NOT_COORDINATOR
    );
    assert_eq!(
        txn_commit(&mut c, 3, &txn_commit_req(&g, 1, -1, "", 9, 22)),
        UNKNOWN_TOPIC_OR_PARTITION
    );
    let mut big = txn_commit_req(&g, 1, -1, "", 1, 22);
    big.topics[0].partitions[0].committed_metadata = Some(s(&"m".repeat(5000)));
    assert_eq!(txn_commit(&mut c, 3, &big), OFFSET_METADATA_TOO_LARGE);

    // KIP-447 (v3): a member id and generation given are checked against the group.
    let (generation, member) = join(&mut c, &g);
    assert_eq!(
        txn_commit(
            &mut c,
            3,
            &txn_commit_req(&g, 1, generation + 1, &member, 0, 23)
        ),
        ILLEGAL_GENERATION
    );
    assert_eq!(
        txn_commit(
            &mut c,
            3,
            &txn_commit_req(&g, 1, generation, "nobody", 0, 23)
        ),
        UNKNOWN_MEMBER_ID
    );
    assert_eq!(
        txn_commit(
            &mut c,
            3,
            &txn_commit_req(&g, 1, generation, &member, 0, 23)
        ),
        NONE
    );
    assert_eq!(fetch(&mut c, &g, false), (10, NONE));

    // Answered once durable: a crash right after keeps the pending offset.
    drop((c, other));
    shoal.kill_hard();
    let shoal = Shoal::start(dir.path(), 2, &flags);
    let mut c = connect(shoal.ports[1]);
    assert_eq!(fetch(&mut c, &g, true), (-1, UNSTABLE_OFFSET_COMMIT));
    assert_eq!(fetch(&mut c, &g, false), (10, NONE));
    drop(c);
    shoal.stop();
}
