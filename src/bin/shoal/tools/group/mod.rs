//! `shoal group`: consumer groups on any Kafka-compatible broker.
//!
//! ## Layout, top layer first
//! - [`describe`]: members, assignments and lag per partition and topic;
//! - [`seek`]: moving a stopped group's offsets;
//! - [`args`]: the command's flags (`seek`'s partitions and targets, RFC 3339 times);
//! - [`coordinator`]: the requests made of a group's coordinator, and ListGroups;
//! - `list` and `delete` here.

pub mod args;
mod coordinator;
mod describe;
mod seek;

use super::failure::Failure;
use super::output::{Report, Table};
use super::session::Session;
use args::GroupAction;
use serde_json::json;
use std::collections::BTreeMap;
use std::net::SocketAddr;

pub fn run(s: &Session, action: GroupAction) -> Result<Report, Failure> {
    match action {
        GroupAction::List => list(s),
        GroupAction::Describe { group } => describe::describe(s, &group),
        GroupAction::Seek(a) => seek::seek(s, a),
        GroupAction::Delete { groups } => delete(s, &groups),
    }
}

/// ListGroups at every broker (each lists the groups it coordinates; a shoal core is a broker),
/// merged by group id: an edge's cores each list every upstream group.
fn list(s: &Session) -> Result<Report, Failure> {
    let m = s.metadata(Some(&[]))?;
    let mut brokers: Vec<SocketAddr> = m
        .brokers
        .iter()
        .filter_map(|b| s.broker(&m, b.node_id.0))
        .collect();
    if brokers.is_empty() {
        brokers.push(s.bootstrap);
    }
    brokers.sort();
    brokers.dedup();
    let mut groups: BTreeMap<String, (String, String)> = BTreeMap::new();
    for addr in brokers {
        for g in coordinator::list(s, addr)? {
            let state = Some(g.group_state.to_string()).filter(|st| !st.is_empty());
            groups.entry(g.group_id.0.to_string()).or_insert((
                state.unwrap_or_else(|| "-".into()),
                g.protocol_type.to_string(),
            ));
        }
    }
    let mut table = Table::new(None, vec!["GROUP", "STATE", "PROTOCOL-TYPE"]);
    let mut rows = Vec::new();
    for (group, (state, protocol_type)) in &groups {
        table
            .rows
            .push(vec![group.clone(), state.clone(), protocol_type.clone()]);
        rows.push(json!({"group": group, "state": state, "protocol_type": protocol_type}));
    }
    Ok(Report {
        tables: vec![table],
        json: serde_json::Value::Array(rows),
    })
}

/// DeleteGroups at each group's coordinator. Every group is tried; the first refusal fails the
/// command (after the others were deleted), by its Kafka name.
fn delete(s: &Session, groups: &[String]) -> Result<Report, Failure> {
    let mut by_coordinator: BTreeMap<SocketAddr, Vec<&str>> = BTreeMap::new();
    for g in groups {
        let (_, addr) = coordinator::retrying(s, || coordinator::find(s, g))?;
        by_coordinator.entry(addr).or_default().push(g);
    }
    let mut deleted = Vec::new();
    let mut refused = None;
    for (addr, gs) in by_coordinator {
        for (group, code) in coordinator::delete(s, addr, &gs)? {
            match Failure::check(code, &format!("deleting group {group}"), None) {
                Ok(()) => deleted.push(group),
                Err(f) => {
                    refused.get_or_insert(f);
                }
            }
        }
    }
    if let Some(mut f) = refused {
        if !deleted.is_empty() {
            f.message += &format!(" (deleted: {})", deleted.join(", "));
        }
        return Err(f);
    }
    let mut t = Table::new(None, Vec::new());
    t.rows
        .push(vec![format!("deleted group(s) {}", deleted.join(", "))]);
    Ok(Report {
        tables: vec![t],
        json: json!({"deleted": deleted}),
    })
}
