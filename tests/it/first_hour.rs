//! A new user's first hour: what a first try of the binary met, each reproduced against the real
//! binary. An operator command piped into `head`; `--cores 0`; a data directory that is a file; a
//! start that fails on core 1's port (the groups' files must be as the last run left them); a
//! plaintext client on a TLS port and a Kafka client on the admin port (told what the port
//! speaks); `shoal consume` on a partition with a read replica (it must fetch from the replica the
//! leader names); an offset out of range (the range named) and a batch too large (the setting
//! named); a seek without partitions (both ways to give them named); `tail -f | shoal produce`
//! (each line sent as it comes).

use crate::common;

use common::cli::{shoal, shoal_input};
use common::{free_port_run, ports_lock, Shoal};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `shoal topic create TOPIC --partitions N` against `bootstrap`, which must succeed.
fn create_topic(bootstrap: &str, topic: &str, partitions: &str) {
    let run = shoal(
        &[
            "topic",
            "create",
            topic,
            "--partitions",
            partitions,
            "-b",
            bootstrap,
        ],
        &[],
    );
    assert!(run.ok, "topic create: {}", run.stderr);
}

/// `printf LINES | shoal produce TOPIC -p PARTITION`, which must succeed.
fn produce_lines(bootstrap: &str, topic: &str, partition: &str, lines: usize) {
    let input: String = (0..lines).map(|i| format!("line {i}\n")).collect();
    let run = shoal_input(
        &["produce", topic, "-p", partition, "-b", bootstrap],
        &[],
        input.as_bytes(),
    );
    assert!(run.ok, "produce: {}", run.stderr);
}

/// `shoal consume TOPIC --offset beginning --exit`.
fn read_all(bootstrap: &str, topic: &str) -> common::cli::Run {
    shoal(
        &[
            "consume",
            topic,
            "--offset",
            "beginning",
            "--exit",
            "-b",
            bootstrap,
        ],
        &[],
    )
}

#[test]
fn an_operator_command_whose_reader_goes_away_ends_without_a_panic() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 1, &[]);
    let bootstrap = shoal.bootstrap();
    for i in 0..30 {
        create_topic(&bootstrap, &format!("t{i:02}"), "1");
    }
    // `shoal topic list | head -0`: the reader is gone before the command prints.
    let mut child = Command::new(env!("CARGO_BIN_EXE_shoal"))
        .args(["topic", "list", "-b", &bootstrap])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_ne!(out.status.code(), Some(101), "{stderr}");
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGPIPE),
        "ends as `cat` would: {:?} {stderr}",
        out.status
    );
    shoal.stop();
}

#[test]
fn zero_cores_and_a_data_directory_that_is_a_file_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let run = shoal(&["serve", "--cores", "0"], &[]);
    assert!(!run.ok);
    assert!(
        run.stderr.contains("at least 1 core"),
        "--cores 0: {}",
        run.stderr
    );
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, "x").unwrap();
    for (data_dir, says) in [
        (file.clone(), "is a file, not a directory".to_string()),
        (
            file.join("data"),
            format!("is under {}, which is a file", file.display()),
        ),
    ] {
        let run = shoal(
            &[
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--admin",
                "127.0.0.1:0",
                "--data-dir",
                data_dir.to_str().unwrap(),
            ],
            &[],
        );
        assert!(!run.ok);
        assert!(
            run.stderr.contains(&says),
            "{}: {}",
            data_dir.display(),
            run.stderr
        );
        assert!(!run.stderr.contains("File exists"), "{}", run.stderr);
    }
}

#[test]
fn a_seek_without_partitions_names_both_ways_to_give_them() {
    let run = shoal(&["group", "seek", "readers", "--to-earliest"], &[]);
    assert!(!run.ok);
    assert!(
        run.stderr.contains("--topic") && run.stderr.contains("--all-topics"),
        "{}",
        run.stderr
    );
}

/// Every file under `root` with its bytes.
fn files_under(root: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                let name = path.strip_prefix(root).unwrap().display().to_string();
                out.insert(name, std::fs::read(&path).unwrap());
            }
        }
    }
    out
}

#[test]
fn a_start_that_fails_on_a_port_leaves_the_groups_as_the_last_run_left_them() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let shoal1 = Shoal::start(&data, 1, &[]);
    let bootstrap = shoal1.bootstrap();
    create_topic(&bootstrap, "clicks", "1");
    produce_lines(&bootstrap, "clicks", "0", 5);
    let run = shoal(
        &[
            "consume",
            "clicks",
            "--group",
            "readers",
            "--offset",
            "beginning",
            "--exit",
            "-b",
            &bootstrap,
        ],
        &[],
    );
    assert!(run.ok, "consume: {}", run.stderr);
    shoal1.stop();
    let groups = data.join("__groups");
    let before = files_under(&groups);
    assert!(!before.is_empty());

    // Two cores, core 1's port taken: the start fails there.
    let _ports = ports_lock();
    let port = free_port_run(2);
    let _taken = std::net::TcpListener::bind(("127.0.0.1", port + 1)).unwrap();
    let listen = format!("127.0.0.1:{port}");
    let run = shoal(
        &[
            "serve",
            "--cores",
            "2",
            "--listen",
            &listen,
            "--admin",
            "127.0.0.1:0",
            "--bind-retry-ms",
            "0",
            "--data-dir",
            data.to_str().unwrap(),
        ],
        &[],
    );
    assert!(!run.ok, "core 1's port is taken");
    assert!(
        run.stderr.contains(&(port + 1).to_string()),
        "{}",
        run.stderr
    );
    assert_eq!(
        files_under(&groups),
        before,
        "the failed start changed the groups' files"
    );

    // The last run's core count serves the group's offsets as they were.
    let shoal1 = Shoal::start(&data, 1, &[]);
    let described = common::cli::group(&shoal1.bootstrap(), &["describe", "readers"]).json();
    assert!(
        described.to_string().contains("\"committed\":5"),
        "{described}"
    );
    shoal1.stop();
}

#[test]
fn clients_on_the_wrong_port_are_told_what_the_port_speaks() {
    let dir = tempfile::tempdir().unwrap();
    let pki = common::pki::pki();
    let _ports = ports_lock();
    let tls_port = free_port_run(1);
    let listener = format!("SSL://127.0.0.1:{tls_port}");
    let shoal1 = Shoal::start(
        &dir.path().join("data"),
        1,
        &[
            "--listener",
            &listener,
            "--tls-cert",
            pki.server.0.to_str().unwrap(),
            "--tls-key",
            pki.server.1.to_str().unwrap(),
        ],
    );
    let tls_addr = format!("127.0.0.1:{tls_port}");
    let run = shoal(&["topic", "list", "-b", &tls_addr, "--timeout", "5s"], &[]);
    assert!(!run.ok);
    assert!(
        run.stderr.contains("this port speaks TLS"),
        "{}",
        run.stderr
    );
    let run = shoal(
        &["topic", "list", "-b", &shoal1.admin, "--timeout", "5s"],
        &[],
    );
    assert!(!run.ok);
    assert!(
        run.stderr.contains("this port speaks HTTP"),
        "{}",
        run.stderr
    );
    // The broker's log says the same of the plaintext client on its TLS port.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !shoal1
        .log_lines()
        .iter()
        .any(|l| l.contains("speaks plaintext to a TLS port"))
    {
        assert!(
            Instant::now() < deadline,
            "no log line names the plaintext client: {:?}",
            shoal1.log_lines()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    shoal1.stop();
}

#[test]
fn shoal_consume_reads_from_the_replica_the_leader_names() {
    let dir = tempfile::tempdir().unwrap();
    let shoal1 = Shoal::start(
        dir.path(),
        2,
        &["--read-replicas", "all", "--metrics-per-partition"],
    );
    let bootstrap = shoal1.bootstrap();
    create_topic(&bootstrap, "hot", "2");
    produce_lines(&bootstrap, "hot", "0", 50);
    produce_lines(&bootstrap, "hot", "1", 50);
    // A consumer that keeps its connections open (no --exit), so the metrics see them.
    let mut consumer = Command::new(env!("CARGO_BIN_EXE_shoal"))
        .args(["consume", "hot", "--offset", "beginning", "-b", &bootstrap])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = consumer.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let mut lines = Vec::new();
    while lines.len() < 100 {
        let line = rx.recv_timeout(Duration::from_secs(30));
        lines.push(line.expect("100 records printed within 30 s"));
    }
    lines.sort();
    lines.dedup();
    assert_eq!(lines.len(), 50, "the same 50 lines in each partition");
    // Each partition fetched on both cores: at its owner (which names the other core as the
    // preferred read replica) and at the replica.
    let fetching = |core: usize, p: i32| {
        shoal1.metric_or_zero(
            "shoal_partition_fetch_connections",
            &format!("core=\"{core}\",topic=\"hot\",partition=\"{p}\""),
        )
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let seen: Vec<(u64, u64)> = (0..2).map(|p| (fetching(0, p), fetching(1, p))).collect();
        let redirected = shoal1.metric_or_zero("shoal_fetch_redirects_total", "");
        if redirected > 0 && seen.iter().all(|(a, b)| *a > 0 && *b > 0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no replica served: redirects {redirected}, (core 0, core 1) fetching each \
             partition {seen:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        rx.recv_timeout(Duration::from_millis(500)).is_err(),
        "no record printed twice"
    );
    consumer.kill().unwrap();
    consumer.wait().unwrap();
    shoal1.stop();
}

#[test]
fn out_of_range_names_the_range_and_too_large_names_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    let shoal1 = Shoal::start(dir.path(), 1, &[]);
    let bootstrap = shoal1.bootstrap();
    create_topic(&bootstrap, "small", "1");
    produce_lines(&bootstrap, "small", "0", 3);
    let run = shoal(
        &[
            "consume", "small", "--offset", "10", "--exit", "-b", &bootstrap,
        ],
        &[],
    );
    assert!(!run.ok);
    assert!(
        run.stderr.contains("the partition holds offsets 0 to 2"),
        "{}",
        run.stderr
    );
    let alter = shoal(
        &[
            "topic",
            "alter-config",
            "small",
            "-c",
            "max.message.bytes=2000",
            "-b",
            &bootstrap,
        ],
        &[],
    );
    assert!(alter.ok, "{}", alter.stderr);
    let big = "x".repeat(4000) + "\n";
    let run = shoal_input(&["produce", "small", "-b", &bootstrap], &[], big.as_bytes());
    assert!(!run.ok, "a 4 KB record over a 2,000 byte limit");
    assert!(
        run.stderr.contains("max.message.bytes"),
        "the setting is named: {}",
        run.stderr
    );
    shoal1.stop();
}

#[test]
fn shoal_produce_sends_lines_that_come_slowly_as_they_come() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let shoal1 = Shoal::start(dir.path(), 1, &[]);
    let bootstrap = shoal1.bootstrap();
    create_topic(&bootstrap, "slow", "1");
    // `tail -f | shoal produce`: the input stays open.
    let mut producer = Command::new(env!("CARGO_BIN_EXE_shoal"))
        .args(["produce", "slow", "-b", &bootstrap])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = producer.stdin.take().unwrap();
    writeln!(input, "first").unwrap();
    input.flush().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let run = read_all(&bootstrap, "slow");
        assert!(run.ok, "{}", run.stderr);
        if run.stdout == "first\n" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a line read 10 s ago is not in the topic: {:?}",
            run.stdout
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    writeln!(input, "second").unwrap();
    drop(input);
    let out = producer.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = read_all(&bootstrap, "slow");
    assert_eq!(run.stdout, "first\nsecond\n");
    shoal1.stop();
}
