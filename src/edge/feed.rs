//! One partition's upstream fetcher ("feed"), on the core that owns the partition.
//!
//! Started by the first consumer fetch, it long-polls the upstream leader over a connection of its
//! own and appends what it gets to the partition's local log with the upstream's offsets
//! ([`shards::Log::append_mirrored`]), so every consumer at the edge is served from the one copy.
//! It follows leader changes (metadata read again on errors), reconnects with backoff, and stops
//! when no consumer has asked for the partition for `--edge-idle-ms`.
//!
//! Where it starts: at the end of what the log holds when the asking consumer is within it; at the
//! consumer's offset when that is past the log's end (the log starts again there); at the
//! upstream's log start when the upstream has dropped everything the log holds.

use super::upstream::Conn;
use super::FeedStatus;
use super::{fetch_request, fetched_partition, EdgeCore, Standing, FETCH_VERSIONS};
use super::{UpstreamError, OFFSET_OUT_OF_RANGE};
use crate::metrics::add;
use kafka_protocol::messages::{ApiKey, FetchResponse};
use shards::{Log, Records};
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, Instant};

const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

#[derive(Debug)]
pub struct Feed {
    topic: String,
    partition: i32,
    log: Log,
    running: Cell<bool>,
    /// The upstream's (log start, high watermark) as last seen, while the fetcher runs.
    upstream: Cell<Option<(i64, i64)>>,
    last_error: RefCell<Option<String>>,
    /// The upstream's batches could not be kept: consumers read through.
    broken: Cell<bool>,
    /// Consumers want the partition until then: the last fetch, or the deadline of the longest
    /// long poll parked on it.
    wanted_until: Cell<Instant>,
}

impl Feed {
    pub fn new(topic: &str, partition: i32, log: Log) -> Self {
        Self {
            topic: topic.to_string(),
            partition,
            log,
            running: Cell::new(false),
            upstream: Cell::new(None),
            last_error: RefCell::new(None),
            broken: Cell::new(false),
            wanted_until: Cell::new(Instant::now()),
        }
    }

    /// A consumer asks for the partition now, and may wait for it until `until`.
    pub fn touch(&self, until: Instant) {
        let until = until.max(Instant::now());
        if until > self.wanted_until.get() {
            self.wanted_until.set(until);
        }
    }

    pub fn is_running(&self) -> bool {
        self.running.get()
    }

    pub fn log_is_closed(&self) -> bool {
        self.log.is_closed()
    }

    pub fn status(&self) -> FeedStatus {
        let (start, hw) = self.upstream.get().unwrap_or((-1, -1));
        FeedStatus {
            fetching: self.running.get(),
            position: self.log.high_watermark(),
            upstream_log_start_offset: start,
            upstream_high_watermark: hw,
            last_error: self.last_error.borrow().clone(),
        }
    }

    /// How to serve a consumer at `offset`: from the local log (past its end, the consumer waits
    /// for the fetcher, as long as the offset is within the upstream's range as the fetcher last
    /// saw it, or that range is not known yet), else by a read-through.
    pub fn standing(&self, offset: i64) -> Standing {
        let (start, end) = (self.log.log_start_offset(), self.log.high_watermark());
        if offset < start || self.broken.get() {
            return Standing::Upstream;
        }
        if offset > end {
            if let Some((up_start, up_end)) = self.upstream.get() {
                if offset < up_start || offset > up_end {
                    return Standing::Upstream;
                }
            }
        }
        Standing::Local
    }

    /// Starts the fetcher, for a consumer at `offset`.
    pub fn start(self: Rc<Self>, edge: Rc<EdgeCore>, offset: i64) {
        if self.running.replace(true) {
            return;
        }
        self.broken.set(false);
        glommio::spawn_local(async move {
            log::info!(
                "core {}: fetching {}-{} from upstream",
                edge.core,
                self.topic,
                self.partition
            );
            self.run(&edge, offset).await;
            self.running.set(false);
            self.upstream.set(None);
            if self.log.is_closed() {
                edge.drop_feed(self.log.id());
            }
            log::info!(
                "core {}: stopped fetching {}-{} at offset {}",
                edge.core,
                self.topic,
                self.partition,
                self.log.high_watermark()
            );
        })
        .detach();
    }

    /// No consumer asked for the partition for `--edge-idle-ms`, and none is waiting for it.
    fn idle(&self, edge: &EdgeCore) -> bool {
        Instant::now().saturating_duration_since(self.wanted_until.get()) > edge.config.idle
    }

    fn failed(&self, edge: &EdgeCore, why: UpstreamError) {
        edge.error(&format!("fetch of {}-{}", self.topic, self.partition), &why);
        *self.last_error.borrow_mut() = Some(why);
    }

    /// Whether the fetcher should go on: wanted, the server running, the log open.
    fn goes_on(&self, edge: &EdgeCore) -> bool {
        !self.idle(edge) && !edge.is_shutting_down() && !self.log.is_closed()
    }

    async fn run(&self, edge: &EdgeCore, first_offset: i64) {
        let mut backoff = FIRST_BACKOFF;
        let mut placed = false;
        let mut conn: Option<Conn> = None;
        while self.goes_on(edge) {
            let step = if placed {
                self.fetch_once(edge, &mut conn).await
            } else {
                self.place(edge, first_offset).await.map(|()| placed = true)
            };
            match step {
                Ok(()) => {
                    backoff = FIRST_BACKOFF;
                    *self.last_error.borrow_mut() = None;
                }
                Err(why) => {
                    conn = None;
                    self.failed(edge, why);
                    if self.broken.get() {
                        break;
                    }
                    let _ = edge.refresh(false).await;
                    let wait = glommio::timer::sleep(backoff);
                    edge.shutdown().unless_reached(1, wait).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }

    /// Decides where the fetcher starts (see the module docs), moving the log there if needed.
    async fn place(&self, edge: &EdgeCore, wanted: i64) -> Result<(), UpstreamError> {
        let (up_start, up_end) = edge.offsets(&self.topic, self.partition).await?;
        self.upstream.set(Some((up_start, up_end)));
        let (start, end) = (self.log.log_start_offset(), self.log.high_watermark());
        if end > up_end {
            // Retried with backoff, like any failure: the upstream lost what the edge holds.
            return Err(format!(
                "the edge holds {}-{} up to offset {end} but the upstream ends at {up_end} \
                 (truncated upstream?); waiting for it to pass {end}",
                self.topic, self.partition
            ));
        }
        // Where the consumer is, if that is past what the edge holds and the upstream has it;
        // else on from the edge's end, unless the upstream no longer has that.
        let to = if wanted > end && (up_start..=up_end).contains(&wanted) {
            Some(wanted)
        } else if end < up_start {
            Some(up_start)
        } else {
            None
        };
        if let Some(to) = to {
            self.log
                .restart_at(to)
                .await
                .map_err(|e| format!("restarting the local log at {to}: {e}"))?;
        }
        log::debug!(
            "{}-{}: upstream {up_start}..{up_end}, local {start}..{end}, fetching from {}",
            self.topic,
            self.partition,
            self.log.high_watermark()
        );
        Ok(())
    }

    /// One long-polling fetch at the local high watermark, appended to the log.
    async fn fetch_once(
        &self,
        edge: &EdgeCore,
        conn: &mut Option<Conn>,
    ) -> Result<(), UpstreamError> {
        if conn.is_none() {
            let leader = edge.leader(&self.topic, self.partition).await?;
            *conn = Some(Conn::connect(&leader, edge.client_id()).await?);
        }
        let c = conn.as_mut().expect("connected above");
        let version = c.version(ApiKey::Fetch, FETCH_VERSIONS)?;
        let offset = self.log.high_watermark();
        let wait = edge.config.fetch_wait;
        let request = fetch_request(
            &self.topic,
            self.partition,
            offset,
            edge.config.fetch_bytes,
            wait,
            1,
            false,
        );
        let response: FetchResponse = c
            .call(
                ApiKey::Fetch,
                version,
                &request,
                wait + super::REQUEST_TIMEOUT,
            )
            .await?;
        let p = fetched_partition(response, &c.addr, &self.topic, self.partition)?;
        add(&edge.metrics.upstream_fetches, 1);
        match p.error_code {
            0 => {}
            OFFSET_OUT_OF_RANGE => {
                // The upstream no longer has (or never had) this offset: place the fetcher again.
                self.place(edge, offset).await?;
                return Ok(());
            }
            code => {
                return Err(format!(
                    "{}: fetch {}-{} at {offset}: error {code}",
                    c.addr, self.topic, self.partition
                ))
            }
        }
        self.upstream
            .set(Some((p.log_start_offset, p.high_watermark)));
        let records = Records::whole_batches(p.records.unwrap_or_default());
        if records.is_empty() {
            return Ok(());
        }
        // The upstream answers from the batch holding the offset. After a restart at a
        // consumer's offset inside a batch, the log starts again after that batch (the consumer is
        // then served that batch by a read-through); batches before the offset are already here.
        let mut offset = offset;
        let straddling = records
            .batch_headers()
            .find(|h| h.base_offset < offset && h.last_offset() >= offset);
        if let Some(h) = straddling {
            let next = h.last_offset() + 1;
            if self.log.log_start_offset() != offset {
                // The edge's end is a batch boundary upstream unless the upstream changed.
                return Err(format!(
                    "{}-{}: the upstream's batch {}..={} straddles the edge's end {offset}",
                    self.topic,
                    self.partition,
                    h.base_offset,
                    h.last_offset()
                ));
            }
            self.log
                .restart_at(next)
                .await
                .map_err(|e| format!("restarting the local log at {next}: {e}"))?;
            offset = next;
        }
        // The batches from `offset` on: the rest of the response's one buffer, not a copy.
        let skip: usize = records
            .batches()
            .take_while(|(h, _)| h.base_offset < offset)
            .map(|(_, b)| b.len())
            .sum();
        if skip == records.len {
            // Only the batch straddling a restart point: nothing after it yet.
            return Ok(());
        }
        let blob = records.parts[0].slice(skip..records.len);
        add(&edge.metrics.upstream_bytes, blob.len() as u64);
        match self.log.append_mirrored(blob).await {
            Ok(_) => Ok(()),
            Err(shards::Error::InvalidBatch(why)) => {
                // Batches the edge cannot keep (an old message format, a bad CRC): its consumers
                // are served by read-through instead, until the fetcher starts again.
                self.broken.set(true);
                log::error!(
                    "{}-{}: the upstream's batches at offset {offset} cannot be kept at the edge \
                     ({why}); its consumers read through to the upstream",
                    self.topic,
                    self.partition
                );
                Err(format!(
                    "cannot keep the upstream's batches at {offset}: {why}"
                ))
            }
            Err(e) => Err(format!("appending to the local log: {e}")),
        }
    }
}
