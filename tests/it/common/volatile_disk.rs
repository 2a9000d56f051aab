//! An ext4 file system on a disk that loses every write not yet flushed when its power is cut, for
//! tests of what survives a power cut (root only).
//!
//! The layers, from the bottom: a *stable image* (a sparse file on the real disk) that only
//! flushes reach; `tests/python/volatile_disk.py`, a FUSE daemon that serves one file, `disk.img`,
//! as that image with the writes since the last fsync laid over it in memory; a loop device on
//! `disk.img` (buffered, so every write and flush of the block device reaches the daemon: the loop
//! driver turns flushes and FUA writes into an fsync of its backing file); ext4 on the loop device,
//! mounted where the test wants its data directory.
//!
//! [`VolatileDisk::cut_power`] tells the daemon to discard what was not fsynced and to keep nothing
//! written later; dropping the disk then tears the layers down (lazily: a file system still in use
//! by a dying process is let go when it is released). [`VolatileDisk::attach`] brings the same
//! stable image up again with an empty overlay: ext4 replays its journal from what was flushed,
//! as after a reboot.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// The disk image's size: room for the broker's segments, each allocated 8 MiB ahead, with zeros
/// written 4 MiB ahead of its data. Sparse on the real disk; the daemon holds it in memory.
pub const IMAGE_BYTES: u64 = 512 << 20;

/// How long one step of setting the disk up or tearing it down may take.
const STEP: Duration = Duration::from_secs(30);

/// A mounted ext4 on a volatile disk; torn down (ext4, loop device, FUSE, daemon) when dropped.
pub struct VolatileDisk {
    daemon: Child,
    /// Lines the daemon printed (`ready`, `cut`).
    said: Receiver<String>,
    /// Where the FUSE file system is mounted (kept alive with the disk).
    fuse_dir: tempfile::TempDir,
    fuse_mounted: bool,
    /// The loop device (`/dev/loopN`), once attached.
    loop_device: Option<String>,
    /// Where ext4 is mounted, once it is.
    mounted_at: Option<PathBuf>,
}

impl VolatileDisk {
    /// A new empty stable image of [`IMAGE_BYTES`] at `image`, formatted ext4 and mounted at `at`.
    pub fn format(image: &Path, at: &Path) -> Result<VolatileDisk, String> {
        let file = std::fs::File::create(image).map_err(|e| format!("{}: {e}", image.display()))?;
        file.set_len(IMAGE_BYTES).map_err(|e| e.to_string())?;
        drop(file);
        let mut disk = Self::serve(image)?;
        let device = disk.loop_device()?;
        // No discards (mkfs would otherwise punch the whole image) and inode tables and journal
        // written now, so no kernel thread zeroes them later while the test runs.
        run(Command::new("mkfs.ext4")
            .args(["-q", "-F", "-b", "4096", "-N", "4096", "-E"])
            .arg("nodiscard,lazy_itable_init=0,lazy_journal_init=0")
            .arg(&device))?;
        disk.mount_ext4(at)?;
        Ok(disk)
    }

    /// The stable image at `image` (as the last power cut left it) mounted at `at`: ext4 replays
    /// its journal.
    pub fn attach(image: &Path, at: &Path) -> Result<VolatileDisk, String> {
        let mut disk = Self::serve(image)?;
        disk.loop_device()?;
        disk.mount_ext4(at)?;
        Ok(disk)
    }

    /// Starts the daemon on `image` and waits for its FUSE file system to answer.
    fn serve(image: &Path) -> Result<VolatileDisk, String> {
        let fuse_dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/volatile_disk.py");
        let mut daemon = Command::new("python3")
            .arg(script)
            .arg(image)
            .arg(fuse_dir.path())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("python3 {script}: {e}"))?;
        let stdout = daemon.stdout.take().unwrap();
        let (tx, said) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        // Counted as mounted from the start, so that a daemon that mounted and then hung is
        // unmounted too.
        let mut disk = VolatileDisk {
            daemon,
            said,
            fuse_dir,
            fuse_mounted: true,
            loop_device: None,
            mounted_at: None,
        };
        disk.wait_for("ready")?;
        Ok(disk)
    }

    /// Waits (at most [`STEP`]) for the daemon to print `line`.
    fn wait_for(&mut self, line: &str) -> Result<(), String> {
        let deadline = Instant::now() + STEP;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.said.recv_timeout(left) {
                Ok(l) if l == line => return Ok(()),
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => {
                    return Err(format!(
                        "the FUSE daemon did not say {line:?} within {STEP:?}"
                    ))
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let status = self.daemon.wait();
                    return Err(format!(
                        "the FUSE daemon exited before saying {line:?}: {status:?}"
                    ));
                }
            }
        }
    }

    /// Attaches a loop device to the daemon's file and returns its name.
    fn loop_device(&mut self) -> Result<String, String> {
        let file = self.fuse_dir.path().join("disk.img");
        let out = output(
            Command::new("losetup")
                .args(["--find", "--show", "--direct-io=off"])
                .arg(&file),
        )?;
        let device = out.trim().to_string();
        self.loop_device = Some(device.clone());
        Ok(device)
    }

    fn mount_ext4(&mut self, at: &Path) -> Result<(), String> {
        let device = self.loop_device.clone().unwrap();
        run(Command::new("mount").args(["-t", "ext4", &device]).arg(at))?;
        self.mounted_at = Some(at.to_path_buf());
        Ok(())
    }

    /// Cuts the power: from the moment this returns, nothing more reaches the stable image, and
    /// what was written since the last flush is gone from it.
    pub fn cut_power(&mut self) -> Result<(), String> {
        signal(self.daemon.id(), libc::SIGUSR1);
        self.wait_for("cut")
    }
}

impl Drop for VolatileDisk {
    /// Unmounts ext4 and detaches the loop device (both lazily, as a process killed a moment ago
    /// may still hold files), unmounts the FUSE file system and stops the daemon (SIGTERM: the
    /// kernel fails whatever is still in flight to it).
    fn drop(&mut self) {
        if let Some(at) = self.mounted_at.take() {
            let _ = run(Command::new("umount").arg("-l").arg(&at));
        }
        if let Some(device) = self.loop_device.take() {
            let _ = run(Command::new("losetup").args(["-d", &device]));
        }
        if self.fuse_mounted {
            let _ = run(Command::new("umount").arg("-l").arg(self.fuse_dir.path()));
        }
        signal(self.daemon.id(), libc::SIGTERM);
        let deadline = Instant::now() + STEP;
        while self.daemon.try_wait().ok().flatten().is_none() {
            if Instant::now() > deadline {
                let _ = self.daemon.kill();
                let _ = self.daemon.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Sends `sig` to process `pid`.
pub fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) on a pid this test started; no memory is involved.
    unsafe {
        libc::kill(pid as i32, sig);
    }
}

/// Whether the test runs as root (mounts and loop devices need it).
pub fn is_root() -> bool {
    // SAFETY: geteuid(2) cannot fail and touches no memory.
    unsafe { libc::geteuid() == 0 }
}

/// Runs `cmd` to completion (at most [`STEP`]); an error says what failed and how.
fn run(cmd: &mut Command) -> Result<(), String> {
    output(cmd).map(drop)
}

/// Runs `cmd` to completion (at most [`STEP`]) and returns its standard output.
fn output(cmd: &mut Command) -> Result<String, String> {
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{what}: {e}"))?;
    let deadline = Instant::now() + STEP;
    while child.try_wait().map_err(|e| e.to_string())?.is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{what} did not finish within {STEP:?}"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "{what}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
