//! Idempotent and transactional producers' calls beside Produce: a producer id from
//! InitProducerId (for a transactional id, asked of its coordinator, found by FindCoordinator),
//! then per transaction AddPartitionsToTxn and EndTxn on the coordinator's connection.

use super::plan::{connect, ClientCfg, ProducerMode, ProducerPlan};
use crate::bench::client::ProducerIdVersions;
use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use kafka_protocol::messages::{
    AddPartitionsToTxnRequest, AddPartitionsToTxnResponse, ApiKey, EndTxnRequest, EndTxnResponse,
    FindCoordinatorRequest, FindCoordinatorResponse, InitProducerIdRequest, InitProducerIdResponse,
    ProducerId as WireProducerId, TopicName, TransactionalId,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use shoal::wire::fetch::decode::FrameReader;
use shoal::wire::SharedStream;
use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// The `transaction.timeout.ms` the transactional producers ask for.
const TRANSACTION_TIMEOUT_MS: i32 = 60_000;
/// Kafka error codes a producer id's calls retry on for a while: the coordinator is loading, or
/// still ending an earlier producer's transaction under this id.
const COORDINATOR_LOAD_IN_PROGRESS: i16 = 14;
const CONCURRENT_TRANSACTIONS: i16 = 51;
/// How long those are retried.
const RETRY_FOR: Duration = Duration::from_secs(10);

fn other(msg: impl Into<String>) -> io::Error {
    io::Error::other(msg.into())
}

fn missing(api: &str) -> io::Error {
    other(format!(
        "the broker does not serve {api}: no idempotent producers"
    ))
}

/// A request and response connection for the calls beside Produce.
struct ControlConn {
    stream: SharedStream,
    reader: FrameReader,
    correlation: i32,
}

impl ControlConn {
    async fn connect(addr: SocketAddr) -> io::Result<ControlConn> {
        Ok(ControlConn {
            stream: connect(addr).await?,
            reader: FrameReader::new(4 << 10),
            correlation: 0,
        })
    }

    async fn call<Req: Encodable, Resp: Decodable>(
        &mut self,
        key: ApiKey,
        version: i16,
        body: &Req,
    ) -> io::Result<Resp> {
        use futures_lite::AsyncWriteExt;
        self.correlation = self.correlation.wrapping_add(1);
        let frame = crate::client::request_frame(key, version, self.correlation, body)?;
        self.stream.write_all(&frame).await?;
        self.stream.flush().await?;
        let frame = self
            .reader
            .read_frame(&mut self.stream, 1 << 20)
            .await
            .map_err(|e| other(format!("{key:?} response: {e}")))?;
        crate::client::decode_response(key, version, self.correlation, frame)
    }
}

/// An idempotent producer's id and epoch; a transactional producer's transactions too.
pub(super) struct ProducerIdentity {
    pub(super) id: i64,
    pub(super) epoch: i16,
    pub(super) transactions: Option<Transactions>,
}

/// A transactional producer's side of its transactions, on its coordinator's connection.
pub(super) struct Transactions {
    conn: ControlConn,
    pub(super) transactional_id: String,
    versions: ProducerIdVersions,
    id: i64,
    epoch: i16,
    topic: String,
    partitions: Vec<i32>,
    pub(super) commit_interval: Duration,
    /// When the open transaction began (its partitions added); None between transactions.
    pub(super) open_since: Option<Instant>,
}

/// The identity of producer `plan.id` for `cfg.producer_mode`: None for plain producers. A
/// transactional producer's id is `<cfg.transactional_prefix>-<producer>`.
pub(super) async fn identify(
    cfg: &ClientCfg,
    plan: &ProducerPlan,
) -> io::Result<Option<ProducerIdentity>> {
    let commit_interval = match cfg.producer_mode {
        ProducerMode::Plain => return Ok(None),
        ProducerMode::Idempotent => None,
        ProducerMode::Transactional { commit_interval } => Some(commit_interval),
    };
    let v = cfg.producer_ids;
    let init_version = v
        .init_producer_id
        .ok_or_else(|| missing("InitProducerId"))?;
    let bootstrap = plan
        .partitions
        .first()
        .ok_or_else(|| other("a producer without partitions"))?
        .leader;
    let Some(commit_interval) = commit_interval else {
        let mut c = ControlConn::connect(bootstrap).await?;
        let r = init_producer_id(&mut c, init_version, None).await?;
        return Ok(Some(ProducerIdentity {
            id: r.producer_id.0,
            epoch: r.producer_epoch,
            transactions: None,
        }));
    };
    let (Some(find), Some(_), Some(_)) = (v.find_coordinator, v.add_partitions_to_txn, v.end_txn)
    else {
        return Err(missing("FindCoordinator, AddPartitionsToTxn or EndTxn"));
    };
    let transactional_id = format!("{}-{}", cfg.transactional_prefix, plan.id);
    let coordinator = find_coordinator(bootstrap, find, &transactional_id).await?;
    let mut conn = ControlConn::connect(coordinator).await?;
    let r = init_producer_id(&mut conn, init_version, Some(&transactional_id)).await?;
    let (id, epoch) = (r.producer_id.0, r.producer_epoch);
    Ok(Some(ProducerIdentity {
        id,
        epoch,
        transactions: Some(Transactions {
            conn,
            transactional_id,
            versions: v,
            id,
            epoch,
            topic: cfg.topic.clone(),
            partitions: plan.partitions.iter().map(|p| p.partition).collect(),
            commit_interval,
            open_since: None,
        }),
    }))
}

fn txn_id(s: &str) -> TransactionalId {
    TransactionalId(StrBytes::from_string(s.to_string()))
}

/// The coordinator of `transactional_id` (FindCoordinator key type 1, asked at `bootstrap`).
async fn find_coordinator(
    bootstrap: SocketAddr,
    version: i16,
    transactional_id: &str,
) -> io::Result<SocketAddr> {
    let mut c = ControlConn::connect(bootstrap).await?;
    let started = Instant::now();
    loop {
        let r: FindCoordinatorResponse = c
            .call(
                ApiKey::FindCoordinator,
                version,
                &FindCoordinatorRequest::default()
                    .with_key(StrBytes::from_string(transactional_id.to_string()))
                    .with_key_type(1),
            )
            .await?;
        if r.error_code == COORDINATOR_LOAD_IN_PROGRESS && started.elapsed() < RETRY_FOR {
            glommio::timer::sleep(Duration::from_millis(50)).await;
            continue;
        }
        if r.error_code != 0 {
            return Err(other(format!(
                "FindCoordinator {transactional_id}: error {}",
                r.error_code
            )));
        }
        return crate::client::resolve(&format!("{}:{}", r.host, r.port));
    }
}

/// A producer id and epoch: for `transactional_id`, from its coordinator (`c`), retried while an
/// earlier producer's transaction under the id is being ended.
async fn init_producer_id(
    c: &mut ControlConn,
    version: i16,
    transactional_id: Option<&str>,
) -> io::Result<InitProducerIdResponse> {
    let req = InitProducerIdRequest::default()
        .with_transactional_id(transactional_id.map(txn_id))
        .with_transaction_timeout_ms(if transactional_id.is_some() {
            TRANSACTION_TIMEOUT_MS
        } else {
            -1
        })
        .with_producer_id(WireProducerId(-1))
        .with_producer_epoch(-1);
    let started = Instant::now();
    loop {
        let r: InitProducerIdResponse = c.call(ApiKey::InitProducerId, version, &req).await?;
        let retry = matches!(
            r.error_code,
            CONCURRENT_TRANSACTIONS | COORDINATOR_LOAD_IN_PROGRESS
        );
        if retry && started.elapsed() < RETRY_FOR {
            glommio::timer::sleep(Duration::from_millis(20)).await;
            continue;
        }
        if r.error_code != 0 {
            return Err(other(format!(
                "InitProducerId{}: error {}",
                transactional_id
                    .map(|t| format!(" {t}"))
                    .unwrap_or_default(),
                r.error_code
            )));
        }
        return Ok(r);
    }
}

impl Transactions {
    /// Begins a transaction: AddPartitionsToTxn for every partition the producer writes to.
    pub(super) async fn begin(&mut self) -> io::Result<()> {
        let version = self.versions.add_partitions_to_txn.unwrap_or(3);
        let req = AddPartitionsToTxnRequest::default()
            .with_v3_and_below_transactional_id(txn_id(&self.transactional_id))
            .with_v3_and_below_producer_id(WireProducerId(self.id))
            .with_v3_and_below_producer_epoch(self.epoch)
            .with_v3_and_below_topics(vec![AddPartitionsToTxnTopic::default()
                .with_name(TopicName(StrBytes::from_string(self.topic.clone())))
                .with_partitions(self.partitions.clone())]);
        let r: AddPartitionsToTxnResponse = self
            .conn
            .call(ApiKey::AddPartitionsToTxn, version, &req)
            .await?;
        let refused: Vec<String> = r
            .results_by_topic_v3_and_below
            .iter()
            .flat_map(|t| &t.results_by_partition)
            .filter(|p| p.partition_error_code != 0)
            .map(|p| {
                format!(
                    "partition {}: error {}",
                    p.partition_index, p.partition_error_code
                )
            })
            .collect();
        if r.error_code != 0 || !refused.is_empty() {
            return Err(other(format!(
                "AddPartitionsToTxn {}: error {} {}",
                self.transactional_id,
                r.error_code,
                refused.join(", ")
            )));
        }
        self.open_since = Some(Instant::now());
        Ok(())
    }

    /// Commits the open transaction (EndTxn, answered once its markers are written); returns how
    /// long the coordinator took to answer.
    pub(super) async fn commit(&mut self) -> io::Result<Duration> {
        let version = self.versions.end_txn.unwrap_or(3);
        let req = EndTxnRequest::default()
            .with_transactional_id(txn_id(&self.transactional_id))
            .with_producer_id(WireProducerId(self.id))
            .with_producer_epoch(self.epoch)
            .with_committed(true);
        let sent = Instant::now();
        let r: EndTxnResponse = self.conn.call(ApiKey::EndTxn, version, &req).await?;
        let took = sent.elapsed();
        if r.error_code != 0 {
            return Err(other(format!(
                "EndTxn(commit) {}: error {}",
                self.transactional_id, r.error_code
            )));
        }
        self.open_since = None;
        Ok(took)
    }

    /// The open transaction has run for the commit interval.
    pub(super) fn due(&self, now: Instant) -> bool {
        self.open_since
            .is_some_and(|t| now.duration_since(t) >= self.commit_interval)
    }
}
