//! A tmpfs mounted for a test (root only), shared by the disk-full tests of both crates
//! (`shards/tests/disk_full.rs`, `tests/it/storage_errors.rs`, which include this file by path).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

pub struct Mount(PathBuf);

impl Mount {
    fn tmpfs(dir: &Path, size: &str) -> Option<Mount> {
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Mount(dir.to_path_buf()))
    }
    pub fn resize(&self, size: &str) {
        let s = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.0)
            .status()
            .unwrap();
        assert!(s.success(), "remount failed");
    }
}

/// Mounts a tmpfs of `size` on `dir`, or says why the test cannot run (and fails if it should).
pub fn tmpfs_or_skip(dir: &Path, size: &str, test: &str) -> Option<Mount> {
    let mount = Mount::tmpfs(dir, size);
    if mount.is_none() {
        // Without root there is no way to make a real disk full; say so loudly rather than pass quietly.
        shards::testing::skipped(test, "the whole test", "mounting a tmpfs needs root");
        assert!(
            effective_uid() != 0,
            "running as root but the tmpfs mount failed: {test} could not run"
        );
    }
    mount
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn effective_uid() -> u32 {
    // `id -u` avoids a libc dependency for one call.
    let out = Command::new("id").arg("-u").output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(u32::MAX)
}
