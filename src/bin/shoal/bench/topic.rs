//! The topic of each run: a fresh one per run unless `--topic` names one; the check that the
//! consumers will read nothing but the run's own records; its deletion after the run unless
//! `--keep-topic`.
//!
//! A named topic that already holds records is refused when the consumers start at the earliest
//! offset (`--start earliest`, `--backlog`): they would read the earlier records too, and the
//! run's figures and its correctness check would count data the run did not produce. Starting at
//! the latest offset, the consumers read only what the run produces, so such a topic is used.

use super::args::FanoutArgs;
use super::client::{self, Cluster};
use super::workload::Workload;
use std::io;

/// The topic of the `index`-th run (from 0) of the series `series`: without `--topic`,
/// `shoal-bench-<series>-<index + 1>`; with `--topic NAME`, NAME for the first run and NAME-2,
/// NAME-3, ... after it.
pub fn name(args: &FanoutArgs, series: &str, index: usize) -> String {
    match (&args.topic, index) {
        (None, _) => format!("shoal-bench-{series}-{}", index + 1),
        (Some(name), 0) => name.clone(),
        (Some(name), _) => format!("{name}-{}", index + 1),
    }
}

/// A series' identity in its topics' names: the start time (ms since the epoch, hex) and the
/// process, so that two generators at once never share a topic.
pub fn series_id() -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    format!("{ms:x}-{}", std::process::id())
}

/// A run's topic, ready for its producers and consumers.
#[derive(Debug)]
pub struct RunTopic {
    name: String,
    /// The run created it: it is the run's to delete.
    created: bool,
}

impl RunTopic {
    /// Creates `w.topic` on `owner` (the cluster the producers write to) unless it exists. A
    /// fresh name (no `--topic`) that exists already, or a named topic that holds records while
    /// the consumers start at the earliest offset, is refused.
    pub fn prepare(owner: &Cluster, w: &Workload, named: bool) -> io::Result<RunTopic> {
        let created = owner.create_topic(&w.topic, w.partitions)?;
        let topic = RunTopic {
            name: w.topic.clone(),
            created,
        };
        if created {
            return Ok(topic);
        }
        if !named {
            return Err(io::Error::other(format!(
                "topic {} exists already, though its name is this run's own",
                w.topic
            )));
        }
        if w.earliest || w.backlog_bytes > 0 {
            let leaders = owner.await_topic(&w.topic, w.partitions, true)?;
            let first = owner.offsets(&w.topic, &leaders, client::EARLIEST)?;
            let end = owner.offsets(&w.topic, &leaders, client::LATEST)?;
            let held: i64 = end.iter().zip(&first).map(|(e, f)| (e - f).max(0)).sum();
            if held > 0 {
                return Err(io::Error::other(refusal(&w.topic, held)));
            }
        }
        Ok(topic)
    }

    /// After the run: deletes the topic if the run created it, unless `keep`. Returns whether it
    /// was deleted, and the report's line that says what became of it.
    pub fn finish(self, owner: &Cluster, keep: bool) -> (bool, String) {
        let kept_because = if !self.created {
            Some("it existed before the run".to_string())
        } else if keep {
            Some("--keep-topic".to_string())
        } else {
            owner
                .delete_topic(&self.name)
                .err()
                .map(|e| format!("it could not be deleted: {e}"))
        };
        match kept_because {
            None => (
                true,
                format!(
                    "{:<16} {} deleted after the run (--keep-topic keeps it)",
                    "topic", self.name
                ),
            ),
            Some(why) => (false, format!("{:<16} {} kept: {why}", "topic", self.name)),
        }
    }
}

/// Why a named topic holding `held` records is not used.
fn refusal(topic: &str, held: i64) -> String {
    format!(
        "topic {topic} already holds {} records and the consumers start at the earliest offset \
         (--start earliest or --backlog): they would read those too, and the run would measure \
         and check more than it produced. Leave out --topic (each run then gets a fresh topic, \
         deleted after it), name a topic that does not exist yet, or start at the latest offset",
        super::stats::thousands(held as u64)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::bench::args::parse_fanout as args;

    #[test]
    fn each_run_of_a_series_has_a_topic_of_its_own() {
        let fresh = args(&[]);
        assert_eq!(name(&fresh, "s1", 0), "shoal-bench-s1-1");
        assert_eq!(name(&fresh, "s1", 2), "shoal-bench-s1-3");
        let named = args(&["--topic", "t"]);
        assert_eq!(name(&named, "s1", 0), "t");
        assert_eq!(name(&named, "s1", 1), "t-2");
        assert_ne!(series_id(), "");
    }
}
