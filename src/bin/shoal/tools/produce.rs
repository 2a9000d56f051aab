//! `shoal produce TOPIC`: one record per line of standard input (`key<DELIMITER>value` with
//! --key-delimiter), partitioned as Kafka's default partitioner does (murmur2 of the key; records
//! without a key stick to one partition per request, round-robin), batched per partition in
//! RecordBatch v2 (`shards::batch`, CRC-32C), compressed, and sent to each partition's leader:
//! once a request is full, and at most --linger-ms after a line was read (input that comes slowly,
//! `tail -f`, is sent as it comes).

use super::args::ClientArgs;
use super::failure::Failure;
use super::output::{Report, Table};
use super::session::{topic_name, Session};
use crate::bench::client::Codec;
use crate::client::SyncConn;
use clap::Args;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{ApiKey, ProduceRequest, ProduceResponse};
use serde::Serialize;
use shards::batch::BatchBuilder;
use std::collections::{BTreeMap, HashMap};
use std::io::BufRead;
use std::sync::mpsc::{Receiver, RecvTimeoutError};

/// A request holds at most this many bytes of records ...
const MAX_REQUEST_BYTES: usize = 1 << 20;

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  printf 'k1\\tv1\\nk2\\tv2\\n' | shoal produce clicks --key-delimiter '\\t' -H source=cli\n  \
    seq 1000 | shoal produce numbers --compression zstd --acks 1 --format json"
)]
pub struct ProduceCommand {
    pub topic: String,
    /// Split each line at the first occurrence of this string into key and value (`\t`: a TAB);
    /// a line without it is a value with no key.
    #[arg(long)]
    pub key_delimiter: Option<String>,
    /// A header for every record, `key=value`; repeatable.
    #[arg(short = 'H', long = "header", value_parser = super::args::parse_config)]
    pub headers: Vec<(String, String)>,
    /// Send every record to this partition (default: by key hash, as Kafka's default partitioner;
    /// records without a key round-robin, one partition per request).
    #[arg(short, long)]
    pub partition: Option<i32>,
    #[arg(long, value_enum, default_value = "none")]
    pub compression: Codec,
    /// 0 (no answer), 1 (the leader wrote it) or all (every in-sync replica has it).
    #[arg(long, default_value = "all", value_parser = parse_acks)]
    pub acks: i16,
    /// ... and at most this many records.
    #[arg(long, default_value_t = 1000)]
    pub batch_records: usize,
    /// Send what was read at most this long after its first line (ms), even if more could join
    /// it: lines that come slowly (`tail -f`) are sent as they come.
    #[arg(long, default_value_t = 100)]
    pub linger_ms: u64,
    #[command(flatten)]
    pub client: ClientArgs,
}

fn parse_acks(s: &str) -> Result<i16, String> {
    match s {
        "0" => Ok(0),
        "1" => Ok(1),
        "all" | "-1" => Ok(-1),
        _ => Err(format!("{s}: 0, 1 or all")),
    }
}

/// `\t`, `\n` and `\\` in a delimiter typed on a command line.
fn unescape(s: &str) -> String {
    s.replace("\\t", "\t")
        .replace("\\n", "\n")
        .replace("\\\\", "\\")
}

/// What went to one partition.
#[derive(Debug, Default, Serialize)]
struct Sent {
    partition: i32,
    records: u64,
    /// The offsets the leader gave the first and the last record (unknown with acks=0).
    first_offset: Option<i64>,
    last_offset: Option<i64>,
}

/// The records read and not sent yet, and where every partition's leader is.
struct Producer<'a> {
    s: &'a Session,
    topic: String,
    acks: i16,
    codec: Codec,
    version: i16,
    /// Each partition's leader's node id and address.
    leaders: BTreeMap<i32, (i32, std::net::SocketAddr)>,
    conns: HashMap<i32, SyncConn>,
    pending: BTreeMap<i32, BatchBuilder>,
    pending_records: usize,
    pending_bytes: usize,
    sent: BTreeMap<i32, Sent>,
}

pub fn run(s: &Session, cmd: &ProduceCommand) -> Result<Report, Failure> {
    let mut p = Producer::new(s, cmd)?;
    let partitions: Vec<i32> = p.leaders.keys().copied().collect();
    if let Some(n) = cmd.partition {
        if !partitions.contains(&n) {
            return Err(Failure::kafka(
                3,
                &format!("topic {} partition {n}", cmd.topic),
                None,
            ));
        }
    }
    let delimiter = cmd.key_delimiter.as_deref().map(unescape);
    let headers: Vec<(&[u8], Option<&[u8]>)> = cmd
        .headers
        .iter()
        .map(|(k, v)| (k.as_bytes(), Some(v.as_bytes())))
        .collect();
    let mut sticky = 0usize;
    let lines = read_lines();
    let linger = std::time::Duration::from_millis(cmd.linger_ms);
    // When the oldest pending record was read.
    let mut oldest: Option<std::time::Instant> = None;
    loop {
        let line = match oldest {
            None => lines.recv().map_err(|_| RecvTimeoutError::Disconnected),
            Some(t) => lines.recv_timeout(linger.saturating_sub(t.elapsed())),
        };
        let line = match line {
            Ok(line) => line.map_err(|e| Failure::other("ReadFailed", e.to_string(), "stdin"))?,
            Err(RecvTimeoutError::Timeout) => {
                p.flush()?;
                sticky += 1;
                oldest = None;
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => break,
        };
        oldest.get_or_insert_with(std::time::Instant::now);
        let (key, value) = split(&line, delimiter.as_deref());
        let partition = match (cmd.partition, key) {
            (Some(n), _) => n,
            (None, Some(k)) => {
                partitions[shards::partitioner::shard_of(Some(k), partitions.len() as u32)
                    .expect("a key") as usize]
            }
            (None, None) => partitions[sticky % partitions.len()],
        };
        let now = now_ms();
        let b = p
            .pending
            .entry(partition)
            .or_insert_with(|| BatchBuilder::new(now));
        let before = b.size();
        b.push(now, key, Some(value), &headers);
        p.pending_bytes += b.size() - before;
        p.pending_records += 1;
        p.sent.entry(partition).or_default().records += 1;
        if p.pending_records >= cmd.batch_records.max(1) || p.pending_bytes >= MAX_REQUEST_BYTES {
            p.flush()?;
            sticky += 1;
            oldest = None;
        }
    }
    p.flush()?;
    Ok(p.report())
}

/// Standard input's lines, read by a thread of their own so that the sender can stop waiting for
/// the next one when --linger-ms has passed.
fn read_lines() -> Receiver<std::io::Result<Vec<u8>>> {
    let (tx, rx) = std::sync::mpsc::sync_channel(4096);
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().split(b'\n') {
            let failed = line.is_err();
            if tx.send(line).is_err() || failed {
                return;
            }
        }
    });
    rx
}

/// A line's key and value: split at the first `delimiter`, else no key.
fn split<'l>(line: &'l [u8], delimiter: Option<&str>) -> (Option<&'l [u8]>, &'l [u8]) {
    let Some(d) = delimiter.map(str::as_bytes).filter(|d| !d.is_empty()) else {
        return (None, line);
    };
    match line.windows(d.len()).position(|w| w == d) {
        Some(i) => (Some(&line[..i]), &line[i + d.len()..]),
        None => (None, line),
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl<'a> Producer<'a> {
    fn new(s: &'a Session, cmd: &ProduceCommand) -> Result<Producer<'a>, Failure> {
        let topic = cmd.topic.as_str();
        let leaders = s.leaders(topic)?;
        if leaders.is_empty() {
            return Err(Failure::kafka(
                3,
                &format!("topic {topic}: no partitions"),
                None,
            ));
        }
        Ok(Producer {
            s,
            topic: topic.to_string(),
            acks: cmd.acks,
            codec: cmd.compression,
            version: s.version(ApiKey::Produce, 3, 9)?,
            leaders,
            conns: HashMap::new(),
            pending: BTreeMap::new(),
            pending_records: 0,
            pending_bytes: 0,
            sent: BTreeMap::new(),
        })
    }

    /// Sends the pending batches: one request per leader, with a batch for each of its partitions.
    fn flush(&mut self) -> Result<(), Failure> {
        let mut by_leader: BTreeMap<i32, Vec<(i32, usize, Vec<u8>)>> = BTreeMap::new();
        for (partition, b) in std::mem::take(&mut self.pending) {
            let count = b.len();
            let batch = self.codec.compress_batch(&b.finish(0));
            let leader = self.leaders[&partition].0;
            by_leader
                .entry(leader)
                .or_default()
                .push((partition, count, batch));
        }
        self.pending_records = 0;
        self.pending_bytes = 0;
        for (leader, batches) in by_leader {
            self.send(leader, batches)?;
        }
        Ok(())
    }

    fn send(&mut self, leader: i32, batches: Vec<(i32, usize, Vec<u8>)>) -> Result<(), Failure> {
        let counts: HashMap<i32, usize> = batches.iter().map(|(p, n, _)| (*p, *n)).collect();
        let req = ProduceRequest::default()
            .with_acks(self.acks)
            .with_timeout_ms(30_000)
            .with_topic_data(vec![TopicProduceData::default()
                .with_name(topic_name(&self.topic))
                .with_partition_data(
                    batches
                        .into_iter()
                        .map(|(p, _, batch)| {
                            PartitionProduceData::default()
                                .with_index(p)
                                .with_records(Some(batch.into()))
                        })
                        .collect(),
                )]);
        let conn = match self.conns.entry(leader) {
            std::collections::hash_map::Entry::Occupied(c) => c.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let addr = self
                    .leaders
                    .values()
                    .find(|(l, _)| *l == leader)
                    .expect("a leader of ours")
                    .1;
                v.insert(self.s.connect(addr)?)
            }
        };
        if self.acks == 0 {
            conn.send(ApiKey::Produce, self.version, &req)?;
            return Ok(());
        }
        let r: ProduceResponse = conn.call(ApiKey::Produce, self.version, &req)?;
        for p in r.responses.iter().flat_map(|t| &t.partition_responses) {
            Failure::check(
                p.error_code,
                &format!("producing to topic {} partition {}", self.topic, p.index),
                p.error_message.as_deref(),
            )?;
            let sent = self.sent.entry(p.index).or_default();
            sent.first_offset.get_or_insert(p.base_offset);
            let n = counts.get(&p.index).copied().unwrap_or(0) as i64;
            sent.last_offset = Some(p.base_offset + n - 1);
        }
        Ok(())
    }

    fn report(mut self) -> Report {
        let mut t = Table::new(
            None,
            vec!["PARTITION", "RECORDS", "FIRST-OFFSET", "LAST-OFFSET"],
        );
        let show = |o: Option<i64>| o.map_or_else(|| "-".to_string(), |o| o.to_string());
        let mut total = 0;
        for (p, sent) in self.sent.iter_mut() {
            sent.partition = *p;
            total += sent.records;
            t.rows.push(vec![
                p.to_string(),
                sent.records.to_string(),
                show(sent.first_offset),
                show(sent.last_offset),
            ]);
        }
        t.title = Some(format!(
            "{total} record(s) to topic {} (acks {})",
            self.topic,
            if self.acks < 0 {
                "all".to_string()
            } else {
                self.acks.to_string()
            }
        ));
        let partitions: Vec<&Sent> = self.sent.values().collect();
        Report {
            json: serde_json::json!({"topic": self.topic, "records": total, "partitions": partitions}),
            tables: vec![t],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_split_into_key_and_value() {
        assert_eq!(
            split(b"k\tv\tw", Some("\t")),
            (Some(&b"k"[..]), &b"v\tw"[..])
        );
        assert_eq!(split(b"plain", Some("\t")), (None, &b"plain"[..]));
        assert_eq!(split(b"a::b", Some("::")), (Some(&b"a"[..]), &b"b"[..]));
        assert_eq!(split(b"a\tb", None), (None, &b"a\tb"[..]));
        assert_eq!(unescape("\\t"), "\t");
        assert_eq!(parse_acks("all"), Ok(-1));
        assert!(parse_acks("2").is_err());
    }
}
