//! One module per Kafka API. Each declares the versions it serves (`VERSIONS`); ApiVersions and the
//! dispatcher below are derived from those declarations, so a version range is written once.
//!
//! Handlers stand alone but for the few that share a check or a decoder (top layer first):
//! - [`incremental_alter_configs`] — uses [`alter_configs`]' change of a resource's configs.
//! - [`alter_configs`]             — uses [`describe_configs`]' resource types and refusal.
//! - [`describe_configs`]
//! - [`delete_acls`]               — uses [`describe_acls`]' filter.
//! - [`describe_acls`]
//! - [`txn_offset_commit`]         — uses [`offset_commit`]'s per-partition refusal.
//! - [`offset_delete`]             — uses [`offset_commit`]'s check that a partition exists.
//! - [`offset_commit`]

pub mod add_offsets_to_txn;
pub mod add_partitions_to_txn;
pub mod alter_configs;
pub mod alter_user_scram_credentials;
pub mod api_versions;
pub mod consumer_group_describe;
pub mod consumer_group_heartbeat;
pub mod create_acls;
pub mod create_partitions;
pub mod create_topics;
pub mod delete_acls;
pub mod delete_groups;
pub mod delete_records;
pub mod delete_topics;
pub mod describe_acls;
pub mod describe_configs;
pub mod describe_groups;
pub mod describe_log_dirs;
pub mod describe_transactions;
pub mod describe_user_scram_credentials;
pub mod end_txn;
pub mod fetch;
pub mod find_coordinator;
pub mod heartbeat;
pub mod incremental_alter_configs;
pub mod init_producer_id;
pub mod join_group;
pub mod leave_group;
pub mod list_groups;
pub mod list_offsets;
pub mod list_transactions;
pub mod metadata;
pub mod offset_commit;
pub mod offset_delete;
pub mod offset_fetch;
pub mod produce;
pub mod sasl_authenticate;
pub mod sasl_handshake;
pub mod sync_group;
pub mod txn_offset_commit;

use crate::cores::Core;
use crate::kafka::session::Session;
use crate::kafka::upstream;
use crate::table::acl::Operation;
use crate::wire::header::Request;
use bytes::Bytes;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::ApiKey;
use std::rc::Rc;

/// What the connection writes back for one request.
#[derive(Debug)]
pub enum Reply {
    /// A whole response frame, in chunks (record bytes are shared, not copied).
    Frame(Vec<Bytes>),
    /// A fetch response and its holds on shared results, released once it is written.
    Fetch(Vec<Bytes>, Vec<shards::ResponseHold>),
    /// No response (Produce with acks=0).
    None,
    /// The request cannot be answered in the protocol: close the connection after earlier responses.
    Close,
}

/// An API and the versions served, inclusive.
#[derive(Debug, Clone, Copy)]
pub struct Versions {
    pub key: ApiKey,
    pub min: i16,
    pub max: i16,
}

/// Every API shoal serves.
pub const APIS: &[Versions] = &[
    produce::VERSIONS,
    fetch::VERSIONS,
    list_offsets::VERSIONS,
    metadata::VERSIONS,
    api_versions::VERSIONS,
    create_topics::VERSIONS,
    create_partitions::VERSIONS,
    describe_configs::VERSIONS,
    alter_configs::VERSIONS,
    incremental_alter_configs::VERSIONS,
    delete_topics::VERSIONS,
    delete_records::VERSIONS,
    init_producer_id::VERSIONS,
    find_coordinator::VERSIONS,
    join_group::VERSIONS,
    sync_group::VERSIONS,
    heartbeat::VERSIONS,
    leave_group::VERSIONS,
    offset_commit::VERSIONS,
    offset_fetch::VERSIONS,
    offset_delete::VERSIONS,
    list_groups::VERSIONS,
    describe_groups::VERSIONS,
    describe_log_dirs::VERSIONS,
    delete_groups::VERSIONS,
    sasl_handshake::VERSIONS,
    sasl_authenticate::VERSIONS,
    create_acls::VERSIONS,
    describe_acls::VERSIONS,
    delete_acls::VERSIONS,
    describe_user_scram_credentials::VERSIONS,
    alter_user_scram_credentials::VERSIONS,
    add_partitions_to_txn::VERSIONS,
    add_offsets_to_txn::VERSIONS,
    end_txn::VERSIONS,
    describe_transactions::VERSIONS,
    list_transactions::VERSIONS,
    txn_offset_commit::VERSIONS,
    consumer_group_heartbeat::VERSIONS,
    consumer_group_describe::VERSIONS,
];

/// Why ACL requests are refused on a broker that enforces none (`--authorizer none`): Kafka's
/// SECURITY_DISABLED, with what to do about it.
pub(crate) fn acls_disabled(core: &Core) -> Option<(ResponseError, String)> {
    (!core.config().authorizer.enabled).then(|| {
        (
            ResponseError::SecurityDisabled,
            "No Authorizer is configured: ACLs are enforced with shoal serve --authorizer acl"
                .to_string(),
        )
    })
}

pub fn supports(api_key: i16, version: i16) -> bool {
    APIS.iter()
        .any(|v| v.key as i16 == api_key && (v.min..=v.max).contains(&version))
}

/// Handles one request, run as a task of its own: a panic anywhere in its handling (a handler,
/// the encoder, a shard) is caught here, logged with the request's API and version, counted in
/// `shoal_handler_panics_total`, and closes only this connection; the core keeps serving. State a
/// handler held is released by unwinding (borrows, permits, reservations are guards).
pub async fn handle_guarded(core: Rc<Core>, req: Request, session: Rc<Session>) -> Reply {
    use futures_lite::FutureExt;
    let (api_key, version, correlation_id) = (req.api_key, req.api_version, req.correlation_id);
    let handled = std::panic::AssertUnwindSafe(async {
        crate::kafka::fault::panic_if_asked(&req).await;
        handle(core.clone(), req, session.clone()).await
    })
    .catch_unwind()
    .await;
    match handled {
        Ok(reply) => reply,
        Err(payload) => {
            let why = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "(no message)".into());
            let api = ApiKey::try_from(api_key)
                .map_or_else(|_| format!("api {api_key}"), |k| format!("{k:?}"));
            log::error!(
                "closing connection from {}: handling {api} v{version} (correlation id {correlation_id}) panicked: {why}",
                session.peer
            );
            crate::metrics::add(&core.metrics.handler_panics, 1);
            core.metrics.error(api_key);
            Reply::Close
        }
    }
}

/// Handles one request. Malformed bodies and unsupported versions close the connection (there is no
/// response format to report them in), except ApiVersions, which answers per KIP-511.
pub async fn handle(core: Rc<Core>, req: Request, session: Rc<Session>) -> Reply {
    let key = ApiKey::try_from(req.api_key).expect("header parsing checked the key");
    let peer = &session.peer;
    let s = &*session;
    if !supports(req.api_key, req.api_version) {
        if key == ApiKey::ApiVersions {
            return api_versions::unsupported_version(&req);
        }
        log::warn!(
            "closing connection from {peer}: {key:?} v{} is not supported",
            req.api_version
        );
        core.metrics.error(req.api_key);
        crate::metrics::add(&core.metrics.protocol_errors, 1);
        return Reply::Close;
    }
    let rights = SessionRights {
        session: s,
        core: &core,
    };
    if let Some(result) = upstream::answer(&core, &req, peer, &rights, &s.forwarder).await {
        let result = result.map(|answer| match answer {
            upstream::Answer::Frame(chunks) => Reply::Frame(chunks),
            upstream::Answer::Close => Reply::Close,
        });
        return finish(&core, &req, peer, key, result);
    }
    // Just after a start, the requests of partitions' data wait only for their own partitions,
    // which are opened first (see `Core::wait_opening`); Metadata and FindCoordinator answer from
    // the topic table; the others wait until the core has opened everything and loaded its
    // groups and transactions.
    let at_once = matches!(
        key,
        ApiKey::Produce
            | ApiKey::Fetch
            | ApiKey::ListOffsets
            | ApiKey::Metadata
            | ApiKey::ApiVersions
            | ApiKey::FindCoordinator
            | ApiKey::SaslHandshake
            | ApiKey::SaslAuthenticate
    );
    if !at_once && !core.until_opened().await {
        return Reply::Close;
    }
    // Produce and fetch are awaited in place; every other handler (rare, some with large
    // futures) is boxed, so that the task of every request does not carry the largest of them.
    let result = match key {
        ApiKey::Produce => produce::handle(&core, &req, s).await,
        ApiKey::Fetch => fetch::handle(&core, &req, s).await,
        ApiKey::ListOffsets => Box::pin(list_offsets::handle(&core, &req, s)).await,
        ApiKey::Metadata => Box::pin(metadata::handle(&core, &req, s)).await,
        ApiKey::ApiVersions => api_versions::handle(&req),
        ApiKey::CreateTopics => Box::pin(create_topics::handle(&core, &req, s)).await,
        ApiKey::CreatePartitions => Box::pin(create_partitions::handle(&core, &req, s)).await,
        ApiKey::DescribeConfigs => Box::pin(describe_configs::handle(&core, &req, s)).await,
        ApiKey::AlterConfigs => Box::pin(alter_configs::handle(&core, &req, s)).await,
        ApiKey::IncrementalAlterConfigs => {
            Box::pin(incremental_alter_configs::handle(&core, &req, s)).await
        }
        ApiKey::DeleteTopics => Box::pin(delete_topics::handle(&core, &req, s)).await,
        ApiKey::DeleteRecords => Box::pin(delete_records::handle(&core, &req, s)).await,
        ApiKey::InitProducerId => Box::pin(init_producer_id::handle(&core, &req, s)).await,
        ApiKey::FindCoordinator => find_coordinator::handle(&core, &req, s),
        ApiKey::JoinGroup => Box::pin(join_group::handle(&core, &req, s)).await,
        ApiKey::SyncGroup => Box::pin(sync_group::handle(&core, &req, s)).await,
        ApiKey::Heartbeat => heartbeat::handle(&core, &req, s),
        ApiKey::LeaveGroup => leave_group::handle(&core, &req, s),
        ApiKey::OffsetCommit => Box::pin(offset_commit::handle(&core, &req, s)).await,
        ApiKey::OffsetFetch => Box::pin(offset_fetch::handle(&core, &req, s)).await,
        ApiKey::OffsetDelete => Box::pin(offset_delete::handle(&core, &req, s)).await,
        ApiKey::ListGroups => list_groups::handle(&core, &req, s),
        ApiKey::DescribeGroups => describe_groups::handle(&core, &req, s),
        ApiKey::DescribeLogDirs => describe_log_dirs::handle(&core, &req, s),
        ApiKey::DeleteGroups => Box::pin(delete_groups::handle(&core, &req, s)).await,
        ApiKey::SaslHandshake => sasl_handshake::handle(&req),
        ApiKey::SaslAuthenticate => sasl_authenticate::handle(&req),
        ApiKey::CreateAcls => Box::pin(create_acls::handle(&core, &req, s)).await,
        ApiKey::DescribeAcls => describe_acls::handle(&core, &req, s),
        ApiKey::DeleteAcls => Box::pin(delete_acls::handle(&core, &req, s)).await,
        ApiKey::DescribeUserScramCredentials => {
            Box::pin(describe_user_scram_credentials::handle(&core, &req, s)).await
        }
        ApiKey::AlterUserScramCredentials => {
            Box::pin(alter_user_scram_credentials::handle(&core, &req, s)).await
        }
        ApiKey::AddPartitionsToTxn => Box::pin(add_partitions_to_txn::handle(&core, &req, s)).await,
        ApiKey::AddOffsetsToTxn => Box::pin(add_offsets_to_txn::handle(&core, &req, s)).await,
        ApiKey::EndTxn => Box::pin(end_txn::handle(&core, &req, s)).await,
        ApiKey::DescribeTransactions => describe_transactions::handle(&core, &req, s),
        ApiKey::ListTransactions => list_transactions::handle(&core, &req, s),
        ApiKey::TxnOffsetCommit => Box::pin(txn_offset_commit::handle(&core, &req, s)).await,
        ApiKey::ConsumerGroupHeartbeat => consumer_group_heartbeat::handle(&core, &req, s),
        ApiKey::ConsumerGroupDescribe => consumer_group_describe::handle(&core, &req, s),
        _ => unreachable!("supports() only admits the APIs above"),
    };
    finish(&core, &req, peer, key, result)
}

/// A handler's reply, or the connection closed (logged, counted) for a body it could not decode.
fn finish(core: &Core, req: &Request, peer: &str, key: ApiKey, result: HandlerResult) -> Reply {
    match result {
        Ok(reply) => reply,
        Err(why) => {
            log::warn!(
                "closing connection from {peer}: malformed {key:?} v{} request: {why}",
                req.api_version
            );
            core.metrics.error(req.api_key);
            crate::metrics::add(&core.metrics.protocol_errors, 1);
            Reply::Close
        }
    }
}

/// Result of a handler: a reply, or why the request body could not be decoded.
/// A connection's rights on its core, as edge mode asks for them.
#[derive(Debug)]
struct SessionRights<'a> {
    session: &'a Session,
    core: &'a Core,
}

impl upstream::Rights for SessionRights<'_> {
    fn may_group(&self, op: Operation, group: &str) -> bool {
        self.session.may_group(self.core, op, group)
    }
    fn may_cluster(&self, op: Operation) -> bool {
        self.session.may_cluster(self.core, op)
    }
}

pub type HandlerResult = Result<Reply, String>;

/// Encodes a kafka-protocol response as a one-chunk frame.
pub fn frame<R: kafka_protocol::protocol::Encodable>(
    key: ApiKey,
    req: &Request,
    body: &R,
) -> Reply {
    frame_at(key, req.api_version, req.correlation_id, body)
}

/// Same, at an explicit version (the KIP-511 fallback answers in v0).
pub fn frame_at<R: kafka_protocol::protocol::Encodable>(
    key: ApiKey,
    version: i16,
    correlation_id: i32,
    body: &R,
) -> Reply {
    match crate::wire::header::encode(key, version, correlation_id, body) {
        Ok(bytes) => Reply::Frame(vec![bytes]),
        Err(e) => {
            log::error!("cannot encode a response, closing the connection: {e}");
            Reply::Close
        }
    }
}

/// Counts the request as an error if any of its items carried an error code.
pub fn count_errors(core: &Core, req: &Request, codes: impl IntoIterator<Item = i16>) {
    if codes.into_iter().any(|c| c != 0) {
        core.metrics.error(req.api_key);
    }
}

/// Asks core 0 for a topic change of the `items` the client may act on (`allowed`), answering the
/// others `TOPIC_AUTHORIZATION_FAILED` without asking; outcomes in request order.
pub async fn change_allowed<T>(
    core: &Rc<Core>,
    items: Vec<T>,
    name: impl Fn(&T) -> String,
    allowed: impl Fn(&T) -> bool,
    change: impl FnOnce(Vec<T>) -> crate::cores::mesh::TopicChange,
) -> Vec<crate::cores::mesh::TopicOutcome> {
    let verdicts: Vec<(bool, String)> = items.iter().map(|t| (allowed(t), name(t))).collect();
    let permitted: Vec<T> = items
        .into_iter()
        .zip(&verdicts)
        .filter_map(|(t, (ok, _))| ok.then_some(t))
        .collect();
    let mut decided = if permitted.is_empty() {
        Vec::new()
    } else {
        crate::control::change_topics(core, change(permitted)).await
    }
    .into_iter();
    let mut out = Vec::new();
    for (ok, name) in verdicts {
        if ok {
            out.extend(decided.next());
        } else {
            out.push(crate::cores::mesh::TopicOutcome {
                name,
                error: Some((
                    kafka_protocol::error::ResponseError::TopicAuthorizationFailed,
                    "not authorized".into(),
                )),
                partitions: -1,
                id: [0; 16],
                acls: Vec::new(),
            });
        }
    }
    out
}

/// Asks core 0 for `change` of the items that passed their checks (the `Ok`s of `checked`, in
/// order), unless none did; one outcome per item asked for.
pub async fn change_checked<T: Clone, E>(
    core: &Rc<Core>,
    checked: &[Result<T, E>],
    change: impl FnOnce(Vec<T>) -> crate::cores::mesh::TopicChange,
) -> std::vec::IntoIter<crate::cores::mesh::TopicOutcome> {
    let valid: Vec<T> = checked
        .iter()
        .filter_map(|c| c.as_ref().ok().cloned())
        .collect();
    if valid.is_empty() {
        Vec::new().into_iter()
    } else {
        crate::control::change_topics(core, change(valid))
            .await
            .into_iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;

    /// The size of the future an async handler returns, from its signature alone.
    fn future_size<'a, F: Future>(
        _: impl FnOnce(&'a Rc<Core>, &'a Request, &'a Session) -> F,
    ) -> usize {
        std::mem::size_of::<F>()
    }

    /// Every request's task is allocated and its future moved (copied) a few times on the way:
    /// the paths every request takes stay small, and large, rare work is boxed. A request's
    /// task was 10 KiB (the largest handler's future, carried by all) and cost about a tenth of a
    /// paced fan-out core in copies.
    #[test]
    fn request_futures_stay_small() {
        let fetch = future_size(fetch::handle);
        let produce = future_size(produce::handle);
        assert!(fetch <= 1536, "fetch's future is {fetch} bytes");
        assert!(produce <= 1536, "produce's future is {produce} bytes");
        fn owned<F: Future>(_: impl FnOnce(Rc<Core>, Request, Rc<Session>) -> F) -> usize {
            std::mem::size_of::<F>()
        }
        let guarded = owned(handle_guarded);
        assert!(
            guarded <= 3072,
            "a request's handling future is {guarded} bytes"
        );
    }
}
