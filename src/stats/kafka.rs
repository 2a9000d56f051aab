//! The Kafka front end's counters (requests, errors and durations per API, bytes, connections,
//! protocol errors, handler panics, SASL, TLS, fetch bytes, pacing and sessions), their plain snapshot and
//! their `/metrics` families. Below [`crate::cores::state`], whose `Core` holds them for the
//! connections and handlers of [`crate::kafka`].

use crate::metrics::{add, core_label, DurationHistogram, DurationSnapshot, Exposition, Family};
use std::cell::Cell;

/// Kafka API keys we count; index = API key.
pub const MAX_API_KEY: usize = 80;

#[derive(Debug)]
pub struct FrontEndStats {
    pub requests: Vec<Cell<u64>>,
    pub errors: Vec<Cell<u64>>,
    /// Per API key: from the request read to its response written (or handed to the next
    /// response's write, which sends both).
    pub durations: Vec<DurationHistogram>,
    pub bytes_in: Cell<u64>,
    pub bytes_out: Cell<u64>,
    /// Writes of response bytes to connections (pipelined responses ready together share one).
    pub response_writes: Cell<u64>,
    pub connections_open: Cell<u64>,
    pub connections_total: Cell<u64>,
    /// Open connections that have sent a Fetch (an edge in front of this broker keeps one per
    /// partition it serves, however many consumers read there).
    pub fetch_connections: Cell<u64>,
    pub protocol_errors: Cell<u64>,
    /// Requests whose handling panicked (each closed its connection).
    pub handler_panics: Cell<u64>,
    /// SASL authentications that succeeded, and that failed.
    pub authentications: Cell<u64>,
    pub authentication_failures: Cell<u64>,
    /// TLS handshakes that failed (untrusted or expired certificates, plaintext clients, timeouts).
    pub tls_handshake_failures: Cell<u64>,
    /// TLS connections whose records the kernel encrypts (kTLS), and those rustls encrypts.
    pub tls_kernel_connections: Cell<u64>,
    pub tls_user_space_connections: Cell<u64>,
    /// Record bytes fetches read from the log (coalesced reads count once).
    pub fetch_log_read_bytes: Cell<u64>,
    /// Record bytes put in fetch responses.
    pub fetch_response_bytes: Cell<u64>,
    /// Long polls that waited for fetch pacing after new data arrived, and the time they waited.
    pub fetch_paced: Cell<u64>,
    pub fetch_paced_us: Cell<u64>,
    /// Incremental fetch sessions the core holds (a gauge), and those evicted for new ones.
    pub fetch_sessions: Cell<u64>,
    pub fetch_session_evictions: Cell<u64>,
    /// Fetches answered in full (sessionless or starting a session), and incrementally.
    pub fetch_full: Cell<u64>,
    pub fetch_incremental: Cell<u64>,
}

impl Default for FrontEndStats {
    fn default() -> Self {
        Self {
            requests: (0..MAX_API_KEY).map(|_| Cell::new(0)).collect(),
            errors: (0..MAX_API_KEY).map(|_| Cell::new(0)).collect(),
            durations: (0..MAX_API_KEY)
                .map(|_| DurationHistogram::default())
                .collect(),
            bytes_in: Cell::new(0),
            bytes_out: Cell::new(0),
            response_writes: Cell::new(0),
            connections_open: Cell::new(0),
            connections_total: Cell::new(0),
            fetch_connections: Cell::new(0),
            protocol_errors: Cell::new(0),
            handler_panics: Cell::new(0),
            authentications: Cell::new(0),
            authentication_failures: Cell::new(0),
            tls_handshake_failures: Cell::new(0),
            tls_kernel_connections: Cell::new(0),
            tls_user_space_connections: Cell::new(0),
            fetch_log_read_bytes: Cell::new(0),
            fetch_response_bytes: Cell::new(0),
            fetch_paced: Cell::new(0),
            fetch_paced_us: Cell::new(0),
            fetch_sessions: Cell::new(0),
            fetch_session_evictions: Cell::new(0),
            fetch_full: Cell::new(0),
            fetch_incremental: Cell::new(0),
        }
    }
}

impl FrontEndStats {
    pub fn request(&self, api_key: i16) {
        if let Some(c) = self.requests.get(api_key as usize) {
            add(c, 1);
        }
    }
    pub fn error(&self, api_key: i16) {
        if let Some(c) = self.errors.get(api_key as usize) {
            add(c, 1);
        }
    }
    pub fn duration(&self, api_key: i16, d: std::time::Duration) {
        if let Some(h) = self.durations.get(api_key as usize) {
            h.record(d);
        }
    }

    pub fn snapshot(&self) -> FrontEndSnapshot {
        FrontEndSnapshot {
            apis: (0..self.requests.len())
                .filter(|&k| self.requests[k].get() > 0)
                .map(|k| (k as i16, self.requests[k].get(), self.errors[k].get()))
                .collect(),
            durations: (0..self.durations.len())
                .map(|k| (k as i16, self.durations[k].snapshot()))
                .filter(|(_, d)| d.count() > 0)
                .collect(),
            bytes_in: self.bytes_in.get(),
            bytes_out: self.bytes_out.get(),
            response_writes: self.response_writes.get(),
            connections_open: self.connections_open.get(),
            connections_total: self.connections_total.get(),
            fetch_connections: self.fetch_connections.get(),
            protocol_errors: self.protocol_errors.get(),
            handler_panics: self.handler_panics.get(),
            authentications: self.authentications.get(),
            authentication_failures: self.authentication_failures.get(),
            tls_handshake_failures: self.tls_handshake_failures.get(),
            tls_kernel_connections: self.tls_kernel_connections.get(),
            tls_user_space_connections: self.tls_user_space_connections.get(),
            fetch_log_read_bytes: self.fetch_log_read_bytes.get(),
            fetch_response_bytes: self.fetch_response_bytes.get(),
            fetch_paced: self.fetch_paced.get(),
            fetch_paced_us: self.fetch_paced_us.get(),
            fetch_sessions: self.fetch_sessions.get(),
            fetch_session_evictions: self.fetch_session_evictions.get(),
            fetch_full: self.fetch_full.get(),
            fetch_incremental: self.fetch_incremental.get(),
        }
    }
}

/// The front end's counters on one core, as plain data that can cross to core 0.
#[derive(Debug, Clone, Default)]
pub struct FrontEndSnapshot {
    /// (API key, requests, errors) for keys with any traffic.
    pub apis: Vec<(i16, u64, u64)>,
    /// (API key, durations) for keys with any request answered.
    pub durations: Vec<(i16, DurationSnapshot)>,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub response_writes: u64,
    pub connections_open: u64,
    pub connections_total: u64,
    pub fetch_connections: u64,
    pub protocol_errors: u64,
    pub handler_panics: u64,
    pub authentications: u64,
    pub authentication_failures: u64,
    pub tls_handshake_failures: u64,
    pub tls_kernel_connections: u64,
    pub tls_user_space_connections: u64,
    pub fetch_log_read_bytes: u64,
    pub fetch_response_bytes: u64,
    pub fetch_paced: u64,
    pub fetch_paced_us: u64,
    pub fetch_sessions: u64,
    pub fetch_session_evictions: u64,
    pub fetch_full: u64,
    pub fetch_incremental: u64,
}

const REQUEST_DURATION: &str = "shoal_kafka_request_duration_seconds";

/// The front end's families with one sample per core.
const PER_CORE: [Family<FrontEndSnapshot>; 21] = [
    ("bytes_in_total", "counter", "Request bytes received.", |s| s.bytes_in),
    ("bytes_out_total", "counter", "Response bytes sent.", |s| s.bytes_out),
    ("response_writes_total", "counter", "Writes of responses to connections: pipelined responses ready together go out in one.", |s| s.response_writes),
    ("connections_open", "gauge", "Open Kafka connections.", |s| s.connections_open),
    ("connections_total", "counter", "Kafka connections accepted.", |s| s.connections_total),
    ("fetch_connections", "gauge", "Open Kafka connections that have sent a Fetch.", |s| s.fetch_connections),
    ("protocol_errors_total", "counter", "Connections closed for bad frames or requests.", |s| s.protocol_errors),
    ("handler_panics_total", "counter", "Requests whose handling panicked; each closed its connection, the core went on serving.", |s| s.handler_panics),
    ("sasl_authentications_total", "counter", "Connections that authenticated with SASL.", |s| s.authentications),
    ("sasl_authentication_failures_total", "counter", "SASL authentications that failed (wrong password, unknown user, too many failures from the address, malformed tokens).", |s| s.authentication_failures),
    ("tls_handshake_failures_total", "counter", "TLS handshakes on the Kafka listener that failed (untrusted or expired client certificates, plaintext clients, timeouts).", |s| s.tls_handshake_failures),
    ("tls_kernel_connections_total", "counter", "TLS connections whose records the kernel encrypts and decrypts after the handshake (kTLS).", |s| s.tls_kernel_connections),
    ("tls_user_space_connections_total", "counter", "TLS connections encrypted in user space by rustls (--tls-kernel off, or a kernel without kernel TLS).", |s| s.tls_user_space_connections),
    ("fetch_log_read_bytes_total", "counter", "Record bytes fetches read from the log (a coalesced read counts once).", |s| s.fetch_log_read_bytes),
    ("fetch_response_bytes_total", "counter", "Record bytes sent to consumers in fetch responses.", |s| s.fetch_response_bytes),
    ("fetch_paced_total", "counter", "Long polls that waited for fetch pacing after new data arrived (their core was busy).", |s| s.fetch_paced),
    ("fetch_paced_microseconds_total", "counter", "Time long polls waited for fetch pacing.", |s| s.fetch_paced_us),
    ("fetch_sessions", "gauge", "Incremental fetch sessions (KIP-227) the core holds.", |s| s.fetch_sessions),
    ("fetch_session_evictions_total", "counter", "Fetch sessions evicted to make room for new ones (their clients start over with a full fetch).", |s| s.fetch_session_evictions),
    ("fetch_full_total", "counter", "Fetches answered in full: outside a session, or starting one.", |s| s.fetch_full),
    ("fetch_incremental_total", "counter", "Fetches answered in a fetch session, with only the partitions that changed.", |s| s.fetch_incremental),
];

impl FrontEndSnapshot {
    /// The front end's families for every core: (core, its snapshot).
    pub fn write_prometheus(out: &mut Exposition, cores: &[(usize, &FrontEndSnapshot)]) {
        out.header(
            REQUEST_DURATION,
            "histogram",
            "Time from a Kafka request read to its response written (a fetch's long-poll wait \
             included), by API.",
        );
        for (core, s) in cores {
            for (key, d) in &s.durations {
                out.duration(REQUEST_DURATION, &api_labels(*core, *key), d);
            }
        }
        let per_api = |read: fn(&(i16, u64, u64)) -> u64| {
            cores.iter().flat_map(move |(core, s)| {
                s.apis
                    .iter()
                    .map(move |a| (api_labels(*core, a.0), read(a)))
            })
        };
        out.family(
            "shoal_kafka_requests_total",
            "counter",
            "Kafka requests handled, by API.",
            per_api(|a| a.1),
        );
        out.family(
            "shoal_kafka_request_errors_total",
            "counter",
            "Kafka requests that returned an error code for at least one item, by API.",
            per_api(|a| a.2),
        );
        out.per_core("shoal_", &PER_CORE, cores);
    }
}

fn api_labels(core: usize, key: i16) -> String {
    format!("{},api=\"{}\"", core_label(core), api_name(key))
}

fn api_name(key: i16) -> String {
    kafka_protocol::messages::ApiKey::try_from(key)
        .map_or_else(|_| format!("api_{key}"), |k| format!("{k:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn request_durations_render_per_api_under_one_header() {
        let m = FrontEndStats::default();
        let produce = kafka_protocol::messages::ApiKey::Produce as i16;
        for us in [50, 100, 101, 900, 7_000_000] {
            m.duration(produce, Duration::from_micros(us));
        }
        m.duration(-1, Duration::from_micros(1)); // no such API: ignored
        m.request(produce);
        m.request(MAX_API_KEY as i16); // beyond the keys counted: ignored
        let s = m.snapshot();
        assert_eq!(s.apis, vec![(produce, 1, 0)]);
        assert_eq!(s.durations.len(), 1);
        assert_eq!(s.durations[0].1.count(), 5);
        let mut out = Exposition::default();
        FrontEndSnapshot::write_prometheus(&mut out, &[(3, &s), (4, &s)]);
        let text = out.into_text();
        for core in ["3", "4"] {
            let labels = format!("{{core=\"{core}\",api=\"Produce\"}}");
            assert!(text.contains(&format!("{REQUEST_DURATION}_count{labels} 5\n")));
            assert!(text.contains(&format!("shoal_kafka_requests_total{labels} 1\n")));
        }
        assert_eq!(
            text.matches("# TYPE shoal_kafka_request_duration_seconds histogram")
                .count(),
            1
        );
    }
}
