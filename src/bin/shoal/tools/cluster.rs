//! `shoal cluster info`: the brokers (for shoal, one per core), the controller, the cluster id,
//! and the API versions the bootstrap broker serves.

use super::args::ClusterAction;
use super::failure::Failure;
use super::output::{Report, Table};
use super::session::Session;
use kafka_protocol::messages::ApiKey;
use serde_json::json;

pub fn run(s: &Session, action: ClusterAction) -> Result<Report, Failure> {
    match action {
        ClusterAction::Info => info(s),
    }
}

fn info(s: &Session) -> Result<Report, Failure> {
    let m = s.metadata(Some(&[]))?;
    let cluster_id = m.cluster_id.as_ref().map(|c| c.to_string());
    let controller = m.controller_id.0;
    let mut brokers: Vec<(i32, String, Option<String>)> = m
        .brokers
        .iter()
        .map(|b| {
            (
                b.node_id.0,
                format!("{}:{}", b.host, b.port),
                b.rack.as_ref().map(|r| r.to_string()),
            )
        })
        .collect();
    brokers.sort();
    let mut summary = Table::new(None, vec!["CLUSTER-ID", "CONTROLLER", "BOOTSTRAP"]);
    summary.rows.push(vec![
        cluster_id.clone().unwrap_or_else(|| "-".into()),
        controller.to_string(),
        s.bootstrap.to_string(),
    ]);
    let mut broker_table = Table::new(Some("brokers".into()), vec!["NODE", "ADDRESS", "RACK"]);
    for (id, addr, rack) in &brokers {
        broker_table.rows.push(vec![
            id.to_string(),
            addr.clone(),
            rack.clone().unwrap_or_else(|| "-".into()),
        ]);
    }
    let mut api_table = Table::new(
        Some("api versions".into()),
        vec!["API", "KEY", "MIN", "MAX"],
    );
    let mut apis = Vec::new();
    for k in &s.versions.api_keys {
        let name = ApiKey::try_from(k.api_key)
            .map_or_else(|_| "Unknown".to_string(), |a| format!("{a:?}"));
        api_table.rows.push(vec![
            name.clone(),
            k.api_key.to_string(),
            k.min_version.to_string(),
            k.max_version.to_string(),
        ]);
        apis.push(
            json!({"name": name, "key": k.api_key, "min": k.min_version, "max": k.max_version}),
        );
    }
    let json = json!({
        "cluster_id": cluster_id,
        "controller": controller,
        "brokers": brokers.iter().map(|(id, addr, rack)| json!({"node_id": id, "address": addr, "rack": rack})).collect::<Vec<_>>(),
        "api_versions": apis,
    });
    Ok(Report {
        tables: vec![summary, broker_table, api_table],
        json,
    })
}
