//! The version walk's requests (`every_advertised_version_answers`): one sensible request for each
//! API shoal serves, at any of its versions, built from `Default::default()` with what a useful
//! answer needs, against the state [`Walk::prepare`] sets up first: a topic with records, a group
//! with a stable member, a transactional producer. Requests that use something up (a topic to
//! delete, a member to leave) set up their own on a connection of their own.

use crate::common::wire::{
    call, connect, create_topic_request, produce_request, request_frame, topic_name,
};
use bytes::Bytes;
use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use kafka_protocol::messages::alter_configs_request::{AlterConfigsResource, AlterableConfig};
use kafka_protocol::messages::alter_user_scram_credentials_request::ScramCredentialUpsertion;
use kafka_protocol::messages::create_acls_request::AclCreation;
use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
use kafka_protocol::messages::delete_acls_request::DeleteAclsFilter;
use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::incremental_alter_configs_request as incremental;
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::{
    OffsetFetchRequestGroup, OffsetFetchRequestTopic,
};
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::txn_offset_commit_request::{
    TxnOffsetCommitRequestPartition, TxnOffsetCommitRequestTopic,
};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Encodable, StrBytes};
use shards::batch::BatchBuilder;
use uuid::Uuid;

/// The topic the walk reads and writes (one partition, with records).
const TOPIC: &str = "walk";
/// The topic CreatePartitions grows, a partition per version.
const GROWN: &str = "walk-grown";
/// The group with a stable member, whose coordinator is the one core.
const GROUP: &str = "walk-group";
const TRANSACTIONAL_ID: &str = "walk-txn";
/// The user the SASL listener knows, and the one SaslAuthenticate names on the plain listener.
pub const USER: &str = "walker";
pub const PASSWORD: &str = "walker-password";

/// Long enough for the stable member to outlive the walk, even one slowed by requests that go
/// unanswered until the sockets' timeout.
const SESSION_TIMEOUT_MS: i32 = 600_000;

const NONE: i16 = 0;
const MEMBER_ID_REQUIRED: i16 = 79;

// Kafka's ACL enums (resource type, pattern type, operation, permission).
const ANY: i8 = 1;
const TOPIC_RESOURCE: i8 = 2;
const LITERAL: i8 = 3;
const READ: i8 = 3;
const ALLOW: i8 = 3;
// Config resource types.
const TOPIC_CONFIGS: i8 = 2;
const BROKER_CONFIGS: i8 = 4;

fn s(v: impl Into<String>) -> StrBytes {
    StrBytes::from_string(v.into())
}

fn group_id(g: &str) -> GroupId {
    GroupId(s(g))
}

/// One record in a RecordBatch v2.
fn one_record() -> Vec<u8> {
    let ts = 1_700_000_000_000;
    let mut b = BatchBuilder::new(ts);
    b.push(ts, Some(b"k"), Some(b"walk"), &[]);
    b.finish(0)
}

/// The PLAIN token of [`USER`].
pub fn plain_token() -> Bytes {
    Bytes::from(format!("\0{USER}\0{PASSWORD}"))
}

/// A request body of any API, encoded into a whole frame once its version and correlation id are
/// known.
struct Body(Box<dyn Fn(ApiKey, i16, i32) -> Vec<u8>>);

impl<R: Encodable + 'static> From<R> for Body {
    fn from(body: R) -> Body {
        Body(Box::new(move |key, version, correlation| {
            request_frame(key, version, correlation, &body)
        }))
    }
}

/// The state the walk's requests refer to, on the broker at `port`.
pub struct Walk {
    port: u16,
    topic_id: Uuid,
    generation: i32,
    member: StrBytes,
    producer_id: ProducerId,
    producer_epoch: i16,
}

impl Walk {
    /// Creates the topics, produces to [`TOPIC`], makes a stable member of [`GROUP`] and a
    /// transactional producer. Panics (naming the request) where the broker refuses any of it.
    pub fn prepare(port: u16) -> Walk {
        let mut c = connect(port);
        for topic in [TOPIC, GROWN] {
            let r: CreateTopicsResponse = call(
                &mut c,
                ApiKey::CreateTopics,
                7,
                1,
                &create_topic_request(topic, 1),
            );
            assert_eq!(r.topics[0].error_code, NONE, "create {topic}");
        }
        let r: MetadataResponse = call(
            &mut c,
            ApiKey::Metadata,
            12,
            2,
            &MetadataRequest::default().with_topics(Some(vec![
                MetadataRequestTopic::default().with_name(Some(topic_name(TOPIC)))
            ])),
        );
        let topic_id = r.topics[0].topic_id;
        let r: ProduceResponse = call(
            &mut c,
            ApiKey::Produce,
            9,
            3,
            &produce_request(TOPIC, 0, one_record(), 1),
        );
        assert_eq!(r.responses[0].partition_responses[0].error_code, NONE);
        let (generation, member) = join(&mut c, GROUP);
        let give = SyncGroupRequestAssignment::default()
            .with_member_id(member.clone())
            .with_assignment(Bytes::from_static(b"walk"));
        let sync = SyncGroupRequest::default()
            .with_group_id(group_id(GROUP))
            .with_generation_id(generation)
            .with_member_id(member.clone())
            .with_assignments(vec![give]);
        let r: SyncGroupResponse = call(&mut c, ApiKey::SyncGroup, 5, 4, &sync);
        assert_eq!(r.error_code, NONE, "sync {GROUP}");
        let init = InitProducerIdRequest::default()
            .with_transactional_id(Some(TransactionalId(s(TRANSACTIONAL_ID))))
            .with_transaction_timeout_ms(60_000);
        let r: InitProducerIdResponse = call(&mut c, ApiKey::InitProducerId, 4, 5, &init);
        assert_eq!(r.error_code, NONE, "InitProducerId for {TRANSACTIONAL_ID}");
        Walk {
            port,
            topic_id,
            generation,
            member,
            producer_id: r.producer_id,
            producer_epoch: r.producer_epoch,
        }
    }

    /// The whole frame of a request for `key` at `version`; `None` for an API this walk has no
    /// request for.
    pub fn request(&self, key: ApiKey, version: i16, correlation: i32) -> Option<Vec<u8>> {
        let body = self
            .data_path(key)
            .or_else(|| self.topics_and_configs(key, version))
            .or_else(|| self.groups(key, version))
            .or_else(|| self.security(key))
            .or_else(|| self.transactions(key))?;
        Some((body.0)(key, version, correlation))
    }

    fn data_path(&self, key: ApiKey) -> Option<Body> {
        Some(match key {
            ApiKey::Produce => {
                let mut r = produce_request(TOPIC, 0, one_record(), 1);
                r.topic_data[0].topic_id = self.topic_id;
                Body::from(r)
            }
            ApiKey::Fetch => Body::from(
                FetchRequest::default()
                    .with_min_bytes(1)
                    .with_max_bytes(1 << 20)
                    .with_topics(vec![FetchTopic::default()
                        .with_topic(topic_name(TOPIC))
                        .with_topic_id(self.topic_id)
                        .with_partitions(vec![FetchPartition::default()
                            .with_fetch_offset(0)
                            .with_partition_max_bytes(1 << 20)])]),
            ),
            ApiKey::ListOffsets => Body::from(
                ListOffsetsRequest::default()
                    .with_replica_id(BrokerId(-1))
                    .with_topics(vec![ListOffsetsTopic::default()
                        .with_name(topic_name(TOPIC))
                        .with_partitions(vec![
                            ListOffsetsPartition::default().with_timestamp(-1)
                        ])]),
            ),
            ApiKey::Metadata => Body::from(MetadataRequest::default().with_topics(Some(vec![
                MetadataRequestTopic::default().with_name(Some(topic_name(TOPIC))),
            ]))),
            ApiKey::ApiVersions => Body::from(
                ApiVersionsRequest::default()
                    .with_client_software_name(s("shoal-walk"))
                    .with_client_software_version(s("1.0")),
            ),
            ApiKey::InitProducerId => Body::from(
                InitProducerIdRequest::default()
                    .with_transactional_id(None)
                    .with_transaction_timeout_ms(60_000),
            ),
            ApiKey::DescribeLogDirs => {
                Body::from(DescribeLogDirsRequest::default().with_topics(None))
            }
            _ => return None,
        })
    }

    fn topics_and_configs(&self, key: ApiKey, v: i16) -> Option<Body> {
        Some(match key {
            ApiKey::CreateTopics => Body::from(create_topic_request(&format!("walk-new-v{v}"), 1)),
            ApiKey::CreatePartitions => Body::from(
                CreatePartitionsRequest::default()
                    .with_timeout_ms(10_000)
                    .with_topics(vec![CreatePartitionsTopic::default()
                        .with_name(topic_name(GROWN))
                        // Versions come in increasing order: one more partition each.
                        .with_count(i32::from(v) + 2)
                        .with_assignments(None)]),
            ),
            ApiKey::DeleteTopics => {
                let doomed = format!("walk-doomed-v{v}");
                let r: CreateTopicsResponse = call(
                    &mut connect(self.port),
                    ApiKey::CreateTopics,
                    7,
                    1,
                    &create_topic_request(&doomed, 1),
                );
                assert_eq!(r.topics[0].error_code, NONE, "create {doomed}");
                let r = DeleteTopicsRequest::default().with_timeout_ms(10_000);
                Body::from(if v >= 6 {
                    r.with_topics(vec![
                        DeleteTopicState::default().with_name(Some(topic_name(&doomed)))
                    ])
                } else {
                    r.with_topic_names(vec![topic_name(&doomed)])
                })
            }
            ApiKey::DescribeConfigs => Body::from(
                DescribeConfigsRequest::default()
                    .with_resources(vec![
                        DescribeConfigsResource::default()
                            .with_resource_type(TOPIC_CONFIGS)
                            .with_resource_name(s(TOPIC))
                            .with_configuration_keys(None),
                        DescribeConfigsResource::default()
                            .with_resource_type(BROKER_CONFIGS)
                            .with_resource_name(s("0"))
                            .with_configuration_keys(None),
                    ])
                    .with_include_synonyms(true)
                    .with_include_documentation(v >= 3),
            ),
            ApiKey::AlterConfigs => Body::from(
                AlterConfigsRequest::default()
                    .with_validate_only(true)
                    .with_resources(vec![AlterConfigsResource::default()
                        .with_resource_type(TOPIC_CONFIGS)
                        .with_resource_name(s(TOPIC))
                        .with_configs(vec![AlterableConfig::default()
                            .with_name(s("retention.ms"))
                            .with_value(Some(s("86400000")))])]),
            ),
            ApiKey::IncrementalAlterConfigs => Body::from(
                IncrementalAlterConfigsRequest::default()
                    .with_validate_only(true)
                    .with_resources(vec![incremental::AlterConfigsResource::default()
                        .with_resource_type(TOPIC_CONFIGS)
                        .with_resource_name(s(TOPIC))
                        .with_configs(vec![incremental::AlterableConfig::default()
                            .with_name(s("retention.ms"))
                            .with_config_operation(0) // SET
                            .with_value(Some(s("86400000")))])]),
            ),
            _ => return None,
        })
    }

    fn groups(&self, key: ApiKey, v: i16) -> Option<Body> {
        let (generation, member) = (self.generation, self.member.clone());
        Some(match key {
            ApiKey::FindCoordinator => {
                let r = FindCoordinatorRequest::default();
                Body::from(if v >= 4 {
                    r.with_coordinator_keys(vec![s(GROUP)])
                } else {
                    r.with_key(s(GROUP))
                })
            }
            // A new member of a group of its own: from v4 answered at once with MEMBER_ID_REQUIRED,
            // before that with the group's first generation (no initial rebalance delay).
            ApiKey::JoinGroup => Body::from(join_request(&format!("walk-join-v{v}"), s(""))),
            ApiKey::SyncGroup => {
                let r = SyncGroupRequest::default()
                    .with_group_id(group_id(GROUP))
                    .with_generation_id(generation)
                    .with_member_id(member.clone())
                    .with_assignments(vec![SyncGroupRequestAssignment::default()
                        .with_member_id(member)
                        .with_assignment(Bytes::from_static(b"walk"))]);
                Body::from(if v >= 5 {
                    r.with_protocol_type(Some(s("consumer")))
                        .with_protocol_name(Some(s("range")))
                } else {
                    r
                })
            }
            ApiKey::Heartbeat => Body::from(
                HeartbeatRequest::default()
                    .with_group_id(group_id(GROUP))
                    .with_generation_id(generation)
                    .with_member_id(member),
            ),
            ApiKey::LeaveGroup => {
                let group = format!("walk-leave-v{v}");
                let (_, leaving) = join(&mut connect(self.port), &group);
                let r = LeaveGroupRequest::default().with_group_id(group_id(&group));
                Body::from(if v >= 3 {
                    r.with_members(vec![MemberIdentity::default().with_member_id(leaving)])
                } else {
                    r.with_member_id(leaving)
                })
            }
            ApiKey::OffsetCommit => Body::from(commit_request(GROUP, generation, member)),
            ApiKey::OffsetFetch => {
                let r = OffsetFetchRequest::default();
                Body::from(if v >= 8 {
                    r.with_groups(vec![OffsetFetchRequestGroup::default()
                        .with_group_id(group_id(GROUP))
                        .with_topics(None)])
                } else {
                    r.with_group_id(group_id(GROUP)).with_topics(Some(vec![
                        OffsetFetchRequestTopic::default()
                            .with_name(topic_name(TOPIC))
                            .with_partition_indexes(vec![0]),
                    ]))
                })
            }
            ApiKey::ListGroups => Body::from(ListGroupsRequest::default()),
            ApiKey::DescribeGroups => {
                Body::from(DescribeGroupsRequest::default().with_groups(vec![group_id(GROUP)]))
            }
            ApiKey::DeleteGroups => {
                // A group with offsets only (a simple commit), so that there is one to delete.
                let group = format!("walk-offsets-v{v}");
                let r: OffsetCommitResponse = call(
                    &mut connect(self.port),
                    ApiKey::OffsetCommit,
                    8,
                    1,
                    &commit_request(&group, -1, s("")),
                );
                assert_eq!(r.topics[0].partitions[0].error_code, NONE, "commit {group}");
                Body::from(DeleteGroupsRequest::default().with_groups_names(vec![group_id(&group)]))
            }
            ApiKey::OffsetDelete => {
                let group = format!("walk-offset-delete-v{v}");
                let r: OffsetCommitResponse = call(
                    &mut connect(self.port),
                    ApiKey::OffsetCommit,
                    8,
                    1,
                    &commit_request(&group, -1, s("")),
                );
                assert_eq!(r.topics[0].partitions[0].error_code, NONE, "commit {group}");
                Body::from(
                    OffsetDeleteRequest::default()
                        .with_group_id(group_id(&group))
                        .with_topics(vec![
                            offset_delete_request::OffsetDeleteRequestTopic::default()
                                .with_name(topic_name(TOPIC))
                                .with_partitions(vec![
                                    offset_delete_request::OffsetDeleteRequestPartition::default(),
                                ]),
                        ]),
                )
            }
            ApiKey::ConsumerGroupHeartbeat => {
                // A member of a consumer-protocol group of its own joins (v0: the coordinator
                // names it; v1: it names itself).
                let member = if v == 0 { "" } else { "walk-member-v1" };
                Body::from(
                    ConsumerGroupHeartbeatRequest::default()
                        .with_group_id(group_id(&format!("walk-consumer-group-v{v}")))
                        .with_member_id(s(member))
                        .with_rebalance_timeout_ms(30_000)
                        .with_subscribed_topic_names(Some(vec![topic_name(TOPIC)]))
                        .with_topic_partitions(Some(vec![])),
                )
            }
            ApiKey::ConsumerGroupDescribe => Body::from(
                ConsumerGroupDescribeRequest::default()
                    .with_group_ids(vec![group_id(&format!("walk-consumer-group-v{v}"))]),
            ),
            // Offset 0 moves nothing: the walk's topic keeps its records for the other requests.
            ApiKey::DeleteRecords => Body::from(
                DeleteRecordsRequest::default()
                    .with_timeout_ms(10_000)
                    .with_topics(vec![delete_records_request::DeleteRecordsTopic::default()
                        .with_name(topic_name(TOPIC))
                        .with_partitions(vec![
                            delete_records_request::DeleteRecordsPartition::default(),
                        ])]),
            ),
            _ => return None,
        })
    }

    fn security(&self, key: ApiKey) -> Option<Body> {
        Some(match key {
            // On a listener without SASL (or once authenticated) both are out of place and
            // answered ILLEGAL_SASL_STATE; the SASL listener's exchange is walked on its own.
            ApiKey::SaslHandshake => {
                Body::from(SaslHandshakeRequest::default().with_mechanism(s("PLAIN")))
            }
            ApiKey::SaslAuthenticate => {
                Body::from(SaslAuthenticateRequest::default().with_auth_bytes(plain_token()))
            }
            ApiKey::CreateAcls => Body::from(CreateAclsRequest::default().with_creations(vec![
                AclCreation::default()
                    .with_resource_type(TOPIC_RESOURCE)
                    .with_resource_name(s("walk-acl"))
                    .with_resource_pattern_type(LITERAL)
                    .with_principal(s(format!("User:{USER}")))
                    .with_host(s("*"))
                    .with_operation(READ)
                    .with_permission_type(ALLOW),
            ])),
            ApiKey::DescribeAcls => Body::from(
                DescribeAclsRequest::default()
                    .with_resource_type_filter(ANY)
                    .with_pattern_type_filter(ANY)
                    .with_operation(ANY)
                    .with_permission_type(ANY),
            ),
            ApiKey::DeleteAcls => Body::from(DeleteAclsRequest::default().with_filters(vec![
                DeleteAclsFilter::default()
                    .with_resource_type_filter(TOPIC_RESOURCE)
                    .with_resource_name_filter(Some(s("walk-acl")))
                    .with_pattern_type_filter(LITERAL)
                    .with_principal_filter(Some(s(format!("User:{USER}"))))
                    .with_host_filter(None)
                    .with_operation(ANY)
                    .with_permission_type(ANY),
            ])),
            ApiKey::DescribeUserScramCredentials => {
                Body::from(DescribeUserScramCredentialsRequest::default().with_users(None))
            }
            ApiKey::AlterUserScramCredentials => Body::from(
                AlterUserScramCredentialsRequest::default().with_upsertions(vec![
                    ScramCredentialUpsertion::default()
                        .with_name(s("walk-scram"))
                        .with_mechanism(1) // SCRAM-SHA-256
                        .with_iterations(4096)
                        .with_salt(Bytes::from_static(&[7; 16]))
                        .with_salted_password(Bytes::from_static(&[9; 32])),
                ]),
            ),
            _ => return None,
        })
    }

    fn transactions(&self, key: ApiKey) -> Option<Body> {
        let id = || TransactionalId(s(TRANSACTIONAL_ID));
        let (pid, epoch) = (self.producer_id, self.producer_epoch);
        Some(match key {
            ApiKey::AddPartitionsToTxn => Body::from(self.add_partition()),
            ApiKey::AddOffsetsToTxn => Body::from(
                AddOffsetsToTxnRequest::default()
                    .with_transactional_id(id())
                    .with_producer_id(pid)
                    .with_producer_epoch(epoch)
                    .with_group_id(group_id(GROUP)),
            ),
            ApiKey::EndTxn => {
                // A transaction to end: the partition joins it first.
                let r: AddPartitionsToTxnResponse = call(
                    &mut connect(self.port),
                    ApiKey::AddPartitionsToTxn,
                    3,
                    1,
                    &self.add_partition(),
                );
                assert_eq!(r.error_code, NONE, "AddPartitionsToTxn before EndTxn");
                Body::from(
                    EndTxnRequest::default()
                        .with_transactional_id(id())
                        .with_producer_id(pid)
                        .with_producer_epoch(epoch)
                        .with_committed(true),
                )
            }
            ApiKey::TxnOffsetCommit => Body::from(
                TxnOffsetCommitRequest::default()
                    .with_transactional_id(id())
                    .with_group_id(group_id(GROUP))
                    .with_producer_id(pid)
                    .with_producer_epoch(epoch)
                    .with_topics(vec![TxnOffsetCommitRequestTopic::default()
                        .with_name(topic_name(TOPIC))
                        .with_partitions(vec![
                            TxnOffsetCommitRequestPartition::default().with_committed_offset(1)
                        ])]),
            ),
            ApiKey::DescribeTransactions => Body::from(
                DescribeTransactionsRequest::default().with_transactional_ids(vec![id()]),
            ),
            ApiKey::ListTransactions => Body::from(ListTransactionsRequest::default()),
            _ => return None,
        })
    }

    /// AddPartitionsToTxn (v0-3) of [`TOPIC`]'s partition to the producer's transaction.
    fn add_partition(&self) -> AddPartitionsToTxnRequest {
        AddPartitionsToTxnRequest::default()
            .with_v3_and_below_transactional_id(TransactionalId(s(TRANSACTIONAL_ID)))
            .with_v3_and_below_producer_id(self.producer_id)
            .with_v3_and_below_producer_epoch(self.producer_epoch)
            .with_v3_and_below_topics(vec![AddPartitionsToTxnTopic::default()
                .with_name(topic_name(TOPIC))
                .with_partitions(vec![0])])
    }
}

fn join_request(group: &str, member: StrBytes) -> JoinGroupRequest {
    JoinGroupRequest::default()
        .with_group_id(group_id(group))
        .with_session_timeout_ms(SESSION_TIMEOUT_MS)
        .with_rebalance_timeout_ms(10_000)
        .with_member_id(member)
        .with_protocol_type(s("consumer"))
        .with_protocols(vec![JoinGroupRequestProtocol::default()
            .with_name(s("range"))
            .with_metadata(Bytes::new())])
}

/// Joins `group` as its only member (JoinGroup v5: MEMBER_ID_REQUIRED, then the join):
/// (generation, member id).
fn join(c: &mut std::net::TcpStream, group: &str) -> (i32, StrBytes) {
    let r: JoinGroupResponse = call(c, ApiKey::JoinGroup, 5, 1, &join_request(group, s("")));
    assert_eq!(r.error_code, MEMBER_ID_REQUIRED, "join {group}");
    let r: JoinGroupResponse = call(
        c,
        ApiKey::JoinGroup,
        5,
        2,
        &join_request(group, r.member_id),
    );
    assert_eq!(r.error_code, NONE, "join {group}");
    (r.generation_id, r.member_id)
}

fn commit_request(group: &str, generation: i32, member: StrBytes) -> OffsetCommitRequest {
    OffsetCommitRequest::default()
        .with_group_id(group_id(group))
        .with_generation_id_or_member_epoch(generation)
        .with_member_id(member)
        .with_topics(vec![OffsetCommitRequestTopic::default()
            .with_name(topic_name(TOPIC))
            .with_partitions(vec![OffsetCommitRequestPartition::default()
                .with_committed_offset(1)
                .with_committed_metadata(Some(s("walk")))])])
}
