//! A producer: template batches stamped with the send time (and, idempotent, with its producer id
//! and each partition's sequence), paced, with requests in flight on one connection shared by a
//! writer task and a reader task; a transactional one commits every commit interval ([`txn`]).

use super::plan::{connect, setup_over, ClientCfg, DoneOnDrop, ProducerPlan, Reporter};
use super::txn::{self, ProducerIdentity, Transactions};
use crate::bench::client;
use crate::bench::client::{Codec, ProduceFrame, ProducerStamp};
use crate::bench::stats::{now_us, record, Hists, Phase, Shared};
use bytes::{Bytes, BytesMut};
use futures_lite::AsyncWriteExt;
use glommio::channels::local_channel;
use glommio::channels::local_channel::{LocalReceiver, LocalSender};
use glommio::sync::{Semaphore, StaticPermit};
use kafka_protocol::messages::{ApiKey, ProduceResponse};
use shards::batch::BatchBuilder;
use shoal::wire::fetch::decode::FrameReader;
use shoal::wire::SharedStream;
use std::cell::RefCell;
use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A batch of `records` values of `message_bytes`: pseudo-random words from a 64-word vocabulary,
/// compressible about like text logs by every codec; the first 8 bytes of the first value are left
/// for the send time. With `views: Some(n)` every record gets a key, and the keys of the first n
/// records map to shards 0, 1, ..., n-1 (Kafka's default partitioner), so that each shard's part
/// of the batch starts with a record whose value can carry the send time.
pub(crate) fn template_batch(
    message_bytes: usize,
    records: usize,
    seed: u64,
    views: Option<u32>,
) -> Vec<u8> {
    const SYLLABLES: [&str; 16] = [
        "ka", "lo", "mi", "ne", "su", "ta", "ri", "po", "de", "fu", "gi", "ho", "ja", "ve", "zo",
        "bu",
    ];
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    // Words of 2 to 4 syllables, fixed for every run.
    let vocabulary: Vec<String> = (0..64u64)
        .map(|w| {
            (0..2 + w % 3)
                .map(|i| SYLLABLES[((w * 7 + i * 5 + w / 3) % 16) as usize])
                .collect()
        })
        .collect();
    let mut value = Vec::with_capacity(message_bytes + 16);
    let mut b = BatchBuilder::new(0);
    for i in 0..records {
        value.clear();
        while value.len() < message_bytes {
            value.extend_from_slice(vocabulary[(next() % 64) as usize].as_bytes());
            value.push(b' ');
        }
        value.truncate(message_bytes);
        let key = views.map(|n| template_key(seed, i, n));
        b.push(0, key.as_deref(), Some(&value), &[]);
    }
    b.finish(0)
}

/// The record-batch bytes one message takes as sent: a producer's batch of `records` messages
/// compressed with `codec`, over its records (batch and record headers included, keys with
/// `views`). What `--rate` in bytes paces, and what every MB/s of the report counts.
pub(crate) fn wire_bytes_per_message(
    message_bytes: usize,
    records: usize,
    codec: client::Codec,
    views: Option<u32>,
) -> f64 {
    let batch = template_batch(message_bytes, records, 1, views);
    codec.compress_batch(&batch).len() as f64 / records.max(1) as f64
}

/// The key of record `i` of producer `seed`'s batches when `n` shard views are read: for i < n,
/// the first such key that maps to shard i.
pub(super) fn template_key(seed: u64, i: usize, n: u32) -> Vec<u8> {
    let key = |t: u32| format!("s{seed}-r{i}-{t}").into_bytes();
    if i >= n as usize {
        return key(0);
    }
    (0..)
        .map(key)
        .find(|k| shards::partitioner::shard_of(Some(k), n) == Some(i as u32))
        .expect("some key maps to every shard")
}

/// A produce request waiting for its response.
#[derive(Debug)]
pub(super) struct Pending {
    pub(super) correlation: i32,
    /// Taken right before the request was written.
    pub(super) sent: Instant,
    pub(super) measured: bool,
    pub(super) records: u64,
    /// Its in-flight slot on the connection, given back once the response is read.
    pub(super) _slot: StaticPermit,
}

/// With acks: the requests in flight on a connection, and the task reading their responses.
pub(super) struct Unacked {
    /// `--max-in-flight` slots; closed if the reader stops early.
    pub(super) slots: Rc<Semaphore>,
    pub(super) pending: LocalSender<Pending>,
    pub(super) reader: glommio::Task<()>,
}

pub(super) struct ProducerConn {
    pub(super) stream: SharedStream,
    pub(super) unacked: Option<Unacked>,
}

/// One partition a producer writes to.
struct Target {
    partition: i32,
    /// Its leader's connection, in the producer's.
    conn: usize,
    /// Without compression, a ready-made request; with it, each batch is compressed from the
    /// template.
    frame: Option<ProduceFrame>,
    /// An idempotent producer's next sequence number on this partition.
    sequence: i32,
}

/// The batch a producer sends over and over, and where each send stamps its time.
struct Template {
    batch: Vec<u8>,
    /// Records whose values carry the send time: the first, or the first of each shard view.
    stamped: usize,
    value_ats: Vec<usize>,
    /// A copy of the batch, stamped before it is compressed.
    scratch: Vec<u8>,
}

impl Template {
    fn new(cfg: &ClientCfg, id: usize) -> Template {
        let batch = template_batch(
            cfg.message_bytes,
            cfg.records_per_batch,
            id as u64 + 1,
            cfg.views,
        );
        let stamped = cfg
            .views
            .map_or(1, |n| (n as usize).min(cfg.records_per_batch));
        let value_ats =
            client::value_positions(&batch, stamped).expect("template values are >= 8 bytes");
        Template {
            scratch: batch.clone(),
            batch,
            stamped,
            value_ats,
        }
    }
}

/// Spaces a producer's batches `interval` apart (zero: as fast as possible).
struct Pacer {
    interval: Duration,
    next_at: Instant,
}

impl Pacer {
    async fn wait(&mut self) {
        if self.interval.is_zero() {
            return;
        }
        let now = Instant::now();
        if self.next_at > now {
            glommio::timer::sleep(self.next_at - now).await;
        } else if now - self.next_at > Duration::from_millis(100) {
            self.next_at = now; // fell far behind: do not burst to catch up
        }
        self.next_at += self.interval;
    }
}

pub(super) async fn producer(
    cfg: Arc<ClientCfg>,
    shared: Arc<Shared>,
    plan: ProducerPlan,
    hists: Rc<RefCell<Hists>>,
) {
    let stats = &shared.producers[plan.id];
    let _done = DoneOnDrop(&stats.done);
    let report = Reporter {
        shared: &shared,
        who: format!("producer {}", plan.id),
        errors: &stats.errors,
        failed: None,
    };
    let mut template = Template::new(&cfg, plan.id);
    let mut identity = match txn::identify(&cfg, &plan).await {
        Ok(i) => i,
        Err(e) => return report.fail(e),
    };
    let transactional_id = identity
        .as_ref()
        .and_then(|i| i.transactions.as_ref())
        .map(|t| t.transactional_id.clone());
    let (mut conns, mut targets) = match connect_partitions(
        &cfg,
        &shared,
        &plan,
        &hists,
        &template,
        transactional_id.as_deref(),
    )
    .await
    {
        Ok(c) => c,
        Err(e) => return report.fail(e),
    };
    setup_over(&shared).await;
    let ok = send_batches(
        &cfg,
        &shared,
        plan.id,
        &report,
        &mut conns,
        &mut targets,
        &mut template,
        &mut identity,
    )
    .await;
    // The last transaction is committed once its produces are acknowledged.
    if let Some(t) = identity.as_mut().and_then(|i| i.transactions.as_mut()) {
        if ok && t.open_since.is_some() {
            commit(&cfg, &shared, plan.id, &report, &conns, t).await;
        }
    }
    // Let the readers collect the outstanding responses.
    for c in &mut conns {
        if let Some(Unacked {
            pending, reader, ..
        }) = c.unacked.take()
        {
            drop(pending);
            reader.await;
        }
    }
}

/// One connection per leader of the plan's partitions (with acks, with a task reading its
/// responses), and per partition, its connection and request.
async fn connect_partitions(
    cfg: &Arc<ClientCfg>,
    shared: &Arc<Shared>,
    plan: &ProducerPlan,
    hists: &Rc<RefCell<Hists>>,
    template: &Template,
    transactional_id: Option<&str>,
) -> io::Result<(Vec<ProducerConn>, Vec<Target>)> {
    let mut conns: Vec<ProducerConn> = Vec::new();
    let mut by_leader: HashMap<SocketAddr, usize> = HashMap::new();
    let mut targets = Vec::new();
    for p in &plan.partitions {
        let conn = match by_leader.get(&p.leader) {
            Some(&c) => c,
            None => {
                let stream = connect(p.leader).await?;
                let unacked =
                    (cfg.acks != 0).then(|| Unacked::start(cfg, shared, plan.id, &stream, hists));
                conns.push(ProducerConn { stream, unacked });
                by_leader.insert(p.leader, conns.len() - 1);
                conns.len() - 1
            }
        };
        let frame = if cfg.compression == Codec::None {
            Some(ProduceFrame::new(
                &cfg.topic,
                p.partition,
                cfg.acks,
                transactional_id,
                cfg.produce_version,
                template.batch.clone(),
                template.stamped,
            )?)
        } else {
            None
        };
        targets.push(Target {
            partition: p.partition,
            conn,
            frame,
            sequence: 0,
        });
    }
    Ok((conns, targets))
}

impl Unacked {
    /// `--max-in-flight` slots on `stream`, and the task reading its responses.
    fn start(
        cfg: &Arc<ClientCfg>,
        shared: &Arc<Shared>,
        id: usize,
        stream: &SharedStream,
        hists: &Rc<RefCell<Hists>>,
    ) -> Unacked {
        let slots = Rc::new(Semaphore::new(cfg.max_in_flight.max(1) as u64));
        let (pending, rx) = local_channel::new_unbounded();
        let reader = glommio::spawn_local(produce_responses(
            cfg.clone(),
            shared.clone(),
            id,
            stream.clone(),
            rx,
            slots.clone(),
            hists.clone(),
        ));
        Unacked {
            slots,
            pending,
            reader,
        }
    }
}

/// Sends a batch to each target in turn, paced, until the drain (or, producing the backlog, until
/// it is all sent), or an error (then false). A transactional producer begins a transaction
/// before its first batch and commits it, then begins the next, every commit interval.
#[allow(clippy::too_many_arguments)]
async fn send_batches(
    cfg: &ClientCfg,
    shared: &Shared,
    id: usize,
    report: &Reporter<'_>,
    conns: &mut [ProducerConn],
    targets: &mut [Target],
    template: &mut Template,
    identity: &mut Option<ProducerIdentity>,
) -> bool {
    let stats = &shared.producers[id];
    let mut pacer = Pacer {
        interval: Duration::from_secs_f64(cfg.batch_interval),
        next_at: Instant::now(),
    };
    let mut correlation = 0i32;
    let mut i = 0usize;
    loop {
        let phase = shared.phase();
        if phase >= Phase::Drain
            || (phase == Phase::Backlog
                && shared.bytes_sent.load(Relaxed) >= shared.byte_limit.load(Relaxed))
        {
            return true;
        }
        if phase != Phase::Backlog {
            pacer.wait().await;
        }
        if let Some(t) = identity.as_mut().and_then(|i| i.transactions.as_mut()) {
            if t.due(Instant::now()) && !commit(cfg, shared, id, report, conns, t).await {
                return false;
            }
            if t.open_since.is_none() {
                if let Err(e) = t.begin().await {
                    report.fail(e);
                    return false;
                }
            }
        }
        let n = targets.len();
        let target = &mut targets[i % n];
        let conn = &mut conns[target.conn];
        i += 1;
        // Waits while --max-in-flight requests are outstanding on this connection.
        let slot = match &conn.unacked {
            Some(f) => match f.slots.acquire_static_permit(1).await {
                Ok(slot) => Some(slot),
                Err(_) => return false, // the reader stopped on an error (reported)
            },
            None => None,
        };
        correlation = correlation.wrapping_add(1);
        let ts = now_us();
        let mut compressed = BytesMut::new();
        let stamp = identity.as_ref().map(|i| ProducerStamp {
            id: i.id,
            epoch: i.epoch,
            base_sequence: target.sequence,
            transactional: i.transactions.is_some(),
        });
        target.sequence = client::next_sequence(
            target.sequence,
            cfg.records_per_batch.min(i32::MAX as usize) as i32,
        );
        let tid = identity
            .as_ref()
            .and_then(|i| i.transactions.as_ref())
            .map(|t| t.transactional_id.as_str());
        let built = next_request(
            cfg,
            target,
            template,
            correlation,
            ts,
            stamp,
            tid,
            &mut compressed,
        );
        let (request, batch_len) = match built {
            Ok(r) => r,
            Err(e) => {
                report.fail(format!("building a produce request: {e}"));
                return false;
            }
        };
        // Publish latency starts here: the slot is taken and the request built.
        let sent = Instant::now();
        if let (Some(f), Some(slot)) = (&conn.unacked, slot) {
            let p = Pending {
                correlation,
                sent,
                measured: phase == Phase::Measure,
                records: cfg.records_per_batch as u64,
                _slot: slot,
            };
            if f.pending.try_send(p).is_err() {
                return false;
            }
        }
        if let Err(e) = write_request(&mut conn.stream, request).await {
            report.fail(format!("sending a produce request: {e}"));
            return false;
        }
        stats
            .records
            .fetch_add(cfg.records_per_batch as u64, Relaxed);
        stats.bytes.fetch_add(batch_len as u64, Relaxed);
        shared.bytes_sent.fetch_add(batch_len as u64, Relaxed);
    }
}

/// The request for `target`'s next batch, stamped with `ts` (and an idempotent producer's
/// `stamp`), and the batch's length: its ready-made request, or the template stamped, compressed
/// and framed into `compressed`.
#[allow(clippy::too_many_arguments)]
fn next_request<'a>(
    cfg: &ClientCfg,
    target: &'a mut Target,
    template: &mut Template,
    correlation: i32,
    ts: u64,
    stamp: Option<ProducerStamp>,
    transactional_id: Option<&str>,
    compressed: &'a mut BytesMut,
) -> io::Result<(&'a [u8], usize)> {
    if let Some(f) = &mut target.frame {
        let len = f.batch_len();
        return Ok((f.stamp(correlation, ts, stamp), len));
    }
    template.scratch.copy_from_slice(&template.batch);
    client::stamp_batch(&mut template.scratch, &template.value_ats, ts, stamp);
    let b = cfg.compression.compress_batch(&template.scratch);
    let len = b.len();
    let req = client::produce_request(
        &cfg.topic,
        target.partition,
        cfg.acks,
        transactional_id,
        Bytes::from(b),
    );
    *compressed =
        crate::client::request_frame(ApiKey::Produce, cfg.produce_version, correlation, &req)?;
    Ok((&compressed[..], len))
}

/// Commits `t`'s open transaction once every produce in flight on `conns` is acknowledged, and
/// counts the commit and the EndTxn's latency; false after an error (reported).
async fn commit(
    cfg: &ClientCfg,
    shared: &Shared,
    id: usize,
    report: &Reporter<'_>,
    conns: &[ProducerConn],
    t: &mut Transactions,
) -> bool {
    let stats = &shared.producers[id];
    for c in conns {
        if let Some(f) = &c.unacked {
            // Every slot free: no produce of this connection is waiting for its answer.
            // (The permit gives every slot back as it drops.)
            let all = f
                .slots
                .acquire_permit(cfg.max_in_flight.max(1) as u64)
                .await;
            if all.is_err() {
                return false; // the reader stopped on an error (reported)
            }
        }
    }
    match t.commit().await {
        Ok(took) => {
            stats.commits.fetch_add(1, Relaxed);
            stats.end_txn_us.fetch_add(took.as_micros() as u64, Relaxed);
            true
        }
        Err(e) => {
            report.fail(e);
            false
        }
    }
}

async fn write_request(stream: &mut SharedStream, request: &[u8]) -> io::Result<()> {
    stream.write_all(request).await?;
    stream.flush().await
}

pub(super) async fn produce_responses(
    cfg: Arc<ClientCfg>,
    shared: Arc<Shared>,
    id: usize,
    mut stream: SharedStream,
    pending: LocalReceiver<Pending>,
    slots: Rc<Semaphore>,
    hists: Rc<RefCell<Hists>>,
) {
    let stats = &shared.producers[id];
    let report = Reporter {
        shared: &shared,
        who: format!("producer {id}"),
        errors: &stats.errors,
        failed: None,
    };
    let mut reader = FrameReader::new(16 << 10);
    while let Some(p) = pending.recv().await {
        let frame = match reader.read_frame(&mut stream, 16 << 20).await {
            Ok(f) => f,
            Err(e) => {
                report.fail(format!("reading a produce response: {e}"));
                break;
            }
        };
        let latency = p.sent.elapsed().as_micros() as u64;
        let r: ProduceResponse = match crate::client::decode_response(
            ApiKey::Produce,
            cfg.produce_version,
            p.correlation,
            frame,
        ) {
            Ok(r) => r,
            Err(e) => {
                report.fail(e);
                break;
            }
        };
        let mut ok = true;
        for t in &r.responses {
            for pr in &t.partition_responses {
                if pr.error_code != 0 {
                    ok = false;
                    report.error(format!(
                        "partition {}: produce error {}{}",
                        pr.index,
                        pr.error_code,
                        pr.error_message
                            .as_ref()
                            .map(|m| format!(" ({m})"))
                            .unwrap_or_default()
                    ));
                } else if pr.base_offset >= 0 {
                    shared.note_end(pr.index as usize, pr.base_offset + p.records as i64);
                }
            }
        }
        if ok {
            stats.acked_records.fetch_add(p.records, Relaxed);
            if p.measured {
                record(&mut hists.borrow_mut().publish, latency);
            }
        }
    }
    // After an error, the producer must not wait for slots that no response will give back.
    slots.close();
}
