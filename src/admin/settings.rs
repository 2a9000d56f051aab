//! Live settings as the admin API names them (`/v1/config/<name>`) and parses their values.

use crate::cores::mesh::Setting;
use std::time::Duration;

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
        _ => Err(format!(
            "unknown setting {name:?}: fetch_coalescing, view_sharing, max_delta_for_fanout, \
             read_replicas, group_lag_interval_ms"
        )),
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
}
