//! Changing `--cores` moves transactional ids to other coordinator cores. Each core's states live
//! in `DATA/__transactions/core-<i>/`, and `DATA/__transactions/cores` records the count they were
//! written with; when it differs at start-up, [`reshard`] writes every id's state into the log of
//! its new coordinator before any core starts, so open and decided transactions survive the change
//! (a Prepare state's markers are then written by the new coordinator's ticker, an open
//! transaction's partitions told of it again). Where a crashed reshard left an id in several logs,
//! the copy of its coordinator under the old count wins, else the most recently updated; every core
//! also drops, when it loads its log, the ids it does not coordinate (stale copies).

use super::log::TxnLog;
use super::state::{TxnMetadata, TxnState};
use super::{coordinator_core, log_dir};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::rc::Rc;

/// Moves transactional ids to their coordinators' logs when the core count changed since they were
/// written (see the module docs). Runs before the cores start, on an executor of its own.
pub fn reshard(data_dir: &Path, cores: usize) -> std::io::Result<()> {
    let root = data_dir.join("__transactions");
    let data_dir = data_dir.to_path_buf();
    shards::internal_log::reshard(
        &root,
        cores,
        "shoal-txn-reshard",
        "transactional ids",
        move |on_disk, old| async move { move_ids(&data_dir, on_disk, old, cores).await },
    )
}

/// The copy of an id's state to keep: its coordinator's under the old count, else the most
/// recently updated. `copies` is not empty.
fn pick(id: &str, old: usize, copies: Vec<(usize, TxnMetadata)>) -> TxnMetadata {
    let coordinator = coordinator_core(id, old);
    let mut copies = copies;
    if let Some(i) = copies.iter().position(|(c, _)| *c == coordinator) {
        return copies.swap_remove(i).1;
    }
    copies
        .into_iter()
        .max_by_key(|(_, m)| m.last_update_ms)
        .expect("at least one copy")
        .1
}

async fn move_ids(
    data_dir: &Path,
    mut old_cores: Vec<usize>,
    old: usize,
    cores: usize,
) -> std::io::Result<()> {
    let cache = Rc::new(shards::TailCache::new(4 << 20, 1 << 20));
    let err = std::io::Error::other;
    old_cores.sort_unstable();
    let mut logs: BTreeMap<usize, TxnLog> = BTreeMap::new();
    let mut copies: HashMap<String, Vec<(usize, TxnMetadata)>> = HashMap::new();
    for &c in &old_cores {
        let l = TxnLog::open(&log_dir(data_dir, c), cache.clone(), u64::MAX)
            .await
            .map_err(err)?;
        for (id, m) in l.all() {
            copies.entry(id).or_default().push((c, m));
        }
        logs.insert(c, l);
    }
    // Each id's state into its new coordinator's log first (a crash here leaves duplicates, which
    // the next start resolves as above).
    for (id, id_copies) in copies {
        let m = pick(&id, old, id_copies);
        let c = coordinator_core(&id, cores);
        if let std::collections::btree_map::Entry::Vacant(e) = logs.entry(c) {
            let l = TxnLog::open(&log_dir(data_dir, c), cache.clone(), u64::MAX)
                .await
                .map_err(err)?;
            e.insert(l);
        }
        logs[&c]
            .write(&id, m)
            .await
            .map_err(|e| err(format!("{e:?}")))?;
    }
    // Every id now has its state at its new coordinator: record the count before the old copies
    // go, so a crash from here on keeps those complete copies.
    shards::internal_log::record_core_count(&data_dir.join("__transactions"), cores)?;
    for (&c, l) in &logs {
        drop_foreign(l, c, cores).await.map_err(err)?;
        l.compact().await.map_err(err)?;
    }
    for (c, l) in logs {
        l.close().await;
        if c >= cores {
            std::fs::remove_dir_all(log_dir(data_dir, c))?;
        }
    }
    Ok(())
}

/// Tombstones the ids of `log` (core `core`'s) that another core coordinates among `cores`; how
/// many.
pub async fn drop_foreign(log: &TxnLog, core: usize, cores: usize) -> Result<usize, String> {
    let mut dropped = 0;
    for (id, m) in log.all() {
        if coordinator_core(&id, cores) != core {
            let dead = TxnMetadata {
                state: TxnState::Dead,
                ..m
            };
            log.write(&id, dead).await.map_err(|e| format!("{e:?}"))?;
            dropped += 1;
        }
    }
    Ok(dropped)
}
