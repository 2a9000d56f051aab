//! The partitions a core is still opening (at start, or those of a topic just created), in the
//! order it opens them: those a request waits for first, the others as they were listed. A
//! request for one of them waits until it is open instead of finding it missing.

use shards::{FastMap, LogConfig, OffsetMonitor};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::time::Duration;

/// What opening a partition needs: its topic, index, topic id and log settings.
pub type ToOpen = (String, i32, [u8; 16], LogConfig);

/// Longest a request waits for its partitions to be opened; then it is answered as if they were
/// not this core's (`NOT_LEADER_OR_FOLLOWER`, retriable), and its client asks again.
pub const OPEN_WAIT: Duration = Duration::from_secs(10);

#[derive(Debug)]
pub struct OpenQueue {
    queue: RefCell<VecDeque<ToOpen>>,
    /// Partitions listed and not yet open, or open with requests that waited for them still to
    /// resume.
    partitions: RefCell<FastMap<(String, i32), Listed>>,
    /// Partitions a request waits for, to be opened before the rest of the queue.
    wanted: RefCell<VecDeque<(String, i32)>>,
    /// Counts the partitions opened (or failed): what waiting requests wake on.
    progress: OffsetMonitor,
}

#[derive(Debug, Default)]
struct Listed {
    open: bool,
    /// Tickets of the requests that waited for it, in the order they came, and how many of
    /// them have resumed: they resume in that order (produces must keep theirs), and one that
    /// comes while any has not resumed waits behind them.
    tickets: u64,
    resumed: u64,
}

impl Default for OpenQueue {
    fn default() -> Self {
        Self {
            queue: RefCell::default(),
            partitions: RefCell::default(),
            wanted: RefCell::default(),
            progress: OffsetMonitor::new(0),
        }
    }
}

impl OpenQueue {
    /// Lists partitions to open.
    pub fn push(&self, to_open: impl IntoIterator<Item = ToOpen>) {
        let mut partitions = self.partitions.borrow_mut();
        let mut queue = self.queue.borrow_mut();
        for t in to_open {
            partitions.insert((t.0.clone(), t.1), Listed::default());
            queue.push_back(t);
        }
    }

    /// The next partition to open: one a request waits for, else the first listed.
    pub fn next(&self) -> Option<ToOpen> {
        let mut queue = self.queue.borrow_mut();
        let mut wanted = self.wanted.borrow_mut();
        while let Some((topic, index)) = wanted.pop_front() {
            if let Some(i) = queue.iter().position(|t| t.0 == topic && t.1 == index) {
                return queue.remove(i);
            }
        }
        queue.pop_front()
    }

    /// `topic`-`index` is open (or could not be).
    pub fn done(&self, topic: &str, index: i32) {
        let key = (topic.to_string(), index);
        let mut partitions = self.partitions.borrow_mut();
        match partitions.get_mut(&key) {
            Some(l) if l.resumed < l.tickets => l.open = true,
            _ => {
                partitions.remove(&key);
            }
        }
        self.progress.advance(self.progress.value() + 1);
    }

    /// Whether any listed partition is not open yet, or has requests still to resume.
    pub fn is_busy(&self) -> bool {
        !self.partitions.borrow().is_empty()
    }

    /// Waits until each of `partitions` still listed is open and the requests that waited for
    /// it before this one have resumed (in the order they came), moving those not open to the
    /// front of the queue; at most [`OPEN_WAIT`]. Returns at once while nothing is listed.
    pub async fn wait_for(&self, partitions: impl Iterator<Item = (String, i32)>) {
        if !self.is_busy() {
            return;
        }
        let mut waiting: Vec<((String, i32), u64)> = Vec::new();
        {
            let mut listed = self.partitions.borrow_mut();
            let mut wanted = self.wanted.borrow_mut();
            for p in partitions {
                if let Some(l) = listed.get_mut(&p) {
                    if !l.open {
                        wanted.push_back(p.clone());
                    }
                    waiting.push((p, l.tickets));
                    l.tickets += 1;
                }
            }
        }
        if waiting.is_empty() {
            return;
        }
        // Resumed when this returns or is dropped (its request gone).
        let waiting = Turn {
            queue: self,
            waiting,
        };
        let deadline = std::time::Instant::now() + OPEN_WAIT;
        // Each partition open, and this request next in line for each.
        let turn = |listed: &FastMap<(String, i32), Listed>| {
            waiting
                .waiting
                .iter()
                .all(|(p, ticket)| listed.get(p).is_none_or(|l| l.open && l.resumed == *ticket))
        };
        while !turn(&self.partitions.borrow()) {
            if std::time::Instant::now() >= deadline {
                log::warn!(
                    "a request waited {OPEN_WAIT:?} for partitions being opened (of {}, e.g. {:?})",
                    waiting.waiting.len(),
                    waiting.waiting.first()
                );
                break;
            }
            let seen = self.progress.value();
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            futures_lite::future::or(
                async {
                    self.progress.wait_for(seen + 1).await;
                },
                glommio::timer::sleep(left),
            )
            .await;
        }
    }
}

/// A request's place in line for its partitions; leaving it lets the next one go.
struct Turn<'a> {
    queue: &'a OpenQueue,
    waiting: Vec<((String, i32), u64)>,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut listed = self.queue.partitions.borrow_mut();
        for (p, _) in &self.waiting {
            if let Some(l) = listed.get_mut(p) {
                l.resumed += 1;
                if l.open && l.resumed >= l.tickets {
                    listed.remove(p);
                }
            }
        }
        drop(listed);
        let progress = &self.queue.progress;
        progress.advance(progress.value() + 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(topic: &str, index: i32) -> ToOpen {
        (topic.to_string(), index, [0; 16], LogConfig::default())
    }

    #[test]
    fn wanted_partitions_open_first_and_their_waiters_wake() {
        let ex = glommio::LocalExecutorBuilder::default().make().unwrap();
        ex.run(async {
            let q = std::rc::Rc::new(OpenQueue::default());
            q.push((0..5).map(|i| part("t", i)));
            assert!(q.is_busy());
            assert_eq!(q.next().unwrap().1, 0);
            let woke = std::rc::Rc::new(std::cell::Cell::new(false));
            let waiter = glommio::spawn_local({
                let (q, woke) = (q.clone(), woke.clone());
                async move {
                    q.wait_for([("t".to_string(), 3)].into_iter()).await;
                    woke.set(true);
                }
            });
            futures_lite::future::yield_now().await;
            // 3 is wanted: it comes before 1 and 2.
            let next = q.next().unwrap();
            assert_eq!(next.1, 3);
            q.done("t", 0);
            futures_lite::future::yield_now().await;
            assert!(!woke.get());
            q.done("t", 3);
            waiter.await;
            assert!(woke.get());
            assert_eq!(q.next().unwrap().1, 1);
            // A partition not listed is not waited for.
            q.wait_for([("u".to_string(), 0)].into_iter()).await;
        });
    }
}
