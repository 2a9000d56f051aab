//! A process's resident set from `/proc`: now, its peak, and resetting the peak for a run.

/// Peak resident set (VmHWM) of a process (None: this one), in bytes: since it started, or since
/// [`reset_peak_rss`].
pub fn peak_rss(pid: Option<u32>) -> Option<u64> {
    status_kb(pid, "VmHWM:").map(|kb| kb * 1024)
}

/// Resident set (VmRSS) of a process now, in bytes.
pub fn rss(pid: Option<u32>) -> Option<u64> {
    status_kb(pid, "VmRSS:").map(|kb| kb * 1024)
}

fn status_kb(pid: Option<u32>, field: &str) -> Option<u64> {
    let path = pid.map_or_else(
        || "/proc/self/status".to_string(),
        |p| format!("/proc/{p}/status"),
    );
    let status = std::fs::read_to_string(path).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Sets a process's peak resident set back to its resident set now (Linux `clear_refs` 5), so that
/// the peak of a run is its own; false where the kernel or permissions do not allow it.
pub fn reset_peak_rss(pid: Option<u32>) -> bool {
    let path = pid.map_or_else(
        || "/proc/self/clear_refs".to_string(),
        |p| format!("/proc/{p}/clear_refs"),
    );
    std::fs::write(path, "5").is_ok()
}
