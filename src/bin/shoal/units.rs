//! Values with units, the same for every flag that takes them (`shoal serve` and `shoal bench`):
//! sizes such as `16KiB`, `64MiB`, `1GB`, `4096`.

/// "16KiB", "1MB", "1g", "4096" -> bytes. KiB/MiB/GiB and a bare k/m/g are powers of 1024;
/// KB/MB/GB powers of 1000.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num
        .parse()
        .map_err(|_| format!("{s:?}: expected a size like 1024, 16KiB, 1MB"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024.0 * 1024.0,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        u => return Err(format!("{s:?}: unknown size unit {u:?}")),
    };
    let bytes = (v * mult).round();
    if bytes >= u64::MAX as f64 {
        return Err(format!("{s:?}: too large"));
    }
    Ok(bytes as u64)
}

/// A size that must fit in memory (`usize`).
pub fn parse_size_usize(s: &str) -> Result<usize, String> {
    usize::try_from(parse_size(s)?).map_err(|_| format!("{s:?}: too large"))
}

/// A size, or -1 for no limit.
pub fn parse_size_or_minus_one(s: &str) -> Result<i64, String> {
    if s.trim() == "-1" {
        return Ok(-1);
    }
    i64::try_from(parse_size(s)?).map_err(|_| format!("{s:?}: too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("16KiB"), Ok(16 << 10));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("1MB"), Ok(1_000_000));
        assert_eq!(parse_size("1.5KiB"), Ok(1536));
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999GiB").is_err());
        assert_eq!(parse_size_or_minus_one("-1"), Ok(-1));
        assert_eq!(parse_size_or_minus_one("2GiB"), Ok(2 << 30));
        assert!(parse_size_or_minus_one("-2").is_err());
    }
}
