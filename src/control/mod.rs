//! The control plane: topic changes (create, grow, configure, delete, ACLs, the edge's mirrored
//! topics), decided by core 0 and applied by every core.
//!
//! Core 0 serializes changes, persists the topic table (`DATA/topics.json`: atomic write, fsync,
//! revision number) and broadcasts it; every core opens or deletes the partitions it owns and
//! acknowledges; the request is answered once all cores have applied it. Cores talk only through
//! messages on the mesh ([`crate::cores::mesh`]), never through shared memory or locks; a core's
//! receive loop hands the changes sent to core 0 to [`decide`].

use crate::cores::every_core::on_every_core;
pub use crate::cores::mesh::{
    ConfigChange, ConfigOp, NewPartitions, NewTopic, Setting, TopicChange, TopicOutcome,
};
use crate::cores::mesh::{CoreMsg, CHANGE_TIMEOUT};
use crate::cores::Core;
use crate::table::configs::{is_list_config, is_topic_config, topic_config_value};
use crate::table::{apply_topic_configs, validate_topic_name, TopicMeta, TopicTable};
use kafka_protocol::error::ResponseError;
use shards::LogConfig;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Instant;

mod table_file;

pub use table_file::load_table;
use table_file::persist_table;

/// Most partitions a topic may have.
pub const MAX_PARTITIONS: i32 = 10_000;

/// Decides a topic change sent to core 0 by another core (what [`crate::cores::receive`] calls).
pub async fn decide(core: Rc<Core>, change: TopicChange) -> Vec<TopicOutcome> {
    change_on_core0(&core, change).await
}

/// Decides a topic change on core 0, one at a time: each kind of change decides on a copy of the
/// table; if anything changed, the table is persisted and applied on every core. One outcome per
/// topic, in request order.
async fn change_on_core0(core: &Rc<Core>, change: TopicChange) -> Vec<TopicOutcome> {
    let Ok(_permit) = core.mesh().changes.acquire_permit(1).await else {
        return Vec::new();
    };
    if let Some(refused) = refused_at_the_edge(core, &change) {
        return refused;
    }
    let mut table = (*core.topics()).clone();
    let mut seen = Names::default();
    let (mut outcomes, changed) = match &change {
        TopicChange::Create {
            topics,
            validate_only,
        } => decide_create(core, &mut table, &mut seen, topics, *validate_only),
        TopicChange::Grow {
            topics,
            validate_only,
        } => decide_grow(core, &mut table, &mut seen, topics, *validate_only),
        TopicChange::Configure {
            changes,
            validate_only,
        } => decide_configure(core, &mut table, &mut seen, changes, *validate_only),
        TopicChange::Delete { names } => decide_delete(&mut table, names),
        TopicChange::CreateAcls { bindings } => decide_create_acls(&mut table, bindings),
        TopicChange::DeleteAcls { filters } => decide_delete_acls(&mut table, filters),
        TopicChange::Mirror { topics } => decide_mirror(&mut table, topics),
    };
    if changed && commit(core, table, &mut outcomes).await {
        if let TopicChange::Delete { .. } | TopicChange::Mirror { .. } = change {
            // Only names that were topics: nothing else is joined to the data directory.
            let deleted = outcomes.iter().filter(|o| o.error.is_none());
            remove_topic_dirs(core, deleted.map(|o| o.name.clone()).collect()).await;
        }
    }
    outcomes
}

/// At the edge, topics are the upstream's: creating, growing, configuring and deleting them is
/// refused (POLICY_VIOLATION, with the upstream to do it on), and logged.
fn refused_at_the_edge(core: &Core, change: &TopicChange) -> Option<Vec<TopicOutcome>> {
    let edge = core.config().edge.as_ref()?;
    let (what, names): (&str, Vec<String>) = match change {
        TopicChange::Create { topics, .. } => {
            ("create", topics.iter().map(|t| t.name.clone()).collect())
        }
        TopicChange::Grow { topics, .. } => (
            "add partitions to",
            topics.iter().map(|t| t.name.clone()).collect(),
        ),
        TopicChange::Configure { changes, .. } => (
            "configure",
            changes.iter().map(|c| c.topic.clone()).collect(),
        ),
        TopicChange::Delete { names } => ("delete", names.clone()),
        _ => return None,
    };
    let why = edge.refuse_topic_change(what, &names);
    Some(
        names
            .iter()
            .map(|n| outcome(n, Some((ResponseError::PolicyViolation, why.clone())), None))
            .collect(),
    )
}

/// Makes the table's topics exactly `upstream`'s: new ones added, grown ones grown, re-created
/// ones (another id) replaced, gone ones removed. One outcome per removed topic (its directory
/// goes).
fn decide_mirror(
    table: &mut TopicTable,
    upstream: &BTreeMap<String, (i32, [u8; 16])>,
) -> (Vec<TopicOutcome>, bool) {
    let mut outcomes = Vec::new();
    let mut changed = false;
    let gone: Vec<String> = table
        .topics
        .keys()
        .filter(|n| !upstream.contains_key(*n))
        .cloned()
        .collect();
    for name in gone {
        table.topics.remove(&name);
        outcomes.push(outcome(&name, None, None));
        changed = true;
    }
    for (name, &(partitions, id)) in upstream {
        let partitions = partitions.clamp(1, MAX_PARTITIONS);
        match table.topics.get_mut(name) {
            Some(meta) if meta.id == id => {
                if meta.partitions < partitions {
                    meta.partitions = partitions;
                    changed = true;
                }
            }
            _ => {
                let meta = TopicMeta {
                    id,
                    partitions,
                    configs: BTreeMap::new(),
                    ordinal: table.next_ordinal,
                };
                table.next_ordinal += 1;
                table.topics.insert(name.clone(), meta);
                changed = true;
            }
        }
    }
    (outcomes, changed)
}

/// The topic names of one request, to refuse a topic named twice (`INVALID_REQUEST`).
#[derive(Default)]
struct Names(std::collections::HashSet<String>);

impl Names {
    fn twice(&mut self, name: &str) -> Option<(ResponseError, String)> {
        (!self.0.insert(name.to_string())).then(|| {
            (
                ResponseError::InvalidRequest,
                "topic named twice in one request".to_string(),
            )
        })
    }
}

/// Has core 0 decide a topic change (here, or by message) and returns its outcomes: CreateTopics,
/// CreatePartitions, AlterConfigs and IncrementalAlterConfigs (topics), DeleteTopics.
pub async fn change_topics(core: &Rc<Core>, change: TopicChange) -> Vec<TopicOutcome> {
    if core.id() == 0 {
        return change_on_core0(core, change).await;
    }
    ask_core0(core, |from, id| CoreMsg::Change { from, id, change }).await
}

/// Sends a topic change to core 0 and waits for its outcomes.
async fn ask_core0(core: &Rc<Core>, msg: impl FnOnce(usize, u64) -> CoreMsg) -> Vec<TopicOutcome> {
    let Some(asked) = core.mesh().ask(0, |id| msg(core.id(), id)).await else {
        return Vec::new();
    };
    match core
        .mesh()
        .answer(asked, Instant::now() + CHANGE_TIMEOUT)
        .await
    {
        Some(CoreMsg::Outcomes { outcomes, .. }) => outcomes,
        _ => Vec::new(),
    }
}

fn outcome(
    name: &str,
    error: Option<(ResponseError, String)>,
    meta: Option<&TopicMeta>,
) -> TopicOutcome {
    TopicOutcome {
        name: name.to_string(),
        error,
        partitions: meta.map_or(-1, |m| m.partitions),
        id: meta.map_or([0; 16], |m| m.id),
        acls: Vec::new(),
    }
}

/// CreateAcls on `table`: a binding already there is not added twice.
fn decide_create_acls(
    table: &mut TopicTable,
    bindings: &[crate::table::acl::AclBinding],
) -> (Vec<TopicOutcome>, bool) {
    let mut changed = false;
    let outcomes = bindings
        .iter()
        .map(|b| {
            if !table.acls.contains(b) {
                table.acls.push(b.clone());
                changed = true;
            }
            outcome(&b.name, None, None)
        })
        .collect();
    (outcomes, changed)
}

/// DeleteAcls on `table`: each filter deletes the bindings it matches (those an earlier filter of
/// the request deleted are not reported again).
fn decide_delete_acls(
    table: &mut TopicTable,
    filters: &[crate::table::acl::AclFilter],
) -> (Vec<TopicOutcome>, bool) {
    let mut changed = false;
    let outcomes = filters
        .iter()
        .map(|f| {
            let (gone, kept) = std::mem::take(&mut table.acls)
                .into_iter()
                .partition(|b| f.matches(b));
            table.acls = kept;
            changed |= !gone.is_empty();
            TopicOutcome {
                acls: gone,
                ..outcome("", None, None)
            }
        })
        .collect();
    (outcomes, changed)
}

/// CreateTopics on `table`: outcomes, and whether anything changed.
fn decide_create(
    core: &Core,
    table: &mut TopicTable,
    seen: &mut Names,
    topics: &[NewTopic],
    validate_only: bool,
) -> (Vec<TopicOutcome>, bool) {
    let mut outcomes = Vec::new();
    let mut changed = false;
    for t in topics {
        let partitions = if t.partitions == -1 {
            core.config().default_partitions
        } else {
            t.partitions
        };
        let err = if let Some(twice) = seen.twice(&t.name) {
            Some(twice)
        } else if let Err(why) = validate_topic_name(&t.name) {
            Some((ResponseError::InvalidTopicException, why))
        } else if is_view_name(&t.name) {
            Some((
                ResponseError::InvalidTopicException,
                "names of the form <topic>.shard-<i>-of-<n> are reserved for views".into(),
            ))
        } else if table.topics.contains_key(&t.name) {
            Some((
                ResponseError::TopicAlreadyExists,
                format!("topic {} already exists", t.name),
            ))
        } else if !(1..=MAX_PARTITIONS).contains(&partitions) {
            Some((
                ResponseError::InvalidPartitions,
                format!("partitions must be 1 to {MAX_PARTITIONS}"),
            ))
        } else if t.replication_factor != -1 && t.replication_factor != 1 {
            Some((
                ResponseError::InvalidReplicationFactor,
                "shoal keeps one replica: replication factor must be 1 or -1".into(),
            ))
        } else if let Err(why) = apply_topic_configs(&core.config().log, &t.configs) {
            Some((ResponseError::InvalidConfig, why))
        } else {
            None
        };
        if err.is_some() {
            outcomes.push(outcome(&t.name, err, None));
            continue;
        }
        let meta = TopicMeta {
            id: new_topic_id(),
            partitions,
            configs: t.configs.clone(),
            ordinal: table.next_ordinal,
        };
        outcomes.push(outcome(&t.name, None, Some(&meta)));
        if !validate_only {
            table.next_ordinal += 1;
            table.topics.insert(t.name.clone(), meta);
            changed = true;
        }
    }
    (outcomes, changed)
}

/// Why `t` cannot grow as asked in `table`, with Kafka's error code; `None` if it can. New
/// partitions are placed like every other (round robin over the cores from the topic's first), so
/// assignments are taken only where they name that placement.
fn check_growth(
    table: &TopicTable,
    t: &NewPartitions,
    cores: usize,
) -> Option<(ResponseError, String)> {
    let Some(meta) = table.get(&t.name) else {
        let why = if is_view_name(&t.name) {
            format!(
                "{} is a sharded view: it has its source's partitions",
                t.name
            )
        } else {
            format!("no topic named {}", t.name)
        };
        return Some((ResponseError::UnknownTopicOrPartition, why));
    };
    let now = meta.partitions;
    if t.count <= now {
        let why = if t.count == now {
            format!("topic {} already has {now} partitions", t.name)
        } else {
            format!(
                "topic {} has {now} partitions, more than the {} asked for: partitions cannot be removed",
                t.name, t.count
            )
        };
        return Some((ResponseError::InvalidPartitions, why));
    }
    if t.count > MAX_PARTITIONS {
        return Some((
            ResponseError::InvalidPartitions,
            format!("partitions must be 1 to {MAX_PARTITIONS}"),
        ));
    }
    if let Some(assignments) = &t.assignments {
        if assignments.len() as i32 != t.count - now {
            return Some((
                ResponseError::InvalidReplicaAssignment,
                format!(
                    "{} assignments for {} new partitions",
                    assignments.len(),
                    t.count - now
                ),
            ));
        }
        for (i, brokers) in assignments.iter().enumerate() {
            let partition = now + i as i32;
            let owner = table.owner(meta, partition, cores) as i32;
            if brokers.as_slice() != [owner] {
                return Some((
                    ResponseError::InvalidReplicaAssignment,
                    format!(
                        "partition {partition} of {} can only be on broker {owner} (shoal places partitions on its cores itself, one replica each), not {brokers:?}",
                        t.name
                    ),
                ));
            }
        }
    }
    None
}

/// CreatePartitions on `table`: outcomes, and whether anything changed.
fn decide_grow(
    core: &Core,
    table: &mut TopicTable,
    seen: &mut Names,
    topics: &[NewPartitions],
    validate_only: bool,
) -> (Vec<TopicOutcome>, bool) {
    let mut outcomes = Vec::new();
    let mut changed = false;
    for t in topics {
        let err = seen
            .twice(&t.name)
            .or_else(|| check_growth(table, t, core.cores()));
        if err.is_some() {
            outcomes.push(outcome(&t.name, err, table.get(&t.name)));
            continue;
        }
        let meta = table.topics.get_mut(&t.name).expect("checked");
        if !validate_only {
            log::info!(
                "topic {}: {} partitions -> {}",
                t.name,
                meta.partitions,
                t.count
            );
            meta.partitions = t.count;
            changed = true;
        }
        outcomes.push(outcome(&t.name, None, Some(meta)));
    }
    (outcomes, changed)
}

/// A topic's own configs after `change`, checked against the server's `base` (every key known,
/// every value valid), or why not.
fn changed_configs(
    base: &LogConfig,
    current: &BTreeMap<String, String>,
    change: &ConfigChange,
) -> Result<BTreeMap<String, String>, (ResponseError, String)> {
    let invalid = |why: String| (ResponseError::InvalidConfig, why);
    let mut configs = if change.replace {
        BTreeMap::new()
    } else {
        current.clone()
    };
    for op in &change.ops {
        let name = match op {
            ConfigOp::Set(n, _) | ConfigOp::Delete(n) | ConfigOp::Append(n, _) | ConfigOp::Subtract(n, _) => n,
            ConfigOp::Invalid(n, code) => {
                return Err((
                    ResponseError::InvalidRequest,
                    format!("{n}: operation {code} is not SET (0), DELETE (1), APPEND (2) or SUBTRACT (3) with a value"),
                ))
            }
        };
        if !is_topic_config(name) {
            return Err(invalid(format!("unsupported topic config {name}")));
        }
        // The list a list operation works on: the topic's own value, else the server's.
        let list = |configs: &BTreeMap<String, String>| -> Vec<String> {
            configs
                .get(name)
                .cloned()
                .unwrap_or_else(|| topic_config_value(name, base))
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect()
        };
        match op {
            ConfigOp::Set(n, v) => {
                configs.insert(n.clone(), v.clone());
            }
            ConfigOp::Delete(n) => {
                configs.remove(n);
            }
            ConfigOp::Append(n, v) | ConfigOp::Subtract(n, v) => {
                if !is_list_config(n) {
                    return Err(invalid(format!(
                        "{n} is not a list: APPEND and SUBTRACT do not apply"
                    )));
                }
                let mut items = list(&configs);
                for item in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                    match op {
                        ConfigOp::Append(..) if !items.iter().any(|i| i == item) => {
                            items.push(item.to_string())
                        }
                        ConfigOp::Subtract(..) => items.retain(|i| i != item),
                        _ => {}
                    }
                }
                configs.insert(n.clone(), items.join(","));
            }
            ConfigOp::Invalid(..) => unreachable!("refused above"),
        }
    }
    apply_topic_configs(base, &configs).map_err(invalid)?;
    Ok(configs)
}

/// AlterConfigs / IncrementalAlterConfigs on `table`: outcomes, and whether anything changed.
fn decide_configure(
    core: &Core,
    table: &mut TopicTable,
    seen: &mut Names,
    changes: &[ConfigChange],
    validate_only: bool,
) -> (Vec<TopicOutcome>, bool) {
    let mut outcomes = Vec::new();
    let mut changed = false;
    for change in changes {
        let name = change.topic.clone();
        let result = if let Some(twice) = seen.twice(&name) {
            Err(twice)
        } else if is_view_name(&name) {
            Err((
                ResponseError::InvalidRequest,
                format!("{name} is a sharded view: it has its source's configs"),
            ))
        } else {
            match table.get(&name) {
                None => Err((
                    ResponseError::UnknownTopicOrPartition,
                    format!("no topic named {name}"),
                )),
                Some(meta) => changed_configs(&core.config().log, &meta.configs, change),
            }
        };
        match result {
            Err(e) => outcomes.push(outcome(&name, Some(e), table.get(&name))),
            Ok(configs) => {
                let meta = table.topics.get_mut(&name).expect("checked");
                if !validate_only && meta.configs != configs {
                    log::info!("topic {name}: configs {:?} -> {configs:?}", meta.configs);
                    meta.configs = configs;
                    changed = true;
                }
                outcomes.push(outcome(&name, None, Some(meta)));
            }
        }
    }
    (outcomes, changed)
}

/// DeleteTopics on `table`: outcomes, and whether anything changed.
fn decide_delete(table: &mut TopicTable, names: &[String]) -> (Vec<TopicOutcome>, bool) {
    let mut outcomes = Vec::new();
    let mut changed = false;
    for name in names {
        match table.topics.remove(name) {
            Some(meta) => {
                outcomes.push(outcome(name, None, Some(&meta)));
                changed = true;
            }
            None => outcomes.push(outcome(
                name,
                Some((
                    ResponseError::UnknownTopicOrPartition,
                    format!("no topic named {name}"),
                )),
                None,
            )),
        }
    }
    (outcomes, changed)
}

/// Removes the (emptied) directories of deleted topics.
async fn remove_topic_dirs(core: &Core, names: Vec<String>) {
    let topics_dir = core.config().data_dir.join("topics");
    let _ = glommio::executor()
        .spawn_blocking(move || {
            for name in names {
                let _ = std::fs::remove_dir(topics_dir.join(name));
            }
        })
        .await;
}

/// Persists a changed `table` and applies it on every core. If it cannot be saved, nothing is
/// applied and every outcome that was a success becomes `KAFKA_STORAGE_ERROR`; false then.
async fn commit(core: &Rc<Core>, mut table: TopicTable, outcomes: &mut [TopicOutcome]) -> bool {
    table.revision += 1;
    if let Err(e) = persist_table(&core.config().data_dir, &table).await {
        log::error!("could not persist the topic table: {e}");
        for o in outcomes.iter_mut() {
            o.error.get_or_insert((
                ResponseError::KafkaStorageError,
                format!("topic table not saved: {e}"),
            ));
        }
        return false;
    }
    broadcast(core, table).await;
    true
}

/// Applies `table` on every core and returns when all have.
async fn broadcast(core: &Rc<Core>, table: TopicTable) {
    let msg = |from, id| CoreMsg::Apply {
        from,
        id,
        table: table.clone(),
    };
    on_every_core(core, msg, core.apply_table(table.clone())).await
}

/// `<source>.shard-<i>-of-<n>` (valid or not): reserved for sharded views.
pub fn is_view_name(name: &str) -> bool {
    crate::table::parse_view_name(name).is_some()
}

fn new_topic_id() -> [u8; 16] {
    // Random enough for an id that only has to differ from earlier topics of the same name.
    let mut id = [0u8; 16];
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let mut x = t ^ (std::process::id() as u128) << 64;
    for b in id.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    id[6] = (id[6] & 0x0f) | 0x40; // version 4
    id[8] = (id[8] & 0x3f) | 0x80;
    id
}
