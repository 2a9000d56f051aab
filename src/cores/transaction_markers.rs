//! Transactions across cores: what a transaction coordinator core asks of the partitions' owner
//! cores (register a partition in a producer's transaction, write commit or abort markers) and of
//! the groups' coordinator cores (commit or drop transactional offsets), over the mesh or in
//! place; completing a transaction once every marker is written; and the coordinator's ticker
//! (recovery after a restart, transactions past their timeout, idle ids, compaction).

use crate::cores::mesh::{CoreMsg, CHANGE_TIMEOUT};
use crate::cores::Core;
use crate::transactions::state::{Markers, TopicPartition, TxnState};
use crate::transactions::TxnAsk;
use kafka_protocol::error::ResponseError;
use shards::partition::MarkerRefused;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// One result per item asked (partition or group), in order: `None` done.
pub type Results = Vec<Option<ResponseError>>;

/// Carries out `ask` on this core: the partitions must be this core's, the groups coordinated
/// here. `revision` is the asking core's topic table revision (see `held`).
pub async fn on_this_core(core: &Rc<Core>, ask: TxnAsk, revision: u64) -> Results {
    match ask {
        TxnAsk::Register {
            producer_id,
            epoch,
            partitions,
        } => partitions
            .iter()
            .map(|(t, p)| match held(core, t, *p, revision) {
                Ok(part) => {
                    part.add_to_transaction(producer_id, epoch);
                    None
                }
                Err(e) => Some(e),
            })
            .collect(),
        TxnAsk::Markers {
            producer_id,
            epoch,
            commit,
            partitions,
        } => {
            let writes = partitions.iter().map(|(t, p)| {
                let part = held(core, t, *p, revision);
                async move {
                    // A partition deleted since it joined the transaction needs no marker
                    // (UNKNOWN_TOPIC_OR_PARTITION says so); one not held is retried.
                    let part = match part {
                        Ok(part) => part,
                        Err(e) => return Some(e),
                    };
                    match part.write_marker(producer_id, epoch, commit, 0).await {
                        Ok(_) => None,
                        // The producer moved on to a later epoch: this marker is stale.
                        Err(MarkerRefused::Fenced) => None,
                        Err(MarkerRefused::Log(e)) => {
                            log::warn!("transaction marker on {}-{}: {e}", part.topic, part.index);
                            Some(ResponseError::KafkaStorageError)
                        }
                    }
                }
            });
            all(writes).await
        }
        TxnAsk::Offsets {
            producer_id,
            epoch,
            commit,
            groups,
        } => {
            let mut out = Vec::with_capacity(groups.len());
            for g in &groups {
                let ended = core
                    .groups()
                    .end_transaction(g, producer_id, epoch, commit)
                    .await;
                out.push(ended.err());
            }
            out
        }
    }
}

/// The partition a transaction names, as this core holds it, or why not:
/// UNKNOWN_TOPIC_OR_PARTITION only when it was deleted (this core's table lacks it and is at
/// least as new as the asking core's, `revision`), NOT_LEADER_OR_FOLLOWER (retried) when the
/// table gives it to this core but the core does not hold it (it could not be opened), when
/// another core owns it, or when this core has not applied the asker's table yet.
fn held(
    core: &Core,
    topic: &str,
    index: i32,
    revision: u64,
) -> Result<Rc<shards::partition::Partition>, ResponseError> {
    if let Some(part) = core.partition(topic, index) {
        return Ok(part);
    }
    let deleted = core.owner(topic, index).is_none() && core.topics().revision >= revision;
    if deleted {
        Err(ResponseError::UnknownTopicOrPartition)
    } else {
        log::debug!(
            "core {}: {topic}-{index} named by a transaction is not held here (table revision {} against {revision})",
            core.id(),
            core.topics().revision
        );
        Err(ResponseError::NotLeaderOrFollower)
    }
}

/// Polls every future until all are done, in this task (so they may borrow); their outputs in
/// order.
async fn join_all<F: std::future::Future>(futures: Vec<F>) -> Vec<F::Output> {
    use std::task::Poll;
    let mut futures: Vec<std::pin::Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, out) in futures.iter_mut().zip(outputs.iter_mut()) {
            if out.is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => *out = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

/// Runs the futures concurrently (each a task on this core); their outputs in order.
async fn all<T: 'static>(
    futures: impl Iterator<Item = impl std::future::Future<Output = T> + 'static>,
) -> Vec<T> {
    let tasks: Vec<_> = futures.map(glommio::spawn_local).collect();
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(t.await);
    }
    out
}

/// Asks `ask` of core `to` (in place when it is this core); a core that cannot be asked or does
/// not answer in time fails every item.
async fn ask_core(core: &Rc<Core>, to: usize, ask: TxnAsk, items: usize) -> Results {
    let revision = core.topics().revision;
    if to == core.id() {
        return on_this_core(core, ask, revision).await;
    }
    let from = core.id();
    let unanswered = vec![Some(ResponseError::CoordinatorNotAvailable); items];
    let exchange = async {
        let asked = core
            .mesh()
            .ask(to, |id| CoreMsg::Txn {
                from,
                id,
                revision,
                ask,
            })
            .await?;
        core.mesh()
            .answer(asked, Instant::now() + CHANGE_TIMEOUT)
            .await
    };
    // Once this core is stopping, the other may have stopped already and will never answer (the
    // ticker waited a minute for it, and the broker did not stop): the exchange is given up. What
    // it was for is redone at the next start, as after a crash (a transaction's Prepare state is
    // durable).
    match core.until_stopping(exchange).await.flatten() {
        Some(CoreMsg::TxnReply { results, .. }) if results.len() == items => results,
        _ => unanswered,
    }
}

/// The partitions grouped by owner core, with their places in `partitions`; those no core owns
/// are answered `UNKNOWN_TOPIC_OR_PARTITION` in `results`.
fn by_owner(
    core: &Core,
    partitions: &[TopicPartition],
    results: &mut Results,
) -> BTreeMap<usize, Vec<usize>> {
    let mut owners: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (i, (t, p)) in partitions.iter().enumerate() {
        match core.owner(t, *p) {
            Some(owner) => owners.entry(owner).or_default().push(i),
            None => results[i] = Some(ResponseError::UnknownTopicOrPartition),
        }
    }
    owners
}

/// Asks each owner core of `partitions` for its share of `make(partitions)`, all at once; one
/// result per partition.
async fn per_owner(
    core: &Rc<Core>,
    partitions: &[TopicPartition],
    make: impl Fn(Vec<TopicPartition>) -> TxnAsk,
) -> Results {
    let mut results: Results = vec![None; partitions.len()];
    let owners = by_owner(core, partitions, &mut results);
    let asks = owners.into_iter().map(|(owner, places)| {
        let mine: Vec<TopicPartition> = places.iter().map(|&i| partitions[i].clone()).collect();
        let n = mine.len();
        let ask = make(mine);
        let core = core.clone();
        async move { (places, ask_core(&core, owner, ask, n).await) }
    });
    for (places, answers) in all(asks).await {
        for (i, r) in places.into_iter().zip(answers) {
            results[i] = r;
        }
    }
    results
}

/// AddPartitionsToTxn, once durable: each partition's owner accepts the producer's transactional
/// batches at `epoch`. One result per partition.
pub async fn register(
    core: &Rc<Core>,
    producer_id: i64,
    epoch: i16,
    partitions: &[TopicPartition],
) -> Results {
    per_owner(core, partitions, |partitions| TxnAsk::Register {
        producer_id,
        epoch,
        partitions,
    })
    .await
}

/// Writes a transaction's markers on every partition and ends its groups' offsets; whether all
/// of it is done (a partition deleted meanwhile needs nothing).
pub async fn write(core: &Rc<Core>, m: &Markers) -> bool {
    let partitions = per_owner(core, &m.partitions, |partitions| TxnAsk::Markers {
        producer_id: m.producer_id,
        epoch: m.epoch,
        commit: m.commit,
        partitions,
    });
    let groups = async {
        let mut by_core: BTreeMap<usize, Vec<String>> = BTreeMap::new();
        for g in &m.groups {
            let c = crate::groups::coordinator_core(g, core.cores());
            by_core.entry(c).or_default().push(g.clone());
        }
        let asks = by_core.into_iter().map(|(c, groups)| {
            let n = groups.len();
            let ask = TxnAsk::Offsets {
                producer_id: m.producer_id,
                epoch: m.epoch,
                commit: m.commit,
                groups,
            };
            let core = core.clone();
            async move { ask_core(&core, c, ask, n).await }
        });
        all(asks).await.concat()
    };
    let (partitions, groups) = futures_lite::future::zip(partitions, groups).await;
    let failed: Vec<_> = m
        .partitions
        .iter()
        .zip(&partitions)
        .filter_map(|(tp, r)| match r {
            None | Some(ResponseError::UnknownTopicOrPartition) => None,
            Some(e) => Some(format!("{}-{}: {e:?}", tp.0, tp.1)),
        })
        .chain(
            groups
                .iter()
                .filter_map(|r| r.map(|e| format!("group offsets: {e:?}"))),
        )
        .collect();
    if !failed.is_empty() {
        log::warn!(
            "core {}: transaction markers of producer {} not all written (retried): {}",
            core.id(),
            m.producer_id,
            failed.join(", ")
        );
    }
    failed.is_empty()
}

/// Writes the markers of `transactional_id`'s transaction, then makes it complete. The caller
/// holds the id's claim. `Err` leaves it in its Prepare state for the ticker to finish.
pub async fn complete(
    core: &Rc<Core>,
    transactional_id: &str,
    markers: &Markers,
) -> Result<(), ResponseError> {
    if !write(core, markers).await {
        return Err(ResponseError::CoordinatorNotAvailable);
    }
    core.transactions()
        .markers_written(transactional_id, markers.epoch, shards::now_ms())
        .await
}

/// Runs the coordinator's ticker until the core stops: at once, the open transactions'
/// partitions are registered again with their owners (a restart forgot them; each owner answers
/// once it holds its partitions) and every core is told, and the transactions decided before the
/// restart are completed; then every check interval the due work (see `TxnCoordinator::due`) is
/// carried out.
pub async fn run_ticker(core: Rc<Core>) {
    let interval = core
        .transactions()
        .config
        .timeout_check_interval
        .max(Duration::from_millis(10));
    let mut unregistered = register_again(&core, ongoing(&core)).await;
    announce_registered(&core).await;
    let mut rounds = 1;
    loop {
        if !unregistered.is_empty() && rounds < 20 {
            rounds += 1;
            unregistered = register_again(&core, unregistered).await;
        }
        complete_due(&core).await;
        if !core.pause(interval).await {
            return;
        }
    }
}

/// Tells every core (this one too) that this core's open transactions are registered again.
async fn announce_registered(core: &Rc<Core>) {
    core.transactions_registered_by(core.id());
    for to in (0..core.cores()).filter(|&c| c != core.id()) {
        core.mesh()
            .send(to, CoreMsg::TxnsRegistered { from: core.id() })
            .await;
    }
}

/// Completes every due transaction at once: each one's markers are durable appends (an fsync per
/// partition), which a restart with many open transactions would otherwise queue.
async fn complete_due(core: &Rc<Core>) {
    let due = core.transactions().due(shards::now_ms()).await;
    let rounds = due.iter().map(|(id, markers, _claim)| async move {
        if let Err(e) = complete(core, id, markers).await {
            log::warn!(
                "core {}: the transaction of {id} is not complete yet: {e:?}",
                core.id()
            );
        }
    });
    join_all(rounds.collect()).await;
}

/// The open transactions: producer id, epoch and partitions.
fn ongoing(core: &Core) -> Vec<(i64, i16, Vec<TopicPartition>)> {
    core.transactions()
        .all()
        .into_iter()
        .filter(|(_, m)| m.state == TxnState::Ongoing)
        .map(|(_, m)| (m.producer_id, m.epoch, m.partitions.into_iter().collect()))
        .collect()
}

/// Registers the transactions' partitions with their owners; what still failed.
async fn register_again(
    core: &Rc<Core>,
    txns: Vec<(i64, i16, Vec<TopicPartition>)>,
) -> Vec<(i64, i16, Vec<TopicPartition>)> {
    let mut left = Vec::new();
    for (producer_id, epoch, partitions) in txns {
        let results = register(core, producer_id, epoch, &partitions).await;
        let failed: Vec<TopicPartition> = partitions
            .into_iter()
            .zip(results)
            .filter(|(_, r)| r.is_some())
            .map(|(tp, _)| tp)
            .collect();
        if !failed.is_empty() {
            left.push((producer_id, epoch, failed));
        }
    }
    left
}
