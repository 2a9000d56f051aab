//! Debian packages the tests use as real clients or tools (chromium, kcat), installed by the tests
//! themselves where they are missing: `apt-get install` (as root, from Debian's archive), once
//! per package and test process.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Mutex;

/// The first of `binaries` that exists, installing `package` first when none does; why not,
/// where it cannot be (not root, no archive).
pub fn installed(binaries: &[&str], package: &str) -> Result<PathBuf, String> {
    static TRIED: Mutex<Option<HashMap<String, Result<PathBuf, String>>>> = Mutex::new(None);
    let mut tried = TRIED.lock().unwrap_or_else(|e| e.into_inner());
    let tried = tried.get_or_insert_with(HashMap::new);
    if let Some(found) = tried.get(package) {
        return found.clone();
    }
    let found = || binaries.iter().map(PathBuf::from).find(|p| p.exists());
    let result = found()
        .or_else(|| {
            install(&[package]);
            found()
        })
        .ok_or_else(|| {
            format!(
                "{package} is not installed and `apt-get install {package}` failed (it needs \
                 root and Debian's package archive)"
            )
        });
    tried.insert(package.to_string(), result.clone());
    result
}

/// `apt-get install`s `packages` (reading the archive's lists first if that alone fails); whether
/// it succeeded. Needs root and Debian's package archive.
pub fn install(packages: &[&str]) -> bool {
    let apt = |args: &[&str]| {
        Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let install = [&["install", "-y", "-qq"][..], packages].concat();
    apt(&install) || (apt(&["update", "-qq"]) && apt(&install))
}
