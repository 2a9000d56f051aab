//! A consumer: one connection, fetches from its own offset, walks batch headers, checks offsets
//! follow on, and samples end-to-end latency.

use super::executors::{connect, setup_over, ClientCfg, ConsumerPlan, DoneOnDrop, Reporter};
use crate::bench::client;
use crate::bench::client::{embedded_timestamp, embedded_timestamp_compressed, FetchTemplate};
use crate::bench::stats::{now_us, record, Hists, Phase, Shared};
use futures_lite::AsyncWriteExt;
use shards::batch::BatchHeader;
use shoal::wire::fetch::decode::{read_fetch_response, BatchVisitor, FrameReader};
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

/// Walks the batches of one consumer's fetch responses.
pub(super) struct Visitor {
    pub(super) next: i64,
    pub(super) modulus: Option<i64>,
    pub(super) records: u64,
    pub(super) bytes: u64,
    pub(super) gaps: u64,
    pub(super) gap_offsets: u64,
    pub(super) sample_latency: bool,
    pub(super) measuring: bool,
    /// A compressed batch was already decompressed for a sample in this response.
    pub(super) sampled_compressed: bool,
    pub(super) epoch_us: u64,
    pub(super) hists: Rc<RefCell<Hists>>,
}

impl Visitor {
    pub(super) fn sample(&self, ts: u64) {
        // Batches from before this run (an old topic read from the start) tell nothing.
        if ts < self.epoch_us {
            return;
        }
        let lat = now_us().saturating_sub(ts);
        let mut h = self.hists.borrow_mut();
        record(&mut h.e2e_interval, lat);
        if self.measuring {
            record(&mut h.e2e, lat);
        }
    }
}

impl BatchVisitor for Visitor {
    fn batch(&mut self, h: &BatchHeader, head: &[u8]) -> bool {
        let total = h.total_len() as u64;
        match self.modulus {
            Some(m) => {
                // Raw baseline: the server's memory holds offsets 0..m and wraps.
                if h.base_offset.rem_euclid(m) != self.next.rem_euclid(m) {
                    self.gaps += 1;
                }
                self.next += h.offset_count();
                self.records += h.record_count.max(0) as u64;
            }
            None => {
                let last = h.last_offset();
                if last < self.next {
                    return false; // an older batch (the fetch offset was inside it or before)
                }
                if h.base_offset > self.next {
                    self.gaps += 1;
                    self.gap_offsets += (h.base_offset - self.next) as u64;
                }
                if !h.is_control() {
                    self.records += if h.base_offset < self.next {
                        (last - self.next + 1) as u64
                    } else {
                        h.record_count.max(0) as u64
                    };
                }
                self.next = last + 1;
            }
        }
        self.bytes += total;
        if !self.sample_latency || h.is_control() {
            return false;
        }
        if h.compression() == 0 {
            if let Some(ts) = embedded_timestamp(head) {
                self.sample(ts);
            }
            false
        } else if !self.sampled_compressed {
            self.sampled_compressed = true;
            true
        } else {
            false
        }
    }

    fn whole_batch(&mut self, h: &BatchHeader, batch: &[u8]) {
        if let Some(ts) = embedded_timestamp_compressed(batch, h) {
            self.sample(ts);
        }
    }
}

pub(super) async fn consumer(
    cfg: Arc<ClientCfg>,
    shared: Arc<Shared>,
    plan: ConsumerPlan,
    hists: Rc<RefCell<Hists>>,
) {
    let stats = &shared.consumers[plan.id];
    let _done = DoneOnDrop(&stats.done);
    let report = Reporter {
        shared: &shared,
        who: format!(
            "consumer {} ({} partition {})",
            plan.id, plan.topic, plan.partition
        ),
        errors: &stats.errors,
        failed: Some(&stats.failed),
    };
    let part = plan.partition as usize;
    let stream = connect(plan.leader).await;
    // Counted whether it connected or not: the run waits for every consumer's attempt.
    shared.consumers_ready.fetch_add(1, Relaxed);
    let mut stream = match stream {
        Ok(s) => s,
        Err(e) => return report.fail(e),
    };
    let mut template = match FetchTemplate::new(
        &plan.topic,
        plan.partition,
        cfg.fetch_version,
        cfg.fetch_max_wait,
        cfg.fetch_max_bytes,
    ) {
        Ok(t) => t,
        Err(e) => return report.fail(e),
    };
    let mut reader = FrameReader::new(cfg.receive_buffer);
    let mut scratch = Vec::new();
    let mut v = Visitor {
        next: stats.start_offset.load(Relaxed),
        modulus: cfg.modulus,
        records: 0,
        bytes: 0,
        gaps: 0,
        gap_offsets: 0,
        sample_latency: cfg.sample_latency,
        measuring: false,
        sampled_compressed: false,
        epoch_us: shared.epoch_us,
        hists,
    };
    setup_over(&shared).await;
    let mut correlation = 0i32;
    loop {
        let phase = shared.phase();
        if phase == Phase::Stop || v.next >= shared.drain_target[part].load(Relaxed) {
            break;
        }
        correlation = correlation.wrapping_add(1);
        let sent = match stream.write_all(template.frame(correlation, v.next)).await {
            Ok(()) => stream.flush().await,
            Err(e) => Err(e),
        };
        if let Err(e) = sent {
            report.fail(format!("sending a fetch: {e}"));
            break;
        }
        v.measuring = phase == Phase::Measure;
        v.sampled_compressed = false;
        let (records, bytes) = (v.records, v.bytes);
        let outcome = read_fetch_response(
            &mut reader,
            &mut stream,
            cfg.fetch_version,
            correlation,
            &mut v,
            &mut scratch,
        )
        .await;
        stats.records.fetch_add(v.records - records, Relaxed);
        stats.bytes.fetch_add(v.bytes - bytes, Relaxed);
        stats.position.store(v.next, Relaxed);
        stats.gaps.store(v.gaps, Relaxed);
        stats.gap_offsets.store(v.gap_offsets, Relaxed);
        match outcome {
            Err(e) => {
                report.fail(format!("reading a fetch response: {e}"));
                break;
            }
            Ok(o) => {
                stats.fetches.fetch_add(1, Relaxed);
                if cfg.modulus.is_none() && o.high_watermark >= 0 {
                    shared.note_end(part, o.high_watermark);
                }
                match o.error_code {
                    0 => {}
                    client::OFFSET_OUT_OF_RANGE => {
                        report.fail(format!("offset {} out of range", v.next));
                        break;
                    }
                    code => {
                        // NOT_LEADER_OR_FOLLOWER and the like: leaders do not move under an
                        // embedded shoal; count it and retry after a pause.
                        report.error(format!("fetch error {code}"));
                        glommio::timer::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        }
    }
}
