//! Small files written whole: a crash leaves either the old or the new content.

use std::path::Path;

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
