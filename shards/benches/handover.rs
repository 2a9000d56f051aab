//! What handing one write's batches to a read replica on another core costs (issue 36): the
//! owner's CPU per append with a replication hook against the same appends without one (the
//! baseline, same run); the owner's CPU per batch and replica core for the forwarding alone; the
//! replica's `Log::apply` (index, copy into its own tail cache) per batch and per byte, beside
//! plain copies of the same bytes (into a reused buffer, and into a ring as large as a tail cache):
//! what a zero-copy replica would save; the channel's fixed cost, to a busy core and a parked one.
//!
//! `cargo bench -p shards --bench handover` (under half a minute). Two unpinned executor threads:
//! the owner's (logs on temp dirs, page-cache writes, no fsync: one without a hook, one handing
//! each write over as it happens, one whose writes are handed over one after another) and the
//! replica's (`Log::replica` of the last two, its own tail cache). The hooks forward as the front
//! end does: onto a local queue that a sender task drains onto glommio shared channels. Per batch
//! size, a warm-up round then `ROUNDS` rounds, the variants taking turns (the appends in blocks,
//! hooked and not alternating); figures are medians of rounds. Owner figures are its thread's CPU
//! time (waiting for a write costs nothing); the replica times each `apply` and copy, which take
//! turns going first, so each is seen on bytes fresh from the owner's core and on bytes just read.

use bytes::Bytes;
use futures_lite::future::yield_now;
use glommio::channels::local_channel::{self, LocalReceiver, LocalSender};
use glommio::channels::shared_channel::{
    self, ConnectedReceiver, ConnectedSender, SharedReceiver, SharedSender,
};
use glommio::LocalExecutorBuilder;
use shards::batch::BatchBuilder;
use shards::{
    AppendOptions, Appended, Handover, Log, LogConfig, LogEvent, LogSnapshot, Records, TailCache,
};
use std::cell::{Cell, RefCell};
use std::hint::black_box;
use std::rc::Rc;
use std::time::{Duration, Instant};

const SIZES: [usize; 3] = [1 << 10, 16 << 10, 256 << 10];
const ROUNDS: usize = 7;
/// Bytes appended per round and variant, in at least `MIN_BATCHES` batches.
const ROUND_BYTES: usize = 8 << 20;
const MIN_BATCHES: usize = 64;
/// Blocks a round's appends take turns in, hooked and not.
const BLOCKS: usize = 16;
/// Each core's tail cache: smaller than a round, so it evicts and reuses chunks as on a busy core.
const CACHE_BYTES: usize = 4 << 20;
const CHUNK_BYTES: usize = 1 << 20;
/// Replica cores of the fan-out figure (past the first, they only drop what they get).
const FANOUT: usize = 4;
/// Each shared channel's slots: more than a round sends, so the owner never waits for room.
const CAPACITY: usize = 1 << 14;
const PINGS: usize = 2000;
const STREAM: u64 = 8192;
/// Hand-overs to a parked core per round, one per `PAUSE`.
const PARKED: u64 = 1000;
const PAUSE: Duration = Duration::from_micros(50);
/// The produced rate the predictions are for, bytes per second.
const PRODUCED: f64 = 1e9;
/// Ways the replica takes a batch: `Log::apply`, a copy into a reused buffer, into a ring.
const TAKES: usize = 3;

/// What the owner's thread sends the replica's.
enum ToReplica {
    /// Follow this log from now on as replica `.0` (a fresh one).
    Start(usize, LogSnapshot),
    /// A hand-over for replica `.0`: applied, and timed.
    Feed(usize, Handover),
    /// A hand-over of a forwarding-only run: dropped on arrival (counted in a stream).
    Forwarded(Handover),
    /// Answer with the figures since the last report.
    Report,
    Ping,
    /// The next `n` `Tick`s or `Forwarded`s are a stream: answer with the CPU time they took.
    Stream(u64),
    Tick,
}

enum FromReplica {
    Report(Taken),
    Pong,
    Streamed { cpu_ns: u64 },
}

/// The replica's figures over a round, per way of taking a batch (see `TAKES`): (batches, ns)
/// when it went first, on bytes fresh from the owner's core, and when it went after another.
#[derive(Debug, Default, Clone, Copy)]
struct Taken {
    fresh: [(u64, u64); TAKES],
    read: [(u64, u64); TAKES],
}

impl Taken {
    fn batches(&self) -> u64 {
        self.fresh.iter().map(|t| t.0).sum()
    }
    /// ns per batch, fresh then read, per way.
    fn per_batch(&self) -> [f64; 2 * TAKES] {
        let per = |(n, ns): (u64, u64)| ns as f64 / n.max(1) as f64;
        std::array::from_fn(|i| {
            per(if i < TAKES {
                self.fresh[i]
            } else {
                self.read[i - TAKES]
            })
        })
    }
}

/// Memory as large as a tail cache, written round and round: a destination as cold as the
/// cache's chunks are.
struct Ring {
    buf: Vec<u8>,
    at: usize,
}

impl Ring {
    fn copy(&mut self, parts: &[Bytes]) {
        for p in parts {
            if self.at + p.len() > self.buf.len() {
                self.at = 0;
            }
            self.buf[self.at..self.at + p.len()].copy_from_slice(p);
            self.at += p.len();
        }
        black_box(self.buf.as_ptr());
    }
}

fn copy_into(buf: &mut Vec<u8>, parts: &[Bytes]) {
    buf.clear();
    for p in parts {
        buf.extend_from_slice(p);
    }
    black_box(buf.as_ptr());
}

/// CPU time of the calling thread (user and system), ns.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to fill.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn timed(f: impl FnOnce()) -> u64 {
    let start = Instant::now();
    f();
    start.elapsed().as_nanos() as u64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn config() -> LogConfig {
    LogConfig {
        flush_interval: None,
        retention_age: None,
        direct_io: false,
        ..LogConfig::default()
    }
}

/// A record batch of `size` bytes, give or take a few (records with values of up to 240 bytes).
fn batch(size: usize, seed: u64) -> Bytes {
    let mut b = BatchBuilder::new(1_700_000_000_000 + seed as i64);
    let mut i = 0u64;
    // A record with a value of `n` bytes adds about `n + 20` (key, varints, header).
    while b.is_empty() || b.size() + 40 < size {
        let key = format!("key-{seed}-{i}");
        let n = (size.saturating_sub(b.size() + 20 + key.len())).clamp(1, 240);
        let value: Vec<u8> = (0..n as u64).map(|j| (seed + i * 31 + j) as u8).collect();
        b.push(
            1_700_000_000_000 + (seed + i) as i64,
            Some(key.as_bytes()),
            Some(&value),
            &[(b"h", Some(b"v"))],
        );
        i += 1;
    }
    Bytes::from(b.finish(0))
}

/// The replica's thread: applies `Feed`s to its replica logs, timing each `apply` beside plain
/// copies of the same bytes; the receivers past the first only drop what they get.
async fn replica(receivers: Vec<SharedReceiver<ToReplica>>, reply: SharedSender<FromReplica>) {
    let mut receivers = receivers.into_iter();
    let rx = receivers.next().unwrap().connect().await;
    for extra in receivers {
        glommio::spawn_local(async move {
            let rx = extra.connect().await;
            while rx.recv().await.is_some() {}
        })
        .detach();
    }
    let tx = reply.connect().await;
    let cache = Rc::new(TailCache::new(CACHE_BYTES, CHUNK_BYTES));
    let mut logs: [Option<Log>; 2] = Default::default();
    let mut buf = Vec::new();
    let mut ring = Ring {
        buf: vec![0; CACHE_BYTES],
        at: 0,
    };
    let mut taken = Taken::default();
    let mut turn = 0;
    // (messages left, CPU time at its start)
    let mut stream = (0u64, 0u64);
    while let Some(msg) = rx.recv().await {
        match msg {
            ToReplica::Start(i, snapshot) => {
                if let Some(old) = logs[i].take() {
                    old.delete().await.expect("close the replica");
                }
                logs[i] = Some(Log::replica(snapshot, config(), cache.clone()).expect("replica"));
            }
            ToReplica::Feed(i, Handover::Appended(a)) => {
                let log = logs[i].as_ref().expect("a replica");
                let parts = a.records.parts.clone();
                let mut handover = Some(Handover::Appended(a));
                let first = turn % TAKES;
                turn += 1;
                for k in (0..TAKES).map(|i| (first + i) % TAKES) {
                    let ns = match k {
                        0 => timed(|| log.apply(handover.take().unwrap()).expect("apply")),
                        1 => timed(|| copy_into(&mut buf, &parts)),
                        _ => timed(|| ring.copy(&parts)),
                    };
                    let t = if k == first {
                        &mut taken.fresh[k]
                    } else {
                        &mut taken.read[k]
                    };
                    *t = (t.0 + 1, t.1 + ns);
                }
            }
            ToReplica::Feed(i, snapshot) => logs[i]
                .as_ref()
                .expect("a replica")
                .apply(snapshot)
                .unwrap(),
            ToReplica::Report => {
                let report = FromReplica::Report(std::mem::take(&mut taken));
                assert!(tx.send(report).await.is_ok());
            }
            ToReplica::Ping => assert!(tx.send(FromReplica::Pong).await.is_ok()),
            ToReplica::Stream(n) => stream = (n, thread_cpu_ns()),
            ToReplica::Tick | ToReplica::Forwarded(_) => {
                // A hand-over for a partition the core holds no replica of is dropped.
                if let ToReplica::Forwarded(handover) = msg {
                    drop(black_box(handover));
                }
                if stream.0 > 0 {
                    stream.0 -= 1;
                    if stream.0 == 0 {
                        let cpu_ns = thread_cpu_ns() - stream.1;
                        assert!(tx.send(FromReplica::Streamed { cpu_ns }).await.is_ok());
                    }
                }
            }
        }
    }
    for log in logs.into_iter().flatten() {
        log.delete().await.expect("close the replica");
    }
}

/// The owner's messages to replica cores, queued for a sender task that puts them on the
/// channels in order (the front end's outbox).
struct Outbox {
    queue: LocalSender<(usize, ToReplica)>,
    queued: Cell<u64>,
    sent: Rc<Cell<u64>>,
}

impl Outbox {
    fn push(&self, to: usize, msg: ToReplica) {
        self.queued.set(self.queued.get() + 1);
        assert!(self.queue.try_send((to, msg)).is_ok());
    }

    /// One write's batches to each of `cores` replica cores, as the front end's hook hands them
    /// over: a clone of the shared slices per core.
    fn fan_out(&self, a: Appended, cores: usize, msg: fn(Handover) -> ToReplica) {
        for to in 0..cores {
            self.push(to, msg(Handover::Appended(a.clone())));
        }
    }

    /// Until the sender task has put everything queued on the channels.
    async fn drained(&self) {
        while self.sent.get() < self.queued.get() {
            yield_now().await;
        }
    }
}

async fn send_all(
    queue: LocalReceiver<(usize, ToReplica)>,
    channels: Rc<Vec<ConnectedSender<ToReplica>>>,
    sent: Rc<Cell<u64>>,
) {
    while let Some((to, msg)) = queue.recv().await {
        assert!(channels[to].send(msg).await.is_ok());
        sent.set(sent.get() + 1);
    }
}

/// The channel's figures, ns per message, medians of rounds.
struct Channel {
    one_way: f64,
    stream: f64,
    stream_send_cpu: f64,
    stream_receive_cpu: f64,
    /// Owner CPU for handing a write to a parked core (less the same loop without), and the
    /// replica's CPU to wake up and take it.
    parked_send_cpu: f64,
    parked_receive_cpu: f64,
}

/// One batch size's figures, medians of rounds.
struct Figures {
    size: usize,
    /// Owner CPU ns per append: without a hook, with one handing each write to the replica.
    plain: f64,
    hooked: f64,
    /// Owner CPU ns per batch for the forwarding alone (less the same loop without), to 1 core
    /// and to `FANOUT` cores, one after another (the replica cores busy).
    forward_1: f64,
    forward_n: f64,
    /// Replica ns per batch, per way of taking it (`TAKES`), on fresh bytes then on read ones:
    /// as the appends come (the replica woken for each), and in a burst (busy).
    woken: [f64; 2 * TAKES],
    busy: [f64; 2 * TAKES],
}

struct Owner {
    channels: Rc<Vec<ConnectedSender<ToReplica>>>,
    reply: ConnectedReceiver<FromReplica>,
    outbox: Rc<Outbox>,
}

impl Owner {
    async fn send(&self, msg: ToReplica) {
        assert!(self.channels[0].send(msg).await.is_ok());
    }

    async fn ask(&self, msg: ToReplica) -> FromReplica {
        self.send(msg).await;
        self.reply.recv().await.expect("the replica answers")
    }

    /// The replica's CPU ns per message of a stream of `n` that `send` sends.
    async fn streamed(&self, n: u64, send: impl std::future::Future<Output = ()>) -> f64 {
        self.send(ToReplica::Stream(n)).await;
        send.await;
        let Some(FromReplica::Streamed { cpu_ns }) = self.reply.recv().await else {
            panic!("the replica answers a stream");
        };
        cpu_ns as f64 / n as f64
    }

    /// Small messages (a ping-pong, a stream), and `event` handed over to a parked replica.
    async fn channel(&self, event: &Appended) -> Channel {
        let mut r: [Vec<f64>; 6] = Default::default();
        for round in 0..=ROUNDS {
            let start = Instant::now();
            for _ in 0..PINGS {
                assert!(matches!(self.ask(ToReplica::Ping).await, FromReplica::Pong));
            }
            let one_way = start.elapsed().as_nanos() as f64 / (2 * PINGS) as f64;

            let (start, mut send_cpu) = (Instant::now(), 0.0);
            let receive_cpu = self
                .streamed(STREAM, async {
                    let cpu = thread_cpu_ns();
                    for _ in 0..STREAM {
                        self.send(ToReplica::Tick).await;
                    }
                    send_cpu = (thread_cpu_ns() - cpu) as f64 / STREAM as f64;
                })
                .await;
            let stream = start.elapsed().as_nanos() as f64 / STREAM as f64;

            // One write handed over per pause: the replica parks between them.
            let paused = |cores: usize| async move {
                let cpu = thread_cpu_ns();
                for _ in 0..PARKED {
                    let a = event.clone();
                    if cores > 0 {
                        self.outbox.fan_out(a, cores, ToReplica::Forwarded);
                    } else {
                        drop(black_box(a));
                    }
                    glommio::timer::sleep(PAUSE).await;
                }
                self.outbox.drained().await;
                (thread_cpu_ns() - cpu) as f64 / PARKED as f64
            };
            let without_first = round % 2 == 1;
            let mut without = if without_first { paused(0).await } else { 0.0 };
            let mut with = 0.0;
            let receive_parked = self
                .streamed(PARKED, async {
                    with = paused(1).await;
                })
                .await;
            if !without_first {
                without = paused(0).await;
            }

            if round > 0 {
                let row = [
                    one_way,
                    stream,
                    send_cpu,
                    receive_cpu,
                    with - without,
                    receive_parked,
                ];
                for (v, x) in r.iter_mut().zip(row) {
                    v.push(x);
                }
            }
        }
        let m = r.map(median);
        Channel {
            one_way: m[0],
            stream: m[1],
            stream_send_cpu: m[2],
            stream_receive_cpu: m[3],
            parked_send_cpu: m[4],
            parked_receive_cpu: m[5],
        }
    }

    /// Owner CPU ns per append, without the hook and with it: `n` appends each, in blocks that
    /// take turns; each hooked block ends once its hand-overs are on the channel.
    async fn appends(&self, logs: [&Log; 2], pool: &[Bytes], n: usize) -> [f64; 2] {
        let block = n / BLOCKS;
        let mut cpu = [0u64; 2];
        for b in 0..BLOCKS {
            for v in [b % 2, 1 - b % 2] {
                let start = thread_cpu_ns();
                for i in 0..block {
                    let blob = pool[(b * block + i) % pool.len()].clone();
                    logs[v]
                        .append(blob, AppendOptions::default())
                        .await
                        .expect("append");
                }
                self.outbox.drained().await;
                cpu[v] += thread_cpu_ns() - start;
            }
        }
        cpu.map(|ns| ns as f64 / (block * BLOCKS) as f64)
    }

    /// Owner CPU ns per write of handing `events` (`n`, round and round) to `cores` cores as
    /// `msg` (0 cores: only the loop), one after another.
    async fn forwards(
        &self,
        events: &[Appended],
        n: usize,
        cores: usize,
        msg: fn(Handover) -> ToReplica,
    ) -> f64 {
        let start = thread_cpu_ns();
        for i in 0..n {
            let a = events[i % events.len()].clone();
            if cores > 0 {
                self.outbox.fan_out(a, cores, msg);
            } else {
                drop(black_box(a));
            }
            yield_now().await;
        }
        self.outbox.drained().await;
        (thread_cpu_ns() - start) as f64 / n as f64
    }

    /// Owner CPU ns per write of handing `n` writes of `burst` to replica 1, in blocks of writes
    /// handed over one after another right after they were appended (the appends not counted).
    async fn bursts(
        &self,
        burst: &Log,
        kept: &RefCell<Vec<Appended>>,
        pool: &[Bytes],
        n: usize,
    ) -> f64 {
        let block = n / BLOCKS;
        let mut ns = 0.0;
        for b in 0..BLOCKS {
            for i in 0..block {
                let blob = pool[(b * block + i) % pool.len()].clone();
                burst
                    .append(blob, AppendOptions::default())
                    .await
                    .expect("append");
            }
            let writes = std::mem::take(&mut *kept.borrow_mut());
            ns += self
                .forwards(&writes, block, 1, |h| ToReplica::Feed(1, h))
                .await
                * block as f64;
        }
        ns / (block * BLOCKS) as f64
    }

    /// The replica's figures since the last report.
    async fn report(&self) -> Taken {
        let FromReplica::Report(taken) = self.ask(ToReplica::Report).await else {
            panic!("the replica reports");
        };
        taken
    }

    async fn size(&self, size: usize) -> Figures {
        let pool: Vec<Bytes> = (0..16).map(|seed| batch(size, seed)).collect();
        let size = pool[0].len();
        let n = (ROUND_BYTES / size).max(MIN_BATCHES) / BLOCKS * BLOCKS;
        let events: Vec<Appended> = pool
            .iter()
            .map(|b| Appended {
                records: Records::whole_batches(b.clone()),
                from: 0,
                high_watermark: 1,
            })
            .collect();
        let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
        let mut logs = Vec::new();
        for dir in &dirs {
            let cache = Rc::new(TailCache::new(CACHE_BYTES, CHUNK_BYTES));
            logs.push(Log::open(dir.path(), config(), cache).await.unwrap());
        }
        // `plain` has no hook; `live` hands each write to replica 0 as it happens; `burst` keeps
        // its writes, to hand them to replica 1 one after another.
        let [plain, live, burst] = <[Log; 3]>::try_from(logs).ok().unwrap();
        self.send(ToReplica::Start(0, live.snapshot().unwrap()))
            .await;
        self.send(ToReplica::Start(1, burst.snapshot().unwrap()))
            .await;
        let (outbox, weak) = (self.outbox.clone(), live.downgrade());
        live.set_replication(Some(Rc::new(move |event: LogEvent| match event {
            LogEvent::Appended(a) => outbox.fan_out(a, 1, |h| ToReplica::Feed(0, h)),
            LogEvent::SegmentsChanged => {
                let log = weak.upgrade().expect("the owner is open");
                let snapshot = log.snapshot().expect("snapshot");
                outbox.push(0, ToReplica::Feed(0, Handover::Snapshot(snapshot)));
            }
        })));
        let kept = Rc::new(RefCell::new(Vec::new()));
        let keep = kept.clone();
        burst.set_replication(Some(Rc::new(move |event: LogEvent| match event {
            LogEvent::Appended(a) => keep.borrow_mut().push(a),
            LogEvent::SegmentsChanged => panic!("a segment holds every round"),
        })));

        let mut owner: [Vec<f64>; 5] = Default::default();
        let [mut woken, mut busy]: [[Vec<f64>; 2 * TAKES]; 2] = Default::default();
        for round in 0..=ROUNDS {
            let mut row = [0.0; 5];
            // The variants take turns going first; the replica has taken everything before the
            // next one starts.
            for v in (0..4).map(|i| (i + round) % 4) {
                match v {
                    0 => {
                        [row[0], row[1]] = self.appends([&plain, &live], &pool, n).await;
                        let taken = self.report().await;
                        assert_eq!(taken.batches(), n as u64, "every write was handed over");
                        if round > 0 {
                            for (x, v) in taken.per_batch().into_iter().zip(&mut woken) {
                                v.push(x);
                            }
                        }
                    }
                    1 => row[2] = self.forwards(&events, n, 0, ToReplica::Forwarded).await,
                    2 => {
                        row[3] = self.bursts(&burst, &kept, &pool, n).await;
                        let taken = self.report().await;
                        assert_eq!(taken.batches(), n as u64, "every write was handed over");
                        if round > 0 {
                            for (x, v) in taken.per_batch().into_iter().zip(&mut busy) {
                                v.push(x);
                            }
                        }
                    }
                    _ => {
                        let forwarded = ToReplica::Forwarded;
                        row[4] = self.forwards(&events, n, FANOUT, forwarded).await;
                    }
                }
                self.report().await;
            }
            if round > 0 {
                for (x, v) in row.into_iter().zip(&mut owner) {
                    v.push(x);
                }
            }
        }
        for log in [plain, live, burst] {
            log.set_replication(None);
            log.delete().await.unwrap();
        }
        let [plain, hooked, base, one, many] = owner.map(median);
        Figures {
            size,
            plain,
            hooked,
            forward_1: one - base,
            forward_n: many - base,
            woken: woken.map(median),
            busy: busy.map(median),
        }
    }
}

async fn owner(channels: Vec<SharedSender<ToReplica>>, reply: SharedReceiver<FromReplica>) {
    let mut connected = Vec::new();
    for c in channels {
        connected.push(c.connect().await);
    }
    let channels = Rc::new(connected);
    let reply = reply.connect().await;
    let (queue, queued) = local_channel::new_unbounded();
    let sent = Rc::new(Cell::new(0));
    let sender = glommio::spawn_local(send_all(queued, channels.clone(), sent.clone()));
    let owner = Owner {
        channels,
        reply,
        outbox: Rc::new(Outbox {
            queue,
            queued: Cell::new(0),
            sent,
        }),
    };

    let timer = {
        let start = Instant::now();
        for _ in 0..1000 {
            black_box(Instant::now());
        }
        start.elapsed().as_nanos() as f64 / 1000.0
    };
    let event = Appended {
        records: Records::whole_batches(batch(SIZES[0], 0)),
        from: 0,
        high_watermark: 1,
    };
    let channel = owner.channel(&event).await;
    let mut figures = Vec::new();
    for size in SIZES {
        figures.push(owner.size(size).await);
    }
    drop(owner);
    sender.await;
    report(timer, &channel, &figures);
}

/// ns per byte at `PRODUCED` bytes per second, as a share of one core.
fn core_share(ns_per_byte: f64) -> f64 {
    ns_per_byte * PRODUCED / 1e9
}

fn report(timer: f64, ch: &Channel, figures: &[Figures]) {
    println!(
        "channel, one small message: round trip / 2 {:.0} ns (the other core parked); a stream \
         of {STREAM}: {:.0} ns wall, sender {:.0} ns CPU, receiver {:.0} ns CPU per message",
        ch.one_way, ch.stream, ch.stream_send_cpu, ch.stream_receive_cpu
    );
    println!(
        "a 1 KiB write handed to a parked core (one per {PAUSE:?}): owner +{:.0} ns CPU, replica \
         {:.0} ns CPU (waking up included)",
        ch.parked_send_cpu, ch.parked_receive_cpu
    );
    println!();
    println!(
        "{:<22} {:>9} {:>9} {:>8} {:>7} {:>11} {:>13}",
        "owner, CPU ns a batch",
        "no hook",
        "hooked",
        "delta",
        "ratio",
        "fwd 1 core",
        format!("fwd/core ({FANOUT})")
    );
    for f in figures {
        println!(
            "{:<22} {:>9.0} {:>9.0} {:>8.0} {:>7.3} {:>11.0} {:>13.0}",
            format!("append, {} B", f.size),
            f.plain,
            f.hooked,
            f.hooked - f.plain,
            f.hooked / f.plain,
            f.forward_1,
            f.forward_n / FANOUT as f64
        );
    }
    println!(
        "(no hook, hooked: appends, the replica woken by each; fwd: the forwarding alone, one \
         write after another; to 1 core in blocks of a round's 1/{BLOCKS}, the first of each \
         waking the replica)"
    );
    println!();
    println!(
        "{:<22} {:>8} {:>8} {:>8} {:>8} {:>9} {:>8} {:>8} {:>7} {:>7}",
        "replica",
        "apply ns",
        "apply/B",
        "copy/B",
        "ring/B",
        "apply r/B",
        "copy r/B",
        "ring r/B",
        "copy %",
        "ring %"
    );
    for f in figures {
        for (what, r) in [("woken", f.woken), ("busy", f.busy)] {
            let s = f.size as f64;
            println!(
                "{:<22} {:>8.0} {:>8.4} {:>8.4} {:>8.4} {:>9.4} {:>8.4} {:>8.4} {:>6.0}% {:>6.0}%",
                format!("{} B, {what}", f.size),
                r[0],
                r[0] / s,
                r[1] / s,
                r[2] / s,
                r[3] / s,
                r[4] / s,
                r[5] / s,
                100.0 * r[1] / r[0],
                100.0 * r[2] / r[0]
            );
        }
    }
    println!(
        "(ns/B of apply, of a copy into a reused buffer, and into a ring as large as the tail \
         cache ({} MiB), on bytes fresh from the owner's core; r: on bytes the replica just read; \
         %: of apply; woken: by each append's hand-over, busy: hand-overs one after another; a \
         timer reading costs {timer:.0} ns, not subtracted)",
        CACHE_BYTES >> 20
    );
    println!();
    for f in figures {
        let s = f.size as f64;
        let rate = PRODUCED / s;
        // Busy cores take hand-overs one after another; a parked one is woken by each.
        let owner = [f.forward_n / FANOUT as f64, f.hooked - f.plain];
        let receive = [ch.stream_receive_cpu, ch.parked_receive_cpu];
        let apply = [f.busy[0], f.woken[0]];
        println!(
            "{} B: hand-over per batch per core: {:.0} ns + {:.4} ns/byte (owner {:.0} + receive \
             {:.0} ns; apply {:.0} ns a batch); waking a parked core: {:.0} ns + {:.4} ns/byte",
            f.size,
            owner[0] + receive[0],
            apply[0] / s,
            owner[0],
            receive[0],
            apply[0],
            owner[1] + receive[1],
            apply[1] / s
        );
        for (i, what) in ["busy", "each woken"].into_iter().enumerate() {
            let taking = receive[i] + apply[i];
            if i == 1 && taking * rate >= 1e9 {
                println!("  {what}: a replica core cannot park between {rate:.0} hand-overs/s");
                continue;
            }
            let replica = core_share(taking / s);
            let owners = [15.0, 63.0].map(|peers| core_share(peers * owner[i] / s));
            println!(
                "  at {:.0} GB/s produced, every core a replica ({rate:.0} batches/s each), \
                 {what}: a replica core {:.1}% of a core; the owners {:.1}% of a core sending to \
                 15 cores, {:.1}% to 63; all cores {:.2} cores (16), {:.2} (64)",
                PRODUCED / 1e9,
                100.0 * replica,
                100.0 * owners[0],
                100.0 * owners[1],
                15.0 * replica + owners[0],
                63.0 * replica + owners[1]
            );
        }
        println!(
            "  a zero-copy replica would save its copy: {:.1}% of a core (as into a reused buffer) \
             to {:.1}% (into a ring)",
            100.0 * core_share(f.busy[1] / s),
            100.0 * core_share(f.busy[2] / s)
        );
    }
}

fn main() {
    let (mut senders, mut receivers) = (Vec::new(), Vec::new());
    for _ in 0..FANOUT {
        let (s, r) = shared_channel::new_bounded(CAPACITY);
        senders.push(s);
        receivers.push(r);
    }
    let (reply_tx, reply_rx) = shared_channel::new_bounded(16);
    let replica_thread = LocalExecutorBuilder::default()
        .name("replica")
        .spawn(move || replica(receivers, reply_tx))
        .expect("the replica's executor");
    let owner_thread = LocalExecutorBuilder::default()
        .name("owner")
        .spawn(move || owner(senders, reply_rx))
        .expect("the owner's executor");
    owner_thread.join().expect("the owner's thread");
    replica_thread.join().expect("the replica's thread");
}
