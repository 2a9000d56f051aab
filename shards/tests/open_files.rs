//! Many logs on one core within a small open files budget: every descriptor under the data
//! directory counted from `/proc/self/fd`, every record read back exactly, across a close and a
//! reopen.

mod common;

use common::*;
use shards::{open_files, set_open_files_limit, AppendOptions, Log};
use std::path::Path;
use std::rc::Rc;

/// Descriptors this process holds on files under `dir`.
fn fds_under(dir: &Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.starts_with(dir))
        .count()
}

/// Waits for the descriptors closed by dropped handles (glommio closes them at its next I/O
/// cycle), then counts.
async fn settled_fds(dir: &Path) -> usize {
    glommio::timer::sleep(std::time::Duration::from_millis(5)).await;
    fds_under(dir)
}

const LOGS: usize = 120;
const BUDGET: u64 = 16;

#[test]
fn many_logs_stay_within_the_budget_and_read_back_exactly() {
    run(|| async {
        let tmp = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(tmp.path()).unwrap();
        set_open_files_limit(BUDGET);
        let cache = no_cache();
        let open_all = || async {
            let mut logs = Vec::new();
            for i in 0..LOGS {
                let log = Log::open(root.join(i.to_string()), small_config(), cache.clone())
                    .await
                    .unwrap();
                logs.push(log);
            }
            logs
        };
        let logs = open_all().await;
        assert!(settled_fds(&root).await as u64 <= BUDGET);
        // Rounds of appends over every log (durable and not, several segments each), each log's
        // expected bytes kept.
        let mut expected: Vec<Vec<u8>> = vec![Vec::new(); LOGS];
        for round in 0..6u64 {
            for (i, log) in logs.iter().enumerate() {
                let b = batch(3, 700, round * 1000 + i as u64);
                let durable = (i + round as usize) % 2 == 0;
                let r = log
                    .append(b.clone(), AppendOptions { durable })
                    .await
                    .unwrap();
                expected[i].extend(with_offset(&b, r.base_offset));
            }
            let fds = settled_fds(&root).await as u64;
            assert!(fds <= BUDGET, "round {round}: {fds} descriptors open");
            assert!(open_files().open <= BUDGET);
        }
        assert!(logs[0].segment_base_offsets().len() > 1, "the logs rolled");
        let read_back = |logs: Vec<Log>, expected: Rc<Vec<Vec<u8>>>, root: std::path::PathBuf| async move {
            for (i, log) in logs.iter().enumerate() {
                let mut at = log.log_start_offset();
                let mut got = Vec::new();
                while at < log.high_watermark() {
                    let r = log.read(at, 4000, true).await.unwrap();
                    got.extend(r.records.to_vec());
                    at = r.records.last_offset + 1;
                }
                assert_eq!(got, expected[i], "log {i}");
                assert!(fds_under(&root) as u64 <= BUDGET + 1);
            }
            logs
        };
        let expected = Rc::new(expected);
        let logs = read_back(logs, expected.clone(), root.clone()).await;
        assert!(open_files().evictions > 0);
        for log in logs {
            log.close().await.unwrap();
        }
        assert_eq!(settled_fds(&root).await, 0);
        assert_eq!(open_files().open, 0);
        // Reopened: the same records, within the budget again.
        let logs = open_all().await;
        let logs = read_back(logs, expected, root.clone()).await;
        assert!(settled_fds(&root).await as u64 <= BUDGET);
        for log in logs {
            log.close().await.unwrap();
        }
        set_open_files_limit(1 << 40);
    });
}

#[test]
fn logs_whose_writers_the_budget_closed_recover_every_record_after_a_crash() {
    run(|| async {
        let tmp = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(tmp.path()).unwrap();
        set_open_files_limit(BUDGET);
        let cache = no_cache();
        let config = shards::LogConfig {
            segment_bytes: 64 << 20,
            ..small_config()
        };
        let mut logs = Vec::new();
        for i in 0..LOGS {
            let dir = root.join(i.to_string());
            logs.push(Log::open(dir, config.clone(), cache.clone()).await.unwrap());
        }
        let mut expected: Vec<Vec<u8>> = vec![Vec::new(); LOGS];
        for round in 0..8u64 {
            for (i, log) in logs.iter().enumerate() {
                // Log 0 is hot: written in every round several times.
                let times = if i == 0 { 5 } else { 1 };
                for k in 0..times {
                    let b = batch(2, 300, round * 10_000 + i as u64 * 10 + k);
                    let durable = (i + round as usize + k as usize) % 3 == 0;
                    let r = log
                        .append(b.clone(), AppendOptions { durable })
                        .await
                        .unwrap();
                    expected[i].extend(with_offset(&b, r.base_offset));
                }
            }
        }
        // A crash: nothing closed.
        drop(logs);
        glommio::timer::sleep(std::time::Duration::from_millis(50)).await;
        for (i, want) in expected.iter().enumerate() {
            let log = Log::open(root.join(i.to_string()), config.clone(), cache.clone())
                .await
                .unwrap();
            let mut got = Vec::new();
            let mut at = 0;
            while at < log.high_watermark() {
                let r = log.read(at, 1 << 20, true).await.unwrap();
                got.extend(r.records.to_vec());
                at = r.records.last_offset + 1;
            }
            assert_eq!(got.len(), want.len(), "log {i}");
            assert!(got == *want, "log {i}");
            log.close().await.unwrap();
        }
        set_open_files_limit(1 << 40);
    });
}
