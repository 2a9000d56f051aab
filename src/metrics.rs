//! The Prometheus text exposition format, and the counter cell every component's stats use. Each
//! component renders its own figures with [`Exposition`]; [`crate::stats`] composes them.

use std::cell::Cell;
use std::fmt::Write;

pub use shards::latency::{DurationHistogram, DurationSnapshot, DURATION_BUCKETS_US};

pub fn add(c: &Cell<u64>, n: u64) {
    c.set(c.get() + n);
}

/// A metric family with one sample per core, read from a component's snapshot: name (or suffix
/// after a prefix), type (`counter`, `gauge`), help, and how to read the value.
pub type Family<T> = (&'static str, &'static str, &'static str, fn(&T) -> u64);

/// The labels of a per-core sample.
pub fn core_label(core: usize) -> String {
    format!("core=\"{core}\"")
}

/// A label value as the text format writes it: backslash, double quote and line feed escaped
/// (group ids are any string a client sends).
pub fn label_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Prometheus text being written: each family's HELP and TYPE once, then its samples.
#[derive(Debug, Default)]
pub struct Exposition {
    text: String,
}

impl Exposition {
    /// A family's HELP and TYPE lines; its samples follow.
    pub fn header(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.text, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    /// One sample of `name` with `labels` (written without braces: `core="0",api="Fetch"`).
    pub fn sample(&mut self, name: &str, labels: &str, value: u64) {
        let _ = writeln!(self.text, "{name}{{{labels}}} {value}");
    }

    /// A family with its samples as (labels, value).
    pub fn family(
        &mut self,
        name: &str,
        kind: &str,
        help: &str,
        samples: impl IntoIterator<Item = (String, u64)>,
    ) {
        self.header(name, kind, help);
        for (labels, value) in samples {
            self.sample(name, &labels, value);
        }
    }

    /// Families with one sample per core, each named `prefix` + its name.
    pub fn per_core<T>(&mut self, prefix: &str, families: &[Family<T>], cores: &[(usize, &T)]) {
        for (name, kind, help, read) in families {
            let samples = cores.iter().map(|(core, s)| (core_label(*core), read(s)));
            self.family(&format!("{prefix}{name}"), kind, help, samples);
        }
    }

    /// A duration histogram as samples of `name` (cumulative buckets in seconds) with `labels`.
    pub fn duration(&mut self, name: &str, labels: &str, d: &DurationSnapshot) {
        let mut below = 0;
        for (i, n) in d.buckets.iter().enumerate() {
            below += n;
            let le = DURATION_BUCKETS_US
                .get(i)
                .map_or("+Inf".to_string(), |us| format!("{}", *us as f64 / 1e6));
            let _ = writeln!(self.text, "{name}_bucket{{{labels},le=\"{le}\"}} {below}");
        }
        let _ = writeln!(
            self.text,
            "{name}_sum{{{labels}}} {}",
            d.sum_us as f64 / 1e6
        );
        let _ = writeln!(self.text, "{name}_count{{{labels}}} {below}");
    }

    pub fn into_text(self) -> String {
        self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn durations_render_as_a_cumulative_histogram() {
        let h = DurationHistogram::default();
        for us in [50, 100, 101, 900, 7_000_000] {
            h.record(Duration::from_micros(us));
        }
        let mut out = Exposition::default();
        out.header("d_seconds", "histogram", "Durations.");
        out.duration("d_seconds", "core=\"3\"", &h.snapshot());
        let text = out.into_text();
        let sample = |series: &str| -> String {
            let line = text
                .lines()
                .find(|l| l.starts_with(series))
                .unwrap_or_else(|| panic!("no {series} in\n{text}"));
            line.rsplit(' ').next().unwrap().to_string()
        };
        let bucket = |le: &str| sample(&format!("d_seconds_bucket{{core=\"3\",le=\"{le}\"}}"));
        // Bounds are inclusive (100 us is in the 100 us bucket) and buckets cumulative.
        assert_eq!(bucket("0.0001"), "2");
        assert_eq!(bucket("0.00025"), "3");
        assert_eq!(bucket("0.001"), "4");
        assert_eq!(bucket("5"), "4");
        assert_eq!(bucket("+Inf"), "5");
        assert_eq!(sample("d_seconds_count{core=\"3\"}"), "5");
        assert_eq!(sample("d_seconds_sum{core=\"3\"}"), "7.001151");
        assert_eq!(text.matches("# TYPE d_seconds histogram").count(), 1);
    }
}
