//! A producer: template batches stamped with the send time, paced, with requests in flight on one
//! connection shared by a writer task and a reader task.

use super::executors::{connect, setup_over, ClientCfg, DoneOnDrop, ProducerPlan, Reporter};
use crate::bench::client;
use crate::bench::client::{Codec, ProduceFrame};
use crate::bench::stats::{now_us, record, Hists, Phase, Shared};
use bytes::Bytes;
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
    // One connection per leader; per partition, its connection and a ready-made request (without
    // compression; with it, each batch is compressed from the template).
    let mut conns: Vec<ProducerConn> = Vec::new();
    let mut by_leader: HashMap<SocketAddr, usize> = HashMap::new();
    let mut targets = Vec::new();
    let template = template_batch(
        cfg.message_bytes,
        cfg.records_per_batch,
        plan.id as u64 + 1,
        cfg.views,
    );
    let stamped = cfg
        .views
        .map_or(1, |n| (n as usize).min(cfg.records_per_batch));
    let value_ats =
        client::value_positions(&template, stamped).expect("template values are >= 8 bytes");
    for p in &plan.partitions {
        let conn = match by_leader.get(&p.leader) {
            Some(&c) => c,
            None => {
                let stream = match connect(p.leader).await {
                    Ok(s) => s,
                    Err(e) => return report.fail(e),
                };
                let unacked = (cfg.acks != 0).then(|| {
                    let slots = Rc::new(Semaphore::new(cfg.max_in_flight.max(1) as u64));
                    let (pending, rx) = local_channel::new_unbounded();
                    let reader = glommio::spawn_local(produce_responses(
                        cfg.clone(),
                        shared.clone(),
                        plan.id,
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
                });
                conns.push(ProducerConn { stream, unacked });
                by_leader.insert(p.leader, conns.len() - 1);
                conns.len() - 1
            }
        };
        let frame = if cfg.compression == Codec::None {
            match ProduceFrame::new(
                &cfg.topic,
                p.partition,
                cfg.acks,
                cfg.produce_version,
                template.clone(),
                stamped,
            ) {
                Ok(f) => Some(f),
                Err(e) => return report.fail(e),
            }
        } else {
            None
        };
        targets.push((p.partition, conn, frame));
    }
    setup_over(&shared).await;
    let interval = Duration::from_secs_f64(cfg.batch_interval);
    let mut next_at = Instant::now();
    let mut correlation = 0i32;
    let mut scratch = template.clone();
    let mut i = 0usize;
    loop {
        let phase = shared.phase();
        if phase >= Phase::Drain
            || (phase == Phase::Backlog
                && shared.bytes_sent.load(Relaxed) >= shared.byte_limit.load(Relaxed))
        {
            break;
        }
        if !interval.is_zero() && phase != Phase::Backlog {
            let now = Instant::now();
            if next_at > now {
                glommio::timer::sleep(next_at - now).await;
            } else if now - next_at > Duration::from_millis(100) {
                next_at = now; // fell far behind: do not burst to catch up
            }
            next_at += interval;
        }
        let n = targets.len();
        let (partition, conn, frame) = &mut targets[i % n];
        let conn = &mut conns[*conn];
        i += 1;
        // Waits while --max-in-flight requests are outstanding on this connection.
        let slot = match &conn.unacked {
            Some(f) => match f.slots.acquire_static_permit(1).await {
                Ok(slot) => Some(slot),
                Err(_) => break, // the reader stopped on an error (reported)
            },
            None => None,
        };
        correlation = correlation.wrapping_add(1);
        let ts = now_us();
        let compressed;
        let (request, batch_len): (&[u8], usize) = match frame {
            Some(f) => {
                let len = f.batch_len();
                (f.stamp(correlation, ts), len)
            }
            None => {
                scratch.copy_from_slice(&template);
                client::stamp_batch(&mut scratch, &value_ats, ts);
                let b = cfg.compression.compress_batch(&scratch);
                let len = b.len();
                let req = client::produce_request(&cfg.topic, *partition, cfg.acks, Bytes::from(b));
                let request =
                    client::request_frame(ApiKey::Produce, cfg.produce_version, correlation, &req)
                        .map(|f| (f, len));
                match request {
                    Ok((f, len)) => {
                        compressed = f;
                        (&compressed[..], len)
                    }
                    Err(e) => {
                        report.fail(format!("building a produce request: {e}"));
                        break;
                    }
                }
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
                break;
            }
        }
        let written = match conn.stream.write_all(request).await {
            Ok(()) => conn.stream.flush().await,
            Err(e) => Err(e),
        };
        if let Err(e) = written {
            report.fail(format!("sending a produce request: {e}"));
            break;
        }
        stats
            .records
            .fetch_add(cfg.records_per_batch as u64, Relaxed);
        stats.bytes.fetch_add(batch_len as u64, Relaxed);
        shared.bytes_sent.fetch_add(batch_len as u64, Relaxed);
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
        let r: ProduceResponse = match client::decode_response(
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
