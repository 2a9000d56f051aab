//! A headless browser for the console's tests: Debian's `chromium`, installed by the test itself
//! where it is missing ([`super::debian`]), and a page's DOM as it stands once its scripts have
//! run.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The chromium binary, installed the first time it is needed on a machine without one (as root,
/// with `apt-get`); why not, where it cannot be.
pub fn chromium() -> Result<PathBuf, String> {
    super::debian::installed(
        &["/usr/bin/chromium", "/usr/bin/chromium-browser"],
        "chromium",
    )
}

/// Chromium without a window, a sandbox, a first run or extensions, with its own profile.
fn headless(browser: &std::path::Path, profile: &std::path::Path) -> Command {
    let mut command = Command::new(browser);
    command
        .args([
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-extensions",
        ])
        .arg(format!("--user-data-dir={}", profile.display()));
    command
}

/// The DOM of `url` after its scripts ran for `budget` of virtual time (timers run at once), as
/// HTML; the browser is killed and the test failed after 90 s of real time. `None`, with a SKIPPED
/// line naming `test`, where no browser can be had.
pub fn dump_dom(test: &str, url: &str, budget: Duration) -> Option<String> {
    let browser = match chromium() {
        Ok(path) => path,
        Err(why) => {
            shards::testing::skipped(test, "the console in a headless browser", &why);
            return None;
        }
    };
    let profile = tempfile::tempdir().unwrap();
    let mut child = headless(&browser, profile.path())
        .arg(format!("--virtual-time-budget={}", budget.as_millis()))
        .arg("--dump-dom")
        .arg(url)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromium runs");
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut out = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut out).unwrap();
        out
    });
    let started = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if started.elapsed() > Duration::from_secs(90) {
            let _ = child.kill();
            panic!("chromium still running after 90 s on {url}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Some(reader.join().unwrap())
}

/// A headless browser showing `url` in real time (no virtual time: for pages that talk to servers
/// for a while), killed when the returned guard is dropped. `None`, with a SKIPPED line naming
/// `test`, where no browser can be had.
pub fn open_page(test: &str, url: &str) -> Option<Browser> {
    let browser = match chromium() {
        Ok(path) => path,
        Err(why) => {
            shards::testing::skipped(test, "a page in a headless browser", &why);
            return None;
        }
    };
    let profile = tempfile::tempdir().unwrap();
    let child = headless(&browser, profile.path())
        .arg(url)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromium runs");
    Some(Browser {
        child,
        _profile: profile,
    })
}

/// A browser started by [`open_page`]; killed on drop.
pub struct Browser {
    child: std::process::Child,
    _profile: tempfile::TempDir,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The attributes of the first element whose opening tag contains `marker` (e.g.
/// `data-topic="hot"`), as (name, value) pairs; `None` if there is none.
pub fn element_attributes(dom: &str, marker: &str) -> Option<Vec<(String, String)>> {
    let at = dom.find(marker)?;
    let start = dom[..at].rfind('<')?;
    let end = at + dom[at..].find('>')?;
    let tag = &dom[start..end];
    let mut out = Vec::new();
    let mut rest = tag;
    while let Some(eq) = rest.find("=\"") {
        let name = rest[..eq]
            .rsplit([' ', '<'])
            .next()
            .unwrap_or("")
            .to_string();
        let value_end = rest[eq + 2..].find('"')?;
        out.push((name, rest[eq + 2..eq + 2 + value_end].to_string()));
        rest = &rest[eq + 2 + value_end + 1..];
    }
    Some(out)
}

/// One attribute of the element found by [`element_attributes`]; panics (showing the DOM's
/// length) if the element or the attribute is missing.
pub fn attribute(dom: &str, marker: &str, name: &str) -> String {
    element_attributes(dom, marker)
        .unwrap_or_else(|| panic!("no element with {marker} in the page ({} bytes)", dom.len()))
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("the element with {marker} has no {name}"))
}
