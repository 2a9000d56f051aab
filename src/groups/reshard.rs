//! Changing `--cores` moves groups to other cores. Each core's offsets live in
//! `DATA/__groups/core-<i>/`, and `DATA/__groups/cores` records the count they were written with;
//! when it differs at start-up, [`reshard`] rewrites every stored offset into the store of its new
//! coordinator before any core starts, so committed offsets survive the change. Where a crashed
//! reshard left a group in several stores, the copy of its coordinator under the old count wins
//! (the others are stale copies); and every core drops, at start-up, the offsets its store holds
//! for groups it does not coordinate, also when the count did not change, so a stale copy never
//! outlives the run that could have been misled by it.
//!
//! Pending transactional offsets move with their group the same way (the old coordinator's copy
//! wins), so a transaction that ends after the restart finds them at the group's new coordinator.
//! So do the consumer-protocol groups a clean stop saved (`core-<i>/consumer-groups.json`).

use super::offsets::{self, Committed, OffsetStore, PendingOffset, TopicPartition};
use super::{coordinator_core, store_dir};
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::rc::Rc;

/// Moves committed offsets to their coordinators' stores when the core count changed since they
/// were written (see the module docs). Runs before the cores start, on an executor of its own.
pub fn reshard(data_dir: &Path, cores: usize) -> std::io::Result<()> {
    let root = data_dir.join("__groups");
    move_saved_groups(&root, cores)?;
    let data_dir = data_dir.to_path_buf();
    shards::internal_log::reshard(
        &root,
        cores,
        "shoal-reshard",
        "committed offsets",
        move |on_disk, old| async move { reshard_on_executor(&data_dir, on_disk, old, cores).await },
    )
}

/// Moves the consumer-protocol groups a clean stop saved (`core-<i>/consumer-groups.json`) into
/// the files of their coordinators under `cores`, when any is in another's (the core count
/// changed). Blocking; before the cores start.
fn move_saved_groups(root: &Path, cores: usize) -> std::io::Result<()> {
    use super::consumer::SavedGroup;
    let Ok(entries) = std::fs::read_dir(root) else {
        return Ok(());
    };
    let mut files = Vec::new();
    for entry in entries {
        let path = entry?.path().join(super::consumer::SAVED_FILE);
        if let Ok(text) = std::fs::read_to_string(&path) {
            files.push((path, text));
        }
    }
    let mut by_core: HashMap<usize, Vec<SavedGroup>> = HashMap::new();
    let mut misplaced = false;
    for (path, text) in &files {
        let Ok(groups) = serde_json::from_str::<Vec<SavedGroup>>(text) else {
            log::warn!("ignoring {}: it does not read back", path.display());
            continue;
        };
        for g in groups {
            let core = coordinator_core(g.id(), cores);
            misplaced |= path.parent() != Some(store_dir_of(root, core).as_path());
            by_core.entry(core).or_default().push(g);
        }
    }
    if !misplaced {
        return Ok(());
    }
    for (path, _) in &files {
        std::fs::remove_file(path)?;
    }
    for (core, groups) in by_core {
        let dir = store_dir_of(root, core);
        std::fs::create_dir_all(&dir)?;
        let text = serde_json::to_vec(&groups).map_err(std::io::Error::other)?;
        shards::files::write_atomically(&dir.join(super::consumer::SAVED_FILE), &text)?;
    }
    log::info!(
        "moved the saved consumer-protocol groups to their coordinators under {cores} cores"
    );
    Ok(())
}

/// `root/core-<c>`.
fn store_dir_of(root: &Path, core: usize) -> std::path::PathBuf {
    root.join(format!("core-{core}"))
}

/// One store's copy of a group's offsets: (store's core, offsets).
type StoreCopy = (usize, Vec<(TopicPartition, Committed)>);

/// The offsets of a group to keep when several stores hold a copy (a crashed reshard leaves
/// copies behind): the copy of the group's coordinator under the old core count if it has one (the
/// others may be stale), else per partition the most recent commit.
pub(super) fn pick_copy(
    group: &str,
    old: usize,
    mut copies: Vec<StoreCopy>,
) -> Vec<(TopicPartition, Committed)> {
    let coordinator = coordinator_core(group, old);
    if let Some(i) = copies.iter().position(|(c, _)| *c == coordinator) {
        return copies.swap_remove(i).1;
    }
    let mut best: std::collections::BTreeMap<TopicPartition, Committed> = Default::default();
    for (_, offsets) in copies {
        for (tp, c) in offsets {
            match best.get(&tp) {
                Some(b) if b.commit_timestamp >= c.commit_timestamp => {}
                _ => {
                    best.insert(tp, c);
                }
            }
        }
    }
    best.into_iter().collect()
}

/// One store's copy of a group's pending offsets: (store's core, (producer id, partition, offset)).
type PendingCopy = (usize, Vec<(i64, TopicPartition, PendingOffset)>);

/// The pending offsets of a group to keep, as [`pick_copy`] chooses committed ones: the old
/// coordinator's copy if there is one, else per producer and partition the newest epoch (then
/// the latest write).
pub(super) fn pick_pending(
    group: &str,
    old: usize,
    mut copies: Vec<PendingCopy>,
) -> Vec<(i64, TopicPartition, PendingOffset)> {
    let coordinator = coordinator_core(group, old);
    if let Some(i) = copies.iter().position(|(c, _)| *c == coordinator) {
        return copies.swap_remove(i).1;
    }
    let newer = |a: &PendingOffset, b: &PendingOffset| {
        (a.producer_epoch, a.value.commit_timestamp) > (b.producer_epoch, b.value.commit_timestamp)
    };
    let mut best: std::collections::BTreeMap<(i64, TopicPartition), PendingOffset> =
        Default::default();
    for (_, pending) in copies {
        for (id, tp, p) in pending {
            match best.get(&(id, tp.clone())) {
                Some(b) if !newer(&p, b) => {}
                _ => {
                    best.insert((id, tp), p);
                }
            }
        }
    }
    best.into_iter().map(|((id, tp), p)| (id, tp, p)).collect()
}

/// The store of core `c`, opened on first use.
async fn target<'a>(
    targets: &'a mut HashMap<usize, OffsetStore>,
    data_dir: &Path,
    cache: &Rc<shards::TailCache>,
    c: usize,
) -> std::io::Result<&'a OffsetStore> {
    if let std::collections::hash_map::Entry::Vacant(e) = targets.entry(c) {
        let s = OffsetStore::open(&store_dir(data_dir, c), cache.clone(), u64::MAX)
            .await
            .map_err(std::io::Error::other)?;
        e.insert(s);
    }
    Ok(&targets[&c])
}

/// Writes each group's chosen pending offsets to its new coordinator's store, replacing what
/// that store held for the group.
async fn move_pending(
    data_dir: &Path,
    cache: &Rc<shards::TailCache>,
    targets: &mut HashMap<usize, OffsetStore>,
    copies: HashMap<String, Vec<PendingCopy>>,
    old: usize,
    cores: usize,
) -> std::io::Result<()> {
    for (g, group_copies) in copies {
        let chosen = pick_pending(&g, old, group_copies);
        let s = target(targets, data_dir, cache, coordinator_core(&g, cores)).await?;
        let had = s.group_pending(&g);
        let keep: HashSet<(i64, TopicPartition)> =
            chosen.iter().map(|(id, tp, _)| (*id, tp.clone())).collect();
        let extra = had
            .iter()
            .filter(|(id, tp, _)| !keep.contains(&(*id, tp.clone())))
            .map(|(id, tp, _)| (*id, tp.clone(), None));
        let changes: offsets::PendingChanges = chosen
            .into_iter()
            .filter(|entry| !had.contains(entry))
            .map(|(id, tp, p)| (id, tp, Some(p)))
            .chain(extra)
            .collect();
        s.write_pending(&g, changes)
            .await
            .map_err(std::io::Error::other)?;
    }
    Ok(())
}

async fn reshard_on_executor(
    data_dir: &Path,
    old_cores: Vec<usize>,
    old: usize,
    cores: usize,
) -> std::io::Result<()> {
    let cache = Rc::new(shards::TailCache::new(4 << 20, 1 << 20));
    let err = std::io::Error::other;
    let mut copies: HashMap<String, Vec<StoreCopy>> = HashMap::new();
    let mut pending: HashMap<String, Vec<PendingCopy>> = HashMap::new();
    let mut stores = Vec::new();
    let mut old_cores = old_cores;
    old_cores.sort_unstable();
    for &c in &old_cores {
        let s = OffsetStore::open(&store_dir(data_dir, c), cache.clone(), u64::MAX)
            .await
            .map_err(err)?;
        for g in s.groups() {
            let offsets = s.group_offsets(&g);
            pending
                .entry(g.clone())
                .or_default()
                .push((c, s.group_pending(&g)));
            copies.entry(g).or_default().push((c, offsets));
        }
        stores.push((c, s));
    }
    // Every group, also one with only pending offsets, so that a stale copy's committed offsets
    // at its new coordinator are dropped.
    let mut by_group: HashMap<(usize, String), offsets::Changes> = HashMap::new();
    for (g, group_copies) in copies {
        let chosen = pick_copy(&g, old, group_copies);
        by_group.insert(
            (coordinator_core(&g, cores), g),
            chosen.into_iter().map(|(tp, c)| (tp, Some(c))).collect(),
        );
    }
    // Write each group's offsets to its new core's store first (a crash here leaves duplicates,
    // which are harmless: the same values), then drop them from stores that no longer own them.
    let mut targets: HashMap<usize, OffsetStore> = HashMap::new();
    for (c, s) in stores {
        targets.insert(c, s);
    }
    for ((c, g), changes) in by_group {
        let s = target(&mut targets, data_dir, &cache, c).await?;
        let keep: HashSet<TopicPartition> = changes.iter().map(|(tp, _)| tp.clone()).collect();
        // Partitions the target's own (stale) copy has and the chosen copy has not go.
        let extra = s
            .group_offsets(&g)
            .into_iter()
            .filter(|(tp, _)| !keep.contains(tp))
            .map(|(tp, _)| (tp, None));
        let moved: Vec<_> = changes
            .into_iter()
            .filter(|((t, p), v)| s.get(&g, t, *p).as_ref() != v.as_ref())
            .chain(extra)
            .collect();
        s.write(&g, moved).await.map_err(err)?;
    }
    move_pending(data_dir, &cache, &mut targets, pending, old, cores).await?;
    // Every group now has a complete copy at its new coordinator: record the new count before
    // removing the old copies, so that a crash from here on, followed by a start with either
    // count, takes those complete copies rather than whatever the deletes left.
    shards::internal_log::record_core_count(&data_dir.join("__groups"), cores)?;
    for (&c, s) in &targets {
        for g in s.groups() {
            if coordinator_core(&g, cores) != c {
                s.delete_group(&g).await.map_err(err)?;
            }
        }
        s.compact().await.map_err(err)?;
    }
    for (c, s) in targets {
        s.close().await;
        if c >= cores {
            let dir = store_dir(data_dir, c);
            std::fs::remove_dir_all(&dir)?;
        }
    }
    Ok(())
}
