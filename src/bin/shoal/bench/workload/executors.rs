//! The client executors: glommio threads that run the consumers and producers assigned to them,
//! flush their histograms into the shared counters, and wait for set-up to end.

use super::consumer::consumer;
use super::plan::{ClientCfg, ConsumerPlan, ProducerPlan};
use super::producer::producer;
use super::stream_consumer::stream_consumer;
use crate::bench::client::PartitionLeader;
use crate::bench::stats::{Hists, Shared};
use glommio::{LocalExecutorBuilder, Placement};
use std::cell::RefCell;
use std::io;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Clone, Default)]
pub(super) struct ExecPlan {
    pub(super) consumers: Vec<ConsumerPlan>,
    pub(super) producers: Vec<ProducerPlan>,
}

/// Starts one glommio executor per plan; each runs its tasks to the end.
pub(super) fn spawn_clients(
    cfg: ClientCfg,
    shared: &Arc<Shared>,
    plans: Vec<ExecPlan>,
    cpus: &[Option<usize>],
) -> io::Result<Vec<glommio::ExecutorJoinHandle<()>>> {
    let cfg = Arc::new(cfg);
    let mut handles = Vec::new();
    for (i, plan) in plans.into_iter().enumerate() {
        let placement = match cpus.get(i).copied().flatten() {
            Some(cpu) => Placement::Fixed(cpu),
            None => Placement::Unbound,
        };
        let (cfg, shared) = (cfg.clone(), shared.clone());
        let h = LocalExecutorBuilder::new(placement)
            .name(&format!("bench-client-{i}"))
            .spawn(move || async move { executor_main(i, cfg, shared, plan).await })
            .map_err(|e| io::Error::other(format!("cannot start client executor {i}: {e}")))?;
        handles.push(h);
    }
    Ok(handles)
}

pub(super) async fn executor_main(
    idx: usize,
    cfg: Arc<ClientCfg>,
    shared: Arc<Shared>,
    plan: ExecPlan,
) {
    let local = Rc::new(RefCell::new(Hists::default()));
    let mut tasks = Vec::new();
    for c in plan.consumers {
        let (cfg, shared, local) = (cfg.clone(), shared.clone(), local.clone());
        tasks.push(if cfg.stream.is_some() {
            glommio::spawn_local(stream_consumer(cfg, shared, c, local))
        } else {
            glommio::spawn_local(consumer(cfg, shared, c, local))
        });
    }
    for p in plan.producers {
        tasks.push(glommio::spawn_local(producer(
            cfg.clone(),
            shared.clone(),
            p,
            local.clone(),
        )));
    }
    let flusher = {
        let local = local.clone();
        let shared = shared.clone();
        glommio::spawn_local(async move {
            loop {
                glommio::timer::sleep(Duration::from_millis(200)).await;
                flush(&shared, idx, &local);
            }
        })
    };
    for t in tasks {
        t.await;
    }
    drop(flusher);
    flush(&shared, idx, &local);
}

/// Moves executor `idx`'s histograms into its shared copy.
pub(super) fn flush(shared: &Shared, idx: usize, local: &RefCell<Hists>) {
    let mut to = shared.hists[idx].lock().unwrap_or_else(|e| e.into_inner());
    to.drain_from(&mut local.borrow_mut());
}

/// Spreads producers and consumers over the client executors, round robin. Producer i writes
/// partitions i, i + producers, ... (or partition i mod partitions when there are more producers).
pub(super) fn assign(
    threads: usize,
    leaders: &[PartitionLeader],
    producers: usize,
    consumers: Vec<ConsumerPlan>,
) -> Vec<ExecPlan> {
    let mut plans = vec![ExecPlan::default(); threads];
    for (i, c) in consumers.into_iter().enumerate() {
        plans[i % threads].consumers.push(c);
    }
    for id in 0..producers {
        let partitions: Vec<PartitionLeader> = if producers >= leaders.len() {
            vec![leaders[id % leaders.len()]]
        } else {
            leaders
                .iter()
                .skip(id)
                .step_by(producers)
                .copied()
                .collect()
        };
        // Producers start from executor 1, away from executor 0's first consumers.
        plans[(id + 1) % threads]
            .producers
            .push(ProducerPlan { id, partitions });
    }
    plans
}
