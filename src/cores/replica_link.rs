//! Read replicas over the mesh: a core's task that sends its replica messages (the owner's
//! hand-overs, a replica's load reports) to the other cores in order, and the tick that starts and
//! stops replicas by policy. The replicas themselves are [`crate::replicas`]'.

use super::mesh::CoreMsg;
use super::state::Core;
use std::rc::Rc;

/// Puts this core's read replica messages on the mesh, in order, for as long as the core runs.
pub async fn send_replica_messages(core: Rc<Core>) {
    let Some(outbox) = core.replicas.outbox() else {
        return;
    };
    while let Some((to, msg)) = outbox.recv().await {
        core.mesh().send(to, CoreMsg::Replica(msg)).await;
        core.replicas.sent(to);
    }
}

/// Every [`crate::replicas::TICK`] until shutdown: read replicas started and stopped by policy,
/// and held replicas' load reported to their owners.
pub async fn tick_replicas(core: Rc<Core>) {
    while core.pause(crate::replicas::TICK).await {
        core.tick_replicas();
    }
}
