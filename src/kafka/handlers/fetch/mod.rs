//! Fetch, in parts with one job each: the request's plan (which partitions, which budget), its
//! execution (reads, and long polling on the partitions' offset monitors until `min_bytes` or
//! `max_wait_ms`), and the hand-written response encoding (`encode`), which writes the log's shared
//! record bytes to the socket without copying them.

pub mod encode;

use super::{count_errors, HandlerResult, Reply, Versions};
use crate::core::Core;
use crate::kafka::errors::code_of;
use crate::kafka::header::{decode, Request};
use crate::partition::Partition;
use bytes::Bytes;
use encode::{encode_fetch_response, PartitionResult, TopicResult};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{ApiKey, FetchRequest};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

pub const VERSIONS: Versions = Versions {
    key: ApiKey::Fetch,
    min: encode::MIN_VERSION,
    max: encode::MAX_VERSION,
};

/// Longest a fetch may wait, whatever it asks.
const MAX_WAIT: Duration = Duration::from_secs(30);

/// One partition of the request, resolved against this core.
struct PlannedPartition {
    index: i32,
    offset: i64,
    max_bytes: usize,
    target: Result<Rc<Partition>, ResponseError>,
}

struct PlannedTopic {
    name: Bytes,
    partitions: Vec<PlannedPartition>,
}

/// The request's budget and deadline, and the partitions it reads.
struct Plan {
    topics: Vec<PlannedTopic>,
    max_bytes: usize,
    min_bytes: usize,
    deadline: Instant,
}

fn plan(core: &Core, request: &FetchRequest) -> Plan {
    let topics = request
        .topics
        .iter()
        .map(|t| {
            let name = t.topic.0.to_string();
            PlannedTopic {
                name: Bytes::copy_from_slice(name.as_bytes()),
                partitions: t
                    .partitions
                    .iter()
                    .map(|p| PlannedPartition {
                        index: p.partition,
                        offset: p.fetch_offset,
                        max_bytes: p.partition_max_bytes.max(0) as usize,
                        target: match core.partition(&name, p.partition) {
                            Some(part) => Ok(part),
                            None if core.owner(&name, p.partition).is_some() => {
                                Err(ResponseError::NotLeaderOrFollower)
                            }
                            None => Err(ResponseError::UnknownTopicOrPartition),
                        },
                    })
                    .collect(),
            }
        })
        .collect();
    let wait = Duration::from_millis(request.max_wait_ms.max(0) as u64).min(MAX_WAIT);
    Plan {
        topics,
        max_bytes: if request.max_bytes > 0 {
            request.max_bytes as usize
        } else {
            usize::MAX
        },
        min_bytes: request.min_bytes.max(0) as usize,
        deadline: Instant::now() + wait,
    }
}

/// Reads every partition once, within the response budget; the first partition that has data may
/// exceed its limits by one batch (KIP-74) so a consumer always makes progress.
async fn execute(plan: &Plan) -> (Vec<TopicResult>, usize) {
    let mut total = 0usize;
    let mut topics = Vec::with_capacity(plan.topics.len());
    for t in &plan.topics {
        let mut partitions = Vec::with_capacity(t.partitions.len());
        for p in &t.partitions {
            partitions.push(match &p.target {
                Err(e) => error_result(p.index, *e, -1, -1),
                Ok(part) => {
                    let budget = p.max_bytes.min(plan.max_bytes.saturating_sub(total));
                    match part.log.read(p.offset, budget, total == 0).await {
                        Ok(read) => {
                            total += read.records.len;
                            PartitionResult {
                                partition: p.index,
                                error_code: 0,
                                high_watermark: read.high_watermark,
                                last_stable_offset: read.high_watermark,
                                log_start_offset: read.log_start_offset,
                                records: Some(read.records),
                            }
                        }
                        Err(e) => error_result(
                            p.index,
                            code_of(&e),
                            part.log.high_watermark(),
                            part.log.log_start_offset(),
                        ),
                    }
                }
            });
        }
        topics.push(TopicResult {
            topic: t.name.clone(),
            partitions,
        });
    }
    (topics, total)
}

fn error_result(partition: i32, e: ResponseError, hw: i64, start: i64) -> PartitionResult {
    PartitionResult {
        partition,
        error_code: e.code(),
        high_watermark: hw,
        last_stable_offset: hw,
        log_start_offset: start,
        records: None,
    }
}

pub async fn handle(core: &Rc<Core>, req: &Request) -> HandlerResult {
    let request: FetchRequest = decode(req)?;
    let plan = plan(core, &request);
    let (topics, _) = loop {
        let (topics, total) = execute(&plan).await;
        let errors = topics
            .iter()
            .flat_map(|t| &t.partitions)
            .any(|p| p.error_code != 0);
        if total >= plan.min_bytes
            || errors
            || Instant::now() >= plan.deadline
            || core.is_shutting_down()
        {
            break (topics, total);
        }
        if !wait_for_data(core, &plan).await {
            break execute(&plan).await;
        }
    };
    count_errors(
        core,
        req,
        topics
            .iter()
            .flat_map(|t| t.partitions.iter().map(|p| p.error_code)),
    );
    let parts = encode_fetch_response(req.api_version, req.correlation_id, 0, 0, 0, &topics);
    Ok(Reply::Frame(parts.chunks))
}

/// Waits until any planned partition's high watermark passes its fetch offset; `false` at the
/// deadline or on shutdown.
async fn wait_for_data(core: &Core, plan: &Plan) -> bool {
    let waits: Vec<_> = plan
        .topics
        .iter()
        .flat_map(|t| &t.partitions)
        .filter_map(|p| {
            p.target
                .as_ref()
                .ok()
                .map(|part| Box::pin(part.log.high_watermark_monitor().wait_for(p.offset + 1)))
        })
        .collect();
    let remaining = plan.deadline.saturating_duration_since(Instant::now());
    let any = AnyOf(waits);
    let timeout = async {
        glommio::timer::sleep(remaining).await;
        false
    };
    let shutdown = async {
        core.shutdown.wait_for(1).await;
        false
    };
    futures_lite::future::or(any, futures_lite::future::or(timeout, shutdown)).await
}

/// Resolves when any of the futures does (true only if it resolved true).
struct AnyOf<F>(Vec<Pin<Box<F>>>);

impl<F: Future<Output = bool>> Future for AnyOf<F> {
    type Output = bool;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<bool> {
        if self.0.is_empty() {
            return Poll::Pending;
        }
        for f in self.0.iter_mut() {
            if let Poll::Ready(v) = f.as_mut().poll(cx) {
                return Poll::Ready(v);
            }
        }
        Poll::Pending
    }
}
