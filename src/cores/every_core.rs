//! Asking every core at once, from one of them (core 0 for the admin thread): their statistics
//! gathered, a live setting applied everywhere.

use super::mesh::{CoreMsg, Setting, CHANGE_TIMEOUT, QUESTION_TIMEOUT};
use super::state::Core;
use crate::stats::CoreSnapshot;
use std::rc::Rc;
use std::time::Instant;

/// Every core's statistics, gathered on core 0 for the admin thread.
pub async fn gather_stats(core: &Rc<Core>, partitions: bool) -> Vec<CoreSnapshot> {
    let mut asked = Vec::new();
    for peer in (0..core.cores()).filter(|&p| p != core.id()) {
        asked.extend(
            core.mesh()
                .ask(peer, |id| CoreMsg::Stats {
                    from: core.id(),
                    id,
                    partitions,
                })
                .await,
        );
    }
    let mut out = vec![core.snapshot(partitions)];
    let deadline = Instant::now() + QUESTION_TIMEOUT;
    for a in asked {
        if let Some(CoreMsg::StatsReply { snapshot, .. }) = core.mesh().answer(a, deadline).await {
            out.push(*snapshot);
        }
    }
    out
}

/// Applies a live setting on every core; returns once all have.
pub async fn set_everywhere(core: &Rc<Core>, setting: Setting) {
    on_every_core(core, |from, id| CoreMsg::Set { from, id, setting }, async {
        core.apply_setting(setting)
    })
    .await
}

/// Sends `msg` to every other core, runs `local` here, and returns once every core has answered.
pub async fn on_every_core(
    core: &Rc<Core>,
    msg: impl Fn(usize, u64) -> CoreMsg,
    local: impl std::future::Future<Output = ()>,
) {
    let mut asked = Vec::new();
    for peer in (0..core.cores()).filter(|&p| p != core.id()) {
        asked.extend(core.mesh().ask(peer, |id| msg(core.id(), id)).await);
    }
    local.await;
    let deadline = Instant::now() + CHANGE_TIMEOUT;
    for a in asked {
        core.mesh().answer(a, deadline).await;
    }
}
