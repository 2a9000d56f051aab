//! The HTTP stream front end's counters (subscribers, frames encoded and sent, bytes, gaps, slow
//! subscribers, refusals), their plain snapshot and their `/metrics` families. Below
//! [`crate::cores::state`], whose `Core` holds them for [`crate::http`].

use crate::metrics::{core_label, label_value, Exposition};
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;

#[derive(Debug, Default)]
pub struct HttpStats {
    /// Streams open now, and ever opened.
    pub subscribers: Cell<u64>,
    pub subscribers_total: Cell<u64>,
    /// Of the open ones, those read over WebSocket (the rest over SSE).
    pub websocket_subscribers: Cell<u64>,
    /// Batches encoded into a frame (SSE events or WebSocket frames of one format), and frames
    /// written to a subscriber: their ratio is how many subscribers one encoding served.
    pub frames_encoded: Cell<u64>,
    pub frames_sent: Cell<u64>,
    /// Frames encoded for one subscriber alone (a batch it joins in the middle).
    pub frames_private: Cell<u64>,
    pub records_sent: Cell<u64>,
    pub bytes_sent: Cell<u64>,
    /// Subscribers skipped forward past data they could not keep up with (`slow=skip`), and
    /// those disconnected for it.
    pub gaps: Cell<u64>,
    pub slow_disconnects: Cell<u64>,
    /// Requests answered with an error status (bad path or query, unknown topic, refused).
    pub refused: Cell<u64>,
    /// Connections handed to the partition's owner core (this core had no copy of it).
    pub handed_over: Cell<u64>,
    /// TLS handshakes on the stream listener that failed (`--http-tls`).
    pub tls_failures: Cell<u64>,
    /// New connections this core handed to a less busy core.
    pub spread: Cell<u64>,
    /// Streams open now, by the topic (or view) they read.
    pub topics: RefCell<BTreeMap<String, u64>>,
}

impl HttpStats {
    /// A stream of `topic` opened (see [`HttpStats::topic_closed`]).
    pub fn topic_opened(&self, topic: &str) {
        *self
            .topics
            .borrow_mut()
            .entry(topic.to_string())
            .or_default() += 1;
    }

    pub fn topic_closed(&self, topic: &str) {
        let mut topics = self.topics.borrow_mut();
        if let Some(n) = topics.get_mut(topic) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                topics.remove(topic);
            }
        }
    }
}

/// The counters as plain data.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HttpSnapshot {
    pub subscribers: u64,
    pub subscribers_total: u64,
    pub websocket_subscribers: u64,
    pub frames_encoded: u64,
    pub frames_sent: u64,
    pub frames_private: u64,
    pub records_sent: u64,
    pub bytes_sent: u64,
    pub gaps: u64,
    pub slow_disconnects: u64,
    pub refused: u64,
    pub handed_over: u64,
    pub tls_failures: u64,
    pub spread: u64,
    /// Streams open now by topic (or view), those with any.
    pub topics: Vec<(String, u64)>,
}

impl HttpStats {
    pub fn snapshot(&self) -> HttpSnapshot {
        HttpSnapshot {
            subscribers: self.subscribers.get(),
            subscribers_total: self.subscribers_total.get(),
            websocket_subscribers: self.websocket_subscribers.get(),
            frames_encoded: self.frames_encoded.get(),
            frames_sent: self.frames_sent.get(),
            frames_private: self.frames_private.get(),
            records_sent: self.records_sent.get(),
            bytes_sent: self.bytes_sent.get(),
            gaps: self.gaps.get(),
            slow_disconnects: self.slow_disconnects.get(),
            refused: self.refused.get(),
            handed_over: self.handed_over.get(),
            tls_failures: self.tls_failures.get(),
            spread: self.spread.get(),
            topics: self
                .topics
                .borrow()
                .iter()
                .map(|(t, n)| (t.clone(), *n))
                .collect(),
        }
    }
}

impl HttpSnapshot {
    pub fn write_prometheus(out: &mut Exposition, cores: &[(usize, &HttpSnapshot)]) {
        type Read = fn(&HttpSnapshot) -> u64;
        let families: [(&str, &str, &str, Read); 14] = [
            ("shoal_http_subscribers", "gauge", "Topic streams open now (SSE and WebSocket).", |s| s.subscribers),
            ("shoal_http_websocket_subscribers", "gauge", "Topic streams open now over WebSocket.", |s| s.websocket_subscribers),
            ("shoal_http_subscribers_total", "counter", "Topic streams opened.", |s| s.subscribers_total),
            ("shoal_http_frames_encoded_total", "counter", "Batches encoded into a shared frame (one per batch, protocol and format per core).", |s| s.frames_encoded),
            ("shoal_http_frames_sent_total", "counter", "Frames written to subscribers; over frames encoded, the sharing ratio.", |s| s.frames_sent),
            ("shoal_http_frames_private_total", "counter", "Frames encoded for one subscriber alone (a batch joined in the middle).", |s| s.frames_private),
            ("shoal_http_records_sent_total", "counter", "Records written to subscribers.", |s| s.records_sent),
            ("shoal_http_bytes_sent_total", "counter", "Bytes written to subscribers.", |s| s.bytes_sent),
            ("shoal_http_gaps_total", "counter", "Subscribers skipped forward past what they could not keep up with (slow=skip).", |s| s.gaps),
            ("shoal_http_slow_disconnects_total", "counter", "Subscribers disconnected for falling behind (slow=disconnect) or not reading.", |s| s.slow_disconnects),
            ("shoal_http_refused_total", "counter", "Stream requests answered with an error status.", |s| s.refused),
            ("shoal_http_handed_over_total", "counter", "Stream connections handed to the partition's owner core.", |s| s.handed_over),
            ("shoal_http_tls_failures_total", "counter", "TLS handshakes on the stream listener that failed.", |s| s.tls_failures),
            ("shoal_http_spread_total", "counter", "New stream connections handed to a less busy core.", |s| s.spread),
        ];
        for (name, kind, help, read) in families {
            out.family(
                name,
                kind,
                help,
                cores.iter().map(|(core, s)| (core_label(*core), read(s))),
            );
        }
        let by_topic = cores.iter().flat_map(|(core, s)| {
            s.topics.iter().map(move |(topic, n)| {
                let labels = format!("{},topic=\"{}\"", core_label(*core), label_value(topic));
                (labels, *n)
            })
        });
        out.family(
            "shoal_http_topic_subscribers",
            "gauge",
            "Topic streams open now, by the topic (or view) they read.",
            by_topic,
        );
    }
}
