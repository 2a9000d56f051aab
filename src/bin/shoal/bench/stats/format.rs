//! Figures as people read them: thousands separators, microseconds, byte sizes, megabytes.

pub fn mb(bytes: f64) -> f64 {
    bytes / 1e6
}

/// 1234567 -> "1,234,567".
pub fn thousands(v: u64) -> String {
    let s = v.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Microseconds as a short human figure: "850us", "1.25ms", "3.2s".
pub fn us(v: u64) -> String {
    if v < 1_000 {
        format!("{v}us")
    } else if v < 1_000_000 {
        format!("{:.2}ms", v as f64 / 1e3)
    } else {
        format!("{:.2}s", v as f64 / 1e6)
    }
}

/// Bytes as "512 B", "16.0 KiB", "1.00 GiB".
pub fn size(v: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut x = v as f64;
    let mut u = 0;
    while x >= 1024.0 && u + 1 < UNITS.len() {
        x /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{v} B")
    } else {
        format!("{x:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn number_formats() {
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(thousands(12), "12");
        assert_eq!(us(850), "850us");
        assert_eq!(us(1_250), "1.25ms");
        assert_eq!(size(16 << 10), "16.0 KiB");
    }
}
