//! A full disk: appends fail with a typed storage error, the log stays readable, and after space is
//! freed and the log reopened no partial batch is visible and appends work again.
//!
//! Uses a real size-limited tmpfs, which needs root (CI and the development machines run as root).

mod common;

use common::*;
use shards::{AppendOptions, Error, Log, LogConfig};
use std::path::{Path, PathBuf};
use std::process::Command;

struct Mount(PathBuf);

impl Mount {
    fn tmpfs(dir: &Path, size: &str) -> Option<Mount> {
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Mount(dir.to_path_buf()))
    }
    fn resize(&self, size: &str) {
        let s = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.0)
            .status()
            .unwrap();
        assert!(s.success(), "remount failed");
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
fn a_full_disk_fails_appends_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mount) = Mount::tmpfs(dir.path(), "300k") else {
        // Without root there is no way to make a real disk full; say so loudly rather than pass quietly.
        eprintln!("SKIPPED a_full_disk_fails_appends_cleanly: mounting a tmpfs needs root");
        assert!(
            effective_uid() != 0,
            "running as root but the tmpfs mount failed: the disk-full test could not run"
        );
        return;
    };
    let path = dir.path().join("p0");
    run(move || async move {
        let config = LogConfig {
            segment_bytes: 1 << 20,
            flush_interval: None,
            ..LogConfig::default()
        };
        let log = Log::open(&path, config.clone(), no_cache()).await.unwrap();
        let mut acked = Vec::new();
        let err = loop {
            let b = batch(1, 16 << 10, acked.len() as u64);
            match log.append(b.clone(), AppendOptions { durable: true }).await {
                Ok(r) => acked.push(with_offset(&b, r.base_offset)),
                Err(e) => break e,
            }
            assert!(
                acked.len() < 100,
                "300 KiB should fill up long before 100 x 16 KiB"
            );
        };
        assert!(
            matches!(err, Error::Storage { .. }),
            "a full disk is a storage error, got {err}"
        );
        assert!(!acked.is_empty());
        let expected: Vec<u8> = acked.concat();
        let hw = log.high_watermark();
        assert_eq!(hw, acked.len() as i64, "the failed append took no offset");
        // Still readable, from disk, with nothing of the failed batch.
        let r = log.read(0, usize::MAX, true).await.unwrap();
        assert_eq!(r.records.to_vec(), expected);
        // A small append may still fit; a big one keeps failing the same way, and the log stays whole.
        let again = log
            .append(batch(1, 64 << 10, 999), AppendOptions { durable: false })
            .await;
        assert!(matches!(again, Err(Error::Storage { .. })));
        assert_eq!(log.high_watermark(), hw);
        drop(log); // as if the broker stopped

        mount.resize("4m");
        let log = Log::open(&path, config, no_cache()).await.unwrap();
        assert_eq!(log.high_watermark(), hw, "no partial batch became visible");
        let r = log.read(0, usize::MAX, true).await.unwrap();
        assert_eq!(r.records.to_vec(), expected);
        let r = log
            .append(batch(2, 100, 1), AppendOptions { durable: true })
            .await
            .unwrap();
        assert_eq!(r.base_offset, hw);
        log.close().await.unwrap();
    });
}

fn effective_uid() -> u32 {
    // `id -u` avoids a libc dependency for one call.
    let out = Command::new("id").arg("-u").output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(u32::MAX)
}
