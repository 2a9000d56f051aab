//! The upstream's topic list as the edge mirrors it: core 0's control plane asks [`TopicMirror`]
//! every `--edge-metadata-refresh-ms` and makes the topic table exactly what it answers.

use super::EdgeCore;
use std::collections::BTreeMap;

/// Upstream answers in a row that must leave a topic out before the edge deletes it.
const MIRROR_MISSES: u32 = 3;

/// A topic's partition count and id.
pub type TopicShape = (i32, [u8; 16]);

/// What the mirror remembers between refreshes.
#[derive(Debug, Default)]
pub struct TopicMirror {
    /// The last refresh failed (logged once per episode).
    failing: bool,
    /// Refreshes in a row that did not list each topic the table has.
    missing: BTreeMap<String, u32>,
}

impl TopicMirror {
    /// Reads the upstream's topics again and returns what the table should hold, or `None` when
    /// it should stay as `current` (no change, or the upstream did not answer). One answer
    /// without a topic (a broker just restarted, an error for that topic) does not delete it and
    /// its data: only `MIRROR_MISSES` answers in a row do.
    pub async fn next(
        &mut self,
        edge: &EdgeCore,
        current: &BTreeMap<String, TopicShape>,
    ) -> Option<BTreeMap<String, TopicShape>> {
        if let Err(e) = edge.refresh(true).await {
            if !self.failing {
                edge.error("metadata", &e);
                self.failing = true;
            }
            return None;
        }
        if self.failing {
            log::info!("upstream {} answers again", edge.config.upstream_list());
            self.failing = false;
        }
        let mut topics: BTreeMap<String, TopicShape> = edge
            .topics()
            .into_iter()
            .map(|(name, t)| (name, (t.leaders.len() as i32, t.id)))
            .collect();
        self.missing
            .retain(|name, _| !topics.contains_key(name) && current.contains_key(name));
        for (name, meta) in current {
            if !topics.contains_key(name) {
                let misses = self.missing.entry(name.clone()).or_default();
                *misses += 1;
                if *misses < MIRROR_MISSES {
                    topics.insert(name.clone(), *meta);
                }
            }
        }
        (topics != *current).then_some(topics)
    }
}
