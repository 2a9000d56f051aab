//! A core's receive loop: one task per peer core takes its messages off the mesh and acts on them
//! (read replicas' hand-overs at once and in order; group lag's questions as background work;
//! transactions' questions once the core has opened its partitions), and completes this core's
//! own questions with their answers.

use super::mesh::{CoreMsg, TopicChange, TopicOutcome};
use super::state::Core;
use glommio::channels::channel_mesh::Receivers;
use std::future::Future;
use std::rc::Rc;

/// Starts one task per peer that receives its messages. Topic changes sent to core 0 are decided
/// by `decide` (the control plane's, above this room).
pub fn spawn_receivers<D, F>(core: &Rc<Core>, mut receivers: Receivers<CoreMsg>, decide: D)
where
    D: Fn(Rc<Core>, TopicChange) -> F + Clone + 'static,
    F: Future<Output = Vec<TopicOutcome>> + 'static,
{
    for (peer, rx) in receivers.streams() {
        let core = core.clone();
        let decide = decide.clone();
        let (queue, core_id) = (core.queues().other, core.id());
        // In a latency-sensitive queue: read replicas' hand-overs must not wait behind a core's
        // fetch work.
        let receive = glommio::spawn_local_into(
            async move {
                while let Some(msg) = rx.recv().await {
                    // Read replicas' hand-overs are applied in the order they came, at once.
                    if let CoreMsg::Replica(msg) = msg {
                        core.receive_replica(msg);
                        continue;
                    }
                    // Group lag's questions (log reads for timestamps) are background work: the
                    // executor's default queue, where the lag rounds run, not this one.
                    let background = matches!(msg, CoreMsg::PartitionEnds { .. });
                    let (core, decide) = (core.clone(), decide.clone());
                    let task = async move { handle(&core, msg, decide).await };
                    if background {
                        let queue = glommio::TaskQueueHandle::default();
                        match glommio::spawn_local_into(task, queue) {
                            Ok(t) => {
                                t.detach();
                            }
                            Err(e) => log::warn!("core {core_id}: group lag question dropped: {e}"),
                        }
                    } else {
                        glommio::spawn_local(task).detach();
                    }
                }
            },
            queue,
        );
        match receive {
            Ok(task) => {
                task.detach();
            }
            Err(e) => log::error!(
                "core {}: messages from core {peer} cannot be received: {e}",
                core_id
            ),
        }
    }
}

/// Acts on one message from another core and sends its answer, if it has one; answers complete
/// this core's own questions.
async fn handle<D, F>(core: &Rc<Core>, msg: CoreMsg, decide: D)
where
    D: Fn(Rc<Core>, TopicChange) -> F,
    F: Future<Output = Vec<TopicOutcome>>,
{
    match msg {
        CoreMsg::Change { from, id, change } => {
            let outcomes = decide(core.clone(), change).await;
            core.mesh()
                .send(from, CoreMsg::Outcomes { id, outcomes })
                .await;
        }
        CoreMsg::Apply { from, id, table } => {
            core.apply_table(table).await;
            core.mesh().send(from, CoreMsg::Applied { id }).await;
        }
        CoreMsg::Set { from, id, setting } => {
            core.apply_setting(setting);
            core.mesh().send(from, CoreMsg::Applied { id }).await;
        }
        CoreMsg::Stats {
            from,
            id,
            partitions,
        } => {
            let snapshot = Box::new(core.snapshot(partitions));
            core.mesh()
                .send(from, CoreMsg::StatsReply { id, snapshot })
                .await;
        }
        CoreMsg::Replica(msg) => core.receive_replica(msg),
        CoreMsg::Stream(stream) => core.take_handed_stream(stream),
        CoreMsg::TxnsRegistered { from } => core.transactions_registered_by(from),
        CoreMsg::PartitionEnds { from, id, asked } => {
            // The owner answers for its partitions once it holds them.
            if !core.until_opened().await {
                return;
            }
            let ends = super::group_lag::partition_ends(core, asked).await;
            core.mesh()
                .send(from, CoreMsg::PartitionEndsReply { id, ends })
                .await;
        }
        CoreMsg::Txn {
            from,
            id,
            revision,
            ask,
        } => {
            // A partition not opened yet is not a deleted one, nor a group not loaded yet one
            // without offsets: the answer waits for the start to finish.
            if !core.until_opened().await {
                return;
            }
            let results = super::transaction_markers::on_this_core(core, ask, revision).await;
            core.mesh()
                .send(from, CoreMsg::TxnReply { id, results })
                .await;
        }
        reply @ (CoreMsg::Outcomes { id, .. }
        | CoreMsg::Applied { id }
        | CoreMsg::StatsReply { id, .. }
        | CoreMsg::PartitionEndsReply { id, .. }
        | CoreMsg::TxnReply { id, .. }) => core.mesh().complete(id, reply),
    }
}
