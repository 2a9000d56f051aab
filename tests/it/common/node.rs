//! kafkajs (a pure JavaScript Kafka client) for the end-to-end tests: node and npm from the
//! machine (Debian's `nodejs` and `npm`, installed by the test itself as root with `apt-get` where
//! they are missing), kafkajs pinned, installed with npm once into the cargo target directory and
//! reused; and `tests/js/` scripts run with it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The kafkajs the tests use.
pub const KAFKAJS: &str = "kafkajs@2.2.4";
const KAFKAJS_VERSION: &str = "2.2.4";

/// How long a script may run before it is killed and the test failed (the scripts bound their
/// own waits well within it).
const SCRIPT_LIMIT: Duration = Duration::from_secs(150);
/// How long `npm install` may take.
const INSTALL_LIMIT: Duration = Duration::from_secs(300);

/// Runs `cmd` to its end, killing it after `limit`; its exit status, stdout and stderr, or why
/// it could not run.
fn run_bounded(mut cmd: Command, limit: Duration) -> Result<(bool, String, String), String> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{cmd:?}: {e}"))?;
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut stdout, &mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut s);
        s
    });
    let started = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().map_err(|e| e.to_string())? {
            break Some(s);
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (out, err) = (out.join().unwrap(), err.join().unwrap());
    match status {
        Some(s) => Ok((s.success(), out, err)),
        None => Err(format!(
            "{cmd:?} ran past {limit:?}\nstdout:\n{out}\nstderr:\n{err}"
        )),
    }
}

fn runs(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Makes sure `node` and `npm` run, installing Debian's packages where they are missing.
fn node_and_npm() -> Result<(), String> {
    if runs("node") && runs("npm") {
        return Ok(());
    }
    super::debian::install(&["nodejs", "npm"]);
    if runs("node") && runs("npm") {
        Ok(())
    } else {
        Err(
            "node and npm are not installed and `apt-get install nodejs npm` failed (it needs \
             root and Debian's package archive)"
                .to_string(),
        )
    }
}

fn installed(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("node_modules/kafkajs/package.json"))
        .is_ok_and(|p| p.contains(&format!("\"version\": \"{KAFKAJS_VERSION}\"")))
}

/// The `node_modules` directory kafkajs is installed in (the first time it is asked for, per test
/// process; kept in the target directory for later runs); why not, where it cannot be had.
pub fn kafkajs() -> Result<PathBuf, String> {
    static DEPS: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    DEPS.get_or_init(|| {
        node_and_npm()?;
        let dir = PathBuf::from(concat!(env!("CARGO_TARGET_TMPDIR"), "/node-deps"));
        if !installed(&dir) {
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            let mut npm = Command::new("npm");
            npm.arg("install").arg("--prefix").arg(&dir).args([
                "--no-save",
                "--no-audit",
                "--no-fund",
                "--silent",
                KAFKAJS,
            ]);
            let (ok, _, err) = run_bounded(npm, INSTALL_LIMIT)?;
            if !ok || !installed(&dir) {
                return Err(format!("`npm install {KAFKAJS}` failed: {err}"));
            }
        }
        Ok(dir.join("node_modules"))
    })
    .clone()
}

/// Runs `tests/js/SCRIPT` with node and kafkajs, and parses the JSON line it prints last. `None`,
/// with a SKIPPED line naming `test`, where kafkajs cannot be had. A script that fails, prints no
/// JSON or runs too long fails the test, with its output.
pub fn run_script(test: &str, script: &str, args: &[&str]) -> Option<serde_json::Value> {
    let modules = match kafkajs() {
        Ok(m) => m,
        Err(why) => {
            shards::testing::skipped(test, "kafkajs", &why);
            return None;
        }
    };
    let path = format!("{}/tests/js/{script}", env!("CARGO_MANIFEST_DIR"));
    let mut node = Command::new("node");
    node.arg(&path).args(args).env("NODE_PATH", &modules);
    let (ok, out, err) = run_bounded(node, SCRIPT_LIMIT).unwrap_or_else(|e| panic!("{e}"));
    let last = out.lines().rev().find(|l| l.starts_with('{'));
    match last.map(serde_json::from_str::<serde_json::Value>) {
        Some(Ok(v)) if ok => Some(v),
        _ => panic!("{script} {args:?} failed (exit ok: {ok})\nstdout:\n{out}\nstderr:\n{err}"),
    }
}
