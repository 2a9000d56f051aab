//! What `shoal consume` does with a partition's fetched bytes: record batches decompressed and
//! decoded (`shards::batch`), control batches skipped, aborted transactions' records dropped under
//! read_committed; and each record printed by a kcat-style template or as a JSON line.

use kafka_protocol::messages::fetch_response::AbortedTransaction;
use shards::batch::{self, BatchHeader, HEADER_LEN};
use std::collections::HashSet;
use std::io::Write;

/// One record as fetched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    pub offset: i64,
    pub timestamp: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

/// A partition's fetched bytes, decoded: the records at or after `from` and the offset to fetch
/// next (past every whole batch, control and aborted ones included).
#[derive(Debug, Default)]
pub struct Decoded {
    pub records: Vec<Fetched>,
    pub next: i64,
}

/// The producers whose transactions in the fetched range were aborted (read_committed), as the
/// Java client tracks them: a producer joins at its aborted transaction's first offset and leaves
/// at the control batch that ends it.
struct Aborted {
    pending: Vec<(i64, i64)>,
    active: HashSet<i64>,
}

impl Aborted {
    fn new(list: Option<&[AbortedTransaction]>) -> Aborted {
        let mut pending: Vec<(i64, i64)> = list
            .unwrap_or_default()
            .iter()
            .map(|a| (a.first_offset, a.producer_id.0))
            .collect();
        // Latest first: `pop` takes the earliest.
        pending.sort_by(|a, b| b.cmp(a));
        Aborted {
            pending,
            active: HashSet::new(),
        }
    }

    /// Whether batch `h`'s records are to be dropped.
    fn drops(&mut self, h: &BatchHeader) -> bool {
        while self
            .pending
            .last()
            .is_some_and(|(first, _)| *first <= h.last_offset())
        {
            let (_, producer) = self.pending.pop().expect("a last one");
            self.active.insert(producer);
        }
        if h.is_control() {
            self.active.remove(&h.producer_id);
            return true;
        }
        h.is_transactional() && self.active.contains(&h.producer_id)
    }
}

/// Decodes the batches in `bytes` (a partial batch at the end is left for the next fetch).
pub fn decode(
    bytes: &[u8],
    from: i64,
    aborted: Option<&[AbortedTransaction]>,
) -> Result<Decoded, String> {
    let mut out = Decoded {
        records: Vec::new(),
        next: from,
    };
    let mut aborted = Aborted::new(aborted);
    let mut at = 0;
    while bytes.len() - at >= HEADER_LEN {
        let rest = &bytes[at..];
        let Some(total) = batch::peek_total_len(rest).filter(|t| *t <= rest.len()) else {
            break;
        };
        let whole = &rest[..total];
        at += total;
        let h = BatchHeader::parse(whole).map_err(|e| format!("a record batch: {e:?}"))?;
        if h.last_offset() < from {
            continue;
        }
        out.next = out.next.max(h.last_offset() + 1);
        if aborted.drops(&h) {
            continue;
        }
        for r in plain_records(&h, whole)? {
            if r.offset >= from {
                out.records.push(r);
            }
        }
    }
    Ok(out)
}

/// The records of one batch, decompressed when it is compressed.
fn plain_records(h: &BatchHeader, whole: &[u8]) -> Result<Vec<Fetched>, String> {
    let bad = |e: shards::error::InvalidBatch| format!("batch at offset {}: {e:?}", h.base_offset);
    let plain = batch::records_section(h, whole).map_err(bad)?;
    // An uncompressed copy of the batch: its header (codec cleared, length fixed), then the
    // records as decompressed, for `batch::records` to read.
    let mut copy = Vec::with_capacity(HEADER_LEN + plain.len());
    copy.extend_from_slice(&whole[..HEADER_LEN]);
    copy.extend_from_slice(&plain);
    let length = (copy.len() - batch::LOG_OVERHEAD) as i32;
    copy[8..12].copy_from_slice(&length.to_be_bytes());
    copy[22] &= !0x07;
    let records = batch::records(&copy).map_err(bad)?;
    Ok(records
        .into_iter()
        .map(|r| Fetched {
            offset: r.offset,
            timestamp: r.timestamp,
            key: r.key.map(<[u8]>::to_vec),
            value: r.value.map(<[u8]>::to_vec),
            headers: r
                .headers
                .iter()
                .map(|(k, v)| (k.to_vec(), v.map(<[u8]>::to_vec)))
                .collect(),
        })
        .collect())
}

/// One piece of a kcat-style output template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Text(Vec<u8>),
    Topic,
    Partition,
    Offset,
    Key,
    Value,
    Timestamp,
    Headers,
    KeyLength,
    ValueLength,
}

/// How records are printed: a template (`%s\n`) or one JSON object per line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Printer {
    Template(Vec<Piece>),
    Json,
}

impl Printer {
    /// `json`, or a template: `%t` topic, `%p` partition, `%o` offset, `%k` key, `%s` value,
    /// `%T` timestamp (ms), `%h` headers (`k=v,...`), `%K`/`%S` key/value length, `%%`; escapes
    /// `\n`, `\t`, `\r`, `\\`.
    pub fn parse(template: &str) -> Printer {
        if template == "json" {
            return Printer::Json;
        }
        let mut pieces = Vec::new();
        let mut text = Vec::new();
        let mut chars = template.chars();
        while let Some(c) = chars.next() {
            let piece = match c {
                '%' => match chars.next() {
                    Some('t') => Piece::Topic,
                    Some('p') => Piece::Partition,
                    Some('o') => Piece::Offset,
                    Some('k') => Piece::Key,
                    Some('s') => Piece::Value,
                    Some('T') => Piece::Timestamp,
                    Some('h') => Piece::Headers,
                    Some('K') => Piece::KeyLength,
                    Some('S') => Piece::ValueLength,
                    other => {
                        text.push(b'%');
                        push_char(&mut text, other.filter(|c| *c != '%'));
                        continue;
                    }
                },
                '\\' => {
                    let escaped = match chars.next() {
                        Some('n') => Some('\n'),
                        Some('t') => Some('\t'),
                        Some('r') => Some('\r'),
                        Some('\\') => Some('\\'),
                        other => {
                            text.push(b'\\');
                            other
                        }
                    };
                    push_char(&mut text, escaped);
                    continue;
                }
                c => {
                    push_char(&mut text, Some(c));
                    continue;
                }
            };
            if !text.is_empty() {
                pieces.push(Piece::Text(std::mem::take(&mut text)));
            }
            pieces.push(piece);
        }
        if !text.is_empty() {
            pieces.push(Piece::Text(text));
        }
        Printer::Template(pieces)
    }

    /// Writes record `r` of `topic` partition `partition`.
    pub fn print(
        &self,
        out: &mut impl Write,
        topic: &str,
        partition: i32,
        r: &Fetched,
    ) -> std::io::Result<()> {
        let pieces = match self {
            Printer::Json => {
                serde_json::to_writer(&mut *out, &json(topic, partition, r))?;
                return out.write_all(b"\n");
            }
            Printer::Template(pieces) => pieces,
        };
        let len = |b: &Option<Vec<u8>>| b.as_ref().map_or(-1, |b| b.len() as i64);
        for p in pieces {
            match p {
                Piece::Text(t) => out.write_all(t)?,
                Piece::Topic => out.write_all(topic.as_bytes())?,
                Piece::Partition => write!(out, "{partition}")?,
                Piece::Offset => write!(out, "{}", r.offset)?,
                Piece::Key => out.write_all(r.key.as_deref().unwrap_or_default())?,
                Piece::Value => out.write_all(r.value.as_deref().unwrap_or_default())?,
                Piece::Timestamp => write!(out, "{}", r.timestamp)?,
                Piece::KeyLength => write!(out, "{}", len(&r.key))?,
                Piece::ValueLength => write!(out, "{}", len(&r.value))?,
                Piece::Headers => {
                    for (i, (k, v)) in r.headers.iter().enumerate() {
                        if i > 0 {
                            out.write_all(b",")?;
                        }
                        out.write_all(k)?;
                        out.write_all(b"=")?;
                        out.write_all(v.as_deref().unwrap_or_default())?;
                    }
                }
            }
        }
        Ok(())
    }
}

fn push_char(text: &mut Vec<u8>, c: Option<char>) {
    if let Some(c) = c {
        let mut buf = [0u8; 4];
        text.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
    }
}

/// A record as one JSON object; bytes as text (invalid UTF-8 replaced), a missing key as null.
fn json(topic: &str, partition: i32, r: &Fetched) -> serde_json::Value {
    let text = |b: &Option<Vec<u8>>| {
        b.as_deref()
            .map(|b| String::from_utf8_lossy(b).into_owned())
    };
    serde_json::json!({
        "topic": topic,
        "partition": partition,
        "offset": r.offset,
        "timestamp": r.timestamp,
        "key": text(&r.key),
        "value": text(&r.value),
        "headers": r.headers.iter().map(|(k, v)| serde_json::json!({
            "key": String::from_utf8_lossy(k),
            "value": text(v),
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use shards::batch::BatchBuilder;

    fn record(offset: i64) -> Fetched {
        Fetched {
            offset,
            timestamp: 7,
            key: Some(b"k".to_vec()),
            value: Some(b"v".to_vec()),
            headers: vec![(b"a".to_vec(), Some(b"1".to_vec())), (b"b".to_vec(), None)],
        }
    }

    fn printed(template: &str, r: &Fetched) -> String {
        let mut out = Vec::new();
        Printer::parse(template).print(&mut out, "t", 3, r).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn templates_print_like_kcat() {
        let r = record(42);
        assert_eq!(printed("%s\\n", &r), "v\n");
        assert_eq!(
            printed("%t/%p@%o %k=%s [%h] %T %K %S%%\\t\\x", &r),
            "t/3@42 k=v [a=1,b=] 7 1 1%\t\\x"
        );
        let j: serde_json::Value = serde_json::from_str(&printed("json", &r)).unwrap();
        assert_eq!(j["offset"], 42);
        assert_eq!(j["headers"][1]["value"], serde_json::Value::Null);
    }

    /// Five records at offsets 10 to 14.
    fn five() -> Vec<u8> {
        let mut b = BatchBuilder::new(100);
        for i in 0..5 {
            let v = format!("v{i}");
            b.push(
                100 + i,
                Some(b"k"),
                Some(v.as_bytes()),
                &[(b"h", Some(b"x"))],
            );
        }
        b.finish(10)
    }

    /// A batch of `values` from `producer` at `base`, with `attributes` set.
    fn batch_of(producer: i64, base: i64, attributes: i16, values: &[&str]) -> Vec<u8> {
        let mut b = BatchBuilder::new(0).producer(producer, 0, 0);
        for v in values {
            b.push(0, None, Some(v.as_bytes()), &[]);
        }
        let mut bytes = b.finish(base);
        bytes[21..23].copy_from_slice(&attributes.to_be_bytes());
        bytes
    }

    #[test]
    fn aborted_transactions_and_control_batches_are_skipped() {
        const TRANSACTIONAL: i16 = 0x10;
        const CONTROL: i16 = 0x20;
        let mut bytes = batch_of(7, 0, TRANSACTIONAL, &["aborted-1", "aborted-2"]);
        bytes.extend(batch_of(8, 2, 0, &["plain"]));
        bytes.extend(batch_of(7, 3, TRANSACTIONAL | CONTROL, &["marker"]));
        bytes.extend(batch_of(7, 4, TRANSACTIONAL, &["committed"]));
        let values = |d: &Decoded| -> Vec<String> {
            d.records
                .iter()
                .map(|r| String::from_utf8(r.value.clone().unwrap()).unwrap())
                .collect()
        };
        let aborted = [AbortedTransaction::default()
            .with_producer_id(kafka_protocol::messages::ProducerId(7))
            .with_first_offset(0)];
        let committed = decode(&bytes, 0, Some(&aborted)).unwrap();
        assert_eq!(values(&committed), ["plain", "committed"]);
        assert_eq!(committed.next, 5);
        // read_uncommitted: every record but the marker.
        let all = decode(&bytes, 0, None).unwrap();
        assert_eq!(
            values(&all),
            ["aborted-1", "aborted-2", "plain", "committed"]
        );
    }

    #[test]
    fn compressed_batches_decode_from_an_offset_within_them() {
        for codec in [0, 1, 2, 3, 4] {
            let bytes = batch::compress_batch(&five(), codec);
            let d = decode(&bytes, 12, None).unwrap();
            assert_eq!(d.next, 15, "codec {codec}");
            let values: Vec<_> = d.records.iter().map(|r| r.value.clone().unwrap()).collect();
            assert_eq!(values, [b"v2".to_vec(), b"v3".to_vec(), b"v4".to_vec()]);
            assert_eq!(d.records[0].offset, 12);
            assert_eq!(d.records[0].timestamp, 102);
            assert_eq!(d.records[0].headers, [(b"h".to_vec(), Some(b"x".to_vec()))]);
        }
        // A partial batch at the end is left for later.
        let bytes = five();
        let d = decode(&bytes[..bytes.len() - 1], 0, None).unwrap();
        assert_eq!((d.records.len(), d.next), (0, 0));
    }
}
