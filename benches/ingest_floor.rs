//! The floor of the ingest workload on this machine: what one server core costs to do only the
//! socket work of `shoal bench fanout --consumers 1 --producers 4 --partitions 4` (the ingest run
//! of the README), beside one bulk TCP stream (the `iperf3` figure) measured in the same run.
//!
//! The floor server is a glommio executor on CPU 0, the clients another on CPU 1 (so it needs two
//! CPUs to mean anything). It is what a broker cannot do less than, per request:
//! - 4 producer connections, each keeping 5 requests of 16 KiB in flight (the bench's defaults:
//!   16 messages of 1 KiB per batch, one batch per request, `--max-in-flight 5`);
//! - the server reads them through shoal's receive buffer (`wire::frame::FrameReader`: one read
//!   takes what has arrived), copies each payload once into its partition's memory (a broker must
//!   keep the bytes: shoal's tail cache), and answers each with 64 bytes, the answers of one read
//!   written together;
//! - one consumer per partition long-polls: each fetch is answered, as soon as anything is there,
//!   with everything produced since its last one, from that memory without copying (one `writev`).
//!
//! No protocol decoding, no CRC, no disk, no offsets: a broker does all of that on top. The figures
//! are the floor for shoal's ingest row: CPU-s per produced GB of the server (ingest plus the
//! delivery to one consumer per partition, as the bench counts it), and its rate as a share of the
//! bulk stream's. Both are printed with the bulk stream's, measured in the same run.
//!
//! A second floor adds what keeping the bytes costs the kernel where a broker acknowledges acks=1 (the
//! page cache, as Kafka and shoal do): each payload is also written, with one `pwrite`, at the end
//! of its partition's file in the system temporary directory, and a thread `fdatasync`s every file
//! each second (shoal's `--flush-ms` default); that thread's CPU is counted with the server's.
//!
//! A third floor writes what one read of a producer's connection brought with one Direct I/O
//! `O_DSYNC` write (copied into a DMA buffer, padded to whole blocks, into a file written with zeros
//! first) before answering: what acks=all costs, as shoal writes it. A fourth does the same without
//! `O_DSYNC`: what acks=1 costs where shoal writes it with Direct I/O (a device that keeps up).
//!
//! `cargo bench --bench ingest_floor` (about 55 s); `-- --quick` for a smoke run; `-- --batch-bytes
//! N` for another request size (the bench's `--batch-bytes`).

use bytes::{Bytes, BytesMut};
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::channels::local_channel;
use glommio::net::{TcpListener, TcpStream};
use glommio::{LocalExecutorBuilder, Placement};
use shoal::wire::frame::FrameReader;
use std::cell::RefCell;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PARTITIONS: usize = 4;
const IN_FLIGHT: u64 = 5;
const ANSWER: usize = 64;
const WARMUP: Duration = Duration::from_secs(1);
/// The page cache floor's flushing thread, for `measure` to count (0: none).
static FLUSH_TID: AtomicI32 = AtomicI32::new(0);

struct Args {
    secs: f64,
    batch: usize,
}

fn args() -> Args {
    let mut a = Args {
        secs: 8.0,
        batch: 16 << 10,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--quick" => a.secs = 1.0,
            "--batch-bytes" => {
                a.batch = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--batch-bytes N (bytes)")
            }
            _ => {} // cargo bench passes --bench
        }
    }
    a
}

/// What the measured window saw.
struct Window {
    bytes: u64,
    fetches: u64,
    secs: f64,
    server_cpu_s: f64,
}

impl Window {
    fn gb_per_s(&self) -> f64 {
        self.bytes as f64 / self.secs / 1e9
    }
    fn cpu_per_gb(&self) -> f64 {
        self.server_cpu_s / (self.bytes as f64 / 1e9)
    }
}

/// Shared between the threads: the server's thread id (for its CPU time), bytes counted by the
/// clients, and the stop flag.
#[derive(Default)]
struct Shared {
    server_tid: AtomicI32,
    /// The flushing thread of the page cache floor, whose CPU counts as the server's (0: none).
    flush_tid: AtomicI32,
    bytes: AtomicU64,
    /// Fetch answers the consumers read (the ingest floor only).
    fetches: AtomicU64,
    stop: AtomicBool,
}

/// CPU time of thread `tid` of this process, from the scheduler's own accounting (nanoseconds).
fn thread_cpu(tid: i32) -> Duration {
    let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).unwrap_or_default();
    let ns = s
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    Duration::from_nanos(ns)
}

/// Runs `server` on CPU 0 and `clients` on CPU 1 for the warm-up and `secs`, and measures the bytes
/// the clients count and the server thread's CPU time over the measured part.
fn measure<S, SF, C, CF>(secs: f64, server: S, clients: C) -> Window
where
    S: FnOnce(TcpListener, Arc<Shared>) -> SF + Send + 'static,
    SF: std::future::Future<Output = ()> + 'static,
    C: FnOnce(std::net::SocketAddr, Arc<Shared>) -> CF + Send + 'static,
    CF: std::future::Future<Output = ()> + 'static,
{
    let shared = Arc::new(Shared::default());
    shared.flush_tid.store(FLUSH_TID.load(SeqCst), SeqCst);
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let sh = shared.clone();
    let srv = LocalExecutorBuilder::new(Placement::Fixed(0))
        .name("floor-server")
        .spawn(move || async move {
            sh.server_tid.store(unsafe { libc::gettid() }, SeqCst);
            l.set_nonblocking(true).unwrap();
            // SAFETY: the descriptor of the listener bound above, handed over here only.
            let listener = unsafe { TcpListener::from_raw_fd(l.into_raw_fd()) };
            server(listener, sh).await
        })
        .unwrap();
    let sh = shared.clone();
    let cli = LocalExecutorBuilder::new(Placement::Fixed(1))
        .name("floor-clients")
        .spawn(move || async move { clients(addr, sh).await })
        .unwrap();
    // The warm-up starts once traffic flows (the device floor writes its files first).
    while shared.bytes.load(SeqCst) == 0 {
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(WARMUP);
    let tids = [&shared.server_tid, &shared.flush_tid].map(|t| t.load(SeqCst));
    let cpu = || -> Duration {
        tids.iter()
            .filter(|&&t| t != 0)
            .map(|&t| thread_cpu(t))
            .sum()
    };
    let counts = || (shared.bytes.load(SeqCst), shared.fetches.load(SeqCst));
    let ((b0, f0), c0, t0) = (counts(), cpu(), Instant::now());
    std::thread::sleep(Duration::from_secs_f64(secs));
    let ((b1, f1), c1, t1) = (counts(), cpu(), Instant::now());
    shared.stop.store(true, SeqCst);
    let _ = cli.join();
    let _ = srv.join();
    Window {
        bytes: b1 - b0,
        fetches: f1 - f0,
        secs: (t1 - t0).as_secs_f64(),
        server_cpu_s: (c1 - c0).as_secs_f64(),
    }
}

/// Accepts `n` connections, then runs `handle` on each until the stop flag.
async fn serve_n<H, F>(listener: TcpListener, shared: Arc<Shared>, n: usize, handle: H)
where
    H: Fn(usize, TcpStream) -> F,
    F: std::future::Future<Output = ()> + 'static,
{
    let mut tasks = Vec::new();
    for i in 0..n {
        let s = listener.accept().await.unwrap();
        s.set_nodelay(true).unwrap();
        tasks.push(glommio::spawn_local(handle(i, s)));
    }
    while !shared.stop.load(SeqCst) {
        glommio::timer::sleep(Duration::from_millis(20)).await;
    }
    drop(tasks);
}

/// One bulk stream: 256 KiB writes, read into a 256 KiB buffer and dropped.
fn bulk(secs: f64) -> Window {
    const WRITE: usize = 256 << 10;
    measure(
        secs,
        |l, sh| async move {
            serve_n(l, sh, 1, |_, mut s| async move {
                let mut buf = vec![0u8; WRITE];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                }
            })
            .await
        },
        |addr, sh| async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            let data = vec![7u8; WRITE];
            while !sh.stop.load(SeqCst) {
                if s.write_all(&data).await.is_err() {
                    break;
                }
                sh.bytes.fetch_add(WRITE as u64, SeqCst);
            }
        },
    )
}

/// A partition's memory: produced bytes not yet fetched, appended behind those fetched (which the
/// fetch answers still hold), and a wake-up for its long-polling consumer.
struct Partition {
    /// Its file and where its end is (the page cache floor only).
    file: Option<(std::fs::File, std::cell::Cell<u64>)>,
    /// Its file written with Direct I/O, and where the next write goes (the device floors).
    device: Option<(glommio::io::DmaFile, std::cell::Cell<u64>)>,
    unfetched: RefCell<BytesMut>,
    arrived: local_channel::LocalSender<()>,
    wait: RefCell<Option<local_channel::LocalReceiver<()>>>,
}

/// The ingest floor: see the module's documentation. Connections 0..4 are producers (producer `i`
/// writes partition `i`), 4..8 consumers (consumer `i - 4` reads partition `i - 4`). With `files`
/// (one per partition), each payload is also written to its partition's file; with `device` (one
/// path per partition, and whether `O_DSYNC`), each read's payloads are written with Direct I/O.
fn ingest(
    secs: f64,
    batch: usize,
    files: Option<Vec<std::fs::File>>,
    device: Option<(Vec<std::path::PathBuf>, bool)>,
) -> Window {
    measure(
        secs,
        move |l, sh| async move {
            let mut files = files.map(|f| f.into_iter());
            let mut device = match device {
                Some((paths, dsync)) => Some(open_device_files(paths, dsync).await.into_iter()),
                None => None,
            };
            let parts: Rc<Vec<Partition>> = Rc::new(
                (0..PARTITIONS)
                    .map(|_| {
                        let (tx, rx) = local_channel::new_bounded(1);
                        Partition {
                            file: files
                                .as_mut()
                                .map(|f| (f.next().unwrap(), std::cell::Cell::new(0))),
                            device: device
                                .as_mut()
                                .map(|f| (f.next().unwrap(), std::cell::Cell::new(0))),
                            unfetched: RefCell::new(BytesMut::with_capacity(8 << 20)),
                            arrived: tx,
                            wait: RefCell::new(Some(rx)),
                        }
                    })
                    .collect(),
            );
            serve_n(l, sh, 2 * PARTITIONS, move |i, s| {
                let parts = parts.clone();
                async move {
                    if i < PARTITIONS {
                        produce_side(s, &parts[i], batch).await
                    } else {
                        fetch_side(s, &parts[i - PARTITIONS]).await
                    }
                }
            })
            .await
        },
        move |addr, sh| async move {
            let mut tasks = Vec::new();
            for _ in 0..PARTITIONS {
                let s = TcpStream::connect(addr).await.unwrap();
                s.set_nodelay(true).unwrap();
                tasks.push(glommio::spawn_local(producer(s, batch, sh.clone())));
            }
            for _ in 0..PARTITIONS {
                let s = TcpStream::connect(addr).await.unwrap();
                s.set_nodelay(true).unwrap();
                tasks.push(glommio::spawn_local(consumer(s, sh.clone())));
            }
            for t in tasks {
                t.await;
            }
        },
    )
}

/// Server side of a producer: frames (a size, then the payload) read through shoal's own receive
/// buffer ([`FrameReader`]), the answers to the frames one read brought written together.
async fn produce_side(mut s: TcpStream, part: &Partition, batch: usize) {
    let mut frames = FrameReader::new();
    let answer = [0u8; ANSWER];
    let mut answers = Vec::with_capacity(64 * ANSWER);
    let mut payloads = Vec::new();
    while let Ok(payload) = frames.read_request(&mut s, batch).await {
        if let Some((file, end)) = &part.file {
            std::os::unix::fs::FileExt::write_all_at(file, &payload, end.get()).unwrap();
            end.set(end.get() + payload.len() as u64);
        }
        part.unfetched.borrow_mut().extend_from_slice(&payload);
        answers.extend_from_slice(&answer);
        if part.device.is_some() {
            payloads.push(payload);
        }
        if !frames.has_frame() {
            if let Some((file, at)) = &part.device {
                write_direct(file, at, &payloads).await;
                payloads.clear();
            }
            let _ = part.arrived.try_send(());
            if s.write_all(&answers).await.is_err() {
                return;
            }
            answers.clear();
        }
    }
}

/// Bytes of each device floor file, written with zeros before the run (so that the run's writes
/// overwrite written blocks and are issued inline, as shoal's zeros written ahead make them); the
/// writes wrap around within them.
const DEVICE_FILE: u64 = 1 << 30;

/// Opens one file per path for Direct I/O writes (`O_DSYNC` with `dsync`) and fills it with zeros.
async fn open_device_files(
    paths: Vec<std::path::PathBuf>,
    dsync: bool,
) -> Vec<glommio::io::DmaFile> {
    let mut files = Vec::new();
    for path in paths {
        let f = glommio::io::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .custom_flags(if dsync { libc::O_DSYNC } else { 0 })
            .dma_open(&path)
            .await
            .unwrap();
        let step = 1 << 20;
        let mut at = 0;
        while at < DEVICE_FILE {
            let mut zeros = f.alloc_dma_buffer(step);
            zeros.as_bytes_mut().fill(0);
            f.write_at(zeros, at).await.unwrap();
            at += step as u64;
        }
        files.push(f);
    }
    files
}

/// The payloads one read brought, copied into one DMA buffer padded to whole blocks and written at
/// `at` (as shoal writes a group of appends with Direct I/O).
async fn write_direct(file: &glommio::io::DmaFile, at: &std::cell::Cell<u64>, payloads: &[Bytes]) {
    let len: usize = payloads.iter().map(|p| p.len()).sum();
    let padded = len.next_multiple_of(4096);
    let mut buf = file.alloc_dma_buffer(padded);
    let b = buf.as_bytes_mut();
    let mut pos = 0;
    for p in payloads {
        b[pos..pos + p.len()].copy_from_slice(p);
        pos += p.len();
    }
    b[pos..].fill(0);
    let mut to = at.get();
    if to + padded as u64 > DEVICE_FILE {
        to = 0;
    }
    file.write_at(buf, to).await.unwrap();
    at.set(to + padded as u64);
}

/// Server side of a consumer: each 8-byte fetch is answered with a `u32` length and everything
/// produced since the last answer, waiting for something if there is nothing.
async fn fetch_side(mut s: TcpStream, part: &Partition) {
    let wait = part.wait.borrow_mut().take().unwrap();
    let mut req = [0u8; 8];
    loop {
        if s.read_exact(&mut req).await.is_err() {
            return;
        }
        let data: Bytes = loop {
            let d = part.unfetched.borrow_mut().split().freeze();
            if !d.is_empty() {
                break d;
            }
            if wait.recv().await.is_none() {
                return;
            }
        };
        {
            let mut u = part.unfetched.borrow_mut();
            if u.capacity() < 1 << 20 {
                *u = BytesMut::with_capacity(8 << 20);
            }
        }
        let head = (data.len() as u32).to_be_bytes();
        if send_two(&mut s, &head, &data).await.is_err() {
            return;
        }
    }
}

/// Writes `a` then `b` with one `writev` when the socket takes them, else the rest with glommio.
async fn send_two(s: &mut TcpStream, a: &[u8], b: &[u8]) -> std::io::Result<()> {
    let iov = [
        libc::iovec {
            iov_base: a.as_ptr() as *mut _,
            iov_len: a.len(),
        },
        libc::iovec {
            iov_base: b.as_ptr() as *mut _,
            iov_len: b.len(),
        },
    ];
    // SAFETY: both buffers outlive the call; the descriptor is the stream's own, non-blocking.
    let n = unsafe { libc::writev(s.as_raw_fd(), iov.as_ptr(), 2) };
    let sent = if n < 0 { 0 } else { n as usize };
    if sent < a.len() {
        s.write_all(&a[sent..]).await?;
        s.write_all(b).await
    } else {
        s.write_all(&b[sent - a.len()..]).await
    }
}

/// A producer: `IN_FLIGHT` requests of `batch` bytes outstanding, each answered with 64 bytes (the
/// next request goes as soon as an answer is read).
async fn producer(mut s: TcpStream, batch: usize, sh: Arc<Shared>) {
    let mut frame = vec![9u8; 4 + batch];
    frame[..4].copy_from_slice(&(batch as u32).to_be_bytes());
    let mut answer = [0u8; ANSWER];
    let mut outstanding = 0;
    while !sh.stop.load(SeqCst) {
        while outstanding < IN_FLIGHT {
            if s.write_all(&frame).await.is_err() {
                return;
            }
            outstanding += 1;
        }
        if s.read_exact(&mut answer).await.is_err() {
            return;
        }
        outstanding -= 1;
        sh.bytes.fetch_add(batch as u64, SeqCst);
    }
}

/// A consumer: one fetch at a time, its answer read whole.
async fn consumer(mut s: TcpStream, sh: Arc<Shared>) {
    let mut buf = vec![0u8; 1 << 20];
    while !sh.stop.load(SeqCst) {
        if s.write_all(&[0u8; 8]).await.is_err() {
            break;
        }
        let mut head = [0u8; 4];
        if s.read_exact(&mut head).await.is_err() {
            break;
        }
        let mut left = u32::from_be_bytes(head) as usize;
        while left > 0 {
            let n = left.min(buf.len());
            if s.read_exact(&mut buf[..n]).await.is_err() {
                return;
            }
            left -= n;
        }
        sh.fetches.fetch_add(1, SeqCst);
    }
}

fn main() {
    let a = args();
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        println!("ingest_floor: needs 2 CPUs (server on one, clients on the other); skipped");
        return;
    }
    let wire = bulk(a.secs);
    println!(
        "bulk TCP stream (256 KiB writes, one connection): {:.2} GB/s, receiver {:.3} CPU-s per GB",
        wire.gb_per_s(),
        wire.cpu_per_gb()
    );
    let floor = ingest(a.secs, a.batch, None, None);
    print_floor("ingest floor", &a, &floor, &wire);
    let page_cache = with_files(|files| ingest(a.secs, a.batch, Some(files), None));
    print_floor("ingest floor + page cache write", &a, &page_cache, &wire);
    for (dsync, name) in [
        (true, "ingest floor + O_DSYNC device write"),
        (false, "ingest floor + Direct I/O device write (no O_DSYNC)"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let paths = (0..PARTITIONS)
            .map(|i| dir.path().join(format!("{i}.log")))
            .collect();
        let device = ingest(a.secs, a.batch, None, Some((paths, dsync)));
        print_floor(name, &a, &device, &wire);
    }
}

fn print_floor(name: &str, a: &Args, floor: &Window, wire: &Window) {
    println!(
        "{name} ({PARTITIONS} producers x {IN_FLIGHT} in flight x {} KiB requests, 1 consumer per partition, one server core): {:.0} MB/s = {:.2}x the bulk stream, server {:.3} CPU-s per produced GB ({:.1} us per request; fetch answers of {:.1} KiB on average)",
        a.batch >> 10,
        floor.gb_per_s() * 1e3,
        floor.gb_per_s() / wire.gb_per_s(),
        floor.cpu_per_gb(),
        floor.server_cpu_s / (floor.bytes as f64 / a.batch as f64) * 1e6,
        floor.bytes as f64 / floor.fetches.max(1) as f64 / 1024.0,
    );
}

/// Runs `run` with one new file per partition in a temporary directory, and a thread that
/// `fdatasync`s them every second until `run` returns (its thread id in `FLUSH_TID` for `measure`).
fn with_files(run: impl FnOnce(Vec<std::fs::File>) -> Window) -> Window {
    let dir = tempfile::tempdir().unwrap();
    let files: Vec<std::fs::File> = (0..PARTITIONS)
        .map(|i| std::fs::File::create(dir.path().join(format!("{i}.log"))).unwrap())
        .collect();
    let synced: Vec<std::fs::File> = files.iter().map(|f| f.try_clone().unwrap()).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let tid = Arc::new(AtomicI32::new(0));
    let flusher = {
        let (stop, tid) = (stop.clone(), tid.clone());
        std::thread::spawn(move || {
            tid.store(unsafe { libc::gettid() }, SeqCst);
            while !stop.load(SeqCst) {
                std::thread::sleep(Duration::from_secs(1));
                synced.iter().for_each(|f| f.sync_data().unwrap());
            }
        })
    };
    while tid.load(SeqCst) == 0 {
        std::thread::yield_now();
    }
    FLUSH_TID.store(tid.load(SeqCst), SeqCst);
    let w = run(files);
    FLUSH_TID.store(0, SeqCst);
    stop.store(true, SeqCst);
    flusher.join().unwrap();
    w
}
