//! The Grafana dashboard (`ops/grafana/shoal-dashboard.json`) and the example Prometheus alert
//! rules (`ops/prometheus/shoal-alerts.yml`) name only metrics shoal exports: every `shoal_*` name
//! in them is a family in the `/metrics` of a running `shoal serve` (with a consumer group that
//! committed, so the per-group families have samples) or `shoal edge`, or a histogram's
//! `_bucket` / `_sum` / `_count` series. And the dashboard is a dashboard: valid JSON, every panel
//! with a query on the data source variable.

use crate::common;

use common::edge::{start_edge, start_upstream};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

const DASHBOARD: &str = include_str!("../../ops/grafana/shoal-dashboard.json");
const ALERTS: &str = include_str!("../../ops/prometheus/shoal-alerts.yml");

/// Every `shoal_...` metric name in `text`.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("shoal_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        out.insert(name);
    }
    out
}

/// `# TYPE name kind` of a `/metrics` text: name to kind.
fn families(metrics: &str) -> BTreeMap<String, String> {
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(name, kind)| (name.to_string(), kind.to_string()))
        .collect()
}

/// Whether `name` is a family, or a series of a histogram family.
fn exported(name: &str, families: &BTreeMap<String, String>) -> bool {
    families.contains_key(name)
        || ["_bucket", "_sum", "_count"].iter().any(|suffix| {
            name.strip_suffix(suffix)
                .is_some_and(|base| families.get(base).is_some_and(|k| k == "histogram"))
        })
}

fn dashboard_queries() -> Vec<String> {
    let d: Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    assert!(!d["title"].as_str().unwrap_or("").is_empty());
    let vars = d["templating"]["list"].as_array().unwrap();
    assert!(vars
        .iter()
        .any(|v| v["name"] == "datasource" && v["type"] == "datasource"));
    let mut queries = Vec::new();
    for p in d["panels"].as_array().unwrap() {
        if p["type"] == "row" {
            continue;
        }
        let targets = p["targets"].as_array().unwrap_or_else(|| panic!("{p}"));
        assert!(!targets.is_empty(), "panel {} has no query", p["title"]);
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
        queries.extend(
            targets
                .iter()
                .map(|t| t["expr"].as_str().unwrap().to_string()),
        );
    }
    queries
}

/// The alert rules' names and expressions (comments and annotations left out). A folded
/// expression (`expr: >`) runs over the lines indented deeper than its key, as in YAML.
fn alert_rules() -> Vec<(String, String)> {
    let indent = |l: &str| l.len() - l.trim_start().len();
    let mut rules = Vec::new();
    let mut lines = ALERTS.lines().peekable();
    let mut alert = None;
    while let Some(line) = lines.next() {
        let t = line.trim();
        if let Some(name) = t.strip_prefix("- alert:") {
            alert = Some(name.trim().to_string());
        } else if let Some(expr) = t.strip_prefix("expr:") {
            let mut expr = expr.trim().to_string();
            if expr == ">" || expr == "|" {
                expr.clear();
                while let Some(next) = lines.next_if(|n| indent(n) > indent(line)) {
                    expr.push_str(next.trim());
                    expr.push(' ');
                }
            }
            rules.push((alert.take().expect("an expr belongs to an alert"), expr));
        }
    }
    rules
}

#[test]
fn dashboards_and_alerts_name_only_exported_metrics() {
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let upstream = start_upstream(dirs[0].path(), "127.0.0.1:0");
    let b = upstream.bootstrap();
    common::create_topics(&b, &[("lagging", 2)]);
    common::cli::produce(&b, "lagging", &[3, 2]);
    // A group that committed, so the per-group families have samples.
    let seek = common::cli::shoal(
        &[
            "group",
            "seek",
            "dash-group",
            "--topic",
            "lagging",
            "--to-earliest",
            "-b",
            &b,
        ],
        &[],
    );
    assert!(seek.ok, "{}", seek.stderr);
    let edge = start_edge(dirs[1].path(), &b);
    let mut known = families(&upstream.admin_get("/metrics").1);
    known.extend(families(&edge.admin_get("/metrics").1));
    assert!(known.len() > 50, "{known:?}");

    let queries = dashboard_queries();
    assert!(queries.len() >= 20, "{queries:?}");
    let rules = alert_rules();
    let names: Vec<&str> = rules.iter().map(|(n, _)| n.as_str()).collect();
    for wanted in [
        "ShoalCoreSaturated",
        "ShoalConsumerGroupLagging",
        "ShoalStorageErrors",
        "ShoalEdgeUpstreamDown",
    ] {
        assert!(names.contains(&wanted), "{names:?}");
    }
    let mut named = BTreeSet::new();
    for text in queries.iter().chain(rules.iter().map(|(_, e)| e)) {
        let found = metric_names(text);
        assert!(!found.is_empty(), "a query without a shoal metric: {text}");
        named.extend(found);
    }
    // The comments name metrics too: they must be real as well.
    named.extend(metric_names(ALERTS));
    let missing: Vec<&String> = named.iter().filter(|n| !exported(n, &known)).collect();
    assert!(missing.is_empty(), "not in /metrics: {missing:?}");
    edge.stop();
    upstream.stop();
}
