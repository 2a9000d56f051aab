//! The raw TCP fan-out baseline: the machine's practical limit for the same delivery.
//!
//! A server with as many threads as the broker has cores holds a ring of record batches in memory,
//! built like the producers' (same message size, same records per batch, same compression codec,
//! so that a delivered byte means the same in both). It answers every Fetch at once with the
//! batches from the asked offset, up to the partition's `max_bytes`, as shoal would: the frame is read and decoded and the response encoded by shoal's own front-end code
//! (`shoal::wire`: `frame`, `header`, `fetch::encode`), and the record bytes are written straight
//! from the ring without copying. No log, no coalescer, no waiting, no producers. The consumers are
//! the same code as in a shoal run, counting the same way; offsets wrap at the ring's end, which
//! their contiguity check is told.
//!
//! Unpaced, it never waits for data: the ceiling of a run whose producers keep the log ahead of the
//! consumers (`--rate 0`). Paced (`--rate`), it is the floor of a paced run's cost instead: batches
//! become available at the run's rate (one every `batch interval` per partition, offsets counted
//! from the server's start), and a fetch at the end of what is available waits until the next batch
//! is due (within its `max_wait_ms`), so it sends as many responses, of the same sizes, as a broker
//! serving that stream must.

use super::client::Codec;
use super::workload::template_batch;
use bytes::{Bytes, BytesMut};
use futures_lite::AsyncWriteExt;
use glommio::net::{TcpListener, TcpStream};
use glommio::{LocalExecutorBuilder, Placement};
use kafka_protocol::messages::{ApiKey, FetchRequest};
use shoal::wire::fetch::encode::{
    encode_fetch_response, AbortedTransactions, PartitionResult, TopicResult,
};
use shoal::wire::frame::{read_frame, FrameError};
use shoal::wire::header;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{FromRawFd, IntoRawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Name prefix of the baseline server's threads (its CPU is counted apart from the generator's).
pub const THREAD_PREFIX: &str = "bench-raw-";

/// Batches in memory, offsets `0..period` and then, so that any answer is one contiguous slice,
/// enough further batches (offsets `period..`) to fill one more response.
#[derive(Debug)]
pub struct Ring {
    bytes: Bytes,
    pub(super) batch_len: usize,
    pub(super) records_per_batch: i64,
    /// Batches with offsets below `period`.
    batches: usize,
    /// Batches in `bytes` (the wrap-around copies included).
    stored: usize,
}

impl Ring {
    /// About `bytes` of batches (at least 4) compressed with `codec`, plus `max_response` bytes for
    /// the wrap.
    pub fn new(
        message_bytes: usize,
        records_per_batch: usize,
        codec: Codec,
        bytes: usize,
        max_response: usize,
    ) -> io::Result<Ring> {
        let mut template = template_batch(message_bytes, records_per_batch, 7, None);
        let at = super::client::first_value_at(&template).expect("values are >= 8 bytes");
        super::client::stamp_batch(&mut template, &[at], 0, None);
        let template = codec.compress_batch(&template);
        let batch_len = template.len();
        let batches = (bytes / batch_len).max(4);
        let stored = batches + max_response.div_ceil(batch_len) + 1;
        let mut out = BytesMut::with_capacity(stored * batch_len);
        for i in 0..stored {
            let start = out.len();
            out.extend_from_slice(&template);
            shards::batch::set_base_offset(&mut out[start..], (i * records_per_batch) as i64);
        }
        Ok(Ring {
            bytes: out.freeze(),
            batch_len,
            records_per_batch: records_per_batch as i64,
            batches,
            stored,
        })
    }

    /// Where offsets wrap.
    pub fn period(&self) -> i64 {
        self.batches as i64 * self.records_per_batch
    }

    /// The batches from `offset` (modulo the period) below offset `end` (paced: what is available;
    /// `i64::MAX` unpaced), at least one unless none is, within `max_bytes`.
    pub(super) fn records(&self, offset: i64, max_bytes: usize, end: i64) -> shards::Records {
        let available = (end.saturating_sub(offset) / self.records_per_batch).max(0) as usize;
        if available == 0 {
            return shards::Records::empty();
        }
        let first = (offset.rem_euclid(self.period()) / self.records_per_batch) as usize;
        let count = (max_bytes / self.batch_len)
            .min(available)
            .clamp(1, self.stored - first);
        let start = first * self.batch_len;
        let len = count * self.batch_len;
        shards::Records {
            parts: vec![self.bytes.slice(start..start + len)],
            len,
            batches: count as u32,
            records: count as u64 * self.records_per_batch as u64,
            first_offset: first as i64 * self.records_per_batch,
            last_offset: (first + count) as i64 * self.records_per_batch - 1,
        }
    }
}

/// The running baseline server.
#[derive(Debug)]
pub struct RawServer {
    pub addrs: Vec<SocketAddr>,
    threads: Threads,
}

/// A raw server's threads, and what stops them.
#[derive(Debug)]
pub(super) struct Threads {
    stop: Arc<AtomicBool>,
    handles: Vec<glommio::ExecutorJoinHandle<()>>,
}

impl Threads {
    /// Stops the threads (each cancels its connections) and waits for them.
    pub(super) fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        for h in self.handles {
            let _ = h.join();
        }
    }
}

impl RawServer {
    /// Starts `threads` server threads, each with its own listener on 127.0.0.1 (thread i on CPU i
    /// where there are enough, as shoal places its cores); with `pace`, one new batch per partition
    /// becomes available every `pace`.
    pub fn start(threads: usize, ring: Arc<Ring>, pace: Option<Duration>) -> io::Result<RawServer> {
        let mut listeners = Vec::new();
        for _ in 0..threads.max(1) {
            let l = std::net::TcpListener::bind("127.0.0.1:0")?;
            l.set_nonblocking(true)?;
            listeners.push(l);
        }
        let addrs = listeners
            .iter()
            .map(std::net::TcpListener::local_addr)
            .collect::<io::Result<Vec<_>>>()?;
        let threads = spawn_servers(listeners, &ring, pace, accept)?;
        Ok(RawServer { addrs, threads })
    }

    pub fn stop(self) {
        self.threads.stop();
    }
}

/// Starts a server thread per listener (thread i on CPU i where there are enough, as shoal places
/// its cores), each running `run` on its listener with the ring, the stop flag and, paced, when
/// its batches become available (one per partition every `pace`, from the thread's start).
pub(super) fn spawn_servers<R, Fut>(
    listeners: Vec<std::net::TcpListener>,
    ring: &Arc<Ring>,
    pace: Option<Duration>,
    run: R,
) -> io::Result<Threads>
where
    R: Fn(TcpListener, Arc<Ring>, Arc<AtomicBool>, Option<Pace>) -> Fut + Send + Copy + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    let threads = listeners.len();
    let stop = Arc::new(AtomicBool::new(false));
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut handles = Vec::with_capacity(threads);
    for (i, l) in listeners.into_iter().enumerate() {
        let fd = l.into_raw_fd();
        let placement = if threads <= cpus {
            Placement::Fixed(i)
        } else {
            Placement::Unbound
        };
        let (ring, stop) = (ring.clone(), stop.clone());
        let h = LocalExecutorBuilder::new(placement)
            .name(&format!("{THREAD_PREFIX}{i}"))
            .spawn(move || async move {
                // SAFETY: `fd` is a listening socket bound by the caller, handed over here only.
                let listener = unsafe { TcpListener::from_raw_fd(fd) };
                let pace = pace.map(|interval| Pace {
                    interval,
                    start: Instant::now(),
                    records_per_batch: ring.records_per_batch,
                });
                run(listener, ring, stop, pace).await;
            })
            .map_err(|e| io::Error::other(format!("cannot start raw server thread {i}: {e}")))?;
        handles.push(h);
    }
    Ok(Threads { stop, handles })
}

/// When a paced server's batches become available: batch `n` of each partition (offsets from
/// `n * records_per_batch`) at `start + n * interval`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Pace {
    pub(super) interval: Duration,
    pub(super) start: Instant,
    pub(super) records_per_batch: i64,
}

impl Pace {
    /// The end (exclusive) of the offsets available at `at`.
    pub(super) fn end_at(&self, at: Instant) -> i64 {
        let batches =
            at.saturating_duration_since(self.start).as_nanos() / self.interval.as_nanos().max(1);
        batches as i64 * self.records_per_batch
    }

    /// A long poll: waits, if nothing from `offset` on is available, until the next batch is due
    /// or `max_wait` has passed; returns the end of what is available then.
    pub(super) async fn wait_past(&self, offset: i64, max_wait: Duration) -> i64 {
        let now = Instant::now();
        if offset >= self.end_at(now) {
            let next = offset / self.records_per_batch + 1;
            let due = self.start + self.interval * u32::try_from(next).unwrap_or(u32::MAX);
            glommio::timer::sleep(due.min(now + max_wait).saturating_duration_since(now)).await;
        }
        self.end_at(Instant::now())
    }
}

async fn accept(listener: TcpListener, ring: Arc<Ring>, stop: Arc<AtomicBool>, pace: Option<Pace>) {
    accept_until(listener, &stop, "raw baseline", |s| {
        serve(s, ring.clone(), pace)
    })
    .await;
}

/// Accepts connections on `listener` until `stop`, each served by `serve` in a task of its own
/// (cancelled at the stop); `what` names the server in its log lines.
pub(super) async fn accept_until<F, Fut>(
    listener: TcpListener,
    stop: &AtomicBool,
    what: &str,
    serve: F,
) where
    F: Fn(TcpStream) -> Fut,
    Fut: std::future::Future<Output = ()> + 'static,
{
    let mut conns = Vec::new();
    loop {
        let accepted = futures_lite::future::or(async { Some(listener.accept().await) }, async {
            while !stop.load(Ordering::SeqCst) {
                glommio::timer::sleep(Duration::from_millis(20)).await;
            }
            None
        })
        .await;
        match accepted {
            None => break,
            Some(Ok(s)) => conns.push(glommio::spawn_local(serve(s))),
            Some(Err(e)) => {
                log::warn!("{what}: accept failed: {e}");
                glommio::timer::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    drop(conns); // cancels the connections still open
}

async fn serve(mut stream: TcpStream, ring: Arc<Ring>, pace: Option<Pace>) {
    let _ = stream.set_nodelay(true);
    loop {
        let frame = match read_frame(&mut stream, 1 << 20).await {
            Ok(f) => f,
            Err(FrameError::Eof) => return,
            Err(e) => {
                log::warn!("raw baseline: {e}");
                return;
            }
        };
        let Ok(req) = header::parse(frame) else {
            return;
        };
        if req.api_key != ApiKey::Fetch as i16 {
            log::warn!(
                "raw baseline: only Fetch is served, not API {}",
                req.api_key
            );
            return;
        }
        let Ok(fetch) = header::decode::<FetchRequest>(&req) else {
            return;
        };
        // Paced: a fetch at the end of what is available waits for the next batch (the bench's
        // consumers fetch one partition each: the first one decides).
        let end = match pace {
            None => i64::MAX,
            Some(p) => {
                let offset = fetch
                    .topics
                    .first()
                    .and_then(|t| t.partitions.first())
                    .map_or(0, |p| p.fetch_offset);
                let max_wait = Duration::from_millis(fetch.max_wait_ms.max(0) as u64);
                p.wait_past(offset, max_wait).await
            }
        };
        let topics: Vec<TopicResult> = fetch
            .topics
            .iter()
            .map(|t| TopicResult {
                topic: Bytes::copy_from_slice(t.topic.0.as_bytes()),
                topic_id: *t.topic_id.as_bytes(),
                partitions: t
                    .partitions
                    .iter()
                    .map(|p| {
                        let max_bytes = p.partition_max_bytes.max(0) as usize;
                        let records = ring.records(p.fetch_offset, max_bytes, end);
                        let hw = if pace.is_some() {
                            end
                        } else {
                            records.last_offset + 1
                        };
                        PartitionResult {
                            partition: p.partition,
                            error_code: 0,
                            high_watermark: hw,
                            last_stable_offset: hw,
                            log_start_offset: 0,
                            aborted_transactions: AbortedTransactions::Empty,
                            preferred_read_replica: -1,
                            current_leader: -1,
                            records,
                        }
                    })
                    .collect(),
            })
            .collect();
        let parts =
            encode_fetch_response(req.api_version, req.correlation_id, 0, 0, 0, &topics, &[]);
        for c in &parts.chunks {
            if stream.write_all(c).await.is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_answers_wrap_and_stay_contiguous() {
        let ring = Ring::new(100, 10, Codec::None, 10_000, 4_000).unwrap();
        let period = ring.period();
        assert!(period >= 10);
        let r = ring.records(0, 4_000, i64::MAX);
        assert_eq!(r.first_offset, 0);
        let headers: Vec<_> = r.batch_headers().collect();
        assert!(!headers.is_empty());
        for (i, h) in headers.iter().enumerate() {
            assert_eq!(h.base_offset, i as i64 * 10);
            shards::batch::validate(&r.parts[0][i * ring.batch_len..], usize::MAX).unwrap();
        }
        // Near the end of the period the answer runs on into the copies (offsets >= period).
        let r = ring.records(period - 10, 4_000, i64::MAX);
        assert_eq!(r.first_offset, period - 10);
        assert!(r.last_offset >= period);
        let r = ring.records(period + 20, 1, i64::MAX);
        assert_eq!((r.first_offset, r.batches), (20, 1));
    }

    #[test]
    fn ring_batches_carry_the_runs_compression() {
        let plain = Ring::new(1000, 16, Codec::None, 1 << 20, 64 << 10).unwrap();
        let lz4 = Ring::new(1000, 16, Codec::Lz4, 1 << 20, 64 << 10).unwrap();
        assert!(
            lz4.batch_len < plain.batch_len / 2,
            "{} vs {}",
            lz4.batch_len,
            plain.batch_len
        );
        let r = lz4.records(lz4.period() - 16, 64 << 10, i64::MAX);
        for i in 0..r.batches as usize {
            let h = shards::batch::validate(&r.parts[0][i * lz4.batch_len..], usize::MAX).unwrap();
            assert_eq!(h.compression(), Codec::Lz4.id() as u8);
            assert_eq!(h.record_count, 16);
            assert_eq!(h.base_offset, lz4.period() - 16 + i as i64 * 16);
        }
    }

    #[test]
    fn a_paced_ring_answers_only_what_is_available() {
        let ring = Ring::new(100, 10, Codec::None, 10_000, 4_000).unwrap();
        // Batches are due every 10 ms: at 35 ms, three of them (offsets 0..30).
        let start = Instant::now();
        let pace = Pace {
            interval: Duration::from_millis(10),
            start,
            records_per_batch: 10,
        };
        assert_eq!(pace.end_at(start), 0);
        let end = pace.end_at(start + Duration::from_millis(35));
        assert_eq!(end, 30);
        assert_eq!(
            ring.records(30, 1 << 20, end).batches,
            0,
            "at the end: nothing"
        );
        assert_eq!(ring.records(40, 1 << 20, end).batches, 0, "past it");
        let r = ring.records(10, 1 << 20, end);
        assert_eq!((r.first_offset, r.last_offset, r.batches), (10, 29, 2));
        // max_bytes still limits (at least one batch).
        assert_eq!(ring.records(0, 1, end).batches, 1);
    }
}
