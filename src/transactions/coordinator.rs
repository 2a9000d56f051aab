//! One core's transaction coordinator: the transactional ids this core owns, their states in the
//! core's transaction log, and the checks of the Kafka requests that change them. Each operation
//! makes the next state durable before it is installed and answers what the caller must do next:
//! nothing, or a transaction's markers to write (on the partitions' owner cores and the groups'
//! coordinators), after which [`TxnCoordinator::markers_written`] completes the transaction. The
//! markers themselves are written by `crate::cores::transaction_markers`, which knows the cores.

use super::log::{TxnLog, TxnLogError};
use super::state::{
    init_producer_id, InitOutcome, Markers, ProducerIdAndEpoch, TopicPartition, Transition,
    TxnMetadata, TxnState,
};
use super::{coordinator_core, log_dir};
use crate::metrics::{Exposition, Family};
use kafka_protocol::error::ResponseError;
use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

/// Settings from the command line.
#[derive(Debug, Clone, Copy)]
pub struct TxnConfig {
    /// Largest `transaction.timeout.ms` a producer may ask for (Kafka
    /// `transaction.max.timeout.ms`).
    pub max_timeout_ms: i32,
    /// A transactional id with no transaction for this long is forgotten (Kafka
    /// `transactional.id.expiration.ms`).
    pub id_expiration: Duration,
    /// How often the coordinator looks for transactions past their timeout (Kafka
    /// `transaction.abort.timed.out.transaction.cleanup.interval.ms`).
    pub timeout_check_interval: Duration,
    /// Compact a core's transaction log once it holds at least this many records (and more than
    /// twice the live ids).
    pub compact_min_records: u64,
}

impl Default for TxnConfig {
    fn default() -> Self {
        TxnConfig {
            max_timeout_ms: 900_000,
            id_expiration: Duration::from_millis(604_800_000),
            timeout_check_interval: Duration::from_millis(1_000),
            compact_min_records: 10_000,
        }
    }
}

/// What an InitProducerId leads to.
#[derive(Debug)]
pub enum Init<'a> {
    /// The producer id and epoch to answer with (durable).
    Ready(i64, i16),
    /// The id's open transaction is being aborted first: write these markers (the round is
    /// claimed), complete it, then ask again.
    AbortFirst(Markers, Completing<'a>),
}

/// Counters for the metrics.
#[derive(Debug, Default)]
pub struct TxnCounters {
    pub commits: Cell<u64>,
    pub aborts: Cell<u64>,
    /// Transactions the coordinator aborted because they outlived their timeout.
    pub timeouts: Cell<u64>,
    /// Producers fenced by a newer one with the same transactional id.
    pub fenced: Cell<u64>,
}

/// What a core's transaction coordinator reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TxnStats {
    /// Transactional ids known.
    pub ids: u64,
    /// Transactions open (ongoing, or their markers being written).
    pub open: u64,
    pub commits: u64,
    pub aborts: u64,
    pub timeouts: u64,
    pub fenced: u64,
}

const PER_CORE: [Family<TxnStats>; 6] = [
    (
        "ids",
        "gauge",
        "Transactional ids the core coordinates.",
        |t| t.ids,
    ),
    (
        "open",
        "gauge",
        "Transactions open (ongoing, or their markers being written) that the core coordinates.",
        |t| t.open,
    ),
    (
        "committed_total",
        "counter",
        "Transactions committed (every marker written).",
        |t| t.commits,
    ),
    (
        "aborted_total",
        "counter",
        "Transactions aborted (every marker written), timed out ones included.",
        |t| t.aborts,
    ),
    (
        "timed_out_total",
        "counter",
        "Transactions the coordinator aborted because they outlived their timeout.",
        |t| t.timeouts,
    ),
    (
        "producers_fenced_total",
        "counter",
        "Transactional producers fenced by a newer one with the same transactional id.",
        |t| t.fenced,
    ),
];

impl TxnStats {
    /// The transaction coordinator's families for every core: (core, its stats).
    pub fn write_prometheus(out: &mut Exposition, cores: &[(usize, &TxnStats)]) {
        out.per_core("shoal_transactions_", &PER_CORE, cores);
    }
}

/// One core's transaction coordinator.
#[derive(Debug)]
pub struct TxnCoordinator {
    core: usize,
    cores: usize,
    pub config: TxnConfig,
    log: RefCell<Option<Rc<TxnLog>>>,
    /// Ids claimed by a change being made or a round of markers being written (by a request or
    /// the ticker): one at a time.
    completing: RefCell<HashSet<String>>,
    pub counters: TxnCounters,
}

/// Clears an id's `completing` mark however the round ends.
#[derive(Debug)]
pub struct Completing<'a>(&'a TxnCoordinator, String);

impl Drop for Completing<'_> {
    fn drop(&mut self) {
        self.0.completing.borrow_mut().remove(&self.1);
    }
}

impl TxnCoordinator {
    pub fn new(core: usize, cores: usize, config: TxnConfig) -> Self {
        TxnCoordinator {
            core,
            cores,
            config,
            log: RefCell::new(None),
            completing: RefCell::new(HashSet::new()),
            counters: TxnCounters::default(),
        }
    }

    /// Opens this core's transaction log. Ids another core coordinates (stale copies a crashed
    /// `--cores` change left) are dropped: their coordinator holds the live state.
    pub async fn load(&self, data_dir: &Path, cache: Rc<shards::TailCache>) -> Result<(), String> {
        let log = TxnLog::open(
            &log_dir(data_dir, self.core),
            cache,
            self.config.compact_min_records,
        )
        .await?;
        let dropped = super::reshard::drop_foreign(&log, self.core, self.cores).await?;
        if dropped > 0 {
            log::warn!(
                "core {}: dropped {dropped} stale copies of transactional ids other cores coordinate",
                self.core
            );
        }
        *self.log.borrow_mut() = Some(Rc::new(log));
        Ok(())
    }

    /// The log, if this core coordinates `transactional_id` and its log is open.
    pub fn check(&self, transactional_id: &str) -> Result<Rc<TxnLog>, ResponseError> {
        if transactional_id.is_empty() {
            return Err(ResponseError::InvalidRequest);
        }
        if coordinator_core(transactional_id, self.cores) != self.core {
            return Err(ResponseError::NotCoordinator);
        }
        self.log
            .borrow()
            .clone()
            .ok_or(ResponseError::CoordinatorLoadInProgress)
    }

    /// The log, if open (statistics, the ticker, Describe/ListTransactions).
    pub fn log(&self) -> Option<Rc<TxnLog>> {
        self.log.borrow().clone()
    }

    /// InitProducerId with a transactional id. `allocate` hands out a new producer id.
    pub async fn init_producer_id(
        &self,
        transactional_id: &str,
        timeout_ms: i32,
        expected: Option<ProducerIdAndEpoch>,
        now: i64,
        allocate: &mut dyn FnMut() -> i64,
    ) -> Result<Init<'_>, ResponseError> {
        let log = self.check(transactional_id)?;
        let claim = self.claim(transactional_id)?;
        let current = log.get(transactional_id);
        let outcome = init_producer_id(
            current.as_ref(),
            timeout_ms,
            self.config.max_timeout_ms,
            expected,
            now,
            allocate,
        )?;
        match outcome {
            InitOutcome::Ready(t) => {
                let (id, epoch) = (t.next.producer_id, t.next.epoch);
                if current.is_some_and(|c| c.producer_id == id && c.epoch != epoch) {
                    self.counters.fenced.set(self.counters.fenced.get() + 1);
                }
                self.apply(&log, transactional_id, t).await?;
                Ok(Init::Ready(id, epoch))
            }
            InitOutcome::AbortFirst(t) => {
                self.counters.fenced.set(self.counters.fenced.get() + 1);
                let markers = self.apply(&log, transactional_id, t).await?;
                let markers = markers.ok_or(ResponseError::UnknownServerError)?;
                Ok(Init::AbortFirst(markers, claim))
            }
        }
    }

    /// AddPartitionsToTxn: durable once this returns Ok.
    pub async fn add_partitions(
        &self,
        transactional_id: &str,
        producer_id: i64,
        epoch: i16,
        partitions: &[TopicPartition],
        now: i64,
    ) -> Result<(), ResponseError> {
        let (log, m, _claim) = self.current(transactional_id)?;
        let t = m.add_partitions(producer_id, epoch, partitions, now)?;
        self.apply(&log, transactional_id, t).await.map(|_| ())
    }

    /// AddOffsetsToTxn: durable once this returns Ok.
    pub async fn add_offsets(
        &self,
        transactional_id: &str,
        producer_id: i64,
        epoch: i16,
        group: &str,
        now: i64,
    ) -> Result<(), ResponseError> {
        let (log, m, _claim) = self.current(transactional_id)?;
        let t = m.add_offsets(producer_id, epoch, group, now)?;
        self.apply(&log, transactional_id, t).await.map(|_| ())
    }

    /// EndTxn: the Prepare state durable; the markers to write, with the round claimed (`None`:
    /// a retry of a transaction already complete).
    pub async fn end_txn(
        &self,
        transactional_id: &str,
        producer_id: i64,
        epoch: i16,
        commit: bool,
        now: i64,
    ) -> Result<Option<(Markers, Completing<'_>)>, ResponseError> {
        let (log, m, claim) = self.current(transactional_id)?;
        let t = m.end_txn(producer_id, epoch, commit, now)?;
        Ok(self
            .apply(&log, transactional_id, t)
            .await?
            .map(|markers| (markers, claim)))
    }

    /// The state of an id this core coordinates, claimed for one change;
    /// `INVALID_PRODUCER_ID_MAPPING` if it has none.
    fn current(
        &self,
        transactional_id: &str,
    ) -> Result<(Rc<TxnLog>, TxnMetadata, Completing<'_>), ResponseError> {
        let log = self.check(transactional_id)?;
        let claim = self.claim(transactional_id)?;
        let m = log
            .get(transactional_id)
            .ok_or(ResponseError::InvalidProducerIdMapping)?;
        Ok((log, m, claim))
    }

    /// Claims `transactional_id` for one change or one round of markers:
    /// `CONCURRENT_TRANSACTIONS` while another holds it (Kafka's pending state).
    fn claim(&self, transactional_id: &str) -> Result<Completing<'_>, ResponseError> {
        self.completing
            .borrow_mut()
            .insert(transactional_id.to_string())
            .then(|| Completing(self, transactional_id.to_string()))
            .ok_or(ResponseError::ConcurrentTransactions)
    }

    async fn apply(
        &self,
        log: &TxnLog,
        transactional_id: &str,
        t: Transition,
    ) -> Result<Option<Markers>, ResponseError> {
        log.apply(transactional_id, t).await.map_err(|e| {
            if let TxnLogError::Io(why) = &e {
                log::error!("core {}: transaction log write failed: {why}", self.core);
            }
            e.code()
        })
    }

    /// Every marker of the round at `epoch` is written: the transaction becomes complete
    /// (durable), and is counted.
    pub async fn markers_written(
        &self,
        transactional_id: &str,
        epoch: i16,
        now: i64,
    ) -> Result<(), ResponseError> {
        let log = self.log().ok_or(ResponseError::CoordinatorNotAvailable)?;
        let Some(m) = log.get(transactional_id) else {
            return Ok(());
        };
        let commit = m.state == TxnState::PrepareCommit;
        let t = m.markers_written(epoch, now)?;
        self.apply(&log, transactional_id, t).await?;
        let counter = if commit {
            &self.counters.commits
        } else {
            &self.counters.aborts
        };
        counter.set(counter.get() + 1);
        Ok(())
    }

    /// What the ticker must carry out now: transactions in a Prepare state whose markers no
    /// round is writing (after a restart, or a round that failed), and open ones past their
    /// timeout (the abort made durable here, its markers returned); then idle ids forgotten.
    pub async fn due(&self, now: i64) -> Vec<(String, Markers, Completing<'_>)> {
        let Some(log) = self.log() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (id, _) in log.recoveries(now) {
            let Ok(claim) = self.claim(&id) else {
                continue;
            };
            // Earlier ids' writes awaited: decide on the state as it is now.
            let Some(m) = log.get(&id) else {
                continue;
            };
            let Some(t) = m.recover(now) else {
                continue;
            };
            let timed_out = m.state == TxnState::Ongoing;
            match self.apply(&log, &id, t).await {
                Ok(Some(markers)) => {
                    if timed_out {
                        log::info!(
                            "core {}: transaction of {id} timed out: aborting it",
                            self.core
                        );
                        self.counters.timeouts.set(self.counters.timeouts.get() + 1);
                    }
                    out.push((id, markers, claim));
                }
                Ok(None) => {}
                Err(e) => log::warn!(
                    "core {}: cannot end the transaction of {id}: {e:?}",
                    self.core
                ),
            }
        }
        let expiration = self.config.id_expiration.as_millis() as i64;
        for (id, _) in log.expired_ids(now, expiration) {
            let Ok(_claim) = self.claim(&id) else {
                continue;
            };
            let Some(t) = log.get(&id).and_then(|m| m.expire_id(now, expiration)) else {
                continue;
            };
            if let Err(e) = self.apply(&log, &id, t).await {
                log::warn!(
                    "core {}: cannot forget transactional id {id}: {e:?}",
                    self.core
                );
            }
        }
        if log.needs_compaction() {
            if let Err(e) = log.compact().await {
                log::warn!("core {}: compacting the transaction log: {e}", self.core);
            }
        }
        out
    }

    /// Every id's state (Describe/ListTransactions, statistics).
    pub fn all(&self) -> Vec<(String, TxnMetadata)> {
        self.log().map(|l| l.all()).unwrap_or_default()
    }

    pub fn stats(&self) -> TxnStats {
        let all = self.all();
        let c = &self.counters;
        TxnStats {
            ids: all.len() as u64,
            open: all
                .iter()
                .filter(|(_, m)| {
                    matches!(
                        m.state,
                        TxnState::Ongoing | TxnState::PrepareCommit | TxnState::PrepareAbort
                    )
                })
                .count() as u64,
            commits: c.commits.get(),
            aborts: c.aborts.get(),
            timeouts: c.timeouts.get(),
            fenced: c.fenced.get(),
        }
    }

    pub async fn close(&self) {
        let log = self.log.borrow_mut().take();
        if let Some(l) = log {
            l.close().await;
        }
    }
}
