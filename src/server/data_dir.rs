//! The data directory (resolved, locked, claimed for `serve` or `edge`) and the process's
//! open-files limit.

use std::path::{Path, PathBuf};

/// Most open files asked for: partitions being read or written hold one to three each (idle ones
/// none), every connection one.
const OPEN_FILES_WANTED: u64 = 1 << 20;

/// Raises this process's open-files limit as far as it may: the soft limit to the hard one, and
/// both to [`OPEN_FILES_WANTED`] where the process may raise its hard limit (root) and the kernel
/// allows it (`fs.nr_open`). Logs what it ends with, so a refused partition (`Too many open
/// files`) can be matched to it.
/// Returns the soft limit it ends with.
pub(super) fn raise_open_files_limit() -> u64 {
    let mut now = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read or write the one struct passed.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut now) } != 0 {
        return 1024;
    }
    let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(now.rlim_max);
    let wanted = OPEN_FILES_WANTED.min(nr_open).max(now.rlim_max);
    let set = |soft: u64, hard: u64| {
        let l = libc::rlimit {
            rlim_cur: soft,
            rlim_max: hard,
        };
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &l) == 0 }
    };
    let limit = if set(wanted, wanted) {
        wanted
    } else if set(now.rlim_max, now.rlim_max) {
        now.rlim_max
    } else {
        now.rlim_cur
    };
    log::info!("open files limit: {limit}");
    limit
}

/// Raises the process's open files limit ([`raise_open_files_limit`]) and returns each core's
/// budget for its logs: `asked`, else half of that limit shared among `cores` (the other half is
/// left to connections, sockets and the runtime).
pub(super) fn open_files_per_core(asked: Option<u64>, cores: usize) -> u64 {
    let limit = raise_open_files_limit();
    let budget = asked.unwrap_or(limit / 2 / cores.max(1) as u64).max(8);
    let total = budget.saturating_mul(cores as u64);
    if total > limit {
        log::warn!(
            "--max-open-files-per-core {budget} x {cores} cores is more than the process's open \
             files limit ({limit}): opens may fail with 'Too many open files'"
        );
    }
    log::info!("open files budget: {budget} per core");
    budget
}

/// Locks the data directory (`LOCK`, an advisory lock the kernel drops when the process dies), so
/// that a second server started on it, by mistake or by an overlapping restart, stops here before
/// it touches anything.
pub(super) fn lock_data_dir(dir: &Path) -> std::io::Result<std::fs::File> {
    let path = dir.join("LOCK");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a descriptor this function owns; no memory is passed.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(file);
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        return Err(std::io::Error::other(format!(
            "data directory {} is in use by another shoal process",
            dir.display()
        )));
    }
    Err(std::io::Error::new(
        e.kind(),
        format!("locking {}: {e}", path.display()),
    ))
}

/// Marks a data directory an edge's cache ([`EDGE_MARK`]) when `upstream` (the edge's upstream
/// list) is given. An edge starts with an empty cache (what it held may no longer be the
/// upstream's), so it refuses a directory that holds a broker's data, and `serve` refuses an
/// edge's.
pub(super) fn claim_data_dir(dir: &Path, upstream: Option<String>) -> std::io::Result<()> {
    let mark = dir.join(EDGE_MARK);
    let has_mark = mark.exists();
    let has_table = dir.join("topics.json").exists();
    let context = |e: std::io::Error| {
        std::io::Error::new(e.kind(), format!("data directory {}: {e}", dir.display()))
    };
    match upstream {
        None if has_mark => Err(std::io::Error::other(format!(
            "data directory {} is a shoal edge's cache; give `shoal serve` a directory of its own",
            dir.display()
        ))),
        None => Ok(()),
        Some(_) if (has_table || has_topic_dirs(dir)) && !has_mark => {
            Err(std::io::Error::other(format!(
                "data directory {} holds a broker's data; give `shoal edge` a directory of its own",
                dir.display()
            )))
        }
        Some(upstream) => {
            std::fs::write(&mark, format!("upstream={upstream}\n")).map_err(context)?;
            match std::fs::remove_dir_all(dir.join("topics")) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(context(e)),
                _ => {}
            }
            match std::fs::remove_file(dir.join("topics.json")) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(context(e)),
                _ => {}
            }
            shards::files::create_dir_all_durable(&dir.join("topics")).map_err(context)
        }
    }
}

/// Whether `dir/topics` holds anything (a broker's partitions).
pub(super) fn has_topic_dirs(dir: &Path) -> bool {
    std::fs::read_dir(dir.join("topics")).is_ok_and(|mut d| d.next().is_some())
}

/// The file that marks a data directory as a shoal edge's cache.
pub const EDGE_MARK: &str = "EDGE";

/// Creates the data directory and resolves it to an absolute path with no `..` or symlinks, so
/// every later path (logs opened long after start-up, group stores) is independent of the working
/// directory and of how the user spelled it.
pub(super) fn resolve_data_dir(dir: &Path) -> std::io::Result<PathBuf> {
    let context = |e: std::io::Error| {
        std::io::Error::new(e.kind(), format!("data directory {}: {e}", dir.display()))
    };
    refuse_files_on_the_way(dir)?;
    shards::files::create_dir_all_durable(&dir.join("topics")).map_err(context)?;
    std::fs::canonicalize(dir).map_err(context)
}

/// Renumbers the groups' and transactions' internal logs for `cores` cores. Called once every port
/// is held: a start that fails leaves the data directory as the last run left it.
pub(super) fn reshard_internal_logs(dir: &Path, cores: usize) -> std::io::Result<()> {
    crate::groups::reshard(dir, cores)?;
    crate::transactions::reshard(dir, cores)
}

/// Refuses a data directory that is a file, or whose path goes through one (where creating it
/// would only say "File exists" or "Not a directory").
fn refuse_files_on_the_way(dir: &Path) -> std::io::Result<()> {
    for (i, path) in dir.ancestors().enumerate() {
        let Ok(meta) = std::fs::metadata(path) else {
            continue;
        };
        if meta.is_dir() {
            return Ok(());
        }
        let what = if i == 0 {
            "is a file".to_string()
        } else {
            format!("is under {}, which is a file", path.display())
        };
        return Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            format!(
                "data directory {} {what}, not a directory: give --data-dir a directory (it is \
                 created if missing)",
                dir.display()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_data_directory_that_is_or_goes_through_a_file_is_refused_by_name() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("plain");
        std::fs::write(&file, "x").unwrap();
        let e = resolve_data_dir(&file).unwrap_err().to_string();
        assert!(e.contains("is a file, not a directory"), "{e}");
        let e = resolve_data_dir(&file.join("data"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("is under {}, which is a file", file.display())),
            "{e}"
        );
        let fresh = tmp.path().join("a/b");
        assert_eq!(
            resolve_data_dir(&fresh).unwrap(),
            std::fs::canonicalize(&fresh).unwrap()
        );
    }
}
