//! What the documentation tells a new user, checked against the binary: the README's quick start
//! run literally (every command, in a fresh working directory, with the default ports and data
//! directory, the console opened in a real browser), `docs/configuration.md` against `shoal serve
//! --help` and `shoal edge --help` (regenerated with `SHOAL_BLESS_DOCS=1 cargo test --test it
//! docs::`), and every flag the README gives a `shoal` command against that command's `--help`.

use crate::common;

use common::Shoal;
use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// `shoal ARGS --help`.
fn help(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_shoal"))
        .args(args)
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

/// One option of a `--help`: its header (`--data-dir <DATA_DIR>`), the text, and the default.
struct Flag {
    header: String,
    text: String,
    default: Option<String>,
}

/// The options of a `--help` page (after `Options:`), `--help` itself left out.
fn flags(help: &str) -> Vec<Flag> {
    let mut out: Vec<Flag> = Vec::new();
    let options = help.split_once("\nOptions:\n").map_or("", |(_, o)| o);
    for line in options.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('-') && !line.starts_with("          ") {
            out.push(Flag {
                header: trimmed.to_string(),
                text: String::new(),
                default: None,
            });
        } else if let Some(flag) = out.last_mut() {
            if !trimmed.is_empty() {
                if !flag.text.is_empty() {
                    flag.text.push(' ');
                }
                flag.text.push_str(trimmed);
            }
        }
    }
    for flag in &mut out {
        if let Some(at) = flag.text.find(" [default: ") {
            let rest = &flag.text[at + " [default: ".len()..];
            let end = rest.find(']').unwrap_or(rest.len());
            flag.default = Some(rest[..end].to_string());
            flag.text = format!("{}{}", &flag.text[..at], &rest[(end + 1).min(rest.len())..]);
        }
    }
    out.retain(|f| !f.header.starts_with("-h, --help"));
    out
}

/// The long name of a flag's header (`--data-dir`).
fn long_name(header: &str) -> &str {
    header
        .split([' ', ','])
        .find(|w| w.starts_with("--"))
        .unwrap_or(header)
}

/// A markdown table of `flags`.
fn table(flags: &[&Flag]) -> String {
    let cell = |s: &str| s.replace('|', "\\|");
    let mut out = String::from("| flag | default | what it does |\n|---|---|---|\n");
    for f in flags {
        let default = f
            .default
            .as_deref()
            .map_or(String::new(), |d| format!("`{}`", cell(d)));
        out += &format!(
            "| `{}` | {} | {} |\n",
            cell(&f.header),
            default,
            cell(&f.text)
        );
    }
    out
}

/// The generated part of docs/configuration.md: every `serve` flag, then those `edge` adds.
fn reference() -> String {
    let serve = flags(&help(&["serve"]));
    let edge = flags(&help(&["edge"]));
    let names: BTreeSet<&str> = serve.iter().map(|f| long_name(&f.header)).collect();
    let edge_only: Vec<&Flag> = edge
        .iter()
        .filter(|f| !names.contains(long_name(&f.header)))
        .collect();
    format!(
        "## `shoal serve`\n\n{}\n## `shoal edge`\n\nEvery `shoal serve` flag above, and:\n\n{}",
        table(&serve.iter().collect::<Vec<_>>()),
        table(&edge_only)
    )
}

const GENERATED: &str = "<!-- generated from --help by tests/it/docs.rs: do not edit below -->\n";

#[test]
fn the_configuration_reference_is_the_help_of_serve_and_edge() {
    let path = repo_file("docs/configuration.md");
    let doc = std::fs::read_to_string(&path).unwrap();
    let (prose, generated) = doc
        .split_once(GENERATED)
        .expect("docs/configuration.md has its generated part");
    let expected = reference();
    if std::env::var_os("SHOAL_BLESS_DOCS").is_some() {
        std::fs::write(&path, format!("{prose}{GENERATED}{expected}")).unwrap();
        return;
    }
    assert!(
        generated == expected,
        "docs/configuration.md is not the binary's --help: run `SHOAL_BLESS_DOCS=1 cargo test \
         --test it docs::` and commit it"
    );
}

/// `shoal ARGS --help`, if ARGS is a command.
fn try_help(args: &[&str]) -> Option<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_shoal"))
        .args(args)
        .arg("--help")
        .output()
        .unwrap();
    out.status
        .success()
        .then(|| String::from_utf8(out.stdout).unwrap())
}

/// The command a README line's `shoal ...` names (`["topic", "create"]`), its help's long flags,
/// and the words after the command (up to a pipe, a comment or the end of the inline code).
fn command_of(words: &[&str]) -> Option<(Vec<String>, BTreeSet<String>)> {
    let mut path: Vec<&str> = Vec::new();
    let mut help = None;
    for word in words {
        let is_word =
            word.chars().all(|c| c.is_ascii_lowercase() || c == '-') && !word.starts_with('-');
        // Deeper only while the command so far has subcommands.
        if !is_word
            || help
                .as_deref()
                .is_some_and(|h: &str| !h.contains("\nCommands:\n"))
        {
            break;
        }
        let mut deeper = path.clone();
        deeper.push(word);
        match try_help(&deeper) {
            Some(h) => {
                path = deeper;
                help = Some(h);
            }
            None => break,
        }
    }
    let help = help?;
    let known = flags(&help)
        .iter()
        .map(|f| long_name(&f.header).to_string())
        .chain(["--help".to_string()])
        .collect();
    Some((path.iter().map(|w| w.to_string()).collect(), known))
}

#[test]
fn every_flag_the_readme_gives_a_shoal_command_exists() {
    let readme = std::fs::read_to_string(repo_file("README.md")).unwrap();
    let mut unknown = Vec::new();
    let mut checked = 0;
    for line in readme.lines() {
        for (at, _) in line.match_indices("shoal ") {
            let rest = &line[at + "shoal ".len()..];
            let rest = rest.split(['`', '|', ';', '#', '&']).next().unwrap_or("");
            let words: Vec<&str> = rest.split_whitespace().collect();
            let Some((path, known)) = command_of(&words) else {
                continue;
            };
            checked += 1;
            for word in &words[path.len()..] {
                let name = word.split('=').next().unwrap();
                if name.starts_with("--") && name.len() > 2 && !known.contains(name) {
                    unknown.push(format!("shoal {} {name} in: {line}", path.join(" ")));
                }
            }
        }
    }
    assert!(
        checked >= 20,
        "only {checked} shoal commands found in the README"
    );
    assert!(
        unknown.is_empty(),
        "README flags no binary has: {unknown:#?}"
    );
}

/// The shell lines of the README's block after `marker` (an HTML comment), comments left out.
fn readme_block(marker: &str) -> Vec<String> {
    let readme = std::fs::read_to_string(repo_file("README.md")).unwrap();
    let (_, after) = readme
        .split_once(marker)
        .unwrap_or_else(|| panic!("the README has {marker}"));
    let block = after.split("```").nth(1).expect("a fenced block");
    block
        .lines()
        .skip(1)
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

/// Whether 127.0.0.1:`port` is free now.
fn free(port: u16) -> bool {
    std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
}

/// Held by a test while it runs a README block on the default ports.
fn default_ports() -> std::sync::MutexGuard<'static, ()> {
    static PORTS: std::sync::Mutex<()> = std::sync::Mutex::new(());
    PORTS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether the `cores` ports from `first` and the admin port 9644 are free; a SKIPPED line for
/// `test` where they are not. No other test uses them (theirs come from `free_port_run`, from
/// 10000 up).
fn defaults_free(test: &str, first: u16) -> bool {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u16;
    let ok = (first..first + cores).chain([9644]).all(free);
    if !ok {
        shards::testing::skipped(
            test,
            "a README block on the default ports",
            &format!("ports {first} and up or 9644 are in use on this machine"),
        );
    }
    ok
}

/// A fresh directory to run README commands in, with `shoal` (the binary under test) and an
/// `xdg-open` that writes down the address it is given on the PATH.
struct Fresh {
    _root: tempfile::TempDir,
    dir: PathBuf,
    path: String,
    opened: PathBuf,
}

impl Fresh {
    fn new() -> Fresh {
        let root = tempfile::tempdir().unwrap();
        let bin = root.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_shoal"), bin.join("shoal")).unwrap();
        let opened = root.path().join("opened");
        let shim = format!("#!/bin/sh\necho \"$1\" >> '{}'\n", opened.display());
        std::fs::write(bin.join("xdg-open"), shim).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(bin.join("xdg-open"), std::fs::Permissions::from_mode(0o755))
            .unwrap();
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let dir = root.path().join("fresh");
        std::fs::create_dir(&dir).unwrap();
        Fresh {
            _root: root,
            dir,
            path,
            opened,
        }
    }

    fn shell(&self, line: &str) -> Command {
        let mut c = Command::new("bash");
        c.args(["-c", line])
            .current_dir(&self.dir)
            .env("PATH", &self.path)
            .env_remove("RUST_LOG");
        c
    }

    /// Runs `line` to its end (at most 60 s): its success and its output.
    fn run(&self, line: &str) -> (bool, String) {
        let mut child = self
            .shell(line)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let started = Instant::now();
        while child.try_wait().unwrap().is_none() {
            if started.elapsed() > Duration::from_secs(60) {
                let _ = child.kill();
                panic!("`{line}` still running after 60 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        let _ = writeln!(std::io::stderr(), "$ {line}\n{text}");
        (out.status.success(), text)
    }

    /// Runs the lines as a user would, each to its end, but those ending in `&`: the server,
    /// started in the background, waited for until it listens. Every line must succeed; returns
    /// the server and each other line with its output.
    fn run_all(&self, lines: &[String]) -> (Option<Shoal>, Vec<(String, String)>) {
        let mut server = None;
        let mut outputs = Vec::new();
        for line in lines {
            let command = line.split(" # ").next().unwrap().trim();
            if let Some(serve) = command.strip_suffix('&') {
                let cmd = self.shell(&format!("exec {}", serve.trim()));
                server = Some(Shoal::spawn(cmd, &self.dir.join("shoal-data")));
                continue;
            }
            let (ok, out) = self.run(command);
            assert!(ok, "`{command}` failed: {out}");
            outputs.push((command.to_string(), out));
        }
        (server, outputs)
    }
}

#[test]
fn the_readme_quick_start_runs_literally_in_a_fresh_directory() {
    let test = "docs::the_readme_quick_start_runs_literally_in_a_fresh_directory";
    let _ports = default_ports();
    if !defaults_free(test, 9092) {
        return;
    }
    let fresh = Fresh::new();
    let lines = readme_block("<!-- quick start -->");
    assert!(
        lines.len() >= 5,
        "a quick start of five commands: {lines:?}"
    );
    let (server, outputs) = fresh.run_all(&lines);
    let server = server.expect("the quick start starts a server in the background");
    assert_eq!(server.ports[0], 9092);
    assert!(
        fresh.dir.join("shoal-data/topics.json").exists(),
        "./shoal-data"
    );
    let (_, consumed) = outputs
        .iter()
        .find(|(c, _)| c.starts_with("shoal consume"))
        .expect("the quick start consumes");
    let records: Vec<&str> = consumed.lines().collect();
    assert!(
        !records.is_empty() && records.iter().all(|r| r.parse::<u32>().is_ok()),
        "the records produced come back: {consumed:?}"
    );
    let url = std::fs::read_to_string(&fresh.opened).expect("the quick start opens the console");
    let url = url.trim();
    assert_eq!(url, "http://127.0.0.1:9644/");
    if let Some(dom) = common::browser::dump_dom(test, url, Duration::from_secs(5)) {
        assert!(dom.contains("clicks"), "the console shows the topic: {dom}");
    }
    server.stop();
}

#[test]
fn the_readme_mtls_recipe_works_as_written() {
    let test = "docs::the_readme_mtls_recipe_works_as_written";
    let _ports = default_ports();
    if !defaults_free(test, 9093) {
        return;
    }
    let fresh = Fresh::new();
    let lines = readme_block("<!-- mtls recipe -->");
    let (server, outputs) = fresh.run_all(&lines);
    let server = server.expect("the recipe starts a server");
    assert_eq!(server.listeners[0].0, "SSL");
    let (last, _) = outputs.last().unwrap();
    assert!(last.starts_with("shoal topic create orders"), "{last}");
    // alice is the super user her certificate names; a certificate without -extfile is v1, and
    // is refused by name.
    let (ok, out) = fresh.run(
        "openssl req -newkey rsa:2048 -nodes -subj /CN=bob -keyout bob.key -out bob.csr && \
         openssl x509 -req -in bob.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 365 -out bob.pem",
    );
    assert!(ok, "{out}");
    let (ok, out) = fresh.run(
        "shoal topic list -b 127.0.0.1:9093 --tls-ca ca.pem --tls-cert bob.pem --tls-key bob.key",
    );
    assert!(!ok && out.contains("X.509 v1"), "{out}");
    server.stop();
}
