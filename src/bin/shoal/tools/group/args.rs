//! The flags of `shoal group`: which group, which partitions, and where `seek` moves them.

use crate::tools::args::ClientArgs;
use clap::{Args, Subcommand};
use std::time::Duration;

#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  shoal group list\n  \
    shoal group describe clicks-readers --format json\n  \
    shoal group seek clicks-readers --topic clicks --to-datetime 2026-12-03T10:00:00Z --dry-run\n  \
    shoal group seek clicks-readers --topic clicks:0,1 --by-duration 10m\n  \
    shoal group delete clicks-readers")]
pub struct GroupCommand {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(subcommand)]
    pub action: GroupAction,
}

#[derive(Debug, Subcommand)]
pub enum GroupAction {
    /// Every group of the cluster (ListGroups to every broker: a group lives on its coordinator),
    /// with its state and protocol type. Example: `shoal group list --format json`
    List,
    /// A group's state, members and their assignments, and per partition the committed offset,
    /// high watermark, last stable offset and lag, with totals per topic. A partition without a
    /// commit shows committed `-` and the lag of a consumer starting at the log start.
    /// Example: `shoal group describe clicks-readers`
    Describe { group: String },
    /// Moves a stopped group's committed offsets (refused while it has members), clamped to
    /// [log start, high watermark]. Example:
    /// `shoal group seek clicks-readers --topic clicks --to-earliest --dry-run`
    Seek(SeekArgs),
    /// Deletes groups without members, with their committed offsets. Example:
    /// `shoal group delete clicks-readers`
    Delete {
        #[arg(required = true)]
        groups: Vec<String>,
    },
}

/// `seek`: the partitions, exactly one target (or `--shift-by` alone, from the committed offset),
/// and whether to commit.
#[derive(Debug, Args)]
#[command(group(
    clap::ArgGroup::new("target")
        .args(["to_earliest", "to_latest", "to_offset", "to_datetime", "by_duration"])
        .multiple(false)
))]
#[command(group(
    clap::ArgGroup::new("partitions")
        .args(["topics", "all_topics"])
        .required(true)
        .multiple(false)
))]
pub struct SeekArgs {
    pub group: String,
    /// A topic, or some of its partitions (`clicks:0,2`); repeat for more.
    #[arg(long = "topic", value_parser = parse_topic_partitions)]
    pub topics: Vec<TopicPartitions>,
    /// Every partition of the topics the group has committed offsets in.
    #[arg(long)]
    pub all_topics: bool,
    /// To each partition's log start.
    #[arg(long)]
    pub to_earliest: bool,
    /// To each partition's high watermark (skipping everything there is now).
    #[arg(long)]
    pub to_latest: bool,
    /// To this offset.
    #[arg(long)]
    pub to_offset: Option<i64>,
    /// To the first record at or after this time (RFC 3339, e.g. 2026-12-03T10:00:00Z); the
    /// high watermark where there is none.
    #[arg(long, value_parser = parse_rfc3339_ms)]
    pub to_datetime: Option<i64>,
    /// As --to-datetime, at this long ago (e.g. 10m, 2h, 1d).
    #[arg(long, value_parser = parse_ago)]
    pub by_duration: Option<Duration>,
    /// Moves by N (negative: back): from the target if one is given, else from the committed
    /// offset (the log start where there is none).
    #[arg(long, allow_negative_numbers = true)]
    pub shift_by: Option<i64>,
    /// Prints the plan (partition, committed, new offset) and commits nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// A topic and the partitions named for it (none: all of them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicPartitions {
    pub topic: String,
    pub partitions: Vec<i32>,
}

/// `topic` or `topic:0,1,2`.
fn parse_topic_partitions(s: &str) -> Result<TopicPartitions, String> {
    let (topic, list) = match s.rsplit_once(':') {
        Some((t, l)) => (t, Some(l)),
        None => (s, None),
    };
    if topic.is_empty() {
        return Err(format!("{s}: TOPIC or TOPIC:P,P,..."));
    }
    let partitions = match list {
        None => Vec::new(),
        Some(l) => l
            .split(',')
            .map(|p| p.trim().parse::<i32>().ok().filter(|p| *p >= 0))
            .collect::<Option<Vec<i32>>>()
            .filter(|ps| !ps.is_empty())
            .ok_or_else(|| format!("{s}: partitions are numbers, e.g. {topic}:0,2"))?,
    };
    Ok(TopicPartitions {
        topic: topic.to_string(),
        partitions,
    })
}

/// "10m", "2h", "1d", "30s", "500ms": how long ago.
fn parse_ago(s: &str) -> Result<Duration, String> {
    let bad = || format!("{s}: a duration such as 10m, 2h, 1d, 30s or 500ms");
    let i = s.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (n, unit) = s.split_at(i);
    let n: u64 = n.parse().map_err(|_| bad())?;
    let ms = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(bad()),
    };
    n.checked_mul(ms).map(Duration::from_millis).ok_or_else(bad)
}

/// An RFC 3339 time (`2026-12-03T10:00:00Z`, `2026-12-03T11:00:00.250+01:00`) as milliseconds
/// since the Unix epoch, the unit of Kafka's record timestamps.
pub fn parse_rfc3339_ms(s: &str) -> Result<i64, String> {
    let bad = || format!("{s}: an RFC 3339 time such as 2026-12-03T10:00:00Z");
    let b = s.as_bytes();
    let num = |from: usize, len: usize| -> Result<i64, String> {
        let part = s.get(from..from + len).ok_or_else(bad)?;
        if !part.bytes().all(|c| c.is_ascii_digit()) {
            return Err(bad());
        }
        part.parse().map_err(|_| bad())
    };
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return Err(bad());
    }
    if b[13] != b':' || b[16] != b':' {
        return Err(bad());
    }
    let (year, month, day) = (num(0, 4)?, num(5, 2)?, num(8, 2)?);
    let (hour, minute, second) = (num(11, 2)?, num(14, 2)?, num(17, 2)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return Err(bad());
    }
    if second > 60 {
        return Err(bad());
    }
    let mut rest = &s[19..];
    let mut millis = 0;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(bad());
        }
        let first3 = format!("{:0<3}", &frac[..digits.min(3)]);
        millis = first3.parse::<i64>().map_err(|_| bad())?;
        rest = &frac[digits..];
    }
    let offset_s = match rest {
        "Z" | "z" => 0,
        _ if rest.len() == 6 && rest.as_bytes()[3] == b':' => {
            let sign = match rest.as_bytes()[0] {
                b'+' => 1,
                b'-' => -1,
                _ => return Err(bad()),
            };
            let (h, m) = (num(s.len() - 5, 2)?, num(s.len() - 2, 2)?);
            sign * (h * 3600 + m * 60)
        }
        _ => return Err(bad()),
    };
    let days = days_from_civil(year, month, day);
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second - offset_s;
    Ok(seconds * 1000 + millis)
}

/// Days from 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse_to_epoch_milliseconds() {
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00Z"), Ok(0));
        assert_eq!(
            parse_rfc3339_ms("2023-11-14T22:13:20Z"),
            Ok(1_700_000_000_000)
        );
        assert_eq!(
            parse_rfc3339_ms("2023-11-14T23:13:20.5+01:00"),
            Ok(1_700_000_000_500)
        );
        assert_eq!(
            parse_rfc3339_ms("2024-02-29T00:00:00.123456Z"),
            Ok(1_709_164_800_123)
        );
        assert_eq!(parse_rfc3339_ms("1969-12-31T23:59:59Z"), Ok(-1000));
        for bad in [
            "2026-12-03",
            "2026-13-03T10:00:00Z",
            "2026-12-03T10:00:00",
            "2026-12-03T10:00:00+0100",
            "2026-12-03T1a:00:00Z",
            "2026-12-03T10:00:00.Z",
        ] {
            assert!(parse_rfc3339_ms(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations_and_partitions_parse() {
        assert_eq!(parse_ago("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_ago("1d"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_ago("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_ago("10").is_err());
        assert!(parse_ago("m").is_err());
        assert_eq!(
            parse_topic_partitions("clicks:0,2"),
            Ok(TopicPartitions {
                topic: "clicks".into(),
                partitions: vec![0, 2]
            })
        );
        assert_eq!(
            parse_topic_partitions("clicks").map(|t| t.partitions),
            Ok(vec![])
        );
        assert!(parse_topic_partitions("clicks:").is_err());
        assert!(parse_topic_partitions("clicks:x").is_err());
        assert!(parse_topic_partitions(":1").is_err());
    }
}
