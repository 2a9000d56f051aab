//! A partition on its owning core: the log plus the idempotent-producer state that must stay in step
//! with it. The producer state is saved at clean shutdown and rebuilt from the log's batch headers
//! after a crash, so duplicates are still recognised after a restart.
//!
//! Expiry and restarts, as in Kafka: the snapshot holds only the producers kept at shutdown and the
//! offset it covers, and only batches after that offset are replayed, so a producer dropped (expired
//! or over the limit) stays dropped across a clean restart. Without a snapshot (a crash) the whole log
//! is replayed: a producer is then re-learned from its batches, with their timestamps as its last
//! activity, and expiry and the limit apply again at once, so only producers whose batches are recent
//! enough come back, which is what Kafka's replay of the log after its last snapshot does too.

use shards::files::write_atomically;
use shards::producers::{ProducerConfig, ProducerStates};
use shards::{Log, LogConfig, TailCache};
use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::rc::Rc;

const SNAPSHOT: &str = "producers.snapshot";

#[derive(Debug)]
pub struct Partition {
    pub topic: String,
    pub index: i32,
    pub topic_id: [u8; 16],
    pub log: Log,
    pub producers: RefCell<ProducerStates>,
}

pub fn partition_dir(data_dir: &Path, topic: &str, index: i32) -> PathBuf {
    data_dir.join("topics").join(topic).join(index.to_string())
}

impl Partition {
    pub async fn open(
        data_dir: &Path,
        topic: &str,
        index: i32,
        topic_id: [u8; 16],
        config: LogConfig,
        producer_config: ProducerConfig,
        cache: Rc<TailCache>,
    ) -> shards::Result<Partition> {
        let dir = partition_dir(data_dir, topic, index);
        let log = Log::open(&dir, config, cache).await?;
        let producers = load_producer_state(&log, producer_config).await?;
        Ok(Partition {
            topic: topic.to_string(),
            index,
            topic_id,
            log,
            producers: RefCell::new(producers),
        })
    }

    /// Saves the producer state and closes the log cleanly (requests still holding the partition get
    /// `Closed` from then on).
    pub async fn close(&self) -> shards::Result<()> {
        let snapshot = self.producers.borrow().encode(self.log.high_watermark());
        let path = self.log.dir().join(SNAPSHOT);
        let written = glommio::executor()
            .spawn_blocking(move || write_atomically(&path, &snapshot))
            .await;
        if let Err(e) = written {
            log::warn!(
                "could not save producer state of {}-{}: {e}",
                self.topic,
                self.index
            );
        }
        self.log.clone().close().await
    }

    pub async fn delete(&self) -> shards::Result<()> {
        self.log.clone().delete().await
    }

    /// Idempotent producers whose state is kept, after forgetting the expired ones if a scan is due.
    pub fn producer_ids(&self) -> usize {
        let mut states = self.producers.borrow_mut();
        states.expire_if_due(shards::now_ms());
        states.len()
    }
}

/// The snapshot if it matches the log, then the batches after it replayed from the log; expiry and
/// the limit apply to the result.
async fn load_producer_state(log: &Log, config: ProducerConfig) -> shards::Result<ProducerStates> {
    let path = log.dir().join(SNAPSHOT);
    let snapshot = glommio::executor()
        .spawn_blocking(move || {
            let b = std::fs::read(&path).ok();
            let _ = std::fs::remove_file(&path); // stale as soon as the log moves on
            b
        })
        .await
        .and_then(|b| ProducerStates::decode(&b));
    let hw = log.high_watermark();
    let (mut states, mut at) = match snapshot {
        Some((s, end)) if end <= hw && end >= log.log_start_offset() => (s, end),
        _ => (ProducerStates::default(), log.log_start_offset()),
    };
    states.set_config(config);
    let now = shards::now_ms();
    states.expire(now);
    while at < hw {
        let read = log.read(at, 4 << 20, true).await?;
        read.records
            .batch_headers()
            .for_each(|h| states.replay(&h, now));
        match read.records.next_offset() {
            Some(next) => at = next,
            None => break,
        }
    }
    states.expire(now);
    Ok(states)
}
