//! The Python clients the end-to-end tests use (kafka-python, and confluent-kafka with its own
//! librdkafka), installed by the tests themselves, pinned, into `target/python-deps`.

use std::process::Command;

/// The Python clients the tests use, pinned: kafka-python (pure Python) and confluent-kafka (its
/// wheel carries its own librdkafka).
const PACKAGES: [&str; 2] = ["kafka-python==3.0.12", "confluent-kafka==2.12.1"];

/// A PYTHONPATH where both clients are importable, installing them there the first time (once per
/// test process, whichever test asks first).
pub fn python_deps() -> String {
    static DEPS: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    DEPS.get_or_init(|| {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/target/python-deps");
        let importable = |path: &str| {
            Command::new("python3")
                .args(["-c", "import kafka, confluent_kafka"])
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
