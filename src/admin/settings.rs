//! Live settings as the admin API names them (`/v1/config/<name>`), parses their values and
//! writes them back (JSON, in the words a request uses).

use crate::cores::mesh::Setting;
use serde_json::{json, Map, Value};
use std::time::Duration;

/// The live settings' names, in the order `GET /v1/config` lists them.
pub(super) const NAMES: [&str; 5] = [
    "fetch_coalescing",
    "view_sharing",
    "max_delta_for_fanout",
    "read_replicas",
    "group_lag_interval_ms",
];

/// A setting's name and its value as a request would write it.
pub(super) fn name_and_value(setting: &Setting) -> (&'static str, Value) {
    let on_off = |on: bool| Value::from(if on { "on" } else { "off" });
    match *setting {
        Setting::FetchCoalescing(on) => (NAMES[0], on_off(on)),
        Setting::ViewSharing(on) => (NAMES[1], on_off(on)),
        Setting::MaxDeltaForFanout(delta) => (NAMES[2], json!(delta)),
        Setting::ReadReplicas(policy) => (NAMES[3], json!(policy.name())),
        Setting::GroupLagInterval(every) => (NAMES[4], json!(every.as_millis() as u64)),
    }
}

/// The settings as one JSON object, `{"name": value, ...}`.
pub(super) fn settings_value<'a>(settings: impl IntoIterator<Item = &'a Setting>) -> Value {
    let object: Map<String, Value> = settings
        .into_iter()
        .map(|s| {
            let (name, value) = name_and_value(s);
            (name.to_string(), value)
        })
        .collect();
    Value::Object(object)
}

/// [`settings_value`] as text, with a newline.
pub(super) fn settings_json<'a>(settings: impl IntoIterator<Item = &'a Setting>) -> String {
    settings_value(settings).to_string() + "\n"
}

/// The refusal of a name that is not a live setting.
pub(super) fn unknown_setting(name: &str) -> String {
    format!("unknown setting {name:?}: {}", NAMES.join(", "))
}

/// A live setting from its name and value.
pub(super) fn parse_setting(name: &str, value: &str) -> Result<Setting, String> {
    match name {
        "fetch_coalescing" => parse_on_off(value).map(Setting::FetchCoalescing),
        "view_sharing" => parse_on_off(value).map(Setting::ViewSharing),
        "max_delta_for_fanout" => value
            .parse::<i64>()
            .ok()
            .filter(|d| *d >= 0)
            .map(Setting::MaxDeltaForFanout)
            .ok_or_else(|| {
                format!("max_delta_for_fanout takes a number of offsets, not {value:?}")
            }),
        "read_replicas" => {
            crate::table::configs::ReplicaPolicy::parse(value).map(Setting::ReadReplicas)
        }
        "group_lag_interval_ms" => value
            .parse::<u64>()
            .map(|ms| Setting::GroupLagInterval(Duration::from_millis(ms)))
            .map_err(|_| {
                format!("group_lag_interval_ms takes milliseconds (0: off), not {value:?}")
            }),
        _ => Err(unknown_setting(name)),
    }
}

/// `on`/`off` (also `true`/`false`), for live settings and the flags that set them at start.
pub fn parse_on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" | "true" => Ok(true),
        "off" | "false" => Ok(false),
        _ => Err(format!("expected on or off, not {s:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse_by_name_and_refuse_bad_values() {
        assert_eq!(
            parse_setting("fetch_coalescing", "on"),
            Ok(Setting::FetchCoalescing(true))
        );
        assert_eq!(
            parse_setting("view_sharing", "false"),
            Ok(Setting::ViewSharing(false))
        );
        assert_eq!(
            parse_setting("max_delta_for_fanout", "500"),
            Ok(Setting::MaxDeltaForFanout(500))
        );
        assert!(parse_setting("max_delta_for_fanout", "-3").is_err());
        assert_eq!(
            parse_setting("group_lag_interval_ms", "250"),
            Ok(Setting::GroupLagInterval(Duration::from_millis(250)))
        );
        assert!(parse_setting("group_lag_interval_ms", "soon").is_err());
        assert!(parse_setting("fetch_coalescing", "maybe").is_err());
        assert!(parse_setting("nonsense", "1").is_err());
    }

    #[test]
    fn settings_are_written_back_in_the_words_a_request_uses() {
        for (name, value) in [
            ("fetch_coalescing", "off"),
            ("view_sharing", "on"),
            ("max_delta_for_fanout", "500"),
            ("read_replicas", "all"),
            ("group_lag_interval_ms", "250"),
        ] {
            let setting = parse_setting(name, value).unwrap();
            let (written_name, written) = name_and_value(&setting);
            assert_eq!(written_name, name);
            let text = written.as_str().map_or(written.to_string(), str::to_string);
            assert_eq!(text, value);
            assert_eq!(parse_setting(written_name, &text), Ok(setting));
        }
        let all = settings_json(&[
            Setting::FetchCoalescing(true),
            Setting::MaxDeltaForFanout(7),
        ]);
        assert_eq!(
            all,
            "{\"fetch_coalescing\":\"on\",\"max_delta_for_fanout\":7}\n"
        );
    }
}
