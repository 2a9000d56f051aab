//! What each client task is given: its settings, its share of the run (a consumer's or a
//! producer's plan), the reporter of its counts, and its connection.

use crate::bench::client::{Brokers, Codec, PartitionLeader, ProducerIdVersions};
use crate::bench::stats::{Phase, Shared};
use glommio::net::TcpStream;
use std::fmt::Display;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::Duration;

/// What every client task needs to know.
#[derive(Debug, Clone)]
pub(super) struct ClientCfg {
    pub(super) topic: String,
    pub(super) produce_version: i16,
    pub(super) fetch_version: i16,
    pub(super) acks: i16,
    pub(super) compression: Codec,
    pub(super) message_bytes: usize,
    pub(super) records_per_batch: usize,
    /// Shard views read (records get keys, and the first records of each batch one per shard).
    pub(super) views: Option<u32>,
    /// Seconds between two batches of one producer (0: no pacing).
    pub(super) batch_interval: f64,
    pub(super) max_in_flight: usize,
    pub(super) fetch_max_wait: Duration,
    pub(super) isolation_level: i8,
    pub(super) fetch_max_bytes: i32,
    pub(super) receive_buffer: usize,
    /// Raw baseline: offsets wrap at this.
    pub(super) modulus: Option<i64>,
    pub(super) sample_latency: bool,
    /// `--follow-replicas`: consumers move to the read replica a fetch response prefers, found in
    /// `brokers`.
    pub(super) follow_replicas: bool,
    pub(super) brokers: Brokers,
    /// Plain, idempotent or transactional producers, and the versions of the calls they need.
    pub(super) producer_mode: ProducerMode,
    /// Consumers read HTTP streams (protocol, address) instead of fetching.
    pub(super) stream: Option<(crate::bench::args::Protocol, std::net::SocketAddr)>,
    pub(super) producer_ids: ProducerIdVersions,
    /// Producer i's transactional id is `<transactional_prefix>-<i>`.
    pub(super) transactional_prefix: String,
}

#[derive(Debug, Clone)]
pub(super) struct ConsumerPlan {
    pub(super) id: usize,
    /// The topic it fetches: the workload's, or one of its shard views.
    pub(super) topic: Arc<str>,
    pub(super) partition: i32,
    pub(super) leader: SocketAddr,
    /// The leader's node id (-1: none, the raw baseline).
    pub(super) leader_id: i32,
}

#[derive(Debug, Clone)]
pub(super) struct ProducerPlan {
    pub(super) id: usize,
    pub(super) partitions: Vec<PartitionLeader>,
}

/// How a client task reports errors: in the run's list and its own counter.
pub(super) struct Reporter<'a> {
    pub(super) shared: &'a Shared,
    pub(super) who: String,
    pub(super) errors: &'a AtomicU64,
    /// Set by [`fail`](Self::fail): a consumer that gave up did not receive everything.
    pub(super) failed: Option<&'a AtomicBool>,
}

impl<'a> Reporter<'a> {
    /// The reporter of consumer `plan` (`kind`: "consumer", "stream consumer").
    pub(super) fn consumer(shared: &'a Shared, plan: &ConsumerPlan, kind: &str) -> Self {
        let stats = &shared.consumers[plan.id];
        Reporter {
            shared,
            who: format!(
                "{kind} {} ({} partition {})",
                plan.id, plan.topic, plan.partition
            ),
            errors: &stats.errors,
            failed: Some(&stats.failed),
        }
    }

    /// An error the task carries on after.
    pub(super) fn error(&self, msg: impl Display) {
        self.shared.error(format!("{}: {msg}", self.who));
        self.errors.fetch_add(1, Relaxed);
    }

    /// An error that ends the task.
    pub(super) fn fail(&self, msg: impl Display) {
        self.error(msg);
        if let Some(f) = self.failed {
            f.store(true, Relaxed);
        }
    }
}

/// Sets a task's `done` flag when the task ends, however it ends.
pub(super) struct DoneOnDrop<'a>(pub(super) &'a AtomicBool);

impl Drop for DoneOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Relaxed);
    }
}

/// Waits for the end of the set-up phase: every task starts together, once all consumers are
/// connected.
pub(super) async fn setup_over(shared: &Shared) {
    while shared.phase() == Phase::Setup {
        glommio::timer::sleep(Duration::from_millis(1)).await;
    }
}

/// A connection to `addr` (through TLS with `--tls-ca`).
pub(super) async fn connect(addr: SocketAddr) -> io::Result<shoal::wire::SharedStream> {
    let s = TcpStream::connect_timeout(addr, Duration::from_secs(10))
        .await
        .map_err(|e| io::Error::other(format!("connecting to {addr}: {e}")))?;
    s.set_nodelay(true)
        .and_then(|_| s.set_read_timeout(Some(Duration::from_secs(60))))
        .and_then(|_| s.set_write_timeout(Some(Duration::from_secs(60))))
        .map_err(|e| io::Error::other(e.to_string()))?;
    let mut stream = crate::client::tls::wrap(s, addr).await?;
    crate::client::sasl::authenticate(&mut stream).await?;
    Ok(stream)
}

/// How the producers mark their batches (`--idempotent`, `--transactional`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProducerMode {
    /// No producer id: batches carry producer id -1 and no sequence.
    #[default]
    Plain,
    /// A producer id from InitProducerId; per partition, sequences that follow on.
    Idempotent,
    /// Idempotent, under a transactional id, committing a transaction every `commit_interval`.
    Transactional { commit_interval: Duration },
}

impl ProducerMode {
    /// Its name in the summary.
    pub fn name(self) -> &'static str {
        match self {
            ProducerMode::Plain => "plain",
            ProducerMode::Idempotent => "idempotent",
            ProducerMode::Transactional { .. } => "transactional",
        }
    }

    pub fn commit_interval(self) -> Option<Duration> {
        match self {
            ProducerMode::Transactional { commit_interval } => Some(commit_interval),
            _ => None,
        }
    }
}
