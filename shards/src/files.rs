//! Small files written whole: a crash leaves either the old or the new content; and directories
//! created so that a crash cannot lose them.

use std::path::Path;

/// Creates `dir` and its missing parents, fsyncing the directory each one was created in, so once
/// this returns a crash cannot lose them (a directory's entry is durable only once its parent is
/// fsynced; `create_dir_all` alone leaves that to the file system's next commit). Directories that
/// already exist cost a `stat`. Blocking: run it off the executor thread.
pub fn create_dir_all_durable(dir: &Path) -> std::io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    create_dir_all_durable(parent)?;
    match std::fs::create_dir(dir) {
        Ok(()) => {}
        // Created by another core meanwhile: its entry may not be synced yet, so sync it here too.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && dir.is_dir() => {}
        Err(e) => return Err(e),
    }
    std::fs::File::open(parent)?.sync_all()
}

/// Writes `bytes` to `path` through a temporary file, fsynced and renamed over it, then fsyncs the
/// directory. Blocking: run it off the executor thread.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_nested_directories_and_is_idempotent() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("topics").join("orders").join("3");
        create_dir_all_durable(&dir).unwrap();
        assert!(dir.is_dir());
        create_dir_all_durable(&dir).unwrap();
        create_dir_all_durable(tmp.path()).unwrap();
        assert!(dir.is_dir());
        // A file in the way is an error, not taken for a directory.
        let file = tmp.path().join("topics").join("file");
        std::fs::write(&file, b"x").unwrap();
        assert!(create_dir_all_durable(&file).is_err());
        assert!(create_dir_all_durable(&file.join("0")).is_err());
        assert!(file.is_file());
    }
}
