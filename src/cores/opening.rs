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
    /// Partitions listed and not opened yet (in the queue or being opened).
    pending: RefCell<FastMap<(String, i32), ()>>,
    /// Partitions a request waits for, to be opened before the rest of the queue.
    wanted: RefCell<VecDeque<(String, i32)>>,
    /// Counts the partitions opened (or failed): what waiting requests wake on.
    progress: OffsetMonitor,
}

impl Default for OpenQueue {
    fn default() -> Self {
        Self {
            queue: RefCell::default(),
            pending: RefCell::default(),
            wanted: RefCell::default(),
            progress: OffsetMonitor::new(0),
        }
    }
}

impl OpenQueue {
    /// Lists partitions to open.
    pub fn push(&self, to_open: impl IntoIterator<Item = ToOpen>) {
        let mut pending = self.pending.borrow_mut();
        let mut queue = self.queue.borrow_mut();
        for t in to_open {
            pending.insert((t.0.clone(), t.1), ());
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
        self.pending
            .borrow_mut()
            .remove(&(topic.to_string(), index));
        self.progress.advance(self.progress.value() + 1);
    }

    /// Whether any listed partition is not open yet.
    pub fn is_busy(&self) -> bool {
        !self.pending.borrow().is_empty()
    }

    /// Moves those of `partitions` still to be opened to the front of the queue; returns them.
    pub fn want(&self, partitions: impl Iterator<Item = (String, i32)>) -> Vec<(String, i32)> {
        if !self.is_busy() {
            return Vec::new();
        }
        let waiting: Vec<(String, i32)> = partitions
            .filter(|p| self.pending.borrow().contains_key(p))
            .collect();
        self.wanted.borrow_mut().extend(waiting.iter().cloned());
        waiting
    }

    /// Waits until none of `partitions` is still to be opened, moving them to the front of the
    /// queue; at most [`OPEN_WAIT`]. Returns at once while nothing is being opened.
    pub async fn wait_for(&self, partitions: impl Iterator<Item = (String, i32)>) {
        let mut waiting = self.want(partitions);
        let deadline = std::time::Instant::now() + OPEN_WAIT;
        while !waiting.is_empty() {
            let seen = self.progress.value();
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let woke = futures_lite::future::or(
                async { Some(self.progress.wait_for(seen + 1).await) },
                async {
                    glommio::timer::sleep(left).await;
                    None
                },
            )
            .await;
            if woke.is_none() {
                return;
            }
            waiting.retain(|p| self.pending.borrow().contains_key(p));
        }
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
