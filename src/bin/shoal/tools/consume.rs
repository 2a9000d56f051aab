//! `shoal consume TOPIC`: fetches partitions from their leaders (Fetch, decoded by
//! [`super::records`]), or from the read replica a leader names (`preferred_read_replica`, back to
//! the leader when the replica answers with an error), from the beginning, the end, an offset or a timestamp, or from a group's
//! committed offsets (committing as it goes, as a simple consumer with every partition assigned, no
//! rebalancing); prints each record by a kcat-style template or as a JSON line; stops after
//! --count records or, with --exit, at the end of every partition.

use super::args::{ClientArgs, Format};
use super::committed::Group;
use super::failure::Failure;
use super::records::{decode, Printer};
use super::session::{topic_name, Session};
use crate::client::SyncConn;
use clap::{ArgMatches, Args, FromArgMatches, ValueEnum};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{ApiKey, BrokerId, FetchRequest, FetchResponse};
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::net::SocketAddr;

use super::offsets::{EARLIEST, LATEST};
/// What a record is printed as when --format is not given.
const DEFAULT_TEMPLATE: &str = "%s\\n";

/// `shoal consume`'s flags; see [`ConsumeCommand`] for --format.
#[derive(Debug, Args)]
pub struct ConsumeArgs {
    pub topic: String,
    /// A partition to read; repeatable (default: all).
    #[arg(short, long)]
    pub partition: Vec<i32>,
    /// Where to start: beginning, end, an offset, or @TIMESTAMP_MS (the first record at or after
    /// it). With --group, only for partitions the group has no committed offset for.
    #[arg(short, long, default_value = "end", value_parser = parse_start)]
    pub offset: Start,
    /// Start from this group's committed offsets and commit as records are printed.
    #[arg(short, long)]
    pub group: Option<String>,
    /// Stop after this many records.
    #[arg(short = 'c', long)]
    pub count: Option<u64>,
    /// Stop at the end of every partition (its high watermark, or last stable offset under
    /// read_committed) instead of waiting for more.
    #[arg(short = 'e', long)]
    pub exit: bool,
    #[arg(long, value_enum, default_value = "read_uncommitted")]
    pub isolation: Isolation,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Isolation {
    #[value(name = "read_uncommitted")]
    ReadUncommitted = 0,
    /// Records of open or aborted transactions are not read.
    #[value(name = "read_committed")]
    ReadCommitted = 1,
}

/// Where reading starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    Beginning,
    End,
    Offset(i64),
    Timestamp(i64),
}

fn parse_start(s: &str) -> Result<Start, String> {
    let bad = || format!("{s}: beginning, end, an offset or @TIMESTAMP_MS");
    Ok(match s {
        "beginning" => Start::Beginning,
        "end" => Start::End,
        _ => match s.strip_prefix('@') {
            Some(ts) => Start::Timestamp(ts.parse().map_err(|_| bad())?),
            None => Start::Offset(s.parse().ok().filter(|o| *o >= 0).ok_or_else(bad)?),
        },
    })
}

/// `shoal consume`: [`ConsumeArgs`], whose shared `--format` takes a template here (`json`: one
/// JSON object per record); the template is kept as typed.
#[derive(Debug)]
pub struct ConsumeCommand {
    pub args: ConsumeArgs,
    pub template: String,
}

/// `json` is JSON; anything else is a template, printed as text.
fn template_format(s: &str) -> Result<Format, String> {
    Ok(if s == "json" {
        Format::Json
    } else {
        Format::Table
    })
}

impl Args for ConsumeCommand {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        ConsumeArgs::augment_args(cmd)
            .mut_arg("format", |a| {
                a.value_parser(template_format)
                    .default_value(DEFAULT_TEMPLATE)
                    .hide_possible_values(true)
                    .help(
                        "How to print each record: a template with %t topic, %p partition, %o \
                         offset, %k key, %s value, %T timestamp (ms), %h headers, %K/%S key/value \
                         length, \\n \\t escapes; or json, one object per line",
                    )
            })
            .after_help(
                "Examples:\n  shoal consume clicks --offset beginning --exit\n  \
                 shoal consume clicks -p 0 --offset @1700000000000 --count 10 --format '%o %k=%s\\n'\n  \
                 shoal consume clicks --group audit --format json",
            )
    }
    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

impl FromArgMatches for ConsumeCommand {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        Self::from_arg_matches_mut(&mut m.clone())
    }
    fn from_arg_matches_mut(m: &mut ArgMatches) -> Result<Self, clap::Error> {
        let template = m
            .get_raw("format")
            .and_then(|mut v| v.next())
            .map_or(DEFAULT_TEMPLATE.to_string(), |v| {
                v.to_string_lossy().into_owned()
            });
        Ok(ConsumeCommand {
            args: ConsumeArgs::from_arg_matches_mut(m)?,
            template,
        })
    }
    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

/// One partition being read.
#[derive(Debug)]
struct Position {
    leader: SocketAddr,
    /// Where it is fetched from: the leader, or the replica the leader named.
    reader: SocketAddr,
    next: i64,
    /// Reached the end (with --exit).
    at_end: bool,
}

/// The reading loop's state.
struct Consumer<'a> {
    s: &'a Session,
    args: &'a ConsumeArgs,
    printer: Printer,
    positions: BTreeMap<i32, Position>,
    conns: HashMap<SocketAddr, SyncConn>,
    /// Every broker's address by id, for `preferred_read_replica`.
    brokers: HashMap<i32, SocketAddr>,
    /// Replicas that could not be reached: not followed again.
    unreachable_replicas: std::collections::HashSet<SocketAddr>,
    group: Option<Group>,
    version: i16,
    printed: u64,
}

pub fn run(s: &Session, cmd: &ConsumeCommand) -> Result<(), Failure> {
    let mut c = Consumer::new(s, &cmd.args, Printer::parse(&cmd.template))?;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let result = c
        .consume(&mut out)
        .and_then(|()| out.flush().map_err(Stop::Write));
    match result {
        Ok(()) => Ok(()),
        // A broken pipe (`| head`): the reader has what it wanted.
        Err(Stop::Write(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(Stop::Write(e)) => Err(Failure::other(
            "WriteFailed",
            e.to_string(),
            "could not write to standard output",
        )),
        Err(Stop::Failed(f)) => Err(f),
    }
}

/// Why the loop stopped early.
enum Stop {
    Failed(Failure),
    Write(std::io::Error),
}

impl From<Failure> for Stop {
    fn from(f: Failure) -> Stop {
        Stop::Failed(f)
    }
}

impl<'a> Consumer<'a> {
    fn new(s: &'a Session, args: &'a ConsumeArgs, printer: Printer) -> Result<Self, Failure> {
        let topic = args.topic.as_str();
        let leaders: BTreeMap<i32, SocketAddr> = s
            .leaders(topic)?
            .into_iter()
            .filter(|(p, _)| args.partition.is_empty() || args.partition.contains(p))
            .map(|(p, (_, addr))| (p, addr))
            .collect();
        if let Some(p) = args.partition.iter().find(|p| !leaders.contains_key(p)) {
            return Err(Failure::kafka(
                3,
                &format!("topic {topic} partition {p}"),
                None,
            ));
        }
        let mut group = args
            .group
            .as_deref()
            .map(|g| Group::open(s, g))
            .transpose()?;
        let ids: Vec<i32> = leaders.keys().copied().collect();
        let mut starts = match &mut group {
            Some(g) => g.committed(topic, &ids)?,
            None => BTreeMap::new(),
        };
        let missing: Vec<i32> = ids
            .iter()
            .copied()
            .filter(|p| !starts.contains_key(p))
            .collect();
        starts.extend(start_offsets(
            s,
            topic,
            &leaders,
            &missing,
            args.offset,
            args.isolation,
        )?);
        let positions = leaders
            .into_iter()
            .map(|(p, leader)| {
                let next = starts.get(&p).copied().unwrap_or(0);
                (
                    p,
                    Position {
                        leader,
                        reader: leader,
                        next,
                        at_end: false,
                    },
                )
            })
            .collect();
        let m = s.metadata(Some(&[]))?;
        let brokers = m
            .brokers
            .iter()
            .filter_map(|b| Some((b.node_id.0, s.broker(&m, b.node_id.0)?)))
            .collect();
        Ok(Consumer {
            s,
            args,
            printer,
            positions,
            conns: HashMap::new(),
            brokers,
            unreachable_replicas: Default::default(),
            group,
            // v11+ lets a leader send the reader to another replica (preferred_read_replica).
            version: s.version(ApiKey::Fetch, 4, 11)?,
            printed: 0,
        })
    }

    fn done(&self) -> bool {
        self.args.count.is_some_and(|c| self.printed >= c)
            || self.args.exit && self.positions.values().all(|p| p.at_end)
    }

    fn consume(&mut self, out: &mut impl Write) -> Result<(), Stop> {
        if self.args.count == Some(0) {
            return Ok(());
        }
        loop {
            let mut readers: Vec<SocketAddr> = self.positions.values().map(|p| p.reader).collect();
            readers.sort();
            readers.dedup();
            let before: BTreeMap<i32, i64> = self
                .positions
                .iter()
                .map(|(p, pos)| (*p, pos.next))
                .collect();
            for reader in readers {
                self.fetch(reader, out)?;
                if self.args.count.is_some_and(|c| self.printed >= c) {
                    break;
                }
            }
            out.flush().map_err(Stop::Write)?;
            if let Some(g) = &mut self.group {
                let moved: BTreeMap<i32, i64> = self
                    .positions
                    .iter()
                    .filter(|(p, pos)| before.get(p) != Some(&pos.next))
                    .map(|(p, pos)| (*p, pos.next))
                    .collect();
                g.commit(&self.args.topic, &moved)?;
            }
            if self.done() {
                return Ok(());
            }
        }
    }

    /// One Fetch of the partitions read from `reader` (those not at their end yet), printed.
    /// The Fetch of the partitions read from `reader` that are not at their end (none: `None`).
    fn request(&self, reader: SocketAddr) -> Option<FetchRequest> {
        let partitions: Vec<FetchPartition> = self
            .positions
            .iter()
            .filter(|(_, pos)| pos.reader == reader && !pos.at_end)
            .map(|(p, pos)| {
                FetchPartition::default()
                    .with_partition(*p)
                    .with_fetch_offset(pos.next)
                    .with_current_leader_epoch(-1)
                    .with_last_fetched_epoch(-1)
                    .with_log_start_offset(-1)
                    .with_partition_max_bytes(1 << 20)
            })
            .collect();
        if partitions.is_empty() {
            return None;
        }
        // With --exit, no waiting for records that may never come; else a short long poll, well
        // within --timeout.
        let wait_ms = if self.args.exit {
            0
        } else {
            (self.args.client.timeout.as_millis() / 2).min(500) as i32
        };
        Some(
            FetchRequest::default()
                .with_replica_id(BrokerId(-1))
                .with_max_wait_ms(wait_ms)
                .with_min_bytes(1)
                .with_max_bytes(16 << 20)
                .with_isolation_level(self.args.isolation as i8)
                .with_session_epoch(-1)
                .with_topics(vec![FetchTopic::default()
                    .with_topic(topic_name(&self.args.topic))
                    .with_partitions(partitions)]),
        )
    }

    /// Connecting to or fetching from `reader` failed with `f`: the partitions it served as a
    /// replica go back to their leaders, and a leader naming it again is not followed; a leader's
    /// failure ends the command.
    fn unreachable(&mut self, reader: SocketAddr, f: Failure) -> Result<(), Stop> {
        self.conns.remove(&reader);
        let mut moved = false;
        for pos in self.positions.values_mut() {
            if pos.reader == reader && pos.leader != reader {
                pos.reader = pos.leader;
                moved = true;
            }
        }
        if moved {
            self.unreachable_replicas.insert(reader);
            Ok(())
        } else {
            Err(f.into())
        }
    }

    fn fetch(&mut self, reader: SocketAddr, out: &mut impl Write) -> Result<(), Stop> {
        let Some(req) = self.request(reader) else {
            return Ok(());
        };
        let conn = match self.conns.entry(reader) {
            std::collections::hash_map::Entry::Occupied(c) => c.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => match self.s.connect(reader) {
                Ok(conn) => v.insert(conn),
                Err(f) => return self.unreachable(reader, f),
            },
        };
        let r: FetchResponse = match conn.call(ApiKey::Fetch, self.version, &req) {
            Ok(r) => r,
            Err(e) => return self.unreachable(reader, Failure::from(e)),
        };
        let topic = self.args.topic.as_str();
        Failure::check(r.error_code, &format!("fetching topic {topic}"), None)?;
        for pd in r.responses.iter().flat_map(|t| &t.partitions) {
            let p = pd.partition_index;
            let Some(pos) = self.positions.get_mut(&p) else {
                continue;
            };
            let what = format!(
                "fetching topic {topic} partition {p} at offset {}",
                pos.next
            );
            if pd.error_code != 0 && pos.reader != pos.leader {
                // A replica that cannot serve it (stopped, behind, moved): back to the leader.
                pos.reader = pos.leader;
                continue;
            }
            if pd.error_code == OFFSET_OUT_OF_RANGE {
                let leader = pos.leader;
                return Err(Stop::Failed(self.out_of_range(leader, p, &what)));
            }
            Failure::check(pd.error_code, &what, None)?;
            if let Some(replica) = self.brokers.get(&pd.preferred_read_replica.0) {
                if !self.unreachable_replicas.contains(replica) {
                    pos.reader = *replica;
                }
            }
            let bytes = pd.records.as_deref().unwrap_or_default();
            let decoded =
                decode(bytes, pos.next, pd.aborted_transactions.as_deref()).map_err(|e| {
                    Failure::other(
                        "CorruptRecord",
                        format!("{what}: {e}"),
                        "see the broker's log",
                    )
                })?;
            for rec in &decoded.records {
                if self.args.count.is_some_and(|c| self.printed >= c) {
                    return Ok(());
                }
                self.printer
                    .print(out, topic, p, rec)
                    .map_err(Stop::Write)?;
                self.printed += 1;
                pos.next = rec.offset + 1;
            }
            pos.next = pos.next.max(decoded.next);
            let end = match self.args.isolation {
                Isolation::ReadCommitted if pd.last_stable_offset >= 0 => pd.last_stable_offset,
                _ => pd.high_watermark,
            };
            pos.at_end = self.args.exit && pos.next >= end;
        }
        Ok(())
    }
}

/// The Kafka error code OFFSET_OUT_OF_RANGE.
const OFFSET_OUT_OF_RANGE: i16 = 1;

impl Consumer<'_> {
    /// OFFSET_OUT_OF_RANGE for `partition`, naming the offsets the partition holds.
    fn out_of_range(&self, leader: SocketAddr, partition: i32, what: &str) -> Failure {
        let (topic, isolation) = (
            self.args.topic.as_str(),
            super::offsets::Isolation::ReadUncommitted,
        );
        let bound = |at| {
            super::offsets::at(self.s, leader, topic, &[partition], at, isolation)
                .ok()
                .and_then(|m| m.get(&partition).copied())
        };
        let mut failure = Failure::kafka(OFFSET_OUT_OF_RANGE, what, None);
        if let (Some(first), Some(end)) = (bound(EARLIEST), bound(LATEST)) {
            failure.message += &if first < end {
                format!(" (the partition holds offsets {first} to {})", end - 1)
            } else {
                format!(" (the partition is empty; its next offset is {end})")
            };
        }
        failure.hint = "start from --offset beginning, end, or an offset in that range";
        failure
    }
}

/// Where each of `partitions` starts by `start` (ListOffsets at their leaders).
fn start_offsets(
    s: &Session,
    topic: &str,
    leaders: &BTreeMap<i32, SocketAddr>,
    partitions: &[i32],
    start: Start,
    isolation: Isolation,
) -> Result<BTreeMap<i32, i64>, Failure> {
    // Under read_committed the end is the last stable offset, as a Kafka consumer resets to.
    let isolation = match isolation {
        Isolation::ReadUncommitted => super::offsets::Isolation::ReadUncommitted,
        Isolation::ReadCommitted => super::offsets::Isolation::ReadCommitted,
    };
    if let Start::Offset(o) = start {
        return Ok(partitions.iter().map(|p| (*p, o)).collect());
    }
    let mut by_leader: BTreeMap<SocketAddr, Vec<i32>> = BTreeMap::new();
    for p in partitions {
        by_leader.entry(leaders[p]).or_default().push(*p);
    }
    let mut out = BTreeMap::new();
    for (addr, ids) in by_leader {
        let timestamp = match start {
            Start::Beginning => EARLIEST,
            Start::Timestamp(ts) => ts,
            _ => LATEST,
        };
        let found = super::offsets::at(s, addr, topic, &ids, timestamp, isolation)?;
        // A timestamp after every record: the end.
        let latest = match start {
            Start::Timestamp(_) => super::offsets::at(s, addr, topic, &ids, LATEST, isolation)?,
            _ => BTreeMap::new(),
        };
        for p in ids {
            let o = found
                .get(&p)
                .copied()
                .filter(|o| *o >= 0)
                .or_else(|| latest.get(&p).copied())
                .ok_or_else(|| {
                    Failure::kafka(
                        3,
                        &format!("the offsets of topic {topic} partition {p}"),
                        None,
                    )
                })?;
            out.insert(p, o);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_parse() {
        assert_eq!(parse_start("beginning"), Ok(Start::Beginning));
        assert_eq!(parse_start("end"), Ok(Start::End));
        assert_eq!(parse_start("42"), Ok(Start::Offset(42)));
        assert_eq!(
            parse_start("@1700000000000"),
            Ok(Start::Timestamp(1_700_000_000_000))
        );
        assert!(parse_start("-3").is_err());
        assert!(parse_start("@soon").is_err());
    }
}
